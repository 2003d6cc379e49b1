//! A blocking native-protocol client: what `exchange client` and the tests use.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::native::{self, ClientMsg, Event, ServerMsg, event_kind};
use exchange::instruments::InstrumentTable;

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
/// lines and comments. INSTRUMENT is an id and PRICE a whole number of price units.
///
/// ```text
/// buy|sell TOKEN INSTRUMENT QTY PRICE|market [day|ioc|fok]
/// cancel TOKEN INSTRUMENT
/// replace TOKEN INSTRUMENT QTY PRICE
/// ```
pub fn parse_script_line(line: &str, client: u32) -> Result<Option<ClientMsg>, String> {
    parse_script_line_in(line, client, None)
}

/// [`parse_script_line`] where, with an instruments table, INSTRUMENT may be a symbol and
/// PRICE a decimal (converted exactly: `buy 1 ACME 100 101.25`).
///
/// ```
/// use exchange::instruments::{ClientsFile, InstrumentSpec, InstrumentsFile, load};
/// use gateway::client::parse_script_line_in;
/// use gateway::native::ClientMsg;
/// let acme = InstrumentSpec {
///     symbol: "ACME".into(),
///     id: None,
///     tick_size: "0.01".into(),
///     lot_size: "1".into(),
///     reference_price: "101.25".into(),
///     band_low: "91".into(),
///     band_high: "111.5".into(),
///     ladder_ticks: None,
///     qty_max: None,
///     currency: "USD".into(),
/// };
/// let instruments = InstrumentsFile { price_decimals: 4, instruments: vec![acme] };
/// let (_, table) = load(&instruments, &ClientsFile { clients: vec![] }).unwrap();
/// let Ok(Some(ClientMsg::NewOrder(order))) = parse_script_line_in("buy 1 ACME 100 101.25", 7, Some(&table))
/// else { panic!() };
/// assert_eq!((order.instrument, order.price, order.qty), (0, 1_012_500, 100));
/// // Finer than the price unit (4 decimals): no order could carry it.
/// assert!(parse_script_line_in("buy 2 ACME 100 101.25001", 7, Some(&table)).is_err());
/// ```
pub fn parse_script_line_in(
    line: &str,
    client: u32,
    instruments: Option<&InstrumentTable>,
) -> Result<Option<ClientMsg>, String> {
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
    let symbol = args.get(1).and_then(|word| instruments?.id_of(word));
    let price = |at: usize| -> Result<i64, String> {
        match (instruments, args.get(at)) {
            (Some(table), Some(word)) => table.price_units(word).map_err(|e| {
                format!("{verb}: PRICE {word:?}: {e} (price_decimals {})", table.price_decimals())
            }),
            _ => number(at, "PRICE"),
        }
    };
    let mut order = native::OrderRequest {
        client,
        token: small(0, "TOKEN")?,
        instrument: symbol.map_or_else(|| small(1, "INSTRUMENT"), Ok)?,
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
                order.price = price(3)?;
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
            order.price = price(3)?;
            Ok(Some(ClientMsg::Replace(order)))
        }
        _ => unreachable!("the verb was checked above"),
    }
}

/// One line describing a server message, for people: with an instruments table, symbols and
/// decimal prices; without, instrument ids and price units.
///
/// ```
/// use gateway::client::describe;
/// use gateway::native::{Event, ServerMsg, event_kind};
/// let event = Event { kind: event_kind::ACCEPTED, token: 5, leaves_qty: 100, price: 101, ..Event::default() };
/// assert_eq!(
///     describe(&ServerMsg::Sequenced { seq: 3, event }, None),
///     "#3 accepted order 5: buy 100 of instrument 0 at 101"
/// );
/// let login = ServerMsg::LoginAccepted { client: 1, next_seq: 1 };
/// assert_eq!(describe(&login, None), "logged in as client 1; next sequence 1");
/// ```
pub fn describe(msg: &ServerMsg, instruments: Option<&InstrumentTable>) -> String {
    match msg {
        ServerMsg::LoginAccepted { client, next_seq } => {
            format!("logged in as client {client}; next sequence {next_seq}")
        }
        ServerMsg::LoginRejected { reason } => {
            let why = [
                "",
                "bad credentials",
                "sequence no longer kept",
                "already logged in",
                "busy: try again later",
            ];
            let why = why.get(usize::from(*reason)).filter(|w| !w.is_empty()).copied();
            format!("login refused: {}", why.map_or_else(|| reason.to_string(), str::to_string))
        }
        ServerMsg::Heartbeat => "heartbeat".to_string(),
        ServerMsg::Error { code } => {
            let why = [
                "",
                "malformed",
                "bad version",
                "unknown type",
                "not logged in",
                "dead link",
                "slow consumer",
                "throttle breach",
            ];
            let why = why.get(usize::from(*code)).filter(|w| !w.is_empty()).copied();
            format!(
                "server closed the session: {}",
                why.map_or_else(|| code.to_string(), str::to_string)
            )
        }
        ServerMsg::Sequenced { seq, event } => describe_event(*seq, event, instruments),
    }
}

fn describe_event(seq: u64, event: &Event, instruments: Option<&InstrumentTable>) -> String {
    let kind = ["accepted", "partially filled", "filled", "cancelled", "replaced", "rejected"]
        .get(usize::from(event.kind))
        .copied()
        .unwrap_or("unknown event");
    let instrument = match instruments.and_then(|t| t.symbol_of(event.instrument)) {
        Some(symbol) => symbol.to_string(),
        None => format!("instrument {}", event.instrument),
    };
    let price = instruments.map_or_else(|| event.price.to_string(), |t| t.price_text(event.price));
    let side = if event.side == 0 { "buy" } else { "sell" };
    let reason = match event.reason {
        0 => String::new(),
        code => format!(" ({})", native::reason_name(code)),
    };
    let token = event.token;
    // A fill says what traded and what is left; other events what is open.
    let filled = matches!(event.kind, event_kind::PARTIALLY_FILLED | event_kind::FILLED);
    let (qty, open) = if filled { (event.qty, event.leaves_qty) } else { (event.leaves_qty, 0) };
    let open = if filled { format!(", {open} open") } else { String::new() };
    format!("#{seq} {kind} order {token}: {side} {qty} of {instrument} at {price}{open}{reason}")
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
