//! The lock-free single-producer single-consumer ring: the connector between stages.
//!
//! # Design
//! - Capacity is a power of two; indices grow without bound and are masked into slots, so
//!   "full" is `tail - head == capacity` and no slot is wasted.
//! - Every slot is allocated and initialised once, at construction; a message is copied (or
//!   built in place, [`Producer::try_write_batch`]) into a slot. Nothing allocates per message.
//! - The consumer releases slots through `head`, which the producer re-reads only when its
//!   cached copy says "full".
//! - The producer publishes each batch by a *batch header*: after writing the batch's slots it
//!   stores the batch's end index in `batch_ends[start]`, the entry beside the batch's first
//!   slot. The consumer follows the chain of headers (each batch's end is the next batch's
//!   start) and never reads an index the producer writes on every batch. So the producer's
//!   publish is a store to a line the consumer reads only once it has caught up with that
//!   very batch: a producer running ahead of its consumer pays no cache-line transfer per
//!   batch, and the consumer reads whole lines of headers and slots. (With a shared `tail`
//!   the consumer re-read `tail` on every call and the producer's next store had to take the
//!   line back: two transfers per single-message batch; docs/benchmarks/ring.md has the
//!   figures.) A header is valid when `end - start` lies in `1..=capacity`: an entry left
//!   from an earlier lap holds an end at or before `start`, which wraps to 0 or more than the
//!   capacity.
//! - Catching up: a consumer that has fallen behind would read one header line per batch
//!   (at batch 16 the headers lie one to a line). Once one call has followed two or more
//!   headers over `CATCH_UP_AFTER_SLOTS`, one to a line on average, it reads `catch_up_end`
//!   instead, an index the producer stores (on its own line) only when a batch crosses a
//!   multiple of `CATCH_UP_STRIDE_SLOTS`, and jumps there. A consumer that keeps up never
//!   reads it.
//! - Batches: the producer fills n slots and publishes them with one header; the consumer
//!   reads everything available up to a bound and releases it with one store. A batch that
//!   does not fit waits until it fits whole.
//! - Depth samples ([`Consumer::len`]) follow the headers from the catch-up index (or the
//!   consumer's own position, whichever is later): at most one stride and a batch of them.
//! - False sharing: the slots start on a 128-byte boundary with padding after the last, so a
//!   batch of small messages fills whole lines; [`Producer`] and [`Consumer`] are 128-byte
//!   aligned, so their per-batch index writes share no line with their neighbours. An idle
//!   consumer's poll is one load and, past its first two, no store (docs/benchmarks/ring.md
//!   has the figures).
//! - Prefetch hints (x86-64): after each publish the producer asks for the next batch's slot
//!   lines in the exclusive state, so that it outruns a consumer that keeps up and the ring
//!   moves data in large consumer reads; a consumer idle for a few polls asks for the slot
//!   the next message will land in. Hints only: they change no memory and no ordering.
//!
//! # Memory ordering
//! - Producer: writes slots, then `batch_ends[start].store(end, Release)`. Consumer:
//!   `batch_ends[start].load(Acquire)`, then reads slots. The Release/Acquire pair makes the
//!   slot writes visible before the consumer reads them (weakening either side to Relaxed
//!   fails `tests/loom.rs`).
//! - Producer: writes slots, then `catch_up_end.store(end, Release)`; consumer:
//!   `catch_up_end.load(Acquire)`, then reads the slots below it: the same argument as for
//!   the headers (weakening either side fails `tests/loom.rs`).
//! - Consumer: reads slots, then `head.store(Release)`. Producer: `head.load(Acquire)`, then
//!   overwrites slots. This pair makes the consumer's reads complete before a slot is reused.
//! - Each index has exactly one writer, so plain loads of one's own index are Relaxed.
//! - Disconnection: a side's final header or index store precedes its
//!   `*_alive.store(false, Release)`; the peer's `Acquire` load of the flag therefore sees it.
//! - Waking: after publishing, a side calls [`Parker::notify`] on its peer's parker when the
//!   peer's strategy may park (`crate::wait` explains why that is a fence, not a syscall).
//!
//! # Example
//!
//! ```
//! use pipeline::ring::{RingConfig, spsc};
//!
//! let (mut producer, mut consumer) = spsc::<u64>(&RingConfig::default())?;
//! let writer = std::thread::spawn(move || producer.push_batch(&[1, 2, 3]));
//! let mut sum = 0;
//! while let Ok(_) = consumer.wait_read_batch(64, |value| sum += value) {}
//! writer.join().unwrap()?;
//! assert_eq!(sum, 6);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::sync::{Arc, AtomicBool, AtomicUsize, CachePadded, Ordering, UnsafeCell};
use crate::wait::{Parker, WaitStrategy, Waiter};

mod view;
use view::RingView;

/// The largest ring we accept: 2^24 slots keeps a ring of 64-byte records at 1 GiB.
pub const CAPACITY_SLOTS_MAX: usize = 1 << 24;

/// Size and behaviour of one connector.
///
/// ```
/// use pipeline::{RingConfig, WaitStrategy};
///
/// let config = RingConfig { capacity_slots: 1024, batch_slots_max: 64, wait: WaitStrategy::Park };
/// assert_eq!(config.validate(), Ok(()));
/// assert_eq!(RingConfig::default().capacity_slots, 4096);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingConfig {
    /// Slots in the ring; a power of two in `1..=CAPACITY_SLOTS_MAX`.
    pub capacity_slots: usize,
    /// Most slots a single batch write or read may cover; `1..=capacity_slots`.
    pub batch_slots_max: usize,
    /// How both sides wait (consumer on empty, producer on full).
    pub wait: WaitStrategy,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig { capacity_slots: 4096, batch_slots_max: 256, wait: WaitStrategy::default() }
    }
}

/// Why a ring could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// `capacity_slots` was 0.
    #[error("ring capacity_slots must be at least 1, got 0")]
    CapacityZero,
    /// `capacity_slots` was not a power of two (indices are masked into slots).
    #[error(
        "ring capacity_slots must be a power of two, got {got} (nearest: {} or {})",
        got.next_power_of_two() / 2,
        got.next_power_of_two()
    )]
    CapacityNotPowerOfTwo {
        /// The capacity asked for.
        got: usize,
    },
    /// `capacity_slots` was over [`CAPACITY_SLOTS_MAX`].
    #[error("ring capacity_slots {got} exceeds the maximum {CAPACITY_SLOTS_MAX}")]
    CapacityTooLarge {
        /// The capacity asked for.
        got: usize,
    },
    /// `batch_slots_max` was 0: no batch could ever be written.
    #[error("batch_slots_max must be at least 1, got 0")]
    BatchZero,
    /// `batch_slots_max` was over `capacity_slots`: such a batch could never fit.
    #[error("batch_slots_max {batch} exceeds capacity_slots {capacity}")]
    BatchLargerThanCapacity {
        /// The batch bound asked for.
        batch: usize,
        /// The ring's capacity.
        capacity: usize,
    },
}

impl RingConfig {
    /// Checks the bounds; every constructor calls this, so bad sizes fail at build time.
    ///
    /// ```
    /// use pipeline::{RingConfig, RingError};
    ///
    /// assert_eq!(RingConfig::default().validate(), Ok(()));
    /// let zero = RingConfig { capacity_slots: 0, ..RingConfig::default() };
    /// assert_eq!(zero.validate(), Err(RingError::CapacityZero));
    /// let wide = RingConfig { capacity_slots: 8, batch_slots_max: 16, ..RingConfig::default() };
    /// let refused = RingError::BatchLargerThanCapacity { batch: 16, capacity: 8 };
    /// assert_eq!(wide.validate(), Err(refused));
    /// ```
    pub fn validate(&self) -> Result<(), RingError> {
        let capacity = self.capacity_slots;
        if capacity == 0 {
            return Err(RingError::CapacityZero);
        }
        if capacity > CAPACITY_SLOTS_MAX {
            return Err(RingError::CapacityTooLarge { got: capacity });
        }
        if !capacity.is_power_of_two() {
            return Err(RingError::CapacityNotPowerOfTwo { got: capacity });
        }
        if self.batch_slots_max == 0 {
            return Err(RingError::BatchZero);
        }
        if self.batch_slots_max > capacity {
            return Err(RingError::BatchLargerThanCapacity {
                batch: self.batch_slots_max,
                capacity,
            });
        }
        Ok(())
    }
}

