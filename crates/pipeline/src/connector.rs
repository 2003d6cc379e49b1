//! [`Sender`] and [`Receiver`]: one interface over the lock-free ring and the blocking
//! baseline, so every experiment can swap the connector kind with a flag. Dispatch is an enum
//! match, which the branch predictor resolves for free on a connector that never changes kind.

use crate::blocking;
use crate::ring::{self, BatchError, Disconnected, RingConfig, RingError, TryPushError};
use crate::sync::Arc;
use crate::wait::Parker;

/// Which implementation backs a connector; in configuration files `lock-free` (alias `ring`)
/// or `blocking` (alias `locked`), as [`std::str::FromStr`] spells them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConnectorKind {
    /// The lock-free SPSC ring ([`crate::ring`]).
    #[default]
    #[serde(alias = "ring")]
    LockFree,
    /// The mutex + condition-variable baseline ([`crate::blocking`]).
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
pub enum Sender<T> {
    LockFree(ring::Producer<T>),
    Blocking(blocking::Producer<T>),
}

/// The reading end of a connector; exactly one per connector.
pub enum Receiver<T> {
    LockFree(ring::Consumer<T>),
    Blocking(blocking::Consumer<T>),
}

/// Builds a connector of `kind`, each side with its own parker.
pub fn connector<T: Copy + Default + Send>(
    kind: ConnectorKind,
    config: &RingConfig,
) -> Result<(Sender<T>, Receiver<T>), RingError> {
    connector_with(kind, config, Parker::new(), Parker::new())
}

/// Builds a connector whose sides wake the given parkers: give every ring of a fan-in the
/// consumer's parker (and every ring of a fan-out the producer's) so one thread can wait on all.
pub fn connector_with<T: Copy + Default + Send>(
    kind: ConnectorKind,
    config: &RingConfig,
    producer_parker: Arc<Parker>,
    consumer_parker: Arc<Parker>,
) -> Result<(Sender<T>, Receiver<T>), RingError> {
    Ok(match kind {
        ConnectorKind::LockFree => {
            let (tx, rx) = ring::spsc_with(config, producer_parker, consumer_parker)?;
            (Sender::LockFree(tx), Receiver::LockFree(rx))
        }
        ConnectorKind::Blocking => {
            let (tx, rx) = blocking::bounded(config, producer_parker, consumer_parker)?;
            (Sender::Blocking(tx), Receiver::Blocking(rx))
        }
    })
}

/// Forwards a method to whichever implementation backs the connector.
macro_rules! dispatch {
    ($self:ident, $side:ident => $call:expr) => {
        match $self {
            Self::LockFree($side) => $call,
            Self::Blocking($side) => $call,
        }
    };
}

impl<T: Copy> Sender<T> {
    /// Pushes one message if there is room; hands it back otherwise.
    #[inline]
    pub fn try_push(&mut self, item: T) -> Result<(), TryPushError<T>> {
        match self.try_write_batch(1, |_, slot| *slot = item) {
            Ok(()) => Ok(()),
            Err(BatchError::Disconnected) => Err(TryPushError::Disconnected(item)),
            Err(BatchError::Full | BatchError::TooLarge { .. }) => Err(TryPushError::Full(item)),
        }
    }

    /// Pushes one message, waiting (per the wait strategy) while the connector is full.
    #[inline]
    pub fn push(&mut self, item: T) -> Result<(), Disconnected> {
        self.push_batch(std::slice::from_ref(&item))
    }

    /// Pushes all `items`, publishing once per chunk of up to `batch_slots_max`.
    #[inline]
    pub fn push_batch(&mut self, items: &[T]) -> Result<(), Disconnected> {
        dispatch!(self, side => side.push_batch(items))
    }

    /// Builds `n` messages in place with `fill(i, slot)` and publishes them at once.
    #[inline]
    pub fn try_write_batch(
        &mut self,
        n: usize,
        fill: impl FnMut(usize, &mut T),
    ) -> Result<(), BatchError> {
        dispatch!(self, side => side.try_write_batch(n, fill))
    }
}

impl<T: Copy> Receiver<T> {
    /// Pops one message if any is available.
    #[inline]
    pub fn try_pop(&mut self) -> Option<T> {
        let mut item = None;
        self.read_batch(1, |value| item = Some(*value));
        item
    }

    /// Pops one message, waiting; `Err` once the sender is gone and the connector drained.
    #[inline]
    pub fn pop(&mut self) -> Result<T, Disconnected> {
        let mut item = None;
        self.wait_read_batch(1, |value| item = Some(*value))?;
        Ok(item.expect("wait_read_batch reads at least one message on Ok"))
    }

    /// Reads up to `max` available messages with one release; never waits.
    #[inline]
    pub fn read_batch(&mut self, max: usize, f: impl FnMut(&T)) -> usize {
        dispatch!(self, side => side.read_batch(max, f))
    }

    /// Reads up to `max` messages, waiting for at least one.
    #[inline]
    pub fn wait_read_batch(
        &mut self,
        max: usize,
        f: impl FnMut(&T),
    ) -> Result<usize, Disconnected> {
        dispatch!(self, side => side.wait_read_batch(max, f))
    }

    /// Approximate queue depth, for metrics.
    pub fn len(&self) -> usize {
        dispatch!(self, side => side.len())
    }

    /// Whether no message is readable now: the check a waiting stage polls, so it is the
    /// side's own cheap test (one load when idle), not a depth count (which reads lines the
    /// producer writes and follows headers).
    #[inline]
    pub fn is_empty(&self) -> bool {
        dispatch!(self, side => side.is_empty())
    }

    /// True once the sender is gone and every message has been read.
    pub fn is_disconnected(&mut self) -> bool {
        dispatch!(self, side => side.is_disconnected())
    }
}
