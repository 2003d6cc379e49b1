//! The call-data-ticket pipeline: the telecom data-flow engine that the planner models and
//! tunes.
//!
//! Binary accounting records (`ticket`: a fixed 64-byte layout with a CRC-32C) come from a
//! seeded generator at a set rate (Poisson arrivals) or flat out. The Decoder parses and
//! validates them; malformed tickets are counted and written with their reason code and bytes
//! to a per-worker reject file, never dropped silently. The Converter (`convert`) turns a
//! ticket into both output formats. The converter's output is copied to two nodes: the
//! Serializer (`serialize`) appends CSV lines to one file per worker under an fsync policy,
//! and the Feeder (`feed`) inserts rows in batched transactions into SQLite (default) or
//! PostgreSQL (when a URL is given), one connection per worker.
//!
//! Every node is a stage of the `pipeline` crate's runtime (`run`), with the thread counts of
//! a planner config file; rings are bounded, so overload pushes back instead of losing tickets.
//! `measure` implements the planner's `Workload` (each node measured alone on this host), and
//! `predict` compares a run with the planner's prediction for the same configuration.
//!
//! Online mode (`online`, `cdr run --online`): every node but the generator is spawned with
//! its maximum worker count; a controller on the caller's thread measures the offered arrival
//! rate and per-node utilization every control interval, re-plans with the planner's
//! consolidation when the rate moved past a hysteresis threshold, and resizes the stages
//! through the runtime's active-worker counts, so no ticket is lost or duplicated. A rate
//! profile (`run::Arrivals::Steps`) makes the rate change during a run.
//!
//! `validate` (`cdr validate`) checks the model against flat-out runs on a shared host: for
//! each configuration it measures the nodes and runs the pipeline back to back, interleaved
//! and repeated, and reports median measured / predicted ratios. `sharing` is what the
//! isolated measurements leave out when the threads share the cores: a probe with the
//! configuration's own thread counts, right before each run, measures a usable core share and
//! the runtime's CPU per hop, and the model carries both.

pub(crate) mod convert;
mod error;
pub mod feed;
pub mod measure;
pub mod online;
pub mod predict;
pub mod run;
pub mod serialize;
pub mod sharing;
pub mod ticket;
pub mod validate;

pub use error::{CdrError, Result};
