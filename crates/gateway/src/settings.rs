//! The gateway's session limits and where it keeps its state (`exchange serve --config`):
//! what every session reads and only the server's start fills in.

use std::path::PathBuf;
use std::time::Duration;

use crate::store;

/// Session limits (`exchange serve --config`).
#[derive(Clone, Debug)]
pub struct Settings {
    /// Order messages per second a session may send; beyond, each is rejected as throttled.
    pub throttle_msgs_per_s: u32,
    /// Cancel a client's open orders when its session has been gone this long; `None`: never.
    pub cancel_on_disconnect: Option<Duration>,
    /// Bytes queued for one connection; a session that falls further behind is cut off.
    pub outbox_bytes_max: usize,
    /// Sequenced native messages kept per client for replay (32 bytes each, allocated at
    /// start for every client in the credentials file).
    pub replay_events_max: usize,
    /// Open orders tracked per client (for cancel-on-disconnect; FIX clients also map their
    /// ClOrdIDs, about 200 bytes per order); beyond, new orders are refused as busy.
    pub open_orders_max: usize,
    /// Heartbeat interval of native sessions; a link silent for [`DEAD_LINK_INTERVALS`] of them
    /// is dead.
    pub heartbeat: Duration,
    /// Time a connection has to log on.
    pub logon_timeout: Duration,
    /// Where the gateway's store keeps FIX sessions' sequence numbers and sent
    /// messages and native sessions' sequenced events.
    pub store_dir: PathBuf,
    /// `fdatasync` each store batch before its messages are sent (group commit); off, a batch
    /// is written (it survives a killed process, not a power failure) and sent at once.
    pub store_sync: bool,
    /// Bytes past which the store is compacted to what recovery needs
    /// (`store::StoreOptions::bytes_max`).
    pub store_bytes_max: u64,
    /// Sent messages per FIX session that compaction keeps for resends
    /// (`store::StoreOptions::fix_resend_window`).
    pub fix_resend_window: usize,
    /// The acceptor's SenderCompID.
    pub fix_comp_id: String,
    /// The bearer token the metrics listener's admin endpoints require; `None`: they are off.
    pub admin_token: Option<String>,
    /// The bearer token `/metrics` requires; `None`: open, and then the listener may only
    /// bind a loopback address ([`crate::server::start`]).
    pub metrics_token: Option<String>,
    /// Series per client id on `/metrics` (`client="N"` labels); off, only their sums: the
    /// page then neither lists who trades nor grows with the credentials file.
    pub metrics_per_client: bool,
    /// Symbols and the price scale FIX's Symbol (55) and decimal prices convert with, from the
    /// files the tier's master data came from; empty: the reference universe's (filled in by
    /// [`crate::server::start`]).
    pub instruments: std::sync::Arc<exchange::instruments::InstrumentTable>,
    /// TLS on the native and FIX listeners; `None`: plain TCP ([`ListenerTls`](crate::ListenerTls)).
    pub tls: Option<crate::tls::ListenerTls>,
    /// The I/O loop polls its sockets without ever sleeping (an idle turn asks the kernel for
    /// ready sockets without waiting, and turns again): no wake-up between a client's bytes and
    /// the loop, at the cost of a CPU kept busy. Refused at start unless the layout leaves that
    /// CPU free ([`crate::ServeError::BusyPollCpus`]). Off by default.
    pub busy_poll: bool,
}

/// Missed heartbeat intervals after which a link is declared dead.
pub const DEAD_LINK_INTERVALS: u32 = 3;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            throttle_msgs_per_s: 100_000,
            cancel_on_disconnect: Some(Duration::from_secs(5)),
            outbox_bytes_max: 1 << 20,
            replay_events_max: 1 << 14,
            open_orders_max: 1 << 12,
            heartbeat: Duration::from_secs(1),
            logon_timeout: Duration::from_secs(5),
            store_dir: PathBuf::from("gateway-store"),
            store_sync: true,
            store_bytes_max: store::STORE_BYTES_MAX_DEFAULT,
            fix_resend_window: store::FIX_RESEND_WINDOW_DEFAULT,
            fix_comp_id: "LEANTIER".into(),
            admin_token: None,
            metrics_token: None,
            metrics_per_client: false,
            instruments: std::sync::Arc::default(),
            tls: None,
            busy_poll: false,
        }
    }
}
