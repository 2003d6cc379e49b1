//! The pipeline runtime: stages on dedicated cores connected by bounded single-writer rings.
//!
//! Bottom-up:
//! - [`ring`]: the lock-free SPSC ring (pre-allocated slots, batch publish, cached indices);
//! - `blocking` (private): the lock-and-condvar baseline behind the same interface;
//! - [`connector`](mod@connector): [`Sender`]/[`Receiver`] over either kind, so experiments
//!   can swap them;
//! - [`wait`]: wait strategies (spin, spin-yield, park, adaptive) and the wake-up protocol;
//! - [`placement`]: CPU topology from /sys, pinning, and a plan that gives critical stages
//!   dedicated cores of one socket (and downgrades spinning when oversubscribed);
//! - [`interrupts`]: which CPUs service device interrupts, so critical threads avoid them;
//! - [`metrics`]: per-worker recorders (counts, busy/idle time, HDR histograms of service,
//!   per-hop and end-to-end latency, queue depth) merged off the hot path into snapshots;
//! - [`stage`]: the builder and runtime: stages with k workers, 1→1 / fan-out (round-robin or
//!   by key) / fan-in connections, fused stages (several on one thread, run to completion per
//!   batch, no ring between them), clean drain-and-join shutdown, panics reported by stage;
//! - [`active`]: the active-worker count that makes a stage resizable while it runs.
//!
//! Under `--cfg loom` only the concurrency core (ring, blocking, connector, wait, active) is
//! compiled, because that is what `tests/loom.rs` model-checks.
//!
//! The crate's README (a working example, the design choices, the measured numbers) is
//! compiled as doctests too, so its examples cannot rot.

#![deny(missing_docs)]

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod active;
pub(crate) mod blocking;
pub mod connector;
#[cfg(not(loom))]
pub mod interrupts;
#[cfg(not(loom))]
pub mod metrics;
#[cfg(not(loom))]
pub mod placement;
pub mod quota;
pub mod ring;
pub mod spill;
#[cfg(not(loom))]
pub mod stage;
mod sync;
pub mod wait;

pub use connector::{ConnectorKind, Receiver, Sender, connector, connector_with};
pub use ring::{BatchError, Disconnected, RingConfig, RingError, TryPushError};
pub use wait::{Parker, WaitStrategy, Waiter};
