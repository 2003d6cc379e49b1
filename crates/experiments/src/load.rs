//! Load driving beyond the open-loop schedule (`stats::open_loop`): the async open-loop
//! driver, a closed-loop driver, the search for the maximum sustainable rate, the load
//! generator's thread priority, and the reports they return.
//!
//! * [`drive_async`]: tokio; spawns each request at its intended time with at most
//!   `in_flight_max` outstanding (a request waiting for a slot is late, and that wait counts
//!   in its latency), counts errors and timeouts.
//! * [`drive_closed_loop`]: N users that each send, wait for the answer, think, repeat; only
//!   requests started after warm-up and finished before cool-down count. Closed loop measures
//!   throughput at a concurrency; use it for capacity, not for latency under a given rate.
//! * [`RateSearch`] / [`search_max_rate`]: the highest rate whose latency percentile stays
//!   within a limit, bracketed from both sides of a start rate and then bisected.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use stats::open_loop::{OpenLoopPlan, duration_ns};
use stats::{BadInput, LatencyHistogram, LatencySummary};
use tokio::task::JoinSet;

/// Scheduling priority (nice value) a load generator's thread asks for while it drives. When
/// the generator and the server it loads share a host's cores, the kernel's fair share would
/// otherwise give the generator as much of a contended core as a busy server thread there, and
/// the generator's lag, not the server, would set the measured rate. On the 2-core development
/// host, `web load` against prefork at medium-600 × 10 users measured 1673-2462 req/s at nice 0
/// against 2252-2719 req/s at nice -10, 8 runs each (docs/benchmarks/web.md).
pub const GENERATOR_NICE: i32 = -10;

/// The calling thread at [`GENERATOR_NICE`] until dropped, then back at its previous priority.
/// Threads it starts meanwhile inherit the priority. Raising needs CAP_SYS_NICE; without it the
/// thread keeps its priority and a warning says so (once per process), because the measurement
/// then depends on the scheduler's sharing.
pub struct GeneratorPriority {
    thread_id: libc::id_t,
    previous_nice: Option<i32>,
}

impl GeneratorPriority {
    pub fn raise() -> GeneratorPriority {
        static WARNED: std::sync::Once = std::sync::Once::new();
        // SAFETY: gettid takes no arguments and cannot fail.
        let thread_id = unsafe { libc::gettid() } as libc::id_t;
        let previous = thread_nice(thread_id);
        let previous_nice = match previous
            .and_then(|nice| set_thread_nice(thread_id, GENERATOR_NICE).map(|()| nice))
        {
            Ok(nice) => Some(nice),
            Err(error) => {
                WARNED.call_once(|| {
                    tracing::warn!(%error, "the load generator keeps its priority (needs CAP_SYS_NICE): a busy server on its core can slow it");
                });
                None
            }
        };
        GeneratorPriority { thread_id, previous_nice }
    }

    /// Whether the thread runs at [`GENERATOR_NICE`].
    pub fn raised(&self) -> bool {
        self.previous_nice.is_some()
    }
}

impl Drop for GeneratorPriority {
    fn drop(&mut self) {
        if let Some(nice) = self.previous_nice {
            // Lowering a priority back is always allowed; a failure leaves the thread raised.
            if let Err(error) = set_thread_nice(self.thread_id, nice) {
                tracing::warn!(%error, "restoring the load generator's priority");
            }
        }
    }
}

fn thread_nice(thread_id: libc::id_t) -> std::io::Result<i32> {
    // getpriority may legitimately answer -1, so errno is cleared first and checked after.
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority reads the priority of one thread; no memory of ours is touched.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, thread_id) };
    let error = std::io::Error::last_os_error();
    if nice == -1 && error.raw_os_error() != Some(0) {
        return Err(error);
    }
    Ok(nice)
}

fn set_thread_nice(thread_id: libc::id_t, nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority changes one thread's priority (Linux: PRIO_PROCESS with a thread id
    // applies to that thread only); no memory of ours is touched.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, thread_id, nice) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Async drivers: shared tally.

/// Completions per fixed interval, for throughput-over-time plots.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThroughputSeries {
    pub interval: Duration,
    pub counts: Vec<u64>,
}

