//! Admission by work under a load of large requests: the server (a child process of this test,
//! so its memory is its own) reads at most its large lane's worth of large bodies at once, so its
//! peak resident memory stays bounded, and small requests sent meanwhile are answered without
//! waiting behind the large ones. Before admission by work, all the large bodies were read at
//! once and the small requests queued behind them in the model's FIFO.
//!
//! `harness = false`: this binary re-executes itself as the server ([`SERVER_ENV`]).
//!
//! With `WEB_LARGE_LOAD_MEASURE=1` it measures instead of testing, with the served defaults
//! (model `adaptive` behind `/matrix`, default bounds and limits): 48 concurrent 2000×2000 ·
//! 2000×20 requests (15.6 MB bodies) while 20 small requests are sent one after another; it
//! prints the figures and asserts nothing. Run it in release:
//! `WEB_LARGE_LOAD_MEASURE=1 cargo test -p web --release --test large_load`.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use web::admission::WorkBounds;
use web::api::SizeLimits;
use web::client::JsonClient;
use web::exec::{ExecConfig, Model};
use web::server::{ServeBounds, Server, ServerConfig};
use web::workload::Shape;

const SERVER_ENV: &str = "LEANTIER_WEB_LARGE_LOAD_SERVER";
const MEASURE_ENV: &str = "WEB_LARGE_LOAD_MEASURE";
const EXAMPLE: &str = r#"{"requestId": 7, "matrixOne": {"columnCount": 2, "rows": [{"value": "1,2"}]},
    "matrixTwo": {"columnCount": 1, "rows": [{"value": "3"}, {"value": "4"}]}}"#;

/// The large requests: 1500×200 · 200×200, about 1.3 MB of body each (above the 1 MiB that
/// makes a body large).
const LARGE: Shape = Shape { rows_a: 1500, inner: 200, cols_b: 200 };
/// How many large requests are sent at once.
const LARGE_COUNT: usize = 48;
/// Body bound.
const BODY_BYTES_MAX: usize = 2 << 20;
/// The large lane: one large request's work at a time (its 300,000-cell product and its
/// answer's text, at most 8.7 MB, which outweigh its body).
fn large_lane_bytes() -> usize {
    let (rows, cols) = (LARGE.rows_a, LARGE.cols_b);
    let work = web::api::answer_bytes_max(rows, cols, "1".len()) + rows * cols * size_of::<i64>();
    work.max(BODY_BYTES_MAX)
}
/// How long a large request may wait for the lane before 503 (keeps the test short).
const ADMISSION_WAIT: Duration = Duration::from_secs(2);
/// Small requests sent one after another while the large ones are in flight.
const SMALL_COUNT: usize = 10;
/// The slowest a small request may be under the load: generous for a loaded 2-core host; the
/// large requests queued ahead of it took several seconds before.
const SMALL_LATENCY_MAX: Duration = Duration::from_millis(1500);
/// The server's peak resident memory above its idle size under the load (26-27 MiB measured with
/// one large request admitted at a time). Before, all 48 bodies (62 MB) were held at once, with
/// the operands of those computing: 110 MiB, and the first small request waited 45.8 s.
const PEAK_GROWTH_BYTES_MAX: u64 = 56 << 20;

fn main() {
    let measuring = std::env::var_os(MEASURE_ENV).is_some();
    if std::env::var_os(SERVER_ENV).is_some() {
        serve_until_stdin_closes(measuring);
        return;
    }
    if measuring {
        let large = Shape { rows_a: 2000, inner: 2000, cols_b: 20 };
        let figures = drive(large, 48, 20, "/matrix");
        println!("measured: {figures}");
        return;
    }
    large_requests_wait_in_their_lane_while_small_ones_are_answered();
    println!("test large_requests_wait_in_their_lane_while_small_ones_are_answered ... ok");
    println!("1 passed, 0 failed");
}

fn serve_until_stdin_closes(measuring: bool) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    if measuring {
        let config = ServerConfig {
            default_model: Model::Adaptive,
            exec: ExecConfig { limits: SizeLimits::default(), workers: 2, queue_depth_max: 256 },
            body_bytes_max: web::server::BODY_BYTES_MAX_DEFAULT,
            io_threads: 2,
            bounds: ServeBounds::default(),
        };
        return serve(listener, config);
    }
    let work = WorkBounds {
        large_work_bytes_max: large_lane_bytes(),
        wait_timeout: ADMISSION_WAIT,
        ..WorkBounds::default()
    };
    let config = ServerConfig {
        default_model: Model::Pinned,
        exec: ExecConfig { limits: SizeLimits::default(), workers: 2, queue_depth_max: 256 },
        body_bytes_max: BODY_BYTES_MAX,
        io_threads: 2,
        bounds: ServeBounds { work, ..ServeBounds::default() },
    };
    serve(listener, config);
}

