//! Property tests of the matching core against a deliberately naive reference model (a flat
//! list of orders searched linearly): same reports, same fills in the same order (which checks
//! price-time priority), never crossed after an input, quantity conserved per order, and
//! cancels/replaces of unknown or finished orders rejected.

use std::collections::HashMap;

use exchange::book::{Listing, TopOfBook};
use exchange::core::{CoreLimits, MatchingCore};
use exchange::msg::{
    Command, CoreOutput, OrderType, OutputKind, Price, Qty, Reason, SequencedInput, Side,
    TimeInForce,
};
use proptest::prelude::*;

const INSTRUMENT: u32 = 7;
const LISTING: Listing = Listing { instrument: INSTRUMENT, ladder_low: 1_000, tick: 5, levels: 64 };
const POOL_SLOTS: u32 = 48;
/// Ended order ids the core keeps refusing: small, so the ids (drawn small) are both refused
/// while kept and taken again once forgotten.
const ENDED_IDS: u32 = 8;

/// An expected answer: (kind, reason, order id, cancelled qty, leaves qty).
type Answer = (OutputKind, Reason, u64, Qty, Qty);
/// An expected fill: (aggressor id, resting id, price, qty).
type Fill = (u64, u64, Price, Qty);

#[derive(Clone, Copy, Debug)]
struct ModelOrder {
    id: u64,
    client: u32,
    side: Side,
    price: Price,
    qty: Qty,
    time: u64,
}

/// The reference: every decision made by scanning all resting orders.
#[derive(Default)]
struct Model {
    orders: Vec<ModelOrder>,
    /// The newest `ENDED_IDS` ended orders' ids, oldest first.
    ended: std::collections::VecDeque<u64>,
    clock: u64,
    halted: bool,
}

impl Model {
    fn end(&mut self, id: u64) {
        if self.ended.len() == ENDED_IDS as usize {
            self.ended.pop_front();
        }
        self.ended.push_back(id);
    }

    fn best_contra(&self, side: Side, limit: Price) -> Option<usize> {
        let crosses = |o: &ModelOrder| match side {
            Side::Buy => o.side == Side::Sell && o.price <= limit,
            Side::Sell => o.side == Side::Buy && o.price >= limit,
        };
        let better = |a: &ModelOrder, b: &ModelOrder| match side {
            Side::Buy => (a.price, a.time) < (b.price, b.time),
            Side::Sell => (-a.price, a.time) < (-b.price, b.time),
        };
        let mut best: Option<usize> = None;
        for (i, o) in self.orders.iter().enumerate() {
            if crosses(o) && best.is_none_or(|b| better(o, &self.orders[b])) {
                best = Some(i);
            }
        }
        best
    }

    /// Fills as (aggressor id, resting id, price, qty); returns the aggressor's remainder.
    fn match_order(
        &mut self,
        id: u64,
        side: Side,
        limit: Price,
        mut qty: Qty,
        fills: &mut Vec<Fill>,
    ) -> Qty {
        while qty > 0 {
            let Some(i) = self.best_contra(side, limit) else { break };
            let fill = qty.min(self.orders[i].qty);
            qty -= fill;
            self.orders[i].qty -= fill;
            fills.push((id, self.orders[i].id, self.orders[i].price, fill));
            if self.orders[i].qty == 0 {
                let ended = self.orders.remove(i);
                self.end(ended.id);
            }
        }
        qty
    }

    fn available(&self, side: Side, limit: Price) -> u64 {
        self.orders
            .iter()
            .filter(|o| match side {
                Side::Buy => o.side == Side::Sell && o.price <= limit,
                Side::Sell => o.side == Side::Buy && o.price >= limit,
            })
            .map(|o| u64::from(o.qty))
            .sum()
    }

