//! Response delivery across machines: the R-Senders publish on NATS subjects, and delivery edges
//! (processes, or tasks in an order-entry gateway) serve end consumers over TCP, gap-free per subject.
//!
//! ```text
//!  tier R-Sender --ring--> publisher thread --NATS {prefix}.data.{o}.{stream}---> edge of outlet o
//!                          (seq per subject,      batch per subject per drain)    (gap check)
//!                           retained window) <--NATS {prefix}.retain.{o}.{stream}---+  |
//!                                                 request/reply on a gap              v TCP
//!                                                                               end consumers
//! ```
//!
//! * [`publish`]: the R-Senders' NATS side, plugged into the tier with
//!   `exchange::tier::run_with_subscribers`. Core NATS delivers at most once, so every record
//!   carries its subject's sequence and each subject keeps a bounded retained window
//!   ([`publish::RETAIN_RECORDS_DEFAULT`]); heartbeats announce each subject's next sequence.
//! * [`edge`]: the delivery edge (the R-Gateway of paper 001): subscribes to one outlet's
//!   subjects, detects gaps, recovers
//!   them from the window, and beyond it sends an explicit resync frame; consumers get the
//!   framing of [`wire`] (docs/DELIVERY.md); a slow consumer is cut off at a named bound.
//! * The benchmark of R-Sender → NATS → edge against a plain `async-nats` pair
//!   (`experiments::delivery_bench`) and the published delivery experiment (runs 1–7,
//!   `experiments::delivery_experiment`) run this crate from outside it.
//! * [`nats`]: how every leantier NATS client connects (URL, authentication, TLS).
//! * [`server`]: a `nats-server` child for tests and experiments when none is given.
//!
//! Latency across processes uses absolute `CLOCK_MONOTONIC` time ([`clock`]).

pub mod admission;
pub mod clock;
pub mod consumer;
pub mod edge;
pub mod entropy;
mod error;
pub mod nats;
pub mod publish;
pub mod server;
pub mod subjects;
pub mod wire;

pub use error::{DeliveryError, Result, io_failed, nats_failed};
