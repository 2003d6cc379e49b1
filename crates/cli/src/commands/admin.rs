//! The admin endpoint's flags and the stop's last words, shared by every server command:
//! `--metrics-listen` (and its token) where the server's own protocol is not HTTP, and the
//! one summary line each server logs when it stops (docs/OPERATIONS.md).

use std::io::Write;
use std::net::SocketAddr;

use ops::endpoint::{Endpoint, Listening, check_exposure};
use ops::{Readiness, Registry};

use crate::outcome::BadInput;

/// `--metrics-listen` and `--metrics-token`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct MetricsFlags {
    /// Serve `/metrics` (Prometheus text: counters, gauges, latency histograms with buckets,
    /// `process_*`), `/health` and `/ready` on this address (a bare port: 127.0.0.1:PORT),
    /// from a thread of its own. An address other than loopback needs --metrics-token.
    #[arg(long, value_parser = metrics_address)]
    pub metrics_listen: Option<SocketAddr>,
    /// The bearer token `/metrics` requires (`/health` and `/ready` stay open).
    #[arg(long, env = "LEANTIER_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
}

impl MetricsFlags {
    /// Starts the admin endpoint over `registry` when `--metrics-listen` is given, and prints
    /// where it listens. Keep the handle: dropping it stops the listener.
    pub fn serve(
        &self,
        registry: Registry,
        readiness: &Readiness,
    ) -> anyhow::Result<Option<Listening>> {
        serve_admin((self.metrics_listen, self.metrics_token.clone()), registry, readiness)
    }
}

/// Starts the admin endpoint over `registry` on `listen` (with `token` for `/metrics`) when
/// given, and prints where it listens. Keep the handle: dropping it stops the listener.
pub fn serve_admin(
    (listen, token): (Option<SocketAddr>, Option<String>),
    registry: Registry,
    readiness: &Readiness,
) -> anyhow::Result<Option<Listening>> {
    let Some(listen) = listen else { return Ok(None) };
    check_exposure(listen, token.is_some()).map_err(BadInput)?;
    let endpoint = Endpoint::new(registry, readiness.clone()).with_metrics_token(token);
    let listening = endpoint.serve(listen)?;
    // Not `println!`: a supervisor that read only the listen line may have closed the pipe.
    let _ = writeln!(std::io::stdout(), "metrics on http://{}/metrics", listening.addr);
    Ok(Some(listening))
}

/// `--metrics-listen`: an address, or a bare port on loopback (the default place for an
/// endpoint that shows the server's activity).
pub fn metrics_address(value: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = value.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    value.parse().map_err(|e| format!("{e}: give HOST:PORT or a port (on 127.0.0.1)"))
}

/// Tells a supervisor reading stdout which signal stopped the server (the summary line goes
/// to the log); a closed pipe is ignored, the stop goes on.
pub fn print_stopped(signal: &str) {
    let _ = writeln!(std::io::stdout(), "stopped on {signal}");
}

/// Keeps `readiness` equal to `check()` (polled every 250 ms), logging each change once:
/// `what` names the dependency (the database, NATS). Runs until dropped.
pub async fn follow_readiness(readiness: &Readiness, what: &str, check: impl Fn() -> bool) {
    loop {
        let ready = check();
        if ready != readiness.is_ready() {
            readiness.set(ready);
            if ready {
                tracing::info!("{what} reachable: ready");
            } else {
                tracing::warn!("{what} unreachable: not ready until it is back");
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
