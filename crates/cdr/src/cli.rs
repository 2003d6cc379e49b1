//! `leantier cdr ...`: run the pipeline with a planner config and compare with the prediction.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use lab::outcome::{BadInput, TargetMissed};
use lab::report::{Markdown, ReportDir, Table};
use planner::model::PipelineConfig;

use crate::feed::DbTarget;
use crate::predict::{Comparison, compare};
use crate::run::{NodeThreads, RunSettings, RunSummary, run_pipeline};
use crate::serialize::FSYNC_EVERY_RECORDS_DEFAULT;
use crate::ticket::MALFORMED_EVERY_DEFAULT;

/// The call-data-ticket pipeline.
#[derive(Debug, ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

/// The cdr subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the pipeline with the thread counts of a planner config; print measured vs
    /// predicted throughput and utilization per node.
    Run(RunArgs),
}

/// `cdr run`.
#[derive(Debug, ClapArgs)]
pub struct RunArgs {
    /// Pipeline config file (from `leantier plan optimize`).
    #[arg(long)]
    pub config: PathBuf,
    /// Poisson ticket rate per second; default: the config's planned rate.
    #[arg(long, conflicts_with = "max")]
    pub rate: Option<f64>,
    /// Run the generator flat out and compare with the predicted maximum throughput.
    #[arg(long)]
    pub max: bool,
    /// Override a node's thread count, `NAME=THREADS` (repeatable).
    #[arg(long = "threads", value_name = "NAME=THREADS")]
    pub threads: Vec<String>,
    /// Seconds the generator runs.
    #[arg(long, default_value_t = 5.0)]
    pub duration_s: f64,
    /// Folder for output files, reject files and the SQLite database.
    #[arg(long, default_value = "cdr-out")]
    pub out_dir: PathBuf,
    /// PostgreSQL URL for the feeder (default: SQLite in --out-dir).
    #[arg(long, env = "LEANTIER_PG_URL")]
    pub db_url: Option<String>,
    /// Serializer fsync policy: one fdatasync per this many records (0 = only at the end).
    #[arg(long, default_value_t = FSYNC_EVERY_RECORDS_DEFAULT)]
    pub fsync_every: u64,
    /// Every n-th ticket is malformed (0 = none).
    #[arg(long, default_value_t = MALFORMED_EVERY_DEFAULT)]
    pub malformed_every: u64,
    /// Generator seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fail (exit 3) if the measured throughput is outside ±this fraction of the prediction.
    #[arg(long)]
    pub check: Option<f64>,
    /// Also write the comparison as JSON, CSV and Markdown into this folder.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// Runs a `cdr` subcommand.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Run(run_args) => run_with_config(run_args),
    }
}

fn apply_overrides(config: &mut PipelineConfig, overrides: &[String]) -> anyhow::Result<()> {
    for item in overrides {
        let parsed =
            item.split_once('=').and_then(|(name, n)| Some((name, n.parse::<u32>().ok()?)));
        let Some((name, threads)) = parsed.filter(|(_, n)| *n > 0) else {
            return Err(
                BadInput(format!("--threads expects NAME=THREADS (>= 1), got {item}")).into()
            );
        };
        let node = config.node.iter_mut().find(|node| node.name == name);
        let node =
            node.ok_or_else(|| BadInput(format!("--threads {item}: unknown node name {name}")))?;
        node.threads = threads;
    }
    Ok(())
}

fn node_threads(config: &PipelineConfig) -> anyhow::Result<NodeThreads> {
    let get = |name: &str| -> anyhow::Result<usize> {
        let threads = config.threads_of(name);
        let threads =
            threads.ok_or_else(|| BadInput(format!("config has no [[node]] named {name}")))?;
        if threads == 0 {
            return Err(BadInput(format!("node {name}: threads must be >= 1")).into());
        }
        Ok(threads as usize)
    };
    anyhow::ensure!(get("generator")? == 1, BadInput("the generator runs one thread".into()));
    Ok(NodeThreads {
        decoder: get("decoder")?,
        converter: get("converter")?,
        serializer: get("serializer")?,
        feeder: get("feeder")?,
    })
}

