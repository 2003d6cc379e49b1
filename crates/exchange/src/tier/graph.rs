//! Wiring: the tier's stages on the pipeline runtime, started, with the feeds its holder or
//! its order source writes and the handles through which each stage's workers report.

use std::sync::Arc;

use journal::{DurableSeq, JournalSender};
use pipeline::WaitStrategy;
use pipeline::placement::Role;
use pipeline::stage::{
    Emitter, Flow, Input, Message, PipelineBuilder, Route, RunningPipeline, StageHandle,
    StageResults, StageSpec,
};

use super::layout::{GroupWait, LayoutChoice, TierLayout, TierStage};
use super::service::TierStart;
use super::workers::{
    CoreWorker, MasterOutcome, MasterWorker, PreprocessWorker, ResponseProcessor, ResponseTotals,
    SenderLatency, SenderWorker,
};
use super::{ExternalEvent, ShardResult, TierConfig, TierInput};
use crate::durability::{ShardRecord, ShardState};
use crate::error::Result;
use crate::master::SnapshotCell;
use crate::msg::{CoreOutput, InboundOrder, REASON_COUNT, Response};
use crate::preprocess::Preprocessor;

/// Where one core shard starts: its recovered state, sequence and journal.
pub(super) struct ShardStart {
    pub(super) state: ShardState,
    pub(super) last_seq: u64,
    pub(super) journal: Option<JournalSender<ShardRecord>>,
}

/// What the stages start from (recovery's output).
pub(super) struct StageStarts {
    pub(super) shards: Vec<ShardStart>,
    /// Per shard, the journal's durable sequence (`None` when off).
    pub(super) durables: Vec<Option<Arc<DurableSeq>>>,
    pub(super) master: MasterWorker,
}

/// The tier's inputs (the intake only when no order source runs in the tier).
pub(super) struct Feeds {
    pub(super) intake: Option<Input<InboundOrder>>,
    pub(super) events: Input<ExternalEvent>,
    pub(super) master: Input<TierInput>,
}

/// Each stage's per-worker results, readable once the pipeline finished.
pub(super) struct StageReports {
    pub(super) shards: StageResults<ShardResult>,
    pub(super) responses: StageResults<ResponseTotals>,
    pub(super) senders: StageResults<SenderLatency>,
    pub(super) master: StageResults<MasterOutcome>,
}

/// The started tier.
pub(super) struct RunningTier {
    pub(super) pipeline: RunningPipeline,
    pub(super) feeds: Feeds,
    pub(super) reports: StageReports,
}

/// Slots of the R-Processor's inbound rings when it holds replies for the journal (`group`,
/// `sync`). Those rings are the hold: replies wait there, in order, until their input is on
/// disk, so while an fsync lasts they fill at the core's output rate. They cover an fsync as
/// long as the journal's own ring does (16,384 inputs) at up to 4 outputs per input (the
/// reference flow makes 2.3). With the default 8,192 slots they covered 7 ms at 500K
/// requests/s, and a slower fsync stalled the core on a full ring: the critical path then
/// carried the fsync (docs/benchmarks/tier-layout.md).
const HELD_REPLIES_RING_SLOTS: usize = 65_536;

/// How each stage runs: its spec under the layout, and whether it is fused after the stage
/// before it.
#[derive(Clone, Copy)]
struct Specs<'a> {
    config: &'a TierConfig,
    layout: &'a TierLayout,
}

impl Specs<'_> {
    /// Thread-per-stage: the configured spec. Auto: the group's workers and wait; spinning
    /// groups are critical (a dedicated core), parked ones ancillary, floating when the plan
    /// gave them no CPU.
    fn of(self, stage: TierStage) -> StageSpec {
        let spec = self.placed(stage);
        if stage == TierStage::Rprocess && self.config.holds_replies() {
            let slots = spec.capacity_slots.max(HELD_REPLIES_RING_SLOTS);
            spec.with_ring(slots, spec.batch_slots_max)
        } else {
            spec
        }
    }

    /// [`Specs::of`] before the reply hold's ring size.
    fn placed(self, stage: TierStage) -> StageSpec {
        let critical = !matches!(stage, TierStage::Events | TierStage::Masterdata);
        let workers = self.layout.workers_of(stage);
        if self.config.layout == LayoutChoice::ThreadPerStage {
            return self
                .config
                .spec(workers, if critical { Role::Critical } else { Role::Ancillary });
        }
        let (role, wait) = match self.layout.group_of(stage).wait {
            GroupWait::Spin => (Role::Critical, WaitStrategy::BusySpin),
            GroupWait::ParkDedicated | GroupWait::ParkFloating => {
                (Role::Ancillary, WaitStrategy::Park)
            }
        };
        let spec = self.config.spec(workers, role).with_wait(wait);
        if self.layout.group_of(stage).wait == GroupWait::ParkFloating {
            spec.floating()
        } else {
            spec
        }
    }

    /// The wait strategy of `stage`'s threads (the R-Processor's durability wait uses it).
    fn wait_of(self, stage: TierStage) -> WaitStrategy {
        self.of(stage).wait
    }

    fn fused(self, stage: TierStage) -> bool {
        self.layout.fused_after_previous(stage)
    }
}

