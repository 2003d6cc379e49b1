//! The tier's stage workers. Each is a [`StageWorker`]: it owns its state while the pipeline
//! runs and hands its totals back from [`StageWorker::finish`] on its own thread, which the
//! run collects through the stage's [`pipeline::stage::StageResults`].

use std::sync::Arc;

use journal::{DurableSeq, JournalSender, JournalWriter, Snapshotter};
use pipeline::WaitStrategy;
use pipeline::metrics::now_ns;
use pipeline::stage::{Emitter, StageWorker};
use stats::LatencyHistogram;

use super::{
    MasterReport, ReleasedSeqs, STAGE_SPLIT_SAMPLE_EVERY, STAGE_SPLITS, ShardResult, Subscriber,
    TierInput, preprocessed, response_to,
};
use crate::durability::{
    MasterJournal, MasterRecord, MasterRecovery, MasterState, ShardRecord, ShardState,
};
use crate::master::{MasterData, MasterUpdate, SnapshotCell};
use crate::msg::{
    Command, CoreOutput, InboundOrder, OutputKind, REASON_COUNT, Response, SequencedInput, Stamps,
};
use crate::preprocess::Preprocessor;

pub(super) struct PreprocessWorker {
    pub(super) preprocess: Preprocessor,
}

impl StageWorker<InboundOrder, TierInput> for PreprocessWorker {
    type Finished = ();

    fn handle(&mut self, request: &InboundOrder, out: &mut Emitter<TierInput>) {
        let mut stamps = request.stamps;
        // Arrival stamps are the runtime's batch start: no clock read per message.
        stamps.preprocess_in_ns = out.handling_ns();
        stamps.ready_ns = stamps.preprocess_in_ns;
        // A refused request travels to the core too (no ring of its own to the R-Processor),
        // so its reject keeps its place among the outputs of the orders around it.
        let input = preprocessed(request, self.preprocess.check(request), stamps);
        out.emit(input);
    }

    fn finish(self) {}
}

pub(super) struct CoreWorker {
    pub(super) shard: usize,
    pub(super) state: ShardState,
    /// The sequencer of this shard's fan-in: last assigned sequence number.
    pub(super) last_seq: u64,
    /// The shard's journal (`None` when off).
    pub(super) journal: Option<JournalSender<ShardRecord>>,
    /// The journal writer stopped: no later reply of this shard is released.
    pub(super) journal_failed: bool,
    pub(super) record: bool,
    pub(super) recorded: Vec<SequencedInput>,
}

impl StageWorker<TierInput, CoreOutput> for CoreWorker {
    /// Finishing drops the journal sender, so the shard's writer drains, syncs and stops.
    type Finished = ShardResult;

    fn handle(&mut self, input: &TierInput, out: &mut Emitter<CoreOutput>) {
        if let Some(refusal) = input.refused {
            // Answered here, unsequenced and unjournaled: it changes no book.
            let reject = refusal.reject(input.instrument, input.stamps);
            out.emit(CoreOutput { shard: self.shard as u32, ..reject });
            return;
        }
        if input.command == Command::Nop {
            return;
        }
        self.last_seq += 1;
        let stamps = Stamps { core_in_ns: out.handling_ns(), ..input.stamps };
        let sequenced = SequencedInput {
            seq: self.last_seq,
            instrument: input.instrument,
            command: input.command,
            stamps,
        };
        // The journaling boundary. `group`: a ring push (no syscall; a full ring waits, which
        // is back-pressure); `sync`: also waits for the record's fsync.
        if let Some(journal) = &mut self.journal
            && !self.journal_failed
            && journal.append(ShardRecord(sequenced)).is_err()
        {
            // The writer logged and returned its error; the durable sequence stops here,
            // so the R-Processor releases no later reply of this shard.
            self.journal_failed = true;
        }
        if self.record {
            self.recorded.push(sequenced);
        }
        let shard = self.shard as u32;
        // The critical path ends when the core emits the request's first output (its answer):
        // one clock read per request, shared by the fills that follow it.
        let mut ready_ns = None;
        self.state.process(&sequenced, &mut |output| {
            let stamps = Stamps { ready_ns: *ready_ns.get_or_insert_with(now_ns), ..output.stamps };
            out.emit(CoreOutput { shard, stamps, ..*output });
        });
    }

    fn finish(self) -> ShardResult {
        ShardResult {
            shard: self.shard,
            output_hash: self.state.hash.hex(),
            output_records: self.state.hash.records(),
            counters: self.state.core.counters(),
            recorded: self.recorded,
        }
    }
}

