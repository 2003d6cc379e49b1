//! `exchange load`: drives `exchange serve` over the native protocol, open loop, and measures
//! each order's latency from its intended send time to its first report (accepted or
//! rejected), as the client sees it.
//!
//! One sender thread follows `lab::load`'s schedule and writes each order to the session whose
//! turn it is; one reader thread per session matches reports to intended times by token.
//! Orders alternate buy and sell at one price, so they match and the book stays small.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lab::load::{OpenLoopPlan, drive_sync};
use lab::stats::LatencyHistogram;

use crate::client::{ClientError, NativeClient};
use crate::native::{self, ClientMsg, OrderRequest, ServerMsg, event_kind};

/// How long the readers wait for the last reports after the schedule ends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Orders one run may send (tokens are u32 and intended times are kept per order).
pub const ORDERS_MAX: u64 = 50_000_000;
/// Marks an order whose first report was counted (or that was never sent).
const ANSWERED: u64 = u64::MAX;

/// What to drive.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub connect: SocketAddr,
    /// (client id, secret) of each session.
    pub sessions: Vec<(u32, String)>,
    pub plan: OpenLoopPlan,
    pub instrument: u32,
    pub price: i64,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct LoadResult {
    pub sent: u64,
    pub answered: u64,
    pub rejected: u64,
    pub elapsed: Duration,
    /// Intended send time → first report.
    pub latency: LatencyHistogram,
    /// How late the sender was (a high tail: the generator could not keep up).
    pub send_lag: LatencyHistogram,
}

/// Runs one open-loop load.
pub fn run(options: &LoadOptions) -> Result<LoadResult, ClientError> {
    let orders = options
        .plan
        .schedule()
        .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?
        .count() as u64;
    if orders > ORDERS_MAX || options.sessions.is_empty() {
        return Err(ClientError::Io(std::io::Error::other(format!(
            "1..={ORDERS_MAX} orders and at least one session"
        ))));
    }
    // Intended send time per token (ns after `start`); ANSWERED once counted.
    let intended: Arc<Vec<AtomicU64>> =
        Arc::new((0..=orders).map(|_| AtomicU64::new(ANSWERED)).collect());
    let start = Instant::now();
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for (client, secret) in &options.sessions {
        let mut session = NativeClient::connect(options.connect)?;
        match session.login(*client, secret, 0, Duration::from_secs(10))? {
            ServerMsg::LoginAccepted { .. } => {}
            other => {
                return Err(ClientError::Io(std::io::Error::other(format!(
                    "login of {client}: {other:?}"
                ))));
            }
        }
        writers.push((*client, session.writer()?));
        let intended = intended.clone();
        readers.push(std::thread::spawn(move || read_reports(session, &intended, start)));
    }
    let mut frame = Vec::with_capacity(native::FRAME_BYTES_MAX);
    let mut write_error = None;
    let report = drive_sync(&options.plan, |shot| {
        let token = shot.index as u32 + 1;
        let (client, writer) = &mut writers[shot.index as usize % options.sessions.len()];
        let order = OrderRequest {
            client: *client,
            token,
            instrument: options.instrument,
            side: (shot.index % 2) as u8,
            price: options.price,
            qty: 1,
            ..OrderRequest::default()
        };
        let intended_ns = shot.intended.saturating_duration_since(start).as_nanos() as u64;
        // Relaxed: the reader reads it after the server's answer, which follows the write
        // below; the socket round trip orders them in practice, and a stale read only
        // mis-attributes one sample (never a crash).
        intended[token as usize].store(intended_ns, Ordering::Relaxed);
        frame.clear();
        native::encode_client(&ClientMsg::NewOrder(order), &mut frame);
        if let Err(error) = writer.write_all(&frame) {
            write_error.get_or_insert(error);
        }
    })
    .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?;
    if let Some(error) = write_error {
        return Err(error.into());
    }
    // The sessions stay open (a closed session would stop its reports); each reader ends
    // after DRAIN_TIMEOUT without a report.
    let mut result = LoadResult {
        sent: report.sent,
        answered: 0,
        rejected: 0,
        elapsed: report.elapsed,
        latency: LatencyHistogram::new(),
        send_lag: report.send_lag,
    };
    for reader in readers {
        let (latency, answered, rejected) = reader.join().expect("reader thread");
        result.latency.merge(&latency);
        result.answered += answered;
        result.rejected += rejected;
    }
    Ok(result)
}

fn read_reports(
    mut session: NativeClient,
    intended: &[AtomicU64],
    start: Instant,
) -> (LatencyHistogram, u64, u64) {
    let mut latency = LatencyHistogram::new();
    let (mut answered, mut rejected) = (0, 0);
    while let Ok(Some(msg)) = session.recv(DRAIN_TIMEOUT) {
        let ServerMsg::Sequenced { event, .. } = msg else { continue };
        let first = matches!(event.kind, event_kind::ACCEPTED | event_kind::REJECTED);
        let Some(slot) = intended.get(event.token as usize).filter(|_| first) else { continue };
        let sent_ns = slot.swap(ANSWERED, Ordering::Relaxed);
        if sent_ns == ANSWERED {
            continue;
        }
        let now_ns = start.elapsed().as_nanos() as u64;
        latency.record_ns(now_ns.saturating_sub(sent_ns));
        answered += 1;
        rejected += u64::from(event.kind == event_kind::REJECTED);
    }
    (latency, answered, rejected)
}
