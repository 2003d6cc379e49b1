//! A raw FIX 4.4 client for the integration tests (shared by several test crates, each of
//! which uses a part of it).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use gateway::fix::{self, Builder, Message, tag};

/// Generous on a loaded 2-core machine; a passing run never waits this long.
pub const WAIT: Duration = Duration::from_secs(10);
/// The password the tests' FIX credentials hash.
pub const SECRET: &str = "fixpass";

/// A received message's fields.
#[derive(Debug)]
pub struct Received(pub Vec<(u32, String)>);

impl Received {
    pub fn get(&self, tag: u32) -> &str {
        self.0.iter().find(|f| f.0 == tag).map_or("", |f| f.1.as_str())
    }
    pub fn msg_type(&self) -> &str {
        self.get(tag::MSG_TYPE)
    }
}

pub struct FixClient {
    pub stream: TcpStream,
    buffer: Vec<u8>,
    comp: &'static str,
    pub next_seq: u64,
}

impl FixClient {
    pub fn connect(addr: SocketAddr, comp: &'static str, next_seq: u64) -> FixClient {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        FixClient { stream, buffer: Vec::new(), comp, next_seq }
    }

    pub fn encode(&self, msg_type: &str, seq: u64, fields: &[(u32, &str)]) -> Vec<u8> {
        let mut builder = Builder::default();
        builder.begin(msg_type.as_bytes(), self.comp.as_bytes(), b"LEANTIER", seq);
        builder.field(tag::SENDING_TIME, &fix::utc_timestamp(1_700_000_000_000_000_000));
        for (t, v) in fields {
            builder.field(*t, v.as_bytes());
        }
        builder.finish().to_vec()
    }

    pub fn send(&mut self, msg_type: &str, fields: &[(u32, &str)]) {
        let bytes = self.encode(msg_type, self.next_seq, fields);
        self.next_seq += 1;
        self.stream.write_all(&bytes).unwrap();
    }

    pub fn logon(&mut self, extra: &[(u32, &str)]) -> Received {
        let mut fields =
            vec![(tag::ENCRYPT_METHOD, "0"), (tag::HEART_BT_INT, "30"), (tag::PASSWORD, SECRET)];
        fields.extend_from_slice(extra);
        self.send("A", &fields);
        self.recv()
    }

    /// The next message, or panics; `None` if the server closed the connection.
    pub fn try_recv(&mut self) -> Option<Received> {
        loop {
            if let Some(len) = fix::split_frame(&self.buffer).expect("the server frames correctly")
            {
                let message = Message::parse(&self.buffer[..len]).unwrap();
                let fields = message
                    .fields()
                    .map(|(t, v)| (t, String::from_utf8_lossy(v).into_owned()))
                    .collect();
                self.buffer.drain(..len);
                return Some(Received(fields));
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("no message within {WAIT:?}: {e}"),
            }
        }
    }

    pub fn recv(&mut self) -> Received {
        self.try_recv().expect("a message, not a closed connection")
    }
}

pub fn new_order<'a>(
    cl_ord_id: &'a str,
    side: &'a str,
    qty: &'a str,
    price: &'a str,
) -> Vec<(u32, &'a str)> {
    vec![
        (tag::CL_ORD_ID, cl_ord_id),
        (tag::SYMBOL, "1"),
        (tag::SIDE, side),
        (tag::TRANSACT_TIME, "20240101-00:00:00.000"),
        (tag::ORDER_QTY, qty),
        (tag::ORD_TYPE, "2"),
        (tag::PRICE, price),
    ]
}
