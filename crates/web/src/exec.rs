//! Execution models: where the CPU work of a request (parse, validate, multiply, render) runs.
//!
//! The async reactor only moves bytes. It hands each body to an [`Executor`] and awaits a
//! one-shot reply; the executor admits at most `queue_depth_max` requests (waiting in the
//! channel for `single`/`pinned`/`prefork`; waiting plus running for `pool`/`adaptive`) and answers
//! code 009 (HTTP 503) past that, so overload is refused at once instead of queueing without
//! bound.
//!
//! - `single`: one worker thread takes requests from a bounded MPMC channel, one at a time.
//! - `pinned`: one worker per allowed CPU, each pinned, all taking whole requests from one bounded
//!   channel (request parallelism; an idle worker takes the next request, so no worker idles
//!   while another has a backlog).
//! - `pool`: a fixed rayon pool; every request's output rows are split across the pool (data
//!   parallelism), requests themselves also run side by side.
//! - `adaptive` (what `serve --model adaptive` runs, in one process with the other in-process
//!   models) decides per request, when it is admitted ([`Calibration::placement`]). While cores
//!   are idle (fewer requests in flight than workers), a body at least as large as the size
//!   where splitting measured faster (calibrated at start-up on this host by
//!   [`Calibration::measure`]) is split across a pinned pool. Otherwise a body above
//!   [`SMALL_BODY_BYTES_MAX`] and up to [`INLINE_BODY_BYTES_MAX`] (the study's medium requests)
//!   runs inline on the reactor thread that read it, on the core where it was read; a small body
//!   goes to the pool, which spreads the many small requests over every core; so does a larger
//!   one, so the reactor keeps reading while it computes.
//! - `prefork` is a process-level model, see [`crate::prefork`]; inside each process it runs
//!   `single`.
//! - The adaptive *child* ([`Executor::start_child`]) is `adaptive` in the per-core layout (`serve
//!   --adaptive-layout per-core`): one per core, the prefork layout. Its reactor thread owns the
//!   core, so a hand-off to a worker there buys no parallelism: a body up to
//!   [`INLINE_BODY_BYTES_MAX`] runs inline on the reactor unless it may split (below). A larger
//!   body, or one that may split, goes, in arrival order, to one worker thread on the same core
//!   (prefork's structure), so the reactor keeps reading the other connections' bodies while it
//!   computes. The worker splits a request over a pool spanning every core when it is at least the
//!   calibrated split size and no other request is admitted anywhere on the host (a counter shared
//!   by all children, [`crate::prefork::HostCounter`]). On the 2-core test host this layout matched
//!   `prefork` at medium and high but lost 5-9% to `pinned` at low, where the shared layout does
//!   not.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use rayon::prelude::*;
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use pipeline::placement::{self, CpuId};

use crate::admission::{Reservation, Shortfall};
use crate::api::{self, Failure, SizeLimits};
use crate::kernel::{self, Matrix, Overflow, Path};
use crate::workload;

/// Default admission bound per model: requests waiting or running. 60 users (the largest load
/// of the study) fit with room to spare; beyond this a client gets 503 rather than a long queue.
pub const QUEUE_DEPTH_MAX_DEFAULT: usize = 256;
/// Splitting a request across cores must be measured this much faster than serial (×1.2).
const PARALLEL_GAIN_NUM: u64 = 6;
const PARALLEL_GAIN_DEN: u64 = 5;
/// The in-process adaptive executor hands bodies up to this size to its pool even though their
/// work is short: small requests are many, and the pool spreads them over every core as they
/// come, where inline they stay on the reactor thread that read them. Paired runs on the 2-core
/// host at low (10.7 KB bodies): through the pool 1.09× the per-core layout's inline processing
/// at 30 and 60 users (16 rounds); inline in this process 0.935× prefork at 60 users (10
/// rounds), where pinned matched prefork.
pub const SMALL_BODY_BYTES_MAX: usize = 32 << 10;
/// Bodies above [`SMALL_BODY_BYTES_MAX`] and up to this size run inline on the reactor thread
/// that read them (which blocks that thread for one such body's work, about 1 ms at 256 KiB on
/// the test host): no thread switch is paid, and the body is used on the core where it was
/// read. Larger bodies go to a worker, so the reactor keeps reading other connections while one
/// computes; inline, such a body's sender stalled on a full receive buffer. Paired runs on the
/// 2-core host, inline against a hand-off: per-core children +4.3% and +1.9% at medium-600 (129
/// KB) × 10 and × 60 users, +3.6% at medium-1000 (211 KB) × 30 (20 rounds), but -2.9% with a 24%
/// higher p99 at high (418 KB) × 60; in one process with medium bodies inline, 1.05-1.10×
/// pinned at medium (16 rounds).
pub const INLINE_BODY_BYTES_MAX: usize = 256 << 10;
/// Request sizes (rows of A in the study's shape) tried by the calibration.
const CALIBRATION_ROWS: [usize; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];
/// Repetitions per calibration point; the minimum is kept (least disturbed by other load).
const CALIBRATION_REPEATS: usize = 5;

