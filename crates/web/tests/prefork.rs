//! The prefork model over real processes: this test binary re-executes itself as the children
//! (the role comes from the environment, as for the `leantier` binary), so it has its own
//! `main` (`harness = false`).

use std::time::Duration;

use bytes::Bytes;
use ops::endpoint::{Source, get};
use web::api::SizeLimits;
use web::client::JsonClient;
use web::exec::{Calibration, Compute, Model, process};
use web::fleet::Fleet;
use web::prefork::{ChildSpec, Prefork, child_spec_from_env, run_child};
use web::server::ServeBounds;
use web::workload::Shape;

const EXAMPLE: &str = r#"{"requestId": 7, "matrixOne": {"columnCount": 2, "rows": [{"value": "1,2"}]},
    "matrixTwo": {"columnCount": 1, "rows": [{"value": "3"}, {"value": "4"}]}}"#;

fn main() {
    if let Some(spec) = child_spec_from_env().expect("child spec") {
        run_child(&spec).expect("prefork child");
        return;
    }
    prefork_children_serve_and_die_with_the_parent();
    println!("test prefork_children_serve_and_die_with_the_parent ... ok");
    adaptive_children_split_or_inline_with_the_serial_answer();
    println!("test adaptive_children_split_or_inline_with_the_serial_answer ... ok");
    adaptive_children_answer_busy_past_the_bound();
    println!("test adaptive_children_answer_busy_past_the_bound ... ok");
    adaptive_children_are_dealt_equal_shares_of_connections();
    println!("test adaptive_children_are_dealt_equal_shares_of_connections ... ok");
    per_core_children_close_idle_connections_and_refuse_past_the_limit();
    println!("test per_core_children_close_idle_connections_and_refuse_past_the_limit ... ok");
    the_fleet_shows_every_child_and_is_ready_only_while_all_are();
    println!("test the_fleet_shows_every_child_and_is_ready_only_while_all_are ... ok");
    println!("6 passed, 0 failed");
}

fn template(model: Model) -> ChildSpec {
    ChildSpec {
        model,
        cpu: 0,
        pool_threads: 2,
        // The published example runs inline; the study-shaped requests of these tests go to
        // the worker and are large enough to split when nothing else computes.
        calibration: Calibration { parallel_body_bytes_min: EXAMPLE.len() + 1 },
        host_counter_fd: -1,
        dealt_channel_fd: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        dim_max: 100,
        cells_max: 10_000,
        answer_bytes_max: web::api::ANSWER_BYTES_MAX_DEFAULT,
        queue_depth_max: 16,
        body_bytes_max: 1 << 16,
        bounds: ServeBounds::default(),
        metrics_token: None,
    }
}

fn prefork_children_serve_and_die_with_the_parent() {
    let template = template(Model::Prefork);
    let exe = std::env::current_exe().unwrap();
    let prefork = Prefork::start(template.addr, 2, template, exe, &[]).unwrap();
    let url = format!("http://{}/matrix/prefork", prefork.local_addr());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        for _ in 0..20 {
            // A fresh client per request: new connections, spread by the kernel over children.
            let (status, body) =
                JsonClient::default().post(&url, Bytes::from(EXAMPLE)).await.unwrap();
            assert_eq!(status, 200);
            assert_eq!(body, Bytes::from_static(br#"{"requestId":"7","rows":[[11]]}"#));
        }
    });
    let children = prefork.child_ids();
    assert_eq!(children.len(), 2);
    assert!(children.iter().all(|&pid| process_exists(pid)), "children serve until stopped");
    drop(prefork);
    std::thread::sleep(Duration::from_millis(50));
    assert!(children.iter().all(|&pid| !process_exists(pid)), "children stop with the parent");
}