/// A push that could not complete; the item is handed back, never dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TryPushError<T> {
    /// No free slot now; the item is handed back.
    #[error("ring is full")]
    Full(T),
    /// The consumer was dropped, so the item could never be read; handed back.
    #[error("the consumer is gone")]
    Disconnected(T),
}

impl<T> TryPushError<T> {
    /// The item that was not pushed, whatever the reason, so a caller can retry or reroute it.
    ///
    /// ```
    /// use pipeline::TryPushError;
    ///
    /// assert_eq!(TryPushError::Full(20).into_inner(), 20);
    /// assert_eq!(TryPushError::Disconnected("order").into_inner(), "order");
    /// ```
    pub fn into_inner(self) -> T {
        match self {
            TryPushError::Full(item) | TryPushError::Disconnected(item) => item,
        }
    }
}

/// A batch write that could not complete; no slot was published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Fewer free slots than the batch needs now (a batch is published whole or not at all).
    #[error("ring has room for fewer than the requested slots")]
    Full,
    /// The consumer was dropped.
    #[error("the consumer is gone")]
    Disconnected,
    /// The batch is larger than `batch_slots_max`, so it would never fit.
    #[error("batch of {requested} slots exceeds batch_slots_max {max}")]
    TooLarge {
        /// Slots asked for.
        requested: usize,
        /// The ring's `batch_slots_max`.
        max: usize,
    },
}

/// The other side of the connector has been dropped (and, for a consumer, the ring is drained).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the other side of the ring is gone")]
pub struct Disconnected;

struct Shared<T> {
    /// Next index the consumer reads. Written only by the consumer.
    head: CachePadded<AtomicUsize>,
    /// The end of the latest batch that crossed a multiple of [`CATCH_UP_STRIDE_SLOTS`]: a
    /// consumer that has fallen behind jumps there instead of following every header, and a
    /// depth sample starts there. Written only by the producer, once per stride, so reading
    /// it costs the producer at most one line transfer per stride. (There is no shared
    /// `tail`: publication goes through `batch_ends`.)
    catch_up_end: CachePadded<AtomicUsize>,
    /// `batch_ends[i]`: the end index of the batch the producer last published starting at
    /// a slot `i` (see the module docs for why a stale entry is never taken for a new one).
    batch_ends: Box<[AtomicUsize]>,
    /// The ring's slots are `storage[first_slot..first_slot + capacity]` (see [`slot_storage`]).
    storage: Box<[UnsafeCell<T>]>,
    first_slot: usize,
    producer_alive: AtomicBool,
    consumer_alive: AtomicBool,
    /// The producer sleeps here when the ring is full.
    producer_parker: Arc<Parker>,
    /// The consumer sleeps here when the ring is empty.
    consumer_parker: Arc<Parker>,
}

// SAFETY: slots are only accessed through the index protocol in the module docs: the producer
// writes only slots in [tail, head + capacity), the consumer reads only slots in
// [head, end of the last header it followed), and the Release/Acquire pairs on `head` and the
// batch headers make those ranges disjoint in time. So sharing `Shared` between the two
// threads is sound whenever `T` itself may move between threads.
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// A view of the ring's slots (without the alignment padding around them) and batch
    /// headers, for a side that holds `self` through its `Arc` as long as the view.
    fn view(&self) -> RingView<T> {
        let capacity = self.batch_ends.len();
        let slots = &self.storage[self.first_slot..self.first_slot + capacity];
        // SAFETY: both boxed slices live as long as `Shared`, which each side keeps alive by
        // the `Arc` it holds beside its view, and a boxed slice never moves.
        unsafe { RingView::new(slots, &self.batch_ends) }
    }
}

/// The writing end of a lock-free ring. Exactly one exists per ring.
///
/// Aligned to 128 bytes, like a cache-padded index: `tail` and `cached_head` are written per
/// batch, and a neighbour in whatever holds the producer (a heap-allocated closure, a `Vec` of
/// outlets) written by another thread would otherwise share their cache line and cost a transfer per
/// batch.
#[repr(align(128))]
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    ring: RingView<T>,
    batch_slots_max: usize,
    tail: usize,
    cached_head: usize,
    notify_consumer: bool,
    /// Whether to issue [`prefetch_for_write`] after each publish (the CPU implements it).
    prefetch: bool,
    waiter: Waiter,
}

/// The reading end of a lock-free ring. Exactly one exists per ring. Aligned like
/// [`Producer`], for the same reason (`head` and `known_end` are written on every batch).
#[repr(align(128))]
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    ring: RingView<T>,
    batch_slots_max: usize,
    head: usize,
    /// The end of the last batch header followed: messages in [head, known_end) are readable.
    known_end: usize,
    /// Polls in a row that found nothing new (saturating), for [`IDLE_POLLS_BEFORE_PREFETCH`].
    idle_polls: u32,
    notify_producer: bool,
    waiter: Waiter,
}

// SAFETY: a side's `RingView` points into the `Shared` that the side's own `Arc` keeps alive,
// so moving the side to another thread moves that access with it, exactly as moving the
// `Arc<Shared<T>>` alone would (which is `Send` when `T: Send`, `Shared` being `Sync` then);
// the index protocol, not the thread, is what keeps the two sides' slot accesses apart.
unsafe impl<T: Send> Send for Producer<T> {}
// SAFETY: as for `Producer`.
unsafe impl<T: Send> Send for Consumer<T> {}

/// Follows single-message batches from `start`, [`SINGLE_SLOT_SPAN`] headers at a time, while
/// they cover at most `bound` slots; returns the end reached (`start` when the next span is
/// not all published single-message batches). Out of line, so that the keep-up path of
/// [`Consumer::read_batch`], which never comes here, keeps its registers.
#[inline(never)]
fn follow_single_slot_batches<T>(ring: RingView<T>, start: usize, bound: usize) -> usize {
    let mut end = start;
    while end.wrapping_sub(start) + SINGLE_SLOT_SPAN <= bound
        && ring.single_slot_batches::<SINGLE_SLOT_SPAN>(end)
    {
        end = end.wrapping_add(SINGLE_SLOT_SPAN);
    }
    end
}

/// Slots between `head` and `tail` (or the end of the batches followed), checked against
/// `capacity` in release builds: more would mean a corrupt index or batch header, and the
/// producer would overwrite unread slots (or the consumer read unwritten ones) without any
/// other sign. The check costs a subtraction and a predictable branch per refresh, nothing
/// per message.
#[inline]
fn occupied_slots(tail: usize, head: usize, capacity: usize) -> usize {
    let occupied = tail.wrapping_sub(head);
    assert!(
        occupied <= capacity,
        "ring occupancy {occupied} over capacity {capacity}: corrupt index"
    );
    occupied
}

/// `a` if it lies ahead of `b` by at most `capacity`, else `b`: the later of the two when `a`
/// may lag `b` by any amount but never leads it by more than `capacity` (the catch-up index
/// against the end of the headers followed).
#[inline]
fn later_index(a: usize, b: usize, capacity: usize) -> usize {
    if a.wrapping_sub(b) <= capacity { a } else { b }
}