/// An execution model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Model {
    /// One worker thread handles every request.
    Single,
    /// A fixed thread pool computes the rows of each request in parallel.
    Pool,
    /// One pinned worker per core, each request handled whole by one worker.
    Pinned,
    /// N processes sharing the port with SO_REUSEPORT, each pinned to one core.
    Prefork,
    /// Per request by size: inline on the reactor, a pinned pool, or all cores when they idle
    /// (split size calibrated at start-up).
    Adaptive,
}

impl Model {
    /// The models one process serves side by side (prefork is a whole-process mode).
    pub const IN_PROCESS: [Model; 4] = [Model::Single, Model::Pool, Model::Pinned, Model::Adaptive];
    /// Every model, in the order reports list them.
    pub const ALL: [Model; 5] =
        [Model::Single, Model::Pool, Model::Pinned, Model::Prefork, Model::Adaptive];

    /// The lower-case name used in routes, flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            Model::Single => "single",
            Model::Pool => "pool",
            Model::Pinned => "pinned",
            Model::Prefork => "prefork",
            Model::Adaptive => "adaptive",
        }
    }
}

impl std::str::FromStr for Model {
    type Err = crate::WebError;

    /// A model by its [`Model::name`], ignoring case.
    fn from_str(name: &str) -> Result<Model, crate::WebError> {
        Model::ALL.into_iter().find(|model| model.name().eq_ignore_ascii_case(name)).ok_or_else(
            || {
                crate::WebError::BadInput(format!(
                    "unknown model {name:?}: use single, pool, pinned, prefork or adaptive"
                ))
            },
        )
    }
}

/// An HTTP status and a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    /// The failure body for `failure`, echoing the request id when one was read.
    pub fn failure(id: Option<&RawValue>, failure: &Failure) -> Reply {
        let mut body = Vec::new();
        api::write_failure(id, failure, &mut body);
        Reply { status: failure.code.http_status(), body }
    }
}

/// How one request's multiplication runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    /// On the calling thread.
    Serial,
    /// Output rows split across the rayon pool the caller runs in.
    DataParallel,
}

/// What running one request under a model gave.
pub struct Done {
    /// The reply, or `Err(work_bytes)`: the request needs that much held before it is
    /// multiplied (its product and answer), and its lane had no room at once; the caller waits
    /// for the room (a worker must not) and runs it again.
    pub reply: Result<Reply, usize>,
    /// The request's reservation, to hold until its reply is written; `None` when it ran
    /// without one, or was refused before it ran.
    pub room: Option<Reservation>,
}

impl Done {
    fn refused(failure: &Failure) -> Done {
        Done { reply: Ok(Reply::failure(None, failure)), room: None }
    }
}

/// The whole CPU side of one request: parse, validate, multiply, render.
pub fn process(body: &[u8], limits: &SizeLimits, compute: Compute) -> Reply {
    // Without a reservation nothing is waited for, so the error cannot occur.
    process_within(body, limits, compute, None).unwrap_or_else(|work_bytes| {
        Reply::failure(None, &Failure::answer_room_full(work_bytes, std::time::Duration::ZERO))
    })
}

