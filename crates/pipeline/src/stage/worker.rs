//! Worker threads: pinning, the panic boundary, the source loop and the consuming (fan-in) loop.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::fused::StagePanic;
use super::{Emitter, Envelope, Flow, PipelineError, StageWorker};
use crate::connector::Receiver;
use crate::metrics::{Recorder, StageMetricsHub, WorkerMetrics, now_ns};
use crate::placement::{ThreadPlacement, pin_current_thread};
use crate::wait::{Parker, WaitStrategy, Waiter};

/// Everything a stage's launcher needs besides its ports.
pub(super) struct LaunchContext {
    pub(super) stage: Arc<str>,
    pub(super) shared: Arc<Shared>,
    pub(super) hub: Arc<StageMetricsHub>,
    pub(super) placements: Vec<ThreadPlacement>,
    pub(super) wait: WaitStrategy,
    pub(super) consumer_parkers: Vec<Arc<Parker>>,
    pub(super) read_batch_max: usize,
    pub(super) pin_threads: bool,
    /// The stage is fused after another: launching builds workers for that stage's threads.
    pub(super) fused: bool,
}

/// State shared by all workers of one running pipeline.
pub(super) struct Shared {
    /// Sources stop at their next call; the rest drains.
    pub(super) stop: AtomicBool,
    /// Every worker stops at its next batch (a handler panicked or the pipeline was dropped).
    pub(super) abort: AtomicBool,
    pub(super) failure: Mutex<Option<PipelineError>>,
    pub(super) pin_failures: Mutex<Vec<String>>,
    pub(super) parkers: Vec<Arc<Parker>>,
}

impl Shared {
    #[inline]
    pub(super) fn aborted(&self) -> bool {
        // Acquire: pairs with the Release in `abort`; the parker's fences order it against sleep.
        self.abort.load(Ordering::Acquire)
    }

    pub(super) fn abort(&self) {
        // Release, then the SeqCst fence inside `notify`: a worker about to sleep either sees
        // the flag in its re-check or is woken (the Parker protocol in `crate::wait`).
        self.abort.store(true, Ordering::Release);
        for parker in &self.parkers {
            parker.notify();
        }
    }

    pub(super) fn fail(&self, error: PipelineError) {
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        failure.get_or_insert(error);
        drop(failure);
        self.abort();
    }
}

/// Spawns one thread per `(worker, body)`: pins it, runs `body` under `catch_unwind`, publishes
/// its metrics and turns a panic into [`PipelineError::StagePanicked`].
pub(super) fn launch_workers<B>(
    context: &LaunchContext,
    workers: impl Iterator<Item = (usize, B)>,
) -> Result<Vec<JoinHandle<()>>, PipelineError>
where
    B: FnOnce(&Shared, &mut WorkerMetrics) + Send + 'static,
{
    let mut threads = Vec::new();
    for (worker, body) in workers {
        let stage = context.stage.clone();
        let shared = context.shared.clone();
        let mut metrics = context.hub.worker(worker);
        // A floating stage's placement is the CPUs no exclusive placement holds.
        let placement = context.placements.get(worker).filter(|_| context.pin_threads).cloned();
        let thread =
            std::thread::Builder::new().name(format!("{stage}/{worker}")).spawn(move || {
                if let Some(placement) = placement {
                    pin(&shared, &placement);
                }
                let outcome = catch_unwind(AssertUnwindSafe(|| body(&shared, &mut metrics)));
                metrics.finish();
                if let Err(panic) = outcome {
                    // A fused stage's panic names that stage (see `fused::in_stage`).
                    let error = match panic.downcast::<StagePanic>() {
                        Ok(named) => PipelineError::StagePanicked {
                            stage: named.stage.to_string(),
                            worker: named.worker,
                            message: named.message,
                        },
                        Err(panic) => PipelineError::StagePanicked {
                            stage: stage.to_string(),
                            worker,
                            message: panic_message(panic.as_ref()),
                        },
                    };
                    shared.fail(error);
                }
            });
        match thread {
            Ok(handle) => threads.push(handle),
            Err(source) => {
                context.shared.abort();
                threads.into_iter().for_each(|t: JoinHandle<()>| drop(t.join()));
                return Err(PipelineError::Spawn { stage: context.stage.to_string(), source });
            }
        }
    }
    Ok(threads)
}

