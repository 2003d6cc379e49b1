//! Worker threads: pinning, the panic boundary, the source loop and the consuming (fan-in) loop.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use super::{Emitter, Envelope, Flow, PipelineError};
use crate::connector::Receiver;
use crate::metrics::{StageMetricsHub, WorkerMetrics, now_ns};
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
        let placement = context.pin_threads.then(|| context.placements[worker].clone());
        let thread =
            std::thread::Builder::new().name(format!("{stage}/{worker}")).spawn(move || {
                if let Some(placement) = placement {
                    pin(&shared, &placement);
                }
                let outcome = catch_unwind(AssertUnwindSafe(|| body(&shared, &mut metrics)));
                metrics.finish();
                if let Err(panic) = outcome {
                    let message = panic_message(panic.as_ref());
                    shared.fail(PipelineError::StagePanicked {
                        stage: stage.to_string(),
                        worker,
                        message,
                    });
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

fn panic_message(panic: &(dyn Any + Send)) -> String {
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
        let flow = handler(&mut emitter);
        let end_ns = now_ns();
        emitter.flush();
        let recorder = metrics.recorder();
        recorder.add_busy_ns(end_ns - start_ns);
        recorder.add_messages_out(emitter.take_emitted());
        metrics.maybe_publish(end_ns);
        if flow == Flow::Stop || emitter.disconnected {
            break;
        }
    }
}

/// A consuming worker: fan-in over its inbound rings, handler, emitter.
pub(super) struct ConsumerLoop<In, Out, H> {
    inputs: Vec<Receiver<Envelope<In>>>,
    emitter: Emitter<Out>,
    handler: H,
    /// Inbound ring polled first next time, so no ring is always served last.
    next_input: usize,
    read_batch_max: usize,
    waiter: Waiter,
    /// No downstream: record end-to-end latency here.
    terminal: bool,
}

impl<In: Copy, Out: Copy, H: FnMut(&In, &mut Emitter<Out>)> ConsumerLoop<In, Out, H> {
    pub(super) fn new(
        inputs: Vec<Receiver<Envelope<In>>>,
        emitter: Emitter<Out>,
        handler: H,
        read_batch_max: usize,
        waiter: Waiter,
    ) -> Self {
        let terminal = emitter.is_terminal();
        ConsumerLoop { inputs, emitter, handler, next_input: 0, read_batch_max, waiter, terminal }
    }

    pub(super) fn run(mut self, shared: &Shared, metrics: &mut WorkerMetrics) {
        while !shared.aborted() {
            let handled = self.handle_available(metrics);
            if handled > 0 {
                self.emitter.flush();
                let recorder = metrics.recorder();
                recorder.add_messages_out(self.emitter.take_emitted());
                metrics.maybe_publish(now_ns());
                if self.emitter.disconnected {
                    break;
                }
                continue;
            }
            if self.inputs.iter_mut().all(|input| input.is_disconnected()) {
                break;
            }
            let inputs = &mut self.inputs;
            self.waiter.wait_until(|| {
                shared.aborted()
                    || inputs.iter().any(|input| !input.is_empty())
                    || inputs.iter_mut().all(|input| input.is_disconnected())
            });
        }
    }

    /// One batch from each inbound ring; returns how many messages were handled.
    #[inline]
    fn handle_available(&mut self, metrics: &mut WorkerMetrics) -> usize {
        let recorder = metrics.recorder();
        let depth_slots: usize = self.inputs.iter().map(Receiver::len).sum();
        let batch_start_ns = now_ns();
        let mut message_start_ns = batch_start_ns;
        let mut handled = 0;
        let ring_count = self.inputs.len();
        for offset in 0..ring_count {
            let index = self.next_input + offset;
            let input =
                &mut self.inputs[if index >= ring_count { index - ring_count } else { index }];
            let (handler, emitter, terminal) =
                (&mut self.handler, &mut self.emitter, self.terminal);
            handled += input.read_batch(self.read_batch_max, |envelope| {
                emitter.ingress_ns = envelope.ingress_ns;
                handler(&envelope.payload, emitter);
                let end_ns = now_ns();
                let hop_latency_ns = message_start_ns.saturating_sub(envelope.sent_ns);
                recorder.record_message(end_ns - message_start_ns, hop_latency_ns);
                if terminal {
                    recorder.record_end_to_end(end_ns.saturating_sub(envelope.ingress_ns));
                }
                message_start_ns = end_ns;
            });
        }
        self.next_input = if self.next_input + 1 >= ring_count { 0 } else { self.next_input + 1 };
        if handled > 0 {
            recorder.record_queue_depth(depth_slots as u64);
            recorder.add_busy_ns(message_start_ns - batch_start_ns);
        }
        handled
    }
}
