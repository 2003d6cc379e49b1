//! The reference universe (instruments, clients) and a realistic, seeded order flow over it.
//!
//! Flow model: each instrument's mid price does a random walk inside its band; passive orders
//! rest a few ticks away from the mid on their own side, a configurable share crosses the mid
//! (and trades), a share is immediate (IOC / FOK / market), cancels and replaces target recent
//! orders, and a configurable share is deliberately invalid. For every invalid request the
//! generator also says which [`Reason`] the pre-process must answer, so tests can check each one.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::instruments::{
    ClientSpec, ClientsFile, InstrumentSpec, InstrumentTable, InstrumentsFile,
};
use crate::master::MasterData;
use crate::msg::{
    ClientId, InboundOrder, InstrumentId, OrderId, OrderType, Price, Qty, Reason, Side,
    TimeInForce, request_kind,
};

/// Ticks in every reference instrument's ladder.
pub const REFERENCE_LADDER_LEVELS: u32 = 4096;
/// Tick size of the reference instruments (price units).
pub const REFERENCE_TICK: Price = 5;
/// Largest order quantity of the reference instruments.
pub const REFERENCE_QTY_MAX: Qty = 10_000;
/// Price band half-width, in ticks around the reference price.
pub const REFERENCE_BAND_TICKS: i64 = 1_000;
/// Recent orders remembered as cancel/replace targets.
pub const RECENT_ORDERS_TRACKED: usize = 4096;

/// Size of the reference universe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UniverseConfig {
    pub instruments: u32,
    pub clients: u32,
}

impl Default for UniverseConfig {
    fn default() -> Self {
        UniverseConfig { instruments: 64, clients: 256 }
    }
}

/// Reference price of instrument `id`.
fn reference_price(id: InstrumentId) -> Price {
    100_000 + Price::from(id % 97) * 1_000
}

/// The reference instruments as a file: symbols `0`, `1`, ... (their ids), integer prices
/// (`price_decimals = 0`), tick 5, every fourth instrument in lots of 10.
pub fn reference_instruments(universe: &UniverseConfig) -> InstrumentsFile {
    let instruments = (0..universe.instruments)
        .map(|id| {
            let reference = reference_price(id);
            let band = REFERENCE_BAND_TICKS * REFERENCE_TICK;
            InstrumentSpec {
                symbol: id.to_string(),
                id: Some(id),
                tick_size: REFERENCE_TICK.to_string(),
                lot_size: if id % 4 == 3 { "10" } else { "1" }.to_string(),
                reference_price: reference.to_string(),
                band_low: (reference - band).to_string(),
                band_high: (reference + band).to_string(),
                ladder_ticks: Some(REFERENCE_LADDER_LEVELS),
                qty_max: Some(REFERENCE_QTY_MAX),
                currency: "XXX".to_string(),
            }
        })
        .collect();
    InstrumentsFile { price_decimals: 0, instruments }
}

/// The reference clients as a file: ids `0..clients`, each allowed orders worth up to 4 000
/// units at the highest price any reference instrument allows (every flow order, at most
/// 1 000 units, fits; an order of the 10 000 maximum at any in-band price does not).
pub fn reference_clients(universe: &UniverseConfig) -> ClientsFile {
    let order_value_max = (reference_price(96) + REFERENCE_BAND_TICKS * REFERENCE_TICK) * 4_000;
    let clients = (0..universe.clients)
        .map(|id| ClientSpec { id, order_value_max: order_value_max.to_string(), enabled: true })
        .collect();
    ClientsFile { clients }
}

/// The reference master data and symbol table (through the same loader as an operator's
/// files).
pub fn reference_market(universe: &UniverseConfig) -> (MasterData, InstrumentTable) {
    assert!(universe.instruments > 0 && universe.clients > 0);
    let files = (reference_instruments(universe), reference_clients(universe));
    crate::instruments::load(&files.0, &files.1).expect("the reference universe loads")
}

/// Builds the reference master data.
pub fn reference_master_data(universe: &UniverseConfig) -> MasterData {
    reference_market(universe).0
}