fn pin(shared: &Shared, placement: &ThreadPlacement) {
    if let Err(error) = pin_current_thread(&placement.cpus) {
        let report =
            format!("{} not pinned to CPUs {:?}: {error}", placement.label, placement.cpus);
        tracing::warn!("placement: {report}");
        shared.pin_failures.lock().unwrap_or_else(PoisonError::into_inner).push(report);
    }
}

pub(super) fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

pub(super) fn run_source<Out: Copy, H>(
    shared: &Shared,
    metrics: &mut WorkerMetrics,
    mut emitter: Emitter<Out>,
    mut handler: H,
) where
    H: FnMut(&mut Emitter<Out>) -> Flow,
{
    loop {
        // Relaxed: `stop` only asks sources to finish; the data they publish is ordered by the
        // rings themselves.
        if shared.aborted() || shared.stop.load(Ordering::Relaxed) {
            break;
        }
        let start_ns = now_ns();
        emitter.ingress_ns = start_ns;
        emitter.handling_ns = start_ns;
        let flow = handler(&mut emitter);
        let end_ns = now_ns();
        emitter.handled_until_ns = end_ns;
        emitter.flush_at(end_ns);
        // Stages fused after the source also read their own inbound rings between calls.
        drain_fused_inputs(&mut emitter);
        let recorder = metrics.recorder();
        recorder.add_busy_ns(end_ns - start_ns);
        recorder.add_messages_out(emitter.take_emitted());
        metrics.maybe_publish(end_ns);
        if flow == Flow::Stop || emitter.disconnected {
            break;
        }
    }
    // What the handler owns (handles feeding the fused stages' other rings) closes now, so
    // those rings drain and disconnect.
    drop(handler);
    drain_fused(shared, &mut emitter);
    emitter.finish_fused();
}

/// Most rounds of [`drain_fused_inputs`] between two source calls: with a batch per ring per
/// round, 1024 rounds take far more than a ring holds, and a producer outside the thread that
/// outpaces the fused stages still lets the source run.
const FUSED_DRAIN_ROUNDS_MAX: usize = 1024;

/// Lets the stages fused after a source read their own inbound rings until those are empty
/// (or [`FUSED_DRAIN_ROUNDS_MAX`] rounds). Why until empty: a fused stage's ring may be fed by
/// this very thread (the tier's pre-process sends its rejects to the R-Processor through one),
/// and its consumer runs only here. Reading one batch per source call let a source that emits
/// more per call than a batch (a gateway turn of 4096 rejected orders) fill that ring in a few
/// calls; the next push then waited for room only this thread could make: a deadlock, found by
/// a flooding client (crates/cli/tests/soak_hostile.rs). Drained, a ring starts each call
/// empty, so a call that emits at most a ring's capacity cannot block on it.
fn drain_fused_inputs<Out: Copy>(emitter: &mut Emitter<Out>) {
    for _ in 0..FUSED_DRAIN_ROUNDS_MAX {
        if emitter.poll_fused() == 0 {
            return;
        }
    }
}

/// Runs the stages fused after a finished source until each of their inbound rings is
/// disconnected and drained (or the pipeline aborts).
fn drain_fused<Out: Copy>(shared: &Shared, emitter: &mut Emitter<Out>) {
    while !shared.aborted() {
        let handled = emitter.poll_fused();
        emitter.flush();
        emitter.finish_done_fused();
        if handled == 0 && emitter.fused_inputs_done() {
            return;
        }
        if handled == 0 {
            std::hint::spin_loop();
        }
    }
}