/// Fuses `to` after `from` (same threads, no ring) or connects them with a ring and `route`.
fn link<A: 'static, T: Message, B: 'static>(
    graph: &mut PipelineBuilder,
    fused: bool,
    from: StageHandle<A, T>,
    to: StageHandle<T, B>,
    route: Route<T>,
) {
    if fused { graph.fuse(from, to) } else { graph.connect(from, to, route) }
}

/// Declares every stage and connection of the tier (see the module docs of [`super`]) as
/// `layout` groups them and starts the pipeline.
pub(super) fn start(
    start: &TierStart,
    layout: &TierLayout,
    starts: StageStarts,
    entry: Entry,
) -> Result<RunningTier> {
    let config = &start.config;
    let specs = Specs { config, layout };
    let mut graph = PipelineBuilder::new().pin_threads(config.placement);
    let fed_by_input = matches!(entry, Entry::Input);
    let (entry, entry_fused) = match entry {
        Entry::Input => (graph.input::<InboundOrder>("intake", 1), false),
        Entry::Source(name, source) => order_source(&mut graph, specs, (name, source)),
    };
    let event_feed = graph.input::<ExternalEvent>("event-feed", 1);
    let master_feed = graph.input::<TierInput>("master-feed", 1);
    let cell = starts.master.cell.clone();
    let preprocess = preprocess_stage(&mut graph, specs, &cell);
    let events = events_stage(&mut graph, specs, &cell);
    let mut master_worker = Some(starts.master);
    let (masterdata, master) =
        graph.stage_with_results("masterdata", specs.of(TierStage::Masterdata), move |_| {
            master_worker.take().expect("one master-data worker, started once")
        });
    let (core, shards) = core_stage(&mut graph, specs, start.record_inputs, starts.shards);
    let (rprocess, responses) = rprocess_stage(&mut graph, specs, starts.durables);
    let (senders, sender_results) = sender_stage(&mut graph, specs, start);
    let by_instrument = || Route::by_key(|m: &TierInput| u64::from(m.instrument));
    if entry_fused {
        graph.fuse(entry, preprocess);
    } else {
        graph.connect(entry, preprocess, Route::by_key(|m: &InboundOrder| u64::from(m.instrument)));
    }
    link(&mut graph, specs.fused(TierStage::Core), preprocess, core, by_instrument());
    graph.connect(event_feed, events, Route::RoundRobin);
    graph.connect(events, core, by_instrument());
    let master_fused = specs.fused(TierStage::Masterdata);
    link(&mut graph, master_fused, events, masterdata, Route::RoundRobin);
    graph.connect(master_feed, masterdata, Route::RoundRobin);
    link(&mut graph, specs.fused(TierStage::Rprocess), core, rprocess, Route::RoundRobin);
    let by_outlet = Route::by_key(|r: &Response| u64::from(r.outlet));
    link(&mut graph, specs.fused(TierStage::Sender), rprocess, senders, by_outlet);

    let mut pipeline = graph.start()?;
    let feeds = Feeds {
        intake: fed_by_input.then(|| pipeline.take_inputs(entry).expect("intake input").remove(0)),
        events: pipeline.take_inputs(event_feed).expect("event input").remove(0),
        master: pipeline.take_inputs(master_feed).expect("master input").remove(0),
    };
    let reports = StageReports { shards, responses, senders: sender_results, master };
    Ok(RunningTier { pipeline, feeds, reports })
}

