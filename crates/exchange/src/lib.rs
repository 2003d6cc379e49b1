//! The reference lean business tier of an exchange: pre-process, matching core, master data,
//! external events and response processing, each its own stage on the `pipeline` runtime,
//! driven open-loop by a realistic order flow and measured from each request's intended send
//! time.
//!
//! # The critical path
//! [`msg`] defines fixed-size `Copy + Default` records for every hop, so rings pre-allocate
//! their slots. The [`preprocess`] stage does hygiene validation, enrichment and business
//! checks against an immutable, versioned [`master`] snapshot read without locks; a reject is
//! answered from there with a [`msg::Reason`] and never reaches the core. Each [`core`] shard
//! is the sequencer of its own fan-in: it numbers every input gap-free into a
//! [`msg::SequencedInput`] (the record a journal appends, see [`tier`]) and hands it to its
//! [`core::MatchingCore`]. The core is a pure function of its sequenced input: price-time
//! priority books ([`book`]) over a pre-allocated `store` (an order-slot arena with
//! intrusive FIFO lists and an open-addressing order index), with named capacity limits and
//! no allocation per order; the same input always yields byte-identical output, whose blake3
//! hash ([`msg::OutputHash`]) the replay test compares.
//!
//! # Durability
//! [`durability`] journals each shard's sequenced input with the `journal` crate, by default with
//! group commit: the core hands the record to a ring and goes on; a writer thread per shard
//! writes and fdatasyncs in batches and publishes a durable sequence; the R-Processor releases a
//! reply only once that sequence covers the input that caused it (`sync`, `relaxed` and `off` are
//! selectable). Runs report both the critical-path latency (until the response is ready, no
//! fsync wait) and the durable reply latency. Snapshots cost the core nothing: a follower thread
//! per shard applies the durable records to a replica of the shard state and every
//! `snapshot_every_records` writes it (books in price-time priority, listings, halts and bands,
//! counters, output hash; [`core`] encodes and restores it) and removes the journal segments it
//! covers. The master-data process journals every update it applies, write-ahead, with
//! snapshots of its own. With a data directory, a run recovers every shard from its newest
//! valid snapshot plus the journal after it (recovered output hash == the stopped run's) and
//! the master data likewise, and continues each sequence; `tests/crash.rs` SIGKILLs a real tier
//! process (its crash child, snapshots on) under load and checks no released reply is
//! ever lost.
//!
//! # Off the critical path
//! The master-data process is the single writer of the snapshot cell; the external events
//! process turns halts, circuit breakers and band changes into control messages in the core's
//! sequenced input (so replay reproduces them) and into master-data updates (so the
//! pre-process sees them early). The R-Processor turns core output into per-client execution
//! reports and per-topic market data and routes them by outlet to N R-Senders, each with its
//! own ring, which deliver to [`tier::Subscriber`]s (in-process outlets here).
//!
//! # Measuring
//! [`flow`] generates the order flow (moving mids, crossing share, immediate orders, cancels,
//! replaces, and invalid requests each tagged with the reason it must get); a stopped tier
//! ([`tier::TierStopped`]) reports end-to-end and per-stage latency histograms, the runtime's
//! per-stage throughput and utilization, rejects by reason and each shard's output hash. The
//! open-loop load run that drives it (`stats::open_loop`'s schedule) is the workspace's
//! `experiments::tier_load`.
//!
//! Under `--cfg loom` only [`master`] and the modules it needs are built, with loom's atomics
//! (see `sync`), because that is what `tests/loom.rs` model-checks.

// The matching core lives in its own crate (`leantier-matching`), which builds with its own
// two dependencies; the tier names it by the paths it always had.
pub use matching::{book, core, msg};

#[cfg(not(loom))]
pub mod durability;
#[cfg(not(loom))]
mod error;
pub mod events;
#[cfg(not(loom))]
pub mod flow;
#[cfg(not(loom))]
pub mod instruments;
pub mod master;
#[cfg(not(loom))]
pub mod preprocess;
mod sync;
#[cfg(not(loom))]
pub mod tier;

#[cfg(not(loom))]
pub use error::{ExchangeError, Result};