/// Rounds that handled messages between two samples of the inbound queue depth. A sample
/// reads each inbound ring's producer index, a cache line the producer writes on every batch;
/// taken on every round it would cost a line transfer per batch that the ring's batch headers
/// exist to avoid (crate::ring).
pub const DEPTH_SAMPLE_EVERY_ROUNDS: u32 = 64;

/// A consuming stage's inbound side: fan-in over its rings, one batch from each per round.
pub(super) struct Inbound<In> {
    inputs: Vec<Receiver<Envelope<In>>>,
    /// Inbound ring polled first next time, so no ring is always served last.
    next_input: usize,
    read_batch_max: usize,
    /// Rounds that handle messages before the next depth sample.
    rounds_until_depth_sample: u32,
}

impl<In: Copy> Inbound<In> {
    pub(super) fn new(inputs: Vec<Receiver<Envelope<In>>>, read_batch_max: usize) -> Self {
        Inbound { inputs, next_input: 0, read_batch_max, rounds_until_depth_sample: 0 }
    }

    pub(super) fn has_input(&self) -> bool {
        self.inputs.iter().any(|input| !input.is_empty())
    }

    /// Every [`DEPTH_SAMPLE_EVERY_ROUNDS`]th round that handled messages, records the depth
    /// the round found: what is left in the rings now plus what it handled.
    fn sample_depth(&mut self, handled: usize, recorder: &mut Recorder) {
        if self.rounds_until_depth_sample > 0 {
            self.rounds_until_depth_sample -= 1;
            return;
        }
        self.rounds_until_depth_sample = DEPTH_SAMPLE_EVERY_ROUNDS - 1;
        let left_slots: usize = self.inputs.iter().map(Receiver::len).sum();
        recorder.record_queue_depth((left_slots + handled) as u64);
    }

    /// True once every inbound ring is disconnected and drained.
    pub(super) fn done(&mut self) -> bool {
        self.inputs.iter_mut().all(|input| input.is_disconnected())
    }

    /// One batch from each inbound ring through `handler`; returns how many were handled.
    /// Timed per batch, not per message: two clock reads per ring batch, its mean handler
    /// time recorded as each message's service time and its oldest message's hop latency as
    /// every message's (an upper bound for the rest). Only a terminal stage reads the clock
    /// after each message: its end-to-end latency is what the run measures.
    #[inline]
    pub(super) fn handle_available<Out: Copy>(
        &mut self,
        recorder: &mut Recorder,
        emitter: &mut Emitter<Out>,
        handler: &mut impl FnMut(&In, &mut Emitter<Out>),
    ) -> usize {
        if self.inputs.is_empty() {
            return 0;
        }
        let terminal = emitter.is_terminal();
        let mut handled = 0;
        let ring_count = self.inputs.len();
        for offset in 0..ring_count {
            let index = self.next_input + offset;
            let input =
                &mut self.inputs[if index >= ring_count { index - ring_count } else { index }];
            handled +=
                handle_batch(input, self.read_batch_max, recorder, emitter, terminal, handler);
        }
        self.next_input = if self.next_input + 1 >= ring_count { 0 } else { self.next_input + 1 };
        if handled > 0 {
            self.sample_depth(handled, recorder);
        }
        handled
    }
}

/// One batch of one inbound ring through `handler`, timed as [`Inbound::handle_available`] says.
#[inline]
fn handle_batch<In: Copy, Out: Copy>(
    input: &mut Receiver<Envelope<In>>,
    read_batch_max: usize,
    recorder: &mut Recorder,
    emitter: &mut Emitter<Out>,
    terminal: bool,
    handler: &mut impl FnMut(&In, &mut Emitter<Out>),
) -> usize {
    let start_ns = now_ns();
    emitter.handling_ns = start_ns;
    let mut oldest_sent_ns = None;
    let count = input.read_batch(read_batch_max, |envelope| {
        oldest_sent_ns.get_or_insert(envelope.sent_ns);
        emitter.ingress_ns = envelope.ingress_ns;
        handler(&envelope.payload, emitter);
        if terminal {
            recorder.record_end_to_end(now_ns().saturating_sub(envelope.ingress_ns));
        }
    });
    let Some(oldest_sent_ns) = oldest_sent_ns else { return 0 };
    let end_ns = now_ns();
    emitter.handled_until_ns = end_ns;
    let hop_latency_ns = start_ns.saturating_sub(oldest_sent_ns);
    recorder.record_batch(count as u64, end_ns - start_ns, hop_latency_ns);
    count
}

