//! The durable store across a killed server: a real server process (`gateway-serve-child`) is
//! SIGKILLed between two sessions, a new one starts over the same store directory, and the
//! FIX client resumes with the right sequence numbers and gets its resends, the native client
//! gets its replay under the same sequence numbers.

#[path = "common/fix_client.rs"]
mod fix_client;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use fix_client::{FixClient, Received, SECRET, WAIT, new_order};
use gateway::client::NativeClient;
use gateway::credentials;
use gateway::fix::tag;
use gateway::native::{ClientMsg, OrderRequest, ServerMsg, event_kind};

/// Instrument 1's reference price (on tick, inside the band).
const PRICE: i64 = 101_000;

/// A server child; killed with SIGKILL when dropped.
struct Server {
    child: Child,
    native: SocketAddr,
    fix: SocketAddr,
}

impl Server {
    /// Starts a server over `dir` (the tier parked) with the tier's journal `journal` (`off`, `group`).
    fn start(dir: &Path, journal: &str) -> Server {
        Server::start_with(dir, journal, 0, "parked")
    }

    /// Likewise, with cancel-on-disconnect after `cancel_ms` (0: off), with the tier `layout` (`parked` or `auto`).
    fn start_with(dir: &Path, journal: &str, cancel_ms: u64, layout: &str) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gateway-serve-child"))
            .arg("--store")
            .arg(dir.join("store"))
            .arg("--credentials")
            .arg(dir.join("credentials"))
            .args(["--journal", journal])
            .args(["--cancel-on-disconnect-ms", &cancel_ms.to_string()])
            .args(["--layout", layout])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server child starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut addr = |name: &str| {
            let line = lines.next().expect("the child prints its addresses").unwrap();
            let addr = line.strip_prefix(name).expect("`native ADDR` then `fix ADDR`");
            addr.trim().parse().unwrap()
        };
        let (native, fix) = (addr("native"), addr("fix"));
        Server { child, native, fix }
    }

    fn kill(mut self) {
        self.child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
        self.child.wait().unwrap();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A FIX client (F11, client id 11) and two native ones (client ids 1 and 2), all with
/// `SECRET`.
fn credentials_in(dir: &Path) {
    let hash = credentials::hash_secret(SECRET.as_bytes()).unwrap();
    let text = format!("11 fix F11 {hash}\n1 native N1 {hash}\n2 native N2 {hash}\n");
    std::fs::write(dir.join("credentials"), text).unwrap();
}

fn report_of(message: &Received) -> (&str, &str, &str, &str) {
    let get = |t| message.get(t);
    (get(tag::MSG_TYPE), get(tag::MSG_SEQ_NUM), get(tag::CL_ORD_ID), get(tag::POSS_DUP_FLAG))
}

#[test]
fn a_fix_session_resumes_with_its_sequence_numbers_resends_and_order_ids_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    credentials_in(dir.path());
    let server = Server::start(dir.path(), "group");
    let mut client = FixClient::connect(server.fix, "F11", 1);
    assert_eq!(client.logon(&[]).get(tag::MSG_SEQ_NUM), "1");
    client.send("D", &new_order("k1", "1", "2", "101000"));
    client.send("D", &new_order("k2", "2", "3", "103000"));
    let first = [client.recv(), client.recv()];
    assert_eq!(report_of(&first[0]), ("8", "2", "k1", ""));
    assert_eq!(report_of(&first[1]), ("8", "3", "k2", ""));
    server.kill();

    let server = Server::start(dir.path(), "group");
    // The client goes on from 4 (Logon 1, two orders): accepted without a resend request, so
    // the server kept the inbound number. Its outbound numbers go on after what its store
    // reserved for the messages it does not keep (the Logon took a run of
    // UNKEPT_SEQ_RESERVE): a killed server never numbers twice; the skip is a gap fill.
    let logon_seq = 1 + gateway::UNKEPT_SEQ_RESERVE;
    let mut client = FixClient::connect(server.fix, "F11", client.next_seq);
    let logon = client.logon(&[]);
    assert_eq!((logon.msg_type(), logon.get(tag::MSG_SEQ_NUM)), ("A", &*logon_seq.to_string()));
    client.send("2", &[(tag::BEGIN_SEQ_NO, "4"), (tag::END_SEQ_NO, "0")]);
    let gap_fill = client.recv();
    let fields = [tag::MSG_SEQ_NUM, tag::GAP_FILL_FLAG, tag::NEW_SEQ_NO].map(|t| gap_fill.get(t));
    // Up to and with the Logon (a session message: not kept either).
    let after_logon = (logon_seq + 1).to_string();
    assert_eq!((gap_fill.msg_type(), fields), ("4", ["4", "Y", &*after_logon]));
    client.send("1", &[(tag::TEST_REQ_ID, "after-kill")]);
    let heartbeat = client.recv();
    assert_eq!((heartbeat.msg_type(), heartbeat.get(tag::TEST_REQ_ID)), ("0", "after-kill"));
    // What the client saw before the kill comes back as possible duplicates, byte for byte
    // the same reports.
    client.send("2", &[(tag::BEGIN_SEQ_NO, "2"), (tag::END_SEQ_NO, "3")]);
    let resent = [client.recv(), client.recv()];
    assert_eq!(report_of(&resent[0]), ("8", "2", "k1", "Y"));
    assert_eq!(report_of(&resent[1]), ("8", "3", "k2", "Y"));
    for (old, new) in first.iter().zip(&resent) {
        for field in [tag::EXEC_ID, tag::EXEC_TYPE, tag::ORD_STATUS, tag::LEAVES_QTY] {
            assert_eq!(old.get(field), new.get(field), "tag {field}");
        }
    }
    // A new order gets a new OrderID: the recovered book still holds k1 and k2 under 1 and 2.
    client.send("D", &new_order("k3", "1", "1", "101000"));
    let accepted = client.recv();
    let after_heartbeat = (logon_seq + 2).to_string();
    assert_eq!(report_of(&accepted), ("8", &*after_heartbeat, "k3", ""), "after the Heartbeat");
    assert_eq!((accepted.get(tag::EXEC_TYPE), accepted.get(tag::ORDER_ID)), ("0", "3"));
    // An order from before the kill can be cancelled by its ClOrdID: the session's orders
    // were rebuilt from the store's reports, and the book from the journal.
    client.send(
        "F",
        &[
            (tag::ORIG_CL_ORD_ID, "k1"),
            (tag::CL_ORD_ID, "c1"),
            (tag::SYMBOL, "1"),
            (tag::SIDE, "1"),
            (tag::TRANSACT_TIME, "20240101-00:00:00.000"),
        ],
    );
    let cancelled = client.recv();
    assert_eq!(
        (
            cancelled.get(tag::EXEC_TYPE),
            cancelled.get(tag::ORIG_CL_ORD_ID),
            cancelled.get(tag::ORDER_ID)
        ),
        ("4", "k1", "1")
    );
    assert_eq!((cancelled.get(tag::ORDER_QTY), cancelled.get(tag::LEAVES_QTY)), ("2", "0"));
}

