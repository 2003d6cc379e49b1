//! The server's HTTP endpoints on the metrics listener, served by `ops::Endpoint` (its listener
//! thread, connection bound and timeout, and bearer-token check): `GET /metrics` (Prometheus
//! text), `GET /health` (the process answers), `GET /ready` (the tier runs and takes orders;
//! 503 while it drains, or while a gateway without a tier cannot reach NATS), and the admin
//! source that sends external events into the running tier, journaled as the tier journals any
//! event (to the core as control input, to the master-data process write-ahead):
//!
//! * `POST /admin/halt?instrument=N`
//! * `POST /admin/resume?instrument=N`
//! * `POST /admin/band?instrument=N&low=L&high=H` (prices in ticks, `low <= high`)
//!
//! The admin endpoints need `Authorization: Bearer TOKEN` with the serve config's
//! `admin_token`; without one configured they are off (403), a missing or wrong token is 401.
//! `/metrics` needs `Authorization: Bearer TOKEN` with `metrics_token` when one is configured
//! (401 otherwise) and is open without one, which `crate::server::start` allows only on a
//! loopback address; `/health` and `/ready` are always open (they say nothing but "ok").
//! Anything else gets a status with a reason in the body: 404 (unknown path), 405 (wrong
//! method), 400 (a missing or malformed parameter).
//!
//! The hub lives on the I/O thread, the endpoint on its own: the page and an event reach the
//! loop as an [`AdminAsk`] on a bounded queue (the loop wakes for it), and the endpoint's
//! thread waits for the answer. The page is a copy the hub makes ([`Snapshot`]), rendered on
//! the endpoint's thread, at most once per [`METRICS_PAGE_MAX_AGE`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use exchange::events::ExternalEvent;
use exchange::msg::{InstrumentId, Price};
use ops::endpoint::{Answer, Listening, Routes, Source, bearer_matches};
use tokio::sync::Notify;

use crate::metrics::Snapshot;

/// Connections the metrics listener serves at once; beyond, new ones are closed unanswered
/// (`ops::endpoint`'s bound: a scraper and an operator need a handful).
pub const HTTP_CONNECTIONS_MAX: usize = ops::endpoint::HTTP_CONNECTIONS_MAX;
/// How old a served metrics page may be (scrapes in between get the same page): a snapshot
/// walks every client on the I/O thread, which also runs the orders.
const METRICS_PAGE_MAX_AGE: Duration = Duration::from_secs(1);
/// How long the endpoint waits for the I/O loop's answer (it turns at least every 10 ms).
const LOOP_ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a request is refused: an HTTP status and the reason sent back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{status} {reason}")]
pub struct AdminError {
    pub status: u16,
    pub reason: String,
}

fn refuse(status: u16, reason: impl Into<String>) -> AdminError {
    AdminError { status, reason: reason.into() }
}

/// What the endpoint's thread asks of the I/O loop.
pub enum AdminAsk {
    /// A copy of the metrics page's counters.
    Snapshot(SyncSender<Snapshot>),
    /// Hand an external event on: where it went, or why it could not.
    Event(ExternalEvent, SyncSender<Result<&'static str, &'static str>>),
}

/// The endpoint's way to the I/O loop: a bounded queue and the loop's wake-up.
#[derive(Clone)]
pub struct LoopAsks {
    pub asks: tokio::sync::mpsc::Sender<AdminAsk>,
    pub work: Arc<Notify>,
}

impl LoopAsks {
    /// Asks the loop; `None` when it is gone, busy with as many asks as there are
    /// connections, or silent for [`LOOP_ANSWER_TIMEOUT`].
    fn ask<T>(&self, ask: impl FnOnce(SyncSender<T>) -> AdminAsk) -> Option<T> {
        let (reply, answer) = sync_channel(1);
        self.asks.try_send(ask(reply)).ok()?;
        self.work.notify_one();
        answer.recv_timeout(LOOP_ANSWER_TIMEOUT).ok()
    }
}

/// The page and readiness the endpoint shows.
struct Page {
    loop_asks: LoopAsks,
    /// The last page rendered, and when.
    rendered: Mutex<Option<(Instant, String)>>,
    /// Set once the loop serves, cleared when it starts draining.
    ready: ops::Readiness,
    /// A gateway without a tier: whether NATS (the input log, the reports) is reachable.
    reachable: Option<Arc<AtomicBool>>,
}

impl Source for Page {
    fn page(&self) -> String {
        let mut rendered = self.rendered.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, page)) = rendered.as_ref()
            && at.elapsed() < METRICS_PAGE_MAX_AGE
        {
            return page.clone();
        }
        let Some(snapshot) = self.loop_asks.ask(AdminAsk::Snapshot) else { return String::new() };
        let page = crate::metrics::render(&snapshot);
        *rendered = Some((Instant::now(), page.clone()));
        page
    }

    fn is_ready(&self) -> bool {
        // Relaxed: a status flag; nothing else is published through it.
        let reachable = self.reachable.as_ref().is_none_or(|up| up.load(Ordering::Relaxed));
        self.ready.is_ready() && reachable
    }
}

/// The admin requests, beside the endpoint's three.
struct AdminRoutes {
    admin_token: Option<String>,
    loop_asks: LoopAsks,
}