/// [`process`] within `room`: once the request is parsed, and before it is multiplied, `room`
/// must hold the request's [`work_bytes`](api::Request::work_bytes); `Err` with them when its
/// lane has no room at once.
fn process_within(
    body: &[u8],
    limits: &SizeLimits,
    compute: Compute,
    room: Option<&mut Reservation>,
) -> Result<Reply, usize> {
    let request = match api::parse_request(body, limits) {
        Ok(request) => request,
        Err((id, failure)) => return Ok(Reply::failure(id, &failure)),
    };
    if let Some(room) = room {
        let work_bytes = request.work_bytes(body.len());
        match room.try_hold(work_bytes) {
            Ok(()) => {}
            Err(Shortfall::Lane) => return Err(work_bytes),
            Err(Shortfall::Connection { held_bytes, share_bytes }) => {
                let failure = Failure::connection_share_full(held_bytes, share_bytes);
                return Ok(Reply::failure(Some(request.id), &failure));
            }
        }
    }
    let product = match compute {
        Compute::Serial => kernel::multiply(&request.a, &request.b),
        Compute::DataParallel => multiply_parallel(&request.a, &request.b),
    };
    Ok(match product {
        Ok(product) => {
            let mut body = Vec::new();
            api::write_success(request.id, &product, &mut body);
            Reply { status: 200, body }
        }
        Err(overflow) => Reply::failure(Some(request.id), &overflow.into()),
    })
}

