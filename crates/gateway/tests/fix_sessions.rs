//! The FIX 4.4 acceptor against a raw tag=value client on loopback: trading (D, F, G), the
//! session layer (resend with gap fill, sequence checks, persistence across a restart) and each
//! bad-input case, with another session still served.

mod common;
#[path = "common/fix_client.rs"]
mod fix_client;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use exchange::flow::{UniverseConfig, reference_master_data};
use fix_client::{FixClient, SECRET, new_order};
use gateway::Running;
use gateway::credentials::{self, Credential, Protocol};
use gateway::fix::tag;

fn start(store: &Path) -> Running {
    let hash = credentials::hash_secret(SECRET.as_bytes()).unwrap();
    let credentials = [(11, "F11"), (12, "F12")]
        .into_iter()
        .map(|(client, comp)| Credential {
            client,
            protocol: Protocol::Fix,
            comp_id: comp.into(),
            hash: hash.clone(),
        })
        .collect();
    common::start_fix_server(store, credentials, 16)
}

#[test]
fn a_fix_client_trades_replaces_and_cancels() {
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let addr = server.fix_listen.unwrap();
    let mut buyer = FixClient::connect(addr, "F11", 1);
    let logon = buyer.logon(&[]);
    assert_eq!((logon.msg_type(), logon.get(tag::HEART_BT_INT)), ("A", "30"));
    buyer.send("D", &new_order("a1", "1", "10", "101000"));
    let report = buyer.recv();
    assert_eq!(
        (report.msg_type(), report.get(tag::EXEC_TYPE), report.get(tag::ORD_STATUS)),
        ("8", "0", "0")
    );
    assert_eq!(
        (report.get(tag::CL_ORD_ID), report.get(tag::LEAVES_QTY), report.get(tag::CUM_QTY)),
        ("a1", "10", "0")
    );
    for required in [tag::ORDER_ID, tag::EXEC_ID, tag::SIDE, tag::SYMBOL, tag::AVG_PX] {
        assert!(!report.get(required).is_empty(), "tag {required} in {report:?}");
    }
    let mut replace = new_order("a2", "1", "8", "100995");
    replace.push((tag::ORIG_CL_ORD_ID, "a1"));
    buyer.send("G", &replace);
    let replaced = buyer.recv();
    assert_eq!(
        (
            replaced.get(tag::EXEC_TYPE),
            replaced.get(tag::CL_ORD_ID),
            replaced.get(tag::ORIG_CL_ORD_ID)
        ),
        ("5", "a2", "a1")
    );
    assert_eq!((replaced.get(tag::ORDER_QTY), replaced.get(tag::LEAVES_QTY)), ("8", "8"));

    let mut seller = FixClient::connect(addr, "F12", 1);
    assert_eq!(seller.logon(&[]).msg_type(), "A");
    seller.send("D", &new_order("s1", "2", "3", "100995"));
    assert_eq!(seller.recv().get(tag::EXEC_TYPE), "0");
    let sold = seller.recv();
    assert_eq!(
        (sold.get(tag::EXEC_TYPE), sold.get(tag::ORD_STATUS), sold.get(tag::LAST_QTY)),
        ("F", "2", "3")
    );
    let bought = buyer.recv();
    assert_eq!((bought.get(tag::EXEC_TYPE), bought.get(tag::ORD_STATUS)), ("F", "1"));
    assert_eq!(
        (bought.get(tag::CUM_QTY), bought.get(tag::LEAVES_QTY), bought.get(tag::AVG_PX)),
        ("3", "5", "100995")
    );

    let cancel = [
        (tag::ORIG_CL_ORD_ID, "a2"),
        (tag::CL_ORD_ID, "a3"),
        (tag::SYMBOL, "1"),
        (tag::SIDE, "1"),
        (tag::TRANSACT_TIME, "20240101-00:00:00.000"),
    ];
    buyer.send("F", &cancel);
    let cancelled = buyer.recv();
    assert_eq!((cancelled.get(tag::EXEC_TYPE), cancelled.get(tag::ORD_STATUS)), ("4", "4"));
    assert_eq!(
        (
            cancelled.get(tag::CL_ORD_ID),
            cancelled.get(tag::ORIG_CL_ORD_ID),
            cancelled.get(tag::CUM_QTY)
        ),
        ("a3", "a2", "3")
    );
    buyer.send("F", &cancel);
    let refused = buyer.recv();
    assert_eq!((refused.msg_type(), refused.get(tag::CXL_REJ_RESPONSE_TO)), ("9", "1"));
    buyer.send("B", &[(tag::TEXT, "news")]);
    let unsupported = buyer.recv();
    assert_eq!(
        (
            unsupported.msg_type(),
            unsupported.get(tag::REF_MSG_TYPE),
            unsupported.get(tag::BUSINESS_REJECT_REASON)
        ),
        ("j", "B", "3")
    );
}

