//! The flags of the web load lab (`web load`, `web matrix`, `web ratio`); the lab itself is
//! `experiments::web_lab`: these parse, call it, and turn its missed targets into exit 3.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;
use experiments::web_lab::{self, LoadSettings, MatrixSettings};
use web::exec::Model;
use web::workload::Complexity;

use super::values::{self, one_of};
use super::web::prefork_child_args;
use crate::outcome::TargetMissed;

/// `web load --request-timeout`'s default, as `experiments::web_lab::REQUEST_TIMEOUT_DEFAULT`.
const REQUEST_TIMEOUT_DEFAULT: &str = "5s";

/// Arguments of `web load`.
#[derive(Debug, ClapArgs)]
pub struct LoadArgs {
    /// Target URL; when absent an in-process server is started and `--model` is used.
    #[arg(long)]
    pub url: Option<String>,
    /// Model of the in-process server (ignored with --url).
    #[arg(long, value_parser = one_of(&Model::ALL, Model::name), default_value = "adaptive")]
    pub model: Model,
    /// Closed loop with this many users (ignored when --rate is given).
    #[arg(long, default_value_t = 10)]
    pub users: usize,
    /// Open loop at this constant request rate, requests/s, latency from the intended send
    /// time.
    #[arg(long, allow_negative_numbers = true, alias = "rate-per-s")]
    pub rate: Option<f64>,
    /// Complexity level of the requests.
    #[arg(long, value_parser = one_of(&Complexity::ALL, Complexity::name), default_value = "medium-600")]
    pub complexity: Complexity,
    /// Measured time (after the warm-up), e.g. 3s.
    #[arg(
        long,
        alias = "duration-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "3s"
    )]
    pub duration: Duration,
    /// Warm-up time, not measured, e.g. 500ms.
    #[arg(
        long,
        alias = "warmup-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "500ms"
    )]
    pub warmup: Duration,
    /// Width of the throughput-over-time intervals, e.g. 100ms.
    #[arg(
        long,
        alias = "interval-ms",
        value_name = "DURATION",
        value_parser = values::millis,
        default_value = "100ms"
    )]
    pub interval: Duration,
    /// A request not answered this long after it was sent counts as timed out, e.g. 2s.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = REQUEST_TIMEOUT_DEFAULT
    )]
    pub request_timeout: Duration,
    /// Print the result as JSON as well.
    #[arg(long)]
    pub json: bool,
    /// Report folder (JSON, throughput-over-time CSV and SVG, Markdown).
    #[arg(long, alias = "report-dir", default_value = "leantier-report/web-load")]
    pub out: PathBuf,
}

/// Arguments of `web matrix`.
#[derive(Debug, ClapArgs)]
pub struct MatrixArgs {
    /// Models to compare.
    #[arg(
        long,
        value_parser = one_of(&Model::ALL, Model::name),
        value_delimiter = ',',
        default_value = "single,pool,pinned,prefork,adaptive"
    )]
    pub models: Vec<Model>,
    /// Closed-loop user counts.
    #[arg(long, value_delimiter = ',', default_value = "10,30,60")]
    pub users: Vec<usize>,
    /// Complexity levels.
    #[arg(
        long,
        value_parser = one_of(&Complexity::ALL, Complexity::name),
        value_delimiter = ',',
        default_value = "low,medium-600,medium-1000,high"
    )]
    pub complexity: Vec<Complexity>,
    /// Measured time per cell and round, e.g. 350ms.
    #[arg(
        long,
        alias = "duration-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "350ms"
    )]
    pub duration: Duration,
    /// Warm-up time per cell and round, e.g. 150ms.
    #[arg(
        long,
        alias = "warmup-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "150ms"
    )]
    pub warmup: Duration,
    /// Rounds: in each round every model of a cell runs once, cells in turn, the models' order
    /// rotated (and reversed every other time) from cell to cell and round to round, so a change
    /// in background load lands on every model alike; each cell reports the median over the
    /// rounds. Many short rounds beat a few long ones where the host's speed drifts over
    /// seconds: adaptive's ratio is the median of per-round (paired) ratios.
    #[arg(long, default_value_t = 9)]
    pub rounds: usize,
    /// Width of the throughput-over-time intervals, e.g. 100ms.
    #[arg(
        long,
        alias = "interval-ms",
        value_name = "DURATION",
        value_parser = values::millis,
        default_value = "100ms"
    )]
    pub interval: Duration,
    /// Worker threads / processes of the leantier models [default: allowed CPUs].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Python interpreter with Flask installed: adds the Python baselines (see scripts/bench-web).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The baseline Flask app.
    #[arg(long, default_value = "bench/web-python/app.py")]
    pub python_app: PathBuf,
    /// Complexity levels at which the Python baselines run (they are slow; they run in the
    /// first round only).
    #[arg(
        long,
        value_parser = one_of(&Complexity::ALL, Complexity::name),
        value_delimiter = ',',
        default_value = "medium-600"
    )]
    pub python_complexity: Vec<Complexity>,
    /// Measured time per Python cell, e.g. 8s: a window much longer than the baseline's
    /// latency, or the closed loop's trimming (only requests started and finished inside it
    /// count) would undercount it.
    #[arg(
        long,
        alias = "python-duration-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "8s"
    )]
    pub python_duration: Duration,
    /// User counts at which the Python baselines run.
    #[arg(long, value_delimiter = ',', default_value = "10")]
    pub python_users: Vec<usize>,
    /// Report folder (JSON, CSV, Markdown, SVG).
    #[arg(long, alias = "report-dir", default_value = "leantier-report/web-matrix")]
    pub out: PathBuf,
    /// Exit with code 3 when a target (adaptive ≥ 0.95× best fixed; ≥ 100× Python) is missed.
    #[arg(long)]
    pub check: bool,
}

