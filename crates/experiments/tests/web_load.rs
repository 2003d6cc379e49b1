//! The web service's load driver against a real server: closed and open loops, answers
//! counted and checked (a non-200 answer and a wrong product are errors).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use experiments::web_load::{Exchange, LoadMode, Window, drive, exchanges};
use web::api::SizeLimits;
use web::exec::{ExecConfig, Model};
use web::server::{ServeBounds, Server, ServerConfig};
use web::workload::Complexity;

/// A pinned-model server on a free loopback port.
fn start(queue_depth_max: usize, workers: usize) -> Server {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ServerConfig {
        default_model: Model::Pinned,
        exec: ExecConfig { limits: SizeLimits::default(), workers, queue_depth_max },
        body_bytes_max: web::server::BODY_BYTES_MAX_DEFAULT,
        io_threads: 2,
        bounds: ServeBounds::default(),
    };
    Server::start(listener, config).unwrap()
}

#[test]
fn load_lab_drives_closed_and_open_loops() {
    let server = start(64, 2);
    let low = exchanges(Complexity::Low);
    let url = format!("http://{}/matrix/pinned", server.local_addr());
    let window = Window {
        warmup: Duration::ZERO,
        measure: Duration::from_millis(300),
        interval: Duration::from_millis(50),
        request_timeout: Duration::from_secs(5),
    };
    let measured = drive(&url, Arc::clone(&low), LoadMode::Closed { users: 3 }, window).unwrap();
    // Answers inside the window, also of requests sent before it: at least the driver's count.
    let answered = measured.report.answered_in_window;
    assert!(answered >= measured.report.ok && measured.throughput_per_s > 0.0);
    let closed = measured.report;
    assert!(
        closed.ok > 0 && closed.errors == 0 && closed.timeouts == 0,
        "{:?}",
        closed.first_error
    );
    assert_eq!(closed.latency.count(), closed.ok);
    // Throughput over time: one count per 50 ms interval, together every completion.
    assert_eq!(closed.throughput.counts.len(), 6);
    assert_eq!(closed.throughput.counts.iter().sum::<u64>(), closed.ok);
    let open =
        drive(&url, Arc::clone(&low), LoadMode::Open { rate_per_s: 200.0 }, window).unwrap().report;
    // 200/s for 0.3 s schedules 60 requests; all must be answered and none lost.
    assert_eq!((open.ok, open.errors, open.timeouts), (60, 0, 0));
    let missing = format!("http://{}/matrix/nonexistent", server.local_addr());
    let failing =
        drive(&missing, Arc::clone(&low), LoadMode::Closed { users: 1 }, window).unwrap().report;
    assert!(failing.ok == 0 && failing.errors > 0, "a non-200 answer is an error");
    // A wrong product is an error too: the first answer of each user is always validated.
    let body = Bytes::from(Complexity::Low.shape().request_body(1, 1));
    let wrong = Arc::new(vec![Exchange { body, expected_rows: serde_json::json!([[0]]) }]);
    let checked = drive(&url, wrong, LoadMode::Closed { users: 2 }, window).unwrap().report;
    assert!(checked.errors >= 2, "{checked:?}");
    assert_eq!(checked.first_error.as_deref(), Some("wrong product in the answer"));
}

/// Answers every HTTP/1.1 POST (keep-alive) with `{"rows":[[1]]}` after `service`: a server
/// of known service time. `None`: accepts and reads, never answers.
fn fixed_time_server(service: Option<Duration>) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while let Ok(read @ 1..) = socket.read(&mut chunk).await {
                        buffer.extend_from_slice(&chunk[..read]);
                        let Some(length) = whole_request(&buffer) else { continue };
                        buffer.drain(..length);
                        let Some(service) = service else { continue };
                        tokio::time::sleep(service).await;
                        let body = r#"{"rows":[[1]]}"#;
                        let answer = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    });
    address
}

/// The length of the first whole request in `bytes` (headers and `content-length` body).
fn whole_request(bytes: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(bytes).ok()?;
    let headers_end = text.find("\r\n\r\n")? + 4;
    let length = text[..headers_end]
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase().strip_prefix("content-length:")?.trim().parse().ok()
        })
        .unwrap_or(0usize);
    (bytes.len() >= headers_end + length).then_some(headers_end + length)
}

fn one_exchange() -> Arc<Vec<Exchange>> {
    let body = Bytes::from(Complexity::Low.shape().request_body(1, 1));
    Arc::new(vec![Exchange { body, expected_rows: serde_json::json!([[1]]) }])
}

#[test]
fn open_loop_latency_is_the_service_time_not_the_gap_between_arrivals() {
    const SERVICE: Duration = Duration::from_millis(2);
    let url = format!("http://{}/matrix", fixed_time_server(Some(SERVICE)));
    let window = Window {
        warmup: Duration::from_millis(100),
        measure: Duration::from_millis(1000),
        interval: Duration::from_millis(100),
        request_timeout: Duration::from_secs(5),
    };
    // 10/s: a 100 ms gap between arrivals, fifty times the service time. A latency taken at
    // the next send (the bug this guards) is about the gap; the right one is the service time
    // plus loopback HTTP and what a loaded CI host adds, far below half the gap.
    let measured = drive(&url, one_exchange(), LoadMode::Open { rate_per_s: 10.0 }, window);
    let report = measured.unwrap().report;
    assert_eq!((report.ok, report.errors, report.timeouts), (10, 0, 0), "{:?}", report.first_error);
    let p50 = report.latency.value_at_percentile_ns(50.0);
    let (low, high) = (SERVICE.as_nanos() as u64, (SERVICE + Duration::from_millis(30)).as_nanos());
    assert!(low <= p50 && u128::from(p50) <= high, "p50 {p50} ns, service 2 ms, gap 100 ms");
    assert_eq!(report.send_lag.count(), 10, "the generator's own lag is kept beside it");
}

#[test]
fn a_cell_with_no_good_answer_says_why() {
    let window = Window {
        warmup: Duration::ZERO,
        measure: Duration::from_millis(200),
        interval: Duration::from_millis(100),
        request_timeout: Duration::from_millis(100),
    };
    let closed = LoadMode::Closed { users: 2 };
    // Nothing listens on port 1: every request fails, and the first failure's chain is named.
    let refused = "http://127.0.0.1:1/matrix";
    let measured = drive(refused, one_exchange(), closed, window).unwrap();
    let why = measured.nothing_answered(refused, &window).expect("nothing was answered");
    assert!(why.to_string().contains("every request to http://127.0.0.1:1/matrix failed"), "{why}");
    assert!(why.to_string().to_lowercase().contains("refused"), "{why}");
    // A server that reads and never answers: timeouts, named with the timeout.
    let silent = format!("http://{}/matrix", fixed_time_server(None));
    let open = LoadMode::Open { rate_per_s: 20.0 };
    let measured = drive(&silent, one_exchange(), open, window).unwrap();
    let why = measured.nothing_answered(&silent, &window).expect("nothing was answered");
    assert!(why.to_string().contains("timed out after 100ms"), "{why}");
    // One good answer is enough to measure.
    let answering = format!("http://{}/matrix", fixed_time_server(Some(Duration::ZERO)));
    let measured = drive(&answering, one_exchange(), closed, window).unwrap();
    assert!(measured.nothing_answered(&answering, &window).is_none());
}
