//! [`Sender`] and [`Receiver`]: one interface over the lock-free ring and the blocking
//! baseline, so every experiment can swap the connector kind with a flag. Dispatch is an enum
//! match, which the branch predictor resolves for free on a connector that never changes kind.
//!
//! ```
//! use pipeline::{ConnectorKind, RingConfig, connector};
//!
//! for kind in [ConnectorKind::LockFree, ConnectorKind::Blocking] {
//!     let config = RingConfig { capacity_slots: 4, batch_slots_max: 4, ..RingConfig::default() };
//!     let (mut tx, mut rx) = connector::<u64>(kind, &config)?;
//!     tx.push_batch(&[1, 2, 3])?;
//!     let mut sum = 0;
//!     rx.read_batch(8, |value| sum += value);
//!     assert_eq!(sum, 6);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::blocking;
use crate::ring::{self, BatchError, Disconnected, RingConfig, RingError, TryPushError};
use crate::sync::Arc;
use crate::wait::Parker;

/// Which implementation backs a connector; in configuration files `lock-free` (alias `ring`)
/// or `blocking` (alias `locked`), as [`std::str::FromStr`] spells them.
///
/// ```
/// use pipeline::ConnectorKind;
///
/// assert_eq!("ring".parse(), Ok(ConnectorKind::LockFree));
/// assert_eq!("locked".parse(), Ok(ConnectorKind::Blocking));
/// assert!("mpmc".parse::<ConnectorKind>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConnectorKind {
    /// The lock-free SPSC ring ([`crate::ring`]).
    #[default]
    #[serde(alias = "ring")]
    LockFree,
    /// The mutex + condition-variable baseline (the private `blocking` module).
    #[serde(alias = "locked")]
    Blocking,
}

impl std::str::FromStr for ConnectorKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "lock-free" | "ring" => Ok(ConnectorKind::LockFree),
            "blocking" | "locked" => Ok(ConnectorKind::Blocking),
            other => Err(format!("unknown connector `{other}` (expected lock-free or blocking)")),
        }
    }
}

/// The writing end of a connector; exactly one per connector (single writer).
///
/// Opaque: which implementation backs it is the [`ConnectorKind`] it was built with, and
/// callers never name the implementation's types.
pub struct Sender<T>(SenderSide<T>);

/// The reading end of a connector; exactly one per connector. Opaque like [`Sender`].
pub struct Receiver<T>(ReceiverSide<T>);

enum SenderSide<T> {
    LockFree(ring::Producer<T>),
    Blocking(blocking::Producer<T>),
}

enum ReceiverSide<T> {
    LockFree(ring::Consumer<T>),
    Blocking(blocking::Consumer<T>),
}

/// Builds a connector of `kind`, each side with its own parker. Sizes are checked here, so a
/// bad [`RingConfig`] fails at build time, not on the first message.
///
/// ```
/// use pipeline::{ConnectorKind, RingConfig, RingError, connector};
///
/// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::LockFree, &RingConfig::default())?;
/// tx.push(7)?;
/// assert_eq!(rx.pop(), Ok(7));
///
/// let odd = RingConfig { capacity_slots: 3, ..RingConfig::default() };
/// let refused = connector::<u32>(ConnectorKind::Blocking, &odd).err();
/// assert_eq!(refused, Some(RingError::CapacityNotPowerOfTwo { got: 3 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn connector<T: Copy + Default + Send>(
    kind: ConnectorKind,
    config: &RingConfig,
) -> Result<(Sender<T>, Receiver<T>), RingError> {
    connector_with(kind, config, Parker::new(), Parker::new())
}

/// Builds a connector whose sides wake the given parkers: give every ring of a fan-in the
/// consumer's parker (and every ring of a fan-out the producer's) so one thread can wait on all.
///
/// ```
/// use pipeline::{ConnectorKind, Parker, RingConfig, connector_with};
///
/// // Fan-in: two producers, one consumer thread that sleeps on one parker for both rings.
/// let consumer_parker = Parker::new();
/// let config = RingConfig::default();
/// let kind = ConnectorKind::LockFree;
/// let (mut a_tx, mut a_rx) =
///     connector_with::<u8>(kind, &config, Parker::new(), consumer_parker.clone())?;
/// let (mut b_tx, mut b_rx) = connector_with::<u8>(kind, &config, Parker::new(), consumer_parker)?;
/// a_tx.push(b'a')?;
/// b_tx.push(b'b')?;
/// assert_eq!((a_rx.try_pop(), b_rx.try_pop()), (Some(b'a'), Some(b'b')));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn connector_with<T: Copy + Default + Send>(
    kind: ConnectorKind,
    config: &RingConfig,
    producer_parker: Arc<Parker>,
    consumer_parker: Arc<Parker>,
) -> Result<(Sender<T>, Receiver<T>), RingError> {
    Ok(match kind {
        ConnectorKind::LockFree => {
            let (tx, rx) = ring::spsc_with(config, producer_parker, consumer_parker)?;
            (Sender(SenderSide::LockFree(tx)), Receiver(ReceiverSide::LockFree(rx)))
        }
        ConnectorKind::Blocking => {
            let (tx, rx) = blocking::bounded(config, producer_parker, consumer_parker)?;
            (Sender(SenderSide::Blocking(tx)), Receiver(ReceiverSide::Blocking(rx)))
        }
    })
}