#[test]
fn each_bad_input_gets_the_prescribed_answer_and_others_are_served() {
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let addr = server.fix_listen.unwrap();
    // Garbage before logon: disconnect.
    let mut garbage = FixClient::connect(addr, "F11", 1);
    garbage.stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    assert!(garbage.try_recv().is_none(), "garbage before logon closes the connection");
    // A wrong password: no session.
    let mut intruder = FixClient::connect(addr, "F11", 1);
    intruder.send(
        "A",
        &[(tag::ENCRYPT_METHOD, "0"), (tag::HEART_BT_INT, "30"), (tag::PASSWORD, "guess")],
    );
    assert!(intruder.try_recv().is_none(), "a bad password closes the connection");

    let mut client = FixClient::connect(addr, "F11", 1);
    assert_eq!(client.logon(&[]).msg_type(), "A");
    // A bad CheckSum: garbled, ignored without consuming a sequence number...
    let mut corrupt = client.encode("1", client.next_seq, &[(tag::TEST_REQ_ID, "lost")]);
    let at = corrupt.len() - 2;
    corrupt[at] = if corrupt[at] == b'0' { b'1' } else { b'0' };
    client.stream.write_all(&corrupt).unwrap();
    // ...and a bad BodyLength likewise.
    let mut long = client.encode("1", client.next_seq, &[(tag::TEST_REQ_ID, "lost")]);
    long[12] = b'9';
    client.stream.write_all(&long).unwrap();
    // So this TestRequest with the same sequence number is the one answered.
    client.send("1", &[(tag::TEST_REQ_ID, "ping")]);
    let heartbeat = client.recv();
    assert_eq!((heartbeat.msg_type(), heartbeat.get(tag::TEST_REQ_ID)), ("0", "ping"));
    // A required tag missing: session Reject naming it.
    let mut no_symbol = new_order("b1", "1", "1", "101000");
    no_symbol.retain(|f| f.0 != tag::SYMBOL);
    client.send("D", &no_symbol);
    let reject = client.recv();
    assert_eq!(
        (reject.msg_type(), reject.get(tag::REF_TAG_ID), reject.get(tag::SESSION_REJECT_REASON)),
        ("3", "55", "1")
    );
    // An order for another client id (Account): rejected execution report.
    let mut other_account = new_order("b2", "1", "1", "101000");
    other_account.push((tag::ACCOUNT, "12"));
    client.send("D", &other_account);
    let rejected = client.recv();
    assert_eq!(
        (rejected.get(tag::EXEC_TYPE), rejected.get(tag::ORD_STATUS), rejected.get(tag::TEXT)),
        ("8", "8", "WrongClient")
    );
    // A MsgSeqNum lower than expected without PossDupFlag: Logout and disconnect.
    client.next_seq -= 3;
    client.send("0", &[]);
    let logout = client.recv();
    assert_eq!(logout.msg_type(), "5");
    assert!(logout.get(tag::TEXT).contains("too low"), "{logout:?}");
    assert!(client.try_recv().is_none());

    let mut other = FixClient::connect(addr, "F12", 1);
    assert_eq!(other.logon(&[]).msg_type(), "A", "the server still serves other sessions");
}

