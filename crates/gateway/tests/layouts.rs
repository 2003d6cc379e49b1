//! The gateway end to end in each serve layout (inline, engine thread parked, engine thread
//! spinning; journal off and on): orders in over several sessions at once, every report out to
//! the session that owns it, in sequence and in the book's price-time order.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use exchange::durability::JournalMode;
use exchange::flow::{UniverseConfig, reference_master_data};
use gateway::client::NativeClient;
use gateway::engine::EngineJournal;
use gateway::hub::Settings;
use gateway::layout::Layout;
use gateway::native::{ClientMsg, Event, OrderRequest, ServerMsg, event_kind, gateway_reason};
use gateway::server::{self, Running, ServeOptions};
use pipeline::placement::Topology;
use pipeline::ring::RingConfig;

/// Generous on a loaded 2-core machine; a passing run never waits this long.
const WAIT: Duration = Duration::from_secs(10);
const SECRET: &str = "s3cret";
/// Instrument 1's reference price (on tick, inside the band).
const PRICE: i64 = 101_000;
/// The journal's group-commit policy (its default).
const GROUP: JournalMode = JournalMode::ALL[0];
/// Orders per session: more than one engine batch (256), sent back to back so that one read
/// of the server carries many.
const ORDERS: u32 = 300;

fn start(layout: Layout, cpus: usize, journal: JournalMode) -> (Running, tempfile::TempDir) {
    start_with_rings(layout, cpus, journal, RingConfig::default())
}

fn start_with_rings(
    layout: Layout,
    cpus: usize,
    journal: JournalMode,
    ring: RingConfig,
) -> (Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let credentials = common::native_credentials(SECRET);
    let options = ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        fix_listen: None,
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        settings: Settings { store_dir: dir.path().to_path_buf(), ..Settings::default() },
        credentials,
        master: reference_master_data(&UniverseConfig { instruments: 4, clients: 8 }),
        core_limits: Default::default(),
        ring,
        journal: EngineJournal { mode: journal, dir: dir.path().join("engine") },
        layout,
        topology: Topology::uniform(cpus),
    };
    (server::start(options).unwrap(), dir)
}

fn logged_in(addr: SocketAddr, client: u32) -> NativeClient {
    let mut session = NativeClient::connect(addr).unwrap();
    let answer = session.login(client, SECRET, 0, WAIT).unwrap();
    assert!(matches!(answer, ServerMsg::LoginAccepted { .. }), "{answer:?}");
    session
}

fn order(client: u32, token: u32, side: u8, price: i64) -> OrderRequest {
    OrderRequest { client, token, instrument: 1, side, price, qty: 1, ..OrderRequest::default() }
}

/// The next `count` sequenced events, checking their numbers run on from `first_seq`.
fn events(session: &mut NativeClient, first_seq: u64, count: u32) -> Vec<Event> {
    (0..u64::from(count))
        .map(|at| match session.recv(WAIT).unwrap() {
            Some(ServerMsg::Sequenced { seq, event }) => {
                assert_eq!(seq, first_seq + at, "sequence numbers without gaps");
                event
            }
            other => panic!("expected sequenced event {}, got {other:?}", first_seq + at),
        })
        .collect()
}

fn kinds_and_tokens(events: &[Event]) -> Vec<(u8, u32)> {
    events.iter().map(|event| (event.kind, event.token)).collect()
}

/// Client 1 rests ORDERS buys; then client 2 sells into them while client 3 places and cancels
/// orders of its own at once. Returns the server's metrics text.
fn trade_across_sessions(server: &Running) -> String {
    let mut buyer = logged_in(server.listen, 1);
    let mut seller = logged_in(server.listen, 2);
    let mut other = logged_in(server.listen, 3);
    for token in 1..=ORDERS {
        buyer.send(&ClientMsg::NewOrder(order(1, token, 0, PRICE))).unwrap();
    }
    let accepted = events(&mut buyer, 1, ORDERS);
    let expected: Vec<(u8, u32)> = (1..=ORDERS).map(|t| (event_kind::ACCEPTED, t)).collect();
    assert_eq!(kinds_and_tokens(&accepted), expected, "accepts in the order sent");

    for token in 1..=ORDERS {
        seller.send(&ClientMsg::NewOrder(order(2, token, 1, PRICE))).unwrap();
        // Below the buys, so it never meets the sells.
        other.send(&ClientMsg::NewOrder(order(3, token, 0, PRICE - 5))).unwrap();
        other.send(&ClientMsg::Cancel(order(3, token, 0, PRICE - 5))).unwrap();
    }
    let sold = events(&mut seller, 1, 2 * ORDERS);
    let expected: Vec<(u8, u32)> =
        (1..=ORDERS).flat_map(|t| [(event_kind::ACCEPTED, t), (event_kind::FILLED, t)]).collect();
    assert_eq!(kinds_and_tokens(&sold), expected, "each sell accepted, then filled");
    let filled = events(&mut buyer, u64::from(ORDERS) + 1, ORDERS);
    let expected: Vec<(u8, u32)> = (1..=ORDERS).map(|t| (event_kind::FILLED, t)).collect();
    assert_eq!(kinds_and_tokens(&filled), expected, "the buys filled in time priority");
    let placed = events(&mut other, 1, 2 * ORDERS);
    let expected: Vec<(u8, u32)> = (1..=ORDERS)
        .flat_map(|t| [(event_kind::ACCEPTED, t), (event_kind::CANCELLED, t)])
        .collect();
    assert_eq!(kinds_and_tokens(&placed), expected, "the third session's own flow, untouched");
    metrics(server.metrics_listen.unwrap())
}

