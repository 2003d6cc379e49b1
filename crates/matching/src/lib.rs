//! A deterministic price-time matching core, to embed in a tier of your own (leantier's
//! reference exchange tier, `leantier-exchange`, is one).
//!
//! - [`msg`]: fixed-size `Copy + Default` records: the typed [`msg::Command`]s a core takes in
//!   a [`msg::SequencedInput`], the [`msg::CoreOutput`] records it emits, the reasons and the
//!   output hash that replay compares;
//! - [`core`]: [`core::MatchingCore`], a pure function of its sequenced input (no clock, no
//!   I/O, no allocation after [`core::MatchingCore::new`]), so replaying the same input
//!   reproduces byte-identical output; snapshots of its whole state;
//! - [`book`]: read-only views of its books (a price ladder per side, FIFO queues per level);
//!   their invariants (level quantities, best levels) are kept behind methods, and only the
//!   core changes them;
//! - [`wire`]: the little-endian field reader and writer its snapshots use.
//!
//! The store behind the books (an order-slot arena with intrusive FIFO lists and an
//! open-addressing order index) is private: named capacity limits, no allocation per order.

#![deny(missing_docs)]

// The README's example compiles and runs as a doctest, so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod book;
pub mod core;
pub mod msg;
mod store;
pub mod wire;
