//! The tier with `--data DIR`: each core shard journals its sequenced input; a restart
//! recovers every shard from DIR to exactly the state the stopped run had reached (its output
//! hash equals the live run's and a replay from scratch of the recorded input) and continues
//! the shard's sequence gap-free.

use std::time::Duration;

use exchange::durability::{JournalMode, JournalOptions, ShardState};
use exchange::flow::reference_master_data;
use exchange::tier::TierConfig;
use experiments::tier_load::{LoadConfig, RunOptions, RunResult, run};
use journal::Policy;

fn config(journal: JournalMode) -> TierConfig {
    TierConfig { core_shards: 2, order_pool_slots: 1 << 14, journal, ..TierConfig::default() }
}

/// The scenario's events and master-data updates, often enough to matter in a short run.
fn load() -> LoadConfig {
    LoadConfig { events_every: 400, master_updates_every: 900, ..LoadConfig::default() }
}

fn options(data_dir: &std::path::Path) -> RunOptions {
    RunOptions {
        load: load(),
        rate_per_s: 10_000.0,
        duration: Duration::from_millis(300),
        record_inputs: true,
        released: None,
        stop: None,
        journal: JournalOptions {
            data_dir: Some(data_dir.to_path_buf()),
            repair: false,
            ..JournalOptions::default()
        },
    }
}

fn run_once(config: &TierConfig, data_dir: &std::path::Path) -> RunResult {
    run_with_load(config, data_dir, load())
}

fn run_with_load(config: &TierConfig, data_dir: &std::path::Path, load: LoadConfig) -> RunResult {
    run(config, RunOptions { load, ..options(data_dir) }, |_| {}).expect("run")
}

/// The output hash of a fresh shard fed `inputs`.
fn replay_hash(config: &TierConfig, inputs: &[exchange::msg::SequencedInput]) -> String {
    let listings = reference_master_data(&config.universe).listings();
    let mut state = ShardState::new(&listings, config.core_limits());
    for input in inputs {
        state.process(input, &mut |_| {});
    }
    state.hash.hex()
}

#[test]
fn restart_from_data_dir_recovers_every_shard_and_continues_its_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(JournalMode::from(Policy::Group));
    let first = run_once(&config, dir.path());
    assert_eq!(first.end_to_end.count(), first.sent, "every request answered");
    assert_eq!(first.critical_path.count(), first.sent);
    let second = run_once(&config, dir.path());
    let third = run_once(&config, dir.path());
    for shard in 0..config.core_shards {
        let (a, b) = (&first.shards[shard], &second.shards[shard]);
        assert!(!a.recorded.is_empty() && !b.recorded.is_empty());
        let first_journal = &first.journal[shard];
        assert_eq!(first_journal.recovery.recovered_seq, 0, "a fresh directory");
        assert_eq!(first_journal.writer.unwrap().records, a.recorded.len() as u64);

        let recovery = &second.journal[shard].recovery;
        let last_seq = a.recorded.last().unwrap().seq;
        assert_eq!(recovery.recovered_seq, last_seq, "shard {shard}");
        assert_eq!(recovery.replayed_records, last_seq);
        assert_eq!(recovery.recovered_hash, a.output_hash, "recovered == the live state");
        assert_eq!(recovery.recovered_hash, replay_hash(&config, &a.recorded), "== replay");
        // Sequencing continues after the recovered sequence, gap-free.
        for (offset, input) in b.recorded.iter().enumerate() {
            assert_eq!(input.seq, last_seq + 1 + offset as u64, "shard {shard}");
        }
        // The restarted shard's live hash continues the first run's: a second restart
        // recovers exactly it, and it equals a replay of both runs' input from scratch.
        let recovery = &third.journal[shard].recovery;
        assert_eq!(recovery.recovered_seq, b.recorded.last().unwrap().seq);
        assert_eq!(recovery.recovered_hash, b.output_hash, "shard {shard}");
        let both: Vec<_> = a.recorded.iter().chain(&b.recorded).copied().collect();
        assert_eq!(recovery.recovered_hash, replay_hash(&config, &both));
    }
}

#[test]
fn a_different_shard_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    run_once(&config(JournalMode::from(Policy::Group)), dir.path());
    let three = TierConfig { core_shards: 3, ..config(JournalMode::from(Policy::Group)) };
    let options = RunOptions {
        rate_per_s: 1_000.0,
        duration: Duration::from_millis(50),
        record_inputs: false,
        released: None,
        stop: None,
        load: load(),
        journal: JournalOptions {
            data_dir: Some(dir.path().to_path_buf()),
            repair: false,
            ..JournalOptions::default()
        },
    };
    let error = run(&three, options, |_| {}).err().expect("refused");
    assert!(matches!(error, exchange::ExchangeError::BadInput(_)), "{error}");
    assert!(format!("{error}").contains("holds 2 shard journals"), "{error}");
}

