//! What travels between stages: [`Envelope`]s chosen a ring by a [`Route`], buffered and
//! published by an [`Emitter`] (inside a stage) or an [`Input`] (a thread outside the pipeline).

use std::sync::Arc;

use super::fused::FusedStage;
use crate::active::ActiveWorkers;
use crate::connector::Sender;
use crate::metrics::now_ns;
use crate::ring::Disconnected;

/// Most messages an emitter buffers per outbound ring before publishing them.
pub const EMIT_BATCH_SLOTS_MAX: usize = 256;

/// What may travel through a pipeline: fixed-size records copied into pre-allocated slots.
pub trait Message: Copy + Default + Send + 'static {}
impl<T: Copy + Default + Send + 'static> Message for T {}

/// A message in a ring, with the stamps the runtime uses for latency metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct Envelope<T> {
    /// The message itself.
    pub payload: T,
    /// When the message (or the one it was derived from) entered the pipeline ([`now_ns`]).
    pub ingress_ns: u64,
    /// When the upstream worker published the ring batch holding it.
    pub sent_ns: u64,
}

/// How an upstream worker chooses among the downstream stage's workers.
pub enum Route<T> {
    /// Each message to the next worker in turn.
    RoundRobin,
    /// By a key: equal keys go to the same worker (per-key order is kept between resizes).
    ByKey(Arc<dyn Fn(&T) -> u64 + Send + Sync>),
}

impl<T> Route<T> {
    /// Routes by `key`: messages with equal keys go to the same worker.
    pub fn by_key(key: impl Fn(&T) -> u64 + Send + Sync + 'static) -> Route<T> {
        Route::ByKey(Arc::new(key))
    }

    /// The downstream worker for `message`, among the downstream stage's active workers.
    #[inline]
    fn pick(&self, message: &T, next: &mut usize, active: &ActiveWorkers) -> usize {
        match self {
            Route::RoundRobin => active.next_round_robin(next),
            Route::ByKey(key) => active.by_key(key(message)),
        }
    }
}

impl<T> Clone for Route<T> {
    fn clone(&self) -> Self {
        match self {
            Route::RoundRobin => Route::RoundRobin,
            Route::ByKey(key) => Route::ByKey(key.clone()),
        }
    }
}

/// One outbound connection of a worker: a ring per downstream worker plus its pending buffer.
pub(super) struct Outlet<T> {
    route: Route<T>,
    /// One ring per spawned downstream worker; routing picks among the active prefix.
    rings: Vec<Sender<Envelope<T>>>,
    active: Arc<ActiveWorkers>,
    pending: Vec<Vec<Envelope<T>>>,
    pending_slots_max: usize,
    next: usize,
}

impl<T: Copy> Outlet<T> {
    pub(super) fn new(
        route: Route<T>,
        rings: Vec<Sender<Envelope<T>>>,
        active: Arc<ActiveWorkers>,
        pending_slots_max: usize,
    ) -> Outlet<T> {
        assert_eq!(rings.len(), active.max(), "one ring per spawned downstream worker");
        let pending = rings.iter().map(|_| Vec::with_capacity(pending_slots_max)).collect();
        Outlet { route, rings, active, pending, pending_slots_max, next: 0 }
    }

    #[inline]
    fn push(&mut self, envelope: Envelope<T>) -> Result<(), Disconnected> {
        let ring = self.route.pick(&envelope.payload, &mut self.next, &self.active);
        self.pending[ring].push(envelope);
        if self.pending[ring].len() == self.pending_slots_max {
            return self.flush_ring(ring, now_ns());
        }
        Ok(())
    }

    #[inline]
    fn flush_ring(&mut self, ring: usize, sent_ns: u64) -> Result<(), Disconnected> {
        let pending = &mut self.pending[ring];
        if pending.is_empty() {
            return Ok(());
        }
        for envelope in pending.iter_mut() {
            envelope.sent_ns = sent_ns;
        }
        let result = self.rings[ring].push_batch(pending);
        pending.clear();
        result
    }
}

