//! Order entry over the network: the gateway in front of the exchange tier.
//!
//! # The face
//!
//! What other crates use, and all they may rely on:
//!
//! - **Serving.** [`start`] runs native and FIX sessions on an in-process tier
//!   ([`ServeOptions`] → [`Running`]: bound addresses, `stop`, `wait`); [`start_remote`] runs
//!   the same sessions without a tier, on a replicated input log ([`RemoteOptions`] →
//!   [`RunningRemote`]). Both take the session limits in [`Settings`] and TLS in
//!   [`ListenerTls`]; both fail with [`ServeError`].
//! - **Clients.** [`client::NativeClient`] (login, send, receive, script lines) and the codecs
//!   a client speaks: [`native`] (the binary protocol, docs/PROTOCOL.md) and [`fix`] (FIX 4.4
//!   tag=value: [`fix::Builder`], [`fix::Message`], [`fix::tag`]).
//! - **Credentials.** [`credentials::parse`] reads a credentials file,
//!   [`credentials::hash_secret`] makes its argon2 hashes.
//! - **For the simulator.** [`routed`]: the sans-IO positions that keep a gateway without a
//!   tier from routing a report twice or skipping one across a restart.
//! - A few bounds tests and tools check against ([`CONNECTIONS_MAX`],
//!   [`PREAUTH_PER_ADDRESS_MAX`], [`HTTP_CONNECTIONS_MAX`], [`DEAD_LINK_INTERVALS`],
//!   [`UNKEPT_SEQ_RESERVE`], [`STORE_FILE_NAME`]) and [`order_id`], the tier order id of a
//!   client's order number. The load client is `experiments::order_entry_load`, over the
//!   clients' stream ([`Transport`], [`Reader`], [`Writer`]).
//!
//! Everything else (the hub, the sessions, the store, the I/O loop, the admin endpoints) is
//! the crate's own.
//!
//! ```
//! use std::time::Duration;
//! use exchange::durability::JournalMode;
//! use exchange::flow::UniverseConfig;
//! use exchange::tier::TierConfig;
//! use gateway::client::NativeClient;
//! use gateway::credentials::{Credential, Protocol, hash_secret};
//! use gateway::native::{ClientMsg, OrderRequest, ServerMsg, event_kind};
//! use gateway::{ServeOptions, Settings};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let hash = hash_secret(b"s3cret").unwrap();
//! let credential =
//!     Credential { client: 1, protocol: Protocol::Native, comp_id: "N1".into(), hash };
//! let running = gateway::start(ServeOptions {
//!     listen: "127.0.0.1:0".parse().unwrap(),
//!     fix_listen: None,
//!     metrics_listen: None,
//!     settings: Settings { store_dir: dir.path().join("store"), ..Settings::default() },
//!     credentials: vec![credential],
//!     tier: TierConfig {
//!         // Client ids 0 and 1 in the master data.
//!         universe: UniverseConfig { instruments: 4, clients: 2 },
//!         journal: JournalMode::OFF,
//!         ..TierConfig::parked()
//!     },
//!     planned_rate_per_s: 1_000.0,
//!     journal_dir: dir.path().join("tier"),
//!     also: None,
//! })
//! .unwrap();
//!
//! let wait = Duration::from_secs(10);
//! let mut session = NativeClient::connect(running.listen).unwrap();
//! let answer = session.login(1, "s3cret", 0, wait).unwrap();
//! assert!(matches!(answer, ServerMsg::LoginAccepted { client: 1, .. }));
//! // Instrument 1 of the reference universe trades near 101 000 ticks.
//! let order =
//!     OrderRequest { client: 1, token: 1, instrument: 1, price: 101_000, qty: 5, ..Default::default() };
//! session.send(&ClientMsg::NewOrder(order)).unwrap();
//! let Some(ServerMsg::Sequenced { event, .. }) = session.recv(wait).unwrap() else { panic!() };
//! assert_eq!((event.kind, event.token, event.reason), (event_kind::ACCEPTED, 1, 0));
//! running.stop();
//! ```
//!
//! # Inside
//!
//! Two protocols reach the same tier. [`native`] is a compact binary protocol (fixed-size
//! frames, SoupBinTCP-style sessions with sequenced, replayable server messages; see
//! docs/PROTOCOL.md). [`fix`] and `fix_session` are a FIX 4.4 acceptor: a tag=value codec that
//! validates BodyLength and CheckSum and indexes fields without allocating, and the session
//! layer (logon, heartbeats, test requests, resend with gap fill, sequence numbers and sent
//! messages persisted per session).
//!
//! Every session's sequenced output goes through `store`, one append-only file with group
//! commit: a message reaches its socket only once it is on disk, so a restarted server resends
//! (FIX) and replays (native) under the numbers clients saw. `server` runs the sessions on the
//! exchange tier (`exchange::tier::Tier`): sessions hand orders to the tier's input, its
//! R-Senders hand reports back, and the gateway wires no stages of its own; with the tier's
//! journal, the store's syncer waits for it so that both fsyncs overlap. `metrics` renders
//! per-session and per-stage counters and latency summaries in the Prometheus text format.
//!
//! The modules use each other in one direction (checked: no module cycles): `link` (a
//! connection's outbox), `settings`, `record` (the store's record format) and `sequence` (the
//! sessions' sequence rules, pure decisions) at the bottom;
//! `store` and `routed` on them; `fix_session` on the store; `metrics` (counters and the page,
//! from a snapshot the hub builds); `hub` (every client's state, the router) on those; the
//! sessions (`fix_server`, `native_server`, `session`) on the hub; the I/O loop (`io`) on the
//! sessions; `server` and `remote` on the loop. Errors are in `error`.
//!
//! Decoding never panics on hostile bytes (property tests feed both decoders arbitrary input);
//! each malformed input gets the protocol's prescribed answer.

// The face: what other crates and tests use. Everything else is the crate's own.
pub mod client;
pub mod credentials;
pub mod fix;
pub mod native;
pub mod record;
pub mod routed;
pub mod sequence;

pub use admin::HTTP_CONNECTIONS_MAX;
pub use admission::{CONNECTIONS_MAX, PREAUTH_PER_ADDRESS_MAX};
pub use error::ServeError;
pub use hub::order_id;
pub use remote::{AppendTally, RemoteOptions, RunningRemote, new_run_id, start as start_remote};
pub use server::{BoundAddresses, Running, ServeOptions, start};
pub use settings::{DEAD_LINK_INTERVALS, Settings};
pub use store::{FILE_NAME as STORE_FILE_NAME, StoreError, UNKEPT_SEQ_RESERVE};
pub use tls::ListenerTls;
// The clients' plain or TLS stream, for the order-entry load client (`experiments::order_entry_load`).
pub use transport::{Reader, Transport, Writer};

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
mod remote;
mod server;
mod session;
mod settings;
mod store;
mod tls;
mod transport;