impl ThroughputSeries {
    /// Each interval's count as a rate.
    pub fn rates_per_s(&self) -> Vec<f64> {
        let seconds = self.interval.as_secs_f64();
        self.counts.iter().map(|&count| count as f64 / seconds).collect()
    }
}

/// Results of an async run (open or closed loop).
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Latency of successful requests; from the intended time in open loop, from the send in
    /// closed loop (where the next send waits for the answer by design).
    pub latency: LatencyHistogram,
    /// Open loop: how late each request was started (waiting for an in-flight slot included).
    /// Closed loop: empty.
    pub send_lag: LatencyHistogram,
    pub ok: u64,
    /// Successful answers received inside the measured window, whenever sent. Closed loop:
    /// `ok` plus the answers to requests sent before the window opened (counting only requests
    /// started inside it undercounts by about latency / window). Open loop: `ok`.
    pub answered_in_window: u64,
    pub errors: u64,
    pub timeouts: u64,
    /// The first error's message, to say what went wrong.
    pub first_error: Option<String>,
    /// Successful completions per interval over the measured window.
    pub throughput: ThroughputSeries,
    /// Length of the measured window.
    pub measured: Duration,
}

impl LoadReport {
    /// Successful requests per second over the measured window.
    pub fn throughput_per_s(&self) -> f64 {
        self.ok as f64 / self.measured.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// The figures of this report in a serializable form (for the report folder's JSON).
    pub fn summary(&self) -> LoadSummary {
        LoadSummary {
            ok: self.ok,
            errors: self.errors,
            timeouts: self.timeouts,
            first_error: self.first_error.clone(),
            measured_s: self.measured.as_secs_f64(),
            throughput_per_s: self.throughput_per_s(),
            throughput_series_per_s: self.throughput.rates_per_s(),
            latency: self.latency.summary(),
            send_lag: self.send_lag.summary(),
        }
    }

    fn empty(interval: Duration) -> Self {
        Self {
            latency: LatencyHistogram::new(),
            send_lag: LatencyHistogram::new(),
            ok: 0,
            answered_in_window: 0,
            errors: 0,
            timeouts: 0,
            first_error: None,
            throughput: ThroughputSeries { interval, counts: Vec::new() },
            measured: Duration::ZERO,
        }
    }

    /// Counts one finished request that completed `done_ns` after the window's start.
    fn record(&mut self, outcome: Outcome, latency_ns: u64, done_ns: u64) {
        match outcome {
            Outcome::Ok => {
                self.ok += 1;
                self.answered_in_window += 1;
                self.latency.record_ns(latency_ns);
                let interval_ns = duration_ns(self.throughput.interval).max(1);
                let slot = usize::try_from(done_ns / interval_ns).unwrap_or(usize::MAX);
                if slot >= self.throughput.counts.len() {
                    self.throughput.counts.resize(slot.saturating_add(1), 0);
                }
                self.throughput.counts[slot] += 1;
            }
            Outcome::Error(message) => {
                self.errors += 1;
                self.first_error.get_or_insert(message);
            }
            Outcome::Timeout => self.timeouts += 1,
        }
    }

    fn merge(&mut self, other: LoadReport) {
        self.latency.merge(&other.latency);
        self.send_lag.merge(&other.send_lag);
        self.ok += other.ok;
        self.answered_in_window += other.answered_in_window;
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        let counts = &mut self.throughput.counts;
        counts.resize(counts.len().max(other.throughput.counts.len()), 0);
        for (count, other) in counts.iter_mut().zip(other.throughput.counts) {
            *count += other;
        }
    }
}

/// [`LoadReport`] without the histograms, for JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadSummary {
    pub ok: u64,
    pub errors: u64,
    pub timeouts: u64,
    pub first_error: Option<String>,
    pub measured_s: f64,
    pub throughput_per_s: f64,
    pub throughput_series_per_s: Vec<f64>,
    pub latency: LatencySummary,
    pub send_lag: LatencySummary,
}

enum Outcome {
    Ok,
    Error(String),
    Timeout,
}