#[test]
fn resend_requests_are_answered_and_sequence_numbers_survive_a_restart() {
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    assert_eq!(client.logon(&[]).get(tag::MSG_SEQ_NUM), "1");
    client.send("D", &new_order("r1", "1", "2", "101000"));
    let report = client.recv();
    assert_eq!(report.get(tag::MSG_SEQ_NUM), "2");
    client.send("2", &[(tag::BEGIN_SEQ_NO, "1"), (tag::END_SEQ_NO, "0")]);
    let gap_fill = client.recv();
    assert_eq!(
        (gap_fill.msg_type(), gap_fill.get(tag::MSG_SEQ_NUM), gap_fill.get(tag::GAP_FILL_FLAG)),
        ("4", "1", "Y")
    );
    assert_eq!(gap_fill.get(tag::NEW_SEQ_NO), "2", "the Logon is gap-filled, not resent");
    let again = client.recv();
    assert_eq!(
        (again.msg_type(), again.get(tag::MSG_SEQ_NUM), again.get(tag::POSS_DUP_FLAG)),
        ("8", "2", "Y")
    );
    assert_eq!(
        (again.get(tag::CL_ORD_ID), again.get(tag::EXEC_ID)),
        ("r1", report.get(tag::EXEC_ID))
    );
    assert!(!again.get(tag::ORIG_SENDING_TIME).is_empty());
    drop(client);
    drop(server);

    // A new server process over the same store: sequence numbers go on.
    let server = start(store.path());
    let addr = server.fix_listen.unwrap();
    let mut stale = FixClient::connect(addr, "F11", 1);
    stale.send(
        "A",
        &[(tag::ENCRYPT_METHOD, "0"), (tag::HEART_BT_INT, "30"), (tag::PASSWORD, SECRET)],
    );
    assert!(stale.try_recv().is_none(), "a Logon with MsgSeqNum 1 is too low after the restart");
    // The client skipped two numbers: the server logs it on and asks for them.
    let mut client = FixClient::connect(addr, "F11", 6);
    let logon = client.logon(&[]);
    assert_eq!((logon.msg_type(), logon.get(tag::MSG_SEQ_NUM)), ("A", "3"));
    let resend = client.recv();
    assert_eq!((resend.msg_type(), resend.get(tag::BEGIN_SEQ_NO)), ("2", "4"));
    // ResetSeqNumFlag starts both sides at 1 again (retried while the server still holds
    // the dropped connection's session).
    drop(client);
    let logon = (0..100)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            let mut reset = FixClient::connect(addr, "F11", 1);
            reset.send(
                "A",
                &[
                    (tag::ENCRYPT_METHOD, "0"),
                    (tag::HEART_BT_INT, "30"),
                    (tag::PASSWORD, SECRET),
                    (tag::RESET_SEQ_NUM_FLAG, "Y"),
                ],
            );
            reset.try_recv()
        })
        .expect("a reset Logon is accepted once the old session is gone");
    assert_eq!((logon.get(tag::MSG_SEQ_NUM), logon.get(tag::RESET_SEQ_NUM_FLAG)), ("1", "Y"));
}

#[test]
fn a_silent_peer_gets_heartbeats_then_a_test_request_then_is_disconnected() {
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    client.send(
        "A",
        &[(tag::ENCRYPT_METHOD, "0"), (tag::HEART_BT_INT, "1"), (tag::PASSWORD, SECRET)],
    );
    assert_eq!(client.recv().msg_type(), "A");
    let mut types = Vec::new();
    while let Some(message) = client.try_recv() {
        types.push(message.msg_type().to_string());
    }
    assert!(types.contains(&"0".to_string()), "a Heartbeat when idle: {types:?}");
    assert!(types.contains(&"1".to_string()), "a TestRequest when the peer is silent: {types:?}");
}

