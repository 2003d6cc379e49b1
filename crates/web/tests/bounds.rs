//! The connection bounds over real sockets (idle, header and body timeouts, the connection
//! limits and the eviction of idle connections), the work held by answers that their clients
//! do not read, the answer bound, and the framing refusals (malformed chunks, unsupported
//! transfer codings), with short bounds configured for the test and generous margins for a
//! loaded host.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use web::admission::WorkBounds;
use web::api::SizeLimits;
use web::conn::ConnectionBounds;
use web::exec::{ExecConfig, Model};
use web::server::{Executors, ServeBounds, Server, ServerConfig};

const EXAMPLE: &str = r#"{"requestId": 7, "matrixOne": {"columnCount": 2, "rows": [{"value": "1,2"}]},
    "matrixTwo": {"columnCount": 1, "rows": [{"value": "3"}, {"value": "4"}]}}"#;
const EXAMPLE_ANSWER: &str = r#"{"requestId":"7","rows":[[11]]}"#;

/// Long enough never to fire in a test that is about another bound.
const LONG: Duration = Duration::from_secs(30);
/// The bound a test is about: short, so the test is quick.
const SHORT: Duration = Duration::from_millis(400);
/// The most a test waits for the server to act on a bound (the host may be loaded).
const PATIENCE: Duration = Duration::from_secs(6);
/// Long enough for the server to have read what a test just sent (the host may be loaded).
const SETTLE: Duration = Duration::from_millis(300);

fn bounds(header: Duration, body: Duration, idle: Duration, connections_max: usize) -> ServeBounds {
    let connection = ConnectionBounds {
        header_timeout: header,
        body_timeout: body,
        idle_timeout: idle,
        connections_max,
        connections_per_address_max: connections_max,
    };
    ServeBounds { connection, work: WorkBounds::default() }
}

fn exec_config() -> ExecConfig {
    ExecConfig {
        limits: SizeLimits { dim_max: 1000, cells_max: 100_000, ..SizeLimits::default() },
        workers: 2,
        queue_depth_max: 16,
    }
}

fn start(bounds: ServeBounds) -> Server {
    start_with(bounds, exec_config())
}

fn start_with(bounds: ServeBounds, exec: ExecConfig) -> Server {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ServerConfig {
        default_model: Model::Pinned,
        exec,
        body_bytes_max: 1 << 16,
        io_threads: 2,
        bounds,
    };
    Server::start(listener, config).unwrap()
}

fn connect(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(server.local_addr()).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

fn request(body: &str) -> String {
    format!(
        "POST /matrix HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One response: its status and body (the head names the body's length).
fn read_response(stream: &mut TcpStream) -> (u16, String) {
    let mut bytes = Vec::new();
    let mut byte = [0u8; 1];
    while !bytes.ends_with(b"\r\n\r\n") {
        let read = stream.read(&mut byte).expect("a response within the patience");
        assert_eq!(read, 1, "closed before a whole head: {:?}", String::from_utf8_lossy(&bytes));
        bytes.push(byte[0]);
    }
    let head = String::from_utf8(bytes).unwrap().to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length: "))
        .map_or(0, |value| value.trim().parse().unwrap());
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).unwrap();
    (status, String::from_utf8(body).unwrap())
}

/// Waits for the server to close `stream` (EOF or reset) and returns how long that took;
/// panics if it is still open after [`PATIENCE`].
fn time_until_closed(stream: &mut TcpStream, since: Instant) -> Duration {
    let mut buffer = [0u8; 256];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return since.elapsed(),
            Ok(_) => continue,
            Err(error) if error.kind() == ErrorKind::ConnectionReset => return since.elapsed(),
            Err(error) => panic!("still open after {:?}: {error}", since.elapsed()),
        }
    }
}

fn error_code(body: &str) -> String {
    let json: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    json["errorCode"].as_str().unwrap_or_default().to_string()
}

