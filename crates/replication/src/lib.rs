//! The exchange tier beyond one machine, on NATS JetStream: each shard's input is a
//! replicated, sequenced stream that gateways append to and engines follow, and one engine
//! per shard leads through a lease kept in a JetStream stream.
//!
//! ```text
//!  gateway ──append (msg id = gateway-run-seq)──▶ stream {PREFIX}_ORDERS_{shard} (R3, Raft)
//!                                                        │ in stream order
//!                              ┌─────────────────────────┴──────────────────┐
//!                        engine (lease holder)                        engine (standby)
//!                        tier → publishes reports                     tier → publishes nothing
//! ```
//!
//! * [`layout`]: stream names, subjects, bounds and the instrument → shard rule.
//! * [`append`]: the gateway's append, deduplicated by message id, acknowledged by a quorum.
//! * [`follow`]: an engine's in-order read of its shard's stream; a hole is an error.
//! * [`engine`]: one engine of a shard's group: the tier on the log, publishing while it leads.
//! * [`fingerprint`]: what engines of one group must share, checked at the lease and snapshots.
//! * [`lease`]: the leader lease (acquire, renew, validity that ends before anyone else's).
//! * [`record`]: one order as a fixed-size, versioned log record.
//! * [`snapshot`]: engine snapshots in the object store, and the log trimmed below them.
//! * [`replay`]: the group's outputs recomputed from a snapshot and the log (snapshots, and
//!   reports that have left the leader's retained window).
//! * [`check`]: a live group's published records compared with a replay of its log.
//!
//! docs/REPLICATION.md says what is replicated and what a failover costs.
#![deny(missing_docs)]

// The README's example compiles and runs as a doctest, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod append;
pub mod check;
pub mod engine;
pub mod error;
pub mod fingerprint;
pub mod follow;
pub mod layout;
pub mod lease;
pub mod record;
pub mod replay;
pub mod snapshot;

pub use error::ReplicationError;