/// The producer stores `catch_up_end` when a batch's end crosses a multiple of this many
/// slots: at most one transfer of that line per stride, and a consumer that jumps there lands
/// at most one stride (or one batch) behind the newest header.
#[cfg(not(loom))]
const CATCH_UP_STRIDE_SLOTS: usize = 64;
/// Slots a consumer must have followed (over at least two headers) in one call before it
/// jumps to `catch_up_end`. A consumer that keeps up finds one header and then none and never
/// reads that line; at batch 16, where each header lies on its own line, one that is 128
/// slots behind reads one line instead of up to eight more headers. Measured: 8 B × 16 from
/// 0.63× to 1.46× the best peer (docs/benchmarks/ring.md, which also has what the batch-1
/// cells did).
#[cfg(not(loom))]
const CATCH_UP_AFTER_SLOTS: usize = 128;
/// The mean batch (in slots) at which the headers followed lie one to a cache line. Below
/// it, following headers reads one line per several batches and a jump gains nothing:
/// measured, jumping after two headers whatever their spacing cost 8 B × 1 about a third.
#[cfg(not(loom))]
const CATCH_UP_MEAN_BATCH_SLOTS: usize = CACHE_LINE_BYTES / std::mem::size_of::<usize>();
/// Headers a consumer that has fallen behind a stream of single-message batches checks at
/// once: a line of them.
#[cfg(not(loom))]
const SINGLE_SLOT_SPAN: usize = CACHE_LINE_BYTES / std::mem::size_of::<usize>();
/// Under loom the rings hold a few slots: small enough that the models take the jump (after
/// two batches of two, `tests/loom.rs`) and check single-slot headers two at a time (a
/// stream of single messages never jumps, as in the real configuration, so that model
/// reaches the span check instead).
#[cfg(loom)]
const SINGLE_SLOT_SPAN: usize = 2;
#[cfg(loom)]
const CATCH_UP_STRIDE_SLOTS: usize = 2;
#[cfg(loom)]
const CATCH_UP_AFTER_SLOTS: usize = 4;
#[cfg(loom)]
const CATCH_UP_MEAN_BATCH_SLOTS: usize = 2;
// `publish` finds a crossed multiple by the bits `start ^ end` shares with the stride.
const _: () = assert!(CATCH_UP_STRIDE_SLOTS.is_power_of_two());

/// Bytes that must separate the ring's slots from unrelated data, and the alignment of its
/// first slot: a pair of 64-byte lines, as for [`CachePadded`].
const SLOT_ALIGN_BYTES: usize = 128;

/// Allocates `capacity` default slots starting on a [`SLOT_ALIGN_BYTES`] boundary, with at
/// least that many bytes of padding after the last one; returns the storage and the index of
/// its first ring slot. Aligned slots let a batch of small messages fill whole cache lines,
/// so the producer writing the next batch does not share a line with the consumer reading
/// this one; the padding keeps other allocations off the ring's first and last lines.
fn slot_storage<T: Default>(capacity: usize) -> (Box<[UnsafeCell<T>]>, usize) {
    let slot_bytes = std::mem::size_of::<UnsafeCell<T>>();
    let pad_slots = if slot_bytes == 0 { 0 } else { 2 * SLOT_ALIGN_BYTES.div_ceil(slot_bytes) };
    let storage: Box<[UnsafeCell<T>]> =
        (0..capacity + pad_slots).map(|_| UnsafeCell::new(T::default())).collect();
    // `align_offset` may answer "impossible" (usize::MAX) for odd slot sizes: start at 0 then.
    let first_slot = match storage.as_ptr().align_offset(SLOT_ALIGN_BYTES) {
        offset if offset <= pad_slots / 2 => offset,
        _ => 0,
    };
    (storage, first_slot)
}

/// Builds a lock-free SPSC ring with its own parkers; the one place its slots are allocated.
///
/// ```
/// use pipeline::ring::{RingConfig, RingError, spsc};
///
/// let (mut producer, mut consumer) = spsc::<u32>(&RingConfig::default())?;
/// producer.push_batch(&[1])?;
/// assert_eq!(consumer.len(), 1);
/// let tiny = RingConfig { capacity_slots: 1 << 30, ..RingConfig::default() };
/// assert_eq!(spsc::<u32>(&tiny).err(), Some(RingError::CapacityTooLarge { got: 1 << 30 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn spsc<T: Copy + Default + Send>(
    config: &RingConfig,
) -> Result<(Producer<T>, Consumer<T>), RingError> {
    spsc_with(config, Parker::new(), Parker::new())
}

/// Builds a lock-free SPSC ring whose sides sleep on the given parkers, so that one thread can
/// wait on several rings (fan-in: all its rings share its consumer parker).
///
/// ```
/// use pipeline::ring::{RingConfig, spsc_with};
/// use pipeline::{Parker, WaitStrategy};
///
/// let config = RingConfig { wait: WaitStrategy::Park, ..RingConfig::default() };
/// let shared = Parker::new();
/// let (mut a, mut a_out) = spsc_with::<u8>(&config, Parker::new(), shared.clone())?;
/// let (mut b, mut b_out) = spsc_with::<u8>(&config, Parker::new(), shared)?;
/// a.push_batch(&[1])?;
/// b.push_batch(&[2])?;
/// assert_eq!(a_out.read_batch(1, |_| ()) + b_out.read_batch(1, |_| ()), 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn spsc_with<T: Copy + Default + Send>(
    config: &RingConfig,
    producer_parker: Arc<Parker>,
    consumer_parker: Arc<Parker>,
) -> Result<(Producer<T>, Consumer<T>), RingError> {
    config.validate()?;
    let (storage, first_slot) = slot_storage(config.capacity_slots);
    let shared = Arc::new(Shared {
        head: CachePadded(AtomicUsize::new(0)),
        catch_up_end: CachePadded(AtomicUsize::new(0)),
        batch_ends: (0..config.capacity_slots).map(|_| AtomicUsize::new(0)).collect(),
        storage,
        first_slot,
        producer_alive: AtomicBool::new(true),
        consumer_alive: AtomicBool::new(true),
        producer_parker: producer_parker.clone(),
        consumer_parker: consumer_parker.clone(),
    });
    let may_park = config.wait.may_park();
    let producer = Producer {
        ring: shared.view(),
        shared: shared.clone(),
        batch_slots_max: config.batch_slots_max,
        tail: 0,
        cached_head: 0,
        notify_consumer: may_park,
        prefetch: cpu_has_prefetchw(),
        waiter: Waiter::new(config.wait, producer_parker),
    };
    let consumer = Consumer {
        ring: shared.view(),
        shared,
        batch_slots_max: config.batch_slots_max,
        head: 0,
        known_end: 0,
        idle_polls: 0,
        notify_producer: may_park,
        waiter: Waiter::new(config.wait, consumer_parker),
    };
    Ok((producer, consumer))
}

impl<T: Copy> Producer<T> {
    /// Slots in the ring, as configured.
    ///
    /// ```
    /// use pipeline::ring::{RingConfig, spsc};
    ///
    /// let config = RingConfig { capacity_slots: 16, batch_slots_max: 4, ..RingConfig::default() };
    /// let (producer, _consumer) = spsc::<u8>(&config)?;
    /// assert_eq!(producer.capacity_slots(), 16);
    /// # Ok::<(), pipeline::RingError>(())
    /// ```
    pub fn capacity_slots(&self) -> usize {
        self.ring.capacity()
    }

    /// The most slots one batch may cover; larger writes are refused or split into chunks.
    ///
    /// ```
    /// use pipeline::ring::{RingConfig, spsc};
    ///
    /// let config = RingConfig { capacity_slots: 16, batch_slots_max: 4, ..RingConfig::default() };
    /// let (producer, _consumer) = spsc::<u8>(&config)?;
    /// assert_eq!(producer.batch_slots_max(), 4);
    /// # Ok::<(), pipeline::RingError>(())
    /// ```
    pub fn batch_slots_max(&self) -> usize {
        self.batch_slots_max
    }