/// The shape of the order flow.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowConfig {
    /// Share of new orders priced through the mid (they trade).
    pub crossing_share: f64,
    /// Share of requests that cancel a recent order.
    pub cancel_share: f64,
    /// Share of requests that replace a recent order.
    pub replace_share: f64,
    /// Share of new orders that are immediate (IOC, FOK or market).
    pub immediate_share: f64,
    /// Share of requests that are invalid (each with a known reject reason).
    pub invalid_share: f64,
    pub seed: u64,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            crossing_share: 0.2,
            cancel_share: 0.25,
            replace_share: 0.1,
            immediate_share: 0.05,
            invalid_share: 0.02,
            seed: 42,
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Recent {
    order_id: OrderId,
    client: ClientId,
    instrument: InstrumentId,
    side: Side,
    price: Price,
}

/// Generates requests; deterministic for a given seed.
pub struct FlowGenerator {
    config: FlowConfig,
    universe: UniverseConfig,
    rng: SmallRng,
    /// Mid price per instrument, in ticks from its reference price.
    mid_ticks: Vec<i64>,
    recent: Vec<Recent>,
    next_order_id: OrderId,
}

impl FlowGenerator {
    pub fn new(universe: UniverseConfig, config: FlowConfig) -> FlowGenerator {
        FlowGenerator {
            config,
            universe,
            rng: SmallRng::seed_from_u64(config.seed),
            mid_ticks: vec![0; universe.instruments as usize],
            recent: Vec::with_capacity(RECENT_ORDERS_TRACKED),
            next_order_id: 1,
        }
    }

    /// The next request and, if it is invalid, the reason it must be rejected with.
    pub fn next_request(&mut self) -> (InboundOrder, Option<Reason>) {
        let draw: f64 = self.rng.random();
        if draw < self.config.invalid_share {
            return self.invalid();
        }
        let draw = draw - self.config.invalid_share;
        if !self.recent.is_empty() && draw < self.config.cancel_share {
            return (self.cancel(), None);
        }
        if !self.recent.is_empty() && draw < self.config.cancel_share + self.config.replace_share {
            return (self.replace(), None);
        }
        let order = self.new_order();
        if order.time_in_force == TimeInForce::Day as u8 {
            let side = Side::from_code(order.side).unwrap_or_default();
            let (order_id, client, instrument, price) =
                (order.order_id, order.client, order.instrument, order.price);
            self.remember(Recent { order_id, client, instrument, side, price });
        }
        (order, None)
    }

    fn lot_of(instrument: InstrumentId) -> Qty {
        if instrument % 4 == 3 { 10 } else { 1 }
    }

    fn mid_price(&self, instrument: InstrumentId) -> Price {
        reference_price(instrument) + self.mid_ticks[instrument as usize] * REFERENCE_TICK
    }

    fn new_order(&mut self) -> InboundOrder {
        let instrument = self.rng.random_range(0..self.universe.instruments);
        let client = self.rng.random_range(0..self.universe.clients);
        // The mid wanders a tick at a time, staying well inside the band.
        let step = self.rng.random_range(-1..=1);
        let mid = &mut self.mid_ticks[instrument as usize];
        *mid = (*mid + step).clamp(-REFERENCE_BAND_TICKS / 2, REFERENCE_BAND_TICKS / 2);
        let side = if self.rng.random::<bool>() { Side::Buy } else { Side::Sell };
        let toward = if side == Side::Buy { 1 } else { -1 };
        let crossing = self.rng.random::<f64>() < self.config.crossing_share;
        let offset_ticks =
            if crossing { self.rng.random_range(1..=3) } else { -self.rng.random_range(1..=20) };
        let price = self.mid_price(instrument) + toward * offset_ticks * REFERENCE_TICK;
        let qty = self.rng.random_range(1..=100) * Self::lot_of(instrument);
        let (order_type, time_in_force, price) =
            if self.rng.random::<f64>() < self.config.immediate_share {
                match self.rng.random_range(0..3) {
                    0 => (OrderType::Limit, TimeInForce::Ioc, price),
                    1 => (OrderType::Limit, TimeInForce::Fok, price),
                    _ => (OrderType::Market, TimeInForce::Ioc, 0),
                }
            } else {
                (OrderType::Limit, TimeInForce::Day, price)
            };
        let order_id = self.next_order_id;
        self.next_order_id += 1;
        InboundOrder {
            kind: request_kind::NEW,
            side: side as u8,
            order_type: order_type as u8,
            time_in_force: time_in_force as u8,
            instrument,
            client,
            order_id,
            price,
            qty,
            ..InboundOrder::default()
        }
    }

