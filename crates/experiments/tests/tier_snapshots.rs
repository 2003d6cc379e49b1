//! Shard snapshots: a snapshot taken between two inputs and restored, followed by the rest of
//! the input, reaches exactly the state of an uninterrupted run (state digest and output hash);
//! the tier takes snapshots mid-run, prunes the journal segments they cover, recovers from
//! the newest valid one (falling back past a damaged one). The pause bound is checked in
//! `tests/snapshot_pause.rs`, a binary of its own so no other test competes for the CPU.

use std::path::Path;
use std::time::Duration;

use exchange::core::CoreLimits;
use exchange::durability::{JournalMode, JournalOptions, ShardState};
use exchange::flow::{UniverseConfig, reference_master_data};
use exchange::msg::{Command, OrderType, SequencedInput, Side, TimeInForce};
use exchange::tier::TierConfig;
use experiments::tier_load::{LoadConfig, RunOptions, RunResult, run};
use journal::Policy;
use journal::{RecoverOptions, StateMachine, recover_from};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ORDER_POOL_SLOTS: u32 = 1 << 14;

fn listings() -> Vec<exchange::book::Listing> {
    reference_master_data(&UniverseConfig::default()).listings()
}

fn fresh() -> ShardState {
    ShardState::new(
        &listings(),
        CoreLimits { order_pool_slots: ORDER_POOL_SLOTS, ..CoreLimits::default() },
    )
}

/// Random valid core input over 8 instruments: every order type, cancels and replaces of
/// earlier ids, halts, resumes and band changes.
fn random_inputs(count: u64, seed: u64) -> Vec<SequencedInput> {
    let listings = listings();
    let mut rng = StdRng::seed_from_u64(seed);
    (1..=count)
        .map(|seq| {
            let listing = listings[rng.random_range(0..8)];
            let mid = listing.ladder_low + listing.tick * i64::from(listing.levels / 2);
            let price = mid + listing.tick * rng.random_range(-20..=20);
            let (order_id, client) = (rng.random_range(1..seq + 1), rng.random_range(0..16));
            let command = match rng.random_range(0..100) {
                0..60 => Command::New {
                    order_id: seq,
                    client,
                    side: if rng.random_bool(0.5) { Side::Buy } else { Side::Sell },
                    order_type: if rng.random_bool(0.05) {
                        OrderType::Market
                    } else {
                        OrderType::Limit
                    },
                    time_in_force: match rng.random_range(0..10) {
                        0 => TimeInForce::Ioc,
                        1 => TimeInForce::Fok,
                        _ => TimeInForce::Day,
                    },
                    price,
                    qty: rng.random_range(1..200),
                },
                60..80 => Command::Cancel { order_id, client },
                80..97 => {
                    Command::Replace { order_id, client, price, qty: rng.random_range(1..200) }
                }
                97 => Command::Halt,
                98 => Command::Resume,
                _ => {
                    Command::SetBand { low: mid - listing.tick * 15, high: mid + listing.tick * 15 }
                }
            };
            SequencedInput { seq, instrument: listing.instrument, command, ..Default::default() }
        })
        .collect()
}

fn feed(state: &mut ShardState, inputs: &[SequencedInput]) {
    for input in inputs {
        state.process(input, &mut |_| {});
    }
}

#[test]
fn snapshot_then_the_rest_equals_the_uninterrupted_run() {
    let inputs = random_inputs(6_000, 11);
    let mut uninterrupted = fresh();
    feed(&mut uninterrupted, &inputs);
    assert!(uninterrupted.core.resting_orders() > 100, "the books hold orders");
    assert!(uninterrupted.core.counters().trades > 100, "orders traded");
    for cut in [1, 777, 3_001, 5_999] {
        let mut before = fresh();
        feed(&mut before, &inputs[..cut]);
        let mut bytes = Vec::new();
        before.write_snapshot(&mut bytes);
        let mut restored = ShardState::restore(&bytes).expect("restores");
        assert_eq!(restored.state_digest(), before.state_digest(), "restore is exact at {cut}");
        assert_eq!(restored.state_hash(), before.state_hash());
        feed(&mut restored, &inputs[cut..]);
        assert_eq!(restored.state_digest(), uninterrupted.state_digest(), "cut at {cut}");
        assert_eq!(restored.hash.hex(), uninterrupted.hash.hex(), "cut at {cut}");
        assert_eq!(restored.core.counters(), uninterrupted.core.counters());
    }
}

