//! A blocking native-protocol client: what `exchange client` and the tests use.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use crate::native::{self, ClientMsg, Event, ServerMsg, event_kind};
pub use crate::transport::ClientTls;
// Public here: what `NativeClient::split` hands out and the load client drives.
pub use crate::transport::{Reader, Transport, Writer};
use exchange::instruments::InstrumentTable;

/// Bytes read per `read` call.
const READ_CHUNK_BYTES: usize = 4096;

pub use crate::error::ClientError;

/// A client's timeouts, each named in the error it raises (the login and an order's first
/// report are requests; the server heartbeats a live session within the idle bound).
pub use ops::Timeout;

/// One connection to `exchange serve`'s native listener, plain or TLS.
pub struct NativeClient {
    stream: Transport,
    buffer: Vec<u8>,
    out: Vec<u8>,
    /// With an idle timeout: the longest silence [`NativeClient::recv`] accepts.
    idle: Option<Duration>,
    /// When bytes last arrived (or the connection opened).
    last_heard: Instant,
}

impl NativeClient {
    pub fn connect(addr: SocketAddr) -> Result<NativeClient, ClientError> {
        let stream = TcpStream::connect(addr)?;
        stream.set_nodelay(true)?;
        Ok(Self::from_transport(Transport::Plain(stream)))
    }

    /// Connects within `timeout`, else fails naming the connect timeout.
    pub fn connect_within(
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<NativeClient, ClientError> {
        Self::connect_with(addr, timeout, None)
    }

    /// Connects, with TLS when `tls` is given, and completes the handshake within `timeout`.
    pub fn connect_with(
        addr: SocketAddr,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<NativeClient, ClientError> {
        Ok(Self::from_transport(Transport::connect(addr, timeout, tls)?))
    }

    fn from_transport(stream: Transport) -> NativeClient {
        let last_heard = Instant::now();
        NativeClient { stream, buffer: Vec::new(), out: Vec::new(), idle: None, last_heard }
    }

    /// From now on, [`NativeClient::recv`] fails once nothing at all (not even a heartbeat)
    /// has arrived for `idle`: the link or the server is gone.
    pub fn set_idle_timeout(&mut self, idle: Duration) {
        self.idle = Some(idle);
    }

    /// Sends a Login and returns the server's answer; no answer within `timeout` fails
    /// naming the request timeout.
    pub fn login(
        &mut self,
        client: u32,
        secret: &str,
        next_seq: u64,
        timeout: Duration,
    ) -> Result<ServerMsg, ClientError> {
        let secret = native::secret_field(secret).ok_or(ClientError::SecretTooLong)?;
        self.send(&ClientMsg::Login { client, secret, next_seq })?;
        self.recv(timeout)?.ok_or_else(|| ClientError::TimedOut {
            timeout: Timeout::Request,
            after: timeout,
            waited_for: "no answer to the login".into(),
        })
    }

    pub fn send(&mut self, msg: &ClientMsg) -> Result<(), ClientError> {
        self.out.clear();
        native::encode_client(msg, &mut self.out);
        self.stream.write_all(&self.out)?;
        Ok(())
    }

    /// The TCP socket under the connection (for its options).
    pub fn socket(&self) -> &TcpStream {
        self.stream.socket()
    }

    /// A writer for one thread and a reader for another, and the bytes read but not yet
    /// decoded (they belong to the reader).
    pub fn split(self) -> Result<(Writer, Reader, Vec<u8>), ClientError> {
        let (writer, reader) = self.stream.split()?;
        Ok((writer, reader, self.buffer))
    }

    /// Sends raw bytes (tests of hostile input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        Ok(self.stream.write_all(bytes)?)
    }

    /// The next server message, skipping heartbeats; `Ok(None)` on timeout; an error once
    /// the idle timeout (when set) has passed without a byte.
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
            self.check_idle()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // Wake at the idle limit too, so a silent server is noticed within it.
            let silent_for = self.idle.map(|idle| idle.saturating_sub(self.last_heard.elapsed()));
            let wait =
                silent_for.map_or(left, |silent| left.min(silent).max(Duration::from_millis(1)));
            self.stream.socket().set_read_timeout(Some(wait))?;
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => {
                    self.buffer.extend_from_slice(&chunk[..n]);
                    self.last_heard = Instant::now();
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl NativeClient {
    /// Fails once the idle timeout has passed since the last byte arrived.
    fn check_idle(&self) -> Result<(), ClientError> {
        match self.idle {
            Some(idle) if self.last_heard.elapsed() >= idle => Err(ClientError::TimedOut {
                timeout: Timeout::Idle,
                after: idle,
                waited_for: "nothing from the server, not even a heartbeat".into(),
            }),
            _ => Ok(()),
        }
    }
}

/// Parses one line of a client script (see `exchange client --help`); `Ok(None)` for blank
/// lines and comments. INSTRUMENT is an id and PRICE a whole number of price units. The time
/// in force defaults to day for a limit order and ioc for a market order (never day).
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
    let words = ScriptWords { verb, args, instruments };
    let instrument = match args.get(1) {
        Some(word) => instrument_of(verb, word, instruments)?,
        None => return Err(format!("{verb}: INSTRUMENT missing")),
    };
    let mut order = native::OrderRequest {
        client,
        token: words.small(0, "TOKEN")?,
        instrument,
        ..Default::default()
    };
    match verb {
        "buy" | "sell" => words.new_order(order).map(Some),
        "cancel" => words.arity(2).map(|()| Some(ClientMsg::Cancel(order))),
        "replace" => {
            words.arity(4)?;
            order.qty = words.small(2, "QTY")?;
            order.price = words.price(3)?;
            Ok(Some(ClientMsg::Replace(order)))
        }
        _ => unreachable!("the verb was checked above"),
    }
}

/// A script line's words after its verb, read with errors that name the verb and the word.
struct ScriptWords<'a> {
    verb: &'a str,
    args: &'a [&'a str],
    instruments: Option<&'a InstrumentTable>,
}

