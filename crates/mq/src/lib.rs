//! Message-queuing middleware: clients talk a length-prefixed binary protocol over TCP to one or
//! more middleware nodes, which keep messages in a database (embedded SQLite, or PostgreSQL
//! shared by several nodes).
//!
//! - [`protocol`]: the versioned wire format (docs/MQ_PROTOCOL.md); every request and reply
//!   carries a request id, every refusal a reason code. The decoder bounds-checks every field
//!   and is property-tested against random bytes.
//! - [`store`]: the [`store::Store`] trait (a batch of requests in one transaction) with SQLite
//!   and PostgreSQL implementations. PostgreSQL runs the operations as SQL functions and takes
//!   messages `FOR UPDATE SKIP LOCKED`, so several nodes never hand one message to two poppers.
//! - [`server`]: a node. Bounded handler slots, a bounded wait queue answered with `Busy` past
//!   its bound, database workers that group-commit whatever requests accumulated while they were
//!   busy, replying only after the commit. Connections may pipeline requests (replies in
//!   request order), which is what lets few connections fill large batches.
//! - `auth`: clients register a name with a secret, stored as a
//!   salted Argon2id hash; queues have an owner, who alone may delete or purge them.
//! - [`frame`] and the `connection` module: bounded frame buffers, write and idle timeouts, the
//!   connection limit; the `reply_memory` module: the node-wide bound on replies owed but not
//!   yet written (reserved before the database sees a request, so a pop is never committed and
//!   then dropped); [`tls`]: optional TLS on the listener and in the client.
//! - `metrics`: what `mq serve --metrics-listen` shows (counters, gauges, latency histograms);
//!   [`server::RunningNode::stop`] drains a node on SIGTERM (docs/OPERATIONS.md).
//! - [`client`]: the client library (one call at a time, or pipelined `submit` / `receive`).
//! - [`util`]: the clock the store's operations and replies are stamped with.
//!
//! The closed-loop load generator, the same-run comparisons against plain SQL and pgmq and the
//! standard experiments run this library from outside it (`experiments::mq_load`, `experiments::mq_bench`,
//! `experiments::mq_experiment`).
//!
//! Delivery: `pop` is at-most-once (the row is deleted in the committed transaction before the
//! reply; a crash between commit and reply loses that message to the reader). `lease` + `ack` is
//! at-least-once: a leased message becomes visible again when its lease expires unackowledged.

mod address;
mod auth;
pub mod client;
mod config;
mod connection;
mod error;
pub mod frame;
mod metrics;
mod node;
pub mod protocol;
mod replies;
mod reply_memory;
pub mod server;
pub mod share;
mod spare;
pub mod store;
pub mod tls;
pub mod util;

pub use error::{MqError, Result};