/// A new connection that sends nothing, and a keep-alive one after its answer, are closed once
/// idle for the idle timeout, not before half of it.
#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let server = start(bounds(LONG, LONG, SHORT, 16));
    let mut fresh = connect(&server);
    let idle = time_until_closed(&mut fresh, Instant::now());
    assert!(idle >= SHORT / 2, "closed after {idle:?}");
    let mut kept = connect(&server);
    kept.write_all(request(EXAMPLE).as_bytes()).unwrap();
    assert_eq!(read_response(&mut kept), (200, EXAMPLE_ANSWER.to_string()));
    let idle = time_until_closed(&mut kept, Instant::now());
    assert!(idle >= SHORT / 2, "closed after {idle:?}");
}

/// A header sent a line every 50 ms (slowloris) is closed at the header timeout although bytes
/// keep arriving, long before the idle timeout.
#[test]
fn a_trickled_header_is_closed_after_the_header_timeout() {
    let server = start(bounds(SHORT, LONG, LONG, 16));
    let mut stream = connect(&server);
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let start = Instant::now();
    stream.write_all(b"POST /matrix HTTP/1.1\r\nhost: test\r\n").unwrap();
    let mut buffer = [0u8; 64];
    let closed_after = loop {
        assert!(start.elapsed() < PATIENCE, "a trickled header was held {PATIENCE:?}");
        match stream.read(&mut buffer) {
            Ok(0) => break start.elapsed(),
            Ok(read) => panic!("an answer to half a header: {:?}", &buffer[..read]),
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // Still open: one more header line. A write may fail once the server closed.
                if stream.write_all(b"x-slow: 1\r\n").is_err() {
                    break start.elapsed();
                }
            }
            Err(_reset) => break start.elapsed(),
        }
    };
    assert!(closed_after >= SHORT / 2, "closed after {closed_after:?}");
}