/// Ten connections opened at once reach the two children five each (SO_REUSEPORT's hash would
/// split them unevenly most of the time), counted as socket descriptors in each child.
fn adaptive_children_are_dealt_equal_shares_of_connections() {
    let template = template(Model::Adaptive);
    let exe = std::env::current_exe().unwrap();
    let children = Prefork::start(template.addr, 2, template, exe, &[]).unwrap();
    let pids = children.child_ids();
    let before: Vec<usize> = pids.iter().map(|&pid| sockets_of(pid)).collect();
    let connections: Vec<_> =
        (0..10).map(|_| std::net::TcpStream::connect(children.local_addr()).unwrap()).collect();
    let mut added = Vec::new();
    for _ in 0..200 {
        added = pids.iter().zip(&before).map(|(&pid, &was)| sockets_of(pid) - was).collect();
        if added.iter().sum::<usize>() == connections.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(added, vec![5, 5], "sockets added per child");
}

fn sockets_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// One request at a time (the host idles: split over the pool), then 8 at once on separate
/// connections (others compute: serial on each child's worker), then the small example (inline
/// on the reactor); every answer equals the serial one.
fn adaptive_children_split_or_inline_with_the_serial_answer() {
    let template = template(Model::Adaptive);
    let exe = std::env::current_exe().unwrap();
    let children = Prefork::start(template.addr, 2, template.clone(), exe, &[]).unwrap();
    let url = format!("http://{}/matrix/adaptive", children.local_addr());
    let body = Bytes::from(Shape::study(90).request_body(5, 11));
    let limits = SizeLimits {
        dim_max: template.dim_max,
        cells_max: template.cells_max,
        answer_bytes_max: template.answer_bytes_max,
    };
    let expected = process(&body, &limits, Compute::Serial);
    assert_eq!(expected.status, 200);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        for _ in 0..4 {
            let (status, answer) = JsonClient::default().post(&url, body.clone()).await.unwrap();
            assert_eq!((status, answer.to_vec()), (200, expected.body.clone()));
        }
        let concurrent = (0..8).map(|_| {
            let (url, body) = (url.clone(), body.clone());
            tokio::spawn(async move { JsonClient::default().post(&url, body).await.unwrap() })
        });
        for answer in concurrent.collect::<Vec<_>>() {
            let (status, answer) = answer.await.unwrap();
            assert_eq!((status, answer.to_vec()), (200, expected.body.clone()));
        }
        let (status, answer) =
            JsonClient::default().post(&url, Bytes::from(EXAMPLE)).await.unwrap();
        assert_eq!(
            (status, answer.to_vec()),
            (200, br#"{"requestId":"7","rows":[[11]]}"#.to_vec())
        );
    });
}

/// One admitted request per child: a burst of slow requests overflows the bound with code 009,
/// and the children keep serving.
fn adaptive_children_answer_busy_past_the_bound() {
    let template = ChildSpec {
        queue_depth_max: 1,
        dim_max: 1000,
        cells_max: 100_000,
        body_bytes_max: 1 << 20,
        ..template(Model::Adaptive)
    };
    let exe = std::env::current_exe().unwrap();
    let children = Prefork::start(template.addr, 2, template, exe, &[]).unwrap();
    let url = format!("http://{}/matrix/adaptive", children.local_addr());
    let body = Bytes::from(Shape::study(1000).request_body(1, 1));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let burst: Vec<_> = (0..24)
            .map(|_| {
                let (url, body) = (url.clone(), body.clone());
                tokio::spawn(async move { JsonClient::default().post(&url, body).await.unwrap() })
            })
            .collect();
        let mut statuses = Vec::new();
        for task in burst {
            let (status, answer) = task.await.unwrap();
            if status == 503 {
                let json: serde_json::Value = serde_json::from_slice(&answer).unwrap();
                assert_eq!(json["errorCode"], "009");
            }
            statuses.push(status);
        }
        assert!(statuses.contains(&503), "{statuses:?}");
        assert!(statuses.iter().all(|&s| s == 200 || s == 503), "{statuses:?}");
        // Fresh connections reach both children: neither may keep a stale count.
        for _ in 0..6 {
            let (status, _) = JsonClient::default().post(&url, Bytes::from(EXAMPLE)).await.unwrap();
            assert_eq!(status, 200);
        }
    });
}

