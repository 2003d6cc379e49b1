//! One adapter per queue under test, all behind [`Peer`], so the harness is written once.
//!
//! Each adapter uses its queue the way its documentation recommends for throughput: batch
//! APIs where they exist (leantier, rtrb chunks, disruptor `batch_publish`/poller), one
//! operation per message where they do not (crossbeam `ArrayQueue`, channels). The batch
//! queues get the same semantics: a batch is published whole (the sender waits until it fits)
//! and the receiver re-reads the sender's index on each call. Every adapter method is
//! `#[inline]`, so no queue pays a call the others do not. Queues that
//! are designed to block (channels, the blocking baseline) block in `receive`; the others are
//! polled with a spin, as they would be on a dedicated core.

use std::sync::Arc;

use disruptor::{BusySpin, EventPoller, Polling, Producer as _, SingleConsumerBarrier};
use disruptor::{SingleProducer, SingleProducerBarrier};
use pipeline::{ConnectorKind, RingConfig, WaitStrategy};

/// Largest batch any side moves at once (the harness never asks for more: it is below every
/// capacity it builds).
pub const BATCH_SLOTS_MAX: usize = 256;

/// A fixed-size message that carries its sequence number in its first word.
pub trait Payload: Copy + Default + Send + Sync + 'static {
    const BYTES: usize;
    fn with_seq(seq: u64) -> Self;
    fn seq(&self) -> u64;
}

/// An 8-byte message.
#[derive(Clone, Copy, Default)]
pub struct Message8(u64);

/// A 64-byte message (one cache line).
#[derive(Clone, Copy, Default)]
#[repr(align(64))]
pub struct Message64([u64; 8]);

impl Payload for Message8 {
    const BYTES: usize = 8;
    fn with_seq(seq: u64) -> Self {
        Message8(seq)
    }
    fn seq(&self) -> u64 {
        self.0
    }
}

impl Payload for Message64 {
    const BYTES: usize = 64;
    fn with_seq(seq: u64) -> Self {
        Message64([seq; 8])
    }
    fn seq(&self) -> u64 {
        self.0[0]
    }
}

/// A queue under test: how to build it and how each side moves a batch.
pub trait Peer<M: Payload> {
    const NAME: &'static str;
    type Tx: Send + 'static;
    type Rx: Send + 'static;
    fn build(capacity_slots: usize, batch_slots_max: usize) -> (Self::Tx, Self::Rx);
    /// Sends every message of `batch`, waiting for room as the queue prescribes.
    fn send(tx: &mut Self::Tx, batch: &[M]);
    /// Receives up to `max` messages; may return 0 (then the harness spins and retries).
    fn receive(rx: &mut Self::Rx, max: usize, f: impl FnMut(&M)) -> usize;
}

pub struct Rtrb;
pub struct CrossbeamArrayQueue;
pub struct CrossbeamChannel;
pub struct StdSyncChannel;
pub struct Disruptor;

/// A `pipeline` connector in one of the modes below: which implementation, how its sides
/// wait, and whether the harness polls the consumer or lets it wait.
pub struct Pipeline<const MODE: u8>;

/// leantier's lock-free ring, busy-spinning, consumer polled by the harness.
pub const POLLED: u8 = 0;
/// The mutex + condvar baseline behind the same interface; a blocked side sleeps.
pub const BLOCKING: u8 = 1;
/// The lock-free ring with its consumer *waiting* under each strategy (wake-up cost).
pub const WAIT_SPIN: u8 = 2;
pub const WAIT_SPIN_YIELD: u8 = 3;
pub const WAIT_ADAPTIVE: u8 = 4;
pub const WAIT_PARK: u8 = 5;

pub type Leantier = Pipeline<POLLED>;
pub type Blocking = Pipeline<BLOCKING>;

/// The wait strategy each mode configures.
pub fn wait_strategy(mode: u8) -> WaitStrategy {
    match mode {
        POLLED | WAIT_SPIN => WaitStrategy::BusySpin,
        WAIT_SPIN_YIELD => {
            WaitStrategy::SpinYield { spins: pipeline::wait::ADAPTIVE_SPINS_DEFAULT }
        }
        WAIT_ADAPTIVE => WaitStrategy::default(),
        _ => WaitStrategy::Park,
    }
}