    fn remember(&mut self, order: Recent) {
        if self.recent.len() < RECENT_ORDERS_TRACKED {
            self.recent.push(order);
        } else {
            let at = self.rng.random_range(0..RECENT_ORDERS_TRACKED);
            self.recent[at] = order;
        }
    }

    fn take_recent(&mut self) -> Recent {
        let at = self.rng.random_range(0..self.recent.len());
        self.recent.swap_remove(at)
    }

    fn cancel(&mut self) -> InboundOrder {
        let target = self.take_recent();
        InboundOrder {
            kind: request_kind::CANCEL,
            instrument: target.instrument,
            client: target.client,
            order_id: target.order_id,
            ..InboundOrder::default()
        }
    }

    fn replace(&mut self) -> InboundOrder {
        let mut target = self.take_recent();
        let toward = if target.side == Side::Buy { 1 } else { -1 };
        target.price += toward * self.rng.random_range(-2..=2) * REFERENCE_TICK;
        let qty = self.rng.random_range(1..=100) * Self::lot_of(target.instrument);
        self.remember(target);
        InboundOrder {
            kind: request_kind::REPLACE,
            instrument: target.instrument,
            client: target.client,
            order_id: target.order_id,
            price: target.price,
            qty,
            ..InboundOrder::default()
        }
    }

    /// A new order broken in one of several ways, with the reason it must get.
    fn invalid(&mut self) -> (InboundOrder, Option<Reason>) {
        let mut order = self.new_order();
        // Limit Day orders only, so every breakage below has exactly one applicable reason.
        order.order_type = OrderType::Limit as u8;
        order.time_in_force = TimeInForce::Day as u8;
        if order.price == 0 {
            order.price = self.mid_price(order.instrument);
        }
        let reason = match self.rng.random_range(0..8) {
            0 => {
                order.side = 7;
                Reason::BadEnum
            }
            1 => {
                order.qty = 0;
                Reason::ZeroQuantity
            }
            2 => {
                order.price += 1;
                Reason::PriceOffTick
            }
            3 => {
                order.price =
                    reference_price(order.instrument) + 2 * REFERENCE_BAND_TICKS * REFERENCE_TICK;
                Reason::PriceOutsideBand
            }
            4 => {
                order.instrument = self.universe.instruments + 1;
                Reason::UnknownInstrument
            }
            5 => {
                order.client = self.universe.clients + 1;
                Reason::UnknownClient
            }
            6 => {
                order.qty = REFERENCE_QTY_MAX + 10;
                Reason::QuantityOverMax
            }
            _ => {
                // Within the quantity maximum and on lot, but worth more than any client may
                // place in one order (see `reference_master_data`).
                order.qty = REFERENCE_QTY_MAX;
                Reason::ClientLimitExceeded
            }
        };
        (order, Some(reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flow_is_deterministic_per_seed_and_has_the_configured_mix() {
        let universe = UniverseConfig { instruments: 8, clients: 8 };
        let draw = |seed| {
            let mut generator =
                FlowGenerator::new(universe, FlowConfig { seed, ..FlowConfig::default() });
            (0..20_000).map(|_| generator.next_request()).collect::<Vec<_>>()
        };
        let first = draw(1);
        assert_eq!(first, draw(1));
        assert_ne!(first, draw(2));
        let share = |kind| {
            first.iter().filter(|(r, bad)| bad.is_none() && r.kind == kind).count() as f64
                / 20_000.0
        };
        assert!(
            (share(request_kind::CANCEL) - 0.25).abs() < 0.02,
            "cancels {}",
            share(request_kind::CANCEL)
        );
        assert!((share(request_kind::REPLACE) - 0.10).abs() < 0.02);
        let invalid = first.iter().filter(|(_, bad)| bad.is_some()).count() as f64 / 20_000.0;
        assert!((invalid - 0.02).abs() < 0.01, "invalid {invalid}");
    }
}
