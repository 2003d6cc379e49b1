//! An order source: what the tier runs to take its orders in ([`super::Tier::start_with_source`]).
//! The tier hands the source what it needs when the source first runs, on the source's own
//! thread ([`SourceStart`]: the control input, the journals' durable sequences, the layout),
//! and [`super::Tier::start_with_source`] returns once the source has started (or with the
//! error its start returned). Nothing is polled and nothing is handed over beside it.

use std::sync::Arc;
use std::sync::mpsc;

use journal::DurableSeq;
use pipeline::stage::{Emitter, Flow};

use super::layout::TierLayout;
use super::service::TierControl;
use crate::msg::InboundOrder;

/// What the tier hands an order source when it first runs.
pub struct SourceStart {
    /// The tier's control input (external events, master-data updates); dropping it is fine
    /// for a source that sends none.
    pub control: TierControl,
    /// Per core shard, the journal's durable sequence (`None` with the journal off): what a
    /// source that took over the reply hold ([`super::TierConfig::hold_replies`]) waits for.
    pub durables: Vec<Option<Arc<DurableSeq>>>,
    /// The thread layout the tier runs.
    pub layout: TierLayout,
}

/// One turn of a started source: it emits the orders it has and waits inside the call when
/// it has none (it owns its thread: the chain's first one when the layout runs the entry
/// inline, else one of its own); it ends the tier's input by returning [`Flow::Stop`].
pub type SourceTurns = Box<dyn FnMut(&mut Emitter<InboundOrder>) -> Flow + Send>;

/// Why a source could not start (its own error, kept as the cause of
/// [`crate::ExchangeError::SourceFailed`]).
pub type SourceFailed = Box<dyn std::error::Error + Send + Sync>;

/// Starts a source on its thread from what the tier hands it.
type StartSource = Box<dyn FnOnce(SourceStart) -> Result<SourceTurns, SourceFailed> + Send>;

/// A source of orders the tier runs: a name (its pipeline stage and thread name) and how it
/// starts.
pub struct OrderSource {
    name: &'static str,
    start: StartSource,
}

/// The pipeline stage (and thread name) of a source that takes the default name.
pub const ORDER_SOURCE_STAGE: &str = "orders";

impl OrderSource {
    /// A source started by `start` from what the tier hands it (on the source's thread, when
    /// it first runs).
    pub fn new(
        start: impl FnOnce(SourceStart) -> Result<SourceTurns, SourceFailed> + Send + 'static,
    ) -> OrderSource {
        OrderSource { name: ORDER_SOURCE_STAGE, start: Box::new(start) }
    }

    /// A source that needs nothing of the tier but its turns (the control input is dropped
    /// when it starts).
    pub fn turns(
        turns: impl FnMut(&mut Emitter<InboundOrder>) -> Flow + Send + 'static,
    ) -> OrderSource {
        OrderSource::new(move |_| Ok(Box::new(turns)))
    }

    /// The same source under another stage (and thread) name.
    pub fn named(self, name: &'static str) -> OrderSource {
        OrderSource { name, ..self }
    }

    /// Its stage (and thread) name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The source as its pipeline stage runs it: the first call waits for what the tier
    /// hands over (`handed`: sent once the pipeline started), starts the source and tells
    /// `started` how that went; every call after is one of the source's turns. A tier that
    /// failed to start hands nothing over, and the source stops unstarted.
    pub(super) fn into_stage(
        self,
        handed: mpsc::Receiver<SourceStart>,
        started: mpsc::SyncSender<Result<(), SourceFailed>>,
    ) -> impl FnMut(&mut Emitter<InboundOrder>) -> Flow + Send + 'static {
        let mut pending = Some((self.start, handed, started));
        let mut turns: Option<SourceTurns> = None;
        move |out: &mut Emitter<InboundOrder>| {
            if let Some(turns) = &mut turns {
                return turns(out);
            }
            let Some((start, handed, started)) = pending.take() else { return Flow::Stop };
            let Ok(handed) = handed.recv() else { return Flow::Stop };
            match start(handed) {
                Ok(mut source) => {
                    let _ = started.send(Ok(()));
                    let flow = source(out);
                    turns = Some(source);
                    flow
                }
                Err(error) => {
                    let _ = started.send(Err(error));
                    Flow::Stop
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::durability::JournalMode;
    use crate::error::ExchangeError;
    use crate::events::ExternalEvent;
    use crate::tier::{Tier, TierConfig, TierStart, in_process_subscribers};

    fn start() -> TierStart {
        let config = TierConfig { journal: JournalMode::OFF, ..TierConfig::parked() };
        TierStart::new(config, 1_000.0, in_process_subscribers(8, 0))
    }

    #[test]
    fn a_source_gets_the_control_input_durables_and_layout_when_it_starts() {
        let seen = Arc::new(Mutex::new(None));
        let noted = seen.clone();
        let source = OrderSource::new(move |started: SourceStart| {
            let SourceStart { mut control, durables, layout } = started;
            let event = control.event(ExternalEvent::CircuitBreaker(1)).is_ok();
            *noted.lock().unwrap() = Some((event, durables.len(), layout));
            Ok(Box::new(|_: &mut Emitter<InboundOrder>| Flow::Stop) as SourceTurns)
        });
        let tier = Tier::start_with_source(start(), source).expect("the tier starts");
        let layout = tier.layout().clone();
        tier.stop().expect("the tier drains once its source stopped");
        let (event, durables, handed) = seen.lock().unwrap().take().expect("the source started");
        assert!(event, "the control input takes an event while the tier runs");
        assert_eq!(durables, 1, "one durable sequence (none: journal off) per core shard");
        assert_eq!(handed, layout, "the source is handed the tier's layout");
    }

    #[test]
    fn a_source_that_fails_to_start_fails_the_start_with_its_own_error() {
        let source = OrderSource::new(|_| Err("the store is owned by pid 7".into())).named("mine");
        let Err(error) = Tier::start_with_source(start(), source) else {
            panic!("a failed source must fail the start")
        };
        let ExchangeError::SourceFailed(cause) = error else { panic!("{error:?}") };
        assert_eq!(cause.to_string(), "the store is owned by pid 7");
    }
}
