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

// The face: what other crates and tests use. Everything else is the crate's own.
pub mod client;
pub mod credentials;
pub mod fix;
pub mod load;
pub mod native;
pub mod routed;

pub use admin::HTTP_CONNECTIONS_MAX;
pub use admission::{CONNECTIONS_MAX, PREAUTH_PER_ADDRESS_MAX};
pub use error::ServeError;
pub use hub::order_id;
pub use remote::{AppendTally, RemoteOptions, RunningRemote, start as start_remote};
pub use server::{BoundAddresses, Running, ServeOptions, start};
pub use settings::{DEAD_LINK_INTERVALS, Settings};
pub use store::{FILE_NAME as STORE_FILE_NAME, StoreError, UNKEPT_SEQ_RESERVE};
pub use tls::ListenerTls;

mod admin;
mod admission;
mod delivered;
mod error;
mod fix_server;
mod fix_session;
mod hub;
mod io;
mod link;
mod metrics;
mod native_server;
mod record;
mod remote;
mod server;
mod session;
mod settings;
mod store;
mod tls;
mod transport;
