//! A three-stage tier of your own types on the pipeline runtime:
//!
//! ```text
//! entry (source) --by account--> validate x2 ==fused== risk x2 --> settle (sink)
//! ```
//!
//! - `validate` drops malformed orders; routing by account gives each worker a fixed set of
//!   accounts, so per-account state needs no lock and keeps each account's order;
//! - `risk` runs fused on `validate`'s threads (no ring between them): it keeps each account's
//!   exposure under a limit, which is only correct because one worker sees all of an account's
//!   orders, in order;
//! - `settle` sums what was accepted per account and hands its totals back when it finishes.
//!
//! `cargo run -p leantier-pipeline --example tier`; `tests/examples.rs` runs it and checks
//! its output against the same rules applied sequentially.

use std::io::Write;

use pipeline::stage::{
    Emitter, Flow, PipelineBuilder, PipelineError, Route, StageSpec, StageWorker,
};

/// Orders the entry stage sends.
pub const ORDERS: u64 = 20_000;
/// Accounts the orders are spread over.
pub const ACCOUNTS: u32 = 8;
/// Most notional (qty × price) one account may have accepted.
pub const ACCOUNT_LIMIT: u64 = 6_000_000;

/// An order as it enters the tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Order {
    /// Sequence number at entry.
    pub id: u64,
    /// Who placed it; the routing key.
    pub account: u32,
    /// Quantity; 0 is malformed.
    pub qty: u32,
    /// Price in ticks.
    pub price: u32,
}

/// An order that passed validation and the risk limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    /// The order's account.
    pub account: u32,
    /// qty × price.
    pub notional: u64,
}

/// The `id`-th order: a fixed stream, so a run's output is reproducible.
pub fn order(id: u64) -> Order {
    Order {
        id,
        account: (id % u64::from(ACCOUNTS)) as u32,
        qty: ((id * 7) % 100) as u32,
        price: 100 + (id % 50) as u32,
    }
}

/// Per account: (orders accepted, notional accepted).
pub type Totals = Vec<(u64, u64)>;

/// The settle stage's worker: totals per account, handed back by [`StageWorker::finish`].
struct Settle {
    totals: Totals,
}

impl StageWorker<Accepted, ()> for Settle {
    type Finished = Totals;

    fn handle(&mut self, accepted: &Accepted, _: &mut Emitter<()>) {
        let total = &mut self.totals[accepted.account as usize];
        total.0 += 1;
        total.1 += accepted.notional;
    }

    fn finish(self) -> Totals {
        self.totals
    }
}

/// Runs the tier over [`ORDERS`] orders and returns the settled totals per account.
pub fn run_tier() -> Result<Totals, PipelineError> {
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let entry = graph.source("entry", StageSpec::ancillary(1), |_| {
        let mut next = 0;
        move |out: &mut Emitter<Order>| {
            out.emit(order(next));
            next += 1;
            if next == ORDERS { Flow::Stop } else { Flow::Continue }
        }
    });
    let validate = graph.stage("validate", StageSpec::ancillary(2), |_| {
        |order: &Order, out: &mut Emitter<Order>| {
            if order.qty > 0 {
                out.emit(*order);
            }
        }
    });
    let risk = graph.stage("risk", StageSpec::ancillary(2), |_| {
        // Only this worker's accounts ever reach it: a plain Vec, no lock.
        let mut exposure = vec![0u64; ACCOUNTS as usize];
        move |order: &Order, out: &mut Emitter<Accepted>| {
            let notional = u64::from(order.qty) * u64::from(order.price);
            let used = &mut exposure[order.account as usize];
            if *used + notional <= ACCOUNT_LIMIT {
                *used += notional;
                out.emit(Accepted { account: order.account, notional });
            }
        }
    });
    let (settle, totals) = graph.stage_with_results("settle", StageSpec::ancillary(1), |_| {
        Settle { totals: vec![(0, 0); ACCOUNTS as usize] }
    });
    graph.connect(entry, validate, Route::by_key(|order: &Order| u64::from(order.account)));
    graph.fuse(validate, risk);
    graph.connect(risk, settle, Route::RoundRobin);
    graph.start()?.wait()?;
    let mut per_worker = totals.take().expect("every settle worker finished");
    Ok(per_worker.remove(0))
}

/// Runs the tier and writes one line per account, then the sums.
pub fn run(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    let totals = run_tier()?;
    for (account, (orders, notional)) in totals.iter().enumerate() {
        writeln!(out, "account {account}: {orders} orders accepted, notional {notional}")?;
    }
    let orders: u64 = totals.iter().map(|(orders, _)| orders).sum();
    let notional: u64 = totals.iter().map(|(_, notional)| notional).sum();
    writeln!(out, "total: {orders} of {ORDERS} orders accepted, notional {notional}")?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(&mut std::io::stdout().lock())
}
