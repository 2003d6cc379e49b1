//! Stages whose workers hand their state back when they finish: per-worker totals (counters,
//! histograms, a shard's output hash) come back to the caller as values, in worker order,
//! instead of through shared cells written from `Drop` impls.

use std::sync::{Arc, Mutex, PoisonError};

use super::fused::{FusedStage, Member};
use super::worker::{ConsumerLoop, Inbound, Shared, launch_workers};
use super::{Emitter, Launched, Launcher, Message, PipelineBuilder, SlotKind, StageHandle};
use super::{StagePorts, StageSpec};
use crate::metrics::WorkerMetrics;
use crate::wait::Waiter;

/// A stage worker that reports a result when it finishes.
pub trait StageWorker<In, Out>: Send + 'static {
    /// What the worker hands back once all its inbound rings are disconnected and drained.
    type Finished: Send + 'static;

    /// Handles one message, as a plain stage handler does.
    fn handle(&mut self, message: &In, out: &mut Emitter<Out>);

    /// Called on the worker's thread after its last message, before the thread ends. Not called
    /// when a handler panicked (the pipeline then reports the panic instead).
    fn finish(self) -> Self::Finished;
}

/// The results of a stage declared with [`PipelineBuilder::stage_with_results`]; read them
/// with [`StageResults::take`] after [`super::RunningPipeline::wait`] returned.
pub struct StageResults<R> {
    /// Per worker: its result, written once by the worker's thread as it ends.
    slots: Arc<Mutex<Vec<Option<R>>>>,
}

impl<R> StageResults<R> {
    /// Every worker's result in worker order; `None` when a worker has not finished (the
    /// pipeline is still running, or a handler panicked and `wait` reported it).
    pub fn take(self) -> Option<Vec<R>> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::take(&mut *slots).into_iter().collect()
    }
}

/// A plain stage handler as a [`StageWorker`] that reports nothing ([`PipelineBuilder::stage`]).
pub(super) struct HandlerWorker<H>(pub(super) H);

impl<In, Out, H: FnMut(&In, &mut Emitter<Out>) + Send + 'static> StageWorker<In, Out>
    for HandlerWorker<H>
{
    type Finished = ();

    #[inline]
    fn handle(&mut self, message: &In, out: &mut Emitter<Out>) {
        (self.0)(message, out)
    }

    fn finish(self) {}
}

impl PipelineBuilder {
    /// A processing stage (or, with `Out = ()`, a sink) whose workers are [`StageWorker`]s:
    /// `make_worker(worker)` builds each one on the starting thread, and each one's
    /// [`StageWorker::finish`] result is kept for [`StageResults::take`].
    ///
    /// ```
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec, StageWorker};
    ///
    /// /// Counts what its worker saw; the count comes back when the pipeline finishes.
    /// struct Count(u64);
    ///
    /// impl StageWorker<u64, ()> for Count {
    ///     type Finished = u64;
    ///     fn handle(&mut self, _: &u64, _: &mut Emitter<()>) {
    ///         self.0 += 1;
    ///     }
    ///     fn finish(self) -> u64 {
    ///         self.0
    ///     }
    /// }
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let numbers = graph.source("numbers", StageSpec::ancillary(1), |_| {
    ///     let mut next = 0u64;
    ///     move |out: &mut Emitter<u64>| {
    ///         next += 1;
    ///         out.emit(next);
    ///         if next == 10 { Flow::Stop } else { Flow::Continue }
    ///     }
    /// });
    /// let spec = StageSpec::ancillary(2);
    /// let (count, results) = graph.stage_with_results("count", spec, |_| Count(0));
    /// graph.connect(numbers, count, Route::RoundRobin);
    /// graph.start()?.wait()?;
    /// let per_worker = results.take().expect("every worker finished");
    /// assert_eq!(per_worker.len(), 2);
    /// assert_eq!(per_worker.iter().sum::<u64>(), 10);
    /// # Ok::<(), pipeline::stage::PipelineError>(())
    /// ```
    pub fn stage_with_results<In: Message, Out: Message, W: StageWorker<In, Out>>(
        &mut self,
        name: &str,
        spec: StageSpec,
        mut make_worker: impl FnMut(usize) -> W + Send + 'static,
    ) -> (StageHandle<In, Out>, StageResults<W::Finished>) {
        let slots = Arc::new(Mutex::new(
            (0..spec.spawned_workers()).map(|_| None).collect::<Vec<Option<W::Finished>>>(),
        ));
        let results = StageResults { slots: slots.clone() };
        let launcher: Launcher = Box::new(move |ports, context| {
            let ports = *ports.downcast::<StagePorts<In, Out>>().expect("stage ports");
            let StagePorts { inputs, outlets, next } = ports;
            let read_batch_max = context.read_batch_max;
            let workers = inputs.into_iter().zip(outlets).zip(next).enumerate().map(
                |(worker, ((inputs, outlets), next))| {
                    let emitter = Emitter::new(outlets).with_next(next);
                    (worker, Inbound::new(inputs, read_batch_max), emitter, make_worker(worker))
                },
            );
            if context.fused {
                let members: Vec<Box<dyn FusedStage<In>>> = workers
                    .map(|(worker_index, inbound, emitter, worker)| {
                        Box::new(Member {
                            stage: context.stage.clone(),
                            worker_index,
                            inbound,
                            emitter,
                            worker: Some(worker),
                            metrics: context.hub.worker(worker_index),
                            results: slots.clone(),
                        }) as Box<dyn FusedStage<In>>
                    })
                    .collect();
                return Ok(Launched::Fused(Box::new(members)));
            }
            let threads = workers.map(|(worker, inbound, emitter, state)| {
                let waiter = Waiter::new(context.wait, context.consumer_parkers[worker].clone());
                let slots = slots.clone();
                (worker, move |shared: &Shared, metrics: &mut WorkerMetrics| {
                    ConsumerLoop::new(inbound, emitter, (state, slots, worker), waiter)
                        .run(shared, metrics);
                })
            });
            launch_workers(&context, threads).map(Launched::Threads)
        });
        (self.declare::<In, Out>(name, spec, SlotKind::Stage, launcher), results)
    }
}
