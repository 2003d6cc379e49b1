//! The native protocol against a real `serve` on loopback: trading, replay on re-login, the
//! session protections, and each bad-input case (with another session still served).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use gateway::Settings;
use gateway::client::{ClientError, NativeClient};
use gateway::native::{
    ClientMsg, Event, OrderRequest, ServerMsg, error_code, event_kind, gateway_reason, login_reject,
};
use gateway::{Running, ServeOptions};

/// Generous on a loaded 2-core machine; a passing run never waits this long.
const WAIT: Duration = Duration::from_secs(10);
const SECRET: &str = "s3cret";
/// Instrument 1's reference price (on tick, inside the band).
const PRICE: i64 = 101_000;

fn start(settings: Settings) -> (Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let credentials = common::native_credentials(SECRET);
    let options = common::serve_options(dir.path(), credentials, 8);
    let options = ServeOptions {
        settings: Settings { store_dir: dir.path().to_path_buf(), ..settings },
        ..options
    };
    (gateway::start(options).unwrap(), dir)
}

fn logged_in(addr: SocketAddr, client: u32, next_seq: u64) -> NativeClient {
    let mut session = NativeClient::connect(addr).unwrap();
    let answer = session.login(client, SECRET, next_seq, WAIT).unwrap();
    assert!(
        matches!(answer, ServerMsg::LoginAccepted { client: c, .. } if c == client),
        "{answer:?}"
    );
    session
}

fn order(client: u32, token: u32, side: u8, qty: u32) -> OrderRequest {
    OrderRequest {
        client,
        token,
        instrument: 1,
        side,
        order_type: 0,
        time_in_force: 0,
        price: PRICE,
        qty,
    }
}

fn next_event(session: &mut NativeClient) -> (u64, Event) {
    match session.recv(WAIT).unwrap() {
        Some(ServerMsg::Sequenced { seq, event }) => (seq, event),
        other => panic!("expected a sequenced event, got {other:?}"),
    }
}

/// A session that still trades: proves the server kept serving after a bad one.
fn still_serving(addr: SocketAddr, client: u32, token: u32) {
    let mut session = logged_in(addr, client, 0);
    session.send(&ClientMsg::NewOrder(order(client, token, 0, 1))).unwrap();
    let (_, event) = next_event(&mut session);
    assert_eq!((event.kind, event.token), (event_kind::ACCEPTED, token));
    session.send(&ClientMsg::Logout).unwrap();
}

#[test]
fn orders_match_and_each_side_gets_its_reports() {
    let (server, _dir) = start(Settings::default());
    let mut buyer = logged_in(server.listen, 1, 0);
    let mut seller = logged_in(server.listen, 2, 0);
    buyer.send(&ClientMsg::NewOrder(order(1, 7, 0, 10))).unwrap();
    let (seq, accepted) = next_event(&mut buyer);
    assert_eq!(
        (seq, accepted.kind, accepted.token, accepted.leaves_qty),
        (1, event_kind::ACCEPTED, 7, 10)
    );
    seller.send(&ClientMsg::NewOrder(order(2, 9, 1, 4))).unwrap();
    let (_, seller_accepted) = next_event(&mut seller);
    assert_eq!(seller_accepted.kind, event_kind::ACCEPTED);
    let (_, seller_fill) = next_event(&mut seller);
    assert_eq!(
        (seller_fill.kind, seller_fill.qty, seller_fill.price),
        (event_kind::FILLED, 4, PRICE)
    );
    let (seq, buyer_fill) = next_event(&mut buyer);
    assert_eq!((seq, buyer_fill.kind, buyer_fill.token), (2, event_kind::PARTIALLY_FILLED, 7));
    assert_eq!((buyer_fill.qty, buyer_fill.leaves_qty), (4, 6));
    buyer
        .send(&ClientMsg::Replace(OrderRequest { price: PRICE - 5, qty: 3, ..order(1, 7, 0, 0) }))
        .unwrap();
    let (_, replaced) = next_event(&mut buyer);
    assert_eq!((replaced.kind, replaced.price), (event_kind::REPLACED, PRICE - 5));
    buyer.send(&ClientMsg::Cancel(order(1, 7, 0, 0))).unwrap();
    let (_, cancelled) = next_event(&mut buyer);
    assert_eq!(cancelled.kind, event_kind::CANCELLED);
    buyer.send(&ClientMsg::Cancel(order(1, 7, 0, 0))).unwrap();
    let (_, unknown) = next_event(&mut buyer);
    assert_eq!(
        (unknown.kind, unknown.reason),
        (event_kind::REJECTED, exchange::msg::Reason::UnknownOrder as u8)
    );
}