fn order(token: u32, side: u8, qty: u32, price: i64) -> OrderRequest {
    order_of(1, token, side, qty, price)
}

fn order_of(client: u32, token: u32, side: u8, qty: u32, price: i64) -> OrderRequest {
    OrderRequest { client, token, instrument: 1, side, order_type: 0, time_in_force: 0, price, qty }
}

fn sequenced(session: &mut NativeClient) -> (u64, gateway::native::Event) {
    match session.recv(WAIT).unwrap() {
        Some(ServerMsg::Sequenced { seq, event }) => (seq, event),
        other => panic!("expected a sequenced event, got {other:?}"),
    }
}

#[test]
fn a_native_client_gets_its_replay_under_the_same_numbers_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    credentials_in(dir.path());
    let server = Server::start(dir.path(), "off");
    let mut session = NativeClient::connect(server.native).unwrap();
    let login = session.login(1, SECRET, 1, WAIT).unwrap();
    assert_eq!(login, ServerMsg::LoginAccepted { client: 1, next_seq: 1 });
    session.send(&ClientMsg::NewOrder(order(7, 0, 5, PRICE))).unwrap();
    session.send(&ClientMsg::NewOrder(order(8, 1, 4, PRICE + 2_000))).unwrap();
    let before = [sequenced(&mut session), sequenced(&mut session)];
    assert_eq!((before[0].0, before[0].1.token, before[0].1.kind), (1, 7, event_kind::ACCEPTED));
    assert_eq!((before[1].0, before[1].1.token, before[1].1.kind), (2, 8, event_kind::ACCEPTED));
    server.kill();

    let server = Server::start(dir.path(), "off");
    let mut session = NativeClient::connect(server.native).unwrap();
    let login = session.login(1, SECRET, 1, WAIT).unwrap();
    assert_eq!(login, ServerMsg::LoginAccepted { client: 1, next_seq: 1 });
    let replayed = [sequenced(&mut session), sequenced(&mut session)];
    assert_eq!(replayed, before, "the replay is what the killed server sent, same numbers");
    session.send(&ClientMsg::NewOrder(order(9, 0, 1, PRICE))).unwrap();
    let (seq, event) = sequenced(&mut session);
    assert_eq!((seq, event.token), (3, 9), "numbering goes on after the replay");
}

