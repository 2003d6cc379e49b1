//! A `TierReplica` fed the tier's input hands out the same responses, in the same order per
//! outlet, as an ordered tier (one pre-process worker, one core shard) does: what a
//! replicated engine's snapshots rely on; operator events in the order flow act at their
//! place.

use std::sync::{Arc, Mutex};

use exchange::durability::JournalMode;
use exchange::events::{ExternalEvent, OPERATOR_CLIENT};
use exchange::flow::{FlowConfig, FlowGenerator};
use exchange::msg::{
    CoreOutput, InboundOrder, OutputKind, Price, Reason, Response, Side, Stamps, request_kind,
};
use exchange::tier::{
    OrderSource, Subscriber, SubscriberFactory, Tier, TierConfig, TierReplica, TierStart,
};
use pipeline::stage::{Emitter, Flow};

const REQUESTS: usize = 20_000;

type PerOutlet = Arc<Mutex<Vec<Vec<Response>>>>;

/// A response without what only measures time.
fn timeless(response: &Response) -> Response {
    let output = CoreOutput { stamps: Stamps::default(), ..response.output };
    Response { output, ..*response }
}

struct Recorder(PerOutlet);

impl Subscriber for Recorder {
    fn deliver(&mut self, response: &Response) {
        self.0.lock().unwrap()[response.outlet as usize].push(timeless(response));
    }
}

fn requests(config: &TierConfig) -> Vec<InboundOrder> {
    let flow = FlowConfig { invalid_share: 0.2, ..FlowConfig::default() };
    let mut generator = FlowGenerator::new(config.universe, flow);
    (0..REQUESTS).map(|_| generator.next_request().0).collect()
}

fn source(requests: Vec<InboundOrder>) -> OrderSource {
    let mut next = 0;
    OrderSource::turns(move |out: &mut Emitter<InboundOrder>| {
        for request in requests.iter().skip(next).take(256) {
            out.emit(*request);
        }
        next += 256;
        if next >= requests.len() { Flow::Stop } else { Flow::Continue }
    })
}

/// What an ordered tier hands each outlet for `requests`.
fn tier_responses(config: &TierConfig, requests: &[InboundOrder]) -> Vec<Vec<Response>> {
    let outlets = config.outlets as usize;
    let delivered: PerOutlet = Arc::new(Mutex::new(vec![Vec::new(); outlets]));
    let shared = delivered.clone();
    let subscribers: SubscriberFactory = Arc::new(move |_sender| {
        let each = (0..outlets).map(|_| Box::new(Recorder(shared.clone())) as Box<dyn Subscriber>);
        each.collect()
    });
    let start = TierStart::new(config.clone(), 1_000.0, subscribers);
    let tier = Tier::start_with_source(start, source(requests.to_vec())).expect("the tier starts");
    tier.stop().expect("the tier drains");
    std::mem::take(&mut *delivered.lock().unwrap())
}

/// What a replica hands each outlet for `requests`.
fn replica_responses(config: &TierConfig, requests: &[InboundOrder]) -> Vec<Vec<Response>> {
    let limits = config.core_limits();
    let mut replica = TierReplica::new(config.starting_master_data(), limits, config.outlets);
    let mut replayed = vec![Vec::new(); config.outlets as usize];
    for request in requests {
        replica.apply(request, &mut |response| {
            replayed[response.outlet as usize].push(timeless(response));
        });
    }
    replayed
}

fn assert_same(delivered: &[Vec<Response>], replayed: &[Vec<Response>]) {
    for (outlet, (tier, replica)) in delivered.iter().zip(replayed).enumerate() {
        let first_difference = tier.iter().zip(replica).position(|(a, b)| a != b);
        assert_eq!(first_difference, None, "outlet {outlet}: the first response that differs");
        assert_eq!(tier.len(), replica.len(), "outlet {outlet}: as many responses");
    }
}

fn ordered() -> TierConfig {
    TierConfig { journal: JournalMode::OFF, ordered_outputs: true, ..TierConfig::parked() }
}

