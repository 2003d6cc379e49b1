//! Every invalid request of the load mix is rejected by the pre-process with the reason the
//! generator intended, and every request the pre-process passes is valid for the core.

use exchange::core::{CoreLimits, MatchingCore};
use exchange::flow::{FlowConfig, FlowGenerator, UniverseConfig, reference_master_data};
use exchange::master::SnapshotCell;
use exchange::msg::{REASON_COUNT, Reason, SequencedInput};
use exchange::preprocess::{Preprocessor, StateChecks};

#[test]
fn invalid_requests_get_their_reason_and_never_reach_the_core() {
    let universe = UniverseConfig { instruments: 16, clients: 32 };
    let master = reference_master_data(&universe);
    let listings = master.listings();
    let cell = SnapshotCell::new(master);
    let mut preprocess = Preprocessor::new(cell.reader().unwrap(), StateChecks::Preprocess);
    let mut core = MatchingCore::new(&listings, CoreLimits::default());
    let flow = FlowConfig { invalid_share: 0.2, ..FlowConfig::default() };
    let mut generator = FlowGenerator::new(universe, flow);
    let mut expected = [0u64; REASON_COUNT];
    let mut seq = 0;
    for _ in 0..50_000 {
        let (request, invalid) = generator.next_request();
        match (preprocess.check(&request), invalid) {
            (Err(reason), Some(want)) => {
                assert_eq!(reason, want, "{request:?}");
                expected[want as usize] += 1;
            }
            (Ok(routed), None) => {
                seq += 1;
                let input = SequencedInput {
                    seq,
                    instrument: routed.instrument,
                    command: routed.command,
                    ..Default::default()
                };
                core.process(&input, &mut |_| {});
            }
            (verdict, want) => panic!("{request:?}: got {verdict:?}, generator meant {want:?}"),
        }
    }
    assert_eq!(preprocess.counters().rejected, expected, "rejects counted per reason");
    let kinds = expected.iter().filter(|&&n| n > 0).count();
    assert_eq!(kinds, 8, "all eight kinds of invalid request occur");
    assert!(expected[Reason::ClientLimitExceeded as usize] > 0);
    assert_eq!(core.counters().invalid_inputs, 0, "nothing invalid reached the core");
    assert!(core.counters().trades > 1_000, "the flow trades: {:?}", core.counters());
}