    /// Whether `n` slots are free by the cached consumer index alone (no shared load): the
    /// fast paths' test, which fails only when the cache says the ring may be too full.
    #[inline(always)]
    fn fits_by_cache(&self, n: usize) -> bool {
        self.tail.wrapping_sub(self.cached_head) + n <= self.ring.capacity()
    }

    /// Free slots, refreshing the cached consumer index only when the cache says fewer than
    /// `wanted` are free.
    #[inline]
    fn free_slots(&mut self, wanted: usize) -> usize {
        let capacity = self.ring.capacity();
        if self.fits_by_cache(wanted) {
            return capacity - self.tail.wrapping_sub(self.cached_head);
        }
        // Acquire: the consumer's reads of the slots it released happen before we reuse them.
        self.cached_head = self.shared.head.load(Ordering::Acquire);
        capacity - occupied_slots(self.tail, self.cached_head, capacity)
    }

    fn consumer_gone(&self) -> bool {
        // Acquire: pairs with the consumer's Release on drop (nothing to read after it).
        !self.shared.consumer_alive.load(Ordering::Acquire)
    }

    /// Publishes the batch of slots from `start` up to `self.tail` by its header and wakes the
    /// consumer if it may be parked.
    #[inline(always)]
    fn publish(&self, start: usize) {
        // Release: the slot writes become visible before the header.
        self.ring.header(start).store(self.tail, Ordering::Release);
        if (start ^ self.tail) >= CATCH_UP_STRIDE_SLOTS {
            // Release: the slot writes become visible before a consumer jumps past them.
            self.shared.catch_up_end.store(self.tail, Ordering::Release);
        }
        if self.notify_consumer {
            self.shared.consumer_parker.notify();
        }
    }

    /// Checks that `n` slots may be written now. All or nothing: nothing is claimed on error.
    #[inline(always)]
    fn claim(&mut self, n: usize) -> Result<(), BatchError> {
        if n > self.batch_slots_max {
            return Err(BatchError::TooLarge { requested: n, max: self.batch_slots_max });
        }
        if self.consumer_gone() {
            return Err(BatchError::Disconnected);
        }
        if self.free_slots(n) < n {
            return Err(BatchError::Full);
        }
        Ok(())
    }

    /// Lets `fill` write the `n` slots that [`Producer::claim`] (or the fast path's cached
    /// check) found free, handed over as at most two runs (before and after the wrap),
    /// publishes them with one header, then asks for the lines of the next `n` slots in the
    /// exclusive state ([`prefetch_for_write`]) when `n > 1`.
    #[inline(always)]
    fn write_claimed(&mut self, n: usize, fill: impl FnOnce([&[UnsafeCell<T>]; 2])) {
        let start = self.tail;
        // SAFETY: `n` ≤ `batch_slots_max` ≤ capacity (checked by the caller and the config).
        fill(unsafe { self.ring.runs(start, n) });
        self.tail = start.wrapping_add(n);
        self.publish(start);
        // Not after a single-message batch: a consumer keeping up with single messages polls
        // the next slot's line itself (its idle prefetch asks for it), so asking for it in
        // the exclusive state only bounced that line between the two cores (64 B batch 1:
        // 19–21 against 28–34 Mmsg/s without, docs/benchmarks/ring.md).
        if self.prefetch && n > 1 {
            // SAFETY: as above.
            let [up_to_wrap, _] = unsafe { self.ring.runs(self.tail, n) };
            prefetch_for_write(up_to_wrap);
        }
    }

    /// Claims `n` slots, lets `fill(i, slot)` build each message in place, and publishes all
    /// `n` at once. All or nothing: on error no slot is published.
    ///
    /// ```
    /// use pipeline::ring::{BatchError, RingConfig, spsc};
    ///
    /// let config = RingConfig { capacity_slots: 4, batch_slots_max: 4, ..RingConfig::default() };
    /// let (mut producer, consumer) = spsc::<u64>(&config)?;
    /// producer.try_write_batch(3, |i, slot| *slot = i as u64)?;
    /// assert_eq!(producer.try_write_batch(2, |_, _| ()), Err(BatchError::Full));
    /// let too_large = BatchError::TooLarge { requested: 5, max: 4 };
    /// assert_eq!(producer.try_write_batch(5, |_, _| ()), Err(too_large));
    /// drop(consumer);
    /// assert_eq!(producer.try_write_batch(1, |_, _| ()), Err(BatchError::Disconnected));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_write_batch(
        &mut self,
        n: usize,
        mut fill: impl FnMut(usize, &mut T),
    ) -> Result<(), BatchError> {
        self.claim(n)?;
        self.write_claimed(n, |runs| {
            for (i, slot) in runs.into_iter().flatten().enumerate() {
                // SAFETY: `claim` checked the slot's index lies in [tail, head + capacity),
                // so the consumer does not access it until `write_claimed` publishes it.
                slot.with_mut(|ptr| fill(i, unsafe { &mut *ptr }));
            }
        });
        Ok(())
    }

    /// Pushes all `items`, one publish per chunk of up to `batch_slots_max`, waiting for room.
    /// A chunk waits until it fits whole: trickling single slots into a full ring would write
    /// the very cache lines the consumer is reading and slow both sides down.
    ///
    /// ```
    /// use pipeline::ring::{Disconnected, RingConfig, spsc};
    ///
    /// let config = RingConfig { capacity_slots: 4, batch_slots_max: 2, ..RingConfig::default() };
    /// let (mut producer, mut consumer) = spsc::<u32>(&config)?;
    /// // Ten messages through four slots: the producer waits while the consumer drains.
    /// let writer = std::thread::spawn(move || producer.push_batch(&[1; 10]));
    /// let mut read = 0;
    /// while let Ok(n) = consumer.wait_read_batch(4, |_| ()) {
    ///     read += n;
    /// }
    /// assert_eq!(writer.join().unwrap(), Ok(()));
    /// assert_eq!(read, 10);
    ///
    /// let (mut producer, consumer) = spsc::<u32>(&config)?;
    /// drop(consumer);
    /// assert_eq!(producer.push_batch(&[1]), Err(Disconnected));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn push_batch(&mut self, items: &[T]) -> Result<(), Disconnected> {
        // The fast path, inline: a batch of 1..=batch_slots_max that the cached consumer
        // index says fits. Everything else (an empty or oversized batch, a ring the cache
        // says is full, a consumer gone) takes the general loop, out of line.
        let n = items.len();
        if n.wrapping_sub(1) < self.batch_slots_max
            && self.fits_by_cache(n)
            && !self.consumer_gone()
        {
            match items {
                [item] => self.write_one(*item),
                _ => self.write_items(items),
            }
            return Ok(());
        }
        self.push_chunks(items)
    }

    /// Writes one message into the next slot, known to be free, and publishes it: one store
    /// of the message, one of its header, no copy loop (the batch-1 path).
    #[inline(always)]
    fn write_one(&mut self, item: T) {
        let start = self.tail;
        // SAFETY: the caller found the slot free (`fits_by_cache`): its index lies in
        // [tail, head + capacity), so the consumer does not access it until it is published.
        self.ring.slot(start).with_mut(|ptr| unsafe { *ptr = item });
        self.tail = start.wrapping_add(1);
        self.publish(start);
    }

    /// Copies `items` (at most `batch_slots_max`, known to fit) into the next slots and
    /// publishes them as one batch.
    #[inline(always)]
    fn write_items(&mut self, items: &[T]) {
        self.write_claimed(items.len(), |[first, second]| {
            let (before_wrap, after_wrap) = items.split_at(first.len());
            copy_into(first, before_wrap);
            copy_into(second, after_wrap);
        });
    }

    /// [`Producer::push_batch`]'s general loop: chunks of `batch_slots_max`, each waiting
    /// until it fits whole.
    #[inline(never)]
    fn push_chunks(&mut self, items: &[T]) -> Result<(), Disconnected> {
        let mut rest = items;
        while !rest.is_empty() {
            let chunk = rest.len().min(self.batch_slots_max);
            match self.claim(chunk) {
                Ok(()) => {}
                Err(BatchError::Full) => {
                    self.wait_for_room(chunk);
                    continue;
                }
                Err(BatchError::Disconnected) => return Err(Disconnected),
                Err(error @ BatchError::TooLarge { .. }) => {
                    unreachable!("chunks never exceed batch_slots_max: {error}")
                }
            }
            let (items, after) = rest.split_at(chunk);
            self.write_items(items);
            rest = after;
        }
        Ok(())
    }

    fn wait_for_room(&mut self, wanted: usize) {
        let shared = &*self.shared;
        let (tail, capacity) = (self.tail, self.ring.capacity());
        self.waiter.wait_until(|| {
            // Acquire: as in `free_slots`.
            let head = shared.head.load(Ordering::Acquire);
            capacity - occupied_slots(tail, head, capacity) >= wanted
                || !shared.consumer_alive.load(Ordering::Acquire)
        });
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // Release: our last batch header happens before the consumer sees us gone.
        self.shared.producer_alive.store(false, Ordering::Release);
        self.shared.consumer_parker.notify();
    }
}

