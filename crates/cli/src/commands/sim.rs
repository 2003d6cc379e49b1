//! `leantier sim`: the deterministic simulation of the replicated tier (docs/SIMULATION.md).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Runs the replicated tier (3 engines, 2 gateways, 100 clients, a 3-node broker) on one
/// thread under seeded faults and checks its invariants as it runs. `--seed S` runs (or
/// replays) one seed and prints its trace hash; `--seeds N` or `--seed-file` runs many. A
/// failure prints the seed, the violated invariant and the run shrunk to the fewest faults
/// that still show it, and exits 1; a bad `--faults` list or seed file exits 2.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run (replay) this one seed.
    #[arg(long, conflicts_with_all = ["seeds", "seed_file"])]
    seed: Option<u64>,
    /// Run this many seeds, from `--first-seed` on.
    #[arg(long, conflicts_with = "seed_file")]
    seeds: Option<u64>,
    /// The first seed of `--seeds`.
    #[arg(long, default_value_t = 1)]
    first_seed: u64,
    /// Run the seeds this file lists (one per line, decimal or 0x-hex; `#` comments).
    #[arg(long)]
    seed_file: Option<PathBuf>,
    /// Fault kinds to draw, comma-separated: crash, stop, pause, pause-stop, partition, loss,
    /// duplicate, delay, broker-kill, clock-jump, torn-write, corrupt, disk-full,
    /// object-store; `all` or `none`.
    #[arg(long, default_value = "all")]
    faults: String,
    /// Faults drawn per seed.
    #[arg(long, default_value_t = 12)]
    fault_count: usize,
    /// Simulated time within which the faults start (the run goes on 4 s after it, then
    /// `--settle` more for the answers).
    #[arg(long, value_parser = super::values::seconds, default_value = "20s")]
    fault_window: Duration,
    /// Simulated time after the faults and the last order for every answer to arrive.
    #[arg(long, value_parser = super::values::seconds, default_value = "10s")]
    settle: Duration,
    /// With `--seed`: replay only these faults of the seed's list (indices, comma-separated),
    /// as a shrunk failure prints them.
    #[arg(long, value_delimiter = ',', requires = "seed")]
    keep_faults: Option<Vec<usize>>,
    /// Clients (each on gateway `client % 2`).
    #[arg(long, default_value_t = 100)]
    clients: usize,
    /// Percent of each gateway's clients on FIX sessions (the rest native), 0 to 100.
    #[arg(long, default_value_t = 50)]
    fix_percent: u64,
    /// Shards, each its own group of 3 engines, lease and input stream (an order goes to
    /// the shard of its instrument).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// Inputs between an engine's snapshots (the leader then trims the log below what every
    /// snapshot and live engine needs; 0: no snapshots, no trim). Production's default is
    /// 100,000; small here so that runs trim, restore from snapshots and resync.
    #[arg(long, default_value_t = 1000)]
    snapshot_every: u64,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `leantier sim`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let kinds = sim::FaultKind::parse_list(&args.faults)?;
    let base = sim::Settings {
        fault_kinds: kinds,
        fault_count: args.fault_count,
        fault_window_ns: args.fault_window.as_nanos() as u64,
        settle_ns: args.settle.as_nanos() as u64,
        clients: args.clients,
        fix_percent: args.fix_percent,
        shards: args.shards,
        snapshot_every: args.snapshot_every,
        ..sim::Settings::new(0)
    };
    base.validate()?;
    if let Some(seed) = args.seed {
        return replay(&sim::Settings { seed, ..base }, args.keep_faults.as_deref());
    }
    let seeds: Vec<u64> = match (&args.seed_file, args.seeds) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .map_err(|source| sim::SimError::Io { what: path.display().to_string(), source })?;
            sim::parse_seeds(&text)?
        }
        (None, Some(count)) => (args.first_seed..args.first_seed.saturating_add(count)).collect(),
        (None, None) => {
            anyhow::bail!(crate::outcome::BadInput("give --seed, --seeds or --seed-file".into()))
        }
    };
    run_many(&base, &seeds, args.json)
}

fn replay(settings: &sim::Settings, keep: Option<&[usize]>) -> anyhow::Result<()> {
    let started = Instant::now();
    let outcome = match keep {
        Some(kept) => sim::run_keeping(settings, kept)?,
        None => sim::run(settings),
    };
    let wall = started.elapsed();
    println!(
        "seed {}: trace hash {:016x}, {:.1} s simulated in {:.2} s ({:.0}×), {} events, {} orders, \
         {} snapshots, {} trims, {} reports resynced, {} FIX resend requests, \
         {} snapshot puts failed",
        outcome.seed,
        outcome.trace_hash,
        outcome.simulated_ns as f64 / 1e9,
        wall.as_secs_f64(),
        outcome.simulated_ns as f64 / 1e9 / wall.as_secs_f64().max(1e-9),
        outcome.events,
        outcome.committed,
        outcome.snapshots,
        outcome.trims,
        outcome.resynced,
        outcome.sessions.resend_requests,
        outcome.snapshot_puts_failed
    );
    for (index, fault) in outcome.faults.iter().enumerate() {
        println!("  fault {index:>2}: {fault}");
    }
    match &outcome.violation {
        None => Ok(()),
        Some(violation) => {
            println!("trace before the violation:");
            for line in outcome.journal.iter().rev().take(40).rev() {
                println!("  {line}");
            }
            anyhow::bail!("seed {}: {violation}", outcome.seed)
        }
    }
}