/// [`process_within`] that turns a panic (a bug) into HTTP 500 so the worker keeps serving.
fn process_guarded(
    body: &[u8],
    limits: &SizeLimits,
    compute: Compute,
    room: Option<&mut Reservation>,
) -> Result<Reply, usize> {
    catch_unwind(AssertUnwindSafe(|| process_within(body, limits, compute, room))).unwrap_or_else(
        |_| {
            tracing::error!("request processing panicked; answered 500");
            Ok(Reply { status: 500, body: br#"{"errorMessage":"internal error"}"#.to_vec() })
        },
    )
}

/// Runs `job` on the calling thread, calls `leave` (the job's admission, left before the
/// answer goes so the next request finds its room), and sends the answer with its reservation.
fn answer_job(job: Job, limits: &SizeLimits, compute: Compute, leave: impl FnOnce()) {
    let Job { body, mut room, reply } = job;
    let done = Done { reply: process_guarded(&body, limits, compute, room.as_mut()), room };
    leave();
    // The client may have gone away; its answer (and its reservation) simply drop.
    let _ = reply.send(done);
}

/// `a · b` with output rows split into one chunk per thread of the current rayon pool.
fn multiply_parallel(a: &Matrix, b: &Matrix) -> Result<Matrix, Overflow> {
    let path = Path::for_operands(a, b);
    let rows_per_chunk = a.rows.div_ceil(rayon::current_num_threads()).max(1);
    let mut cells = vec![0; a.rows * b.cols];
    cells.par_chunks_mut(rows_per_chunk * b.cols).enumerate().try_for_each(|(chunk, out)| {
        let first = chunk * rows_per_chunk;
        kernel::multiply_rows(a, b, path, first..first + out.len() / b.cols, out)
    })?;
    Ok(Matrix::from_cells(a.rows, b.cols, cells))
}

/// Settings shared by every executor.
#[derive(Debug, Clone, Copy)]
pub struct ExecConfig {
    pub limits: SizeLimits,
    /// Worker threads of the multi-worker models (default: the allowed CPUs).
    pub workers: usize,
    /// Admission bound: requests waiting or running per model.
    pub queue_depth_max: usize,
}

struct Job {
    body: Bytes,
    room: Option<Reservation>,
    reply: oneshot::Sender<Done>,
}

/// Counts requests admitted and not yet answered; refuses past the bound.
struct Admission {
    in_flight: AtomicUsize,
    bound: usize,
    /// In an adaptive child: the same count over every process of the layout.
    host_in_flight: Option<&'static AtomicUsize>,
}

impl Admission {
    fn new(bound: usize, host_in_flight: Option<&'static AtomicUsize>) -> Admission {
        Admission { in_flight: AtomicUsize::new(0), bound, host_in_flight }
    }

    fn try_enter(&self) -> bool {
        // Relaxed: the counters only bound admission and guide a choice (is the host idle?);
        // the job itself is published to the worker by the channel's or pool's own
        // synchronisation, not through them, and a stale reading only makes one request
        // serial or split.
        let before = self.in_flight.fetch_add(1, Ordering::Relaxed);
        if before >= self.bound {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        if let Some(host) = self.host_in_flight {
            host.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    fn leave(&self) {
        // Relaxed: see try_enter.
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(host) = self.host_in_flight {
            host.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether the caller's request is the only one admitted on the host (adaptive children).
    fn alone_on_host(&self) -> bool {
        // Relaxed: see try_enter.
        self.host_in_flight.is_some_and(|host| host.load(Ordering::Relaxed) == 1)
    }

    fn current(&self) -> usize {
        // Relaxed: a heuristic reading (are cores idle?); a stale value only changes a choice.
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// The start-up measurement that sets the adaptive model's split size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    /// Bodies from this size are split across idle cores (`usize::MAX`: never).
    pub parallel_body_bytes_min: usize,
}

impl Calibration {
    /// Times serial and data-parallel processing of study-shaped requests on `pool`.
    pub fn measure(pool: &rayon::ThreadPool, limits: &SizeLimits) -> Calibration {
        let mut parallel_body_bytes_min = usize::MAX;
        for rows in CALIBRATION_ROWS {
            let body = workload::Shape::study(rows).request_body(1, rows as u64);
            let serial_ns = fastest_ns(|| process(&body, limits, Compute::Serial));
            let parallel_ns =
                fastest_ns(|| pool.install(|| process(&body, limits, Compute::DataParallel)));
            let splitting_pays = parallel_ns * PARALLEL_GAIN_NUM < serial_ns * PARALLEL_GAIN_DEN;
            if splitting_pays && parallel_body_bytes_min == usize::MAX {
                parallel_body_bytes_min = body.len();
            }
            tracing::debug!(rows, serial_ns, parallel_ns, "adaptive calibration point");
        }
        Calibration { parallel_body_bytes_min }
    }

    /// Whether a body of `body_bytes` is split across cores: only while `cores_idle`, and only
    /// from the size where splitting measured faster.
    pub fn splits(&self, body_bytes: usize, cores_idle: bool) -> bool {
        cores_idle && body_bytes >= self.parallel_body_bytes_min
    }

    /// Where the in-process adaptive model runs a body of `body_bytes`. The split is decided
    /// first because the calibration measured it faster; a body that does not split runs inline
    /// when it is medium-sized, since a hand-off measured slower there. Deciding the inline
    /// case after the split (not by the split size alone) keeps medium bodies inline under load
    /// whatever the calibration found: it found "never" on some starts and 57 KB on another.
    pub fn placement(&self, body_bytes: usize, cores_idle: bool) -> Placement {
        if self.splits(body_bytes, cores_idle) {
            Placement::Pool(Compute::DataParallel)
        } else if body_bytes > SMALL_BODY_BYTES_MAX && body_bytes <= INLINE_BODY_BYTES_MAX {
            Placement::Inline
        } else {
            Placement::Pool(Compute::Serial)
        }
    }
}

/// Where the adaptive model runs one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the reactor thread that read the body.
    Inline,
    /// On the pinned pool, serial or split.
    Pool(Compute),
}

/// The start-up line that reports the adaptive thresholds.
impl std::fmt::Display for Calibration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "adaptive calibration: split ")?;
        match self.parallel_body_bytes_min {
            usize::MAX => write!(f, "never (splitting measured no faster)")?,
            bytes => write!(f, "bodies from {bytes} bytes while cores idle")?,
        }
        write!(f, "; otherwise inline on the reactor up to {INLINE_BODY_BYTES_MAX} bytes")?;
        write!(f, " (shared layout: from {} bytes)", SMALL_BODY_BYTES_MAX + 1)
    }
}

/// Calibrates the adaptive thresholds on a pool of `workers` pinned threads, then drops it.
pub fn calibrate(workers: usize, limits: &SizeLimits) -> std::io::Result<Calibration> {
    let pool = rayon_pool(Model::Adaptive, workers, true)?;
    Ok(Calibration::measure(&pool, limits))
}

/// The fastest of [`CALIBRATION_REPEATS`] runs (the least disturbed by other load).
fn fastest_ns(mut run: impl FnMut() -> Reply) -> u64 {
    let mut timed_ns = || {
        let start = Instant::now();
        let reply = run();
        assert_eq!(reply.status, 200, "calibration requests are well-formed");
        start.elapsed().as_nanos() as u64
    };
    (0..CALIBRATION_REPEATS).map(|_| timed_ns()).min().unwrap_or(u64::MAX)
}

enum Inner {
    /// `single` and `pinned`: workers taking whole requests from one bounded channel.
    Queue { jobs: crossbeam::channel::Sender<Job> },
    /// `pool`: every request split across the pool.
    Pool { pool: rayon::ThreadPool, admission: Arc<Admission> },
    /// `adaptive`: inline, serial or split, per request.
    Adaptive { pool: rayon::ThreadPool, admission: Arc<Admission>, calibration: Calibration },
    /// `adaptive` in one process of the per-core layout: bodies up to [`INLINE_BODY_BYTES_MAX`]
    /// that will not split inline on the reactor, the others handed (FIFO) to a worker on the
    /// same core, which splits them over every core while the host idles.
    Child {
        admission: Arc<Admission>,
        calibration: Calibration,
        jobs: crossbeam::channel::Sender<Job>,
    },
}

/// One model's workers and admission bound.
pub struct Executor {
    model: Model,
    limits: SizeLimits,
    inner: Inner,
}

impl Executor {
    /// Starts the model's workers (and, for `adaptive`, calibrates).
    pub fn start(model: Model, config: &ExecConfig) -> std::io::Result<Executor> {
        assert!(config.workers >= 1 && config.queue_depth_max >= 1);
        let admission = || Arc::new(Admission::new(config.queue_depth_max, None));
        let inner = match model {
            Model::Single | Model::Prefork => {
                Inner::Queue { jobs: spawn_queue_workers(model, 1, false, config)? }
            }
            Model::Pinned => {
                Inner::Queue { jobs: spawn_queue_workers(model, config.workers, true, config)? }
            }
            Model::Pool => Inner::Pool {
                pool: rayon_pool(model, config.workers, false)?,
                admission: admission(),
            },
            Model::Adaptive => {
                let pool = rayon_pool(model, config.workers, true)?;
                let calibration = Calibration::measure(&pool, &config.limits);
                tracing::info!(?calibration, "adaptive model calibrated");
                Inner::Adaptive { pool, admission: admission(), calibration }
            }
        };
        Ok(Executor { model, limits: config.limits, inner })
    }

    /// The adaptive model of one process of the per-core layout, on CPU `cpu`: bodies up to
    /// [`INLINE_BODY_BYTES_MAX`] run inline on the reactor unless they may split; the others go
    /// to one worker thread pinned to `cpu`, which splits a body of at least
    /// `thresholds.parallel_body_bytes_min` over a pool of `config.workers` threads pinned
    /// round-robin over the allowed CPUs (call before pinning the process) when it is the only
    /// request admitted on the host: `host_in_flight` counts them over every process of the
    /// layout, queued ones included, so under load (any other request waiting or computing
    /// anywhere) nothing splits.
    pub fn start_child(
        config: &ExecConfig,
        thresholds: Calibration,
        cpu: CpuId,
        host_in_flight: &'static AtomicUsize,
    ) -> std::io::Result<Executor> {
        assert!(config.workers >= 1 && config.queue_depth_max >= 1);
        let admission = Arc::new(Admission::new(config.queue_depth_max, Some(host_in_flight)));
        // Admission bounds the requests in the channel plus the one computing, so the channel
        // never refuses a request admission let in.
        let (jobs, queue) = crossbeam::channel::bounded::<Job>(config.queue_depth_max);
        let worker = ChildWorker {
            pool: rayon_pool(Model::Adaptive, config.workers, true)?,
            admission: Arc::clone(&admission),
            parallel_body_bytes_min: thresholds.parallel_body_bytes_min,
            limits: config.limits,
        };
        std::thread::Builder::new().name("web-adaptive-worker".into()).spawn(move || {
            if let Err(error) = placement::pin_current_thread(&[cpu]) {
                tracing::warn!(cpu, %error, "could not pin the adaptive worker; running unpinned");
            }
            worker.serve(&queue);
        })?;
        let inner = Inner::Child { admission, calibration: thresholds, jobs };
        Ok(Executor { model: Model::Adaptive, limits: config.limits, inner })
    }

    pub fn model(&self) -> Model {
        self.model
    }

    /// The adaptive model's thresholds (`None` for the fixed models).
    pub fn calibration(&self) -> Option<Calibration> {
        match &self.inner {
            Inner::Adaptive { calibration, .. } => Some(*calibration),
            _ => None,
        }
    }

    /// Runs one request under this model within `room` (see [`Done`]); never blocks the
    /// calling (reactor) thread beyond the adaptive model's inline budget, except in an adaptive
    /// child, whose reactor owns its core.
    pub async fn execute(&self, body: Bytes, room: Option<Reservation>) -> Done {
        let limits = self.limits;
        let (reply, answer) = oneshot::channel();
        let admitted = match &self.inner {
            Inner::Queue { jobs } => jobs.try_send(Job { body, room, reply }).is_ok(),
            Inner::Pool { pool, admission } => {
                let job = Job { body, room, reply };
                let admitted = admission.try_enter();
                if admitted {
                    run_on_pool(pool, admission, job, Compute::DataParallel, limits);
                }
                admitted
            }
            Inner::Adaptive { pool, admission, calibration } => {
                if !admission.try_enter() {
                    return Done::refused(&Failure::busy());
                }
                // The count includes this request and every one inline on a reactor.
                let cores_idle = admission.current() < pool.current_num_threads();
                match calibration.placement(body.len(), cores_idle) {
                    Placement::Inline => return run_inline(admission, &body, &limits, room),
                    Placement::Pool(compute) => {
                        run_on_pool(pool, admission, Job { body, room, reply }, compute, limits);
                        true
                    }
                }
            }
            Inner::Child { admission, calibration, jobs } => {
                if !admission.try_enter() {
                    return Done::refused(&Failure::busy());
                }
                let may_split = calibration.splits(body.len(), admission.alone_on_host());
                if !may_split && body.len() <= INLINE_BODY_BYTES_MAX {
                    return run_inline(admission, &body, &limits, room);
                }
                // The worker leaves the admission when it has answered.
                let sent = jobs.try_send(Job { body, room, reply });
                if sent.is_err() {
                    admission.leave();
                }
                sent.is_ok()
            }
        };
        if !admitted {
            return Done::refused(&Failure::busy());
        }
        // The workers always answer (panics are caught); a closed channel means shutdown.
        answer.await.unwrap_or_else(|_| Done::refused(&Failure::busy()))
    }
}

/// The adaptive child's worker: takes the bodies too large to run inline, in arrival order, on
/// the child's core (as `prefork`'s worker does), so its reactor keeps reading connections while
/// a request computes.
struct ChildWorker {
    pool: rayon::ThreadPool,
    admission: Arc<Admission>,
    parallel_body_bytes_min: usize,
    limits: SizeLimits,
}

impl ChildWorker {
    /// Serves until the executor (the only sender) is dropped.
    fn serve(&self, queue: &crossbeam::channel::Receiver<Job>) {
        while let Ok(job) = queue.recv() {
            self.process(job);
        }
    }

    /// Split over every core when this is the only request admitted on the host and the body is
    /// at least the calibrated split size.
    fn process(&self, job: Job) {
        let leave = || self.admission.leave();
        if job.body.len() >= self.parallel_body_bytes_min && self.admission.alone_on_host() {
            self.pool.install(|| answer_job(job, &self.limits, Compute::DataParallel, leave));
        } else {
            answer_job(job, &self.limits, Compute::Serial, leave);
        }
    }
}

/// Runs an admitted request on the calling (reactor) thread, serially. There is no await until
/// it is answered, so the admission is left exactly once, and panics are caught.
fn run_inline(
    admission: &Admission,
    body: &[u8],
    limits: &SizeLimits,
    mut room: Option<Reservation>,
) -> Done {
    let reply = process_guarded(body, limits, Compute::Serial, room.as_mut());
    admission.leave();
    Done { reply, room }
}

/// Runs an admitted `job` on `pool`, which leaves the admission when it has answered.
fn run_on_pool(
    pool: &rayon::ThreadPool,
    admission: &Arc<Admission>,
    job: Job,
    compute: Compute,
    limits: SizeLimits,
) {
    let admission = Arc::clone(admission);
    pool.spawn(move || {
        answer_job(job, &limits, compute, || admission.leave());
    });
}

fn spawn_queue_workers(
    model: Model,
    count: usize,
    pinned: bool,
    config: &ExecConfig,
) -> std::io::Result<crossbeam::channel::Sender<Job>> {
    // The channel bounds waiting requests; the workers hold the running ones.
    let (jobs, queue) = crossbeam::channel::bounded::<Job>(config.queue_depth_max);
    let allowed = allowed_cpus()?;
    for index in 0..count {
        let queue = queue.clone();
        let limits = config.limits;
        let cpu = pinned.then(|| cpu_for_worker(&allowed, index));
        std::thread::Builder::new().name(format!("web-{}-{index}", model.name())).spawn(
            move || {
                if let Some(cpu) = cpu
                    && let Err(error) = placement::pin_current_thread(&[cpu])
                {
                    tracing::warn!(cpu, %error, "could not pin worker; running unpinned");
                }
                // Ends when the executor (the only sender) is dropped.
                while let Ok(job) = queue.recv() {
                    // The channel's bound is the admission: nothing to leave.
                    answer_job(job, &limits, Compute::Serial, || {});
                }
            },
        )?;
    }
    Ok(jobs)
}

fn rayon_pool(model: Model, workers: usize, pinned: bool) -> std::io::Result<rayon::ThreadPool> {
    let allowed = allowed_cpus()?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(workers)
        .thread_name(move |index| format!("web-{}-{index}", model.name()))
        .start_handler(move |index| {
            let cpu = cpu_for_worker(&allowed, index);
            if pinned && let Err(error) = placement::pin_current_thread(&[cpu]) {
                tracing::warn!(%error, "could not pin pool worker; running unpinned");
            }
        })
        .build()
        .map_err(std::io::Error::other)
}

/// The CPUs this process may use (its affinity mask: taskset, cgroup cpuset).
pub fn allowed_cpus() -> std::io::Result<Vec<CpuId>> {
    placement::current_affinity().map_err(std::io::Error::other)
}

/// The CPU of worker `index`: workers take the allowed CPUs round-robin.
pub fn cpu_for_worker(allowed: &[CpuId], index: usize) -> CpuId {
    assert!(!allowed.is_empty(), "a process always has at least one allowed CPU");
    allowed[index % allowed.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ExecConfig {
        ExecConfig { limits: SizeLimits::default(), workers: 2, queue_depth_max: 4 }
    }

    #[test]
    fn every_model_gives_the_same_answer() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let body = Bytes::from(workload::Shape::study(70).request_body(9, 3));
        let expected = process(&body, &SizeLimits::default(), Compute::Serial);
        assert_eq!(expected.status, 200);
        for model in Model::IN_PROCESS {
            let executor = Executor::start(model, &config()).unwrap();
            let done = runtime.block_on(executor.execute(body.clone(), None));
            assert_eq!(done.reply, Ok(expected.clone()), "{model:?}");
        }
    }

    #[test]
    fn calibration_finds_a_measured_split_size_or_never() {
        let pool = rayon_pool(Model::Adaptive, 2, false).unwrap();
        let calibration = Calibration::measure(&pool, &SizeLimits::default());
        let sizes: Vec<usize> = CALIBRATION_ROWS
            .iter()
            .map(|&rows| workload::Shape::study(rows).request_body(1, rows as u64).len())
            .collect();
        let split = calibration.parallel_body_bytes_min;
        assert!(split == usize::MAX || sizes.contains(&split), "{calibration:?}");
    }

    #[test]
    fn bodies_split_while_cores_idle_and_medium_ones_run_inline_otherwise() {
        use Placement::{Inline, Pool};
        let medium_bytes = SMALL_BODY_BYTES_MAX + 1;
        let large_bytes = INLINE_BODY_BYTES_MAX + 1;
        let split_from_5000 = Calibration { parallel_body_bytes_min: 5000 };
        assert_eq!(split_from_5000.placement(4999, true), Pool(Compute::Serial));
        assert_eq!(split_from_5000.placement(medium_bytes, true), Pool(Compute::DataParallel));
        assert_eq!(split_from_5000.placement(medium_bytes, false), Inline, "busy: inline");
        assert_eq!(split_from_5000.placement(INLINE_BODY_BYTES_MAX, false), Inline);
        assert_eq!(split_from_5000.placement(large_bytes, false), Pool(Compute::Serial));
        assert_eq!(split_from_5000.placement(large_bytes, true), Pool(Compute::DataParallel));
        let never_split = Calibration { parallel_body_bytes_min: usize::MAX };
        assert_eq!(never_split.placement(medium_bytes, true), Inline);
        assert_eq!(never_split.placement(large_bytes, true), Pool(Compute::Serial));
        assert!(!never_split.splits(usize::MAX - 1, true));
        let line = split_from_5000.to_string();
        assert!(line.contains("from 5000 bytes") && line.contains("up to 262144 bytes"), "{line}");
        assert!(never_split.to_string().contains("split never"));
    }

    #[test]
    fn admission_refuses_past_the_bound() {
        let admission = Admission::new(2, None);
        assert!(admission.try_enter() && admission.try_enter());
        assert!(!admission.try_enter());
        admission.leave();
        assert!(admission.try_enter());
        assert_eq!(admission.current(), 2);
    }
}
