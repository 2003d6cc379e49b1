//! The whole tier end to end (real threads, real rings): every request is answered, nothing
//! invalid reaches the core, and replaying each shard's recorded sequenced input into a fresh
//! core reproduces the shard's output hash byte for byte.

use std::time::Duration;

use exchange::core::MatchingCore;
use exchange::durability::JournalOptions;
use exchange::flow::reference_master_data;
use exchange::msg::{OutputHash, Reason};
use exchange::tier::TierConfig;
use experiments::tier_load::{LoadConfig, RunOptions, run};

#[test]
fn tier_answers_everything_and_replay_reproduces_every_shard_hash() {
    let config = TierConfig {
        preprocess_workers: 2,
        core_shards: 2,
        senders: 2,
        order_pool_slots: 1 << 14,
        ..TierConfig::default()
    };
    let options = RunOptions {
        rate_per_s: 20_000.0,
        duration: Duration::from_millis(500),
        record_inputs: true,
        journal: JournalOptions::default(),
        released: None,
        stop: None,
        load: LoadConfig { events_every: 500, master_updates_every: 700, ..LoadConfig::default() },
    };
    let result = run(&config, options, |_| {}).expect("run");
    assert!(result.sent > 5_000, "sent {}", result.sent);
    assert_eq!(result.end_to_end.count(), result.sent, "every request answered exactly once");
    let pre_rejects: u64 = Reason::ALL
        .iter()
        .filter(|r| r.is_invalid_input())
        .map(|r| result.rejects[*r as usize])
        .sum();
    assert!(pre_rejects > 0, "the mix holds invalid requests: {:?}", result.rejects);
    assert_eq!(result.shards.len(), 2);

    let listings = reference_master_data(&config.universe).listings();
    let limits = config.core_limits();
    for shard in &result.shards {
        assert_eq!(
            shard.counters.invalid_inputs, 0,
            "nothing invalid reached core shard {}",
            shard.shard
        );
        assert!(!shard.recorded.is_empty());
        let mut replay = MatchingCore::new(&listings, limits);
        let mut hash = OutputHash::default();
        for input in &shard.recorded {
            replay.process(input, &mut |output| hash.update(output));
        }
        assert_eq!(hash.records(), shard.output_records);
        assert_eq!(hash.hex(), shard.output_hash, "shard {} replay", shard.shard);
    }
    // The external events reached the core as control messages (halts reject some orders).
    let halted = result.rejects[Reason::InstrumentHalted as usize];
    assert!(halted > 0, "halts took effect: {:?}", result.rejects);
}