impl ScriptWords<'_> {
    fn number(&self, at: usize, what: &str) -> Result<i64, String> {
        let verb = self.verb;
        let word = self.args.get(at).ok_or_else(|| format!("{verb}: {what} missing"))?;
        word.parse().map_err(|_| format!("{verb}: {what} {word:?} is not a number"))
    }

    fn small(&self, at: usize, what: &str) -> Result<u32, String> {
        let verb = self.verb;
        u32::try_from(self.number(at, what)?).map_err(|_| format!("{verb}: {what} out of range"))
    }

    /// A price: in the instruments table's decimals when there is one, else in ticks.
    fn price(&self, at: usize) -> Result<i64, String> {
        let verb = self.verb;
        match (self.instruments, self.args.get(at)) {
            (Some(table), Some(word)) => table.price_units(word).map_err(|e| {
                format!("{verb}: PRICE {word:?}: {e} (price_decimals {})", table.price_decimals())
            }),
            _ => self.number(at, "PRICE"),
        }
    }

    fn arity(&self, n: usize) -> Result<(), String> {
        let verb = self.verb;
        if self.args.len() == n { Ok(()) } else { Err(format!("{verb}: {n} arguments expected")) }
    }

    /// `buy|sell TOKEN INSTRUMENT QTY PRICE|market [day|ioc|fok]`, the first two read.
    fn new_order(&self, mut order: native::OrderRequest) -> Result<ClientMsg, String> {
        let verb = self.verb;
        order.side = u8::from(verb == "sell");
        order.qty = self.small(2, "QTY")?;
        let market = self.args.get(3) == Some(&"market");
        if market {
            order.order_type = 1;
        } else {
            order.price = self.price(3)?;
        }
        // A market order never rests, so it is immediate: IOC unless FOK is asked for
        // (the engine rejects a market day order, MarketDay).
        order.time_in_force = match (self.args.get(4).copied(), market) {
            (None, true) | (Some("ioc"), _) => 1,
            (None | Some("day"), false) => 0,
            (Some("fok"), _) => 2,
            (Some("day"), true) => {
                return Err(format!("{verb}: a market order is ioc or fok, not day"));
            }
            (Some(other), _) => {
                return Err(format!("{verb}: time in force {other:?} is not day, ioc or fok"));
            }
        };
        if self.args.len() > 5 {
            return Err(format!("{verb}: at most 5 arguments"));
        }
        Ok(ClientMsg::NewOrder(order))
    }
}

