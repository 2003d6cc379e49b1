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

/// Snapshots every 100 inputs under partitions and crashes: the log is trimmed, restarted
/// engines continue from the newest snapshot, gateways cut off past it resync (reported, the
/// sessions skip what was lost), and every invariant holds, `trim-never-past-need` included.
#[test]
fn snapshots_trim_the_log_restore_engines_and_resyncs_are_reported_not_violations() {
    let (mut restores, mut resynced) = (0, 0);
    for seed in 1..=3 {
        let settings = Settings {
            snapshot_every: 100,
            fault_kinds: vec![FaultKind::Crash, FaultKind::Partition],
            ..short(seed)
        };
        let outcome = run(&settings);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        assert!(outcome.snapshots > 0 && outcome.trims > 0, "seed {seed} trimmed its log");
        restores += outcome.journal.iter().filter(|line| line.contains("restores")).count();
        resynced += outcome.sessions_lost;
    }
    assert!(restores > 0, "a restarted engine continued from a snapshot");
    assert!(resynced > 0, "a gateway cut off past the snapshot resynced");
}

/// Seed 130 (the benchmark's shape, every fault kind) once failed `liveness` in the
/// simulator's model, not the tier: a retain reply delayed by the network answered an older
/// request after the gateway's feed had moved on, and the gateway resynced from where it
/// stood, losing reports the group could recompute. A gateway now resyncs only on the reply
/// to its own gap, as production's request/reply inbox does.
#[test]
fn seed_130_a_late_retain_reply_to_an_older_request_resyncs_nothing() {
    let outcome = run(&Settings::new(130));
    assert_eq!(outcome.violation, None, "{:#?}", outcome.journal);
    assert!(outcome.trims > 0 && outcome.resynced > 0, "it trims and resyncs");
}

/// Half the clients on FIX sessions, half native, under gateway crashes: FIX clients that
/// come back find their gateway's Logon past what they took, ask for the gap with a
/// ResendRequest and get production's answer (stored reports again with PossDupFlag, the
/// Logons' numbers gap-filled); native ones resume from their last sequence. No session
/// skips or repeats a number (`session-without-gaps`) and every answer equals the
/// reference's.
#[test]
fn fix_sessions_ask_for_their_gaps_and_get_resends_and_gap_fills() {
    let (mut requests, mut resent, mut gap_fills) = (0, 0, 0);
    for seed in 1..=3 {
        let settings = Settings {
            fault_kinds: vec![FaultKind::Crash, FaultKind::Stop],
            engine_faults: false,
            ..short(seed)
        };
        assert_eq!((0..4).filter(|n| settings.is_fix(*n)).count(), 2, "half the clients");
        let outcome = run(&settings);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        requests += outcome.sessions.resend_requests;
        resent += outcome.sessions.resent;
        gap_fills += outcome.sessions.gap_fills;
    }
    assert!(requests > 0 && resent > 0 && gap_fills > 0, "{requests} {resent} {gap_fills}");
}

/// Gateway crashes are power failures of the session store's disk: what was not synced is
/// lost, the store is recovered through production's scan, and every message the gateways
/// sent is still there with its bytes (`store-keeps-what-it-sent`), FIX and native sessions
/// resuming from it.
#[test]
fn a_crashed_gateways_store_keeps_every_message_it_sent() {
    for seed in 1..=3 {
        let settings =
            Settings { fault_kinds: vec![FaultKind::Crash], engine_faults: false, ..short(seed) };
        let outcome = run(&settings);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        let crashes = outcome.journal.iter().filter(|line| line.contains("crashes")).count();
        assert!(crashes > 0, "seed {seed}: a gateway crashed");
    }
}

/// Found and fixed: production's store recovered the valid prefix of a batch it never
/// synced, so a power failure that tore the write-back (a share of its sectors persisting)
/// kept a batch's reports without the routed-position record written after them, and the
/// restarted gateway routed them again (seed 9 of these runs failed
/// `answers-equal-reference`). Each batch now ends with a `BATCH_END` record and recovery
/// drops a batch without it whole (`gateway::record::scan`): seeds 1–10 keep every
/// invariant with torn write-backs, and tails are cut.
#[test]
fn a_torn_store_batch_is_dropped_whole() {
    let mut torn_tails = 0;
    for seed in 1..=10 {
        let settings = Settings {
            fault_kinds: vec![FaultKind::Crash],
            engine_faults: false,
            gateway_store_tears: true,
            // Off as when seed 9 was found: a flip draws from the seed's generator.
            gateway_store_corruption: false,
            fault_window_ns: 10_000_000_000,
            settle_ns: 6_000_000_000,
            ..Settings::new(seed)
        };
        let outcome = run(&settings);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        let torn = outcome.journal.iter().filter(|line| line.contains("torn tail")).count();
        // Seed 9 recovered a torn batch's reports without their position before the fix.
        if seed == 9 {
            assert!(torn > 0, "seed 9 tears its store: {:#?}", outcome.journal);
        }
        torn_tails += torn;
    }
    assert!(torn_tails > 0, "some write-back was torn and cut");
}