/// The connection bounds hold in the per-core processes too (they serve through the same accept
/// loop): in both layouts, a connection past a child's limit gets 503 with code 010 while the
/// one it holds is in a request, and an idle connection is closed after the idle timeout.
fn per_core_children_close_idle_connections_and_refuse_past_the_limit() {
    use std::io::{Read, Write};
    let idle_timeout = Duration::from_secs(1);
    for model in [Model::Prefork, Model::Adaptive] {
        let mut template = template(model);
        template.bounds.connection.idle_timeout = idle_timeout;
        template.bounds.connection.connections_max = 1;
        let exe = std::env::current_exe().unwrap();
        // One child: every connection reaches it, whatever the layout spreads them by.
        let children = Prefork::start(template.addr, 1, template, exe, &[]).unwrap();
        let connect = || {
            let stream = std::net::TcpStream::connect(children.local_addr()).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
            stream
        };
        let mut held = connect();
        // A header begun: the connection is not idle, so it is not evicted for the next one.
        held.write_all(b"POST /matrix HTTP/1.1\r\n").unwrap();
        // Accepted and read first, so the child holds it before the second arrives.
        std::thread::sleep(Duration::from_millis(100));
        let mut refused = String::new();
        connect().read_to_string(&mut refused).unwrap();
        assert!(refused.starts_with("HTTP/1.1 503"), "{model:?}: {refused}");
        assert!(refused.contains(r#""errorCode":"010""#), "{model:?}: {refused}");
        drop(held);
        std::thread::sleep(Duration::from_millis(200));
        let mut idle = connect();
        let opened = std::time::Instant::now();
        let read = idle.read(&mut [0u8; 16]);
        assert!(matches!(read, Ok(0)), "{model:?}: the idle connection was not closed: {read:?}");
        assert!(opened.elapsed() < Duration::from_secs(5), "{model:?}");
    }
}

/// Each child answers the admin paths on the shared port and on its own; the parent's view
/// labels every child's series, and turns not ready once one child stops (SIGTERM: it drains
/// and exits) while the other still serves.
fn the_fleet_shows_every_child_and_is_ready_only_while_all_are() {
    let template = template(Model::Prefork);
    let exe = std::env::current_exe().unwrap();
    let children = Prefork::start(template.addr, 2, template, exe, &[]).unwrap();
    for addr in [children.local_addr()].iter().chain(children.admin_addrs()) {
        assert_eq!(get(*addr, "/health").unwrap().0, 200, "{addr}");
        assert_eq!(get(*addr, "/ready").unwrap().0, 200, "{addr}");
        assert_eq!(get(*addr, "/elsewhere").unwrap().0, 404, "{addr}");
    }
    let fleet = Fleet::new(children.admin_addrs().to_vec(), None);
    assert!(fleet.is_ready());
    let page = fleet.page();
    for line in ["web_worker_up{worker=\"0\"} 1", "web_worker_up{worker=\"1\"} 1"] {
        assert!(page.lines().any(|l| l == line), "{line:?} missing from\n{page}");
    }
    assert!(page.contains("web_requests_total{worker=\"1\"} 0"), "{page}");

    let first = libc::pid_t::try_from(children.child_ids()[0]).unwrap();
    // SAFETY: kill(2) on this test's own child; it touches no memory of ours.
    assert_eq!(unsafe { libc::kill(first, libc::SIGTERM) }, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fleet.is_ready() {
        assert!(std::time::Instant::now() < deadline, "still ready with a child stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(children.admin_addrs()[1], "/ready").unwrap().0, 200, "the other serves on");
}