fn serve(listener: std::net::TcpListener, config: ServerConfig) {
    let server = Server::start(listener, config).unwrap();
    println!("{}", server.local_addr());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// `VmHWM` (peak resident set) of process `pid`, in bytes.
fn peak_resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// What one run under the large-request load measured.
struct Figures {
    statuses: Vec<u16>,
    small_latencies: Vec<Duration>,
    idle_peak_bytes: u64,
    loaded_peak_bytes: u64,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let served = self.statuses.iter().filter(|&&status| status == 200).count();
        let mut sorted = self.small_latencies.clone();
        sorted.sort();
        write!(
            f,
            "{served} of {} large served (others 503); small requests: slowest {:?}, median {:?}; server peak RSS {} MiB idle, {} MiB under the load",
            self.statuses.len(),
            sorted.last().unwrap(),
            sorted[sorted.len() / 2],
            self.idle_peak_bytes >> 20,
            self.loaded_peak_bytes >> 20
        )
    }
}

/// Starts the server child, sends `large_count` requests of shape `large` at once to `path` and
/// `small_count` small ones one after another meanwhile.
fn drive(large: Shape, large_count: usize, small_count: usize, path: &str) -> Figures {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(SERVER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut addr = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut addr).unwrap();
    let addr: SocketAddr = addr.trim().parse().unwrap();
    let url = format!("http://{addr}{path}");
    let large = Bytes::from(large.request_body(1, 1));
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (idle_peak_bytes, small_latencies, statuses) = runtime.block_on(async {
        let client = JsonClient::default();
        // Warm: the first answers allocate the server's steady buffers.
        assert_eq!(client.post(&url, Bytes::from(EXAMPLE)).await.unwrap().0, 200);
        let idle_peak = peak_resident_bytes(child.id());
        let load: Vec<_> = (0..large_count)
            .map(|_| {
                let (url, body) = (url.clone(), large.clone());
                // A client each: one connection per large request, all at once.
                tokio::spawn(async move { JsonClient::default().post(&url, body).await.unwrap() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut small_latencies = Vec::new();
        for _ in 0..small_count {
            let sent = Instant::now();
            let (status, _) = client.post(&url, Bytes::from(EXAMPLE)).await.unwrap();
            small_latencies.push(sent.elapsed());
            assert_eq!(status, 200);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut statuses = Vec::new();
        for task in load {
            let (status, answer) = task.await.unwrap();
            if status == 503 {
                assert!(
                    answer.starts_with(br#"{"requestId":null,"errorCode":"009""#),
                    "{answer:?}"
                );
            }
            statuses.push(status);
        }
        (idle_peak, small_latencies, statuses)
    });
    let loaded_peak_bytes = peak_resident_bytes(child.id());
    drop(child.stdin.take());
    child.wait().unwrap();
    Figures { statuses, small_latencies, idle_peak_bytes, loaded_peak_bytes }
}

fn large_requests_wait_in_their_lane_while_small_ones_are_answered() {
    let large_bytes = LARGE.request_body(1, 1).len();
    assert!(large_bytes > 1 << 20 && large_bytes <= BODY_BYTES_MAX, "{large_bytes}");
    let figures = drive(LARGE, LARGE_COUNT, SMALL_COUNT, "/matrix/pinned");
    println!("large-load: {figures}");
    let Figures { statuses, small_latencies, idle_peak_bytes, loaded_peak_bytes } = figures;
    let peak_growth = loaded_peak_bytes.saturating_sub(idle_peak_bytes);
    let slowest = small_latencies.iter().max().unwrap();
    assert!(statuses.iter().all(|&status| status == 200 || status == 503), "{statuses:?}");
    assert!(statuses.contains(&200), "the lane serves large requests: {statuses:?}");
    assert!(*slowest < SMALL_LATENCY_MAX, "small requests waited: {small_latencies:?}");
    assert!(peak_growth < PEAK_GROWTH_BYTES_MAX, "peak RSS grew {} MiB", peak_growth >> 20);
    let _ = std::io::stdout().flush();
}
