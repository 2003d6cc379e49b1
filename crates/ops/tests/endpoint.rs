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
