//! Property tests of both decoders: arbitrary bytes never panic, and what the encoders write
//! decodes back to the same message.

use gateway::fix::{self, Builder, Message, tag};
use gateway::native::{self, ClientMsg, Event, OrderRequest, ServerMsg};
use proptest::prelude::*;

/// Drains `bytes` through the native framer and decoders as a server and a client would.
fn native_drain(mut bytes: &[u8]) {
    while let Ok(Some((version, kind, payload, used))) = native::split_frame(bytes) {
        assert!(used <= bytes.len() && used <= native::FRAME_BYTES_MAX);
        let _ = native::decode_client(version, kind, payload);
        let _ = native::decode_server(version, kind, payload);
        bytes = &bytes[used..];
    }
}

/// Drains `bytes` through the FIX framer (resyncing past garbled input) and field index.
fn fix_drain(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match fix::split_frame(bytes) {
            Ok(None) => return,
            Ok(Some(used)) => {
                if let Ok(message) = Message::parse(&bytes[..used]) {
                    let _ = message.get(tag::MSG_SEQ_NUM).and_then(fix::parse_u64);
                    let _ = message.msg_type();
                }
                bytes = &bytes[used..];
            }
            Err(_) => {
                let skip = fix::resync(bytes);
                assert!(skip > 0, "resync must make progress");
                bytes = &bytes[skip..];
            }
        }
    }
}

fn order() -> impl Strategy<Value = OrderRequest> {
    (any::<u32>(), any::<u32>(), any::<u32>(), any::<[u8; 3]>(), any::<i64>(), any::<u32>())
        .prop_map(|(client, token, instrument, codes, price, qty)| OrderRequest {
            client,
            token,
            instrument,
            side: codes[0],
            order_type: codes[1],
            time_in_force: codes[2],
            price,
            qty,
        })
}

fn client_msg() -> impl Strategy<Value = ClientMsg> {
    prop_oneof![
        (any::<u32>(), any::<[u8; native::SECRET_BYTES]>(), any::<u64>())
            .prop_map(|(client, secret, next_seq)| ClientMsg::Login { client, secret, next_seq }),
        Just(ClientMsg::Heartbeat),
        Just(ClientMsg::Logout),
        order().prop_map(ClientMsg::NewOrder),
        order().prop_map(ClientMsg::Cancel),
        order().prop_map(ClientMsg::Replace),
    ]
}

fn server_msg() -> impl Strategy<Value = ServerMsg> {
    let event =
        (any::<[u8; 3]>(), any::<u32>(), any::<u32>(), any::<i64>(), any::<u32>(), any::<u32>())
            .prop_map(|(codes, instrument, token, price, qty, leaves_qty)| Event {
                kind: codes[0],
                reason: codes[1],
                side: codes[2],
                instrument,
                token,
                price,
                qty,
                leaves_qty,
            });
    prop_oneof![
        (any::<u32>(), any::<u64>())
            .prop_map(|(client, next_seq)| ServerMsg::LoginAccepted { client, next_seq }),
        any::<u8>().prop_map(|reason| ServerMsg::LoginRejected { reason }),
        Just(ServerMsg::Heartbeat),
        (any::<u64>(), event).prop_map(|(seq, event)| ServerMsg::Sequenced { seq, event }),
        any::<u8>().prop_map(|code| ServerMsg::Error { code }),
    ]
}

/// A FIX value: printable ASCII without SOH or '='-free requirements (values may hold '=').
fn fix_value() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(0x21u8..0x7f, 1..24)
}

/// Cases per property: 2 000 in the test suite; `scripts/soak-decoders` sets
/// `LEANTIER_CODEC_CASES` to a million or more.
fn cases() -> u32 {
    std::env::var("LEANTIER_CODEC_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn native_decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        native_drain(&bytes);
    }

    #[test]
    fn native_frames_with_a_valid_header_never_panic(
        kind in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..60)
    ) {
        let mut bytes = ((payload.len() + 2) as u16).to_be_bytes().to_vec();
        bytes.extend_from_slice(&[native::VERSION, kind]);
        bytes.extend_from_slice(&payload);
        native_drain(&bytes);
    }

    #[test]
    fn native_client_messages_round_trip(msg in client_msg()) {
        let mut bytes = Vec::new();
        native::encode_client(&msg, &mut bytes);
        let (version, kind, payload, used) = native::split_frame(&bytes).unwrap().unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(native::decode_client(version, kind, payload), Ok(msg));
    }

    #[test]
    fn native_server_messages_round_trip(msg in server_msg()) {
        let mut bytes = Vec::new();
        native::encode_server(&msg, &mut bytes);
        let (version, kind, payload, used) = native::split_frame(&bytes).unwrap().unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(native::decode_server(version, kind, payload), Ok(msg));
    }

    #[test]
    fn fix_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        fix_drain(&bytes);
    }

    #[test]
    fn fix_decoder_never_panics_on_near_fix(
        fields in proptest::collection::vec((0u32..1000, fix_value()), 0..20),
        body_delta in -3i64..3,
        checksum_delta in 0u32..2,
    ) {
        // Well-formed looking messages with a possibly wrong BodyLength or CheckSum.
        let mut body = Vec::new();
        for (tag, value) in &fields {
            body.extend_from_slice(format!("{tag}=").as_bytes());
            body.extend_from_slice(value);
            body.push(fix::SOH);
        }
        let length = (body.len() as i64 + body_delta).max(0);
        let mut bytes = format!("8=FIX.4.4\x019={length}\x01").into_bytes();
        bytes.extend_from_slice(&body);
        let sum = (fix::checksum(&bytes) + checksum_delta) % 256;
        bytes.extend_from_slice(format!("10={sum:03}\x01").as_bytes());
        let framed = fix::split_frame(&bytes);
        if body_delta == 0 && checksum_delta == 0 && !body.is_empty() {
            prop_assert_eq!(framed, Ok(Some(bytes.len())));
        } else {
            prop_assert!(!matches!(framed, Ok(Some(n)) if n == bytes.len()) || body.is_empty());
        }
        fix_drain(&bytes);
    }

    #[test]
    fn fix_messages_round_trip(
        msg_type in fix_value(), seq in 1u64..1_000_000_000,
        fields in proptest::collection::vec((200u32..10_000, fix_value()), 0..30),
    ) {
        let mut builder = Builder::default();
        builder.begin(&msg_type, b"SERVER", b"CLIENT", seq);
        for (tag, value) in &fields {
            builder.field(*tag, value);
        }
        let bytes = builder.finish().to_vec();
        prop_assert_eq!(fix::split_frame(&bytes), Ok(Some(bytes.len())));
        let message = Message::parse(&bytes).unwrap();
        prop_assert_eq!(message.msg_type(), &msg_type[..]);
        prop_assert_eq!(message.get(tag::MSG_SEQ_NUM).and_then(fix::parse_u64), Some(seq));
        let decoded: Vec<(u32, Vec<u8>)> =
            message.fields().skip(6).take(fields.len()).map(|(tag, value)| (tag, value.to_vec())).collect();
        prop_assert_eq!(decoded, fields);
    }
}
