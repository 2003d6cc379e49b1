//! A blocking native-protocol client: what `exchange client` and the tests use.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::native::{self, ClientMsg, ServerMsg};

/// Bytes read per `read` call.
const READ_CHUNK_BYTES: usize = 4096;

/// Why the client could not go on.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server sent a bad frame: {0}")]
    Decode(#[from] native::DecodeError),
    #[error("the server closed the connection")]
    Closed,
    #[error("secret is longer than {} bytes", native::SECRET_BYTES)]
    SecretTooLong,
}

/// One connection to `exchange serve`'s native listener.
pub struct NativeClient {
    stream: TcpStream,
    buffer: Vec<u8>,
    out: Vec<u8>,
}

impl NativeClient {
    pub fn connect(addr: SocketAddr) -> Result<NativeClient, ClientError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(NativeClient { stream, buffer: Vec::new(), out: Vec::new() })
    }

    /// Sends a Login and returns the server's answer.
    pub fn login(
        &mut self,
        client: u32,
        secret: &str,
        next_seq: u64,
        timeout: Duration,
    ) -> Result<ServerMsg, ClientError> {
        let secret = native::secret_field(secret).ok_or(ClientError::SecretTooLong)?;
        self.send(&ClientMsg::Login { client, secret, next_seq })?;
        self.recv(timeout)?.ok_or(ClientError::Closed)
    }

    pub fn send(&mut self, msg: &ClientMsg) -> Result<(), ClientError> {
        self.out.clear();
        native::encode_client(msg, &mut self.out);
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    /// A second handle on the connection, for writing from another thread.
    pub fn writer(&self) -> Result<TcpStream, ClientError> {
        Ok(self.stream.try_clone()?)
    }

    /// The connection and the bytes read but not yet decoded (for a reader of its own).
    pub fn into_parts(self) -> (TcpStream, Vec<u8>) {
        (self.stream, self.buffer)
    }

    /// Sends raw bytes (tests of hostile input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        Ok(self.stream.write_all(bytes)?)
    }

    /// The next server message, skipping heartbeats; `Ok(None)` on timeout.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<ServerMsg>, ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((version, kind, payload, len)) = native::split_frame(&self.buffer)? {
                let msg = native::decode_server(version, kind, payload);
                self.buffer.drain(..len);
                match msg? {
                    ServerMsg::Heartbeat => {
                        self.send(&ClientMsg::Heartbeat)?;
                        continue;
                    }
                    msg => return Ok(Some(msg)),
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.stream.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => self.buffer.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Parses one line of a client script (see `exchange client --help`); `Ok(None)` for blank
/// lines and comments.
///
/// ```text
/// buy|sell TOKEN INSTRUMENT QTY PRICE|market [day|ioc|fok]
/// cancel TOKEN INSTRUMENT
/// replace TOKEN INSTRUMENT QTY PRICE
/// ```
pub fn parse_script_line(line: &str, client: u32) -> Result<Option<ClientMsg>, String> {
    let words: Vec<&str> = line.split('#').next().unwrap_or("").split_whitespace().collect();
    let Some((&verb, args)) = words.split_first() else { return Ok(None) };
    if !matches!(verb, "buy" | "sell" | "cancel" | "replace") {
        return Err(format!("unknown command {verb:?} (buy, sell, cancel, replace)"));
    }
    let number = |at: usize, what: &str| -> Result<i64, String> {
        let word = args.get(at).ok_or_else(|| format!("{verb}: {what} missing"))?;
        word.parse().map_err(|_| format!("{verb}: {what} {word:?} is not a number"))
    };
    let small = |at: usize, what: &str| -> Result<u32, String> {
        u32::try_from(number(at, what)?).map_err(|_| format!("{verb}: {what} out of range"))
    };
    let mut order = native::OrderRequest {
        client,
        token: small(0, "TOKEN")?,
        instrument: small(1, "INSTRUMENT")?,
        ..Default::default()
    };
    let arity = |n: usize| {
        if args.len() == n { Ok(()) } else { Err(format!("{verb}: {n} arguments expected")) }
    };
    match verb {
        "buy" | "sell" => {
            order.side = u8::from(verb == "sell");
            order.qty = small(2, "QTY")?;
            if args.get(3) == Some(&"market") {
                order.order_type = 1;
            } else {
                order.price = number(3, "PRICE")?;
            }
            order.time_in_force = match args.get(4).copied() {
                None | Some("day") => 0,
                Some("ioc") => 1,
                Some("fok") => 2,
                Some(other) => {
                    return Err(format!("{verb}: time in force {other:?} is not day, ioc or fok"));
                }
            };
            if args.len() > 5 {
                return Err(format!("{verb}: at most 5 arguments"));
            }
            Ok(Some(ClientMsg::NewOrder(order)))
        }
        "cancel" => arity(2).map(|()| Some(ClientMsg::Cancel(order))),
        "replace" => {
            arity(4)?;
            order.qty = small(2, "QTY")?;
            order.price = number(3, "PRICE")?;
            Ok(Some(ClientMsg::Replace(order)))
        }
        _ => unreachable!("the verb was checked above"),
    }
}

/// One line describing a server message, for people.
pub fn describe(msg: &ServerMsg) -> String {
    match msg {
        ServerMsg::Sequenced { seq, event } => {
            let kind =
                ["accepted", "partially-filled", "filled", "cancelled", "replaced", "rejected"]
                    .get(usize::from(event.kind))
                    .copied()
                    .unwrap_or("unknown");
            let reason = match exchange::msg::Reason::ALL.get(usize::from(event.reason)) {
                Some(exchange::msg::Reason::None) => String::new(),
                Some(reason) => format!(" reason={reason:?}"),
                None => format!(" reason={}", gateway_reason_name(event.reason)),
            };
            format!(
                "seq={seq} {kind} token={} instrument={} price={} qty={} leaves={}{reason}",
                event.token, event.instrument, event.price, event.qty, event.leaves_qty
            )
        }
        other => format!("{other:?}"),
    }
}

fn gateway_reason_name(code: u8) -> String {
    match code {
        native::gateway_reason::THROTTLED => "Throttled".into(),
        native::gateway_reason::BUSY => "Busy".into(),
        native::gateway_reason::WRONG_CLIENT => "WrongClient".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_lines_parse_into_orders() {
        let Ok(Some(ClientMsg::NewOrder(order))) = parse_script_line("sell 7 1 10 101000 ioc", 3)
        else {
            panic!()
        };
        assert_eq!(
            (
                order.client,
                order.token,
                order.instrument,
                order.side,
                order.qty,
                order.price,
                order.time_in_force
            ),
            (3, 7, 1, 1, 10, 101_000, 1)
        );
        let Ok(Some(ClientMsg::NewOrder(market))) = parse_script_line("buy 8 1 5 market fok", 3)
        else {
            panic!()
        };
        assert_eq!((market.order_type, market.price, market.time_in_force), (1, 0, 2));
        assert!(
            matches!(parse_script_line("cancel 7 1", 3), Ok(Some(ClientMsg::Cancel(o))) if o.token == 7)
        );
        assert!(
            matches!(parse_script_line("replace 7 1 4 100995", 3), Ok(Some(ClientMsg::Replace(o))) if o.qty == 4)
        );
        assert_eq!(parse_script_line("  # comment", 3), Ok(None));
        assert!(parse_script_line("buy x 1 10 5", 3).unwrap_err().contains("TOKEN"));
        assert!(parse_script_line("hold 1 1", 3).unwrap_err().contains("unknown command"));
        assert!(parse_script_line("cancel 1 1 9", 3).unwrap_err().contains("2 arguments"));
    }
}
