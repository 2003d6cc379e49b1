//! The reference tier with a source and a subscriber of your own: the source (run by the tier
//! on one of its threads) sends resting sells and then buys that cross them; the subscriber
//! (one per outlet and R-Sender) tallies what the tier delivers by kind of record.
//!
//! `cargo run -p leantier-exchange --example custom_tier`; `tests/examples.rs` runs it and
//! checks the tally.

use std::io::Write;
use std::sync::{Arc, Mutex};

use exchange::durability::JournalMode;
use exchange::flow::reference_master_data;
use exchange::msg::{InboundOrder, OutputKind, Response, Side, request_kind};
use exchange::tier::{OrderSource, Subscriber, SubscriberFactory, Tier, TierConfig, TierStart};
use pipeline::stage::{Emitter, Flow};

/// Sells sent before the buys that take them one for one.
pub const PAIRS: u64 = 10;
/// Outlets the reference master data routes clients to (one subscriber each per R-Sender).
const OUTLETS: usize = 8;

/// What the subscribers received, by kind of record.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Orders accepted.
    pub accepted: u64,
    /// Orders filled in full (both sides of every trade here).
    pub filled: u64,
    /// Trades published as market data.
    pub trades: u64,
    /// Anything else (top-of-book changes, partial fills, rejects).
    pub other: u64,
}

/// A subscriber of our own: it tallies into a shared [`Tally`].
struct Tallying(Arc<Mutex<Tally>>);

impl Subscriber for Tallying {
    fn deliver(&mut self, response: &Response) {
        let mut tally = self.0.lock().unwrap();
        match response.output.kind {
            OutputKind::Accepted => tally.accepted += 1,
            OutputKind::Filled => tally.filled += 1,
            OutputKind::Trade => tally.trades += 1,
            _ => tally.other += 1,
        }
    }
}

/// A source of our own: `PAIRS` sells at `price`, then as many buys at the same price.
fn crossing_orders(price: i64) -> OrderSource {
    let mut sent = 0;
    OrderSource::turns(move |out: &mut Emitter<InboundOrder>| {
        let side = if sent < PAIRS { Side::Sell } else { Side::Buy };
        out.emit(InboundOrder {
            kind: request_kind::NEW,
            side: side as u8,
            instrument: 1,
            client: 1 + side as u32,
            order_id: sent + 1,
            price,
            qty: 1,
            ..InboundOrder::default()
        });
        sent += 1;
        if sent == 2 * PAIRS { Flow::Stop } else { Flow::Continue }
    })
}

/// Runs the tier over the source's orders and returns the subscribers' tally.
pub fn run_tier() -> Result<Tally, Box<dyn std::error::Error>> {
    let config = TierConfig { journal: JournalMode::OFF, ..TierConfig::parked() };
    let instrument = reference_master_data(&config.universe);
    let instrument = instrument.instrument(1).ok_or("instrument 1 is not listed")?;
    let price = (instrument.band_low + instrument.band_high) / 2;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let shared = tally.clone();
    let subscribers: SubscriberFactory = Arc::new(move |_sender| {
        let each = (0..OUTLETS).map(|_| Box::new(Tallying(shared.clone())) as Box<dyn Subscriber>);
        each.collect()
    });
    // No external events: the source drops the control input, and the tier ends when the
    // source stops.
    let tier = Tier::start_with_source(
        TierStart::new(config, 1_000.0, subscribers),
        crossing_orders(price),
    )?;
    tier.stop()?;
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    Ok(tally)
}

/// Runs the tier and writes the tally.
pub fn run(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let Tally { accepted, filled, trades, other } = run_tier()?;
    writeln!(out, "accepted {accepted}, filled {filled}, trades {trades}, other {other}")?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(&mut std::io::stdout().lock())
}