fn metrics(addr: SocketAddr) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

fn assert_layout(text: &str, layout: &str, usable_cpus: usize) {
    assert!(text.contains(&format!("layout=\"{layout}\"")), "layout {layout} in:\n{text}");
    assert!(text.contains(&format!("gateway_usable_cpus {usable_cpus}\n")), "{text}");
    let reports = 2 * ORDERS + 2 * ORDERS + ORDERS + ORDERS; // accepts and fills, other's two
    assert!(text.contains(&format!("gateway_engine_out_total {reports}\n")), "{text}");
}

#[test]
fn inline_trades_across_sessions_in_order() {
    let (server, _dir) = start(Layout::Inline, 16, JournalMode::OFF);
    assert_layout(&trade_across_sessions(&server), "inline", 16);
}

#[test]
fn auto_runs_inline_on_two_cpus_and_says_why() {
    let (server, _dir) = start(Layout::Auto, 2, JournalMode::OFF);
    assert!(server.layout.reason.contains("2 usable CPUs"), "{:?}", server.layout);
    let text = trade_across_sessions(&server);
    assert_layout(&text, "inline", 2);
    assert!(text.contains("requested=\"auto\""), "{text}");
}

#[test]
fn a_parked_engine_thread_trades_across_sessions_in_order() {
    let (server, _dir) = start(Layout::EngineThread, 2, JournalMode::OFF);
    assert_layout(&trade_across_sessions(&server), "engine-thread-park", 2);
}

#[test]
fn a_spinning_engine_thread_trades_across_sessions_in_order() {
    // Planned on 3 CPUs: the engine spins on CPU 2 (pinned where the host has it).
    let (server, _dir) = start(Layout::Auto, 3, JournalMode::OFF);
    assert_layout(&trade_across_sessions(&server), "engine-thread-spin", 3);
}

#[test]
fn inline_with_the_journal_releases_reports_once_durable_in_order() {
    let (server, _dir) = start(Layout::Inline, 2, GROUP);
    assert_layout(&trade_across_sessions(&server), "inline", 2);
}

#[test]
fn a_parked_engine_thread_with_the_journal_trades_in_order() {
    let (server, _dir) = start(Layout::EngineThread, 2, GROUP);
    assert_layout(&trade_across_sessions(&server), "engine-thread-park", 2);
}

#[test]
fn inline_with_the_journal_answers_every_order_when_its_rings_are_full() {
    // Rings far smaller than a burst: the release thread's ring and the egress ring fill
    // while the journal syncs. Inline, the I/O thread must not wait on the first (the release
    // thread may be waiting on the second, which only the I/O thread drains).
    let ring = RingConfig { capacity_slots: 64, batch_slots_max: 64, ..RingConfig::default() };
    let (server, _dir) = start_with_rings(Layout::Inline, 2, GROUP, ring);
    let mut session = logged_in(server.listen, 1);
    for token in 1..=ORDERS {
        session.send(&ClientMsg::NewOrder(order(1, token, 0, PRICE))).unwrap();
    }
    let mut answered = events(&mut session, 1, ORDERS);
    for event in &answered {
        let busy = (event_kind::REJECTED, gateway_reason::BUSY);
        assert!(
            event.kind == event_kind::ACCEPTED || (event.kind, event.reason) == busy,
            "accepted, or refused as busy: {event:?}"
        );
    }
    answered.sort_by_key(|event| event.token);
    let tokens: Vec<u32> = answered.iter().map(|event| event.token).collect();
    assert_eq!(tokens, (1..=ORDERS).collect::<Vec<_>>(), "every order answered once");
    assert!(answered.iter().any(|event| event.kind == event_kind::ACCEPTED));
}