impl<T: Copy> Consumer<T> {
    /// Slots in the ring, as configured: with [`Consumer::len`], how full it is.
    ///
    /// ```
    /// use pipeline::ring::{RingConfig, spsc};
    ///
    /// let config = RingConfig { capacity_slots: 32, batch_slots_max: 8, ..RingConfig::default() };
    /// let (_producer, consumer) = spsc::<u8>(&config)?;
    /// assert_eq!(consumer.capacity_slots(), 32);
    /// # Ok::<(), pipeline::RingError>(())
    /// ```
    pub fn capacity_slots(&self) -> usize {
        self.ring.capacity()
    }

    /// Messages available now, following published batch headers only while the ones already
    /// followed cover fewer than `wanted`. A call that has followed two or more headers over
    /// [`CATCH_UP_AFTER_SLOTS`] has found the consumer behind: it reads `catch_up_end` once
    /// and jumps there instead of reading one more header line per batch ([`Self::catch_up`]).
    #[inline(always)]
    fn available(&mut self, wanted: usize) -> usize {
        let ready = self.known_end.wrapping_sub(self.head);
        if ready >= wanted {
            return ready;
        }
        let before = self.known_end;
        let (mut end, headers) =
            self.follow_headers(before, (wanted - ready).min(CATCH_UP_AFTER_SLOTS));
        if end.wrapping_sub(before) >= CATCH_UP_AFTER_SLOTS {
            end = self.catch_up(before, end, headers, wanted);
        }
        if end == before {
            // Nothing new: return without a store once past the first idle polls. This is
            // the polling path of an idle consumer, and a store on every poll cost ~50 ns
            // per hop in ping-pong (docs/benchmarks/ring.md).
            if ready == 0 {
                self.note_idle_poll();
            }
            return ready;
        }
        self.idle_polls = 0;
        self.known_end = end;
        debug_assert!(end.wrapping_sub(self.head) <= self.ring.capacity());
        end.wrapping_sub(self.head)
    }

    /// Follows published headers from `start` while they cover fewer than `bound` slots past
    /// it; returns the end reached and how many headers were followed.
    ///
    /// Each header names where the next one lies, so following them one by one is a chain of
    /// dependent loads. At batch 1 a consumer that has fallen behind would run that chain once
    /// per message; once it has followed two headers and the last was a single-message batch,
    /// it checks [`SINGLE_SLOT_SPAN`] headers at a time instead ([`RingView::single_slot_batches`]):
    /// independent loads of one line of headers, no branch per header.
    #[inline(always)]
    fn follow_headers(&self, start: usize, bound: usize) -> (usize, usize) {
        let ring = self.ring;
        let (mut end, mut headers) = (start, 0);
        while end.wrapping_sub(start) < bound {
            let Some(next) = ring.published_batch_end(end) else { break };
            let single_slot = next.wrapping_sub(end) == 1;
            end = next;
            headers += 1;
            if single_slot && headers >= 2 {
                let skipped_to = follow_single_slot_batches(ring, end, bound - (end - start));
                headers += skipped_to.wrapping_sub(end);
                end = skipped_to;
            }
        }
        (end, headers)
    }

    /// The rest of [`Self::available`] once its headers from `before` reached `end`, at least
    /// [`CATCH_UP_AFTER_SLOTS`] further: when they were two or more and averaged at least
    /// [`CATCH_UP_MEAN_BATCH_SLOTS`] (one to a line), jump to `catch_up_end`; then follow
    /// headers until `wanted` is covered. Out of line: a consumer that keeps up never comes
    /// here.
    #[inline(never)]
    fn catch_up(&self, before: usize, end: usize, headers: usize, wanted: usize) -> usize {
        let capacity = self.ring.capacity();
        let followed = end.wrapping_sub(before);
        let mut end = end;
        if headers >= 2 && followed >= headers * CATCH_UP_MEAN_BATCH_SLOTS {
            // Acquire: pairs with the producer's Release, so the slots below are written.
            let catch_up_end = self.shared.catch_up_end.load(Ordering::Acquire);
            end = later_index(catch_up_end, end, capacity);
        }
        let ready = occupied_slots(end, self.head, capacity);
        if ready < wanted {
            end = self.follow_headers(end, wanted - ready).0;
        }
        end
    }

    /// An idle poll that found nothing: count the first few (the only store), then, when the
    /// next message's slot begins a cache line, ask for that line, so that when its header
    /// appears the slot's transfer has already started ([`prefetch_for_read`]). Not for a
    /// slot inside a line: the producer is then filling that line message by message, and
    /// pulling it away between two of its writes cost a transfer per message (8 B batch 1:
    /// median 0.44× the best peer with the prefetch on every idle poll, 1.37× with it only at
    /// line starts; the 8 B hop p50, which now gets the prefetch for one message in eight,
    /// from 0.96× to 1.00–1.07× the best peer's; docs/benchmarks/ring.md).
    #[inline(always)]
    fn note_idle_poll(&mut self) {
        if self.idle_polls >= IDLE_POLLS_BEFORE_PREFETCH {
            let slot = self.ring.slot(self.known_end);
            if begins_cache_line(slot) {
                prefetch_for_read(slot);
            }
        } else {
            self.idle_polls += 1;
        }
    }

