//! The pipeline runtime: stages on dedicated cores connected by bounded single-writer rings.
//!
//! - [`ring`]: the lock-free SPSC ring (pre-allocated slots, batch publish, cached indices);
//! - [`blocking`]: the lock-and-condvar baseline behind the same interface;
//! - [`connector`]: [`Sender`]/[`Receiver`] over either kind, so experiments can swap them;
//! - [`wait`]: wait strategies (spin, spin-yield, park, adaptive) and the wake-up protocol.

pub mod blocking;
pub mod connector;
pub mod metrics;
pub mod placement;
pub mod ring;
pub mod stage;
mod sync;
pub mod wait;

pub use connector::{ConnectorKind, Receiver, Sender, connector, connector_with};
pub use ring::{BatchError, Disconnected, RingConfig, RingError, TryPushError};
pub use wait::{Parker, WaitStrategy, Waiter};
