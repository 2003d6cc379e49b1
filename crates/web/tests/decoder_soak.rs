//! The web request decoder soak (not CI): generated HTTP/1.1 requests, valid and damaged
//! (flipped, cut, spliced bytes; hostile `Content-Length`, `Transfer-Encoding`, chunk sizes and
//! JSON), each sent on an in-memory connection served by `conn::serve_io`, the code every
//! socket connection runs: HTTP framing (hyper), chunked decoding, body admission, the bounds,
//! JSON parsing and validation, multiplication. Every input must end with the connection
//! closed, without a panic or a hang, after zero or more whole answers whose statuses are
//! documented, each refusal of ours with a documented `errorCode`.
//!
//! Run: `LEANTIER_SOAK_INPUTS=1000000 LEANTIER_SOAK_SEED=1 cargo test -p web --release --test
//! decoder_soak -- --ignored --nocapture` (defaults: 1,000,000 inputs, seed 1; a failure names
//! its input index, which `LEANTIER_SOAK_FIRST=<index> LEANTIER_SOAK_INPUTS=<index + 1>` replays alone).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use web::admission::WorkBounds;
use web::api::{ErrorCode, SizeLimits};
use web::conn::ConnectionBounds;
use web::exec::{ExecConfig, Model};
use web::server::Executors;

/// Inputs in flight at once: many, since a cut input waits for a timeout.
const CONCURRENCY: usize = 512;
/// The connection timeouts: short, so a cut input ends quickly.
const TIMEOUT: Duration = Duration::from_millis(100);
/// The longest one input may take before it counts as a hang.
const INPUT_TIMEOUT: Duration = Duration::from_secs(5);
/// Statuses an answer may have: ours (200, 400, 408, 413, 422, 501, 503), axum's routing (404,
/// 405) and hyper's refusals of a head (400, 431 header too large, 505 version).
const ALLOWED_STATUSES: [u16; 11] = [200, 400, 404, 405, 408, 413, 422, 431, 501, 503, 505];

const EXAMPLE: &str = r#"{"requestId": 7, "matrixOne": {"columnCount": 2, "rows": [{"value": "1,2"}, {"value": "-3, 4"}]},
    "matrixTwo": {"columnCount": 1, "rows": [{"value": "3"}, {"value": "4"}]}}"#;
// Mostly the served routes and method, so that most inputs reach the body decoder.
const PATHS: [&str; 6] =
    ["/matrix", "/matrix", "/matrix/single", "/matrix/pool", "/nowhere", "/matrix/"];
const METHODS: [&str; 6] = ["POST", "POST", "POST", "POST", "GET", "PUT"];
const CODINGS: [&str; 9] = [
    "chunked",
    "gzip, chunked",
    "chunked, chunked",
    "identity",
    "CHUNKED",
    " chunked ",
    "gzip",
    "chunked;q=1",
    "",
];
const LENGTHS: [&str; 8] =
    ["0", "-1", "18446744073709551616", "1e3", "+5", "5, 5", " 12", "999999999"];
const CHUNK_SIZES: [&str; 8] =
    ["ffffffffffffffff", "0x10", "-1", "1;x=\"q\"", " a", "zz", "10000000", ""];
const JSON_JUNK: [&str; 8] = ["{", "}", "[", "\"", "1e999", "-", "null", "\\u0000"];

/// xorshift64*: deterministic, fast, and good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// One generated request: a valid one of a random framing, then zero to three damages.
fn generate(rng: &mut Rng) -> Vec<u8> {
    let mut body = EXAMPLE.to_string();
    if rng.below(4) == 0 {
        let at = rng.below(body.len());
        body.insert_str(at, rng.pick(&JSON_JUNK));
    }
    // Mostly the last request of its connection, so that a whole one ends at its answer (the
    // client never half-closes: hyper drops the answer of a client that does).
    let close = if rng.below(8) == 0 { "" } else { "connection: close\r\n" };
    let head =
        format!("{} {} HTTP/1.1\r\nhost: soak\r\n{close}", rng.pick(&METHODS), rng.pick(&PATHS));
    let mut raw = match rng.below(4) {
        0 => format!("{head}content-length: {}\r\n\r\n{body}", body.len()),
        1 => format!("{head}content-length: {}\r\n\r\n{body}", rng.pick(&LENGTHS)),
        2 => format!(
            "{head}transfer-encoding: {}\r\n\r\n{}",
            rng.pick(&CODINGS),
            chunked(rng, &body)
        ),
        _ => format!("{head}transfer-encoding: chunked\r\n\r\n{}", chunked(rng, &body)),
    }
    .into_bytes();
    // Half the inputs undamaged beyond their headers' values, the others up to three times.
    for _ in 0..rng.below(6).saturating_sub(2) {
        damage(rng, &mut raw);
    }
    raw
}

/// `body` in random chunks, a chunk size sometimes replaced by a hostile one.
fn chunked(rng: &mut Rng, body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (piece, after) = rest.split_at((1 + rng.below(64)).min(rest.len()));
        let size = if rng.below(16) == 0 {
            rng.pick(&CHUNK_SIZES).to_string()
        } else {
            format!("{:x}", piece.len())
        };
        out.push_str(&format!("{size}\r\n{piece}\r\n"));
        rest = after;
    }
    out.push_str("0\r\n\r\n");
    out
}

fn damage(rng: &mut Rng, raw: &mut Vec<u8>) {
    if raw.is_empty() {
        return;
    }
    let at = rng.below(raw.len());
    match rng.below(5) {
        0 => raw[at] = rng.next() as u8,
        1 => raw.truncate(at),
        2 => raw.insert(at, rng.next() as u8),
        3 => {
            let copy = raw[at..].to_vec();
            raw.extend_from_slice(&copy);
        }
        _ => raw.splice(at..at, b"\r\n".iter().copied()).for_each(drop),
    }
}