#[test]
fn orders_on_the_book_before_a_kill_are_there_after_it_with_the_engine_journal() {
    let dir = tempfile::tempdir().unwrap();
    credentials_in(dir.path());
    // One layout before the kill, the other after: both journal and recover alike.
    let server = Server::start_with(dir.path(), "group", 0, "parked");
    let mut buyer = NativeClient::connect(server.native).unwrap();
    buyer.login(1, SECRET, 0, WAIT).unwrap();
    buyer.send(&ClientMsg::NewOrder(order(7, 0, 5, PRICE))).unwrap();
    let (_, accepted) = sequenced(&mut buyer);
    // Sent only once the journal had the order: the kill cannot lose it.
    assert_eq!((accepted.kind, accepted.leaves_qty), (event_kind::ACCEPTED, 5));
    server.kill();

    let server = Server::start_with(dir.path(), "group", 0, "auto");
    let mut seller = NativeClient::connect(server.native).unwrap();
    seller.login(2, SECRET, 0, WAIT).unwrap();
    seller.send(&ClientMsg::NewOrder(order_of(2, 1, 1, 5, PRICE))).unwrap();
    let (_, sell_accepted) = sequenced(&mut seller);
    assert_eq!(sell_accepted.kind, event_kind::ACCEPTED);
    let (_, fill) = sequenced(&mut seller);
    assert_eq!(
        (fill.kind, fill.qty, fill.price, fill.leaves_qty),
        (event_kind::FILLED, 5, PRICE, 0),
        "the sell met the buy the killed server had accepted"
    );
    // The buyer logs on again and gets its side of the trade (event 2: 1 was the accept).
    let mut buyer = NativeClient::connect(server.native).unwrap();
    buyer.login(1, SECRET, 2, WAIT).unwrap();
    let (seq, filled) = sequenced(&mut buyer);
    assert_eq!((seq, filled.kind, filled.token, filled.qty), (2, event_kind::FILLED, 7, 5));
}

#[test]
fn orders_of_a_session_the_kill_ended_are_cancelled_after_the_grace_window() {
    const GRACE_MS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    credentials_in(dir.path());
    let server = Server::start_with(dir.path(), "group", GRACE_MS, "auto");
    let mut buyer = NativeClient::connect(server.native).unwrap();
    buyer.login(1, SECRET, 0, WAIT).unwrap();
    buyer.send(&ClientMsg::NewOrder(order(7, 0, 5, PRICE))).unwrap();
    assert_eq!(sequenced(&mut buyer).1.kind, event_kind::ACCEPTED);
    server.kill();

    // The buyer stays away past the grace window (ten times over: a loaded host's timers).
    let server = Server::start_with(dir.path(), "group", GRACE_MS, "auto");
    std::thread::sleep(std::time::Duration::from_millis(10 * GRACE_MS));
    let mut buyer = NativeClient::connect(server.native).unwrap();
    buyer.login(1, SECRET, 2, WAIT).unwrap();
    let (seq, cancelled) = sequenced(&mut buyer);
    assert_eq!((seq, cancelled.kind, cancelled.token), (2, event_kind::CANCELLED, 7));
}

/// Issue 42: a flipped byte in a synced record of the store (a damaged disk) loses that
/// record only. The restarted server skips it, keeps the records after it, fills the lost
/// number with a "not kept" reject, and numbers on past every number the damaged bytes may
/// have carried: no number the client saw is used again.
#[test]
fn a_flipped_byte_in_a_synced_record_loses_only_that_record_after_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    credentials_in(dir.path());
    let server = Server::start(dir.path(), "off");
    let mut session = NativeClient::connect(server.native).unwrap();
    session.login(1, SECRET, 1, WAIT).unwrap();
    // One at a time: each event is out (its batch synced) before the next batch is written,
    // so each batch end claims the batch before it.
    for (token, side) in [(7, 0), (8, 1), (9, 0)] {
        let price = if side == 0 { PRICE } else { PRICE + 2_000 };
        session.send(&ClientMsg::NewOrder(order(token, side, 1, price))).unwrap();
        assert_eq!(sequenced(&mut session).1.token, token);
    }
    server.kill();
    let path = dir.path().join("store").join(gateway::STORE_FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    let mut second_at = None;
    gateway::record::scan(&mut bytes.as_slice(), |record| {
        let frame = gateway::native::split_frame(record.payload).ok().flatten();
        let decoded =
            frame.and_then(|(v, k, body, _)| gateway::native::decode_server(v, k, body).ok());
        if let Some(ServerMsg::Sequenced { seq: 2, .. }) = decoded {
            second_at = Some(record.payload_at as usize);
        }
        true
    })
    .unwrap();
    bytes[second_at.expect("event 2's record") + 6] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let server = Server::start(dir.path(), "off");
    let mut session = NativeClient::connect(server.native).unwrap();
    session.login(1, SECRET, 1, WAIT).unwrap();
    let mut replayed = Vec::new();
    while let Some(ServerMsg::Sequenced { seq, event }) =
        session.recv(std::time::Duration::from_millis(500)).unwrap()
    {
        replayed.push((seq, event));
    }
    let not_kept = gateway::native::gateway_reason::NOT_KEPT;
    let seqs: Vec<u64> = replayed.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "one run of numbers");
    assert!(seqs.len() > 3, "numbering moved past the damaged bytes: {seqs:?}");
    assert_eq!((replayed[0].1.token, replayed[2].1.token), (7, 9), "the records around it kept");
    assert_eq!(replayed[1].1.reason, not_kept, "the damaged record's number: not kept");
    assert!(replayed[3..].iter().all(|(_, event)| event.reason == not_kept), "{replayed:?}");
    session.send(&ClientMsg::NewOrder(order(10, 0, 1, PRICE))).unwrap();
    let (seq, event) = sequenced(&mut session);
    assert_eq!((seq, event.token), (seqs.len() as u64 + 1, 10), "numbering goes on after them");
}