/// Most messages handed to a fused downstream stage at once: when a handler emits more while
/// handling one batch, the fused stage runs over these first (bounded memory, order kept).
pub const FUSED_BATCH_SLOTS_MAX: usize = 256;

/// Hands a handler's output to every downstream stage.
pub struct Emitter<T> {
    outlets: Vec<Outlet<T>>,
    /// Stamped on emitted messages; the runtime sets it per handled message (or source call).
    pub(super) ingress_ns: u64,
    /// When the runtime started handling the current batch: the hand-off stamp of a fused hop.
    pub(super) handling_ns: u64,
    /// When the runtime finished this stage's last batch (its closing clock read): the start
    /// of the fused stage's run over what that batch handed it, which follows at once.
    pub(super) handled_until_ns: u64,
    emitted: u64,
    /// A downstream ring is gone (the pipeline is aborting): the worker stops after this batch.
    pub(super) disconnected: bool,
    /// The stage fused after this one (run on this thread, no ring), with its pending input.
    next: Option<Box<dyn FusedStage<T>>>,
    local: Vec<Envelope<T>>,
}

impl<T: Copy> Emitter<T> {
    pub(super) fn new(outlets: Vec<Outlet<T>>) -> Emitter<T> {
        Emitter {
            outlets,
            ingress_ns: 0,
            handling_ns: 0,
            handled_until_ns: 0,
            emitted: 0,
            disconnected: false,
            next: None,
            local: Vec::new(),
        }
    }

    /// Also hands every message to `next`, a stage fused onto this thread.
    pub(super) fn with_next(mut self, next: Option<Box<dyn FusedStage<T>>>) -> Emitter<T> {
        if next.is_some() {
            self.local = Vec::with_capacity(FUSED_BATCH_SLOTS_MAX);
        }
        self.next = next;
        self
    }

    /// No downstream stage: the runtime records end-to-end latency for this worker.
    pub(super) fn is_terminal(&self) -> bool {
        self.outlets.is_empty() && self.next.is_none()
    }

    /// Sends `message` downstream, carrying the ingress time of the message being handled.
    #[inline]
    pub fn emit(&mut self, message: T) {
        self.emit_with_ingress(message, self.ingress_ns);
    }

    /// Sends `message` with an explicit ingress time ([`now_ns`] scale), e.g. a source that
    /// knows when a request arrived from the network.
    #[inline]
    pub fn emit_with_ingress(&mut self, message: T, ingress_ns: u64) {
        self.emitted += 1;
        let envelope = Envelope { payload: message, ingress_ns, sent_ns: self.handling_ns };
        if self.next.is_some() {
            self.local.push(envelope);
            if self.local.len() == FUSED_BATCH_SLOTS_MAX {
                self.pass_local(now_ns());
            }
        }
        for outlet in &mut self.outlets {
            // A downstream ring disappears only when the pipeline aborts (its consumer exits
            // early only on abort), so the message is moot; the worker stops after this batch.
            if outlet.push(envelope).is_err() {
                self.disconnected = true;
            }
        }
    }

    /// The ingress time of the message being handled (for a source: the start of this call).
    pub fn ingress_ns(&self) -> u64 {
        self.ingress_ns
    }

    /// When the runtime started handling the batch this message belongs to ([`now_ns`]
    /// scale): a stage's arrival stamp without a clock read of its own. The runtime reads the
    /// clock once per batch, not per message, so every message of a batch shares it.
    pub fn handling_ns(&self) -> u64 {
        self.handling_ns
    }

    /// Publishes every buffered message, one batch per ring, and runs the fused stages over
    /// what they were handed (publishing their output too).
    pub(super) fn flush(&mut self) {
        self.flush_at(now_ns());
    }