/// Checks everything the server wrote for one input; the reason when it is wrong.
fn check(answer: &[u8]) -> Result<Vec<u16>, String> {
    let mut statuses = Vec::new();
    let mut rest = answer;
    while !rest.is_empty() {
        let head_end = rest
            .windows(4)
            .position(|window| window == b"\r\n\r\n")
            .ok_or("an answer cut inside its head")?;
        let head = std::str::from_utf8(&rest[..head_end]).map_err(|_| "a head not UTF-8")?;
        let head = head.to_ascii_lowercase();
        let status: u16 = head.get(9..12).and_then(|s| s.parse().ok()).ok_or("no status")?;
        if !ALLOWED_STATUSES.contains(&status) {
            return Err(format!("undocumented status {status}"));
        }
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .map_or(Ok(0), |value| value.trim().parse())
            .map_err(|_| "a bad content-length")?;
        let body = rest.get(head_end + 4..head_end + 4 + length).ok_or("an answer cut short")?;
        if status != 200 && head.contains("application/json") {
            let code = refusal_code(body)
                .map_err(|reason| format!("{reason}: {}", String::from_utf8_lossy(answer)))?;
            if !ErrorCode::ALL.iter().any(|known| known.code() == code) {
                return Err(format!("undocumented errorCode {code:?}"));
            }
        }
        statuses.push(status);
        rest = &rest[head_end + 4 + length..];
    }
    Ok(statuses)
}

/// The `errorCode` of a refusal `{"requestId":<id or null>,"errorCode":...}`. The whole
/// refusal must be JSON a standard reader accepts: an id it could not read back (such as
/// `1e9997`, out of a double's range) is answered with `null`, not echoed.
fn refusal_code(body: &[u8]) -> Result<String, String> {
    let refusal: serde_json::Value = serde_json::from_slice(body)
        .map_err(|error| format!("a refusal that is not JSON ({error})"))?;
    let code = refusal["errorCode"].as_str().ok_or("a refusal without errorCode")?;
    Ok(code.to_string())
}

async fn run_one(router: axum::Router, raw: Vec<u8>) -> Result<Vec<u16>, String> {
    let bounds = ConnectionBounds {
        header_timeout: TIMEOUT,
        body_timeout: TIMEOUT,
        idle_timeout: TIMEOUT,
        connections_max: 1,
        connections_per_address_max: 1,
    };
    let answer = common::exchange_in_memory(router, bounds, raw, INPUT_TIMEOUT).await?;
    check(&answer)
}

#[test]
#[ignore = "soak: run by hand or by scripts/soak-decoders"]
fn soak_web_request_decoder() {
    let inputs: u64 =
        std::env::var("LEANTIER_SOAK_INPUTS").map_or(1_000_000, |v| v.parse().unwrap());
    let seed: u64 = std::env::var("LEANTIER_SOAK_SEED").map_or(1, |v| v.parse().unwrap());
    // Reproduces a reported failure: its input index.
    let first: u64 = std::env::var("LEANTIER_SOAK_FIRST").map_or(0, |v| v.parse().unwrap());
    let config = ExecConfig {
        limits: SizeLimits { dim_max: 64, cells_max: 4096, ..SizeLimits::default() },
        workers: 2,
        queue_depth_max: 4 * CONCURRENCY,
    };
    // The adaptive model calibrates with larger requests than these limits allow: not served.
    let executors = Executors::start(&[Model::Single, Model::Pool], &config).unwrap();
    let router = executors.router(Model::Single, 1 << 14, &WorkBounds::default());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let next = Arc::new(AtomicU64::new(first));
    let started = Instant::now();
    let tallies = runtime.block_on(async {
        let workers: Vec<_> = (0..CONCURRENCY)
            .map(|_| {
                let (router, next) = (router.clone(), Arc::clone(&next));
                tokio::spawn(async move {
                    let mut tally = BTreeMap::<u16, u64>::new();
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        if index >= inputs {
                            return Ok(tally);
                        }
                        let raw = generate(&mut Rng(seed
                            ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            | 1));
                        let statuses =
                            run_one(router.clone(), raw.clone()).await.map_err(|reason| {
                                format!(
                                    "input {index} (seed {seed}): {reason}\n{}",
                                    String::from_utf8_lossy(&raw)
                                )
                            })?;
                        // 0 counts the inputs closed without an answer.
                        for status in
                            statuses.iter().copied().chain(statuses.is_empty().then_some(0))
                        {
                            *tally.entry(status).or_default() += 1;
                        }
                    }
                })
            })
            .collect();
        let mut total = BTreeMap::<u16, u64>::new();
        for worker in workers {
            let tally: Result<_, String> = worker.await.unwrap();
            for (status, count) in tally.unwrap_or_else(|failure| panic!("{failure}")) {
                *total.entry(status).or_default() += count;
            }
        }
        total
    });
    let elapsed = started.elapsed();
    let ran = inputs.saturating_sub(first);
    println!(
        "web decoder soak: {ran} inputs (seed {seed}, from {first}) in {elapsed:.1?} ({:.0}/s); answers by status (0: closed without one): {tallies:?}",
        ran as f64 / elapsed.as_secs_f64()
    );
    // A replay of one input may be refused; a run of many must also reach the multiplication.
    let valid = tallies.get(&200).copied().unwrap_or(0);
    assert!(ran < 1000 || valid > 0, "no input was answered 200: the generator is broken");
}