impl Routes for AdminRoutes {
    fn answer(
        &self,
        method: &str,
        path: &str,
        query: &str,
        authorization: Option<&str>,
    ) -> Option<Answer> {
        let event = match parse(method, path, query)? {
            Ok(event) => event,
            Err(AdminError { status, reason }) => return Some(Answer::text(status, reason + "\n")),
        };
        if let Err(AdminError { status, reason }) =
            authorize(authorization, self.admin_token.as_deref())
        {
            tracing::warn!(status, reason, "admin request refused");
            return Some(Answer::text(status, reason + "\n"));
        }
        Some(match self.loop_asks.ask(|reply| AdminAsk::Event(event, reply)) {
            Some(Ok(_)) => Answer::text(200, format!("sent {event:?}\n")),
            Some(Err(why)) => Answer::text(503, format!("{why}\n")),
            None => Answer::text(503, "the server did not answer\n"),
        })
    }
}

/// What the endpoint needs from the server.
pub struct EndpointSetup {
    pub metrics_token: Option<String>,
    pub admin_token: Option<String>,
    pub loop_asks: LoopAsks,
    pub ready: ops::Readiness,
    pub reachable: Option<Arc<AtomicBool>>,
}

/// Serves the endpoints on `listener` from a thread of its own until the handle drops.
pub fn serve(
    listener: std::net::TcpListener,
    setup: EndpointSetup,
) -> Result<Listening, ops::OpsError> {
    let EndpointSetup { metrics_token, admin_token, loop_asks, ready, reachable } = setup;
    let rendered = Mutex::new(None);
    let page = Page { loop_asks: loop_asks.clone(), rendered, ready, reachable };
    let routes = AdminRoutes { admin_token, loop_asks };
    let endpoint = ops::Endpoint::of(page).with_metrics_token(metrics_token).with_routes(routes);
    endpoint.serve_on(listener)
}

/// The external event an admin request asks for, the reason it is refused, or `None` when
/// `path` is none of the admin endpoints.
pub fn parse(method: &str, path: &str, query: &str) -> Option<Result<ExternalEvent, AdminError>> {
    if !matches!(path, "/admin/halt" | "/admin/resume" | "/admin/band") {
        return None;
    }
    if method != "POST" {
        return Some(Err(refuse(405, format!("{path} takes POST"))));
    }
    Some(event(path, query))
}

/// Whether an admin request's `Authorization` header carries the configured token.
pub fn authorize(authorization: Option<&str>, token: Option<&str>) -> Result<(), AdminError> {
    let Some(token) = token else {
        return Err(refuse(403, "admin endpoints are off: set admin_token in the serve config"));
    };
    if bearer_matches(authorization, token) {
        Ok(())
    } else {
        Err(refuse(401, "missing or wrong bearer token"))
    }
}

fn event(path: &str, query: &str) -> Result<ExternalEvent, AdminError> {
    let instrument: InstrumentId = param(query, "instrument")?;
    Ok(match path {
        "/admin/halt" => ExternalEvent::Halt(instrument),
        "/admin/resume" => ExternalEvent::Resume(instrument),
        _ => {
            let (low, high): (Price, Price) = (param(query, "low")?, param(query, "high")?);
            if low > high {
                return Err(refuse(400, format!("band low {low} above high {high}")));
            }
            ExternalEvent::Band { instrument, low, high }
        }
    })
}

fn param<T: std::str::FromStr>(query: &str, name: &str) -> Result<T, AdminError> {
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix(name).and_then(|rest| rest.strip_prefix('=')))
        .ok_or_else(|| refuse(400, format!("missing parameter {name}")))?;
    value.parse().map_err(|_| refuse(400, format!("{name}={value:?} is not a number")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_admin_endpoint_parses_and_each_bad_request_names_its_reason() {
        let post = |target: &str| {
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            parse("POST", path, query).expect("an admin path")
        };
        assert_eq!(post("/admin/halt?instrument=3"), Ok(ExternalEvent::Halt(3)));
        assert_eq!(post("/admin/resume?instrument=2"), Ok(ExternalEvent::Resume(2)));
        let band = post("/admin/band?high=120&instrument=1&low=-5");
        assert_eq!(band, Ok(ExternalEvent::Band { instrument: 1, low: -5, high: 120 }));
        assert_eq!(parse("GET", "/metrics", ""), None, "the endpoint's own path");
        assert_eq!(parse("GET", "/nowhere", ""), None, "a 404");
        let wrong_method = parse("GET", "/admin/halt", "instrument=3").unwrap().unwrap_err();
        assert_eq!(
            (wrong_method.status, wrong_method.reason.as_str()),
            (405, "/admin/halt takes POST")
        );
        let bad = [
            ("/admin/halt", 400, "missing parameter instrument"),
            ("/admin/halt?instrument=x", 400, "not a number"),
            ("/admin/halt?instrument=-1", 400, "not a number"),
            ("/admin/band?instrument=3&low=9", 400, "missing parameter high"),
            ("/admin/band?instrument=1&low=9&high=3", 400, "above high"),
        ];
        for (target, status, reason) in bad {
            let error = post(target).unwrap_err();
            assert_eq!(error.status, status, "{target:?}: {error}");
            assert!(error.reason.contains(reason), "{target:?}: {error}");
        }
    }

    #[test]
    fn admin_requests_need_the_admin_token() {
        assert!(authorize(Some("Bearer s3cret"), Some("s3cret")).is_ok());
        assert_eq!(authorize(Some("Bearer s3cret"), Some("other")).unwrap_err().status, 401);
        assert_eq!(authorize(None, Some("s3cret")).unwrap_err().status, 401);
        assert_eq!(authorize(Some("Bearer s3cret"), None).unwrap_err().status, 403);
    }
}
