//! The gateway end to end on the tier in its layouts (parked thread per stage, the planned
//! `auto` layout; journal off and on, the store's syncer waiting for the journal or the tier
//! holding replies): orders in over several sessions at once, every report out to the session
//! that owns it, in sequence and in the book's price-time order.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use exchange::durability::JournalMode;
use exchange::tier::{LayoutChoice, TierConfig, WaitChoice};
use gateway::Settings;
use gateway::client::NativeClient;
use gateway::native::{ClientMsg, Event, OrderRequest, ServerMsg, event_kind, gateway_reason};
use gateway::{Running, ServeOptions};

/// Generous on a loaded 2-core machine; a passing run never waits this long.
const WAIT: Duration = Duration::from_secs(10);
const SECRET: &str = "s3cret";
/// Instrument 1's reference price (on tick, inside the band).
const PRICE: i64 = 101_000;
/// The journal's group-commit policy (its default).
const GROUP: JournalMode = JournalMode::ALL[0];
/// Orders per session: more than one ring batch (256), sent back to back so that one read
/// of the server carries many.
const ORDERS: u32 = 300;

/// A server on the tier `tier` makes of the test's universe, with the store syncing or not.
fn start(
    tier: impl FnOnce(TierConfig) -> TierConfig,
    store_sync: bool,
) -> (Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let options = common::serve_options(dir.path(), common::native_credentials(SECRET), 8);
    let settings = Settings { store_sync, ..options.settings.clone() };
    let options = ServeOptions { tier: tier(options.tier.clone()), settings, ..options };
    (gateway::start(options).unwrap(), dir)
}

fn journaled(tier: TierConfig) -> TierConfig {
    TierConfig { journal: GROUP, ..tier }
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

fn assert_layout(text: &str, groups: &str) {
    assert!(text.contains(&format!("groups=\"{groups}\"")), "layout {groups} in:\n{text}");
    assert!(text.contains("gateway_usable_cpus "), "{text}");
    let reports = 2 * ORDERS + 2 * ORDERS + ORDERS + ORDERS; // accepts and fills, other's two
    assert!(text.contains(&format!("gateway_engine_out_total {reports}\n")), "{text}");
}

/// The parked tier's groups: one thread per stage.
const PARKED: &str =
    "preprocess:park core:park rprocess:park sender:park events:park masterdata:park";

#[test]
fn a_parked_tier_trades_across_sessions_in_order() {
    let (server, _dir) = start(|tier| tier, true);
    assert_layout(&trade_across_sessions(&server), PARKED);
}

#[test]
fn the_planned_layout_trades_across_sessions_in_order() {
    let auto = |tier| TierConfig { layout: LayoutChoice::Auto, wait: WaitChoice::Auto, ..tier };
    let (server, _dir) = start(auto, true);
    let groups = server.layout.groups.iter().map(|g| g.label()).collect::<Vec<_>>();
    assert!(groups.iter().any(|g| g.contains("core")), "{groups:?}");
    let text = trade_across_sessions(&server);
    assert!(text.contains("gateway_layout_info{groups=\""), "{text}");
}

#[test]
fn with_the_journal_the_store_waits_for_it_and_reports_stay_in_order() {
    let (server, _dir) = start(journaled, true);
    assert_layout(&trade_across_sessions(&server), PARKED);
}

#[test]
fn with_the_journal_and_an_unsynced_store_the_tier_holds_replies_in_order() {
    let (server, _dir) = start(journaled, false);
    assert_layout(&trade_across_sessions(&server), PARKED);
}

#[test]
fn with_the_journal_every_order_is_answered_when_the_rings_are_full() {
    // Rings far smaller than a burst: the pre-process input fills (orders answered busy) while
    // the reply rings and the journal's fill behind it. The I/O thread must never wait on the
    // tier, which may be waiting for it to read replies.
    let small = |tier| TierConfig { ring_slots: 64, batch_slots: 64, ..journaled(tier) };
    let (server, _dir) = start(small, true);
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
