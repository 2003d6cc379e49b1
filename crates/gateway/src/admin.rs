//! The server's HTTP endpoints on the metrics listener: `GET /metrics` (Prometheus text),
//! `GET /health` (the process answers), `GET /ready` (the tier runs and takes orders; 503 while it drains), and the
//! admin source that sends external events into the running tier, journaled as the tier
//! journals any event (to the core as control input, to the master-data process write-ahead):
//!
//! * `POST /admin/halt?instrument=N`
//! * `POST /admin/resume?instrument=N`
//! * `POST /admin/band?instrument=N&low=L&high=H` (prices in ticks, `low <= high`)
//!
//! The admin endpoints need `Authorization: Bearer TOKEN` with the serve config's
//! `admin_token`; without one configured they are off (403), a missing or wrong token is 401.
//! `/metrics` needs `Authorization: Bearer TOKEN` with `metrics_token` when one is configured
//! (401 otherwise) and is open without one, which [`crate::server::start`] allows only on a
//! loopback address; `/health` and `/ready` are always open (they say nothing but "ok").
//! Anything else gets a status with a reason in the body: 404 (unknown path), 405 (wrong
//! method), 400 (a missing or malformed parameter).

use exchange::events::ExternalEvent;
use exchange::msg::{InstrumentId, Price};

/// Connections the metrics listener serves at once; beyond, new ones are closed unanswered.
/// Each holds a 4 KiB request buffer and a task on the I/O thread, which also runs the
/// orders, for up to 1 s to send its request and 1 s to take its answer: a flood of idle
/// connections must not grow either without bound. A scraper and an operator need a handful.
pub const HTTP_CONNECTIONS_MAX: usize = 16;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminRequest {
    Metrics,
    Health,
    Ready,
    /// An external event for the tier.
    Event(ExternalEvent),
}

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

/// Parses an HTTP request's first line (`METHOD TARGET VERSION`).
pub fn parse(request_line: &str) -> Result<AdminRequest, AdminError> {
    let mut parts = request_line.split_ascii_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(refuse(400, "malformed request line"));
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let expect = |wanted: &str| {
        if method == wanted { Ok(()) } else { Err(refuse(405, format!("{path} takes {wanted}"))) }
    };
    match path {
        "/metrics" => expect("GET").map(|()| AdminRequest::Metrics),
        "/health" => expect("GET").map(|()| AdminRequest::Health),
        "/ready" => expect("GET").map(|()| AdminRequest::Ready),
        "/admin/halt" | "/admin/resume" | "/admin/band" => {
            expect("POST")?;
            event(path, query).map(AdminRequest::Event)
        }
        _ => Err(refuse(404, format!("no endpoint {path}"))),
    }
}

/// Whether an admin request (its whole head, `request`) carries the configured token.
pub fn authorize(request: &str, token: Option<&str>) -> Result<(), AdminError> {
    let Some(token) = token else {
        return Err(refuse(403, "admin endpoints are off: set admin_token in the serve config"));
    };
    bearer(request, token)
}

/// Whether a scrape of `/metrics` (its whole head, `request`) may read the page: open without
/// a configured `metrics_token`, else only with that bearer token.
pub fn authorize_scrape(request: &str, token: Option<&str>) -> Result<(), AdminError> {
    token.map_or(Ok(()), |token| bearer(request, token))
}

/// Whether `request` carries `Authorization: Bearer token`.
fn bearer(request: &str, token: &str) -> Result<(), AdminError> {
    let presented = request.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        name.trim().eq_ignore_ascii_case("authorization").then(|| value.strip_prefix("Bearer "))?
    });
    match presented {
        Some(presented) if same_secret(presented.as_bytes(), token.as_bytes()) => Ok(()),
        _ => Err(refuse(401, "missing or wrong bearer token")),
    }
}

/// Compares in time that depends on the lengths only, not on where the bytes differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
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
    fn each_endpoint_parses_and_each_bad_request_names_its_reason() {
        assert_eq!(parse("GET /metrics HTTP/1.0"), Ok(AdminRequest::Metrics));
        assert_eq!(parse("GET /health HTTP/1.1"), Ok(AdminRequest::Health));
        assert_eq!(parse("GET /ready HTTP/1.1"), Ok(AdminRequest::Ready));
        let resume = parse("POST /admin/resume?instrument=2 HTTP/1.1");
        assert_eq!(resume, Ok(AdminRequest::Event(ExternalEvent::Resume(2))));
        let band = parse("POST /admin/band?high=120&instrument=1&low=-5 HTTP/1.1");
        let wanted = ExternalEvent::Band { instrument: 1, low: -5, high: 120 };
        assert_eq!(band, Ok(AdminRequest::Event(wanted)));
        let bad = [
            ("", 400, "malformed"),
            ("GET /nowhere HTTP/1.1", 404, "no endpoint /nowhere"),
            ("POST /metrics HTTP/1.1", 405, "takes GET"),
            ("POST /admin/halt HTTP/1.1", 400, "missing parameter instrument"),
            ("POST /admin/halt?instrument=x HTTP/1.1", 400, "not a number"),
            ("POST /admin/halt?instrument=-1 HTTP/1.1", 400, "not a number"),
            ("POST /admin/band?instrument=1&low=9&high=3 HTTP/1.1", 400, "above high"),
        ];
        for (line, status, reason) in bad {
            let error = parse(line).unwrap_err();
            assert_eq!(error.status, status, "{line:?}: {error}");
            assert!(error.reason.contains(reason), "{line:?}: {error}");
        }
    }

    #[test]
    fn a_request_line_names_an_endpoint_or_why_not() {
        use exchange::events::ExternalEvent;
        assert_eq!(
            parse("POST /admin/halt?instrument=3 HTTP/1.1"),
            Ok(AdminRequest::Event(ExternalEvent::Halt(3)))
        );
        assert_eq!(parse("GET /admin/halt?instrument=3 HTTP/1.1").unwrap_err().status, 405);
        assert_eq!(parse("POST /admin/band?instrument=3&low=9 HTTP/1.1").unwrap_err().status, 400);
    }

    #[test]
    fn admin_requests_need_the_admin_token() {
        let head = "POST /admin/halt?instrument=1 HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n";
        assert!(authorize(head, Some("s3cret")).is_ok());
        assert_eq!(authorize(head, Some("other")).unwrap_err().status, 401);
        assert_eq!(authorize(head, None).unwrap_err().status, 403);
    }

    #[test]
    fn scrapes_need_the_metrics_token_only_when_one_is_set() {
        let head = "GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n";
        assert!(authorize_scrape(head, Some("s3cret")).is_ok());
        assert_eq!(
            authorize_scrape("GET /metrics HTTP/1.1", Some("s3cret")).unwrap_err().status,
            401
        );
        assert!(authorize_scrape("GET /metrics HTTP/1.1", None).is_ok());
    }
}
