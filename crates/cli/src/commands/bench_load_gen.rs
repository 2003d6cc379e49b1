//! `leantier bench load-gen`: the flags, and the table and report folder of a run of
//! [`experiments::ringbench::loadgen::run`].

use std::path::PathBuf;
use std::time::Duration;

use experiments::report::{Markdown, ReportDir, Table};
use experiments::ringbench::loadgen::{KEPT_UP_SLACK, LoadGenReport, LoadGenSettings, Sink};

use crate::commands::values::{self, one_of};
use crate::outcome::TargetMissed;

/// The rate the generator must keep up with on one thread into the null sink (issue 15).
const KEPT_UP_RATE_TARGET_PER_S: f64 = 2_000_000.0;

/// The open-loop load generator alone: highest rate it keeps up with, its schedule lag and
/// its CPU use, into a null sink and into a ring drained by another thread.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Target rates in requests per second (comma separated), each measured for --duration.
    #[arg(
        long,
        allow_negative_numbers = true,
        alias = "rates",
        value_delimiter = ',',
        default_value = "1000,10000,100000,1000000,2000000,4000000,8000000,16000000"
    )]
    pub rate: Vec<f64>,
    /// Time per (sink, rate) step, e.g. 1s or 500ms.
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "1s"
    )]
    pub duration: Duration,
    /// Evenly spaced requests instead of Poisson arrivals.
    #[arg(long)]
    pub constant: bool,
    /// Sinks to drive (comma separated): null (requests dropped) or ring (pushed into a ring
    /// that another thread drains).
    #[arg(long, value_delimiter = ',', default_value = "null,ring",
          value_parser = one_of(&Sink::ALL, Sink::name))]
    pub sinks: Vec<Sink>,
    /// Folder for the report (JSON, CSV, Markdown).
    #[arg(long, default_value = "leantier-report/bench-load-gen")]
    pub out: PathBuf,
    /// Exit with code 3 unless the generator kept up with 2M requests/s into the null sink.
    #[arg(long)]
    pub check: bool,
}

/// Runs the measurement, prints the table and writes the report folder.
pub fn run(args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(!args.duration.is_zero(), "--duration must be > 0");
    let settings = LoadGenSettings {
        rates_per_s: args.rate.clone(),
        step: args.duration,
        constant: args.constant,
        sinks: args.sinks.clone(),
    };
    let report = experiments::ringbench::loadgen::run(&settings)?;
    let table = steps_table(&report);
    println!("{table}");
    for (sink, rate) in &report.highest_kept_up {
        let rate = rate.map_or("none of the rates".into(), |r| format!("{:.0} requests/s", r));
        println!("highest rate kept up with ({sink} sink): {rate}");
    }
    let dir = ReportDir::create(&args.out)?;
    dir.write_json("load-gen.json", &report)?;
    dir.write_csv("load-gen.csv", &table)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "leantier bench load-gen");
    markdown.table(&table);
    dir.write_markdown("README.md", markdown.as_str())?;
    println!("report: {}", dir.path().display());
    let null_kept_up = report.highest_kept_up.iter().find(|(sink, _)| *sink == Sink::Null.name());
    let met =
        null_kept_up.and_then(|(_, rate)| *rate).is_some_and(|r| r >= KEPT_UP_RATE_TARGET_PER_S);
    if args.check && !met {
        return Err(TargetMissed(vec!["load generator keeps up with 2M requests/s".into()]).into());
    }
    Ok(())
}

fn steps_table(report: &LoadGenReport) -> Table {
    let mut table = Table::new([
        "sink",
        "target /s",
        "achieved /s",
        "kept up",
        "lag p50 ns",
        "lag p99 ns",
        "lag p99.9 ns",
        "lag max ns",
        "CPU %",
        "CPU ns/req",
        "sleeps",
        "spin window ns",
    ])
    .with_title(format!(
        "open-loop generator, one thread (kept up: ended within {:.0}% of its duration)",
        KEPT_UP_SLACK * 100.0
    ));
    for step in &report.steps {
        let lag = &step.send_lag_ns;
        table.row([
            step.sink.to_string(),
            format!("{:.0}", step.target_rate_per_s),
            format!("{:.0}", step.achieved_rate_per_s),
            if step.kept_up { "yes" } else { "NO" }.into(),
            lag.p50_ns.to_string(),
            lag.p99_ns.to_string(),
            lag.p99_9_ns.to_string(),
            lag.max_ns.to_string(),
            format!("{:.1}", step.cpu_fraction * 100.0),
            format!("{:.0}", step.cpu_ns_per_request),
            step.sleeps.to_string(),
            step.spin_window_ns.to_string(),
        ]);
    }
    table
}