async fn run_with_timeout<T, E: Display>(
    request: impl Future<Output = Result<T, E>>,
    timeout: Duration,
) -> Outcome {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(_)) => Outcome::Ok,
        Ok(Err(error)) => Outcome::Error(error.to_string()),
        Err(_) => Outcome::Timeout,
    }
}

// ---------------------------------------------------------------------------------------------
// Async open-loop driver.

/// Limits of [`drive_async`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AsyncOpenLoopOptions {
    /// Most requests outstanding at once; a due request waits for a slot (and is late).
    pub in_flight_max: usize,
    /// A request not answered this long after it started counts as a timeout.
    pub timeout: Duration,
    /// Width of the throughput series' intervals.
    pub interval: Duration,
}

impl Default for AsyncOpenLoopOptions {
    fn default() -> Self {
        Self {
            in_flight_max: 1_024,
            timeout: Duration::from_secs(5),
            interval: Duration::from_secs(1),
        }
    }
}

/// Issues `request(index)` at each intended time of `plan` as its own tokio task, at most
/// `in_flight_max` at once, and waits for all of them. Latency is measured from the intended
/// time. Tokio timers have millisecond resolution, so at high rates requests go out in
/// small bursts up to 1 ms late; that lateness is in `send_lag` and in the latencies.
pub async fn drive_async<F, Fut, T, E>(
    plan: &OpenLoopPlan,
    options: &AsyncOpenLoopOptions,
    mut request: F,
) -> Result<LoadReport, BadInput>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Display + Send + 'static,
{
    if options.in_flight_max == 0 || options.interval.is_zero() {
        return Err(BadInput("in_flight_max and interval must be > 0".into()));
    }
    let schedule = plan.schedule()?;
    let slots = Arc::new(tokio::sync::Semaphore::new(options.in_flight_max));
    let mut report = LoadReport::empty(options.interval);
    let mut tasks = JoinSet::new();
    let start = tokio::time::Instant::now();
    for (index, offset_ns) in (0..).zip(schedule) {
        let intended = start + Duration::from_nanos(offset_ns);
        tokio::time::sleep_until(intended).await;
        let slot = Arc::clone(&slots).acquire_owned().await.expect("semaphore is never closed");
        report.send_lag.record_ns(duration_ns(intended.elapsed()));
        let future = request(index);
        let timeout = options.timeout;
        tasks.spawn(async move {
            let outcome = run_with_timeout(future, timeout).await;
            // Stamped here, when the answer arrives: the driver joins finished tasks only
            // between sends, so a clock read at the join would add up to a whole gap between
            // arrivals to every latency (at 50/s, ~20 ms against a 0.5 ms server).
            let answered = tokio::time::Instant::now();
            drop(slot);
            Answered { outcome, intended, answered }
        });
        // Collect what has finished so the join set stays small on long runs.
        while let Some(joined) = tasks.try_join_next() {
            record_joined(&mut report, joined, start);
        }
    }
    while let Some(joined) = tasks.join_next().await {
        record_joined(&mut report, joined, start);
    }
    report.measured = start.elapsed();
    Ok(report)
}

/// One finished request of [`drive_async`]: its outcome, when it was meant to go out and when
/// its answer (or its failure) came.
struct Answered {
    outcome: Outcome,
    intended: tokio::time::Instant,
    answered: tokio::time::Instant,
}

fn record_joined(
    report: &mut LoadReport,
    joined: Result<Answered, tokio::task::JoinError>,
    start: tokio::time::Instant,
) {
    match joined {
        Ok(Answered { outcome, intended, answered }) => {
            let latency_ns = duration_ns(answered - intended);
            report.record(outcome, latency_ns, duration_ns(answered - start));
        }
        Err(error) => report.record(Outcome::Error(format!("request task failed: {error}")), 0, 0),
    }
}

// ---------------------------------------------------------------------------------------------
// Closed-loop driver.