fn run_with_config(args: &RunArgs) -> anyhow::Result<()> {
    let mut config: PipelineConfig = lab::config::load_toml(Some(&args.config))?;
    apply_overrides(&mut config, &args.threads)?;
    let threads = node_threads(&config)?;
    if !(args.duration_s.is_finite() && args.duration_s > 0.0) {
        return Err(BadInput(format!("--duration-s must be > 0, got {}", args.duration_s)).into());
    }
    let rate_per_s = match (args.max, args.rate) {
        (true, _) => None,
        (false, Some(rate)) => Some(rate),
        (false, None) => Some(config.arrival_rate_per_s),
    };
    let database = match &args.db_url {
        Some(url) => DbTarget::Postgres {
            url: url.clone(),
            table: format!("leantier_cdr_run_{}", std::process::id()),
        },
        None => DbTarget::Sqlite(args.out_dir.join("cdr.sqlite")),
    };
    let settings = RunSettings {
        threads,
        rate_per_s,
        duration: Duration::from_secs_f64(args.duration_s),
        out_dir: args.out_dir.clone(),
        database: database.clone(),
        fsync_every_records: args.fsync_every,
        malformed_every: args.malformed_every,
        seed: args.seed,
    };
    let summary = run_pipeline(&settings)?;
    check_no_ticket_lost(&summary)?;
    let comparison = compare(&config, &summary, args.duration_s, args.max)?;
    let table = comparison_table(&comparison, args.max);
    print!("{table}");
    println!(
        "generated {} tickets ({:.0}/s), rejected {} (see {}/rejects-*.log), serialized {}, \
         inserted {}; stored throughput measured {:.0}/s vs predicted {:.0}/s (ratio {:.3})",
        summary.generated,
        summary.generated as f64 / args.duration_s,
        summary.rejected,
        args.out_dir.display(),
        summary.serialized,
        summary.inserted,
        comparison.measured_throughput_per_s,
        comparison.predicted_throughput_per_s,
        comparison.measured_throughput_per_s / comparison.predicted_throughput_per_s,
    );
    println!(
        "CPU used: {:.2} cores ({:.2} µs per generated ticket); model's core budget {:.2}",
        summary.cpu_s / summary.wall_s,
        summary.cpu_s * 1e6 / summary.generated.max(1) as f64,
        config.model.host.cores,
    );
    if let DbTarget::Postgres { .. } = database {
        database.drop_table()?;
    }
    if let Some(dir) = &args.report {
        let report = ReportDir::create(dir)?;
        report.write_json("comparison.json", &comparison)?;
        report.write_csv("comparison.csv", &table)?;
        let mut markdown = Markdown::new();
        markdown.heading(1, "cdr run: measured vs predicted").table(&table);
        report.write_markdown("comparison.md", markdown.as_str())?;
    }
    if let Some(tolerance) = args.check {
        let ratio = comparison.measured_throughput_per_s / comparison.predicted_throughput_per_s;
        if (ratio - 1.0).abs() > tolerance {
            return Err(TargetMissed(vec![format!(
                "measured/predicted throughput {ratio:.3} is outside 1 ± {tolerance}"
            )])
            .into());
        }
    }
    Ok(())
}

/// Every valid ticket reached both outputs; every other one is in a reject file.
fn check_no_ticket_lost(summary: &RunSummary) -> anyhow::Result<()> {
    let valid = summary.generated - summary.rejected;
    anyhow::ensure!(
        summary.serialized == valid && summary.inserted == valid,
        "ticket accounting mismatch: generated {} - rejected {} = {valid}, serialized {}, inserted {}",
        summary.generated,
        summary.rejected,
        summary.serialized,
        summary.inserted
    );
    Ok(())
}

/// Per node: threads, measured and predicted throughput and utilization.
pub fn comparison_table(comparison: &Comparison, flat_out: bool) -> Table {
    let title = if flat_out { "maximum throughput run" } else { "paced run" };
    let mut table = Table::new([
        "node",
        "threads",
        "measured/s",
        "predicted/s",
        "ratio",
        "measured util",
        "predicted util",
    ])
    .with_title(title);
    for node in &comparison.nodes {
        table.row([
            node.name.clone(),
            node.threads.to_string(),
            format!("{:.0}", node.measured_throughput_per_s),
            format!("{:.0}", node.predicted_throughput_per_s),
            format!("{:.3}", node.throughput_ratio()),
            format!("{:.3}", node.measured_utilization),
            format!("{:.3}", node.predicted_utilization),
        ]);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::model::NodeConfig;

    fn config() -> PipelineConfig {
        let node = |name: &str| NodeConfig { name: name.into(), threads: 1, ..Default::default() };
        PipelineConfig {
            node: ["generator", "decoder", "converter", "serializer", "feeder"].map(node).to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn thread_overrides_apply_and_bad_ones_are_bad_input() {
        let mut config = config();
        apply_overrides(&mut config, &["converter=3".into()]).unwrap();
        assert_eq!(node_threads(&config).unwrap().converter, 3);
        for bad in ["converter", "converter=0", "converter=x", "convertor=2"] {
            let error = apply_overrides(&mut config, &[bad.into()]).unwrap_err();
            assert!(error.downcast_ref::<BadInput>().is_some(), "{bad}: {error}");
        }
        config.node.retain(|node| node.name != "feeder");
        let error = node_threads(&config).unwrap_err();
        assert!(error.to_string().contains("no [[node]] named feeder"), "{error}");
    }

    #[test]
    fn lost_tickets_are_reported() {
        let summary = RunSummary {
            generated: 100,
            rejected: 2,
            serialized: 98,
            inserted: 97,
            wall_s: 1.0,
            cpu_s: 0.5,
            stages: Vec::new(),
        };
        let error = check_no_ticket_lost(&summary).unwrap_err();
        assert!(error.to_string().contains("inserted 97"), "{error}");
        check_no_ticket_lost(&RunSummary { inserted: 98, ..summary }).unwrap();
    }
}
