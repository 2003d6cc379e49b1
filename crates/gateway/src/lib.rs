//! Order entry over the network: the gateway in front of the exchange tier.
//!
//! Two protocols reach the same tier. [`native`] is a compact binary protocol (fixed-size
//! frames, SoupBinTCP-style sessions with sequenced, replayable server messages; see
//! docs/PROTOCOL.md). [`fix`] and [`fix_session`] are a FIX 4.4 acceptor: a tag=value codec that
//! validates BodyLength and CheckSum and indexes fields without allocating, and the session layer
//! (logon, heartbeats, test requests, resend with gap fill, sequence numbers and sent messages
//! persisted per session).
//!
//! Every session's sequenced output goes through [`store`], one append-only file with group
//! commit: a message reaches its socket only once it is on disk, so a restarted server resends
//! (FIX) and replays (native) under the numbers clients saw. [`server`] runs the sessions on the
//! exchange tier (`exchange::tier::Tier`): sessions hand orders to the tier's input, its
//! R-Senders hand reports back, and the gateway wires no stages of its own; with the tier's
//! journal, the store's syncer waits for it so that both fsyncs overlap. [`metrics`] serves
//! per-session and per-stage counters and latency summaries in the Prometheus text format.
//!
//! Decoding never panics on hostile bytes (property tests feed both decoders arbitrary input);
//! each malformed input gets the protocol's prescribed answer.

pub mod admin;
pub mod admission;
pub mod client;
pub mod credentials;
mod delivered;
mod error;
pub mod fix;
mod fix_server;
pub mod fix_session;
pub mod hub;
mod io;
pub mod metrics;
pub mod native;
mod native_server;
pub mod remote;
pub mod routed;
pub mod server;
mod session;
pub mod store;
pub mod tls;
pub mod transport;