    /// [`Emitter::flush`] with a stamp the caller already read.
    pub(super) fn flush_at(&mut self, sent_ns: u64) {
        for outlet in &mut self.outlets {
            for ring in 0..outlet.rings.len() {
                if outlet.flush_ring(ring, sent_ns).is_err() {
                    self.disconnected = true;
                }
            }
        }
        self.pass_local(sent_ns);
        if let Some(next) = &mut self.next
            && next.flush(sent_ns)
        {
            self.disconnected = true;
        }
    }

    /// Runs the fused stage over the messages handed to it so far, its run starting at
    /// `start_ns` (a clock read the caller has, so a fused hop costs one read, not two).
    #[inline]
    fn pass_local(&mut self, start_ns: u64) {
        if let Some(next) = &mut self.next
            && !self.local.is_empty()
        {
            next.handle_local(&self.local, start_ns);
            self.local.clear();
        }
    }

    /// The fused stages read a batch from each of their own inbound rings (after running over
    /// what this stage handed them); returns how many messages they took from rings.
    pub(super) fn poll_fused(&mut self) -> usize {
        self.pass_local(self.handled_until_ns);
        self.next.as_mut().map_or(0, |next| next.poll())
    }

    /// Whether a fused stage has a message waiting in one of its inbound rings.
    pub(super) fn fused_have_input(&self) -> bool {
        self.next.as_ref().is_some_and(|next| next.has_input())
    }

    /// Whether every fused stage's inbound rings are disconnected and drained.
    pub(super) fn fused_inputs_done(&mut self) -> bool {
        self.next.as_mut().is_none_or(|next| next.inputs_done())
    }

    /// Finishes the workers of the fused stages whose rings are done, in chain order
    /// ([`FusedStage::finish_done_workers`]); for a chain whose head has finished.
    pub(super) fn finish_done_fused(&mut self) {
        if let Some(next) = &mut self.next {
            next.finish_done_workers();
        }
    }

    /// Ends the fused stages (their results, metrics; dropping their outbound rings).
    pub(super) fn finish_fused(&mut self) {
        self.pass_local(now_ns());
        if let Some(next) = self.next.take() {
            next.finish();
        }
    }

    pub(super) fn take_emitted(&mut self) -> u64 {
        std::mem::take(&mut self.emitted)
    }
}

/// A thread outside the pipeline feeding it (from [`super::PipelineBuilder::input`]). Messages are
/// buffered per ring and published when a ring's buffer fills or on [`Input::flush`]: call it
/// after each burst. Dropping the handle flushes and closes its rings; the pipeline finishes
/// once every source has stopped and every input handle has been dropped.
pub struct Input<T: Copy> {
    pub(super) emitter: Emitter<T>,
}

impl<T: Copy> Input<T> {
    /// Buffers `message` with ingress time now. `Err` once the pipeline has aborted.
    #[inline]
    pub fn send(&mut self, message: T) -> Result<(), Disconnected> {
        self.send_with_ingress(message, now_ns())
    }

    /// Buffers `message` with the given ingress time ([`now_ns`] scale), e.g. when the request
    /// arrived from the network.
    #[inline]
    pub fn send_with_ingress(&mut self, message: T, ingress_ns: u64) -> Result<(), Disconnected> {
        self.emitter.emit_with_ingress(message, ingress_ns);
        self.status()
    }

    /// Publishes everything buffered (waiting for room per the downstream's strategy).
    pub fn flush(&mut self) -> Result<(), Disconnected> {
        self.emitter.flush();
        self.status()
    }

    /// [`Input::flush`] stamped as sent at `sent_ns` ([`now_ns`] scale), a time the caller
    /// already has (e.g. a load generator's issue time): no clock read of its own.
    pub fn flush_at(&mut self, sent_ns: u64) -> Result<(), Disconnected> {
        self.emitter.flush_at(sent_ns);
        self.status()
    }

    fn status(&self) -> Result<(), Disconnected> {
        if self.emitter.disconnected { Err(Disconnected) } else { Ok(()) }
    }
}

impl<T: Copy> Drop for Input<T> {
    fn drop(&mut self) {
        self.emitter.flush();
    }
}