/// Parameters of [`drive_closed_loop`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClosedLoopOptions {
    /// Concurrent users, each with at most one request outstanding.
    pub users: usize,
    /// Pause between a response and the user's next request.
    pub think_time: Duration,
    /// Run before measuring (not counted).
    pub warm_up: Duration,
    /// The measured window.
    pub measure: Duration,
    /// Run after measuring (not counted), so the window ends under full load.
    pub cool_down: Duration,
    pub timeout: Duration,
    /// Width of the throughput series' intervals.
    pub interval: Duration,
}

impl Default for ClosedLoopOptions {
    fn default() -> Self {
        Self {
            users: 10,
            think_time: Duration::ZERO,
            warm_up: Duration::from_secs(1),
            measure: Duration::from_secs(10),
            cool_down: Duration::from_secs(1),
            timeout: Duration::from_secs(5),
            interval: Duration::from_secs(1),
        }
    }
}

/// Runs `options.users` users, each calling `request(user, sequence)`, waiting for the
/// answer, thinking, and repeating until warm-up + measure + cool-down has passed. Only
/// requests started after the warm-up and finished within the measured window count, except
/// in `answered_in_window`. Each user tallies into its own report; they are merged at the end
/// (no shared state).
pub async fn drive_closed_loop<F, Fut, T, E>(
    options: &ClosedLoopOptions,
    request: F,
) -> Result<LoadReport, BadInput>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Display + Send + 'static,
{
    if options.users == 0 || options.measure.is_zero() || options.interval.is_zero() {
        return Err(BadInput("users, measure and interval must be > 0".into()));
    }
    let request = Arc::new(request);
    let window_start = tokio::time::Instant::now() + options.warm_up;
    let window_end = window_start + options.measure;
    let run_end = window_end + options.cool_down;
    let options = *options;
    let mut users = JoinSet::new();
    for user in 0..options.users {
        let request = Arc::clone(&request);
        users.spawn(async move {
            let mut tally = LoadReport::empty(options.interval);
            for sequence in 0.. {
                let started = tokio::time::Instant::now();
                if started >= run_end {
                    break;
                }
                let outcome = run_with_timeout(request(user, sequence), options.timeout).await;
                let done = tokio::time::Instant::now();
                if started >= window_start && done <= window_end {
                    tally.record(
                        outcome,
                        duration_ns(done - started),
                        duration_ns(done - window_start),
                    );
                } else if matches!(outcome, Outcome::Ok)
                    && done >= window_start
                    && done <= window_end
                {
                    tally.answered_in_window += 1;
                }
                if !options.think_time.is_zero() {
                    tokio::time::sleep(options.think_time).await;
                }
            }
            tally
        });
    }
    let mut report = LoadReport::empty(options.interval);
    while let Some(joined) = users.join_next().await {
        match joined {
            Ok(tally) => report.merge(tally),
            Err(error) => report.record(Outcome::Error(format!("user task failed: {error}")), 0, 0),
        }
    }
    let intervals = options.measure.as_nanos().div_ceil(options.interval.as_nanos());
    report.throughput.counts.resize(usize::try_from(intervals).unwrap_or(usize::MAX), 0);
    report.measured = options.measure;
    Ok(report)
}

// ---------------------------------------------------------------------------------------------
// Maximum-rate search.

/// Each bracketing step multiplies (or divides) the rate by this factor.
const BRACKET_GROWTH: f64 = 2.0;

/// A search for the highest rate whose latency at `percentile` stays within `limit_ns`:
/// bracket the limit from the start rate (double while a step passes, halve while it fails,
/// within `min..=max`), then bisect between the highest passing and the lowest failing rate
/// until they are within `precision` (relative) of each other.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateSearchPlan {
    pub start_rate_per_s: f64,
    pub min_rate_per_s: f64,
    pub max_rate_per_s: f64,
    /// e.g. 99.0 for p99.
    pub percentile: f64,
    pub limit_ns: u64,
    /// Stop bisecting once (failing − passing) / passing is at most this (e.g. 0.05).
    pub precision: f64,
}

/// One measured step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub rate_per_s: f64,
    /// Latency at the plan's percentile.
    pub value_ns: u64,
    pub passed: bool,
    pub summary: LatencySummary,
}