impl<M: Payload, const MODE: u8> Peer<M> for Pipeline<MODE> {
    const NAME: &'static str = match MODE {
        POLLED => "leantier ring",
        BLOCKING => "blocking (mutex+condvar)",
        WAIT_SPIN => "wait: busy-spin",
        WAIT_SPIN_YIELD => "wait: spin-yield",
        WAIT_ADAPTIVE => "wait: adaptive",
        _ => "wait: park",
    };
    type Tx = pipeline::Sender<M>;
    type Rx = pipeline::Receiver<M>;
    fn build(capacity_slots: usize, batch_slots_max: usize) -> (Self::Tx, Self::Rx) {
        let kind = if MODE == BLOCKING { ConnectorKind::Blocking } else { ConnectorKind::LockFree };
        let config = RingConfig { capacity_slots, batch_slots_max, wait: wait_strategy(MODE) };
        pipeline::connector(kind, &config).expect("benchmark ring sizes are valid powers of two")
    }
    #[inline]
    fn send(tx: &mut Self::Tx, batch: &[M]) {
        tx.push_batch(batch).expect("consumer outlives the producer");
    }
    #[inline]
    fn receive(rx: &mut Self::Rx, max: usize, f: impl FnMut(&M)) -> usize {
        if MODE == POLLED { rx.read_batch(max, f) } else { rx.wait_read_batch(max, f).unwrap_or(0) }
    }
}

impl<M: Payload> Peer<M> for Rtrb {
    const NAME: &'static str = "rtrb";
    type Tx = rtrb::Producer<M>;
    type Rx = rtrb::Consumer<M>;
    fn build(capacity_slots: usize, _batch_slots_max: usize) -> (Self::Tx, Self::Rx) {
        rtrb::RingBuffer::new(capacity_slots)
    }
    #[inline]
    fn send(tx: &mut Self::Tx, batch: &[M]) {
        // The whole batch as one chunk, waiting until it fits, as leantier and disruptor do.
        // `write_chunk_uninit` checks its cached read index first; `slots()` would re-read
        // the consumer's index on every send, a cache miss the other queues do not pay.
        loop {
            match tx.write_chunk_uninit(batch.len()) {
                Ok(chunk) => {
                    chunk.fill_from_iter(batch.iter().copied());
                    return;
                }
                Err(rtrb::chunks::ChunkError::TooFewSlots(_)) => std::hint::spin_loop(),
            }
        }
    }
    #[inline]
    fn receive(rx: &mut Self::Rx, max: usize, mut f: impl FnMut(&M)) -> usize {
        let n = rx.slots().min(max);
        if n == 0 {
            return 0;
        }
        let chunk = rx.read_chunk(n).expect("n <= available slots");
        let (first, second) = chunk.as_slices();
        first.iter().chain(second).for_each(&mut f);
        chunk.commit_all();
        n
    }
}

impl<M: Payload> Peer<M> for CrossbeamArrayQueue {
    const NAME: &'static str = "crossbeam ArrayQueue";
    type Tx = Arc<crossbeam::queue::ArrayQueue<M>>;
    type Rx = Arc<crossbeam::queue::ArrayQueue<M>>;
    fn build(capacity_slots: usize, _batch_slots_max: usize) -> (Self::Tx, Self::Rx) {
        let queue = Arc::new(crossbeam::queue::ArrayQueue::new(capacity_slots));
        (queue.clone(), queue)
    }
    #[inline]
    fn send(tx: &mut Self::Tx, batch: &[M]) {
        for message in batch {
            while tx.push(*message).is_err() {
                std::hint::spin_loop();
            }
        }
    }
    #[inline]
    fn receive(rx: &mut Self::Rx, max: usize, mut f: impl FnMut(&M)) -> usize {
        let mut n = 0;
        while n < max {
            let Some(message) = rx.pop() else { break };
            f(&message);
            n += 1;
        }
        n
    }
}

/// The two bounded channels differ only in their constructors and types; both are used the
/// way channel users batch: block for the first message, then drain what is already there.
pub trait Channel<M> {
    const NAME: &'static str;
    type Tx: Send + 'static;
    type Rx: Send + 'static;
    fn bounded(capacity_slots: usize) -> (Self::Tx, Self::Rx);
    fn send(tx: &Self::Tx, message: M) -> bool;
    fn recv(rx: &Self::Rx) -> Option<M>;
    fn try_recv(rx: &Self::Rx) -> Option<M>;
}

