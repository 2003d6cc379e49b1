//! The matching core embedded in a program of your own: replays a file of orders
//! (`orders.txt` beside this file, or the path given) through one [`MatchingCore`] and prints
//! every trade, every reject and engine cancel, then the book's final state.
//!
//! The core is a pure function of its sequenced input (no clock, no I/O), so the same file
//! always prints the same lines; `tests/examples.rs` runs this and checks them.
//!
//! `cargo run -p leantier-matching --example replay [-- FILE]`

use std::io::Write;

use matching::book::Listing;
use matching::core::{CoreLimits, MatchingCore};
use matching::msg::{
    Command, CoreOutput, OrderType, OutputKind, Reason, SequencedInput, Side, TimeInForce,
};

/// The one instrument the file trades.
pub const INSTRUMENT: u32 = 1;

/// Its ladder: prices 90..=110 in ticks of 1.
pub fn listing() -> Listing {
    Listing { instrument: INSTRUMENT, ladder_low: 90, tick: 1, levels: 21 }
}

/// Parses one request line (see `orders.txt` for the forms).
pub fn parse_command(line: &str) -> Result<Command, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |at: usize| -> Result<i64, String> {
        let word = words.get(at).ok_or_else(|| format!("missing field {at}"))?;
        word.parse().map_err(|_| format!("`{word}` is not a number"))
    };
    match words.first().copied() {
        Some("new") => {
            let side = match words.get(3).copied() {
                Some("buy") => Side::Buy,
                Some("sell") => Side::Sell,
                other => return Err(format!("side {other:?}: expected buy or sell")),
            };
            let time_in_force = match words.get(6).copied() {
                None | Some("day") => TimeInForce::Day,
                Some("ioc") => TimeInForce::Ioc,
                Some("fok") => TimeInForce::Fok,
                Some(other) => return Err(format!("time in force `{other}`")),
            };
            Ok(Command::New {
                order_id: number(1)? as u64,
                client: number(2)? as u32,
                side,
                order_type: OrderType::Limit,
                time_in_force,
                price: number(4)?,
                qty: number(5)? as u32,
            })
        }
        Some("cancel") => {
            Ok(Command::Cancel { order_id: number(1)? as u64, client: number(2)? as u32 })
        }
        Some("replace") => Ok(Command::Replace {
            order_id: number(1)? as u64,
            client: number(2)? as u32,
            price: number(3)?,
            qty: number(4)? as u32,
        }),
        other => Err(format!("request {other:?}: expected new, cancel or replace")),
    }
}

/// The line an output record prints as, if it is one this program reports.
fn describe(output: &CoreOutput) -> Option<String> {
    match (output.kind, output.reason) {
        (OutputKind::Trade, _) => Some(format!(
            "trade {} @ {}: order {} took from order {}",
            output.qty, output.price, output.order_id, output.contra_order_id
        )),
        (OutputKind::Rejected, reason) => {
            Some(format!("rejected order {}: {reason:?}", output.order_id))
        }
        (OutputKind::Cancelled, reason) if reason != Reason::CancelRequested => {
            Some(format!("engine cancelled order {}: {reason:?}", output.order_id))
        }
        _ => None,
    }
}

/// Replays `orders` (the file's text) and writes what happened to `out`.
pub fn run(orders: &str, out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let mut core = MatchingCore::new(
        &[listing()],
        CoreLimits { order_pool_slots: 1024, ..CoreLimits::default() },
    );
    let mut lines = Vec::new();
    let requests = orders.lines().enumerate().filter(|(_, line)| {
        let line = line.trim();
        !line.is_empty() && !line.starts_with('#')
    });
    for (seq, (at, line)) in (1..).zip(requests) {
        let command = parse_command(line).map_err(|error| format!("line {}: {error}", at + 1))?;
        let input = SequencedInput { seq, instrument: INSTRUMENT, command, ..Default::default() };
        core.process(&input, &mut |output| lines.extend(describe(output)));
    }
    for line in lines {
        writeln!(out, "{line}")?;
    }
    let counters = core.counters();
    let book = core.book(INSTRUMENT).expect("listed").top();
    writeln!(
        out,
        "{} requests, {} trades, {} orders resting",
        counters.inputs,
        counters.trades,
        core.resting_orders()
    )?;
    writeln!(
        out,
        "best bid {} x {}, best ask {} x {}",
        book.bid, book.bid_qty, book.ask, book.ask_qty
    )?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/orders.txt");
    let path = std::env::args().nth(1).unwrap_or_else(|| shipped.to_string());
    let orders = std::fs::read_to_string(&path).map_err(|error| format!("{path}: {error}"))?;
    run(&orders, &mut std::io::stdout().lock())
}
