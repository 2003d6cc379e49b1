//! A blocking FIX 4.4 initiator for the tests that run `exchange serve` as a process.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use gateway::fix::{self, Builder, Message, tag};

/// How long a test waits for the acceptor's next message.
pub const FIX_WAIT: Duration = Duration::from_secs(10);

/// One session's fields as text, in order.
pub type Fields = Vec<(u32, String)>;

/// The value of `wanted` in `fields` ("" when absent).
pub fn get(fields: &Fields, wanted: u32) -> &str {
    fields.iter().find(|(t, _)| *t == wanted).map_or("", |(_, v)| v.as_str())
}

/// A session with the acceptor `LEANTIER` as `comp_id`.
pub struct FixClient {
    stream: TcpStream,
    buffer: Vec<u8>,
    comp_id: String,
    pub next_seq: u64,
}

impl FixClient {
    pub fn connect(address: SocketAddr, comp_id: &str, next_seq: u64) -> FixClient {
        let stream = TcpStream::connect(address).expect("connecting to the FIX acceptor");
        stream.set_read_timeout(Some(FIX_WAIT)).unwrap();
        FixClient { stream, buffer: Vec::new(), comp_id: comp_id.to_owned(), next_seq }
    }

    pub fn send(&mut self, msg_type: &str, fields: &[(u32, &str)]) {
        let mut builder = Builder::default();
        let ours = self.comp_id.as_bytes();
        builder.begin(msg_type.as_bytes(), ours, b"LEANTIER", self.next_seq);
        builder.field(tag::SENDING_TIME, &fix::utc_timestamp(1_700_000_000_000_000_000));
        for (t, v) in fields {
            builder.field(*t, v.as_bytes());
        }
        self.next_seq += 1;
        self.stream.write_all(builder.finish()).expect("sending to the FIX acceptor");
    }

    pub fn recv(&mut self) -> Fields {
        match self.next_message() {
            Ok(fields) => fields,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                panic!("the FIX acceptor closed the session")
            }
            Err(e) => panic!("no FIX message within {FIX_WAIT:?}: {e}"),
        }
    }

    /// The next message within `wait`; `None` when none came (the session stays usable).
    #[allow(dead_code)] // not every test crate that includes this module waits this way
    pub fn recv_within(&mut self, wait: Duration) -> Option<Fields> {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let got = self.next_message();
        self.stream.set_read_timeout(Some(FIX_WAIT)).unwrap();
        match got {
            Ok(fields) => Some(fields),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("the FIX session failed: {e}"),
        }
    }

    fn next_message(&mut self) -> std::io::Result<Fields> {
        loop {
            if let Some(len) = fix::split_frame(&self.buffer).expect("the server frames correctly")
            {
                let message = Message::parse(&self.buffer[..len]).expect("a FIX message");
                let fields = message
                    .fields()
                    .map(|(t, v)| (t, String::from_utf8_lossy(v).into_owned()))
                    .collect();
                self.buffer.drain(..len);
                return Ok(fields);
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk)? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                n => self.buffer.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Logs on with `secret`; panics unless the acceptor answers with a Logon.
    pub fn logon(&mut self, secret: &str) {
        let logon =
            [(tag::ENCRYPT_METHOD, "0"), (tag::HEART_BT_INT, "30"), (tag::PASSWORD, secret)];
        self.send("A", &logon);
        let reply = self.recv();
        assert_eq!(get(&reply, tag::MSG_TYPE), "A", "Logon refused: {reply:?}");
    }
}