    fn top(&self) -> TopOfBook {
        let best = |side: Side| {
            let prices = self.orders.iter().filter(|o| o.side == side).map(|o| o.price);
            let price = if side == Side::Buy { prices.max() } else { prices.min() };
            price.map_or((0, 0), |p| {
                (
                    p,
                    self.orders
                        .iter()
                        .filter(|o| o.side == side && o.price == p)
                        .map(|o| u64::from(o.qty))
                        .sum(),
                )
            })
        };
        let (bid, bid_qty) = best(Side::Buy);
        let (ask, ask_qty) = best(Side::Sell);
        TopOfBook { bid, bid_qty, ask, ask_qty }
    }

    /// The expected (kind, reason, order id, qty, leaves) answer and the expected fills.
    fn apply(&mut self, command: Command) -> (Vec<Answer>, Vec<Fill>) {
        self.clock += 1;
        let mut answers = Vec::new();
        let mut fills = Vec::new();
        match command {
            Command::New { order_id, client, side, order_type, time_in_force, price, qty } => {
                let limit = if order_type == OrderType::Market {
                    if side == Side::Buy { LISTING.ladder_high() } else { LISTING.ladder_low }
                } else {
                    price
                };
                let rests = order_type == OrderType::Limit && time_in_force == TimeInForce::Day;
                let reject = if self.halted {
                    Some(Reason::InstrumentHalted)
                } else if self.orders.iter().any(|o| o.id == order_id)
                    || self.ended.contains(&order_id)
                {
                    Some(Reason::DuplicateOrderId)
                } else if rests && self.orders.len() == POOL_SLOTS as usize {
                    Some(Reason::OrderPoolFull)
                } else {
                    None
                };
                if let Some(reason) = reject {
                    answers.push((OutputKind::Rejected, reason, order_id, 0, 0));
                    return (answers, fills);
                }
                answers.push((OutputKind::Accepted, Reason::None, order_id, 0, qty));
                if time_in_force == TimeInForce::Fok && self.available(side, limit) < u64::from(qty)
                {
                    answers.push((
                        OutputKind::Cancelled,
                        Reason::FillOrKillUnfilled,
                        order_id,
                        qty,
                        0,
                    ));
                    self.end(order_id);
                    return (answers, fills);
                }
                let left = self.match_order(order_id, side, limit, qty, &mut fills);
                if left == 0 || !rests {
                    self.end(order_id);
                }
                if left > 0 && rests {
                    self.orders.push(ModelOrder {
                        id: order_id,
                        client,
                        side,
                        price,
                        qty: left,
                        time: self.clock,
                    });
                } else if left > 0 {
                    answers.push((
                        OutputKind::Cancelled,
                        Reason::ImmediateRemainder,
                        order_id,
                        left,
                        0,
                    ));
                }
            }
            Command::Cancel { order_id, client }
            | Command::CancelOnDisconnect { order_id, client } => {
                let why = match command {
                    Command::Cancel { .. } => Reason::CancelRequested,
                    _ => Reason::CancelOnDisconnect,
                };
                match self.orders.iter().position(|o| o.id == order_id) {
                    None => {
                        answers.push((OutputKind::Rejected, Reason::UnknownOrder, order_id, 0, 0))
                    }
                    Some(i) if self.orders[i].client != client => {
                        answers.push((OutputKind::Rejected, Reason::NotOrderOwner, order_id, 0, 0))
                    }
                    Some(i) => {
                        let order = self.orders.remove(i);
                        self.end(order_id);
                        answers.push((OutputKind::Cancelled, why, order_id, order.qty, 0));
                    }
                }
            }
            Command::Replace { order_id, client, price, qty } => match self
                .orders
                .iter()
                .position(|o| o.id == order_id)
            {
                None => answers.push((OutputKind::Rejected, Reason::UnknownOrder, order_id, 0, 0)),
                Some(i) if self.orders[i].client != client => {
                    answers.push((OutputKind::Rejected, Reason::NotOrderOwner, order_id, 0, 0))
                }
                Some(_) if self.halted => {
                    answers.push((OutputKind::Rejected, Reason::InstrumentHalted, order_id, 0, 0))
                }
                Some(i) => {
                    answers.push((OutputKind::Replaced, Reason::None, order_id, 0, qty));
                    if self.orders[i].price == price && qty <= self.orders[i].qty {
                        self.orders[i].qty = qty;
                    } else {
                        let order = self.orders.remove(i);
                        let left = self.match_order(order_id, order.side, price, qty, &mut fills);
                        if left > 0 {
                            self.orders.push(ModelOrder {
                                price,
                                qty: left,
                                time: self.clock,
                                ..order
                            });
                        } else {
                            self.end(order_id);
                        }
                    }
                }
            },
            Command::Halt => self.halted = true,
            Command::Resume => self.halted = false,
            Command::SetBand { .. } | Command::Nop => {}
        }
        (answers, fills)
    }
}