#[test]
fn a_client_that_logs_in_again_gets_every_message_replayed() {
    let (server, _dir) = start(Settings::default());
    let mut first = logged_in(server.listen, 1, 0);
    for token in 1..=3 {
        first.send(&ClientMsg::NewOrder(order(1, token, 0, 1))).unwrap();
    }
    let seen: Vec<(u64, Event)> = (0..3).map(|_| next_event(&mut first)).collect();
    drop(first);
    // The server notices the close asynchronously; retry while it still holds the session.
    let mut again = None;
    for _ in 0..100 {
        let mut session = NativeClient::connect(server.listen).unwrap();
        match session.login(1, SECRET, 2, WAIT).unwrap() {
            ServerMsg::LoginAccepted { next_seq, .. } => {
                assert_eq!(next_seq, 2);
                again = Some(session);
                break;
            }
            ServerMsg::LoginRejected { reason } => {
                assert_eq!(reason, login_reject::ALREADY_LOGGED_IN)
            }
            other => panic!("{other:?}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut again = again.expect("re-login accepted once the first session is gone");
    assert_eq!(next_event(&mut again), seen[1]);
    assert_eq!(next_event(&mut again), seen[2]);
    again.send(&ClientMsg::NewOrder(order(1, 4, 0, 1))).unwrap();
    assert_eq!(next_event(&mut again).0, 4, "new messages continue the sequence");
}

#[test]
fn bad_credentials_are_rejected() {
    let (server, _dir) = start(Settings::default());
    let mut session = NativeClient::connect(server.listen).unwrap();
    let answer = session.login(1, "wrong", 0, WAIT).unwrap();
    assert_eq!(answer, ServerMsg::LoginRejected { reason: login_reject::BAD_CREDENTIALS });
    let mut unknown = NativeClient::connect(server.listen).unwrap();
    let answer = unknown.login(99, SECRET, 0, WAIT).unwrap();
    assert_eq!(answer, ServerMsg::LoginRejected { reason: login_reject::BAD_CREDENTIALS });
    still_serving(server.listen, 2, 1);
}

/// Sends `bytes` on a fresh connection (logged in first when `login`) and expects the server to
/// answer `code` and close.
fn expect_error_and_close(addr: SocketAddr, login: bool, bytes: &[u8], code: u8) {
    let mut session =
        if login { logged_in(addr, 1, 0) } else { NativeClient::connect(addr).unwrap() };
    session.send_raw(bytes).unwrap();
    assert_eq!(session.recv(WAIT).unwrap(), Some(ServerMsg::Error { code }), "for {bytes:?}");
    assert!(matches!(session.recv(WAIT), Err(ClientError::Closed)), "closed after {bytes:?}");
}

#[test]
fn each_bad_frame_gets_its_error_and_the_server_serves_others() {
    let (server, _dir) = start(Settings::default());
    let addr = server.listen;
    let mut order_frame = Vec::new();
    gateway::native::encode_client(&ClientMsg::NewOrder(order(1, 1, 0, 1)), &mut order_frame);
    // Garbage (an order) before login.
    expect_error_and_close(addr, false, &order_frame, error_code::NOT_LOGGED_IN);
    // Wrong version.
    let mut wrong_version = order_frame.clone();
    wrong_version[2] = 9;
    expect_error_and_close(addr, true, &wrong_version, error_code::BAD_VERSION);
    // Unknown message type.
    expect_error_and_close(addr, true, &[0, 2, 1, b'?'], error_code::UNKNOWN_TYPE);
    // A frame whose length does not fit its type, and a length over the maximum.
    expect_error_and_close(addr, true, &[0, 3, 1, b'H', 0], error_code::MALFORMED);
    expect_error_and_close(addr, true, &[0xff, 0xff, 1, b'O'], error_code::MALFORMED);
    still_serving(addr, 2, 1);
}

#[test]
fn an_order_for_another_client_is_rejected() {
    let (server, _dir) = start(Settings::default());
    let mut session = logged_in(server.listen, 1, 0);
    session.send(&ClientMsg::NewOrder(order(2, 5, 0, 1))).unwrap();
    let (_, event) = next_event(&mut session);
    assert_eq!(
        (event.kind, event.reason, event.token),
        (event_kind::REJECTED, gateway_reason::WRONG_CLIENT, 5)
    );
    still_serving(server.listen, 2, 1);
}

#[test]
fn a_session_over_its_rate_is_throttled() {
    let (server, _dir) = start(Settings { throttle_msgs_per_s: 5, ..Settings::default() });
    let mut session = logged_in(server.listen, 1, 0);
    for token in 1..=20 {
        session.send(&ClientMsg::NewOrder(order(1, token, 0, 1))).unwrap();
    }
    let events: Vec<Event> = (0..20).map(|_| next_event(&mut session).1).collect();
    let throttled = events.iter().filter(|e| e.reason == gateway_reason::THROTTLED).count();
    let accepted = events.iter().filter(|e| e.kind == event_kind::ACCEPTED).count();
    assert!(throttled >= 10, "{throttled} throttled of 20 at 5/s");
    assert!(accepted >= 5, "the burst allowance of 5 is admitted, got {accepted}");
    let metrics = http_get(server.metrics_listen.unwrap());
    assert!(metrics.contains(&format!("gateway_throttled_total {throttled}")), "{metrics}");
}

#[test]
fn open_orders_are_cancelled_after_the_grace_window() {
    let grace = Duration::from_millis(50);
    let settings = Settings { cancel_on_disconnect: Some(grace), ..Settings::default() };
    let (server, _dir) = start(settings);
    let mut session = logged_in(server.listen, 1, 0);
    session.send(&ClientMsg::NewOrder(order(1, 1, 0, 5))).unwrap();
    assert_eq!(next_event(&mut session).1.kind, event_kind::ACCEPTED);
    session.send(&ClientMsg::Logout).unwrap();
    drop(session);
    // The cancel is sequenced into the client's stream while it is away: replay shows it.
    // Each look logs on again, which ends the absence, so it comes well after a whole grace
    // window (a look within it would keep the order alive, and so would every later one).
    let mut cancelled = None;
    for _ in 0..100 {
        std::thread::sleep(grace * 4);
        let mut again = NativeClient::connect(server.listen).unwrap();
        if !matches!(again.login(1, SECRET, 2, WAIT).unwrap(), ServerMsg::LoginAccepted { .. }) {
            continue;
        }
        match again.recv(Duration::from_millis(200)).unwrap() {
            Some(ServerMsg::Sequenced { event, .. }) => {
                cancelled = Some(event);
                break;
            }
            _ => continue,
        }
    }
    let event = cancelled.expect("the open order was cancelled");
    assert_eq!((event.kind, event.token), (event_kind::CANCELLED, 1));
    let reason = exchange::msg::Reason::CancelOnDisconnect as u8;
    assert_eq!(event.reason, reason, "told apart from a cancel the client asked for");
}

#[test]
fn a_slow_consumer_is_cut_off_and_others_are_served() {
    // An outbox smaller than one sequenced frame: the first report overflows it.
    let (server, _dir) = start(Settings { outbox_bytes_max: 16, ..Settings::default() });
    let mut session = logged_in(server.listen, 1, 0);
    session.send(&ClientMsg::NewOrder(order(1, 1, 0, 1))).unwrap();
    assert_eq!(
        session.recv(WAIT).unwrap(),
        Some(ServerMsg::Error { code: error_code::SLOW_CONSUMER })
    );
    let metrics = (0..100)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            http_get(server.metrics_listen.unwrap())
        })
        .find(|m| m.contains("gateway_cut_off_total 1"));
    assert!(metrics.is_some(), "cut-off counted");
}

/// The value of the sample named exactly `series` (name and labels) in a scrape.
fn sample(metrics: &str, series: &str) -> f64 {
    let line = metrics
        .lines()
        .find(|line| line.strip_prefix(series).is_some_and(|rest| rest.starts_with(' ')))
        .unwrap_or_else(|| panic!("no {series} in\n{metrics}"));
    line[series.len()..].trim().parse().unwrap()
}

#[test]
fn the_metrics_listener_serves_sessions_stages_and_latencies() {
    let (server, _dir) = start(Settings { metrics_per_client: true, ..Settings::default() });
    let mut session = logged_in(server.listen, 1, 0);
    for token in 1..=3 {
        session.send(&ClientMsg::NewOrder(order(1, token, 0, 1))).unwrap();
        assert_eq!(next_event(&mut session).1.kind, event_kind::ACCEPTED);
    }
    // Another client's id in the order: rejected by the gateway, counted by reason.
    session.send(&ClientMsg::NewOrder(order(2, 4, 0, 1))).unwrap();
    assert_eq!(next_event(&mut session).1.reason, gateway_reason::WRONG_CLIENT);
    let metrics = http_get(server.metrics_listen.unwrap());
    assert!(metrics.starts_with("HTTP/1.0 200 OK"), "{metrics}");
    assert_eq!(sample(&metrics, "gateway_orders_in_total{client=\"1\"}"), 3.0);
    let wrong_client = format!(
        "gateway_rejects_total{{client=\"1\",reason=\"{}\"}}",
        gateway_reason::WRONG_CLIENT
    );
    assert_eq!(sample(&metrics, &wrong_client), 1.0);
    assert_eq!(sample(&metrics, "gateway_engine_in_total"), 3.0);
    assert_eq!(sample(&metrics, "gateway_engine_out_total"), 3.0);
    assert_eq!(sample(&metrics, "gateway_ring_depth{ring=\"replies\"}"), 0.0);
    assert_eq!(sample(&metrics, "gateway_order_to_report_seconds_count"), 3.0);
    assert_eq!(sample(&metrics, "gateway_engine_service_seconds_count"), 3.0);
    let all = sample(&metrics, "gateway_order_to_report_seconds_bucket{le=\"+Inf\"}");
    let within_wait = sample(&metrics, "gateway_order_to_report_seconds_bucket{le=\"10\"}");
    assert_eq!((all, within_wait), (3.0, 3.0), "buckets are cumulative and hold all three");
    let whole = sample(&metrics, "gateway_order_to_report_seconds_sum");
    let service = sample(&metrics, "gateway_engine_service_seconds_sum");
    assert!(whole > 0.0 && whole < 3.0 * WAIT.as_secs_f64(), "{whole}");
    assert!(
        service > 0.0 && service <= whole,
        "the engine's time is part of the whole: {service} {whole}"
    );
    assert!(sample(&metrics, "process_resident_memory_bytes") > 0.0);
    assert!(sample(&metrics, "gateway_store_commits_total") >= 1.0);
    assert_eq!(sample(&metrics, "gateway_store_failed"), 0.0);
}

fn http_get(addr: SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// Two native sessions at `rate_per_s` for `duration` against `connect`.
fn load_options(
    connect: SocketAddr,
    rate_per_s: f64,
    duration: Duration,
) -> experiments::order_entry_load::LoadOptions {
    experiments::order_entry_load::LoadOptions {
        connect,
        protocol: experiments::order_entry_load::LoadProtocol::Native,
        sessions: [1, 2]
            .map(|client| experiments::order_entry_load::LoadSession {
                client,
                comp_id: String::new(),
                secret: SECRET.into(),
            })
            .to_vec(),
        plan: stats::open_loop::OpenLoopPlan {
            process: stats::open_loop::ArrivalProcess::Poisson { rate_per_s },
            seed: 1,
            duration,
        },
        instruments: vec![experiments::order_entry_load::Traded::reference(1, PRICE)],
        tls: None,
        drain: experiments::order_entry_load::DRAIN_DEFAULT,
    }
}

#[test]
fn the_load_generator_measures_every_order_it_sends() {
    let (server, _dir) = start(Settings::default());
    let options = load_options(server.listen, 2_000.0, Duration::from_millis(200));
    let result = experiments::order_entry_load::run(&options).unwrap();
    assert!(result.sent > 100, "about 400 orders in 200 ms at 2K/s, sent {}", result.sent);
    assert_eq!(result.answered, result.sent, "every order got its first report");
    assert_eq!(result.latency.count(), result.sent);
    assert_eq!(result.rejected, 0);
}

/// A TCP relay to `server` whose server-to-client direction holds every byte from `quiet.0`
/// to `quiet.1` after it first forwarded one (the login's answer), as a gateway holds reports
/// while its NATS node is down. A server that ends the link during the spell gets nothing more
/// to the client (the held bytes are dropped and the client's connection shut), as a gateway
/// that ended a session sends it nothing more.
fn relay_with_a_quiet_spell(server: SocketAddr, quiet: (Duration, Duration)) -> SocketAddr {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::{Arc, OnceLock};
    use std::time::Instant;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let pipe =
        move |mut from: TcpStream, mut to: TcpStream, logged_in: Option<Arc<OnceLock<Instant>>>| {
            std::thread::spawn(move || {
                let (mut buffer, mut held) = ([0u8; 16 * 1024], Vec::new());
                from.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
                let in_spell = |logged_in: &Option<Arc<OnceLock<Instant>>>| {
                    let since = logged_in.as_ref().and_then(|at| at.get()).map(Instant::elapsed);
                    since.is_some_and(|since| (quiet.0..quiet.1).contains(&since))
                };
                loop {
                    match from.read(&mut buffer) {
                        Ok(0) => break,
                        Ok(n) => held.extend_from_slice(&buffer[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => break,
                    }
                    if !in_spell(&logged_in) && !held.is_empty() {
                        if to.write_all(&held).is_err() {
                            break;
                        }
                        held.clear();
                        if let Some(at) = &logged_in {
                            at.get_or_init(Instant::now);
                        }
                    }
                }
                let _ = to.shutdown(Shutdown::Both);
            });
        };
    std::thread::spawn(move || {
        for client in listener.incoming().map_while(Result::ok) {
            let upstream = TcpStream::connect(server).unwrap();
            pipe(client.try_clone().unwrap(), upstream.try_clone().unwrap(), None);
            pipe(upstream, client, Some(Arc::new(OnceLock::new())));
        }
    });
    address
}

/// Answers held back from 0.3 s to 6 s after login, in a 4 s schedule, are all counted: the readers never
/// give up while the schedule still sends (they used to stop after the drain without a report,
/// and a load across a failover lost every later answer), and after it the sessions heartbeat,
/// so the server (here: dead link after 1.2 s of silence) keeps the links the readers wait on.
#[test]
fn the_load_generator_reads_on_through_a_quiet_spell_while_it_sends() {
    let settings = Settings { heartbeat: Duration::from_millis(400), ..Settings::default() };
    let dead_link = settings.heartbeat * gateway::DEAD_LINK_INTERVALS;
    let (server, _dir) = start(settings);
    let quiet = (Duration::from_millis(300), Duration::from_secs(6));
    let (schedule, drain) = (Duration::from_secs(4), Duration::from_secs(3));
    assert!(schedule - quiet.0 > drain, "a reader that gave up mid-schedule misses answers");
    assert!(quiet.1 - schedule > dead_link, "a silent client loses its link");
    assert!(schedule + drain > quiet.1, "the drain outlasts the spell");
    let relay = relay_with_a_quiet_spell(server.listen, quiet);
    let options = experiments::order_entry_load::LoadOptions {
        drain,
        ..load_options(relay, 300.0, schedule)
    };
    let result = experiments::order_entry_load::run(&options).unwrap();
    assert!(result.sent > 800, "about 1,200 orders in 4 s at 300/s, sent {}", result.sent);
    assert_eq!(result.answered, result.sent, "every order got its first report");
    let slowest_ms = result.latency.max_ns() / 1_000_000;
    assert!(slowest_ms >= 5_000, "the spell held answers back: slowest {slowest_ms} ms");
}

#[test]
fn the_server_heartbeats_and_ends_a_silent_session_as_a_dead_link() {
    use std::io::{Read, Write};
    let (server, _dir) =
        start(Settings { heartbeat: Duration::from_millis(100), ..Settings::default() });
    let mut stream = std::net::TcpStream::connect(server.listen).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let mut frame = Vec::new();
    let secret = gateway::native::secret_field(SECRET).unwrap();
    gateway::native::encode_client(
        &ClientMsg::Login { client: 1, secret, next_seq: 0 },
        &mut frame,
    );
    stream.write_all(&frame).unwrap();
    // Read everything until the server closes; this client never heartbeats.
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).unwrap();
    let mut received = Vec::new();
    let mut rest = &bytes[..];
    while let Some((version, kind, payload, len)) = gateway::native::split_frame(rest).unwrap() {
        received.push(gateway::native::decode_server(version, kind, payload).unwrap());
        rest = &rest[len..];
    }
    assert!(matches!(received[0], ServerMsg::LoginAccepted { .. }), "{received:?}");
    assert!(
        received.contains(&ServerMsg::Heartbeat),
        "the server heartbeats an idle link: {received:?}"
    );
    assert_eq!(received.last(), Some(&ServerMsg::Error { code: error_code::DEAD_LINK }));
}

/// The status code of an HTTP response (`HTTP/1.x CODE REASON`).
fn status(response: &str) -> &str {
    response.split_ascii_whitespace().nth(1).unwrap_or("")
}

/// An HTTP request to the metrics listener: its whole response.
fn http(addr: SocketAddr, request_line: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(format!("{request_line}\r\n\r\n").as_bytes()).unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// Sends orders (tokens from `*token` on) until one gets `kind` with `reason`; the event that
/// causes it travels the tier's events stage while orders go through the pre-process.
fn until_answered(session: &mut NativeClient, token: &mut u32, kind: u8, reason: u8) {
    for _ in 0..200 {
        *token += 1;
        session.send(&ClientMsg::NewOrder(order(1, *token, 0, 1))).unwrap();
        let (_, event) = next_event(session);
        if (event.kind, event.reason) == (kind, reason) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no order answered {kind}/{reason} within 200 tries");
}

#[test]
fn an_admin_halt_reaches_the_running_tier_and_a_resume_lifts_it() {
    let settings = Settings { admin_token: Some("t0ken".into()), ..Settings::default() };
    let (server, _dir) = start(settings);
    let admin = server.metrics_listen.unwrap();
    let unauthorized = http(admin, "POST /admin/halt?instrument=1 HTTP/1.1");
    assert!(status(&unauthorized) == "401", "{unauthorized}");
    let wrong = http(admin, "POST /admin/halt?instrument=1 HTTP/1.1\r\nAuthorization: Bearer x");
    assert!(status(&wrong) == "401", "{wrong}");
    let mut session = logged_in(server.listen, 1, 0);
    let mut token = 0;
    until_answered(&mut session, &mut token, event_kind::ACCEPTED, 0);

    let halted =
        http(admin, "POST /admin/halt?instrument=1 HTTP/1.1\r\nAuthorization: Bearer t0ken");
    assert!(status(&halted) == "200", "{halted}");
    let halted_reason = exchange::msg::Reason::InstrumentHalted as u8;
    until_answered(&mut session, &mut token, event_kind::REJECTED, halted_reason);

    let resumed =
        http(admin, "POST /admin/resume?instrument=1 HTTP/1.1\r\nAuthorization: Bearer t0ken");
    assert!(status(&resumed) == "200", "{resumed}");
    until_answered(&mut session, &mut token, event_kind::ACCEPTED, 0);

    for (line, status) in [
        ("GET /admin/halt?instrument=1 HTTP/1.1", "405"),
        ("POST /admin/band?instrument=1&low=5 HTTP/1.1\r\nAuthorization: Bearer t0ken", "400"),
        ("GET /nowhere HTTP/1.1", "404"),
        ("GET /health HTTP/1.1", "200"),
        ("GET /ready HTTP/1.1", "200"),
    ] {
        let answer = http(admin, line);
        assert!(self::status(&answer) == status, "{line}: {answer}");
    }
}

#[test]
fn an_order_in_the_same_write_as_the_login_is_answered_without_more_bytes() {
    let (server, _dir) = start(Settings::default());
    let mut session = NativeClient::connect(server.listen).unwrap();
    let mut secret = [0u8; 32];
    secret[..SECRET.len()].copy_from_slice(SECRET.as_bytes());
    let mut bytes = Vec::new();
    gateway::native::encode_client(
        &ClientMsg::Login { client: 1, secret, next_seq: 0 },
        &mut bytes,
    );
    gateway::native::encode_client(&ClientMsg::NewOrder(order(1, 7, 0, 1)), &mut bytes);
    session.send_raw(&bytes).unwrap();
    assert!(matches!(session.recv(WAIT).unwrap(), Some(ServerMsg::LoginAccepted { .. })));
    // Nothing more is sent: the order must be answered from what the login's read brought.
    let (_, event) = next_event(&mut session);
    assert_eq!((event.kind, event.token), (event_kind::ACCEPTED, 7));
}

#[test]
fn a_client_that_stops_reading_is_dropped_and_may_log_in_again() {
    let settings = Settings {
        heartbeat: Duration::from_millis(50),
        outbox_bytes_max: 64 << 20,
        throttle_msgs_per_s: 10_000_000,
        ..Settings::default()
    };
    let (server, _dir) = start(settings);
    let session = logged_in(server.listen, 1, 0);
    // Orders that each get a report, far more than the socket buffers hold, from a thread of
    // their own; the session itself never reads a byte.
    let mut writer = session.socket().try_clone().unwrap();
    std::thread::spawn(move || {
        let mut frames = Vec::new();
        for token in 1..=200_000 {
            gateway::native::encode_client(
                &ClientMsg::NewOrder(order(1, token, 0, 1)),
                &mut frames,
            );
        }
        for chunk in frames.chunks(64 * 1024) {
            if std::io::Write::write_all(&mut writer, chunk).is_err() {
                return; // the server closed the connection
            }
        }
    });
    // The stalled session ends (its writes time out), so the client can log in again.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let mut again = NativeClient::connect(server.listen).unwrap();
        match again.login(1, SECRET, 0, WAIT).unwrap() {
            ServerMsg::LoginAccepted { .. } => break,
            ServerMsg::LoginRejected { reason } => {
                assert_eq!(reason, login_reject::ALREADY_LOGGED_IN);
                assert!(std::time::Instant::now() < deadline, "the stalled session never ended");
                std::thread::sleep(Duration::from_millis(100));
            }
            other => panic!("{other:?}"),
        }
    }
    drop(session);
}

#[test]
fn connections_that_never_log_in_from_one_address_lock_nobody_out() {
    use gateway::PREAUTH_PER_ADDRESS_MAX;
    let (server, _dir) = start(Settings::default());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // From another loopback address: many idle connections, none logging in.
    let idle: Vec<tokio::net::TcpStream> = runtime.block_on(async {
        let mut idle = Vec::new();
        for _ in 0..100 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            idle.push(socket.connect(server.listen).await.unwrap());
        }
        idle
    });
    // The server keeps PREAUTH_PER_ADDRESS_MAX of them and closes the rest at once.
    let kept = runtime.block_on(async {
        let mut kept = Vec::new();
        for mut stream in idle {
            let mut byte = [0u8; 1];
            let read = tokio::io::AsyncReadExt::read(&mut stream, &mut byte);
            let closed = matches!(
                tokio::time::timeout(Duration::from_millis(100), read).await,
                Ok(Ok(0) | Err(_))
            );
            if !closed {
                kept.push(stream);
            }
        }
        kept
    });
    assert_eq!(kept.len(), PREAUTH_PER_ADDRESS_MAX, "idle connections kept from one address");
    // While those are held, a client logs in and trades.
    still_serving(server.listen, 1, 9);
    drop(kept);
}

#[test]
fn admin_endpoints_are_off_without_a_token() {
    let (server, _dir) = start(Settings::default());
    let line = "POST /admin/halt?instrument=1 HTTP/1.1\r\nAuthorization: Bearer anything";
    let answer = http(server.metrics_listen.unwrap(), line);
    assert!(status(&answer) == "403" && answer.contains("admin_token"), "{answer}");
}

#[test]
fn a_session_far_over_its_throttle_is_cut_off() {
    let settings = Settings { throttle_msgs_per_s: 100, ..Settings::default() };
    let (server, _dir) = start(settings);
    let mut session = logged_in(server.listen, 1, 0);
    let mut frames = Vec::new();
    for token in 1..=3_000 {
        gateway::native::encode_client(&ClientMsg::NewOrder(order(1, token, 0, 1)), &mut frames);
    }
    let _ = session.send_raw(&frames); // the server may close while the flood is in flight
    let code = loop {
        match session.recv(WAIT).unwrap() {
            Some(ServerMsg::Error { code }) => break code,
            Some(ServerMsg::Sequenced { .. }) => {}
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(code, error_code::THROTTLE_BREACH);
    // What the store kept: a replay from the first event on shows where the flood was cut.
    let mut again = logged_in(server.listen, 1, 1);
    let (mut accepted, mut throttled) = (0, 0);
    while let Some(ServerMsg::Sequenced { event, .. }) =
        again.recv(Duration::from_millis(500)).unwrap()
    {
        if event.kind == event_kind::ACCEPTED {
            accepted += 1;
        } else {
            assert_eq!(event.reason, gateway_reason::THROTTLED, "{event:?}");
            throttled += 1;
        }
    }
    assert!(accepted <= 100, "the throttle's burst at most: {accepted}");
    assert!((1_000..2_900).contains(&throttled), "cut soon after 1,000 refusals: {throttled}");
}

// The metrics listener against hostile readers (issue 29).

#[test]
fn the_default_metrics_page_sums_the_sessions_and_names_no_client() {
    let (server, _dir) = start(Settings::default());
    let mut first = logged_in(server.listen, 1, 0);
    let mut second = logged_in(server.listen, 2, 0);
    first.send(&ClientMsg::NewOrder(order(1, 1, 0, 1))).unwrap();
    assert_eq!(next_event(&mut first).1.kind, event_kind::ACCEPTED);
    second.send(&ClientMsg::NewOrder(order(2, 1, 0, 1))).unwrap();
    assert_eq!(next_event(&mut second).1.kind, event_kind::ACCEPTED);
    second.send(&ClientMsg::NewOrder(order(3, 2, 0, 1))).unwrap();
    assert_eq!(next_event(&mut second).1.reason, gateway_reason::WRONG_CLIENT);
    let metrics = http_get(server.metrics_listen.unwrap());
    assert!(!metrics.contains("client="), "no client id on the default page:\n{metrics}");
    assert_eq!(sample(&metrics, "gateway_orders_in_total"), 2.0);
    assert_eq!(sample(&metrics, "gateway_logons_total"), 2.0);
    let wrong_client =
        format!("gateway_rejects_total{{reason=\"{}\"}}", gateway_reason::WRONG_CLIENT);
    assert_eq!(sample(&metrics, &wrong_client), 1.0);
}

#[test]
fn a_metrics_token_guards_the_page_but_not_health_and_ready() {
    let settings = Settings { metrics_token: Some("m3trics".into()), ..Settings::default() };
    let (server, _dir) = start(settings);
    let addr = server.metrics_listen.unwrap();
    let without = http(addr, "GET /metrics HTTP/1.1");
    assert!(status(&without) == "401", "{without}");
    assert!(!without.contains("gateway_"), "no metric in a refusal: {without}");
    let wrong = http(addr, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer admin");
    assert!(status(&wrong) == "401", "{wrong}");
    let right = http(addr, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer m3trics");
    assert!(status(&right) == "200" && right.contains("gateway_orders_in_total"));
    for open in ["GET /health HTTP/1.1", "GET /ready HTTP/1.1"] {
        assert!(status(&http(addr, open)) == "200", "{open} needs no token");
    }
}

#[test]
fn an_open_metrics_listener_off_loopback_is_refused_and_a_token_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    let exposed = |settings: Settings| ServeOptions {
        metrics_listen: Some("0.0.0.0:0".parse().unwrap()),
        settings: Settings { store_dir: dir.path().to_path_buf(), ..settings },
        ..common::serve_options(dir.path(), common::native_credentials(SECRET), 8)
    };
    let error = gateway::start(exposed(Settings::default())).err().expect("refused");
    assert!(matches!(error, gateway::ServeError::MetricsExposed { .. }), "{error}");
    assert!(error.to_string().contains("metrics_token"), "says what to do: {error}");
    let guarded = Settings { metrics_token: Some("m3trics".into()), ..Settings::default() };
    let running = gateway::start(exposed(guarded)).expect("a token allows any address");
    assert!(!running.metrics_listen.unwrap().ip().is_loopback());
}

#[test]
fn idle_connections_beyond_the_bound_are_closed_and_the_listener_recovers() {
    use std::io::Read;
    let (server, _dir) = start(Settings::default());
    let addr = server.metrics_listen.unwrap();
    let idle: Vec<std::net::TcpStream> = (0..gateway::HTTP_CONNECTIONS_MAX)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let mut extra = std::net::TcpStream::connect(addr).unwrap();
    let mut answer = String::new();
    extra.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "", "closed unanswered while the bound is taken");
    drop(idle);
    // Each idle connection's slot comes back once the endpoint sees it closed, or at the
    // latest after the endpoint's timeout.
    let started = std::time::Instant::now();
    let health = std::iter::repeat_with(|| {
        std::thread::sleep(Duration::from_millis(20));
        http(addr, "GET /health HTTP/1.1")
    })
    .take_while(|_| started.elapsed() < ops::endpoint::HTTP_CONNECTION_TIMEOUT * 2)
    .find(|answer| status(answer) == "200");
    assert!(health.is_some(), "served again once the idle connections went");
}

// The store's bound (issue 29): compaction keeps what recovery needs.

#[test]
fn a_store_past_its_bound_shrinks_and_a_restart_keeps_numbering_and_the_replay_window() {
    const ORDERS: u64 = 600;
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        store_dir: dir.path().to_path_buf(),
        store_bytes_max: 8 << 10,
        replay_events_max: 8,
        ..Settings::default()
    };
    let serve = || {
        let options = common::serve_options(dir.path(), common::native_credentials(SECRET), 8);
        gateway::start(ServeOptions { settings: settings.clone(), ..options }).unwrap()
    };
    let store = dir.path().join(gateway::STORE_FILE_NAME);
    let server = serve();
    let mut session = logged_in(server.listen, 1, 0);
    let mut largest = 0;
    // Each order placed and cancelled (open orders are kept by compaction): events 2t-1, 2t.
    for token in 1..=ORDERS as u32 {
        session.send(&ClientMsg::NewOrder(order(1, token, 0, 1))).unwrap();
        let (seq, event) = next_event(&mut session);
        assert_eq!(
            (seq, event.kind, event.token),
            (2 * u64::from(token) - 1, event_kind::ACCEPTED, token)
        );
        session.send(&ClientMsg::Cancel(order(1, token, 0, 0))).unwrap();
        let (seq, event) = next_event(&mut session);
        assert_eq!(
            (seq, event.kind, event.token),
            (2 * u64::from(token), event_kind::CANCELLED, token)
        );
        largest = largest.max(std::fs::metadata(&store).unwrap().len());
    }
    let written = sample(&http_get(server.metrics_listen.unwrap()), "gateway_store_bytes_total");
    assert!(written > 2.0 * settings.store_bytes_max as f64, "{written} bytes written");
    // Compaction runs between units of work: one batch may pass the bound before it.
    assert!(largest < settings.store_bytes_max + 4096, "the file reached {largest} bytes");
    drop(session);
    server.stop();

    let server = serve();
    let mut again = NativeClient::connect(server.listen).unwrap();
    let refused = again.login(1, SECRET, 1, WAIT).unwrap();
    let unavailable = login_reject::SEQUENCE_UNAVAILABLE;
    assert_eq!(refused, ServerMsg::LoginRejected { reason: unavailable }, "older than kept");
    let last = 2 * ORDERS;
    let mut replay = logged_in(server.listen, 1, last - 7);
    for seq in last - 7..=last {
        let (replayed, event) = next_event(&mut replay);
        assert_eq!((replayed, u64::from(event.token)), (seq, seq.div_ceil(2)), "the window");
    }
    replay.send(&ClientMsg::NewOrder(order(1, 1000, 0, 1))).unwrap();
    assert_eq!(next_event(&mut replay).0, last + 1, "numbering goes on");
}