/// The outcome of a rate search.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateSearchReport {
    pub plan: RateSearchPlan,
    /// Every measured step, in the order measured.
    pub steps: Vec<StepResult>,
    /// The highest rate that met the limit; `None` if even `min_rate_per_s` failed.
    pub last_passing_rate_per_s: Option<f64>,
    /// The lowest rate that missed the limit; `None` if even `max_rate_per_s` passed.
    pub first_failing_rate_per_s: Option<f64>,
}

/// Rate search state for callers that run each step themselves (e.g. inside async code):
/// `while let Some(rate) = search.next_rate() { ...measure...; search.record(rate, &h); }`.
#[derive(Clone, Debug)]
pub struct RateSearch {
    plan: RateSearchPlan,
    steps: Vec<StepResult>,
    passing: Option<f64>,
    failing: Option<f64>,
}

impl RateSearch {
    pub fn new(plan: RateSearchPlan) -> Result<Self, BadInput> {
        let positive = |v: f64| v > 0.0 && v.is_finite();
        let ordered = plan.min_rate_per_s <= plan.start_rate_per_s
            && plan.start_rate_per_s <= plan.max_rate_per_s;
        if !(positive(plan.min_rate_per_s) && positive(plan.max_rate_per_s) && ordered) {
            return Err(BadInput("rate search needs 0 < min <= start <= max rates".into()));
        }
        if !(plan.precision > 0.0 && plan.precision < 1.0) {
            return Err(BadInput(format!("precision {} is not in (0, 1)", plan.precision)));
        }
        if !(0.0..=100.0).contains(&plan.percentile) {
            return Err(BadInput(format!("percentile {} is not in 0..=100", plan.percentile)));
        }
        Ok(Self { plan, steps: Vec::new(), passing: None, failing: None })
    }

    /// The next rate to measure; `None` once the limit is bracketed within the precision, or
    /// the search ran into `min` (failing) or `max` (passing).
    pub fn next_rate(&self) -> Option<f64> {
        let plan = &self.plan;
        match (self.passing, self.failing) {
            (None, None) => Some(plan.start_rate_per_s),
            (Some(pass), None) if pass >= plan.max_rate_per_s => None,
            (Some(pass), None) => Some((pass * BRACKET_GROWTH).min(plan.max_rate_per_s)),
            (None, Some(fail)) if fail <= plan.min_rate_per_s => None,
            (None, Some(fail)) => Some((fail / BRACKET_GROWTH).max(plan.min_rate_per_s)),
            (Some(pass), Some(fail)) if (fail - pass) / pass <= plan.precision => None,
            (Some(pass), Some(fail)) => Some((pass + fail) / 2.0),
        }
    }

    /// Records the latency measured at `rate_per_s`; returns whether the step passed. An empty
    /// histogram (nothing completed) fails the step.
    pub fn record(&mut self, rate_per_s: f64, latency: &LatencyHistogram) -> bool {
        let value_ns = latency.value_at_percentile_ns(self.plan.percentile);
        let passed = !latency.is_empty() && value_ns <= self.plan.limit_ns;
        self.steps.push(StepResult { rate_per_s, value_ns, passed, summary: latency.summary() });
        // A noisy host may pass above a rate that failed (or fail below one that passed): the
        // bracket keeps the highest pass below the lowest fail, so the search always ends.
        if passed {
            if self.failing.is_none_or(|fail| rate_per_s < fail) {
                self.passing = Some(self.passing.map_or(rate_per_s, |pass| pass.max(rate_per_s)));
            }
        } else {
            self.failing = Some(self.failing.map_or(rate_per_s, |fail| fail.min(rate_per_s)));
            self.passing = self.passing.filter(|&pass| pass < rate_per_s);
        }
        passed
    }

    pub fn into_report(self) -> RateSearchReport {
        RateSearchReport {
            plan: self.plan,
            steps: self.steps,
            last_passing_rate_per_s: self.passing,
            first_failing_rate_per_s: self.failing,
        }
    }
}