    /// Messages in the ring now, a depth sample for metrics: it follows the headers published
    /// past the catch-up index (at most one stride and a batch of them, or the ring's
    /// capacity while the producer keeps publishing), so sample it now and then, not on every
    /// poll.
    ///
    /// ```
    /// use pipeline::ring::{RingConfig, spsc};
    ///
    /// let (mut producer, mut consumer) = spsc::<u8>(&RingConfig::default())?;
    /// assert_eq!(consumer.len(), 0);
    /// producer.push_batch(&[1, 2, 3])?;
    /// assert_eq!(consumer.len(), 3);
    /// consumer.read_batch(1, |_| ());
    /// assert_eq!(consumer.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        // Relaxed: only counted, no slot is read below it.
        let catch_up_end = self.shared.catch_up_end.load(Ordering::Relaxed);
        let mut end = later_index(catch_up_end, self.known_end, self.ring.capacity());
        while let Some(next) = self.ring.published_batch_end(end) {
            end = next;
        }
        occupied_slots(end, self.head, self.ring.capacity())
    }

    /// Whether no message is readable now (the check a waiting consumer polls).
    ///
    /// ```
    /// use pipeline::ring::{RingConfig, spsc};
    ///
    /// let (mut producer, consumer) = spsc::<u8>(&RingConfig::default())?;
    /// assert!(consumer.is_empty());
    /// producer.push_batch(&[1])?;
    /// assert!(!consumer.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.known_end == self.head && self.ring.published_batch_end(self.known_end).is_none()
    }

    /// True once the producer is gone and every message it published has been read.
    ///
    /// ```
    /// use pipeline::ring::{RingConfig, spsc};
    ///
    /// let (mut producer, mut consumer) = spsc::<u8>(&RingConfig::default())?;
    /// assert!(!consumer.is_disconnected());
    /// producer.push_batch(&[1])?;
    /// drop(producer);
    /// assert!(!consumer.is_disconnected(), "one message is still unread");
    /// consumer.read_batch(1, |_| ());
    /// assert!(consumer.is_disconnected());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_disconnected(&mut self) -> bool {
        // Acquire: pairs with the producer's Release on drop, so `available` sees its last
        // batch header.
        !self.shared.producer_alive.load(Ordering::Acquire) && self.available(1) == 0
    }

    /// Calls `f` on up to `max` available messages (and at most `batch_slots_max`), then
    /// releases them all with one store. Returns how many were read; never waits.
    ///
    /// ```
    /// use pipeline::ring::{RingConfig, spsc};
    ///
    /// let config = RingConfig { capacity_slots: 8, batch_slots_max: 2, ..RingConfig::default() };
    /// let (mut producer, mut consumer) = spsc::<u8>(&config)?;
    /// assert_eq!(consumer.read_batch(8, |_| ()), 0, "empty: returns at once");
    /// producer.push_batch(&[1, 2, 3])?;
    /// let mut read = Vec::new();
    /// assert_eq!(consumer.read_batch(8, |value| read.push(*value)), 2, "at most batch_slots_max");
    /// assert_eq!(read, [1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn read_batch(&mut self, max: usize, mut f: impl FnMut(&T)) -> usize {
        let wanted = max.min(self.batch_slots_max);
        let n = self.available(wanted).min(wanted);
        if n == 0 {
            return 0;
        }
        // One message (the batch-1 path) without the runs and their loops.
        if n == 1 {
            // SAFETY: the slot's index is `head` < `known_end`: published by the producer
            // (`available` followed its header), which does not touch it until we release it.
            self.ring.slot(self.head).with(|ptr| f(unsafe { &*ptr }));
        } else {
            // SAFETY: `n` ≤ `wanted` ≤ `batch_slots_max` ≤ capacity.
            for run in unsafe { self.ring.runs(self.head, n) } {
                for slot in run {
                    // SAFETY: as above, for every index in [head, head + n) ⊆ [head, known_end).
                    slot.with(|ptr| f(unsafe { &*ptr }));
                }
            }
        }
        self.head = self.head.wrapping_add(n);
        // Release: our slot reads complete before the producer may overwrite them.
        self.shared.head.store(self.head, Ordering::Release);
        if self.notify_producer {
            self.shared.producer_parker.notify();
        }
        n
    }

    /// Like [`Consumer::read_batch`], but waits until at least one message is available;
    /// `Err` once the producer is gone and the ring drained. Panics if `max` is 0, which
    /// could never make progress.
    ///
    /// ```
    /// use pipeline::ring::{Disconnected, RingConfig, spsc};
    ///
    /// let (mut producer, mut consumer) = spsc::<u8>(&RingConfig::default())?;
    /// producer.push_batch(&[7])?;
    /// drop(producer);
    /// assert_eq!(consumer.wait_read_batch(4, |value| assert_eq!(*value, 7)), Ok(1));
    /// assert_eq!(consumer.wait_read_batch(4, |_| ()), Err(Disconnected));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_read_batch(
        &mut self,
        max: usize,
        mut f: impl FnMut(&T),
    ) -> Result<usize, Disconnected> {
        assert!(max > 0, "wait_read_batch needs max >= 1 to make progress");
        loop {
            let n = self.read_batch(max, &mut f);
            if n > 0 {
                return Ok(n);
            }
            if self.is_disconnected() {
                return Err(Disconnected);
            }
            let (shared, ring) = (&*self.shared, &self.ring);
            // Nothing was readable, so `known_end == head`: the next batch starts there.
            let next_start = self.known_end;
            self.waiter.wait_until(|| {
                // Acquire on both: as in `published_batch_end` and `is_disconnected`.
                ring.published_batch_end(next_start).is_some()
                    || !shared.producer_alive.load(Ordering::Acquire)
            });
        }
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        // Release: the producer sees us gone and stops waiting for room.
        self.shared.consumer_alive.store(false, Ordering::Release);
        self.shared.producer_parker.notify();
    }
}

/// Most bytes of slots [`prefetch_for_write`] asks for after one publish: 64 lines. A larger
/// batch is a stream the hardware prefetchers follow anyway; this bounds the hints per publish.
const PREFETCH_BYTES_MAX: usize = 4096;
/// Bytes per cache line on the CPUs the prefetch targets (x86-64).
const CACHE_LINE_BYTES: usize = 64;

