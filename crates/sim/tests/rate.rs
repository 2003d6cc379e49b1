//! How fast the simulator runs (docs/BENCHMARKS.md, "Deterministic simulation"): simulated
//! time per wall-clock second and seeds per CPU-hour on one thread, for the benchmark's shape
//! (3 engines, 2 gateways, 100 clients, 3 broker nodes, every fault kind). Ignored by default:
//!
//! ```text
//! flock /work/bench.lock cargo test -p sim --release --test rate -- --ignored --nocapture
//! ```
//! `SIM_RATE_SEEDS` sets the seeds per round (default 20), `SIM_RATE_ROUNDS` the rounds (3),
//! `SIM_FIX_PERCENT` the share of FIX sessions (the settings' 50 by default; 0: native only,
//! what the FIX codec and session layer cost).

use std::time::Instant;

/// This thread's CPU time so far, s (`/proc/thread-self/stat`'s utime + stime, at the kernel's
/// 100 ticks per second): on a shared host the wall clock also counts other processes' turns.
fn thread_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("Linux /proc");
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks = |at: usize| fields[at].parse::<f64>().expect("a tick count");
    (ticks(11) + ticks(12)) / 100.0
}

#[test]
#[ignore = "a measurement: run it in release under the benchmark lock"]
fn simulated_time_per_wall_clock_second() {
    let number = |name: &str, default: u64| {
        std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
    };
    let (seeds, rounds) = (number("SIM_RATE_SEEDS", 20), number("SIM_RATE_ROUNDS", 3));
    let fix_percent = number("SIM_FIX_PERCENT", sim::Settings::new(0).fix_percent);
    println!(
        "| round | seeds | simulated (s) | wall (s) | CPU (s) | simulated / wall | simulated / CPU | \
         seeds per CPU-hour | events per CPU-s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for round in 0..rounds {
        let (started, cpu_started) = (Instant::now(), thread_cpu_s());
        let (mut simulated_ns, mut events) = (0u64, 0u64);
        for seed in round * seeds + 1..=(round + 1) * seeds {
            let outcome = sim::run(&sim::Settings { fix_percent, ..sim::Settings::new(seed) });
            assert_eq!(outcome.violation, None, "seed {seed}");
            simulated_ns += outcome.simulated_ns;
            events += outcome.events;
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = (thread_cpu_s() - cpu_started).max(0.01);
        let simulated = simulated_ns as f64 / 1e9;
        println!(
            "| {round} | {seeds} | {simulated:.0} | {wall:.2} | {cpu:.2} | {:.0} | {:.0} | {:.0} | {:.0} |",
            simulated / wall,
            simulated / cpu,
            seeds as f64 * 3600.0 / cpu,
            events as f64 / cpu
        );
        assert!(simulated / wall > 1.0, "the simulation runs faster than real time");
    }
}

/// Seeds `1..=SIM_SEEDS` (default 500) with every fault kind, the benchmark's shape (the
/// retained window `SIM_RETAIN_RECORDS`, 256 by default): each
/// failure printed with its seed and invariant (docs/SIMULATION.md records them), then the
/// summary. Ignored by default (minutes in release):
///
/// ```text
/// flock /work/bench.lock cargo test -p sim --release --test rate every_fault_kind -- --ignored --nocapture
/// ```
#[test]
#[ignore = "a soak: run it in release"]
fn every_fault_kind_over_many_seeds() {
    let seeds = std::env::var("SIM_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(500u64);
    // SIM_RETAIN_RECORDS=8192: production's window instead of the simulator's 256.
    let retain_records = std::env::var("SIM_RETAIN_RECORDS").ok().and_then(|v| v.parse().ok());
    let retain_records = retain_records.unwrap_or(sim::Settings::new(0).retain_records);
    let (cpu_started, mut simulated_ns) = (thread_cpu_s(), 0u64);
    let mut failures = std::collections::BTreeMap::<&str, Vec<u64>>::new();
    let (mut losses_reported, mut regenerated) = (0u64, 0u64);
    let (mut trims, mut resynced, mut sessions_lost) = (0u64, 0u64, 0u64);
    let mut recomputable = 0u64;
    let (mut resend_requests, mut gap_fills, mut puts_failed) = (0u64, 0u64, 0u64);
    let (mut store_lost, mut store_flips, mut store_refused) = (0u64, 0u64, 0u64);
    for seed in 1..=seeds {
        let settings = sim::Settings { retain_records, ..sim::Settings::new(seed) };
        let ran = std::panic::catch_unwind(|| sim::run(&settings));
        let Ok(outcome) = ran else {
            println!("FAILED seed {seed}: the simulator panicked");
            failures.entry("panic").or_default().push(seed);
            continue;
        };
        simulated_ns += outcome.simulated_ns;
        losses_reported += outcome.losses_reported;
        regenerated += outcome.regenerated;
        trims += outcome.trims;
        resynced += outcome.resynced;
        sessions_lost += outcome.sessions_lost;
        recomputable += outcome.resynced_recomputable;
        resend_requests += outcome.sessions.resend_requests;
        gap_fills += outcome.sessions.gap_fills;
        puts_failed += outcome.snapshot_puts_failed;
        store_lost += outcome.store_lost;
        store_flips += outcome.store_flips;
        store_refused += outcome.store_writes_refused;
        if let Some(violation) = &outcome.violation {
            println!("FAILED seed {seed}: {violation}");
            failures.entry(violation.invariant.name()).or_default().push(seed);
        }
    }
    let cpu = thread_cpu_s() - cpu_started;
    println!(
        "{seeds} seeds, {:.2} simulated hours, {cpu:.0} CPU-s ({:.0} seeds per CPU-hour); \
         journal losses reported (refused recoveries): {losses_reported}; reports regenerated \
         past the window: {regenerated}; log trims: {trims}; reports resynced (lost past the \
         newest snapshot, reported): {resynced}, of them not yet in their sessions: \
         {sessions_lost}, at or after the snapshot's numbering: {recomputable}; FIX resend \
         requests: {resend_requests}, gap fills: {gap_fills}; snapshot puts failed: \
         {puts_failed}; gateway crashes flipping store bytes: {store_flips}, messages lost to \
         the damaged store records skipped (reported): {store_lost}; gateway store writes a \
         full disk refused (held): {store_refused}; failures: {failures:?}",
        simulated_ns as f64 / 3.6e12,
        seeds as f64 * 3600.0 / cpu.max(0.01)
    );
    assert!(failures.is_empty(), "failing seeds by invariant: {failures:?}");
}
