//! `leantier replication`: tools for a replicated engine group (docs/REPLICATION.md).

use std::time::Duration;

use super::exchange_serve::ServeArgs;

/// Tools for a replicated engine group.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Listens to one shard's report and market-data subjects for `--duration`, then replays
    /// the shard's input log from its newest snapshot and compares every record heard with
    /// the replay's (routing and canonical output; not the clocks). Takes the engines' own
    /// `exchange serve` flags (`--config`, `--nats`, `--shard`, `--prefix`, ...) so that it
    /// replays with their settings. Exit 0: every record equal; 1: a record differs or one
    /// sequence was heard with two contents.
    Check(CheckArgs),
}

/// `replication check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// How long to listen before replaying (SIGTERM or SIGINT ends the listening earlier).
    #[arg(long, value_parser = super::values::seconds, default_value = "10s")]
    duration: Duration,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Runs `leantier replication …`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Check(check) => run_check(check),
    }
}

fn run_check(args: &CheckArgs) -> anyhow::Result<()> {
    let tier = super::exchange_serve::tier_of(&args.serve)?;
    let (nats, log) = super::exchange_roles::log_from(&args.serve)?;
    let shard = args.serve.replication.shard;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let report = runtime.block_on(async {
        let stop = ops::stop::stop_signal()?;
        let client = delivery::nats::connect(&nats, "check").await?;
        let prefix = log.publish_prefix(shard);
        println!("listening to {prefix}.data.> for {:?} (or until SIGTERM/SIGINT)", args.duration);
        let stop = async move {
            let signal = stop.await;
            tracing::info!(signal, "capture stopped: replaying");
        };
        let captured = replication::check::capture(&client, &prefix, args.duration, stop).await?;
        println!("heard {} records; replaying shard {shard}'s log", captured.records.len());
        let report = replication::check::verify(client, &log, shard, &tier, &captured).await?;
        anyhow::Ok(report)
    })?;
    println!(
        "checked {} records: {} equal, {} differ, {} sequences heard with two contents, {} not \
         produced by the log, {} before the newest snapshot",
        report.checked,
        report.equal,
        report.mismatched,
        report.conflicts,
        report.unproduced,
        report.not_covered
    );
    for (index, seq) in &report.mismatches {
        let subject = replication::check::subject_name(*index);
        println!("differs or not produced: {subject} sequence {seq}");
    }
    if !report.passed() {
        anyhow::bail!("the group published records its input log does not produce");
    }
    Ok(())
}
