//! How fast the simulator runs (docs/BENCHMARKS.md, "Deterministic simulation"): simulated
//! time per wall-clock second and seeds per CPU-hour on one thread, for the benchmark's shape
//! (3 engines, 2 gateways, 100 clients, 3 broker nodes, every fault kind). Ignored by default:
//!
//! ```text
//! flock /work/bench.lock cargo test -p sim --release --test rate -- --ignored --nocapture
//! ```
//! `SIM_RATE_SEEDS` sets the seeds per round (default 20), `SIM_RATE_ROUNDS` the rounds (3).

use std::time::Instant;

#[test]
#[ignore = "a measurement: run it in release under the benchmark lock"]
fn simulated_time_per_wall_clock_second() {
    let number = |name: &str, default: u64| {
        std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
    };
    let (seeds, rounds) = (number("SIM_RATE_SEEDS", 20), number("SIM_RATE_ROUNDS", 3));
    println!(
        "| round | seeds | simulated (s) | wall (s) | simulated / wall | seeds per CPU-hour | events per s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for round in 0..rounds {
        let started = Instant::now();
        let (mut simulated_ns, mut events) = (0u64, 0u64);
        for seed in round * seeds + 1..=(round + 1) * seeds {
            let outcome = sim::run(&sim::Settings::new(seed));
            assert_eq!(outcome.violation, None, "seed {seed}");
            simulated_ns += outcome.simulated_ns;
            events += outcome.events;
        }
        let wall = started.elapsed().as_secs_f64();
        let simulated = simulated_ns as f64 / 1e9;
        println!(
            "| {round} | {seeds} | {simulated:.0} | {wall:.2} | {:.0} | {:.0} | {:.0} |",
            simulated / wall,
            seeds as f64 * 3600.0 / wall,
            events as f64 / wall
        );
        assert!(simulated / wall > 1.0, "the simulation runs faster than real time");
    }
}