pub(super) struct ResponseProcessor {
    pub(super) outlets: u32,
    pub(super) rejects: [u64; REASON_COUNT],
    /// Per shard, the journal's durable sequence when replies are held (`group`, `sync`).
    pub(super) durables: Vec<Option<Arc<DurableSeq>>>,
    pub(super) wait: WaitStrategy,
    /// Replies never released because a journal writer failed.
    pub(super) unreleased: u64,
}

/// What the R-Processor counted.
pub(super) struct ResponseTotals {
    pub(super) rejects: [u64; REASON_COUNT],
    pub(super) unreleased: u64,
}

impl ResponseProcessor {
    /// The reply hold. A shard's outputs arrive in sequence order and its durable sequence
    /// only grows, so waiting for the head output releases every reply in order with no
    /// queue of its own (the inbound ring holds the rest); the core runs on meanwhile.
    fn durable(&self, output: &CoreOutput) -> bool {
        if output.seq == 0 {
            return true; // a pre-process reject: no journaled input caused it
        }
        match self.durables.get(output.shard as usize) {
            Some(Some(durable)) => durable.wait_for(output.seq, self.wait).is_ok(),
            _ => true,
        }
    }
}

impl StageWorker<CoreOutput, Response> for ResponseProcessor {
    type Finished = ResponseTotals;

    fn handle(&mut self, output: &CoreOutput, out: &mut Emitter<Response>) {
        if !self.durable(output) {
            self.unreleased += 1;
            return;
        }
        let rprocess_in_ns = out.handling_ns();
        let output = CoreOutput { stamps: Stamps { rprocess_in_ns, ..output.stamps }, ..*output };
        if output.kind == OutputKind::Rejected {
            self.rejects[output.reason as usize] += 1;
        }
        out.emit(response_to(output, self.outlets));
    }

    fn finish(self) -> ResponseTotals {
        ResponseTotals { rejects: self.rejects, unreleased: self.unreleased }
    }
}

pub(super) struct SenderWorker {
    pub(super) outlets: Vec<Box<dyn Subscriber>>,
    pub(super) latency: SenderLatency,
    pub(super) released: Option<Arc<ReleasedSeqs>>,
}

/// What the R-Senders measured; merged over senders at the end of the run.
pub(super) struct SenderLatency {
    pub(super) end_to_end: LatencyHistogram,
    pub(super) critical_path: LatencyHistogram,
    /// Per split of [`STAGE_SPLITS`], sampled (see [`STAGE_SPLIT_SAMPLE_EVERY`]).
    pub(super) stage_latency: Vec<LatencyHistogram>,
    pub(super) delivered: u64,
    /// Answered requests that reached the core: the sampling stride's counter.
    pub(super) reached_core: u64,
}

impl SenderLatency {
    pub(super) fn new() -> SenderLatency {
        SenderLatency {
            end_to_end: LatencyHistogram::new(),
            critical_path: LatencyHistogram::new(),
            stage_latency: STAGE_SPLITS.iter().map(|_| LatencyHistogram::new()).collect(),
            delivered: 0,
            reached_core: 0,
        }
    }

    pub(super) fn merge(&mut self, other: &SenderLatency) {
        self.end_to_end.merge(&other.end_to_end);
        self.critical_path.merge(&other.critical_path);
        for (total, part) in self.stage_latency.iter_mut().zip(&other.stage_latency) {
            total.merge(part);
        }
        self.delivered += other.delivered;
        self.reached_core += other.reached_core;
    }
}

impl StageWorker<Response, ()> for SenderWorker {
    type Finished = SenderLatency;

    fn handle(&mut self, response: &Response, out: &mut Emitter<()>) {
        let sender_in_ns = out.handling_ns();
        // The by-outlet route sends each outlet's responses to one sender, in order; each
        // sender holds a subscriber slot for every outlet and uses those routed to it.
        self.outlets[response.outlet as usize].deliver(response);
        self.latency.delivered += 1;
        if let Some(released) = &self.released
            && response.output.seq > 0
        {
            released.record(response.output.shard, response.output.seq);
        }
        if !response.answers_request {
            return;
        }
        let done_ns = now_ns();
        let s = response.output.stamps;
        self.latency.end_to_end.record_ns(done_ns.saturating_sub(s.intended_ns));
        self.latency.critical_path.record_ns(s.ready_ns.saturating_sub(s.intended_ns));
        if s.core_in_ns == 0 {
            return; // a pre-process reject: it skipped the core
        }
        self.latency.reached_core += 1;
        if !self.latency.reached_core.is_multiple_of(STAGE_SPLIT_SAMPLE_EVERY) {
            return;
        }
        let splits = [
            s.preprocess_in_ns.saturating_sub(s.intended_ns),
            s.core_in_ns.saturating_sub(s.preprocess_in_ns),
            s.rprocess_in_ns.saturating_sub(s.core_in_ns),
            sender_in_ns.saturating_sub(s.rprocess_in_ns),
            done_ns.saturating_sub(sender_in_ns),
        ];
        for (histogram, ns) in self.latency.stage_latency.iter_mut().zip(splits) {
            histogram.record_ns(ns);
        }
    }

