//! `leantier`: a thin binary. Every subcommand's arguments and logic live in a library crate;
//! this file only parses, sets up logging, dispatches and maps errors to exit codes
//! (see `lab::outcome`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Build, measure, model and tune the lean multi-core business tier of transaction systems.
#[derive(Parser)]
#[command(name = "leantier", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `pipeline=debug`.
    #[arg(long, global = true, env = "LEANTIER_LOG", default_value = "warn")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main demo: the lean exchange tier at 20K/40K/60K msg/s, then its maximum rate;
    /// prints latency per stage and writes a report folder.
    Demo(exchange::cli::DemoArgs),
    /// The reference exchange tier: run a configuration, or an experiment.
    Exchange(exchange::cli::Args),
    /// Micro-benchmarks that run leantier and its peers in the same run and print the ratios.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Message-queuing middleware: serve a node, run a client, load-test, benchmark.
    Mq(mq::cli::Args),
    /// REST matrix service under selectable execution models, and its load lab.
    Web(web::cli::Args),
    /// Capacity planner: measure a pipeline, model it as a queueing network, optimize threads.
    Plan(planner::cli::Args),
    /// The call-data-ticket pipeline: run a planner config, compare measured vs predicted.
    Cdr(cdr::cli::Args),
    /// The safe store writer: journal benchmark (throughput, fdatasync baseline, durable-reply
    /// latency per policy) and a read-only journal checker.
    Journal(journal::cli::Args),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Ring throughput (leantier vs rtrb, crossbeam, disruptor, std mpsc, blocking) and
    /// pinned ping-pong latency, plus the wake-up and idle-CPU cost of each wait strategy.
    Ring(lab::ringbench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Demo(args) => exchange::cli::run_demo(&args),
        Command::Exchange(args) => exchange::cli::run(&args),
        Command::Bench(BenchCommand::Ring(args)) => lab::ringbench::run(&args),
        Command::Mq(args) => mq::cli::run(&args),
        Command::Web(args) => web::cli::run(&args),
        Command::Plan(args) => planner::cli::run(&args, &[&cdr::measure::CdrWorkload::default()]),
        Command::Cdr(args) => cdr::cli::run(&args),
        Command::Journal(args) => journal::cli::run(&args),
    };
    lab::outcome::exit_code_for(result)
}