#[test]
fn a_damaged_snapshot_payload_is_an_error_not_a_panic() {
    let mut state = fresh();
    feed(&mut state, &random_inputs(2_000, 5));
    let mut bytes = Vec::new();
    state.write_snapshot(&mut bytes);
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..300 {
        let mut damaged = bytes.clone();
        let at = rng.random_range(0..damaged.len());
        damaged[at] ^= 1 << rng.random_range(0..8);
        // A flipped bit may still restore (e.g. a quantity); it must never panic, and what
        // restores must differ from the original.
        if let Ok(restored) = ShardState::restore(&damaged) {
            assert_ne!(restored.state_digest(), state.state_digest(), "bit at byte {at}");
        }
    }
    for len in [0, 7, 100, bytes.len() - 1] {
        assert!(ShardState::restore(&bytes[..len]).is_err(), "truncated to {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(ShardState::restore(&longer).is_err(), "trailing bytes");
}

fn snapshot_config(shards: usize) -> TierConfig {
    TierConfig {
        core_shards: shards,
        order_pool_slots: ORDER_POOL_SLOTS,
        journal: JournalMode::from(Policy::Group),
        snapshot_every_records: 250,
        ..TierConfig::default()
    }
}

fn run_on(config: &TierConfig, dir: &Path, segment_bytes: u64) -> RunResult {
    let options = RunOptions {
        rate_per_s: 8_000.0,
        duration: Duration::from_millis(400),
        record_inputs: true,
        released: None,
        stop: None,
        journal: JournalOptions {
            data_dir: Some(dir.to_path_buf()),
            segment_bytes,
            ..JournalOptions::default()
        },
        load: LoadConfig { events_every: 300, master_updates_every: 700, ..LoadConfig::default() },
    };
    run(config, options, |_| {}).expect("run")
}

fn numbered(dir: &Path, extension: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(&format!(".{extension}")))
        .collect();
    names.sort();
    names
}

/// Replays `inputs` on a fresh shard.
fn replayed(inputs: &[SequencedInput]) -> ShardState {
    let mut state = fresh();
    feed(&mut state, inputs);
    state
}

#[test]
fn the_tier_snapshots_mid_run_prunes_segments_and_recovers_from_the_newest_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = snapshot_config(2);
    // Small segments (about 300 records each) so snapshots make whole segments obsolete.
    let segment_bytes = 16 * 1024;
    let first = run_on(&config, dir.path(), segment_bytes);
    let newest_snapshots: Vec<u64> = (0..config.core_shards)
        .map(|shard| {
            let names = numbered(&dir.path().join(format!("shard-{shard}")), "snap");
            names.last().expect("snapshots written")[..20].parse().unwrap()
        })
        .collect();
    let second = run_on(&config, dir.path(), segment_bytes);
    for (shard, newest_snapshot) in newest_snapshots.into_iter().enumerate() {
        let (a, b) = (&first.shards[shard], &second.shards[shard]);
        let report = first.journal[shard].snapshots.expect("snapshots on");
        assert!(report.taken >= 3, "shard {shard}: {report:?}");
        assert_eq!(report.records_followed, a.recorded.len() as u64, "followed every record");
        let recovery = &second.journal[shard].recovery;
        let last_seq = a.recorded.last().unwrap().seq;
        let snapshot_seq = recovery.snapshot_seq.expect("recovered from a snapshot");
        assert_eq!(snapshot_seq, newest_snapshot, "the newest one");
        let every = config.snapshot_every_records;
        assert_eq!(snapshot_seq, last_seq - last_seq % every, "taken at every multiple");
        assert_eq!(recovery.recovered_seq, last_seq);
        assert_eq!(recovery.replayed_records, last_seq - snapshot_seq, "only the journal after it");
        assert_eq!(recovery.recovered_hash, a.output_hash, "== the live run");
        assert_eq!(recovery.recovered_hash, replayed(&a.recorded).hash.hex(), "== full replay");

        let shard_dir = dir.path().join(format!("shard-{shard}"));
        let segments = numbered(&shard_dir, "seg");
        assert_ne!(segments[0], format!("{:020}.seg", 1), "covered segments are removed");
        assert_eq!(numbered(&shard_dir, "snap").len(), journal::snapshot::SNAPSHOTS_KEPT);
        // Snapshot + journal after it == the full replay of both runs' input, state included.
        let both: Vec<_> = a.recorded.iter().chain(&b.recorded).copied().collect();
        let recovered = recover_from(&shard_dir, RecoverOptions::default(), fresh).unwrap();
        assert!(recovered.snapshot_seq.is_some());
        assert_eq!(recovered.state.state_digest(), replayed(&both).state_digest());
        assert_eq!(recovered.state.hash.hex(), b.output_hash);
    }
}

