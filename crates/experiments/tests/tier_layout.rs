//! The tier under the `auto` layout: the planned thread groups run fused (the critical chain
//! on one thread with the journal off, cut after the core when replies are held), every
//! request is answered once, replay reproduces each shard's hash, and each fused stage still
//! reports its own metrics. Service times are given, so no calibration run is needed and the
//! plan does not depend on how loaded the host is.

use std::time::Duration;

use exchange::core::{CoreLimits, MatchingCore};
use exchange::durability::{JournalMode, JournalOptions};
use exchange::flow::reference_master_data;
use exchange::msg::OutputHash;
use exchange::tier::layout::{CHAIN, TierStage};
use exchange::tier::{LayoutChoice, ServiceTimes, TierConfig};
use experiments::tier_load::{LoadConfig, RunOptions, RunResult, run};

const SERVICE: ServiceTimes =
    ServiceTimes { preprocess_ns: 400.0, core_ns: 1_500.0, rprocess_ns: 200.0, sender_ns: 300.0 };

/// A run at `rate_per_s` for `millis` ms with the default journal options.
fn options(rate_per_s: f64, millis: u64, record_inputs: bool) -> RunOptions {
    RunOptions {
        rate_per_s,
        duration: Duration::from_millis(millis),
        record_inputs,
        journal: JournalOptions::default(),
        released: None,
        stop: None,
        load: LoadConfig::default(),
    }
}

fn run_auto(journal: JournalMode) -> RunResult {
    run_auto_with(journal, None)
}

/// `auto` with the generator where `generator_inline` says (`None`: where the plan puts it).
fn run_auto_with(journal: JournalMode, generator_inline: Option<bool>) -> RunResult {
    let config = TierConfig {
        layout: LayoutChoice::Auto,
        service_ns: Some(SERVICE),
        generator_inline,
        journal,
        order_pool_slots: 1 << 14,
        ..TierConfig::default()
    };
    let load = LoadConfig { events_every: 400, master_updates_every: 900, ..LoadConfig::default() };
    let options = RunOptions { load, ..options(10_000.0, 400, true) };
    run(&config, options, |_| {}).expect("run")
}

fn check_answers_and_replay(result: &RunResult) {
    assert!(result.sent > 2_000, "sent {}", result.sent);
    assert_eq!(result.end_to_end.count(), result.sent, "every request answered exactly once");
    let listings = reference_master_data(&TierConfig::default().universe).listings();
    let limits = CoreLimits { order_pool_slots: 1 << 14, ..CoreLimits::default() };
    for shard in &result.shards {
        let mut replay = MatchingCore::new(&listings, limits);
        let mut hash = OutputHash::default();
        for input in &shard.recorded {
            replay.process(input, &mut |output| hash.update(output));
        }
        assert_eq!(hash.hex(), shard.output_hash, "shard {} replay", shard.shard);
    }
    // Each stage, fused or not, reports what it handled.
    for stage in CHAIN {
        let metrics = result.pipeline.iter().find(|m| m.stage == stage.name()).unwrap();
        assert!(metrics.messages_in > 0, "{}: {metrics:?}", stage.name());
        assert_eq!(metrics.service_ns.count, metrics.messages_in, "{}", stage.name());
    }
    assert_eq!(result.layout_utilization.len(), result.layout.groups.len());
    let chain = result.layout.group_of(TierStage::Preprocess);
    let measured = result.layout_utilization[0];
    assert!(measured > 0.0 && measured <= 1.0, "{measured} for {}", chain.label());
}

#[test]
fn auto_with_the_journal_off_runs_the_whole_chain_on_one_thread() {
    let result = run_auto(JournalMode::OFF);
    assert_eq!(result.layout.groups[0].stages, CHAIN, "{:?}", result.layout);
    check_answers_and_replay(&result);
}

#[test]
fn auto_with_held_replies_cuts_after_the_core_and_still_answers_everything() {
    let result = run_auto(JournalMode::default());
    assert!(result.journal_mode.holds_replies());
    let first = &result.layout.groups[0];
    assert_eq!(first.stages, [TierStage::Preprocess, TierStage::Core], "{:?}", result.layout);
    assert!(!result.layout.fused_after_previous(TierStage::Rprocess));
    check_answers_and_replay(&result);
    for shard in &result.journal {
        let writer = shard.writer.as_ref().expect("journaling");
        assert!(writer.records > 0, "{writer:?}");
    }
}

#[test]
fn a_generator_inline_before_the_preprocess_feeds_every_request_through_the_chain() {
    for journal in [JournalMode::OFF, JournalMode::default()] {
        let result = run_auto_with(journal, Some(true));
        assert!(result.layout.generator_inline, "{:?}", result.layout);
        check_answers_and_replay(&result);
        let generator = result.pipeline.iter().find(|m| m.stage == "generator").unwrap();
        assert_eq!(generator.messages_out, result.sent, "{generator:?}");
        let preprocess = result.pipeline.iter().find(|m| m.stage == "preprocess").unwrap();
        assert_eq!(preprocess.messages_in, result.sent, "fused after the generator: {journal:?}");
        assert!(result.send_lag.count() == result.sent, "the inline generator's lag is reported");
    }
    // Outside the tier, as before, when the configuration says so.
    let outside = run_auto_with(JournalMode::OFF, Some(false));
    assert!(!outside.layout.generator_inline);
    check_answers_and_replay(&outside);
}

#[test]
fn an_inline_generator_needs_a_single_preprocess_worker() {
    let config = TierConfig {
        layout: LayoutChoice::ThreadPerStage,
        preprocess_workers: 2,
        generator_inline: Some(true),
        ..TierConfig::default()
    };
    let options = options(1_000.0, 50, false);
    let Err(error) = run(&config, options, |_| {}) else { panic!("the run should be refused") };
    assert!(error.to_string().contains("generator_inline"), "{error}");
}

#[test]
fn thread_per_stage_stays_available() {
    let config = TierConfig {
        layout: LayoutChoice::ThreadPerStage,
        journal: JournalMode::OFF,
        order_pool_slots: 1 << 14,
        ..TierConfig::default()
    };
    let options = options(10_000.0, 300, false);
    let result = run(&config, options, |_| {}).expect("run");
    assert_eq!(result.end_to_end.count(), result.sent);
    assert!(result.layout.groups.iter().all(|g| g.stages.len() == 1), "{:?}", result.layout);
    assert_eq!(result.layout.workers_of(TierStage::Preprocess), config.preprocess_workers);
}

#[test]
fn bad_service_times_are_bad_input() {
    let service = ServiceTimes { core_ns: f64::NAN, ..SERVICE };
    let config = TierConfig { service_ns: Some(service), ..TierConfig::default() };
    let error = config.validate().unwrap_err();
    assert!(error.to_string().contains("service_ns"), "{error}");
    let fused = ServiceTimes { sender_ns: -1.0, ..SERVICE };
    let config = TierConfig { fused_service_ns: Some(fused), ..TierConfig::default() };
    let error = config.validate().unwrap_err();
    assert!(error.to_string().contains("fused_service_ns"), "{error}");
}
