//! The tier with `--data DIR`: each core shard journals its sequenced input; a restart
//! recovers every shard from DIR to exactly the state the stopped run had reached (its output
//! hash equals the live run's and a replay from scratch of the recorded input) and continues
//! the shard's sequence gap-free.

use std::time::Duration;

use exchange::core::CoreLimits;
use exchange::durability::{JournalMode, JournalOptions, ShardState};
use exchange::flow::reference_master_data;
use exchange::tier::{RunOptions, RunResult, TierConfig, run};

fn config(journal: JournalMode) -> TierConfig {
    TierConfig {
        core_shards: 2,
        events_every: 400,
        master_updates_every: 900,
        order_pool_slots: 1 << 14,
        journal,
        ..TierConfig::default()
    }
}

fn run_once(config: &TierConfig, data_dir: &std::path::Path) -> RunResult {
    let options = RunOptions {
        rate_per_s: 10_000.0,
        duration: Duration::from_millis(300),
        record_inputs: true,
        journal: JournalOptions { data_dir: Some(data_dir.to_path_buf()), repair: false },
    };
    run(config, options, |_| {}).expect("run")
}

/// The output hash of a fresh shard fed `inputs`.
fn replay_hash(config: &TierConfig, inputs: &[exchange::msg::SequencedInput]) -> String {
    let listings = reference_master_data(&config.universe).listings();
    let mut state =
        ShardState::new(&listings, CoreLimits { order_pool_slots: config.order_pool_slots });
    for input in inputs {
        state.process(input, &mut |_| {});
    }
    state.hash.hex()
}

#[test]
fn restart_from_data_dir_recovers_every_shard_and_continues_its_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(JournalMode::Group);
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
    run_once(&config(JournalMode::Group), dir.path());
    let three = TierConfig { core_shards: 3, ..config(JournalMode::Group) };
    let options = RunOptions {
        rate_per_s: 1_000.0,
        duration: Duration::from_millis(50),
        record_inputs: false,
        journal: JournalOptions { data_dir: Some(dir.path().to_path_buf()), repair: false },
    };
    let error = run(&three, options, |_| {}).err().expect("refused");
    assert!(error.downcast_ref::<lab::outcome::BadInput>().is_some(), "{error:#}");
    assert!(format!("{error}").contains("holds 2 shard journals"), "{error}");
}

#[test]
fn every_policy_answers_every_request_and_journals_per_its_policy() {
    for mode in [JournalMode::Sync, JournalMode::Relaxed, JournalMode::Off] {
        let dir = tempfile::tempdir().unwrap();
        let config = TierConfig { core_shards: 1, ..config(mode) };
        let result = run_once(&config, dir.path());
        assert_eq!(result.end_to_end.count(), result.sent, "{mode:?}");
        let recorded = result.shards[0].recorded.len() as u64;
        let writer = result.journal[0].writer;
        match mode {
            JournalMode::Off => assert!(writer.is_none()),
            _ => assert_eq!(writer.unwrap().records, recorded, "{mode:?}"),
        }
        if mode == JournalMode::Sync {
            assert_eq!(writer.unwrap().syncs, recorded, "sync: one fsync per record");
        }
    }
}