#[test]
fn the_fix_load_generator_gets_every_order_answered_and_logs_out() {
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let master = reference_master_data(&UniverseConfig { instruments: 4, clients: 16 });
    let band = master.instrument(1).unwrap();
    let options = experiments::order_entry_load::LoadOptions {
        connect: server.fix_listen.unwrap(),
        protocol: experiments::order_entry_load::LoadProtocol::Fix {
            target_comp_id: "LEANTIER".into(),
        },
        sessions: [(11, "F11"), (12, "F12")]
            .map(|(client, comp)| experiments::order_entry_load::LoadSession {
                client,
                comp_id: comp.into(),
                secret: SECRET.into(),
            })
            .to_vec(),
        plan: stats::open_loop::OpenLoopPlan {
            process: stats::open_loop::ArrivalProcess::Poisson { rate_per_s: 2_000.0 },
            seed: 1,
            duration: Duration::from_millis(200),
        },
        instruments: vec![experiments::order_entry_load::Traded::reference(
            1,
            (band.band_low + band.band_high) / 2,
        )],
        tls: None,
        drain: experiments::order_entry_load::DRAIN_DEFAULT,
    };
    // Twice: the first run's Logout frees the sessions, so the second logs on again (with
    // ResetSeqNumFlag) and is answered too.
    for run in 0..2 {
        let result = experiments::order_entry_load::run(&options).unwrap();
        assert!(
            result.sent > 100,
            "run {run}: about 400 orders in 200 ms at 2K/s, sent {}",
            result.sent
        );
        assert_eq!(result.answered, result.sent, "run {run}: every order got an ExecutionReport");
        assert_eq!(result.latency.count(), result.sent);
        assert_eq!(result.rejected, 0, "run {run}: every order was accepted");
    }
}

#[test]
fn an_order_in_the_same_write_as_the_logon_is_answered_without_more_bytes() {
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    let logon_fields =
        [(tag::ENCRYPT_METHOD, "0"), (tag::HEART_BT_INT, "30"), (tag::PASSWORD, SECRET)];
    let mut bytes = client.encode("A", 1, &logon_fields);
    bytes.extend(client.encode("D", 2, &new_order("p1", "1", "10", "101000")));
    client.stream.write_all(&bytes).unwrap();
    assert_eq!(client.recv().msg_type(), "A");
    // Nothing more is sent: the order must be answered from what the logon's read brought.
    let report = client.recv();
    assert_eq!((report.msg_type(), report.get(tag::CL_ORD_ID)), ("8", "p1"));
}

#[test]
fn test_requests_over_the_throttle_end_the_session() {
    let store = tempfile::tempdir().unwrap();
    let hash = credentials::hash_secret(SECRET.as_bytes()).unwrap();
    let credential =
        Credential { client: 11, protocol: Protocol::Fix, comp_id: "F11".into(), hash };
    let options = common::serve_options(store.path(), vec![credential], 16);
    let settings = gateway::Settings { throttle_msgs_per_s: 20, ..options.settings.clone() };
    let options = gateway::ServeOptions {
        fix_listen: Some("127.0.0.1:0".parse().unwrap()),
        settings,
        ..options
    };
    let server = gateway::start(options).unwrap();
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    assert_eq!(client.logon(&[]).msg_type(), "A");
    // One write, so the server takes them within microseconds whatever the host's load
    // (a throttle refills 20 tokens a second).
    let mut burst = Vec::new();
    for at in 0..100 {
        burst.extend(client.encode("1", client.next_seq, &[(tag::TEST_REQ_ID, &at.to_string())]));
        client.next_seq += 1;
    }
    client.stream.write_all(&burst).unwrap();
    // About 20 Heartbeats answer the first TestRequests; then a Logout says why.
    let mut heartbeats = 0;
    let logout = loop {
        let message = client.recv();
        match message.msg_type() {
            "0" => heartbeats += 1,
            "5" => break message,
            other => panic!("unexpected {other}: {message:?}"),
        }
    };
    assert!(logout.get(tag::TEXT).contains("over the throttle"), "{logout:?}");
    assert!((1..=40).contains(&heartbeats), "{heartbeats} answered before the throttle");
}

