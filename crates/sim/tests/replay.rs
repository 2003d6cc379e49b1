//! A run is a pure function of its seed: the same seed twice gives the same trace hash; the
//! simulated system keeps every invariant under the CI seed set's faults.

use sim::{FaultKind, Settings, run};

/// A short run: 6 s of faults, 3 s of settling.
fn short(seed: u64) -> Settings {
    Settings {
        fault_window_ns: 6_000_000_000,
        settle_ns: 6_000_000_000,
        fault_count: 6,
        ..Settings::new(seed)
    }
}

#[test]
fn the_same_seed_twice_gives_the_same_trace_and_another_seed_another() {
    let (first, again, other) = (run(&short(11)), run(&short(11)), run(&short(12)));
    assert_eq!(first.trace_hash, again.trace_hash);
    assert_eq!(first.events, again.events);
    assert_eq!(first.committed, again.committed);
    assert_ne!(first.trace_hash, other.trace_hash);
    assert!(first.committed > 1_000, "the clients traded: {} orders", first.committed);
}

#[test]
fn without_faults_every_client_gets_the_reference_answers() {
    let settings = Settings { fault_kinds: Vec::new(), ..short(3) };
    let outcome = run(&settings);
    assert!(outcome.faults.is_empty());
    assert_eq!(outcome.violation, None, "journal: {:#?}", outcome.journal);
}

#[test]
fn the_correct_cores_keep_every_invariant_under_faults() {
    for seed in 1..=4 {
        let outcome = run(&short(seed));
        assert_eq!(outcome.faults.len(), 6);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
    }
    let _ = FaultKind::ALL;
}

#[test]
fn two_shards_each_with_its_group_lease_and_stream_keep_every_invariant_under_faults() {
    for seed in 1..=3 {
        let outcome = run(&Settings { shards: 2, ..short(seed) });
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        let per_shard = &outcome.shard_committed;
        assert!(per_shard.len() == 2 && per_shard.iter().all(|n| *n > 1_000), "{per_shard:?}");
        let leads = |shard: usize| {
            let engines =
                [3 * shard, 3 * shard + 1, 3 * shard + 2].map(|e| format!("engine {e} leads"));
            outcome.journal.iter().any(|line| engines.iter().any(|e| line.contains(e.as_str())))
        };
        assert!(leads(0) && leads(1), "each shard's group elects its own leader");
    }
}

#[test]
fn a_run_without_time_to_settle_fails_liveness_shrinks_and_replays_its_shrunk_faults() {
    let settings = Settings { settle_ns: 0, ..short(5) };
    let failed = run(&settings);
    let violation = failed.violation.as_ref().expect("orders still in flight at the end");
    assert_eq!(violation.invariant, sim::Invariant::Liveness, "{violation}");
    let shrunk = sim::shrink(&settings, &failed).expect("a failed run shrinks");
    assert!(
        shrunk.kept.len() < failed.faults.len(),
        "faults the failure does not need are dropped"
    );
    let replayed = sim::run_keeping(&settings, &shrunk.kept).unwrap();
    assert_eq!(replayed.trace_hash, shrunk.outcome.trace_hash, "a shrunk run replays exactly");
    assert!(sim::run_keeping(&settings, &[99]).is_err(), "an index past the seed's faults");
}

/// Seed 414 (the benchmark's shape, every fault kind) once panicked: a leader still catching
/// up after its restart answered a retain request from a gateway ahead of it by slicing past
/// its window.
#[test]
fn seed_414_a_leader_behind_its_gateway_answers_a_retain_with_no_records() {
    let outcome = run(&Settings::new(414));
    assert_eq!(outcome.violation, None, "{:#?}", outcome.journal);
    assert_eq!(outcome.faults.len(), 12);
}