    fn finish(self) -> SenderLatency {
        self.latency
    }
}

/// The master-data process: the single writer of the [`SnapshotCell`]. With a journal, each
/// update it applies is journaled write-ahead (the append returns after its fdatasync) and
/// only then published, so the pre-process never acts on master data a crash could lose.
pub(super) struct MasterWorker {
    pub(super) cell: Arc<SnapshotCell>,
    /// The writer's own copy of the current version (what it journals and snapshots).
    state: MasterState,
    journal: Option<JournalSender<MasterRecord>>,
    last_seq: u64,
    /// The snapshotter and its interval in journaled updates.
    snapshots: Option<(Snapshotter, u64)>,
    recovery: Option<MasterRecovery>,
    journaled: u64,
    /// Why the journal or the snapshots stopped, if they did.
    errors: Vec<String>,
}

/// What the master-data process reports when it finishes.
pub(super) struct MasterOutcome {
    /// `None` when journaling is off (or the journal stopped).
    pub(super) report: Option<MasterReport>,
    pub(super) errors: Vec<String>,
}

impl MasterWorker {
    /// The worker over a new cell holding `reference`, started from the recovered master data
    /// when journaling; also returns the journal's writer, for the run to join.
    pub(super) fn start(
        journal: Option<MasterJournal>,
        reference: MasterData,
    ) -> (MasterWorker, Option<JournalWriter>) {
        let mut worker = MasterWorker {
            cell: SnapshotCell::new(reference.clone()),
            state: MasterState { data: reference, refused: None },
            journal: None,
            last_seq: 0,
            snapshots: None,
            recovery: None,
            journaled: 0,
            errors: Vec::new(),
        };
        let Some(journal) = journal else {
            return (worker, None);
        };
        worker.cell.publish(journal.state.data.clone());
        worker.state = journal.state;
        worker.journal = Some(journal.sender);
        worker.last_seq = journal.last_seq;
        worker.snapshots = journal.snapshots;
        worker.recovery = Some(journal.recovery);
        (worker, Some(journal.writer))
    }

    /// Journals `update` write-ahead; `false` (and the journal stops) when the write failed.
    fn journal(&mut self, update: MasterUpdate) -> bool {
        let Some(journal) = &mut self.journal else {
            return true;
        };
        let record = MasterRecord { seq: self.last_seq + 1, update };
        if let Err(error) = journal.append(record) {
            // Nothing is published after a failed journal write: the pre-process keeps the
            // last durable version, and the run reports the failure.
            self.errors
                .push(format!("master journal stopped, update {update:?} not applied: {error}"));
            self.journal = None;
            self.recovery = None;
            return false;
        }
        self.last_seq += 1;
        self.journaled += 1;
        true
    }
}

impl StageWorker<TierInput, ()> for MasterWorker {
    type Finished = MasterOutcome;

    fn handle(&mut self, input: &TierInput, _: &mut Emitter<()>) {
        if input.master == MasterUpdate::None {
            return;
        }
        let mut next = self.state.data.clone();
        if let Err(why) = next.apply(&input.master) {
            tracing::warn!("master-data update {:?} refused: {why}", input.master);
            return;
        }
        if !self.journal(input.master) {
            return;
        }
        self.state.data = next;
        self.cell.publish(self.state.data.clone());
        if let Some((snapshotter, every_records)) = &mut self.snapshots
            && self.last_seq.is_multiple_of(*every_records)
        {
            snapshotter.offer(self.last_seq, &self.state);
        }
    }

    /// Closes the journal (its writer drains and stops) and waits for the snapshotter.
    fn finish(mut self) -> MasterOutcome {
        drop(self.journal.take());
        let taken = match self.snapshots.take().map(|(snapshotter, _)| snapshotter.finish()) {
            Some(Ok(stats)) => stats.taken,
            Some(Err(error)) => {
                self.errors.push(format!("master snapshot thread stopped: {error}"));
                0
            }
            None => 0,
        };
        let report = self.recovery.take().map(|recovery| MasterReport {
            recovery,
            updates_journaled: self.journaled,
            snapshots_taken: taken,
            final_digest: self.state.digest(),
        });
        MasterOutcome { report, errors: self.errors }
    }
}
