//! Wiring: the tier's stages on the pipeline runtime, started, with the feeds the load
//! generator writes and the handles through which each stage's workers report.

use std::sync::{Arc, Mutex, PoisonError};

use journal::{DurableSeq, JournalSender};
use pipeline::placement::Role;
use pipeline::stage::{Input, PipelineBuilder, Route, RunningPipeline, StageHandle, StageResults};

use super::workers::{
    CoreWorker, MasterOutcome, MasterWorker, PreprocessWorker, RejectInputs, ResponseProcessor,
    ResponseTotals, SenderLatency, SenderWorker,
};
use super::{
    ExternalEvent, RunOptions, ShardResult, SubscriberFactory, TierConfig, TierInput,
    external_event_effect,
};
use crate::durability::{ShardRecord, ShardState};
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

/// The inputs the load generator writes.
pub(super) struct Feeds {
    pub(super) gateway: Input<InboundOrder>,
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

/// Declares every stage and connection of the tier (see the module docs of [`super`]), starts
/// the pipeline and hands the pre-process workers their reject rings.
pub(super) fn start(
    config: &TierConfig,
    options: &RunOptions,
    starts: StageStarts,
    subscribers: SubscriberFactory,
) -> anyhow::Result<RunningTier> {
    let mut graph = PipelineBuilder::new().pin_threads(config.placement);
    let gateway = graph.input::<InboundOrder>("gateway", 1);
    let event_feed = graph.input::<ExternalEvent>("event-feed", 1);
    let master_feed = graph.input::<TierInput>("master-feed", 1);
    let rejects = graph.input::<CoreOutput>("rejects", config.preprocess_workers);
    let cell = starts.master.cell.clone();
    let reject_inputs: RejectInputs = Arc::new(Mutex::new(Vec::new()));
    let preprocess = preprocess_stage(&mut graph, config, &cell, &reject_inputs);
    let events = events_stage(&mut graph, config, &cell);
    let mut master_worker = Some(starts.master);
    let (masterdata, master) =
        graph.stage_with_results("masterdata", config.spec(1, Role::Ancillary), move |_| {
            master_worker.take().expect("one master-data worker, started once")
        });
    let (core, shards) = core_stage(&mut graph, config, options, starts.shards);
    let (rprocess, responses) = rprocess_stage(&mut graph, config, starts.durables);
    let (senders, sender_results) = sender_stage(&mut graph, config, options, subscribers);
    let by_instrument = || Route::by_key(|m: &TierInput| u64::from(m.instrument));
    graph.connect(gateway, preprocess, Route::by_key(|m: &InboundOrder| u64::from(m.instrument)));
    graph.connect(preprocess, core, by_instrument());
    graph.connect(event_feed, events, Route::RoundRobin);
    graph.connect(events, core, by_instrument());
    graph.connect(events, masterdata, Route::RoundRobin);
    graph.connect(master_feed, masterdata, Route::RoundRobin);
    graph.connect(core, rprocess, Route::RoundRobin);
    graph.connect(rejects, rprocess, Route::RoundRobin);
    graph.connect(rprocess, senders, Route::by_key(|r: &Response| u64::from(r.gateway)));

    let mut pipeline = graph.start()?;
    let taken = pipeline.take_inputs(rejects).expect("rejects input");
    *reject_inputs.lock().unwrap_or_else(PoisonError::into_inner) =
        taken.into_iter().map(Some).collect();
    let feeds = Feeds {
        gateway: pipeline.take_inputs(gateway).expect("gateway input").remove(0),
        events: pipeline.take_inputs(event_feed).expect("event input").remove(0),
        master: pipeline.take_inputs(master_feed).expect("master input").remove(0),
    };
    let reports = StageReports { shards, responses, senders: sender_results, master };
    Ok(RunningTier { pipeline, feeds, reports })
}

fn preprocess_stage(
    graph: &mut PipelineBuilder,
    config: &TierConfig,
    cell: &Arc<SnapshotCell>,
    reject_inputs: &RejectInputs,
) -> StageHandle<InboundOrder, TierInput> {
    let (cell, reject_inputs) = (cell.clone(), reject_inputs.clone());
    let spec = config.spec(config.preprocess_workers, Role::Critical);
    // The stage's result is `()`: finishing only closes each worker's reject ring.
    let (stage, _) = graph.stage_with_results("preprocess", spec, move |worker| {
        let reader = cell.reader().expect("preprocess workers <= SNAPSHOT_READERS_MAX");
        PreprocessWorker {
            preprocess: Preprocessor::new(reader),
            worker,
            rejects: None,
            reject_inputs: reject_inputs.clone(),
        }
    });
    stage
}

fn events_stage(
    graph: &mut PipelineBuilder,
    config: &TierConfig,
    cell: &Arc<SnapshotCell>,
) -> StageHandle<ExternalEvent, TierInput> {
    let cell = cell.clone();
    graph.stage("events", config.spec(1, Role::Ancillary), move |_| {
        let mut reader = cell.reader().expect("one events reader");
        move |event: &ExternalEvent, out: &mut pipeline::stage::Emitter<TierInput>| {
            out.emit(external_event_effect(event, reader.current()));
        }
    })
}

fn core_stage(
    graph: &mut PipelineBuilder,
    config: &TierConfig,
    options: &RunOptions,
    shards: Vec<ShardStart>,
) -> (StageHandle<TierInput, CoreOutput>, StageResults<ShardResult>) {
    let mut starts: Vec<Option<ShardStart>> = shards.into_iter().map(Some).collect();
    let record = options.record_inputs;
    let spec = config.spec(config.core_shards, Role::Critical);
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
    config: &TierConfig,
    durables: Vec<Option<Arc<DurableSeq>>>,
) -> (StageHandle<CoreOutput, Response>, StageResults<ResponseTotals>) {
    let durables = if config.journal.holds_replies() { durables } else { Vec::new() };
    let (gateways, wait) = (config.gateways, config.wait_strategy());
    graph.stage_with_results("rprocess", config.spec(1, Role::Critical), move |_| {
        ResponseProcessor {
            gateways,
            rejects: [0; REASON_COUNT],
            durables: durables.clone(),
            wait,
            unreleased: 0,
        }
    })
}

fn sender_stage(
    graph: &mut PipelineBuilder,
    config: &TierConfig,
    options: &RunOptions,
    subscribers: SubscriberFactory,
) -> (StageHandle<Response, ()>, StageResults<SenderLatency>) {
    let publish_work_ns = config.publish_work_ns;
    let released = options.released.clone();
    graph.stage_with_results("sender", config.spec(config.senders, Role::Critical), move |sender| {
        SenderWorker {
            gateways: subscribers(sender),
            publish_work_ns,
            latency: SenderLatency::new(),
            released: released.clone(),
        }
    })
}
