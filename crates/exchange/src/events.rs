//! External events (market operations, a surveillance feed: halts, circuit breakers, price
//! bands), what each does to the core and the master data ([`Effect`]), and each as a request
//! of the order flow, for a tier whose inputs are one ordered log
//! (an engine of a replicated group, the `replication` crate): an event appended to the log
//! between two orders takes effect in the core between them on every engine of the group. A
//! control input on a ring of its own could overtake an order on one engine and not on
//! another, and the engines' books would part.
//!
//! An operator request is an [`InboundOrder`] from [`OPERATOR_CLIENT`], a client id no
//! session can hold (the gateway's credentials refuse it), whose kind is one of
//! [`operator_kind`]. The pre-process turns it into the core's command (`Halt`, `Resume`,
//! `SetBand`); the core owns halt and band state, so the event is in its books, its snapshots
//! and its journal like any input.

use crate::master::{MasterData, MasterUpdate};
use crate::msg::{ClientId, Command, InboundOrder, InstrumentId, Price};

/// An external event as it arrives from outside (market operations, a surveillance feed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExternalEvent {
    #[default]
    None,
    Halt(InstrumentId),
    /// Halt caused by a price move (same effect as a halt; reported apart).
    CircuitBreaker(InstrumentId),
    Resume(InstrumentId),
    Band {
        instrument: InstrumentId,
        low: Price,
        high: Price,
    },
}

/// What an event does: the core's command for its instrument and the master data's update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effect {
    pub instrument: InstrumentId,
    /// `Nop` for [`ExternalEvent::None`] and for an instrument the master data does not list.
    pub command: Command,
    pub master: MasterUpdate,
}

/// The client id of operator requests; no session may hold it.
pub const OPERATOR_CLIENT: ClientId = ClientId::MAX;

/// The kinds of an operator request ([`InboundOrder::kind`] when the client is
/// [`OPERATOR_CLIENT`]).
pub mod operator_kind {
    /// Halt the instrument.
    pub const HALT: u8 = 1;
    /// Halt the instrument on a price move (same effect; reported apart).
    pub const CIRCUIT_BREAKER: u8 = 2;
    /// Resume trading.
    pub const RESUME: u8 = 3;
    /// Set the price band: `price` the lowest price, `order_id` the highest (its bits).
    pub const BAND: u8 = 4;
}

impl ExternalEvent {
    /// What the event does, given the current master data: an event for an instrument it
    /// does not list has no effect on the core (its command is `Nop`).
    ///
    /// ```
    /// use exchange::events::ExternalEvent;
    /// use exchange::flow::{UniverseConfig, reference_master_data};
    /// use exchange::msg::Command;
    /// let master = reference_master_data(&UniverseConfig::default());
    /// assert_eq!(ExternalEvent::Halt(1).effect(&master).command, Command::Halt);
    /// assert_eq!(ExternalEvent::Halt(999_999).effect(&master).command, Command::Nop);
    /// ```
    pub fn effect(&self, master: &MasterData) -> Effect {
        let (instrument, command, update) = match *self {
            ExternalEvent::None => return Effect::default(),
            ExternalEvent::Halt(instrument) | ExternalEvent::CircuitBreaker(instrument) => {
                (instrument, Command::Halt, MasterUpdate::Halted { instrument, halted: true })
            }
            ExternalEvent::Resume(instrument) => {
                (instrument, Command::Resume, MasterUpdate::Halted { instrument, halted: false })
            }
            ExternalEvent::Band { instrument, low, high } => (
                instrument,
                Command::SetBand { low, high },
                MasterUpdate::Band { instrument, low, high },
            ),
        };
        let command = if master.instrument(instrument).is_some() { command } else { Command::Nop };
        Effect { instrument, command, master: update }
    }

    /// The event as an operator request (`None` for [`ExternalEvent::None`]).
    ///
    /// ```
    /// use exchange::events::{ExternalEvent, OPERATOR_CLIENT};
    /// let band = ExternalEvent::Band { instrument: 3, low: 90, high: 110 };
    /// let request = band.as_request().unwrap();
    /// assert_eq!((request.client, request.instrument), (OPERATOR_CLIENT, 3));
    /// assert_eq!(ExternalEvent::of_request(&request), Some(band));
    /// assert_eq!(ExternalEvent::None.as_request(), None);
    /// ```
    pub fn as_request(&self) -> Option<InboundOrder> {
        let (kind, instrument, low, high) = match *self {
            ExternalEvent::None => return None,
            ExternalEvent::Halt(instrument) => (operator_kind::HALT, instrument, 0, 0),
            ExternalEvent::CircuitBreaker(instrument) => {
                (operator_kind::CIRCUIT_BREAKER, instrument, 0, 0)
            }
            ExternalEvent::Resume(instrument) => (operator_kind::RESUME, instrument, 0, 0),
            ExternalEvent::Band { instrument, low, high } => {
                (operator_kind::BAND, instrument, low, high)
            }
        };
        let order_id = high.cast_unsigned();
        let client = OPERATOR_CLIENT;
        Some(InboundOrder {
            kind,
            instrument,
            client,
            order_id,
            price: low,
            ..InboundOrder::default()
        })
    }

    /// The event an operator request carries; `None` when `request` is not one (another
    /// client, or a kind outside [`operator_kind`]).
    ///
    /// ```
    /// use exchange::msg::InboundOrder;
    /// use exchange::events::{ExternalEvent, OPERATOR_CLIENT};
    /// let halt = ExternalEvent::Halt(7).as_request().unwrap();
    /// assert_eq!(ExternalEvent::of_request(&halt), Some(ExternalEvent::Halt(7)));
    /// let from_a_client = InboundOrder { client: 1, ..halt };
    /// assert_eq!(ExternalEvent::of_request(&from_a_client), None);
    /// let unknown_kind = InboundOrder { kind: 99, ..halt };
    /// assert_eq!(ExternalEvent::of_request(&unknown_kind), None);
    /// ```
    pub fn of_request(request: &InboundOrder) -> Option<ExternalEvent> {
        if request.client != OPERATOR_CLIENT {
            return None;
        }
        let instrument = request.instrument;
        Some(match request.kind {
            operator_kind::HALT => ExternalEvent::Halt(instrument),
            operator_kind::CIRCUIT_BREAKER => ExternalEvent::CircuitBreaker(instrument),
            operator_kind::RESUME => ExternalEvent::Resume(instrument),
            operator_kind::BAND => ExternalEvent::Band {
                instrument,
                low: request.price,
                high: request.order_id.cast_signed(),
            },
            _ => return None,
        })
    }
}
