//! The web service's load driver against a real server: closed and open loops, answers
//! counted and checked (a non-200 answer and a wrong product are errors).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use labs::web_load::{Exchange, LoadMode, Window, drive, exchanges};
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