/// What `--seeds` measured.
#[derive(serde::Serialize)]
struct Summary {
    seeds: u64,
    failed: u64,
    simulated_s: f64,
    wall_s: f64,
    simulated_per_wall: f64,
    seeds_per_wall_hour: f64,
    events: u64,
    orders: u64,
    snapshots: u64,
    trims: u64,
    /// Reports the gateways' resyncs declared lost (older than every window and the newest
    /// snapshot: reported, not a failure).
    reports_resynced: u64,
    /// ResendRequests the FIX sessions sent (each answered by production's plan).
    fix_resend_requests: u64,
    /// Snapshot puts the object store (or the broker) failed.
    snapshot_puts_failed: u64,
}

fn run_many(base: &sim::Settings, seeds: &[u64], json: bool) -> anyhow::Result<()> {
    let bar = experiments::progress::progress_bar(seeds.len() as u64, "simulating seeds");
    let started = Instant::now();
    let mut summary = Summary {
        seeds: 0,
        failed: 0,
        simulated_s: 0.0,
        wall_s: 0.0,
        simulated_per_wall: 0.0,
        seeds_per_wall_hour: 0.0,
        events: 0,
        orders: 0,
        snapshots: 0,
        trims: 0,
        reports_resynced: 0,
        fix_resend_requests: 0,
        snapshot_puts_failed: 0,
    };
    let mut failure = None;
    for &seed in seeds {
        let settings = sim::Settings { seed, ..base.clone() };
        let outcome = sim::run(&settings);
        summary.seeds += 1;
        summary.simulated_s += outcome.simulated_ns as f64 / 1e9;
        summary.events += outcome.events;
        summary.orders += outcome.committed;
        summary.snapshots += outcome.snapshots;
        summary.trims += outcome.trims;
        summary.reports_resynced += outcome.resynced;
        summary.fix_resend_requests += outcome.sessions.resend_requests;
        summary.snapshot_puts_failed += outcome.snapshot_puts_failed;
        bar.inc(1);
        if outcome.violation.is_some() {
            summary.failed += 1;
            failure = Some((settings, outcome));
            break;
        }
    }
    bar.finish_and_clear();
    summary.wall_s = started.elapsed().as_secs_f64();
    summary.simulated_per_wall = summary.simulated_s / summary.wall_s.max(1e-9);
    summary.seeds_per_wall_hour = summary.seeds as f64 * 3600.0 / summary.wall_s.max(1e-9);
    print_summary(&summary, json)?;
    let Some((settings, outcome)) = failure else { return Ok(()) };
    report_failure(&settings, &outcome)
}

fn print_summary(summary: &Summary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(summary).context("summary as JSON")?);
        return Ok(());
    }
    println!(
        "| seeds | failed | simulated (s) | wall (s) | simulated / wall | seeds per hour (wall, one thread) | events | orders | snapshots | trims | reports resynced | FIX resend requests | snapshot puts failed |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {:.1} | {:.2} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} |",
        summary.seeds,
        summary.failed,
        summary.simulated_s,
        summary.wall_s,
        summary.simulated_per_wall,
        summary.seeds_per_wall_hour,
        summary.events,
        summary.orders,
        summary.snapshots,
        summary.trims,
        summary.reports_resynced,
        summary.fix_resend_requests,
        summary.snapshot_puts_failed
    );
    Ok(())
}

/// Prints the failing seed, its violation and the run shrunk to the fewest faults; an error
/// (exit 1) naming the seed.
fn report_failure(settings: &sim::Settings, outcome: &sim::Outcome) -> anyhow::Result<()> {
    let violation = outcome.violation.as_ref().expect("a failed run has a violation");
    println!("FAILED seed {}: {violation}", settings.seed);
    println!("shrinking ({} faults)…", outcome.faults.len());
    let shrunk = sim::shrink(settings, outcome).expect("a failed run shrinks");
    let kept: Vec<String> = shrunk.kept.iter().map(usize::to_string).collect();
    let shown = shrunk.outcome.violation.as_ref().expect("the shrunk run fails");
    println!("shrunk to {} fault(s): {shown}", shrunk.kept.len());
    for (index, fault) in shrunk.kept.iter().zip(&shrunk.outcome.faults) {
        println!("  fault {index:>2}: {fault}");
    }
    println!("trace of the shrunk run before the violation:");
    for line in shrunk.outcome.journal.iter().rev().take(40).rev() {
        println!("  {line}");
    }
    println!("replay: leantier sim --seed {} --keep-faults {}", settings.seed, kept.join(","));
    anyhow::bail!("seed {} broke {}", settings.seed, violation.invariant.name())
}