/// Forwards a method to whichever implementation backs the connector.
macro_rules! dispatch {
    ($side_of:expr, $kind:ident, $side:ident => $call:expr) => {
        match $side_of {
            $kind::LockFree($side) => $call,
            $kind::Blocking($side) => $call,
        }
    };
}

impl<T: Copy> Sender<T> {
    /// Pushes one message if there is room; hands it back otherwise, so nothing is lost.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, RingConfig, TryPushError, connector};
    ///
    /// let config = RingConfig { capacity_slots: 1, batch_slots_max: 1, ..RingConfig::default() };
    /// let (mut tx, rx) = connector::<u32>(ConnectorKind::LockFree, &config)?;
    /// assert_eq!(tx.try_push(10), Ok(()));
    /// assert_eq!(tx.try_push(20), Err(TryPushError::Full(20)));
    /// drop(rx);
    /// assert_eq!(tx.try_push(30), Err(TryPushError::Disconnected(30)));
    /// # Ok::<(), pipeline::RingError>(())
    /// ```
    #[inline]
    pub fn try_push(&mut self, item: T) -> Result<(), TryPushError<T>> {
        match self.try_write_batch(1, |_, slot| *slot = item) {
            Ok(()) => Ok(()),
            Err(BatchError::Disconnected) => Err(TryPushError::Disconnected(item)),
            Err(BatchError::Full | BatchError::TooLarge { .. }) => Err(TryPushError::Full(item)),
        }
    }

    /// Pushes one message, waiting (per the wait strategy) while the connector is full;
    /// `Err` once the receiver is gone, since nobody would ever read it.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, Disconnected, RingConfig, connector};
    ///
    /// let (mut tx, rx) = connector::<u32>(ConnectorKind::Blocking, &RingConfig::default())?;
    /// assert_eq!(tx.push(1), Ok(()));
    /// drop(rx);
    /// assert_eq!(tx.push(2), Err(Disconnected));
    /// # Ok::<(), pipeline::RingError>(())
    /// ```
    #[inline]
    pub fn push(&mut self, item: T) -> Result<(), Disconnected> {
        self.push_batch(std::slice::from_ref(&item))
    }

    /// Pushes all `items`, publishing once per chunk of up to `batch_slots_max`: one
    /// publication (and at most one wake-up) per chunk instead of per message.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, Disconnected, RingConfig, connector};
    ///
    /// let config = RingConfig { capacity_slots: 8, batch_slots_max: 2, ..RingConfig::default() };
    /// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::LockFree, &config)?;
    /// tx.push_batch(&[1, 2, 3, 4, 5])?;
    /// assert_eq!(rx.len(), 5);
    /// drop(rx);
    /// assert_eq!(tx.push_batch(&[6]), Err(Disconnected));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn push_batch(&mut self, items: &[T]) -> Result<(), Disconnected> {
        dispatch!(&mut self.0, SenderSide, side => side.push_batch(items))
    }

    /// Builds `n` messages in place with `fill(i, slot)` and publishes them at once; all or
    /// nothing, so on `Err` no slot was published and `fill` was not called.
    ///
    /// ```
    /// use pipeline::{BatchError, ConnectorKind, RingConfig, connector};
    ///
    /// let config = RingConfig { capacity_slots: 4, batch_slots_max: 2, ..RingConfig::default() };
    /// let (mut tx, mut rx) = connector::<usize>(ConnectorKind::LockFree, &config)?;
    /// tx.try_write_batch(2, |i, slot| *slot = 10 * i)?;
    /// let too_large = BatchError::TooLarge { requested: 3, max: 2 };
    /// assert_eq!(tx.try_write_batch(3, |_, _| ()), Err(too_large));
    /// tx.try_write_batch(2, |i, slot| *slot = 20 + i)?;
    /// assert_eq!(tx.try_write_batch(1, |_, _| ()), Err(BatchError::Full));
    /// let mut read = Vec::new();
    /// rx.read_batch(4, |value| read.push(*value));
    /// assert_eq!(read, [0, 10]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_write_batch(
        &mut self,
        n: usize,
        fill: impl FnMut(usize, &mut T),
    ) -> Result<(), BatchError> {
        dispatch!(&mut self.0, SenderSide, side => side.try_write_batch(n, fill))
    }
}