/// A body sent a byte every 50 ms is answered 408 with code 013 at the body timeout, and the
/// connection is closed.
#[test]
fn a_trickled_body_gets_408_after_the_body_timeout() {
    let server = start(bounds(LONG, SHORT, LONG, 16));
    let mut stream = connect(&server);
    let head = "POST /matrix HTTP/1.1\r\nhost: test\r\ncontent-length: 1000\r\n\r\n{";
    stream.write_all(head.as_bytes()).unwrap();
    let start = Instant::now();
    let trickle = {
        let mut writer = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            while start.elapsed() < PATIENCE && writer.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let (status, body) = read_response(&mut stream);
    let answered_after = start.elapsed();
    assert_eq!((status, error_code(&body).as_str()), (408, "013"), "{body}");
    assert!(answered_after >= SHORT / 2, "answered after {answered_after:?}");
    time_until_closed(&mut stream, start);
    drop(stream);
    trickle.join().unwrap();
}

/// With a limit of two connections, both in a request (a header begun, so neither is idle), a
/// third gets 503 with code 010 and is closed while the two are served; once one of them
/// closes, a new connection is served.
#[test]
fn connections_past_the_limit_are_refused_while_none_is_idle() {
    let server = start(bounds(LONG, LONG, LONG, 2));
    let whole = request(EXAMPLE);
    let (begun, rest) = whole.split_at(20);
    let mut held: Vec<TcpStream> = (0..2).map(|_| connect(&server)).collect();
    for stream in &mut held {
        stream.write_all(begun.as_bytes()).unwrap();
    }
    std::thread::sleep(SETTLE);
    let mut extra = connect(&server);
    let (status, body) = read_response(&mut extra);
    assert_eq!((status, error_code(&body).as_str()), (503, "010"), "{body}");
    time_until_closed(&mut extra, Instant::now());
    for stream in &mut held {
        stream.write_all(rest.as_bytes()).unwrap();
        assert_eq!(read_response(stream), (200, EXAMPLE_ANSWER.to_string()));
    }
    drop(held.pop());
    let start = Instant::now();
    loop {
        let mut stream = connect(&server);
        // The server may not have seen the close yet: then this one is refused too.
        if stream.write_all(request(EXAMPLE).as_bytes()).is_ok()
            && read_response(&mut stream).0 == 200
        {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "a freed slot was never reused");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `zz` is no chunk size: 400 with code 011 (it was 413, code 007). `gzip, chunked` names a
/// coding the server cannot undo: 501 with code 012 (it was served as plain chunked), and so
/// does any other coding; `chunked, chunked` is malformed. Each answer is the last on its
/// connection; a well-formed chunked body on the same server is still answered.
#[test]
fn bad_chunked_framing_is_400_and_unknown_codings_are_501() {
    let server = start(bounds(LONG, LONG, LONG, 16));
    let chunked = |coding: &str, chunks: &str| {
        format!(
            "POST /matrix HTTP/1.1\r\nhost: test\r\ntransfer-encoding: {coding}\r\n\r\n{chunks}"
        )
    };
    let body = format!("{:x}\r\n{EXAMPLE}\r\n0\r\n\r\n", EXAMPLE.len());
    let cases = [
        (chunked("chunked", "zz\r\n{}\r\n0\r\n\r\n"), 400, "011"),
        (chunked("chunked", "ffffffffffffffffff\r\n{}\r\n0\r\n\r\n"), 400, "011"),
        (chunked("gzip, chunked", &body), 501, "012"),
        (chunked("deflate,chunked", &body), 501, "012"),
        (chunked("chunked, chunked", &body), 400, "011"),
    ];
    for (raw, status, code) in cases {
        let mut stream = connect(&server);
        stream.write_all(raw.as_bytes()).unwrap();
        let (answered, answer) = read_response(&mut stream);
        assert_eq!((answered, error_code(&answer).as_str()), (status, code), "{raw:?}: {answer}");
        time_until_closed(&mut stream, Instant::now());
    }
    let mut stream = connect(&server);
    stream.write_all(chunked("chunked", &body).as_bytes()).unwrap();
    assert_eq!(read_response(&mut stream), (200, EXAMPLE_ANSWER.to_string()));
}

/// Sends `raw` on an in-memory connection and returns everything the server wrote.
async fn exchange_in_memory(router: axum::Router, raw: Vec<u8>) -> Vec<u8> {
    let bounds = bounds(SHORT, SHORT, SHORT, 1).connection;
    common::exchange_in_memory(router, bounds, raw, PATIENCE).await.unwrap()
}

static ROUTER: std::sync::LazyLock<axum::Router> = std::sync::LazyLock::new(|| {
    let executors = Executors::start(&[Model::Single], &exec_config()).unwrap();
    executors.router(Model::Single, 1 << 16, &WorkBounds::default())
});

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However a body is cut into chunks (with extensions and trailers), the answer is the
    /// example's; a chunk size line made malformed gets 400 with code 011 instead.
    #[test]
    fn chunked_bodies_decode_whole_or_are_refused_with_011(
        cuts in proptest::collection::vec(1usize..40, 0..8),
        extension in proptest::option::of("[a-z]{1,5}"),
        corrupt in proptest::option::of((0usize..8, "[g-z]{1,3}")),
    ) {
        let mut pieces = Vec::new();
        let mut rest = EXAMPLE;
        for cut in cuts {
            let (piece, after) = rest.split_at(cut.min(rest.len()));
            if !piece.is_empty() {
                pieces.push(piece);
            }
            rest = after;
        }
        if !rest.is_empty() {
            pieces.push(rest);
        }
        let corrupted = corrupt.as_ref().map(|(index, _)| index % pieces.len());
        let mut raw = String::from("POST /matrix HTTP/1.1\r\nhost: t\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n");
        for (index, piece) in pieces.iter().enumerate() {
            let size = match (&corrupt, corrupted == Some(index)) {
                (Some((_, junk)), true) => format!("{junk}{:x}", piece.len()),
                _ => format!("{:x}", piece.len()),
            };
            let extension = extension.as_deref().map(|name| format!(";{name}=1")).unwrap_or_default();
            raw.push_str(&format!("{size}{extension}\r\n{piece}\r\n"));
        }
        raw.push_str("0\r\nx-trailer: 1\r\n\r\n");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let answer = runtime.block_on(exchange_in_memory(ROUTER.clone(), raw.into_bytes()));
        let answer = String::from_utf8_lossy(&answer);
        if corrupted.is_some() {
            prop_assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
            prop_assert!(answer.contains("\"errorCode\":\"011\""), "{answer}");
        } else {
            prop_assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            prop_assert!(answer.ends_with(EXAMPLE_ANSWER), "{answer}");
        }
    }
}

/// `dim`×1 · 1×`dim` with 10-digit cells: a body of about 36 KB for `dim` 1000 whose product
/// cells have 19 digits, so its answer is 20 MB of text that no socket buffer absorbs.
fn outer_product_request(dim: usize) -> String {
    const CELL: &str = "3037000499"; // its square is just below i64::MAX
    let column = vec![format!("{{\"value\":\"{CELL}\"}}"); dim].join(",");
    let row = vec![CELL; dim].join(",");
    request(&format!(
        "{{\"requestId\":1,\"matrixOne\":{{\"columnCount\":1,\"rows\":[{column}]}},\
         \"matrixTwo\":{{\"columnCount\":{dim},\"rows\":[{{\"value\":\"{row}\"}}]}}}}"
    ))
}

/// Resident memory of this process (the server runs in it), in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// How many connections send an outer-product request and never read its answer.
const NON_READERS: usize = 12;
/// A non-reader's receive buffer: fixed and small, as a client that reads nothing gets, so
/// that the kernel cannot absorb the answers (an unset buffer grew to take one 20 MB answer
/// whole on the test host, and the test measured one more answer than it meant to).
const NON_READER_RECEIVE_BYTES: usize = 64 << 10;

/// Connections that send a 36 KB body with a 20 MB answer and never read it: the server holds
/// the work of one such answer at a time (its reservation lasts until the answer is written),
/// the others get 009 after the admission wait, so its resident memory grows by about one
/// answer (21 MiB measured), not twelve (256 MiB measured before the answer was counted, and
/// 48 MiB when the reservation was let go before the answer was written); a small request is
/// answered meanwhile; and once the write progress timeout cuts the stalled connection off, its
/// room comes back and a client that reads gets the same large answer.
#[test]
fn answers_that_are_never_read_hold_bounded_memory() {
    let limits = SizeLimits { dim_max: 1000, cells_max: 1 << 20, answer_bytes_max: 24 << 20 };
    let work = WorkBounds {
        large_work_bytes_max: 32 << 20,
        connection_work_bytes_max: 32 << 20,
        wait_timeout: Duration::from_secs(1),
        ..WorkBounds::default()
    };
    let idle = Duration::from_secs(3);
    let bounds = ServeBounds { work, ..bounds(LONG, LONG, idle, 64) };
    let server = start_with(bounds, ExecConfig { limits, queue_depth_max: 256, ..exec_config() });
    let mut warm = connect(&server);
    warm.write_all(request(EXAMPLE).as_bytes()).unwrap();
    assert_eq!(read_response(&mut warm).0, 200);
    let before = resident_bytes();
    let hostile = outer_product_request(1000);
    let attacked = Instant::now();
    let non_readers: Vec<TcpStream> = (0..NON_READERS)
        .map(|_| {
            let mut stream = connect_from(&server, [127, 0, 0, 1], NON_READER_RECEIVE_BYTES);
            stream.write_all(hostile.as_bytes()).unwrap();
            stream
        })
        .collect();
    std::thread::sleep(SETTLE);
    let sent = Instant::now();
    warm.write_all(request(EXAMPLE).as_bytes()).unwrap();
    assert_eq!(read_response(&mut warm), (200, EXAMPLE_ANSWER.to_string()));
    let waited = sent.elapsed();
    assert!(waited < Duration::from_secs(3), "a small request waited {waited:?}");
    // Past the admission wait, before the write progress timeout.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(attacked.elapsed()));
    let grown = resident_bytes().saturating_sub(before);
    assert!(grown < 40 << 20, "resident memory grew {} MiB", grown >> 20);
    std::thread::sleep(idle + SETTLE);
    let mut reader = connect(&server);
    reader.write_all(hostile.as_bytes()).unwrap();
    let (status, answer) = read_response(&mut reader);
    assert_eq!(status, 200, "the cut-off connection's room came back: {}", &answer[..120]);
    drop(non_readers);
}

/// An answer predicted beyond the bound is refused with code 014 (HTTP 422) without computing,
/// and the same connection is served on.
#[test]
fn an_answer_past_the_bound_is_refused_with_014() {
    let limits = SizeLimits { dim_max: 1000, cells_max: 1 << 20, answer_bytes_max: 1 << 20 };
    let exec = ExecConfig { limits, ..exec_config() };
    let server = start_with(bounds(LONG, LONG, LONG, 16), exec);
    let mut stream = connect(&server);
    stream.write_all(outer_product_request(1000).as_bytes()).unwrap();
    let (status, body) = read_response(&mut stream);
    assert_eq!((status, error_code(&body).as_str()), (422, "014"), "{body}");
    assert!(body.contains("1000x1000") && body.contains("1048576"), "{body}");
    stream.write_all(request(EXAMPLE).as_bytes()).unwrap();
    assert_eq!(read_response(&mut stream), (200, EXAMPLE_ANSWER.to_string()));
}

/// Every slot held by a connection that never sent a byte: a new client is still answered,
/// the longest-idle connection having been closed for it, and the others kept.
#[test]
fn idle_connections_make_room_for_a_new_client() {
    let server = start(bounds(LONG, LONG, LONG, 4));
    let mut idle: Vec<TcpStream> = Vec::new();
    for _ in 0..4 {
        idle.push(connect(&server));
        // Each is idle since it was accepted: distinct times make the oldest well defined.
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(SETTLE);
    let mut client = connect(&server);
    client.write_all(request(EXAMPLE).as_bytes()).unwrap();
    assert_eq!(read_response(&mut client), (200, EXAMPLE_ANSWER.to_string()));
    time_until_closed(&mut idle[0], Instant::now());
    let newest = &mut idle[3];
    newest.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let kept = newest.read(&mut [0u8; 16]).map_err(|error| error.kind());
    assert!(matches!(kept, Err(ErrorKind::WouldBlock | ErrorKind::TimedOut)), "{kept:?}");
}

/// A connection to `server` from `address` (of the loopback network) with a receive buffer of
/// `receive_bytes` (the system's choice when 0).
fn connect_from(server: &Server, address: [u8; 4], receive_bytes: usize) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    if receive_bytes > 0 {
        socket.set_recv_buffer_size(receive_bytes).unwrap();
    }
    socket.bind(&std::net::SocketAddr::from((address, 0)).into()).unwrap();
    socket.connect(&server.local_addr().into()).unwrap();
    let stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// One address holding its share of the slots with connections that are never idle (each in a
/// trickled header) gets 503 with code 010 for one more, while another address is served.
#[test]
fn one_address_cannot_take_every_slot() {
    let connection = ConnectionBounds {
        connections_per_address_max: 2,
        ..bounds(LONG, LONG, LONG, 8).connection
    };
    let server = start(ServeBounds { connection, work: WorkBounds::default() });
    let hog = [127, 0, 0, 1];
    let mut held: Vec<TcpStream> = (0..2).map(|_| connect_from(&server, hog, 0)).collect();
    for stream in &mut held {
        stream.write_all(b"POST /matrix HTTP/1.1\r\n").unwrap();
    }
    std::thread::sleep(SETTLE);
    let mut more = connect_from(&server, hog, 0);
    let (status, body) = read_response(&mut more);
    assert_eq!((status, error_code(&body).as_str()), (503, "010"), "{body}");
    assert!(body.contains("from this address"), "{body}");
    let mut other = connect_from(&server, [127, 0, 0, 2], 0);
    other.write_all(request(EXAMPLE).as_bytes()).unwrap();
    assert_eq!(read_response(&mut other), (200, EXAMPLE_ANSWER.to_string()));
}