/// Arguments of `web ratio`.
#[derive(Debug, ClapArgs)]
pub struct RatioArgs {
    /// Throughputs of the first tool's runs, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ours: Vec<f64>,
    /// Throughputs of the peer's runs, paired in order with --ours.
    #[arg(long, value_delimiter = ',', required = true)]
    pub peer: Vec<f64>,
}

impl LoadArgs {
    fn settings(&self) -> LoadSettings {
        LoadSettings {
            url: self.url.clone(),
            model: self.model,
            users: self.users,
            rate: self.rate,
            complexity: self.complexity,
            duration: self.duration,
            warmup: self.warmup,
            interval: self.interval,
            request_timeout: self.request_timeout,
            json: self.json,
            out: self.out.clone(),
            child_args: prefork_child_args(),
        }
    }
}

impl MatrixArgs {
    /// The lab's settings from these flags (`--check` stays here: it decides the exit code).
    pub fn settings(&self) -> MatrixSettings {
        MatrixSettings {
            models: self.models.clone(),
            users: self.users.clone(),
            complexity: self.complexity.clone(),
            duration: self.duration,
            warmup: self.warmup,
            rounds: self.rounds,
            interval: self.interval,
            workers: self.workers,
            python: self.python.clone(),
            python_app: self.python_app.clone(),
            python_complexity: self.python_complexity.clone(),
            python_duration: self.python_duration,
            python_users: self.python_users.clone(),
            out: self.out.clone(),
            child_args: prefork_child_args(),
        }
    }
}

/// `web load`: one cell. Exits 1 (after the table) when no request was answered well.
pub fn run_load(args: &LoadArgs) -> anyhow::Result<()> {
    web_lab::run_load(&args.settings())
}

/// `web matrix`: exit 3 with `--check` when a target is missed.
pub fn run_matrix(args: &MatrixArgs) -> anyhow::Result<()> {
    let missed = web_lab::run_matrix(&args.settings())?;
    if args.check && !missed.is_empty() {
        return Err(TargetMissed(missed).into());
    }
    Ok(())
}

/// `web ratio`: prints "<median of ours/peer per pair> <95% interval>".
pub fn run_ratio(args: &RatioArgs) -> anyhow::Result<()> {
    let (ratio, interval) = web_lab::paired_ratio_of(&args.ours, &args.peer)?;
    println!("{ratio:.3} {}", if interval.is_empty() { "n/a" } else { &interval });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        matrix: MatrixArgs,
    }

    /// The flags' defaults are the lab's: the request timeout, and every model and level.
    #[test]
    fn matrix_defaults_are_the_labs() {
        assert_eq!(values::seconds(REQUEST_TIMEOUT_DEFAULT), Ok(web_lab::REQUEST_TIMEOUT_DEFAULT));
        let settings = Cli::try_parse_from(["m"]).unwrap().matrix.settings();
        assert_eq!(settings.models, Model::ALL);
        assert_eq!(settings.complexity, Complexity::ALL);
        assert_eq!((settings.rounds, settings.users), (9, vec![10, 30, 60]));
    }
}
