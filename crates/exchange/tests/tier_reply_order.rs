//! A client's answers follow its requests' order, the pre-process's rejects included: a refused
//! request travels through its core shard like an accepted one, so its reject never overtakes
//! the answer to an earlier order. (A replicated engine needs this: every replica must number
//! the same outputs in the same order, docs/REPLICATION.md.)

use std::sync::{Arc, Mutex};

use exchange::durability::JournalMode;
use exchange::flow::reference_master_data;
use exchange::msg::{InboundOrder, OutputKind, Response, Side, request_kind};
use exchange::tier::{OrderSource, Subscriber, SubscriberFactory, Tier, TierConfig, TierStart};
use pipeline::stage::{Emitter, Flow};

const ORDERS: u64 = 4_000;
/// Every this many orders one is refused by the pre-process (quantity 0: hygiene).
const REFUSED_EVERY: u64 = 7;
const CLIENT: u32 = 1;

/// Records the order id of every answer to `CLIENT`'s requests, in delivery order.
struct Answers(Arc<Mutex<Vec<(u64, OutputKind)>>>);

impl Subscriber for Answers {
    fn deliver(&mut self, response: &Response) {
        let output = response.output;
        if response.answers_request && output.client == CLIENT {
            self.0.lock().unwrap().push((output.order_id, output.kind));
        }
    }
}

/// `ORDERS` resting buys of one client, in one burst (one emit call), every
/// `REFUSED_EVERY`-th with quantity 0.
fn burst(price: i64) -> OrderSource {
    OrderSource::turns(move |out: &mut Emitter<InboundOrder>| {
        for order_id in 1..=ORDERS {
            let qty = if order_id.is_multiple_of(REFUSED_EVERY) { 0 } else { 1 };
            out.emit(InboundOrder {
                kind: request_kind::NEW,
                side: Side::Buy as u8,
                instrument: 1,
                client: CLIENT,
                order_id,
                price,
                qty,
                ..InboundOrder::default()
            });
        }
        Flow::Stop
    })
}

#[test]
fn a_clients_answers_rejects_included_follow_its_requests_order() {
    let config = TierConfig { journal: JournalMode::OFF, ..TierConfig::parked() };
    let master = reference_master_data(&config.universe);
    let listed = master.instrument(1).expect("instrument 1 is listed");
    let price = listed.band_low;
    let answers = Arc::new(Mutex::new(Vec::new()));
    let shared = answers.clone();
    let outlets = config.outlets;
    let subscribers: SubscriberFactory = Arc::new(move |_sender| {
        let each = (0..outlets).map(|_| Box::new(Answers(shared.clone())) as Box<dyn Subscriber>);
        each.collect()
    });
    let start = TierStart::new(config, 1_000.0, subscribers);
    let tier = Tier::start_with_source(start, burst(price)).expect("the tier starts");
    tier.stop().expect("the tier drains");
    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let order_ids: Vec<u64> = answers.iter().map(|(id, _)| *id).collect();
    let expected: Vec<u64> = (1..=ORDERS).collect();
    let first_out_of_order = order_ids.iter().zip(&expected).position(|(got, want)| got != want);
    assert_eq!(first_out_of_order, None, "answers out of request order: {answers:?}");
    assert_eq!(order_ids.len(), expected.len(), "one answer per request");
    let rejected = answers.iter().filter(|(_, kind)| *kind == OutputKind::Rejected).count();
    assert_eq!(rejected as u64, ORDERS / REFUSED_EVERY, "the quantity-0 orders are refused");
}