#[test]
fn a_replace_may_not_take_a_live_orders_cl_ord_id() {
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    assert_eq!(client.logon(&[]).msg_type(), "A");
    for id in ["a1", "b1"] {
        client.send("D", &new_order(id, "1", "10", "101000"));
        assert_eq!(client.recv().get(tag::EXEC_TYPE), "0", "{id} accepted");
    }
    let mut replace = new_order("b1", "1", "8", "101000");
    replace.push((tag::ORIG_CL_ORD_ID, "a1"));
    client.send("G", &replace);
    let refused = client.recv();
    assert_eq!((refused.msg_type(), refused.get(tag::CL_ORD_ID)), ("9", "b1"), "{refused:?}");
    // b1 still belongs to its own order: cancelling it by its ClOrdID works.
    let mut cancel = new_order("c1", "1", "10", "101000");
    cancel.push((tag::ORIG_CL_ORD_ID, "b1"));
    client.send("F", &cancel);
    let cancelled = client.recv();
    assert_eq!((cancelled.get(tag::EXEC_TYPE), cancelled.get(tag::CL_ORD_ID)), ("4", "c1"));
}

#[test]
fn session_messages_cost_the_store_a_record_per_reservation_not_one_each() {
    const TEST_REQUESTS: usize = 3000;
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    assert_eq!(client.logon(&[]).msg_type(), "A");
    for at in 0..TEST_REQUESTS {
        client.send("1", &[(tag::TEST_REQ_ID, &format!("t{at}"))]);
        assert_eq!(client.recv().msg_type(), "0");
    }
    let size = std::fs::metadata(store.path().join(gateway::STORE_FILE_NAME)).unwrap().len();
    // Each TestRequest moves the inbound number (a record per batch of them: 21 bytes, and the
    // batch's end with its synced-end claim, 21 more); the answers take one reservation per
    // UNKEPT_SEQ_RESERVE: far below one record per message each way (a FIX message is ~100).
    assert!(size < 48 * TEST_REQUESTS as u64, "{size} bytes for {TEST_REQUESTS} test requests");
    drop(client);
    drop(server);
    let server = start(store.path());
    let mut client =
        FixClient::connect(server.fix_listen.unwrap(), "F11", 2 + TEST_REQUESTS as u64);
    let logon = client.logon(&[]);
    let next = (2 + TEST_REQUESTS).to_string();
    assert_eq!(logon.get(tag::MSG_SEQ_NUM), next, "a stopped server's successor numbers on");
}

