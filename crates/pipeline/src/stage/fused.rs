//! Fused stages: a stage run on its upstream stage's thread, with no ring between them.
//!
//! [`super::PipelineBuilder::fuse`] makes stage B run on the threads of stage A (worker i of B
//! on worker i of A): A's emitter hands each message to B's worker through a pre-allocated local
//! buffer, and B's handler runs over the buffer when A's batch is done (or the buffer fills),
//! to completion, before the thread reads its next batch. B keeps its other inbound rings
//! (fan-in from other stages), which the group's thread polls after A's; it keeps its outbound
//! rings and may itself have a stage fused after it (a chain A → B → C on one thread).
//!
//! Metrics per fused stage come from one clock read per local batch, not per message: its run
//! starts at the upstream's closing clock read (taken just before) and ends at its own. The
//! batch's handling time is its busy time and is recorded as each message's service time (the
//! batch mean, `record_n`), and the hand-off latency is the time from the start of the
//! upstream's handling of the batch to the start of B's run over it. Messages B reads from its
//! own rings are timed per ring batch, as in any stage.
//!
//! A panic inside a fused stage unwinds through its upstream's handler; [`in_stage`] wraps
//! it in a [`StagePanic`] naming the fused stage on the way, so the error names the stage
//! whose handler panicked, not the thread's first stage.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;

use super::worker::{Inbound, ResultSlots, finish_into, panic_message};
use super::{Emitter, Envelope, StageWorker};
use crate::metrics::{WorkerMetrics, now_ns};

/// A stage fused after another: driven by the upstream stage's thread through its emitter.
pub(super) trait FusedStage<In>: Send {
    /// Runs the handler over messages handed over by the upstream stage, starting at
    /// `start_ns` (the upstream's closing clock read).
    fn handle_local(&mut self, batch: &[Envelope<In>], start_ns: u64);
    /// Reads a batch from each of its own inbound rings (and those of stages fused after it);
    /// returns how many messages it took.
    fn poll(&mut self) -> usize;
    /// Publishes its buffered output (and its fused stages'); `true` if a downstream ring is
    /// gone (the pipeline is aborting).
    fn flush(&mut self, now_ns: u64) -> bool;
    fn has_input(&self) -> bool;
    /// Every inbound ring of it (and of its fused stages) is disconnected and drained.
    fn inputs_done(&mut self) -> bool;
    /// Called once the stage it is fused after has finished (a source that stopped): finishes
    /// its worker as soon as its own rings are done, before the stages fused after it, since
    /// what the worker closes when it finishes (a handle feeding one of their rings) may be
    /// what they wait for; then asks the stage fused after it the same.
    fn finish_done_workers(&mut self);
    /// Hands back its worker's result and metrics and drops its outbound rings.
    fn finish(self: Box<Self>);
}

/// The panic payload of a fused stage's handler, naming the stage.
pub(super) struct StagePanic {
    pub(super) stage: Arc<str>,
    pub(super) worker: usize,
    pub(super) message: String,
}

/// Runs `body`; a panic in it that does not already name a fused stage is re-raised as a
/// [`StagePanic`] naming `stage`. No cost unless a panic unwinds.
fn in_stage<R>(stage: &Arc<str>, worker: usize, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) if payload.is::<StagePanic>() => resume_unwind(payload),
        Err(payload) => resume_unwind(Box::new(StagePanic {
            stage: stage.clone(),
            worker,
            message: panic_message(payload.as_ref()),
        })),
    }
}

/// One worker of a fused stage.
pub(super) struct Member<In, Out, W: StageWorker<In, Out>> {
    pub(super) stage: Arc<str>,
    pub(super) worker_index: usize,
    pub(super) inbound: Inbound<In>,
    pub(super) emitter: Emitter<Out>,
    /// `None` once finished ([`FusedStage::finish_done_workers`]).
    pub(super) worker: Option<W>,
    pub(super) metrics: WorkerMetrics,
    pub(super) results: ResultSlots<W::Finished>,
}

impl<In, Out, W> FusedStage<In> for Member<In, Out, W>
where
    In: Copy + Send + 'static,
    Out: Copy + Send + 'static,
    W: StageWorker<In, Out>,
{
    fn handle_local(&mut self, batch: &[Envelope<In>], start_ns: u64) {
        let Some(first) = batch.first() else { return };
        let worker = self.worker.as_mut().expect("a finished fused stage is handed no more input");
        let emitter = &mut self.emitter;
        in_stage(&self.stage, self.worker_index, || {
            for envelope in batch {
                emitter.ingress_ns = envelope.ingress_ns;
                emitter.handling_ns = start_ns;
                worker.handle(&envelope.payload, emitter);
            }
        });
        let end_ns = now_ns();
        emitter.handled_until_ns = end_ns;
        let terminal = emitter.is_terminal();
        let count = batch.len() as u64;
        let recorder = self.metrics.recorder();
        recorder.record_batch(count, end_ns - start_ns, start_ns.saturating_sub(first.sent_ns));
        if terminal {
            for envelope in batch {
                recorder.record_end_to_end(end_ns.saturating_sub(envelope.ingress_ns));
            }
        }
    }

    fn poll(&mut self) -> usize {
        let (worker, emitter) = (&mut self.worker, &mut self.emitter);
        let recorder = self.metrics.recorder();
        in_stage(&self.stage, self.worker_index, || {
            let handled = match worker {
                Some(worker) => {
                    let mut handler =
                        |message: &In, out: &mut Emitter<Out>| worker.handle(message, out);
                    self.inbound.handle_available(recorder, emitter, &mut handler)
                }
                None => 0, // finished: its rings are done
            };
            handled + emitter.poll_fused()
        })
    }

    fn flush(&mut self, now_ns: u64) -> bool {
        in_stage(&self.stage, self.worker_index, || self.emitter.flush_at(now_ns));
        self.metrics.recorder().add_messages_out(self.emitter.take_emitted());
        self.metrics.maybe_publish(now_ns);
        self.emitter.disconnected
    }

    fn has_input(&self) -> bool {
        self.inbound.has_input() || self.emitter.fused_have_input()
    }

    fn inputs_done(&mut self) -> bool {
        self.inbound.done() && self.emitter.fused_inputs_done()
    }

    fn finish_done_workers(&mut self) {
        if self.worker.is_some() && self.inbound.done() {
            let worker = self.worker.take().expect("checked above");
            let (results, index) = (&self.results, self.worker_index);
            in_stage(&self.stage, index, || finish_into(worker, results, index));
        }
        if self.worker.is_none() {
            self.emitter.finish_done_fused();
        }
    }

    fn finish(self: Box<Self>) {
        let Member { stage, worker_index, mut emitter, worker, metrics, results, .. } = *self;
        in_stage(&stage, worker_index, || emitter.finish_fused());
        if let Some(worker) = worker {
            in_stage(&stage, worker_index, || finish_into(worker, &results, worker_index));
        }
        metrics.finish();
    }
}