/// Flips a byte in the middle of a snapshot file.
fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xFF;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_corrupt_snapshot_falls_back_to_the_older_one_or_a_full_replay() {
    let config = snapshot_config(1);
    let dir = tempfile::tempdir().unwrap();
    // Default (large) segments: nothing is pruned, so a full replay stays possible.
    let first = run_on(&config, dir.path(), journal::segment::SEGMENT_BYTES_DEFAULT);
    let inputs = &first.shards[0].recorded;
    let shard_dir = dir.path().join("shard-0");
    let snapshots = numbered(&shard_dir, "snap");
    assert_eq!(snapshots.len(), journal::snapshot::SNAPSHOTS_KEPT);
    let seq_of = |name: &str| name[..20].parse::<u64>().unwrap();
    let expected = replayed(inputs).state_digest();

    damage(&shard_dir.join(&snapshots[1]));
    let recovered = recover_from(&shard_dir, RecoverOptions::default(), fresh).unwrap();
    assert_eq!(recovered.snapshot_seq, Some(seq_of(&snapshots[0])), "the older snapshot");
    assert_eq!(recovered.state.state_digest(), expected);

    damage(&shard_dir.join(&snapshots[0]));
    let recovered = recover_from(&shard_dir, RecoverOptions::default(), fresh).unwrap();
    assert_eq!(recovered.snapshot_seq, None, "no valid snapshot: a full replay");
    assert_eq!(recovered.replayed_records, inputs.len() as u64);
    assert_eq!(recovered.state.state_digest(), expected);

    // The tier itself starts from it and reports the full replay.
    let second = run_on(&config, dir.path(), journal::segment::SEGMENT_BYTES_DEFAULT);
    let recovery = &second.journal[0].recovery;
    assert_eq!((recovery.snapshot_seq, recovery.recovered_seq), (None, inputs.len() as u64));
    assert_eq!(recovery.recovered_hash, first.shards[0].output_hash);
}

#[test]
fn a_snapshot_from_another_configuration_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    run_on(&snapshot_config(1), dir.path(), journal::segment::SEGMENT_BYTES_DEFAULT);
    let other_pool = TierConfig { order_pool_slots: ORDER_POOL_SLOTS * 2, ..snapshot_config(1) };
    let options = short_restart(dir.path());
    let error = run(&other_pool, options, |_| {}).err().expect("refused");
    assert!(matches!(error, exchange::ExchangeError::BadInput(_)), "{error}");
}

#[test]
fn a_restart_refuses_a_deleted_newest_segment_instead_of_starting_from_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let config = snapshot_config(1);
    let first = run_on(&config, dir.path(), 16 * 1024);
    let shard_dir = dir.path().join("shard-0");
    let newest = shard_dir.join(numbered(&shard_dir, "seg").pop().unwrap());
    assert!(!numbered(&shard_dir, "snap").is_empty(), "a snapshot to start from exists");
    assert!(!first.shards[0].recorded.is_empty());
    std::fs::remove_file(&newest).unwrap();

    let options = short_restart(dir.path());
    let error = run(&config, options, |_| {}).err().expect("refused");
    let exchange::ExchangeError::Journal { source: refusal, .. } = &error else {
        panic!("a journal refusal: {error}");
    };
    assert_eq!(refusal.reason(), "newest-segment-missing", "{refusal}");
    assert!(refusal.to_string().contains(&newest.display().to_string()), "names the file");
    let checked = journal::validate::check(&shard_dir).expect_err("journal check agrees");
    assert_eq!(checked.reason(), refusal.reason());
}

/// A 50 ms run at 1K msg/s on the data directory `dir` (a restart of what ran there).
fn short_restart(dir: &std::path::Path) -> RunOptions {
    RunOptions {
        rate_per_s: 1_000.0,
        duration: Duration::from_millis(50),
        record_inputs: false,
        released: None,
        stop: None,
        journal: JournalOptions { data_dir: Some(dir.to_path_buf()), ..Default::default() },
        load: LoadConfig::default(),
    }
}
