//! The admin endpoint over real HTTP: each path's status, and a page a Prometheus text parser
//! reads with a histogram's buckets, a counter and the process metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ops::endpoint::get;
use ops::{BucketHistogram, Endpoint, Readiness, Registry};

#[test]
fn the_endpoint_routes_health_ready_metrics_and_404s_the_rest() {
    let (latency, sent) = (BucketHistogram::default(), Arc::new(AtomicU64::new(0)));
    let mut registry = Registry::default();
    registry.register("request_seconds", "request latency", latency.clone());
    let read = Arc::clone(&sent);
    registry.register("sent", "sent", ops::read::counter(move || read.load(Ordering::Relaxed)));
    let readiness = Readiness::default();
    let listening = Endpoint::new(registry, readiness.clone()).serve(([127, 0, 0, 1], 0).into());
    let addr = listening.as_ref().unwrap().addr;

    assert_eq!(get(addr, "/health").unwrap().0, 200);
    assert_eq!(get(addr, "/ready").unwrap().0, 503, "not ready before start-up says so");
    readiness.set(true);
    assert_eq!(get(addr, "/ready").unwrap().0, 200);
    assert_eq!(get(addr, "/elsewhere").unwrap().0, 404);

    latency.record_ns(3_000_000);
    sent.store(7, Ordering::Relaxed);
    let (status, page) = get(addr, "/metrics").unwrap();
    assert_eq!(status, 200);
    let lines = page.lines().map(|line| Ok(line.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let value = |name: &str| scrape.samples.iter().find(|s| s.metric == name).map(|s| &s.value);
    assert!(matches!(value("sent_total"), Some(prometheus_parse::Value::Counter(v)) if *v == 7.0));
    let Some(prometheus_parse::Value::Histogram(buckets)) = value("request_seconds") else {
        panic!("no histogram in\n{page}")
    };
    let at = |le: f64| buckets.iter().find(|b| b.less_than == le).unwrap().count;
    assert_eq!((at(0.0025), at(0.005)), (0.0, 1.0), "{page}");
    assert!(
        matches!(value("process_resident_memory_bytes"), Some(prometheus_parse::Value::Gauge(v)) if *v > 0.0)
    );
}

#[test]
fn a_metrics_token_guards_metrics_and_open_metrics_stay_on_loopback() {
    let endpoint = Endpoint::new(Registry::default(), Readiness::default())
        .with_metrics_token(Some("s3cret".into()));
    assert_eq!(endpoint.answer("GET", "/metrics", None).unwrap().status, 401);
    assert_eq!(endpoint.answer("GET", "/metrics", Some("Bearer nope")).unwrap().status, 401);
    assert_eq!(endpoint.answer("GET", "/metrics", Some("Bearer s3cret")).unwrap().status, 200);
    assert_eq!(endpoint.answer("POST", "/health", None).unwrap().status, 405);
    assert_eq!(endpoint.answer("GET", "/api/x", None), None);
    assert!(ops::endpoint::check_exposure(([0, 0, 0, 0], 9).into(), false).is_err());
    assert!(ops::endpoint::check_exposure(([0, 0, 0, 0], 9).into(), true).is_ok());
    assert!(ops::endpoint::check_exposure(([127, 0, 0, 1], 9).into(), false).is_ok());
}

/// A server's own routes beside the three: asked for any other path (with its query and
/// `Authorization` header), a 404 where they answer nothing; served on a listener bound
/// before (the server reports its address first).
#[test]
fn extra_routes_answer_other_paths_on_a_listener_bound_before() {
    use std::io::{Read, Write};
    struct Halt;
    impl ops::endpoint::Routes for Halt {
        fn answer(
            &self,
            method: &str,
            path: &str,
            query: &str,
            authorization: Option<&str>,
        ) -> Option<ops::endpoint::Answer> {
            if path != "/admin/halt" {
                return None;
            }
            let allowed = ops::endpoint::bearer_matches(authorization, "t0ken");
            let status = if method != "POST" {
                405
            } else if allowed {
                200
            } else {
                401
            };
            Some(ops::endpoint::Answer::text(status, format!("{method} {query}\n")))
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let endpoint = Endpoint::new(Registry::default(), Readiness::default()).with_routes(Halt);
    let _listening = endpoint.serve_on(listener).unwrap();
    let post = |authorization: &str| {
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let head = format!("POST /admin/halt?instrument=3 HTTP/1.0\r\n{authorization}\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    let allowed = post("Authorization: Bearer t0ken\r\n");
    assert!(allowed.starts_with("HTTP/1.0 200") && allowed.ends_with("POST instrument=3\n"));
    assert!(post("Authorization: Bearer t0ke\r\n").starts_with("HTTP/1.0 401"));
    assert!(post("").starts_with("HTTP/1.0 401"), "no header, no entry");
    assert_eq!(get(addr, "/admin/halt").unwrap().0, 405, "the routes decide the method");
    assert_eq!(get(addr, "/admin/elsewhere").unwrap().0, 404);
    assert_eq!(get(addr, "/health").unwrap().0, 200, "the three stay the endpoint's");
}
