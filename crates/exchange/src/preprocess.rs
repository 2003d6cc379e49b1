//! The pre-process: hygiene validation, enrichment and business checks, so the core only ever
//! sees valid input. Each check failure is a [`Reason`]; the refused request goes on to its
//! core shard, which answers it with the reject in its place among the shard's outputs
//! (`tier::Refusal`).
//!
//! The checks read one master-data snapshot per message through a [`SnapshotReader`] (no
//! locks). Pre-process workers are partitioned by instrument, so one instrument's order flow
//! keeps its order through the pre-process.

use crate::events::ExternalEvent;
use crate::master::{MasterData, SnapshotReader, Status, band_fits};
use crate::msg::{
    Command, InboundOrder, InstrumentId, OrderType, Price, Qty, REASON_COUNT, Reason, RequestKind,
    Side, TimeInForce,
};

/// A request that passed every check: where it goes and what the core must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Routed {
    pub instrument: InstrumentId,
    pub command: Command,
}

/// Counters of one pre-process worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreprocessCounters {
    pub accepted: u64,
    /// Rejects per [`Reason`] code.
    pub rejected: [u64; REASON_COUNT],
}

impl Default for PreprocessCounters {
    fn default() -> Self {
        PreprocessCounters { accepted: 0, rejected: [0; REASON_COUNT] }
    }
}

/// Who checks the halt and the price band, the state external events change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateChecks {
    /// The pre-process too, against its master data (which the events process updates), so
    /// the core sees fewer doomed orders.
    Preprocess,
    /// The core only (`TierConfig::ordered_outputs`): events reach the core in the order
    /// flow (operator requests, `events::OPERATOR_CLIENT`) and the master data is not updated
    /// by them, so a pre-process check could only be out of date.
    Core,
}

/// One pre-process worker.
pub struct Preprocessor {
    reader: SnapshotReader,
    state_checks: StateChecks,
    counters: PreprocessCounters,
}

impl Preprocessor {
    pub fn new(reader: SnapshotReader, state_checks: StateChecks) -> Preprocessor {
        Preprocessor { reader, state_checks, counters: PreprocessCounters::default() }
    }

    pub fn counters(&self) -> &PreprocessCounters {
        &self.counters
    }

    /// Validates and enriches one request against the newest master data.
    pub fn check(&mut self, request: &InboundOrder) -> Result<Routed, Reason> {
        let verdict = check_with(self.reader.current(), request, self.state_checks);
        match verdict {
            Ok(_) => self.counters.accepted += 1,
            Err(reason) => self.counters.rejected[reason as usize] += 1,
        }
        verdict
    }
}

/// The checks, as a pure function of (snapshot, request), the halt and band included
/// ([`StateChecks::Preprocess`]).
pub fn check_against(master: &MasterData, request: &InboundOrder) -> Result<Routed, Reason> {
    check_with(master, request, StateChecks::Preprocess)
}

/// The checks, with the halt and band checked here or left to the core (`state_checks`).
/// An operator request (`events::OPERATOR_CLIENT`) becomes the core's command for its event.
pub fn check_with(
    master: &MasterData,
    request: &InboundOrder,
    state_checks: StateChecks,
) -> Result<Routed, Reason> {
    if let Some(event) = ExternalEvent::of_request(request) {
        return operator_command(master, &event);
    }
    let command = hygiene(request)?;
    let instrument = master.instrument(request.instrument).ok_or(Reason::UnknownInstrument)?;
    let client = master.client(request.client).ok_or(Reason::UnknownClient)?;
    let routed = Routed { instrument: request.instrument, command };
    if instrument.status != Status::Active {
        return Err(Reason::InstrumentInactive);
    }
    // Cancels pass while halted or disabled: taking risk off is always allowed.
    let (price, qty) = match command {
        Command::Cancel { .. } | Command::CancelOnDisconnect { .. } => return Ok(routed),
        Command::New { order_type: OrderType::Market, side, qty, .. } => {
            // A market order is valued at the far end of the band.
            (if side == Side::Buy { instrument.band_high } else { instrument.band_low }, qty)
        }
        Command::New { price, qty, .. } | Command::Replace { price, qty, .. } => {
            if (price - instrument.listing.ladder_low) % instrument.listing.tick != 0 {
                return Err(Reason::PriceOffTick);
            }
            let outside_band = price < instrument.band_low || price > instrument.band_high;
            if state_checks == StateChecks::Preprocess && outside_band {
                return Err(Reason::PriceOutsideBand);
            }
            (price, qty)
        }
        _ => unreachable!("hygiene only builds New, the cancels and Replace"),
    };
    if state_checks == StateChecks::Preprocess && instrument.halted {
        return Err(Reason::InstrumentHalted);
    }
    if qty % instrument.lot != 0 {
        return Err(Reason::QuantityOffLot);
    }
    if qty > instrument.qty_max {
        return Err(Reason::QuantityOverMax);
    }
    if !client.enabled {
        return Err(Reason::ClientDisabled);
    }
    if order_value(price, qty) > client.order_value_max {
        return Err(Reason::ClientLimitExceeded);
    }
    Ok(routed)
}

/// The core's command for an operator's event: refused for an unknown instrument, and for a
/// band off the instrument's ladder or upside down (as the master data refuses one).
fn operator_command(master: &MasterData, event: &ExternalEvent) -> Result<Routed, Reason> {
    let effect = event.effect(master);
    let instrument = master.instrument(effect.instrument).ok_or(Reason::UnknownInstrument)?;
    if let ExternalEvent::Band { low, high, .. } = *event
        && !band_fits(&instrument.listing, low, high)
    {
        return Err(Reason::BadPrice);
    }
    Ok(Routed { instrument: effect.instrument, command: effect.command })
}

fn order_value(price: Price, qty: Qty) -> u64 {
    (price.unsigned_abs()).saturating_mul(u64::from(qty))
}

/// Field, size and enum checks that need no reference data.
fn hygiene(request: &InboundOrder) -> Result<Command, Reason> {
    let (order_id, client) = (request.order_id, request.client);
    let kind = RequestKind::from_code(request.kind).ok_or(Reason::BadRequestKind)?;
    match kind {
        RequestKind::New => {
            let side = Side::from_code(request.side).ok_or(Reason::BadEnum)?;
            let order_type = OrderType::from_code(request.order_type).ok_or(Reason::BadEnum)?;
            let time_in_force =
                TimeInForce::from_code(request.time_in_force).ok_or(Reason::BadEnum)?;
            if request.qty == 0 {
                return Err(Reason::ZeroQuantity);
            }
            match order_type {
                OrderType::Limit if request.price <= 0 => return Err(Reason::BadPrice),
                OrderType::Market if request.price != 0 => return Err(Reason::BadPrice),
                OrderType::Market if time_in_force == TimeInForce::Day => {
                    return Err(Reason::MarketDay);
                }
                _ => {}
            }
            let (price, qty) = (request.price, request.qty);
            Ok(Command::New { order_id, client, side, order_type, time_in_force, price, qty })
        }
        RequestKind::Cancel => Ok(Command::Cancel { order_id, client }),
        RequestKind::CancelOnDisconnect => Ok(Command::CancelOnDisconnect { order_id, client }),
        RequestKind::Replace => {
            if request.qty == 0 {
                return Err(Reason::ZeroQuantity);
            }
            if request.price <= 0 {
                return Err(Reason::BadPrice);
            }
            Ok(Command::Replace { order_id, client, price: request.price, qty: request.qty })
        }
    }
}