/// The instrument a script's INSTRUMENT word names: a symbol of the instruments table, or an
/// id.
fn instrument_of(
    verb: &str,
    word: &str,
    instruments: Option<&InstrumentTable>,
) -> Result<u32, String> {
    if let Some(id) = instruments.and_then(|table| table.id_of(word)) {
        return Ok(id);
    }
    match (word.parse::<u32>(), instruments) {
        (Ok(id), _) => Ok(id),
        (Err(_), Some(_)) => {
            Err(format!("{verb}: unknown symbol {word:?}: not in the instruments file, nor an id"))
        }
        (Err(_), None) => Err(format!(
            "{verb}: INSTRUMENT {word:?} is not an instrument id (symbols need the server's \
             instruments file)"
        )),
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
    describe_answer(msg, instruments, None)
}

/// [`describe`], knowing the request the message answers (the client's last one with the
/// event's token): a reject is described from it, since the server's reject carries the
/// reason but not always the order's side and quantity, and a market order is "at market".
///
/// ```
/// use gateway::client::{describe_answer, parse_script_line};
/// use gateway::native::{Event, ServerMsg, event_kind};
/// let sell = parse_script_line("sell 5 1 10 market", 1).unwrap().unwrap();
/// let reject = Event { kind: event_kind::REJECTED, token: 5, instrument: 1, reason: 3, ..Event::default() };
/// let line = describe_answer(&ServerMsg::Sequenced { seq: 4, event: reject }, None, Some(&sell));
/// assert!(line.starts_with("#4 rejected order 5: sell 10 of instrument 1 at market ("), "{line}");
/// ```
pub fn describe_answer(
    msg: &ServerMsg,
    instruments: Option<&InstrumentTable>,
    sent: Option<&ClientMsg>,
) -> String {
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
        ServerMsg::Sequenced { seq, event } => {
            let words = Words { instruments };
            match sent {
                _ if event.kind == event_kind::REJECTED => {
                    describe_reject(*seq, event, sent, &words)
                }
                Some(ClientMsg::NewOrder(order)) if order.order_type == 1 => {
                    describe_event(*seq, event, &words, true)
                }
                _ => describe_event(*seq, event, &words, false),
            }
        }
    }
}

/// How instruments and prices are written: symbols and decimals with a table, else ids and
/// price units.
struct Words<'a> {
    instruments: Option<&'a InstrumentTable>,
}

impl Words<'_> {
    fn instrument(&self, id: u32) -> String {
        match self.instruments.and_then(|t| t.symbol_of(id)) {
            Some(symbol) => symbol.to_string(),
            None => format!("instrument {id}"),
        }
    }

    fn price(&self, units: i64) -> String {
        self.instruments.map_or_else(|| units.to_string(), |t| t.price_text(units))
    }

    fn side(side: u8) -> &'static str {
        if side == 0 { "buy" } else { "sell" }
    }

    fn reason(code: u8) -> String {
        match code {
            0 => String::new(),
            code => format!(" ({})", native::reason_name(code)),
        }
    }
}

/// A reject, described from the request it answers when known.
fn describe_reject(seq: u64, event: &Event, sent: Option<&ClientMsg>, words: &Words) -> String {
    let (token, reason) = (event.token, Words::reason(event.reason));
    match sent {
        Some(ClientMsg::NewOrder(order)) => {
            let at = if order.order_type == 1 { "market".into() } else { words.price(order.price) };
            let (side, qty, instrument) =
                (Words::side(order.side), order.qty, words.instrument(order.instrument));
            format!("#{seq} rejected order {token}: {side} {qty} of {instrument} at {at}{reason}")
        }
        // A replace names no side (the book knows it), so none is printed.
        Some(ClientMsg::Replace(order)) => format!(
            "#{seq} rejected replace of order {token}: {} of {} at {}{reason}",
            order.qty,
            words.instrument(order.instrument),
            words.price(order.price)
        ),
        Some(ClientMsg::Cancel(order)) => format!(
            "#{seq} rejected cancel of order {token} of {}{reason}",
            words.instrument(order.instrument)
        ),
        _ => format!(
            "#{seq} rejected order {token} of {}{reason}",
            words.instrument(event.instrument)
        ),
    }
}

