//! The tier binding: one thread runs the exchange's pre-process checks and matching core on
//! the requests the sessions push into a `pipeline` ring, and pushes each execution report
//! into a second ring that the gateway's router drains and routes to the owning session.
//!
//! The interface is narrow on purpose: [`InboundOrder`] in, [`CoreOutput`] (client audience
//! only) out. Order ids are `client << 32 | token`, so a report names its owner and the
//! client's own order number without any lookup.

use std::sync::Arc;
use std::thread::JoinHandle;

use exchange::core::{CoreLimits, MatchingCore};
use exchange::master::MasterData;
use exchange::msg::{ClientId, CoreOutput, InboundOrder, OrderId, OutputKind, SequencedInput};
use exchange::preprocess::check_against;
use pipeline::ring::{self, Consumer, Producer, RingConfig};
use tokio::sync::Notify;

/// Requests the engine reads per batch before it wakes the router.
const ENGINE_BATCH_MAX: usize = 256;

/// The tier order id of a client's order number.
pub fn order_id(client: ClientId, token: u32) -> OrderId {
    (u64::from(client) << 32) | u64::from(token)
}

/// The client order number inside a tier order id.
pub fn token_of(order_id: OrderId) -> u32 {
    order_id as u32
}

/// The gateway's ends of the engine.
pub struct EngineLink {
    /// Where sessions push requests; `Full` means the tier is busy.
    pub ingress: Producer<InboundOrder>,
    /// Execution reports, in the core's order.
    pub egress: Consumer<CoreOutput>,
    /// Notified after the engine publishes reports.
    pub reports_ready: Arc<Notify>,
    pub thread: JoinHandle<()>,
}

/// Starts the engine thread over `master` (a fixed snapshot: `serve` has no master-data feed).
pub fn start(
    master: MasterData,
    limits: CoreLimits,
    ring_config: &RingConfig,
) -> Result<EngineLink, pipeline::ring::RingError> {
    let (ingress, mut requests) = ring::spsc::<InboundOrder>(ring_config)?;
    let (mut reports, egress) = ring::spsc::<CoreOutput>(ring_config)?;
    let reports_ready = Arc::new(Notify::new());
    let wake = reports_ready.clone();
    let thread = std::thread::Builder::new()
        .name("gateway-engine".into())
        .spawn(move || {
            let mut core = MatchingCore::new(&master.listings(), limits);
            let mut seq = 0u64;
            let mut handle = |request: &InboundOrder| {
                process(&master, &mut core, &mut seq, request, &mut reports);
            };
            while requests.wait_read_batch(ENGINE_BATCH_MAX, &mut handle).is_ok() {
                wake.notify_one();
            }
        })
        .expect("spawning the engine thread");
    Ok(EngineLink { ingress, egress, reports_ready, thread })
}

fn process(
    master: &MasterData,
    core: &mut MatchingCore,
    seq: &mut u64,
    request: &InboundOrder,
    reports: &mut Producer<CoreOutput>,
) {
    let mut send = |output: &CoreOutput| {
        if matches!(output.kind, OutputKind::Trade | OutputKind::TopOfBook) {
            return; // market data: no subscriber in `serve`
        }
        // Err only when the router is gone (shutdown); nothing is left to answer.
        let _ = reports.push_batch(std::slice::from_ref(output));
    };
    match check_against(master, request) {
        Ok(routed) => {
            *seq += 1;
            let input = SequencedInput {
                seq: *seq,
                instrument: routed.instrument,
                command: routed.command,
                stamps: request.stamps,
            };
            core.process(&input, &mut send);
        }
        Err(reason) => send(&CoreOutput {
            kind: OutputKind::Rejected,
            reason,
            side: exchange::msg::Side::from_code(request.side).unwrap_or_default(),
            instrument: request.instrument,
            client: request.client,
            order_id: request.order_id,
            price: request.price,
            stamps: request.stamps,
            ..CoreOutput::default()
        }),
    }
}