/// Snapshots every 100 inputs under `object-store` faults (puts and reads failing, puts
/// delayed up to 2 s), crashes and partitions: a failed put neither notes nor trims, a
/// delayed one trims only if its engine still leads when it completes, an engine whose
/// start cannot read the newest snapshot exits and is started again; `trim-never-past-need`
/// and `durable-never-dropped` hold with the rest.
fn object_store_faults(seed: u64) -> Settings {
    Settings {
        fault_kinds: vec![FaultKind::ObjectStore, FaultKind::Crash, FaultKind::Partition],
        snapshot_every: 100,
        fault_window_ns: 10_000_000_000,
        settle_ns: 6_000_000_000,
        ..Settings::new(seed)
    }
}

#[test]
fn object_store_faults_fail_and_delay_snapshots_and_the_trim_still_keeps_what_is_needed() {
    let (mut puts_failed, mut exits, mut trims) = (0, 0, 0);
    for seed in 1..=3 {
        let outcome = run(&object_store_faults(seed));
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        puts_failed += outcome.snapshot_puts_failed;
        exits += outcome.journal.iter().filter(|line| line.contains("it exits")).count();
        trims += outcome.trims;
    }
    assert!(puts_failed > 0 && exits > 0 && trims > 0, "{puts_failed} {exits} {trims}");
}

/// Found and fixed: production's regenerator answered a failed snapshot read with no
/// records, the retain service fell back to its window, and a gateway behind it resynced
/// reports the group could recompute a moment later (seed 5 of these runs failed
/// `liveness`). A failed regeneration now answers "nothing yet"
/// (`delivery::publish::regenerated_answer`): the gateway asks again, and seeds 1–5 keep
/// every invariant with the regenerator's reads failing.
#[test]
fn a_failed_snapshot_read_while_regenerating_is_asked_again_not_resynced() {
    let mut reads_failed = 0;
    for seed in 1..=5 {
        // Flipped store bytes off as when seed 5 was found (a flip draws from the generator).
        let settings = Settings {
            regenerator_read_faults: true,
            gateway_store_corruption: false,
            ..object_store_faults(seed)
        };
        let outcome = run(&settings);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        let failed = outcome.journal.iter().filter(|line| line.contains("read failed")).count();
        if seed == 5 {
            assert!(failed > 0, "seed 5 fails a regeneration's read: {:#?}", outcome.journal);
        }
        reads_failed += failed;
    }
    assert!(reads_failed > 0, "some regeneration's read failed");
}

/// Found and fixed: production's session store had no durable watermark, so recovery ended
/// the store at a damaged record and cut everything after it as a torn tail when that was
/// under 8 MiB (`gateway::record::tail`): a flipped byte in a synced sector lost the messages
/// the gateway sent after it (seed 1 of these runs failed `store-keeps-what-it-sent`: client
/// 1's messages 20..=21). Every batch end now claims the synced end; recovery skips damage
/// before it, keeps the records after it and moves each session's numbering past what the
/// skipped records held (reported, counted in `store_lost`), and only damage past it is a
/// torn tail: seeds 1–5 keep every invariant with flipped store bytes.
#[test]
fn a_flipped_byte_in_the_gateways_store_keeps_the_messages_sent_after_it() {
    let mut skipped = 0;
    for seed in 1..=5 {
        let settings = Settings {
            fault_kinds: vec![FaultKind::Crash],
            engine_faults: false,
            gateway_store_corruption: true,
            ..short(seed)
        };
        let outcome = run(&settings);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        let flips = outcome.journal.iter().filter(|line| line.contains("flipped")).count();
        let damage = outcome.journal.iter().filter(|line| line.contains("damaged records")).count();
        if seed == 1 {
            assert!(flips > 0 && damage > 0, "seed 1 flips a synced byte: {:#?}", outcome.journal);
        }
        skipped += damage;
    }
    assert!(skipped > 0, "some damage was skipped");
}

/// A gateway's session store fills up (`disk-full` on a gateway): as production's store does
/// since issue 42's follow-up, the refused batch stays unwritten and held (nothing of it goes
/// out before its record is on disk: `store-keeps-what-it-sent` checks every message at its
/// send), is written once the disk has room, and the clients get every report (`liveness`);
/// crashes while it is held lose only what was never sent.
#[test]
fn a_full_disk_under_a_gateways_store_holds_its_output_until_written() {
    let mut held = 0;
    for seed in 1..=3 {
        let settings = Settings {
            fault_kinds: vec![FaultKind::DiskFull, FaultKind::Crash],
            engine_faults: false,
            ..short(seed)
        };
        let outcome = run(&settings);
        assert_eq!(outcome.violation, None, "seed {seed}: {:#?}", outcome.journal);
        held += outcome.journal.iter().filter(|line| line.contains("disk full")).count();
    }
    assert!(held > 0, "some gateway's store was refused a write");
}
