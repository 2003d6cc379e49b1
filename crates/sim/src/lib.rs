//! Deterministic simulation of the replicated tier (docs/SIMULATION.md).
//!
//! One thread, one seeded generator ([`rng::Rng`]) for every choice, and a queue of timed
//! events: a run is a pure function of its seed and its fault list, so a failure replays
//! exactly ([`run::Outcome::trace_hash`]). What runs is the production decision logic,
//! driven without I/O: the lease core (`replication::lease::LeaseCore`), the receivers'
//! epoch fence (`delivery::edge::EpochFence`), the gateway's routed positions
//! (`gateway::routed::RoutedPositions`), the sessions' sequence rules (`gateway::sequence`) and the tier replica that numbers each gateway's
//! reports (`replication::replay::GroupReplica`); around it the simulator models the
//! JetStream broker ([`broker`]), the NATS network and the processes ([`world`]), and checks
//! the invariants as it goes ([`check`]) against a single-process reference tier.

#![deny(missing_docs)]

pub mod broker;
pub mod check;
pub mod client;
pub mod clock;
pub mod disk;
pub mod engine;
pub mod error;
pub mod faults;
pub mod gateway;
pub mod journal;
pub mod msg;
pub mod process;
pub mod rng;
pub mod run;
pub mod session;
pub mod settings;
pub mod snapshot;
pub mod store;
pub mod world;

pub use check::{Invariant, Violation};
pub use error::SimError;
pub use faults::{Fault, FaultKind};
pub use run::{Outcome, Shrunk, parse_seeds, run, run_keeping, run_with, shrink};
pub use settings::Settings;