/// Any event but a reject; `market`: the order is a market order (no price of its own).
fn describe_event(seq: u64, event: &Event, words: &Words, market: bool) -> String {
    let kind = ["accepted", "partially filled", "filled", "cancelled", "replaced", "rejected"]
        .get(usize::from(event.kind))
        .copied()
        .unwrap_or("unknown event");
    let instrument = words.instrument(event.instrument);
    let (side, reason, token) = (Words::side(event.side), Words::reason(event.reason), event.token);
    // A fill says what traded and what is left; other events what is open.
    let filled = matches!(event.kind, event_kind::PARTIALLY_FILLED | event_kind::FILLED);
    let (qty, open) = if filled { (event.qty, event.leaves_qty) } else { (event.leaves_qty, 0) };
    let open = if filled { format!(", {open} open") } else { String::new() };
    // A fill's price is the trade's; a market order has none before it trades.
    let price = if market && !filled { "market".into() } else { words.price(event.price) };
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

    fn acme() -> InstrumentTable {
        use exchange::instruments::{ClientsFile, InstrumentSpec, InstrumentsFile, load};
        let acme = InstrumentSpec {
            symbol: "ACME".into(),
            id: None,
            tick_size: "0.01".into(),
            lot_size: "1".into(),
            reference_price: "101.25".into(),
            band_low: "91".into(),
            band_high: "111.5".into(),
            ladder_ticks: None,
            qty_max: None,
            currency: "USD".into(),
        };
        let file = InstrumentsFile { price_decimals: 4, instruments: vec![acme] };
        load(&file, &ClientsFile { clients: vec![] }).unwrap().1
    }

    #[test]
    fn a_bare_market_order_is_immediate_and_a_market_day_order_is_refused() {
        let Ok(Some(ClientMsg::NewOrder(market))) = parse_script_line("buy 8 1 5 market", 3) else {
            panic!()
        };
        assert_eq!((market.order_type, market.time_in_force), (1, 1), "market is IOC");
        let day = parse_script_line("sell 9 1 5 market day", 3).unwrap_err();
        assert!(day.contains("a market order is ioc or fok"), "{day}");
        let Ok(Some(ClientMsg::NewOrder(limit))) = parse_script_line("buy 10 1 5 100", 3) else {
            panic!()
        };
        assert_eq!(limit.time_in_force, 0, "a limit order stays a day order");
    }

    #[test]
    fn an_unknown_symbol_is_named_as_such() {
        let table = acme();
        let unknown = parse_script_line_in("buy 1 NOPE 10 101.25", 1, Some(&table)).unwrap_err();
        assert!(unknown.contains(r#"unknown symbol "NOPE""#), "{unknown}");
        let no_table = parse_script_line_in("buy 1 NOPE 10 101", 1, None).unwrap_err();
        assert!(no_table.contains("not an instrument id") && no_table.contains("instruments file"));
        assert!(!no_table.contains("is not a number"), "{no_table}");
        let by_id = parse_script_line_in("buy 1 0 10 101.25", 1, Some(&table)).unwrap();
        assert!(matches!(by_id, Some(ClientMsg::NewOrder(o)) if o.instrument == 0));
    }

    #[test]
    fn rejects_and_market_orders_are_described_from_the_request() {
        let table = acme();
        let sequenced = |kind, price| ServerMsg::Sequenced {
            seq: 9,
            // What the engine's reject of a replace carries: no side, no quantity.
            event: Event { kind, token: 7, reason: 4, price, ..Event::default() },
        };
        let reject = sequenced(event_kind::REJECTED, 0);
        let replace = parse_script_line_in("replace 7 ACME 4 101.30", 1, Some(&table)).unwrap();
        let line = describe_answer(&reject, Some(&table), replace.as_ref());
        assert!(line.starts_with("#9 rejected replace of order 7: 4 of ACME at 101.3"), "{line}");
        assert!(!line.contains("buy") && !line.contains(" 0 of"), "{line}");
        let sell = parse_script_line_in("sell 7 ACME 10 200", 1, Some(&table)).unwrap();
        let line = describe_answer(&reject, Some(&table), sell.as_ref());
        assert!(line.starts_with("#9 rejected order 7: sell 10 of ACME at 200"), "{line}");
        let market = parse_script_line_in("buy 7 ACME 10 market", 1, Some(&table)).unwrap();
        let accepted = sequenced(event_kind::ACCEPTED, 0);
        let line = describe_answer(&accepted, Some(&table), market.as_ref());
        assert!(line.contains("of ACME at market"), "{line}");
        let filled = sequenced(event_kind::FILLED, 1_012_500);
        let line = describe_answer(&filled, Some(&table), market.as_ref());
        assert!(line.contains("at 101.25"), "a fill has the trade's price: {line}");
    }
}