/// Runs a whole rate search: `run(rate)` measures one step and returns its latencies. The
/// error is the caller's own (a library's typed error, or `anyhow` in a command): a bad plan
/// converts into it.
pub fn search_max_rate<E: From<BadInput>>(
    plan: RateSearchPlan,
    mut run: impl FnMut(f64) -> Result<LatencyHistogram, E>,
) -> Result<RateSearchReport, E> {
    let mut search = RateSearch::new(plan)?;
    while let Some(rate_per_s) = search.next_rate() {
        let latency = run(rate_per_s)?;
        search.record(rate_per_s, &latency);
    }
    Ok(search.into_report())
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;
    use stats::open_loop::ArrivalProcess;
    use std::time::Instant;

    fn count_below(histogram: &LatencyHistogram, limit_ns: u64) -> u64 {
        histogram.as_hdr().count_between(0, limit_ns - 1)
    }

    #[test]
    fn generator_priority_is_raised_for_this_thread_and_restored() {
        // SAFETY: gettid takes no arguments and cannot fail.
        let me = unsafe { libc::gettid() } as libc::id_t;
        let before = thread_nice(me).unwrap();
        // A thread started before the raise (threads started after it inherit the priority).
        let (raised_tx, raised_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            raised_rx.recv().unwrap();
            // SAFETY: as above.
            thread_nice(unsafe { libc::gettid() } as libc::id_t).unwrap()
        });
        let priority = GeneratorPriority::raise();
        raised_tx.send(()).unwrap();
        assert_eq!(other.join().unwrap(), before, "only the calling thread is raised");
        if priority.raised() {
            assert_eq!(thread_nice(me).unwrap(), GENERATOR_NICE);
        } else {
            assert_eq!(thread_nice(me).unwrap(), before, "a refused raise changes nothing");
        }
        drop(priority);
        assert_eq!(thread_nice(me).unwrap(), before);
    }
    /// A real TCP server on loopback that answers one byte per request and stalls once.
    async fn stalling_echo_server(stall_at: u64, stall: Duration) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut byte = [0_u8; 1];
            for served in 0.. {
                if socket.read_exact(&mut byte).await.is_err() {
                    return;
                }
                if served == stall_at {
                    tokio::time::sleep(stall).await;
                }
                socket.write_all(&byte).await.unwrap();
            }
        });
        address
    }

    #[tokio::test]
    async fn async_driver_measures_queueing_behind_a_stalled_tcp_server() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let address = stalling_echo_server(20, Duration::from_millis(50)).await;
        let stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let connection = Arc::new(tokio::sync::Mutex::new(stream));
        let plan = OpenLoopPlan {
            process: ArrivalProcess::Constant { rate_per_s: 1_000.0 },
            seed: 0,
            duration: Duration::from_millis(200),
        };
        // One connection, one request in flight: like a client that must wait for answers.
        let options = AsyncOpenLoopOptions { in_flight_max: 1, ..Default::default() };
        let report = drive_async(&plan, &options, |index| {
            let connection = Arc::clone(&connection);
            async move {
                let mut stream = connection.lock().await;
                stream.write_all(&[index as u8]).await?;
                let mut answer = [0_u8; 1];
                stream.read_exact(&mut answer).await?;
                anyhow::ensure!(answer[0] == index as u8, "wrong answer");
                anyhow::Ok(())
            }
        })
        .await
        .unwrap();
        assert_eq!(
            (report.ok, report.errors, report.timeouts),
            (200, 0, 0),
            "{:?}",
            report.first_error
        );
        // Requests due 20..50 ms were queued behind the 50 ms stall: ≥ 20 ms late each.
        let slow = report.latency.count() - count_below(&report.latency, 20_000_000);
        assert!(slow >= 25, "{slow} requests ≥ 20 ms");
        assert!(report.latency.max_ns() >= 45_000_000);
        assert!(report.send_lag.max_ns() >= 40_000_000, "the driver waited for the slot");
        assert_eq!(report.throughput.counts.iter().sum::<u64>(), 200);
        let summary = report.summary();
        assert_eq!(summary.latency, report.latency.summary());
        let json = serde_json::to_string(&summary).unwrap();
        assert_eq!(serde_json::from_str::<LoadSummary>(&json).unwrap().ok, 200);
    }

    #[tokio::test]
    async fn async_driver_times_each_request_to_its_answer_not_to_the_next_arrival() {
        // A service of known time (2 ms) at 50/s: each answer comes 18 ms before the next
        // arrival, so the latency must be the service time, not the 20 ms gap.
        const SERVICE: Duration = Duration::from_millis(2);
        const GAP: Duration = Duration::from_millis(20);
        let plan = OpenLoopPlan {
            process: ArrivalProcess::Constant { rate_per_s: 50.0 },
            seed: 0,
            duration: Duration::from_millis(300),
        };
        let options = AsyncOpenLoopOptions::default();
        let report = drive_async(&plan, &options, |_| async {
            tokio::time::sleep(SERVICE).await;
            Ok::<(), String>(())
        })
        .await
        .unwrap();
        assert_eq!(report.ok, 15);
        let p50 = report.latency.value_at_percentile_ns(50.0);
        // Tokio timers round up to the millisecond: up to 2 ms more, plus a loaded host's delay.
        let slack = Duration::from_millis(5);
        assert!(
            duration_ns(SERVICE) <= p50 && p50 <= duration_ns(SERVICE + slack),
            "p50 {p50} ns: the service time is 2 ms"
        );
        assert!(p50 < duration_ns(GAP) / 2, "p50 {p50} ns is near the gap between arrivals");
    }

    #[tokio::test]
    async fn async_driver_counts_errors_and_timeouts() {
        let plan = OpenLoopPlan {
            process: ArrivalProcess::Poisson { rate_per_s: 2_000.0 },
            seed: 9,
            duration: Duration::from_millis(50),
        };
        let expected = plan.schedule().unwrap().count() as u64;
        let options =
            AsyncOpenLoopOptions { timeout: Duration::from_millis(20), ..Default::default() };
        let report = drive_async(&plan, &options, |index| async move {
            match index {
                3 => tokio::time::sleep(Duration::from_millis(500)).await,
                i if i % 2 == 1 => return Err(format!("odd request {i}")),
                _ => {}
            }
            Ok(())
        })
        .await
        .unwrap();
        let odd = expected / 2 - 1;
        assert_eq!(report.timeouts, 1);
        assert_eq!(report.errors, odd);
        assert_eq!(report.ok, expected - odd - 1);
        assert!(report.first_error.unwrap().starts_with("odd request"));
    }

    #[tokio::test]
    async fn closed_loop_throughput_follows_users_service_and_think_time() {
        // Service 4 ms; requests started during the first 50 ms take 45 ms instead and must
        // be trimmed by the 100 ms warm-up.
        let start = Instant::now();
        let service = move |_user: usize, _sequence: u64| async move {
            let slow = start.elapsed() < Duration::from_millis(50);
            tokio::time::sleep(Duration::from_millis(if slow { 45 } else { 4 })).await;
            Ok::<(), String>(())
        };
        let options = ClosedLoopOptions {
            users: 4,
            think_time: Duration::ZERO,
            warm_up: Duration::from_millis(100),
            measure: Duration::from_millis(500),
            cool_down: Duration::from_millis(50),
            timeout: Duration::from_secs(1),
            interval: Duration::from_millis(100),
        };
        let busy = drive_closed_loop(&options, service).await.unwrap();
        // At most 4 users / 4 ms = 1000/s; timers and a loaded machine make it lower.
        assert!(
            busy.throughput_per_s() <= 1_000.0 && busy.throughput_per_s() >= 300.0,
            "{}",
            busy.throughput_per_s()
        );
        assert!(busy.latency.max_ns() < 40_000_000, "warm-up requests were not trimmed");
        assert!(busy.latency.min_ns() >= 4_000_000);
        assert_eq!(busy.throughput.counts.len(), 5);
        assert_eq!(busy.throughput.counts.iter().sum::<u64>(), busy.ok);
        // Each user has one request in flight when the window opens; its answer lands inside.
        assert!(busy.answered_in_window > busy.ok, "{} vs {}", busy.answered_in_window, busy.ok);
        assert!(busy.answered_in_window <= busy.ok + 4, "at most one straddling answer per user");

        let thinking = ClosedLoopOptions { think_time: Duration::from_millis(16), ..options };
        let slow = drive_closed_loop(&thinking, service).await.unwrap();
        // At most 4 users / 20 ms = 200/s.
        assert!(
            slow.throughput_per_s() <= 200.0 && slow.throughput_per_s() >= 80.0,
            "{}",
            slow.throughput_per_s()
        );
    }

    /// Latency grows with the rate: 10 ns per msg/s, so 55K msg/s is exactly the 550 µs limit.
    fn synthetic(rate: f64) -> anyhow::Result<LatencyHistogram> {
        Ok(LatencyHistogram::from_samples_ns(&[(rate * 10.0) as u64; 100]))
    }

    const SEARCH: RateSearchPlan = RateSearchPlan {
        start_rate_per_s: 20_000.0,
        min_rate_per_s: 1_000.0,
        max_rate_per_s: 1_000_000.0,
        percentile: 99.0,
        limit_ns: 550_000,
        precision: 0.01,
    };

    #[test]
    fn rate_search_brackets_upwards_then_bisects_to_the_limit() {
        let report = search_max_rate(SEARCH, synthetic).unwrap();
        let rates: Vec<f64> = report.steps.iter().map(|s| s.rate_per_s).collect();
        assert_eq!(rates[..3], [20_000.0, 40_000.0, 80_000.0], "doubles until a step fails");
        let pass = report.last_passing_rate_per_s.unwrap();
        let fail = report.first_failing_rate_per_s.unwrap();
        // The limit sits at 55K msg/s (within the histogram's rounding).
        assert!(pass < fail && pass <= 55_500.0 && fail >= 54_500.0, "{pass} .. {fail}");
        assert!((fail - pass) / pass <= SEARCH.precision, "{pass} .. {fail}");
        assert!(report.steps.len() <= 12, "{rates:?}");
    }

    #[test]
    fn rate_search_brackets_downwards_when_the_start_fails() {
        let high_start = RateSearchPlan { start_rate_per_s: 500_000.0, ..SEARCH };
        let report = search_max_rate(high_start, synthetic).unwrap();
        assert!(!report.steps[0].passed && !report.steps[1].passed);
        assert_eq!(report.steps[1].rate_per_s, 250_000.0, "halves while steps fail");
        let pass = report.last_passing_rate_per_s.unwrap();
        assert!((55_000.0 * (1.0 - 2.0 * SEARCH.precision)..=55_500.0).contains(&pass), "{pass}");
    }

    #[test]
    fn rate_search_stops_at_its_bounds_and_refuses_bad_plans() {
        let generous = RateSearchPlan { limit_ns: u64::MAX, ..SEARCH };
        let report = search_max_rate(generous, synthetic).unwrap();
        assert_eq!(report.last_passing_rate_per_s, Some(SEARCH.max_rate_per_s));
        assert_eq!(report.first_failing_rate_per_s, None);
        let empty =
            search_max_rate(SEARCH, |_| Ok::<_, BadInput>(LatencyHistogram::new())).unwrap();
        assert_eq!(empty.last_passing_rate_per_s, None);
        assert_eq!(empty.first_failing_rate_per_s, Some(SEARCH.min_rate_per_s));
        assert!(RateSearch::new(RateSearchPlan { min_rate_per_s: 0.0, ..SEARCH }).is_err());
        assert!(RateSearch::new(RateSearchPlan { precision: 0.0, ..SEARCH }).is_err());
        assert!(RateSearch::new(RateSearchPlan { start_rate_per_s: 1e7, ..SEARCH }).is_err());
    }

    #[test]
    fn a_noisy_pass_above_a_failure_does_not_widen_the_bracket() {
        let mut search = RateSearch::new(SEARCH).unwrap();
        let slow = LatencyHistogram::from_samples_ns(&[1_000_000; 10]);
        let fast = LatencyHistogram::from_samples_ns(&[1_000; 10]);
        assert!(!search.record(40_000.0, &slow));
        assert!(search.record(60_000.0, &fast), "noise: a higher rate passes");
        assert!(search.record(10_000.0, &fast));
        assert_eq!(search.next_rate(), Some(25_000.0), "bisects 10K..40K, ignoring 60K");
    }
}
