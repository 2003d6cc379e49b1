//! The load driver behind `web load` and `web matrix`: one cell of HTTP load at a server, with
//! the answers checked.
//!
//! Every cell drives HTTP load with pooled keep-alive connections from a separate tokio runtime
//! in this process. Closed loop: N users, each sending its next request when the previous answer
//! arrives (the study's test plan), warm-up trimmed. Open loop: a constant rate whose latency is
//! measured from each request's intended send time, so a stalled server cannot hide its queue
//! (no coordinated omission). Latencies go into `stats` HDR histograms; tables, the report
//! folder and the SVG plots of the commands come from `report`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stats::LatencySummary;

use crate::load::{
    AsyncOpenLoopOptions, ClosedLoopOptions, GeneratorPriority, LoadReport, ThroughputSeries,
    drive_async, drive_closed_loop,
};
use stats::open_loop::{ArrivalProcess, OpenLoopPlan};

use web::api::SizeLimits;
use web::client::{JsonClient, UserConnections};
use web::exec::{Compute, process};
use web::workload::Complexity;
use web::{Result, WebError};

/// Distinct request bodies per cell (different ids and cells), sent round-robin.
const BODIES_PER_CELL: u64 = 8;
/// Seed of the open-loop schedule (constant arrivals do not use randomness, but plans carry one).
const OPEN_LOOP_SEED: u64 = 1;
/// Every this many responses of a user, the answer is parsed and compared with the expected
/// product (the others are checked for status 200 and a non-empty body), so the generator's
/// own CPU cost stays small while a wrong answer is still caught.
const VALIDATE_EVERY: u64 = 32;

/// One measured cell (one round of it in `web matrix`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CellResult {
    pub target: String,
    pub complexity: Complexity,
    pub users: usize,
    /// The matrix round (0 for `web load`).
    pub round: usize,
    pub throughput_per_s: f64,
    pub completed: u64,
    pub errors: u64,
    pub latency: LatencySummary,
    /// Open loop: how late the generator sent each request (already inside `latency`); a
    /// high tail means the generator, not the server, fell behind. Closed loop: empty.
    pub send_lag: LatencySummary,
    /// Completions per interval over the measured window (throughput over time).
    pub throughput_series: ThroughputSeries,
}

impl CellResult {
    /// The summary of one driven cell.
    pub fn new(
        target: &str,
        (complexity, users, round): (Complexity, usize, usize),
        measured: &Measured,
    ) -> CellResult {
        let report = &measured.report;
        if let Some(error) = &report.first_error {
            tracing::warn!(target, error, "requests failed");
        }
        CellResult {
            target: target.into(),
            complexity,
            users,
            round,
            throughput_per_s: measured.throughput_per_s,
            completed: measured.report.answered_in_window,
            errors: report.errors + report.timeouts,
            latency: report.latency.summary(),
            send_lag: report.send_lag.summary(),
            throughput_series: report.throughput.clone(),
        }
    }
}

/// How a cell offers load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadMode {
    /// N users, each with one request outstanding.
    Closed { users: usize },
    /// Constant arrivals; latency from the intended send time.
    Open { rate_per_s: f64 },
}

/// A request body and the `rows` its answer must carry.
pub struct Exchange {
    pub body: Bytes,
    pub expected_rows: serde_json::Value,
}

/// The cell's time window and the width of its throughput-over-time intervals.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub warmup: Duration,
    pub measure: Duration,
    pub interval: Duration,
    /// A request not answered this long after it was sent counts as timed out.
    pub request_timeout: Duration,
}

/// One driven cell: the driver's report and the throughput it is summarised by.
#[derive(Debug)]
pub struct Measured {
    /// Latency, errors and throughput over time as `load` tallies them: in closed loop only
    /// requests both started and answered inside the measured window.
    pub report: LoadReport,
    /// The report's `answered_in_window` over the window. Counting only requests also
    /// *started* inside it (the report's `ok`) would undercount by about latency / window, 7%
    /// for a Python cell (0.6 s latency, 8 s window) but 0.5% for a leantier one, which would
    /// flatter the ratio between them.
    pub throughput_per_s: f64,
}

impl Measured {
    /// Why the cell measured nothing, when no request to `url` was answered well: every one
    /// failed (the first failure says how), timed out, or outlived the window. `None` when
    /// at least one was.
    pub fn nothing_answered(&self, url: &str, window: &Window) -> Option<WebError> {
        let report = &self.report;
        if report.ok > 0 {
            return None;
        }
        let (errors, timeouts) = (report.errors, report.timeouts);
        let why = match &report.first_error {
            Some(first) => format!(
                "every request to {url} failed ({errors} errors, {timeouts} timeouts); the \
                 first: {first}"
            ),
            None if timeouts > 0 => format!(
                "no request to {url} was answered: {timeouts} timed out after {:?} each (is the \
                 server up and answering?)",
                window.request_timeout
            ),
            None => format!(
                "no request to {url} was answered within the {:?} measured window",
                window.measure
            ),
        };
        Some(WebError::Failed(why))
    }
}