fn side_strategy() -> impl Strategy<Value = Side> {
    prop_oneof![Just(Side::Buy), Just(Side::Sell)]
}

/// Raw operation: ids and prices are drawn small so orders collide, cross and get reused.
#[derive(Clone, Debug)]
enum Op {
    New { id: u64, client: u32, side: Side, market: bool, tif: u8, level: u32, qty: Qty },
    Cancel { id: u64, client: u32 },
    CancelOnDisconnect { id: u64, client: u32 },
    Replace { id: u64, client: u32, level: u32, qty: Qty },
    Halt,
    Resume,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1u64..120, 1u32..3, side_strategy(), prop::bool::weighted(0.1), 0u8..3, 20u32..44, 1u32..40)
            .prop_map(|(id, client, side, market, tif, level, qty)| Op::New { id, client, side, market, tif, level, qty }),
        2 => (1u64..120, 1u32..3).prop_map(|(id, client)| Op::Cancel { id, client }),
        1 => (1u64..120, 1u32..3).prop_map(|(id, client)| Op::CancelOnDisconnect { id, client }),
        2 => (1u64..120, 1u32..3, 20u32..44, 1u32..40).prop_map(|(id, client, level, qty)| Op::Replace { id, client, level, qty }),
        1 => Just(Op::Halt),
        3 => Just(Op::Resume),
    ]
}

