//! `leantier`: the command line. This crate is the only one that knows about flags, terminals
//! and exit codes: each module of [`commands`] parses one area's flags, calls the library
//! crates (which return typed results) and prints them; [`outcome`] maps errors to exit codes.
//! This file sets up logging and dispatches.

mod commands;
mod outcome;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Build, measure, model and tune the lean multi-core business tier of transaction systems.
#[derive(Parser)]
#[command(name = "leantier", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `info` or `pipeline=debug`.
    #[arg(long, global = true, env = "LEANTIER_LOG", default_value = "warn")]
    log: String,
    /// Log lines as `text` (for people) or `json` (one object per line, for log collectors).
    #[arg(long, global = true, env = "LEANTIER_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main demo: `exchange serve` in-process on loopback driven by open-loop native
    /// sessions at 20K/40K/60K orders/s: in-tier response (beside the published lean tier),
    /// order → ack and durable reply at the client, then the highest rate per view; writes a
    /// report folder. `--in-process`: the tier's own critical path without a network.
    Demo(commands::exchange::DemoArgs),
    /// The reference exchange tier: run a configuration, or an experiment.
    Exchange(commands::exchange::Args),
    /// Micro-benchmarks that run leantier and its peers in the same run and print the ratios.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Message-queuing middleware: serve a node, run a client, load-test, benchmark.
    Mq(commands::mq::Args),
    /// REST matrix service under selectable execution models, and its load lab.
    Web(commands::web::Args),
    /// Capacity planner: measure a pipeline, model it as a queueing network, optimize threads.
    Plan(commands::planner::Args),
    /// The call-data-ticket pipeline: run a planner config, compare measured vs predicted.
    Cdr(commands::cdr::Args),
    /// Each of the five papers' experiments at a scale this machine runs, beside the published
    /// figures, with a verdict per claim: one self-contained index.html and data files.
    Reproduce(commands::reproduce::Args),
    /// The safe store writer: journal benchmark (throughput, fdatasync baseline, durable-reply
    /// latency per policy) and a read-only journal checker.
    Journal(commands::journal::Args),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Ring throughput (leantier vs rtrb, crossbeam, disruptor, std mpsc, blocking) and
    /// pinned ping-pong latency, plus the wake-up and idle-CPU cost of each wait strategy.
    Ring(commands::bench_ring::Args),
    /// The open-loop load generator alone: the highest rate it keeps up with on one thread,
    /// its schedule lag and its CPU use, into a null sink and into a drained ring.
    LoadGen(commands::bench_load_gen::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log, &cli.log_format);
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(&args),
        Command::Exchange(args) => commands::exchange::run(&args),
        Command::Bench(BenchCommand::Ring(args)) => commands::bench_ring::run(&args),
        Command::Bench(BenchCommand::LoadGen(args)) => commands::bench_load_gen::run(&args),
        Command::Mq(args) => commands::mq::run(&args),
        Command::Web(args) => commands::web::run(&args),
        Command::Plan(args) => {
            commands::planner::run(&args, &[&cdr::measure::CdrWorkload::default()])
        }
        Command::Cdr(args) => commands::cdr::run(&args),
        Command::Journal(args) => commands::journal::run(&args),
        Command::Reproduce(args) => commands::reproduce::run(&args),
    };
    outcome::exit_code_for(result)
}

/// Logs to stderr, filtered by `filter`, as text or as JSON lines (`format`).
fn init_logging(filter: &str, format: &str) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    if format == "json" {
        logs.json().init();
    } else {
        // Colour codes only for a person at a terminal; logs piped to a file stay plain text.
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init();
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over the whole command tree (conflicts, defaults, names).
    #[test]
    fn the_command_tree_is_consistent() {
        super::Cli::command().debug_assert();
    }
}