/// Where the tier's orders enter.
pub(super) enum Entry {
    /// The intake: an input stage that a thread outside the tier writes ([`Feeds::intake`]).
    Input,
    /// An order source ([`super::OrderSource`], under its stage name) as its stage runs it:
    /// inline before the pre-process when the layout runs the entry inline
    /// ([`TierLayout::generator_inline`]), else on a thread of its own ahead of a ring.
    Source(&'static str, Box<SourceStage>),
}

/// An order source's stage handler.
pub(super) type SourceStage = dyn FnMut(&mut Emitter<InboundOrder>) -> Flow + Send;

/// Declares the order source: on the pre-process group's spec with the pre-process fused
/// after it (inline), or parked on a thread of its own. Returns whether it is inline.
fn order_source(
    graph: &mut PipelineBuilder,
    specs: Specs,
    (name, source): (&'static str, Box<SourceStage>),
) -> (StageHandle<(), InboundOrder>, bool) {
    let inline = specs.layout.generator_inline;
    let spec = if inline {
        specs.of(TierStage::Preprocess)
    } else {
        StageSpec::ancillary(1).with_wait(WaitStrategy::Park)
    };
    let mut source = Some(source);
    let handle = graph
        .source(name, spec, move |_| source.take().expect("one order source worker, started once"));
    (handle, inline)
}

fn preprocess_stage(
    graph: &mut PipelineBuilder,
    specs: Specs,
    cell: &Arc<SnapshotCell>,
) -> StageHandle<InboundOrder, TierInput> {
    let cell = cell.clone();
    let spec = specs.of(TierStage::Preprocess);
    let state_checks = specs.config.state_checks();
    let (stage, _) = graph.stage_with_results("preprocess", spec, move |_| {
        let reader = cell.reader().expect("preprocess workers <= SNAPSHOT_READERS_MAX");
        PreprocessWorker { preprocess: Preprocessor::new(reader, state_checks) }
    });
    stage
}

fn events_stage(
    graph: &mut PipelineBuilder,
    specs: Specs,
    cell: &Arc<SnapshotCell>,
) -> StageHandle<ExternalEvent, TierInput> {
    let cell = cell.clone();
    graph.stage("events", specs.of(TierStage::Events), move |_| {
        let mut reader = cell.reader().expect("one events reader");
        move |event: &ExternalEvent, out: &mut pipeline::stage::Emitter<TierInput>| {
            out.emit(event.effect(reader.current()).into());
        }
    })
}

fn core_stage(
    graph: &mut PipelineBuilder,
    specs: Specs,
    record: bool,
    shards: Vec<ShardStart>,
) -> (StageHandle<TierInput, CoreOutput>, StageResults<ShardResult>) {
    let mut starts: Vec<Option<ShardStart>> = shards.into_iter().map(Some).collect();
    let spec = specs.of(TierStage::Core);
    graph.stage_with_results("core", spec, move |shard| {
        let start = starts[shard].take().expect("one recovered state per core shard, taken once");
        CoreWorker {
            shard,
            state: start.state,
            last_seq: start.last_seq,
            journal: start.journal,
            journal_failed: false,
            record,
            recorded: Vec::new(),
        }
    })
}

fn rprocess_stage(
    graph: &mut PipelineBuilder,
    specs: Specs,
    durables: Vec<Option<Arc<DurableSeq>>>,
) -> (StageHandle<CoreOutput, Response>, StageResults<ResponseTotals>) {
    let config = specs.config;
    let durables = if config.holds_replies() { durables } else { Vec::new() };
    let (outlets, wait) = (config.outlets, specs.wait_of(TierStage::Rprocess));
    graph.stage_with_results("rprocess", specs.of(TierStage::Rprocess), move |_| {
        ResponseProcessor {
            outlets,
            rejects: [0; REASON_COUNT],
            durables: durables.clone(),
            wait,
            unreleased: 0,
        }
    })
}

fn sender_stage(
    graph: &mut PipelineBuilder,
    specs: Specs,
    start: &TierStart,
) -> (StageHandle<Response, ()>, StageResults<SenderLatency>) {
    let (released, subscribers) = (start.released.clone(), start.subscribers.clone());
    graph.stage_with_results("sender", specs.of(TierStage::Sender), move |sender| SenderWorker {
        outlets: subscribers(sender),
        latency: SenderLatency::new(),
        released: released.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::JournalMode;
    use journal::Policy;

    #[test]
    fn the_reply_hold_rings_cover_an_fsync_when_replies_are_held() {
        let held = TierConfig {
            journal: JournalMode(Some(Policy::Group)),
            layout: LayoutChoice::ThreadPerStage,
            ..TierConfig::default()
        };
        let (_, layout) = super::super::planned::plan_layout(&held, 1.0).unwrap();
        let specs = Specs { config: &held, layout: &layout };
        assert_eq!(specs.of(TierStage::Rprocess).capacity_slots, HELD_REPLIES_RING_SLOTS);
        assert_eq!(specs.of(TierStage::Core).capacity_slots, held.ring_slots);

        let off = TierConfig { journal: JournalMode::OFF, ..held.clone() };
        let specs = Specs { config: &off, layout: &layout };
        assert_eq!(specs.of(TierStage::Rprocess).capacity_slots, off.ring_slots);
    }
}