/// Per worker of a stage: its [`StageWorker::finish`] result, once it finished.
pub(super) type ResultSlots<R> = Arc<Mutex<Vec<Option<R>>>>;

/// Finishes `worker` (after its last message) and keeps its result in `slots[index]`.
pub(super) fn finish_into<In, Out, W: StageWorker<In, Out>>(
    worker: W,
    slots: &ResultSlots<W::Finished>,
    index: usize,
) {
    let finished = worker.finish();
    slots.lock().unwrap_or_else(PoisonError::into_inner)[index] = Some(finished);
}

/// A consuming worker's thread: its inbound rings and those of the stages fused after it,
/// its [`StageWorker`], emitter, and the wait when there is nothing to do.
pub(super) struct ConsumerLoop<In, Out, W: StageWorker<In, Out>> {
    inbound: Inbound<In>,
    emitter: Emitter<Out>,
    /// `None` once finished: its own rings are done while fused stages may still have input.
    worker: Option<W>,
    results: ResultSlots<W::Finished>,
    index: usize,
    waiter: Waiter,
}

impl<In: Copy, Out: Copy, W: StageWorker<In, Out>> ConsumerLoop<In, Out, W> {
    pub(super) fn new(
        inbound: Inbound<In>,
        emitter: Emitter<Out>,
        worker: (W, ResultSlots<W::Finished>, usize),
        waiter: Waiter,
    ) -> Self {
        let (worker, results, index) = worker;
        ConsumerLoop { inbound, emitter, worker: Some(worker), results, index, waiter }
    }

    /// Runs until every inbound ring (its own and the fused stages') is disconnected and
    /// drained, or the pipeline aborts. The worker finishes as soon as its own rings are done,
    /// before the fused stages: what it closes when it finishes (a handle feeding a fused
    /// stage's ring, say) may be what those stages wait for.
    pub(super) fn run(mut self, shared: &Shared, metrics: &mut WorkerMetrics) {
        while !shared.aborted() {
            let mut handled = 0;
            if let Some(worker) = &mut self.worker {
                let mut handler =
                    |message: &In, out: &mut Emitter<Out>| worker.handle(message, out);
                let recorder = metrics.recorder();
                handled += self.inbound.handle_available(recorder, &mut self.emitter, &mut handler);
            }
            handled += self.emitter.poll_fused();
            if handled > 0 {
                let now = now_ns();
                self.emitter.flush_at(now);
                metrics.recorder().add_messages_out(self.emitter.take_emitted());
                metrics.maybe_publish(now);
                if self.emitter.disconnected {
                    break;
                }
                continue;
            }
            if self.inbound.done() {
                if let Some(worker) = self.worker.take() {
                    finish_into(worker, &self.results, self.index);
                    continue;
                }
                if self.emitter.fused_inputs_done() {
                    break;
                }
            }
            // An unfinished worker wakes once its own rings are done, to finish first.
            let unfinished = self.worker.is_some();
            let (inbound, emitter) = (&mut self.inbound, &mut self.emitter);
            self.waiter.wait_until(|| {
                shared.aborted()
                    || inbound.has_input()
                    || emitter.fused_have_input()
                    || (inbound.done() && (unfinished || emitter.fused_inputs_done()))
            });
        }
        if let Some(worker) = self.worker.take() {
            finish_into(worker, &self.results, self.index);
        }
        self.emitter.finish_fused();
    }
}