/// Drives one cell at `url` with `exchanges` sent round-robin. A non-200 or empty answer is an
/// error, and every `VALIDATE_EVERY`th answer of a user (open loop: of the run) must carry
/// the expected product.
pub fn drive(
    url: &str,
    exchanges: Arc<Vec<Exchange>>,
    mode: LoadMode,
    window: Window,
) -> Result<Measured> {
    let _priority = GeneratorPriority::raise();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let runtime = runtime.map_err(|source| WebError::Io {
        what: "starting the load generator's runtime".into(),
        source,
    })?;
    runtime.block_on(async move {
        match mode {
            LoadMode::Closed { users } => drive_closed(url, exchanges, users, window).await,
            LoadMode::Open { rate_per_s } => drive_open(url, exchanges, rate_per_s, window).await,
        }
    })
}

/// [`drive`]'s closed loop: `users` connections, each sending its next request when the
/// last one was answered; throughput over the measured window.
async fn drive_closed(
    url: &str,
    exchanges: Arc<Vec<Exchange>>,
    users: usize,
    window: Window,
) -> Result<Measured> {
    let connections = Arc::new(UserConnections::new(url, users)?);
    let options = ClosedLoopOptions {
        users,
        warm_up: window.warmup,
        measure: window.measure,
        cool_down: Duration::ZERO,
        interval: window.interval,
        timeout: window.request_timeout,
        ..ClosedLoopOptions::default()
    };
    let report = drive_closed_loop(&options, move |user, sequence| {
        let connections = Arc::clone(&connections);
        let exchanges = Arc::clone(&exchanges);
        async move {
            let exchange = &exchanges[(user + sequence as usize) % exchanges.len()];
            let answer = connections.post(user, exchange.body.clone()).await;
            checked(answer, exchange, sequence)
        }
    })
    .await
    .map_err(bad_plan)?;
    let throughput_per_s = report.answered_in_window as f64 / window.measure.as_secs_f64();
    Ok(Measured { report, throughput_per_s })
}

/// [`drive`]'s open loop at `rate_per_s` (constant arrivals): a warm-up, then the measured
/// window, which counts every scheduled request with its latency from its intended time.
async fn drive_open(
    url: &str,
    exchanges: Arc<Vec<Exchange>>,
    rate_per_s: f64,
    window: Window,
) -> Result<Measured> {
    let client = JsonClient::default();
    let url: Arc<str> = url.into();
    let mut send = move |index: u64| {
        let (client, url) = (client.clone(), Arc::clone(&url));
        let exchanges = Arc::clone(&exchanges);
        async move {
            let exchange = &exchanges[(index % exchanges.len() as u64) as usize];
            let answer = client.post(&url, exchange.body.clone()).await;
            checked(answer, exchange, index)
        }
    };
    let process = ArrivalProcess::Constant { rate_per_s };
    let options = AsyncOpenLoopOptions {
        interval: window.interval,
        timeout: window.request_timeout,
        ..AsyncOpenLoopOptions::default()
    };
    if !window.warmup.is_zero() {
        let plan = OpenLoopPlan { process, seed: OPEN_LOOP_SEED, duration: window.warmup };
        drive_async(&plan, &options, &mut send).await.map_err(bad_plan)?;
    }
    let plan = OpenLoopPlan { process, seed: OPEN_LOOP_SEED, duration: window.measure };
    let report = drive_async(&plan, &options, &mut send).await.map_err(bad_plan)?;
    let throughput_per_s = report.throughput_per_s();
    Ok(Measured { report, throughput_per_s })
}

/// A load plan the lab refused: the caller's input, so bad input of the web service's.
fn bad_plan(stats::BadInput(why): stats::BadInput) -> WebError {
    WebError::BadInput(why)
}

/// [`check_answer`] on an answer, or the whole chain of why there was none (the driver
/// keeps the first failure's text, and a top-level "posting" alone says nothing).
fn checked(
    answer: Result<(u16, Bytes)>,
    exchange: &Exchange,
    sequence: u64,
) -> std::result::Result<(), String> {
    let checked = answer.and_then(|(status, body)| check_answer(status, &body, exchange, sequence));
    checked.map_err(|error| ops::error_chain(&error))
}

/// Status 200 and a body for every answer; the whole product for a sample of them.
fn check_answer(status: u16, answer: &[u8], exchange: &Exchange, sequence: u64) -> Result<()> {
    let wrong = |why: &str| Err(WebError::Failed(why.into()));
    if status != 200 {
        return wrong(&format!("HTTP {status}"));
    }
    if answer.is_empty() {
        return wrong("empty answer");
    }
    if sequence.is_multiple_of(VALIDATE_EVERY) {
        let json: serde_json::Value = match serde_json::from_slice(answer) {
            Ok(json) => json,
            Err(e) => return wrong(&format!("answer is not JSON: {e}")),
        };
        if json["rows"] != exchange.expected_rows {
            return wrong("wrong product in the answer");
        }
    }
    Ok(())
}

/// The cell's distinct requests with their expected products (computed here, serially).
pub fn exchanges(complexity: Complexity) -> Arc<Vec<Exchange>> {
    let exchanges = (0..BODIES_PER_CELL)
        .map(|seed| {
            let body = complexity.shape().request_body(seed + 1, seed);
            let reply = process(&body, &SizeLimits::default(), Compute::Serial);
            assert_eq!(reply.status, 200, "the load lab's bodies are well-formed");
            let answer: serde_json::Value =
                serde_json::from_slice(&reply.body).expect("the service writes JSON");
            Exchange { body: Bytes::from(body), expected_rows: answer["rows"].clone() }
        })
        .collect();
    Arc::new(exchanges)
}
