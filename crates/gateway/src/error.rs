//! The gateway's errors: why a server did not start ([`ServeError`]) and why a client could not
//! go on ([`ClientError`]), in a module of their own so the modules that raise them (the
//! I/O loop, the transports) need not reach into the server or the client.

use std::net::SocketAddr;
use std::time::Duration;

use crate::native;
use ops::Timeout;

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(
        "metrics listener on {addr}: not a loopback address and no metrics_token set; /metrics \
         would show the server's counters to anyone who can reach it (set metrics_token in the \
         serve config, or listen on 127.0.0.1 or ::1)"
    )]
    MetricsExposed { addr: SocketAddr },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("the tier failed")]
    Tier(#[from] exchange::ExchangeError),
    #[error("starting the credential verifiers")]
    Verifier(#[from] crate::credentials::CredentialsError),
    #[error("the tier stopped before serving")]
    TierStopped,
    #[error("replicated input log: {0}")]
    Log(#[from] replication::ReplicationError),
    #[error("the metrics and admin listener")]
    Metrics(#[source] ops::OpsError),
    #[error("gateway without a tier: {0}")]
    Remote(String),
    /// `busy_poll` asked for on a host whose usable CPUs cannot give the polling thread one of
    /// its own: it would spin on a CPU the tier's other threads (or the OS) need.
    #[error(
        "busy_poll needs {needed_cpus} usable CPUs with this layout ({layout}: a CPU for each \
         spinning thread, the polling loop's among them, and one for everything else); this host \
         gives {usable_cpus}: run without --busy-poll, or on more CPUs"
    )]
    BusyPollCpus { needed_cpus: usize, usable_cpus: usize, layout: String },
}

/// Why the client could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    /// The TLS handshake failed (an untrusted certificate, a name it is not for, a client
    /// certificate the server refused) or its settings are unusable.
    #[error("{0}")]
    Tls(String),
    #[error("the server sent a bad frame: {0}")]
    Decode(#[from] native::DecodeError),
    #[error("the server closed the connection")]
    Closed,
    #[error("secret is longer than {} bytes", native::SECRET_BYTES)]
    SecretTooLong,
    /// One of the client's timeouts passed: which one, after how long, and what it waited for.
    #[error("the {} timeout ({after:?}) passed: {waited_for}", timeout.name())]
    TimedOut { timeout: Timeout, after: Duration, waited_for: String },
}