#[test]
fn the_replica_hands_each_outlet_what_the_tier_does() {
    let config = ordered();
    let mut requests = requests(&config);
    // Operator events among the orders: halts, resumes and bands take effect in the core at
    // their place in the flow, in the tier as in the replica.
    let instruments = config.universe.instruments;
    for (step, at) in (0..requests.len()).step_by(REQUESTS / 40).enumerate().rev() {
        let instrument = (step as u32 / 3) % instruments;
        let event = match step % 3 {
            0 => ExternalEvent::Halt(instrument),
            1 => ExternalEvent::Resume(instrument),
            _ => ExternalEvent::CircuitBreaker(instrument),
        };
        requests.insert(at, event.as_request().unwrap());
    }
    let delivered = tier_responses(&config, &requests);
    let total: usize = delivered.iter().map(Vec::len).sum();
    assert!(total > REQUESTS, "every request answered, fills and market data besides: {total}");
    let rejects = delivered.iter().flatten().filter(|r| r.output.seq == 0).count();
    assert!(rejects > REQUESTS / 10, "the pre-process refused some: {rejects}");
    let halted = delivered.iter().flatten().filter(|r| r.output.reason == Reason::InstrumentHalted);
    assert!(halted.count() > 0, "the operator's halts refused orders");
    assert_same(&delivered, &replica_responses(&config, &requests));
}

/// Operator requests in the order flow of an ordered tier: each event acts from its place on,
/// the core owning the halt and the band (a band wider than the reference one lets orders in);
/// only the operator's client id makes a request an event; a bad event is refused.
#[test]
fn operator_events_act_in_the_order_flow_at_their_place() {
    let config = ordered();
    let master = config.starting_master_data();
    let listed = master.instrument(1).expect("instrument 1 is listed");
    let tick = listed.listing.tick;
    let top = listed.listing.ladder_low + tick * Price::from(listed.listing.levels - 1);
    let mid = listed.band_low + (listed.band_high - listed.band_low) / 2 / tick * tick;
    assert!(listed.band_high + tick <= top, "the ladder reaches past the reference band");
    let buy = |order_id, price| InboundOrder {
        kind: request_kind::NEW,
        side: Side::Buy as u8,
        instrument: 1,
        client: 1,
        order_id,
        price,
        qty: listed.lot,
        ..InboundOrder::default()
    };
    let operator = |event: ExternalEvent| event.as_request().unwrap();
    let halt = operator(ExternalEvent::Halt(1));
    let script = [
        buy(1, mid),
        halt,
        buy(2, mid),
        InboundOrder { kind: request_kind::CANCEL, price: 0, qty: 0, ..buy(1, 0) },
        operator(ExternalEvent::Resume(1)),
        buy(3, mid),
        operator(ExternalEvent::Band { instrument: 1, low: listed.band_low, high: mid }),
        buy(4, mid + tick),
        operator(ExternalEvent::Band { instrument: 1, low: listed.listing.ladder_low, high: top }),
        buy(5, listed.band_high + tick),
        InboundOrder { client: 1, ..halt },
        buy(6, mid),
        operator(ExternalEvent::Halt(9_999)),
        operator(ExternalEvent::Band { instrument: 1, low: mid, high: mid - tick }),
    ];
    let delivered = tier_responses(&config, &script);
    assert_same(&delivered, &replica_responses(&config, &script));
    let answers: Vec<(u32, u64, OutputKind, Reason)> = delivered
        .iter()
        .flatten()
        .filter(|r| r.output.kind != OutputKind::TopOfBook && r.output.kind != OutputKind::Trade)
        .map(|r| (r.output.client, r.output.order_id, r.output.kind, r.output.reason))
        .collect();
    let answer = |client, order_id| {
        let found = answers.iter().find(|a| (a.0, a.1) == (client, order_id));
        found.map(|a| (a.2, a.3)).unwrap_or_else(|| panic!("no answer to {order_id}: {answers:?}"))
    };
    use OutputKind::{Accepted, Rejected};
    assert_eq!(answer(1, 1), (Accepted, Reason::None), "before the halt");
    assert_eq!(answer(1, 2), (Rejected, Reason::InstrumentHalted), "after the halt");
    let cancelled = (1, 1, OutputKind::Cancelled, Reason::CancelRequested);
    assert!(answers.contains(&cancelled), "cancels pass while halted: {answers:?}");
    assert_eq!(answer(1, 3), (Accepted, Reason::None), "after the resume");
    assert_eq!(answer(1, 4), (Rejected, Reason::PriceOutsideBand), "above the narrowed band");
    assert_eq!(answer(1, 5), (Accepted, Reason::None), "inside the widened band");
    assert_eq!(answer(1, 0), (Rejected, Reason::ZeroQuantity), "a client's 'halt' is an order");
    assert_eq!(answer(1, 6), (Accepted, Reason::None), "and halts nothing");
    let refused: Vec<Reason> =
        answers.iter().filter(|a| a.0 == OPERATOR_CLIENT).map(|a| a.3).collect();
    assert_eq!(refused, [Reason::UnknownInstrument, Reason::BadPrice], "bad events refused");
}