#[test]
fn a_long_resend_is_answered_in_bounded_parts_the_peer_asks_for_in_turn() {
    const ORDERS: usize = 1_100;
    let store = tempfile::tempdir().unwrap();
    let server = start(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    assert_eq!(client.logon(&[]).msg_type(), "A");
    for at in 0..ORDERS {
        client.send("D", &new_order(&format!("o{at}"), "1", "1", "101000"));
    }
    for _ in 0..ORDERS {
        assert_eq!(client.recv().msg_type(), "8");
    }
    // Stored: the reports (2..=1101); the Logon (1) is a session message, not kept.
    // Everything is asked for at once.
    client.send("2", &[(tag::BEGIN_SEQ_NO, "1"), (tag::END_SEQ_NO, "0")]);
    let mut resent = 0;
    let next = loop {
        let message = client.recv();
        match message.msg_type() {
            "8" => resent += 1,
            "4" => {}
            "0" => break message.get(tag::MSG_SEQ_NUM).parse::<u64>().unwrap(),
            other => panic!("unexpected {other}: {message:?}"),
        }
    };
    assert_eq!(resent, 1000, "the first part: a gap fill for the Logon, 1000 stored reports");
    assert!(next > 1101, "the Heartbeat after the part shows the rest is missing: {next}");
    client.send("2", &[(tag::BEGIN_SEQ_NO, "1002"), (tag::END_SEQ_NO, "0")]);
    let mut rest = 0;
    while rest < ORDERS - 1000 {
        let message = client.recv();
        assert_eq!(message.msg_type(), "8", "{message:?}");
        rest += 1;
    }
}

/// A FIX server over `store` whose store is compacted past 8 KiB, keeping 4 sent messages
/// per session for resends.
fn start_compacting(store: &Path) -> Running {
    let credentials = vec![Credential {
        client: 11,
        protocol: Protocol::Fix,
        comp_id: "F11".into(),
        hash: credentials::hash_secret(SECRET.as_bytes()).unwrap(),
    }];
    let options = common::serve_options(store, credentials, 16);
    let settings = gateway::Settings {
        store_bytes_max: 8 << 10,
        fix_resend_window: 4,
        ..options.settings.clone()
    };
    let fix_listen = Some("127.0.0.1:0".parse().unwrap());
    gateway::start(gateway::ServeOptions { settings, fix_listen, ..options }).unwrap()
}

#[test]
fn a_compacted_store_resends_its_window_and_the_open_orders_report_and_gap_fills_the_rest() {
    const CANCELLED: u64 = 60;
    let store = tempfile::tempdir().unwrap();
    let server = start_compacting(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 1);
    assert_eq!(client.logon(&[]).get(tag::MSG_SEQ_NUM), "1");
    client.send("D", &new_order("keep", "1", "2", "101000"));
    assert_eq!(client.recv().get(tag::MSG_SEQ_NUM), "2", "an order left open");
    for n in 0..CANCELLED {
        let (id, cancel_id) = (format!("o{n}"), format!("c{n}"));
        client.send("D", &new_order(&id, "1", "1", "101000"));
        assert_eq!(client.recv().get(tag::EXEC_TYPE), "0");
        let cancel = [
            (tag::ORIG_CL_ORD_ID, id.as_str()),
            (tag::CL_ORD_ID, cancel_id.as_str()),
            (tag::SYMBOL, "1"),
            (tag::SIDE, "1"),
            (tag::TRANSACT_TIME, "20240101-00:00:00.000"),
        ];
        client.send("F", &cancel);
        assert_eq!(client.recv().get(tag::EXEC_TYPE), "4");
    }
    let last = 2 + 2 * CANCELLED;
    let size = std::fs::metadata(store.path().join(gateway::STORE_FILE_NAME)).unwrap().len();
    assert!(size < 8 << 10, "the store was compacted: {size} bytes");

    // Kept: the open order's report, the newest 4 at the last compaction and all since.
    client.send("2", &[(tag::BEGIN_SEQ_NO, "1"), (tag::END_SEQ_NO, "0")]);
    let mut answer = |wanted: &str| {
        let message = client.recv();
        assert_eq!(message.msg_type(), wanted);
        let seq: u64 = message.get(tag::MSG_SEQ_NUM).parse().unwrap();
        (seq, message.get(tag::NEW_SEQ_NO).parse::<u64>().ok())
    };
    assert_eq!(answer("4"), (1, Some(2)), "the Logon gap-filled");
    assert_eq!(answer("8"), (2, None), "the open order's report, older than the window");
    let (gap_at, Some(kept_from)) = answer("4") else { panic!("a gap fill") };
    assert!(gap_at == 3 && kept_from > 3 && kept_from <= last - 3, "gap 3..{kept_from}");
    for seq in kept_from..=last {
        assert_eq!(answer("8"), (seq, None), "resent from the window on");
    }
    drop(client);
    drop(server);

    let server = start_compacting(store.path());
    let mut client = FixClient::connect(server.fix_listen.unwrap(), "F11", 2 + 2 * CANCELLED + 2);
    let logon = client.logon(&[]);
    assert_eq!(logon.get(tag::MSG_SEQ_NUM), (last + 1).to_string(), "numbering goes on");
}
