//! A `TierReplica` fed the tier's input hands out the same responses, in the same order per
//! gateway, as an ordered tier (one pre-process worker, one core shard) does: what a
//! replicated engine's snapshots rely on.

use std::sync::{Arc, Mutex};

use exchange::core::CoreLimits;
use exchange::durability::JournalMode;
use exchange::flow::{FlowConfig, FlowGenerator};
use exchange::msg::{CoreOutput, InboundOrder, Response, Stamps};
use exchange::tier::{
    OrderSource, RunOptions, Subscriber, SubscriberFactory, Tier, TierConfig, TierReplica,
};
use pipeline::stage::{Emitter, Flow};

const REQUESTS: usize = 20_000;

type PerGateway = Arc<Mutex<Vec<Vec<Response>>>>;

/// A response without what only measures time.
fn timeless(response: &Response) -> Response {
    let output = CoreOutput { stamps: Stamps::default(), ..response.output };
    Response { output, ..*response }
}

struct Recorder(PerGateway);

impl Subscriber for Recorder {
    fn deliver(&mut self, response: &Response) {
        self.0.lock().unwrap()[response.gateway as usize].push(timeless(response));
    }
}

fn requests(config: &TierConfig) -> Vec<InboundOrder> {
    let flow = FlowConfig { invalid_share: 0.2, ..FlowConfig::default() };
    let mut generator = FlowGenerator::new(config.universe, flow);
    (0..REQUESTS).map(|_| generator.next_request().0).collect()
}

fn source(requests: Vec<InboundOrder>) -> OrderSource {
    let mut next = 0;
    Box::new(move |out: &mut Emitter<InboundOrder>| {
        for request in requests.iter().skip(next).take(256) {
            out.emit(*request);
        }
        next += 256;
        if next >= requests.len() { Flow::Stop } else { Flow::Continue }
    })
}

#[test]
fn the_replica_hands_each_gateway_what_the_tier_does() {
    let config =
        TierConfig { journal: JournalMode::OFF, ordered_outputs: true, ..TierConfig::parked() };
    let requests = requests(&config);
    let gateways = config.gateways as usize;
    let delivered: PerGateway = Arc::new(Mutex::new(vec![Vec::new(); gateways]));
    let shared = delivered.clone();
    let subscribers: SubscriberFactory = Arc::new(move |_sender| {
        let each = (0..gateways).map(|_| Box::new(Recorder(shared.clone())) as Box<dyn Subscriber>);
        each.collect()
    });
    let options = RunOptions::planned_for(1_000.0);
    let (tier, control) =
        Tier::start_with_source(&config, &options, subscribers, source(requests.clone()))
            .expect("the tier starts");
    drop(control);
    tier.stop().expect("the tier drains");

    let limits = CoreLimits { order_pool_slots: config.order_pool_slots };
    let mut replica = TierReplica::new(config.starting_master_data(), limits, config.gateways);
    let mut replayed = vec![Vec::new(); gateways];
    for request in &requests {
        replica.apply(request, &mut |response| {
            replayed[response.gateway as usize].push(timeless(response));
        });
    }
    let delivered = std::mem::take(&mut *delivered.lock().unwrap());
    let total: usize = delivered.iter().map(Vec::len).sum();
    assert!(total > REQUESTS, "every request answered, fills and market data besides: {total}");
    let rejects = delivered.iter().flatten().filter(|r| r.output.seq == 0).count();
    assert!(rejects > REQUESTS / 10, "the pre-process refused some: {rejects}");
    for (gateway, (tier, replica)) in delivered.iter().zip(&replayed).enumerate() {
        let first_difference = tier.iter().zip(replica).position(|(a, b)| a != b);
        assert_eq!(first_difference, None, "gateway {gateway}: the first response that differs");
        assert_eq!(tier.len(), replica.len(), "gateway {gateway}: as many responses");
    }
}
