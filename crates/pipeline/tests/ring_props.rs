//! Property tests: for random capacities, batch sizes and read sizes, every message sent
//! through either connector kind arrives exactly once and in order. Rings up to 512 slots and
//! reads up to 299 messages, so that a consumer falls far enough behind to jump to the
//! producer's catch-up index.

use pipeline::{ConnectorKind, RingConfig, WaitStrategy, connector};
use proptest::prelude::*;

fn transfer(
    kind: ConnectorKind,
    capacity_log2: u32,
    write_batches: Vec<usize>,
    read_max: usize,
    in_place: bool,
) -> Vec<u64> {
    let capacity_slots = 1usize << capacity_log2;
    let ring = RingConfig {
        capacity_slots,
        batch_slots_max: capacity_slots,
        wait: WaitStrategy::default(),
    };
    let (mut tx, mut rx) = connector::<u64>(kind, &ring).unwrap();
    let writer = std::thread::spawn(move || {
        let mut next = 0u64;
        for batch in write_batches {
            let n = batch.min(capacity_slots);
            if in_place {
                while tx.try_write_batch(n, |i, slot| *slot = next + i as u64).is_err() {
                    std::thread::yield_now();
                }
            } else {
                let items: Vec<u64> = (next..next + n as u64).collect();
                tx.push_batch(&items).unwrap();
            }
            next += n as u64;
        }
        next
    });
    let mut received = Vec::new();
    while rx.wait_read_batch(read_max, |value| received.push(*value)).is_ok() {}
    let sent = writer.join().unwrap();
    assert_eq!(received.len() as u64, sent);
    received
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn nothing_lost_duplicated_or_reordered(
        capacity_log2 in 0u32..10,
        write_batches in prop::collection::vec(1usize..40, 1..60),
        read_max in 1usize..300,
        in_place in any::<bool>(),
        blocking in any::<bool>(),
    ) {
        let kind = if blocking { ConnectorKind::Blocking } else { ConnectorKind::LockFree };
        let received = transfer(kind, capacity_log2, write_batches, read_max, in_place);
        for (index, value) in received.iter().enumerate() {
            prop_assert_eq!(*value, index as u64);
        }
    }
}