#[test]
fn every_policy_answers_every_request_and_journals_per_its_policy() {
    for mode in
        [JournalMode::from(Policy::Sync), JournalMode::from(Policy::Relaxed), JournalMode::OFF]
    {
        let dir = tempfile::tempdir().unwrap();
        let config = TierConfig { core_shards: 1, ..config(mode) };
        if mode == JournalMode::OFF {
            let error = run(&config, options(dir.path()), |_| {}).err().expect("needs a journal");
            assert!(matches!(error, exchange::ExchangeError::BadInput(_)), "{error}");
            let options = RunOptions { journal: JournalOptions::default(), ..options(dir.path()) };
            let result = run(&config, options, |_| {}).expect("run");
            assert_eq!(result.end_to_end.count(), result.sent);
            assert!(result.journal[0].writer.is_none());
            continue;
        }
        let result = run_once(&config, dir.path());
        assert_eq!(result.end_to_end.count(), result.sent, "{mode:?}");
        let recorded = result.shards[0].recorded.len() as u64;
        let writer = result.journal[0].writer;
        assert_eq!(writer.unwrap().records, recorded, "{mode:?}");
        if mode == JournalMode::from(Policy::Sync) {
            assert_eq!(writer.unwrap().syncs, recorded, "sync: one fsync per record");
        }
    }
}

#[test]
fn a_corrupt_record_stops_start_up_unless_repair_truncates_there() {
    let dir = tempfile::tempdir().unwrap();
    let config = TierConfig { core_shards: 1, ..config(JournalMode::from(Policy::Group)) };
    run_once(&config, dir.path());
    // Flip a payload byte of the first record: valid records follow, so this is corruption
    // in the middle, not a torn tail.
    let segment = dir.path().join("shard-0").join(format!("{:020}.seg", 1));
    let mut bytes = std::fs::read(&segment).unwrap();
    let at = journal::segment::SEGMENT_HEADER_BYTES as usize + journal::frame::FRAME_HEADER_BYTES;
    bytes[at] ^= 0xFF;
    std::fs::write(&segment, &bytes).unwrap();

    let error = run(&config, options(dir.path()), |_| {}).err().expect("refuses to start");
    // The journal's refusal names the segment; the tier's error says what it was doing.
    let cause = std::error::Error::source(&error).expect("the journal's refusal");
    let message = format!("{error}: {cause}");
    assert!(message.contains("00000000000000000001.seg"), "names the file: {message}");

    let repair = JournalOptions { repair: true, ..options(dir.path()).journal };
    let result = run(&config, RunOptions { journal: repair, ..options(dir.path()) }, |_| {})
        .expect("repair truncates at the corrupt record and starts");
    let recovery = &result.journal[0].recovery;
    assert!(recovery.repaired);
    assert_eq!(recovery.recovered_seq, 0, "the first record and everything after discarded");
    assert_eq!(result.shards[0].recorded[0].seq, 1, "sequencing restarts after the repair");
}

#[test]
fn master_data_changed_mid_run_is_journaled_and_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let config = TierConfig {
        core_shards: 1,
        snapshot_every_records: 40,
        ..config(JournalMode::from(Policy::Group))
    };
    let busy = LoadConfig { events_every: 150, master_updates_every: 60, ..load() };
    let reference = exchange::durability::MasterState {
        data: reference_master_data(&config.universe),
        refused: None,
    };
    let first = run_with_load(&config, dir.path(), busy.clone());
    let master = first.master.clone().expect("journaled with the shards");
    assert_eq!(master.recovery.recovered_seq, 0, "a fresh directory");
    assert!(master.updates_journaled >= 20, "client limits, halts and bands: {master:?}");
    assert!(master.snapshots_taken >= 1, "{master:?}");
    assert_ne!(master.final_digest, reference.digest(), "the master data changed mid-run");

    let second = run_with_load(&config, dir.path(), busy.clone());
    let recovery = &second.master.as_ref().unwrap().recovery;
    assert_eq!(recovery.recovered_seq, master.updates_journaled);
    assert!(recovery.snapshot_seq.is_some(), "from a master snapshot");
    assert_eq!(recovery.recovered_digest, master.final_digest, "== the stopped run's");

    // Without its snapshots, a replay of the whole master journal gives the same data.
    let final_digest = second.master.unwrap().final_digest;
    let master_dir = dir.path().join(exchange::durability::MASTER_DIR);
    for entry in std::fs::read_dir(&master_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "snap") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let options = JournalOptions { data_dir: Some(dir.path().to_path_buf()), ..Default::default() };
    let replayed =
        exchange::durability::open_master(dir.path(), &options, 0, &reference.data).unwrap();
    assert_eq!(replayed.recovery.snapshot_seq, None);
    assert_eq!(replayed.recovery.recovered_digest, final_digest);
    drop(replayed.sender);
    replayed.writer.join().unwrap();
}