/// Asks for the cache lines of `slots` in the exclusive state (x86 `PREFETCHW`), ahead of the
/// producer's next write to them.
///
/// Why (measured): without it, a consumer that kept up read one producer batch per call, the
/// producer was the slow side, and the 8 B batch-16 cell ran at 0.5× disruptor, whose slower
/// consumer lets its ring run full and reads 256 per call. With it, leantier's ring runs full
/// too and the consumer reads 256 per call (docs/benchmarks/ring.md has the read-size
/// histograms and ratios). Our reading of the mechanism (this VM exposes no cache counters to
/// confirm it): the consumer read these lines a lap ago and may still hold them shared, so
/// the next batch's stores waited for the ownership transfer; with the lines already owned the
/// producer outruns the consumer, and the publishing line crossed once per consumer read
/// instead of once per producer batch (measured when batches were published through `tail`;
/// batch headers keep the effect). A hint only: no memory is read or written. Called only where
/// [`cpu_has_prefetchw`] says the CPU implements the instruction.
#[inline(always)]
fn prefetch_for_write<T>(slots: &[UnsafeCell<T>]) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    {
        let start = slots.as_ptr() as usize;
        let end = start + std::mem::size_of_val(slots).min(PREFETCH_BYTES_MAX);
        let mut line = start & !(CACHE_LINE_BYTES - 1);
        while line < end {
            // SAFETY: PREFETCHW is a hint: it neither reads nor writes memory architecturally
            // and never faults, whatever the address; `line` lies within the ring's storage.
            unsafe {
                std::arch::asm!(
                    "prefetchw [{line}]",
                    line = in(reg) line,
                    options(nostack, preserves_flags)
                );
            }
            line += CACHE_LINE_BYTES;
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = slots;
}

/// Idle polls in a row after which each further idle poll prefetches the next slot. A
/// consumer that keeps up with a stream finds the ring empty for a poll or two between
/// messages; prefetching from the first idle poll pulled the very line the producer was
/// writing away from it on every message (8 B batch 1: 0.67× disruptor against 0.79× without
/// the prefetch, same runs). A consumer waiting for the next request of a ping-pong polls far
/// longer and keeps the latency gain (docs/benchmarks/ring.md).
const IDLE_POLLS_BEFORE_PREFETCH: u32 = 2;

/// Whether `slot` starts at a cache-line boundary, so that no earlier slot shares its first
/// line.
#[inline(always)]
fn begins_cache_line<S>(slot: &S) -> bool {
    (slot as *const S as usize).is_multiple_of(CACHE_LINE_BYTES)
}

/// Asks for the cache line holding `slot` (x86 `PREFETCHT0`, part of SSE, so every x86-64
/// CPU has it). An idle consumer calls it on its polls that find nothing new (after the first
/// [`IDLE_POLLS_BEFORE_PREFETCH`]), for the slot the next message will be written to: the
/// slot's line transfer can then overlap the one of the batch header instead of following
/// it. Measured effect (with `tail` in the header's place): hop p50 1.02× disruptor's instead
/// of 1.085× (docs/benchmarks/ring.md). A hint only: no memory is read or written, so it races
/// with nothing the producer does; loom and miri skip it.
#[inline(always)]
fn prefetch_for_read<T>(slot: &UnsafeCell<T>) {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    // SAFETY: PREFETCHT0 is a hint: it neither reads nor writes memory architecturally and
    // never faults; the address is a slot of the ring's storage.
    unsafe {
        std::arch::asm!(
            "prefetcht0 [{line}]",
            line = in(reg) slot as *const UnsafeCell<T> as usize,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = slot;
}

/// Whether the CPU implements `PREFETCHW` (CPUID leaf 8000_0001h, ECX bit 8, "PRFCHW", which
/// Linux lists as `3dnowprefetch`). Always false under loom and miri, which cannot run it, and
/// off x86-64. Read once per ring, at construction.
fn cpu_has_prefetchw() -> bool {
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    {
        use std::arch::x86_64::__cpuid;
        const EXTENDED_FEATURES_LEAF: u32 = 0x8000_0001;
        const PRFCHW_ECX_BIT: u32 = 1 << 8;
        // SAFETY: CPUID exists on every x86-64 CPU and only reads identification registers
        // (recent Rust calls the intrinsic safe; `unsafe` keeps the 1.85 MSRV building).
        #[allow(unused_unsafe)]
        unsafe {
            __cpuid(0x8000_0000).eax >= EXTENDED_FEATURES_LEAF
                && __cpuid(EXTENDED_FEATURES_LEAF).ecx & PRFCHW_ECX_BIT != 0
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    false
}

/// Copies `items` into the claimed slots `run` (same length), as a plain slice-to-slice copy
/// that the compiler vectorises: no per-message bounds check or index arithmetic.
#[inline(always)]
fn copy_into<T: Copy>(run: &[UnsafeCell<T>], items: &[T]) {
    debug_assert_eq!(run.len(), items.len());
    for (slot, item) in run.iter().zip(items) {
        // SAFETY: `run` holds slots claimed by `Producer::claim` and not yet published, so
        // the consumer does not access them until `write_claimed` publishes them.
        slot.with_mut(|ptr| unsafe { *ptr = *item });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn config(capacity_slots: usize, batch_slots_max: usize) -> RingConfig {
        RingConfig { capacity_slots, batch_slots_max, wait: WaitStrategy::Park }
    }

    #[test]
    fn bad_sizes_fail_at_construction_with_a_reason() {
        let cases = [
            (config(0, 1), RingError::CapacityZero),
            (config(12, 4), RingError::CapacityNotPowerOfTwo { got: 12 }),
            (config(8, 0), RingError::BatchZero),
            (config(8, 16), RingError::BatchLargerThanCapacity { batch: 16, capacity: 8 }),
            (config(1 << 25, 1), RingError::CapacityTooLarge { got: 1 << 25 }),
        ];
        for (config, expected) in cases {
            assert_eq!(spsc::<u64>(&config).err(), Some(expected.clone()));
        }
        assert!(RingError::CapacityNotPowerOfTwo { got: 12 }.to_string().contains("8 or 16"));
    }

    #[test]
    fn full_ring_hands_the_item_back() {
        let kind = crate::ConnectorKind::LockFree;
        let (mut producer, mut consumer) = crate::connector::<u32>(kind, &config(4, 4)).unwrap();
        for i in 0..4 {
            producer.try_push(i).unwrap();
        }
        assert_eq!(producer.try_push(9), Err(TryPushError::Full(9)));
        assert_eq!(consumer.read_batch(1, |v| assert_eq!(*v, 0)), 1);
        producer.try_push(9).unwrap();
        let mut seen = Vec::new();
        consumer.read_batch(usize::MAX, |v| seen.push(*v));
        assert_eq!(seen, [1, 2, 3, 9]);
    }

    #[test]
    fn batch_write_is_all_or_nothing() {
        let (mut producer, mut consumer) = spsc::<u32>(&config(8, 8)).unwrap();
        producer.try_write_batch(6, |i, slot| *slot = i as u32).unwrap();
        assert_eq!(producer.try_write_batch(3, |_, slot| *slot = 99), Err(BatchError::Full));
        assert_eq!(
            producer.try_write_batch(9, |_, _| {}),
            Err(BatchError::TooLarge { requested: 9, max: 8 })
        );
        assert_eq!(consumer.len(), 6);
        assert_eq!(consumer.read_batch(4, |_| {}), 4);
        producer.try_write_batch(3, |i, slot| *slot = 100 + i as u32).unwrap();
        let mut seen = Vec::new();
        while consumer.read_batch(2, |v| seen.push(*v)) > 0 {}
        assert_eq!(seen, [4, 5, 100, 101, 102]);
    }

    /// Headers left from earlier laps never read as new batches: after each lap the ring
    /// reads empty, and a batch read in parts stays readable until its last message.
    #[test]
    fn stale_batch_headers_are_never_taken_for_new_ones() {
        let (mut producer, mut consumer) = spsc::<u32>(&config(4, 4)).unwrap();
        let mut next = 0;
        for lap in 0..6u32 {
            assert!(consumer.is_empty(), "lap {lap}");
            assert_eq!(consumer.read_batch(4, |_| {}), 0, "lap {lap}");
            let batch: Vec<u32> = (next..next + 1 + lap % 3).collect();
            producer.push_batch(&batch).unwrap();
            producer.push_batch(&[next + 100]).unwrap();
            let mut seen = Vec::new();
            while !consumer.is_empty() {
                consumer.read_batch(1, |v| seen.push(*v));
            }
            let mut expected = batch.clone();
            expected.push(next + 100);
            assert_eq!(seen, expected, "lap {lap}");
            next += 1000;
        }
    }

    #[test]
    fn a_consumer_far_behind_jumps_to_the_catch_up_end_and_reads_in_order() {
        let (mut producer, mut consumer) = spsc::<u32>(&config(1024, 256)).unwrap();
        let sent: Vec<u32> = (0..640).collect();
        for batch in sent.chunks(16) {
            producer.push_batch(batch).unwrap();
        }
        let mut seen = Vec::new();
        assert_eq!(consumer.read_batch(256, |v| seen.push(*v)), 256);
        // After 8 headers (128 slots) it jumped to the last stride the producer crossed,
        // instead of following 8 more headers up to 256.
        assert_eq!(consumer.known_end, 640);
        while consumer.read_batch(256, |v| seen.push(*v)) > 0 {}
        assert_eq!(seen, sent);
        // A consumer that keeps up never jumps: one header, then none.
        producer.push_batch(&[7; 16]).unwrap();
        assert_eq!(consumer.read_batch(256, |_| {}), 16);
        assert_eq!(consumer.known_end, 656);
    }

    /// A consumer behind a stream of single messages checks their headers a line at a time:
    /// across the wrap, with batches of other sizes in between (which end a span), it reads
    /// every message once and in order, at most `max` per call.
    #[test]
    fn a_consumer_behind_single_messages_reads_them_in_order_across_the_wrap() {
        let (mut producer, mut consumer) = spsc::<u32>(&config(64, 64)).unwrap();
        let (mut next, mut expected) = (0u32, 0u32);
        for lap in 0..20u32 {
            // 40 messages: singles, with a batch of 2 or 3 somewhere inside a span.
            let mut sent = 0;
            while sent < 40 {
                let n = if sent == 9 + lap % 8 { 2 + lap % 2 } else { 1 };
                let items: Vec<u32> = (next..next + n).collect();
                producer.push_batch(&items).unwrap();
                (next, sent) = (next + n, sent + n);
            }
            let mut reads = Vec::new();
            while !consumer.is_empty() {
                reads.push(consumer.read_batch(32, |v| {
                    assert_eq!(*v, expected, "lap {lap}");
                    expected += 1;
                }));
            }
            assert_eq!(expected, next, "lap {lap}");
            assert_eq!(reads[0], 32, "lap {lap}: the first read takes its whole bound");
        }
    }

    #[test]
    fn a_single_slot_span_is_taken_only_when_every_header_in_it_is_a_published_single() {
        let (mut producer, consumer) = spsc::<u32>(&config(16, 16)).unwrap();
        let ring = consumer.ring;
        assert!(!ring.single_slot_batches::<4>(0), "nothing published");
        for value in 0..3 {
            producer.push_batch(&[value]).unwrap();
        }
        assert!(!ring.single_slot_batches::<4>(0), "the fourth is not published yet");
        producer.push_batch(&[3]).unwrap();
        assert!(ring.single_slot_batches::<4>(0));
        for value in 4..SINGLE_SLOT_SPAN as u32 {
            producer.push_batch(&[value]).unwrap();
        }
        let span = SINGLE_SLOT_SPAN;
        assert_eq!(follow_single_slot_batches(ring, 0, 16), span, "one span, then unpublished");
        assert_eq!(follow_single_slot_batches(ring, 0, span - 1), 0, "a span past the bound");
        producer.push_batch(&[100, 101]).unwrap();
        assert!(!ring.single_slot_batches::<2>(span), "a batch of two is not two singles");
    }

    #[test]
    fn depth_samples_count_every_published_message_between_catch_up_strides() {
        let (mut producer, mut consumer) = spsc::<u32>(&config(1024, 256)).unwrap();
        for value in 0..3 {
            producer.push_batch(&[value]).unwrap();
        }
        assert_eq!(consumer.len(), 3, "before the first stride");
        assert_eq!(consumer.read_batch(1, |_| {}), 1);
        assert_eq!(consumer.len(), 2);
        for value in 0..70 {
            producer.push_batch(&[value]).unwrap();
        }
        assert_eq!(consumer.len(), 72, "past a stride: counted from the catch-up index");
        assert_eq!(consumer.read_batch(10, |_| {}), 10);
        assert_eq!(consumer.len(), 62);
        while consumer.read_batch(256, |_| {}) > 0 {}
        assert_eq!(consumer.len(), 0);
    }

    #[test]
    fn a_stale_catch_up_end_never_moves_the_consumer_back() {
        assert_eq!(later_index(640, 512, 1024), 640);
        assert_eq!(later_index(512, 640, 1024), 640, "behind: keep the headers' end");
        assert_eq!(later_index(3, usize::MAX - 4, 16), 3, "across the wrap of the index");
        assert_eq!(later_index(usize::MAX - 4, 3, 16), 3);
    }

    #[test]
    fn consumer_drains_then_sees_disconnect() {
        let (mut producer, mut consumer) = spsc::<u32>(&config(8, 8)).unwrap();
        producer.push_batch(&[1, 2, 3]).unwrap();
        drop(producer);
        assert!(!consumer.is_disconnected());
        assert_eq!(consumer.wait_read_batch(1, |v| assert_eq!(*v, 1)), Ok(1));
        assert_eq!(consumer.wait_read_batch(8, |_| {}), Ok(2));
        assert_eq!(consumer.wait_read_batch(8, |_| {}), Err(Disconnected));
    }

    #[test]
    fn producer_learns_the_consumer_is_gone_instead_of_blocking() {
        let kind = crate::ConnectorKind::LockFree;
        let (mut producer, consumer) = crate::connector::<u32>(kind, &config(2, 2)).unwrap();
        producer.push_batch(&[1, 2]).unwrap();
        drop(consumer);
        assert_eq!(producer.push(3), Err(Disconnected));
        assert_eq!(producer.try_push(3), Err(TryPushError::Disconnected(3)));
    }

    #[test]
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(miri)))]
    fn prefetch_is_used_exactly_where_the_kernel_reports_the_instruction() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let flags = cpuinfo.lines().find(|line| line.starts_with("flags")).unwrap();
        let reported = flags.split_whitespace().any(|flag| flag == "3dnowprefetch");
        assert_eq!(cpu_has_prefetchw(), reported, "{flags}");
        let (producer, _consumer) = spsc::<u64>(&config(8, 8)).unwrap();
        assert_eq!(producer.prefetch, reported);
    }

    #[test]
    fn only_slots_that_begin_a_cache_line_are_prefetched_by_an_idle_consumer() {
        let (_producer, consumer) = spsc::<u64>(&config(64, 8)).unwrap();
        let starts: Vec<usize> =
            (0..64).filter(|&index| begins_cache_line(consumer.ring.slot(index))).collect();
        assert_eq!(starts, [0, 8, 16, 24, 32, 40, 48, 56], "8-byte slots from an aligned first");
        #[derive(Clone, Copy, Default)]
        #[repr(align(64))]
        struct Line {
            _bytes: [u64; 8],
        }
        let (_producer, consumer) = spsc::<Line>(&config(8, 8)).unwrap();
        assert!((0..8).all(|index| begins_cache_line(consumer.ring.slot(index))));
    }

    #[test]
    fn idle_polls_count_up_to_the_prefetch_threshold_and_reset_on_new_data() {
        let (mut producer, mut consumer) = spsc::<u64>(&config(8, 8)).unwrap();
        for _ in 0..IDLE_POLLS_BEFORE_PREFETCH + 3 {
            assert_eq!(consumer.read_batch(8, |_| {}), 0);
        }
        assert_eq!(consumer.idle_polls, IDLE_POLLS_BEFORE_PREFETCH);
        producer.push_batch(&[7]).unwrap();
        assert_eq!(consumer.read_batch(8, |v| assert_eq!(*v, 7)), 1);
        assert_eq!(consumer.idle_polls, 0);
    }

    /// Odd-sized messages (lines hold a fractional number of them) in batches that straddle
    /// the wrap: the prefetch after each publish covers the slots up to the ring's end only,
    /// and every message still arrives intact and in order.
    #[test]
    fn batches_straddling_the_wrap_arrive_intact() {
        let (mut producer, mut consumer) = spsc::<[u8; 3]>(&config(16, 16)).unwrap();
        let (mut next, mut expected) = (0u8, 0u8);
        for batch in [5, 7, 16, 3, 11, 13, 1, 16, 9].repeat(8) {
            let items: Vec<[u8; 3]> = (0..batch).map(|i| [next.wrapping_add(i); 3]).collect();
            producer.push_batch(&items).unwrap();
            next = next.wrapping_add(batch);
            while consumer.read_batch(usize::MAX, |item| {
                assert_eq!(*item, [expected; 3]);
                expected = expected.wrapping_add(1);
            }) > 0
            {}
        }
        assert_eq!(expected, next);
    }

    #[test]
    #[cfg_attr(miri, ignore = "a million messages take hours under miri's interpreter")]
    fn threads_transfer_a_million_in_order_with_every_strategy() {
        let strategies = [
            WaitStrategy::BusySpin,
            WaitStrategy::SpinYield { spins: 64 },
            WaitStrategy::Park,
            WaitStrategy::default(),
        ];
        for wait in strategies {
            let ring = RingConfig { capacity_slots: 64, batch_slots_max: 16, wait };
            let (mut producer, mut consumer) = spsc::<u64>(&ring).unwrap();
            const COUNT: u64 = 1_000_000;
            let writer = std::thread::spawn(move || {
                let mut next = 0;
                while next < COUNT {
                    let n = ((COUNT - next) as usize).min(7);
                    let chunk: Vec<u64> = (next..next + n as u64).collect();
                    producer.push_batch(&chunk).unwrap();
                    next += n as u64;
                }
            });
            let mut expected = 0;
            while let Ok(_n) = consumer.wait_read_batch(16, |v| {
                assert_eq!(*v, expected);
                expected += 1;
            }) {}
            writer.join().unwrap();
            assert_eq!(expected, COUNT, "{wait:?}");
        }
    }
}