impl<T: Copy> Receiver<T> {
    /// Pops one message if any is available; never waits.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, RingConfig, connector};
    ///
    /// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::LockFree, &RingConfig::default())?;
    /// assert_eq!(rx.try_pop(), None);
    /// tx.push(5)?;
    /// assert_eq!(rx.try_pop(), Some(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        let mut item = None;
        self.read_batch(1, |value| item = Some(*value));
        item
    }

    /// Pops one message, waiting; `Err` once the sender is gone and the connector drained
    /// (messages sent before the sender dropped are still delivered).
    ///
    /// ```
    /// use pipeline::{ConnectorKind, Disconnected, RingConfig, connector};
    ///
    /// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::Blocking, &RingConfig::default())?;
    /// let producer = std::thread::spawn(move || tx.push(9));
    /// assert_eq!(rx.pop(), Ok(9));
    /// producer.join().unwrap()?;
    /// assert_eq!(rx.pop(), Err(Disconnected));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn pop(&mut self) -> Result<T, Disconnected> {
        let mut item = None;
        self.wait_read_batch(1, |value| item = Some(*value))?;
        Ok(item.expect("wait_read_batch reads at least one message on Ok"))
    }

    /// Reads up to `max` available messages (at most `batch_slots_max`) with one release and
    /// returns how many it read; never waits, so 0 means empty now.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, RingConfig, connector};
    ///
    /// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::LockFree, &RingConfig::default())?;
    /// assert_eq!(rx.read_batch(8, |_| ()), 0);
    /// tx.push_batch(&[1, 2, 3])?;
    /// let mut read = Vec::new();
    /// assert_eq!(rx.read_batch(2, |value| read.push(*value)), 2);
    /// assert_eq!(read, [1, 2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn read_batch(&mut self, max: usize, f: impl FnMut(&T)) -> usize {
        dispatch!(&mut self.0, ReceiverSide, side => side.read_batch(max, f))
    }

    /// Reads up to `max` messages, waiting for at least one; `Err` once the sender is gone
    /// and everything it sent has been read.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, Disconnected, RingConfig, connector};
    ///
    /// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::LockFree, &RingConfig::default())?;
    /// tx.push_batch(&[4, 5])?;
    /// drop(tx);
    /// let mut sum = 0;
    /// assert_eq!(rx.wait_read_batch(8, |value| sum += value), Ok(2));
    /// assert_eq!(sum, 9);
    /// assert_eq!(rx.wait_read_batch(8, |_| ()), Err(Disconnected));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn wait_read_batch(
        &mut self,
        max: usize,
        f: impl FnMut(&T),
    ) -> Result<usize, Disconnected> {
        dispatch!(&mut self.0, ReceiverSide, side => side.wait_read_batch(max, f))
    }

    /// Approximate queue depth, for metrics: exact when the sender is idle, a sample of a
    /// moving value otherwise.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, RingConfig, connector};
    ///
    /// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::Blocking, &RingConfig::default())?;
    /// assert_eq!(rx.len(), 0);
    /// tx.push_batch(&[1, 2])?;
    /// assert_eq!(rx.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn len(&self) -> usize {
        dispatch!(&self.0, ReceiverSide, side => side.len())
    }

    /// Whether no message is readable now: the check a waiting stage polls, so it is the
    /// side's own cheap test (one load when idle), not a depth count (which reads lines the
    /// producer writes and follows headers).
    ///
    /// ```
    /// use pipeline::{ConnectorKind, RingConfig, connector};
    ///
    /// let (mut tx, rx) = connector::<u32>(ConnectorKind::LockFree, &RingConfig::default())?;
    /// assert!(rx.is_empty());
    /// tx.push(1)?;
    /// assert!(!rx.is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn is_empty(&self) -> bool {
        dispatch!(&self.0, ReceiverSide, side => side.is_empty())
    }

    /// True once the sender is gone and every message has been read: the signal for a stage
    /// to finish, as opposed to [`Receiver::is_empty`], which a slow sender also causes.
    ///
    /// ```
    /// use pipeline::{ConnectorKind, RingConfig, connector};
    ///
    /// let (mut tx, mut rx) = connector::<u32>(ConnectorKind::LockFree, &RingConfig::default())?;
    /// tx.push(1)?;
    /// drop(tx);
    /// assert!(!rx.is_disconnected(), "one message is still unread");
    /// assert_eq!(rx.try_pop(), Some(1));
    /// assert!(rx.is_disconnected());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_disconnected(&mut self) -> bool {
        dispatch!(&mut self.0, ReceiverSide, side => side.is_disconnected())
    }
}