impl<M: Payload> Channel<M> for CrossbeamChannel {
    const NAME: &'static str = "crossbeam bounded channel";
    type Tx = crossbeam::channel::Sender<M>;
    type Rx = crossbeam::channel::Receiver<M>;
    fn bounded(capacity_slots: usize) -> (Self::Tx, Self::Rx) {
        crossbeam::channel::bounded(capacity_slots)
    }
    #[inline]
    fn send(tx: &Self::Tx, message: M) -> bool {
        tx.send(message).is_ok()
    }
    fn recv(rx: &Self::Rx) -> Option<M> {
        rx.recv().ok()
    }
    fn try_recv(rx: &Self::Rx) -> Option<M> {
        rx.try_recv().ok()
    }
}

impl<M: Payload> Channel<M> for StdSyncChannel {
    const NAME: &'static str = "std mpsc sync_channel";
    type Tx = std::sync::mpsc::SyncSender<M>;
    type Rx = std::sync::mpsc::Receiver<M>;
    fn bounded(capacity_slots: usize) -> (Self::Tx, Self::Rx) {
        std::sync::mpsc::sync_channel(capacity_slots)
    }
    #[inline]
    fn send(tx: &Self::Tx, message: M) -> bool {
        tx.send(message).is_ok()
    }
    fn recv(rx: &Self::Rx) -> Option<M> {
        rx.recv().ok()
    }
    fn try_recv(rx: &Self::Rx) -> Option<M> {
        rx.try_recv().ok()
    }
}

/// Adapts any [`Channel`] to [`Peer`].
pub struct ViaChannel<C>(std::marker::PhantomData<C>);

impl<M: Payload, C: Channel<M>> Peer<M> for ViaChannel<C> {
    const NAME: &'static str = C::NAME;
    type Tx = C::Tx;
    type Rx = C::Rx;
    fn build(capacity_slots: usize, _batch_slots_max: usize) -> (Self::Tx, Self::Rx) {
        C::bounded(capacity_slots)
    }
    #[inline]
    fn send(tx: &mut Self::Tx, batch: &[M]) {
        for message in batch {
            assert!(C::send(tx, *message), "consumer outlives the producer");
        }
    }
    #[inline]
    fn receive(rx: &mut Self::Rx, max: usize, mut f: impl FnMut(&M)) -> usize {
        let Some(first) = C::recv(rx) else { return 0 };
        f(&first);
        let mut n = 1;
        while n < max {
            let Some(message) = C::try_recv(rx) else { break };
            f(&message);
            n += 1;
        }
        n
    }
}

impl<M: Payload> Peer<M> for Disruptor {
    const NAME: &'static str = "disruptor";
    type Tx = SingleProducer<M, SingleConsumerBarrier>;
    type Rx = EventPoller<M, SingleProducerBarrier>;
    fn build(capacity_slots: usize, _batch_slots_max: usize) -> (Self::Tx, Self::Rx) {
        let builder = disruptor::build_single_producer(capacity_slots, M::default, BusySpin);
        let (poller, builder) = builder.new_event_poller();
        (builder.build(), poller)
    }
    #[inline]
    fn send(tx: &mut Self::Tx, batch: &[M]) {
        for chunk in batch.chunks(tx_batch_limit()) {
            tx.batch_publish(chunk.len(), |slots| {
                for (slot, message) in slots.zip(chunk) {
                    *slot = *message;
                }
            });
        }
    }
    #[inline]
    fn receive(rx: &mut Self::Rx, max: usize, mut f: impl FnMut(&M)) -> usize {
        match rx.take(max as u64) {
            Ok(mut events) => (&mut events).map(&mut f).count(),
            Err(Polling::NoEvents | Polling::Shutdown) => 0,
        }
    }
}

/// disruptor's `batch_publish` must fit in the ring; the harness never asks for more than
/// this, which is below every capacity it builds.
fn tx_batch_limit() -> usize {
    BATCH_SLOTS_MAX
}
