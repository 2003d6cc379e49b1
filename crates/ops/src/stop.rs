//! How every server stops: on SIGTERM (a supervisor, `kill`) or SIGINT (Ctrl-C) it stops
//! accepting, finishes or refuses with a clear reply what it took, flushes its stores and
//! journals, logs one summary line and exits 0, all within [`DRAIN_TIMEOUT`].

use std::time::Duration;

/// The longest a server drains after a stop signal before it cuts what is left and exits.
/// Supervisors (systemd's `TimeoutStopSec`, Kubernetes' `terminationGracePeriodSeconds`)
/// should allow more than this before they send SIGKILL; 10 s stays under both defaults.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Waits for SIGTERM or SIGINT and names the one that came. The handlers are installed when
/// this is called, not when it is first polled: call it before the server announces itself,
/// so a supervisor that stops it right after reading its listen line is heard.
///
/// Needs a tokio runtime with its I/O driver enabled.
pub fn stop_signal() -> std::io::Result<impl std::future::Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        }
    })
}