fn command_of(op: &Op) -> Command {
    match *op {
        Op::New { id, client, side, market, tif, level, qty } => Command::New {
            order_id: id,
            client,
            side,
            order_type: if market { OrderType::Market } else { OrderType::Limit },
            time_in_force: if market {
                TimeInForce::Ioc
            } else {
                TimeInForce::from_code(tif).unwrap()
            },
            price: if market { 0 } else { LISTING.price_of(level) },
            qty,
        },
        Op::Cancel { id, client } => Command::Cancel { order_id: id, client },
        Op::CancelOnDisconnect { id, client } => {
            Command::CancelOnDisconnect { order_id: id, client }
        }
        Op::Replace { id, client, level, qty } => {
            Command::Replace { order_id: id, client, price: LISTING.price_of(level), qty }
        }
        Op::Halt => Command::Halt,
        Op::Resume => Command::Resume,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn core_matches_the_reference_model(ops in prop::collection::vec(op_strategy(), 1..300)) {
        let limits = CoreLimits { order_pool_slots: POOL_SLOTS, ended_order_ids: ENDED_IDS };
        let mut core = MatchingCore::new(&[LISTING], limits);
        let mut model = Model::default();
        // Per-order open quantity, tracked from the output stream alone (conservation).
        let mut leaves: HashMap<u64, Qty> = HashMap::new();
        for (seq, op) in ops.iter().enumerate() {
            let command = command_of(op);
            let input = SequencedInput { seq: seq as u64 + 1, instrument: INSTRUMENT, command, ..Default::default() };
            let mut outputs: Vec<CoreOutput> = Vec::new();
            core.process(&input, &mut |o| outputs.push(*o));
            let (want_answers, want_fills) = model.apply(command);

            let answers: Vec<_> = outputs.iter()
                .filter(|o| matches!(o.kind, OutputKind::Accepted | OutputKind::Cancelled | OutputKind::Replaced | OutputKind::Rejected))
                .map(|o| {
                    let qty = if o.kind == OutputKind::Cancelled { o.qty } else { 0 };
                    let leaves = if matches!(o.kind, OutputKind::Accepted | OutputKind::Replaced) { o.leaves_qty } else { 0 };
                    (o.kind, o.reason, o.order_id, qty, leaves)
                })
                .collect();
            prop_assert_eq!(&answers, &want_answers, "answers to {:?}", op);
            let trades: Vec<_> = outputs.iter().filter(|o| o.kind == OutputKind::Trade)
                .map(|o| (o.order_id, o.contra_order_id, o.price, o.qty)).collect();
            prop_assert_eq!(&trades, &want_fills, "fills (price-time priority) of {:?}", op);

            for o in &outputs {
                match o.kind {
                    OutputKind::Accepted | OutputKind::Replaced => { leaves.insert(o.order_id, o.leaves_qty); }
                    OutputKind::PartiallyFilled | OutputKind::Filled => {
                        let open = leaves.get_mut(&o.order_id).expect("fill of a known order");
                        prop_assert!(*open >= o.qty, "overfill");
                        *open -= o.qty;
                        prop_assert_eq!(*open, o.leaves_qty);
                        prop_assert_eq!(o.kind == OutputKind::Filled, o.leaves_qty == 0);
                    }
                    OutputKind::Cancelled => {
                        let open = leaves.insert(o.order_id, 0).expect("cancel of a known order");
                        prop_assert_eq!(open, o.qty, "cancelled quantity is the open quantity");
                    }
                    OutputKind::Rejected | OutputKind::Trade | OutputKind::TopOfBook => {}
                }
            }
            let book = core.book(INSTRUMENT).unwrap();
            prop_assert!(!book.is_crossed(), "crossed after {:?}", op);
            prop_assert_eq!(book.top(), model.top());
            // A top-of-book record reports the top it changed to (quantities here fit a Qty).
            if let Some(record) = outputs.iter().rev().find_map(CoreOutput::top_of_book) {
                prop_assert_eq!(record, model.top());
            }
            prop_assert_eq!(core.counters().invalid_inputs, 0);
        }
        for (id, open) in leaves {
            let resting = core.resting_qty(id);
            prop_assert_eq!(resting.unwrap_or(0), open, "order {} open quantity", id);
        }
    }
}

#[test]
fn cancel_and_replace_of_a_filled_order_are_rejected() {
    let mut core = MatchingCore::new(
        &[LISTING],
        CoreLimits { order_pool_slots: POOL_SLOTS, ..CoreLimits::default() },
    );
    let price = LISTING.price_of(30);
    let new = |order_id, side| Command::New {
        order_id,
        client: 1,
        side,
        order_type: OrderType::Limit,
        time_in_force: TimeInForce::Day,
        price,
        qty: 10,
    };
    let commands = [
        new(1, Side::Sell),
        new(2, Side::Buy),
        Command::Cancel { order_id: 1, client: 1 },
        Command::Replace { order_id: 2, client: 1, price, qty: 5 },
        Command::Cancel { order_id: 99, client: 1 },
    ];
    let mut outputs = Vec::new();
    for (seq, command) in commands.into_iter().enumerate() {
        let input = SequencedInput {
            seq: seq as u64 + 1,
            instrument: INSTRUMENT,
            command,
            ..Default::default()
        };
        core.process(&input, &mut |o| outputs.push(*o));
    }
    let rejects: Vec<_> = outputs
        .iter()
        .filter(|o| o.kind == OutputKind::Rejected)
        .map(|o| (o.seq, o.reason))
        .collect();
    assert_eq!(
        rejects,
        vec![(3, Reason::UnknownOrder), (4, Reason::UnknownOrder), (5, Reason::UnknownOrder)]
    );
    assert_eq!(core.resting_orders(), 0);
}
