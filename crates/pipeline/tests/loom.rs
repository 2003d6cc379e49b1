//! Model checks of the ring's memory orderings, the parker's wake-up protocol and resizing.
//! Run with: `RUSTFLAGS="--cfg loom" cargo test -p leantier-pipeline --release --test loom`
//! (scripts/test does). Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use pipeline::active::ActiveWorkers;
use pipeline::{ConnectorKind, RingConfig, WaitStrategy, connector};

/// Bounded model checking: every interleaving with at most `PREEMPTION_BOUND` preemptions.
/// Loom's authors report that almost all concurrency bugs need no more than two or three;
/// unbounded exploration of these spin-then-park loops does not finish.
const PREEMPTION_BOUND: usize = 4;

fn model(test: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(PREEMPTION_BOUND);
    builder.check(test);
}

fn config(capacity_slots: usize, batch_slots_max: usize) -> RingConfig {
    RingConfig { capacity_slots, batch_slots_max, wait: WaitStrategy::Park }
}

/// Sends 1, 2, 3 through a two-slot connector of `kind` (so the ring wraps and the producer
/// must wait for room) and checks they arrive in order; a lost wake-up on either side shows
/// up as a loom deadlock, a missing Release/Acquire pair as a causality violation.
fn transfers_in_order_without_lost_wakeups(kind: ConnectorKind) {
    model(move || {
        let (mut tx, mut rx) = connector::<u64>(kind, &config(2, 2)).unwrap();
        let producer = thread::spawn(move || {
            for value in 1..=3 {
                tx.push(value).unwrap();
            }
        });
        let mut seen = Vec::new();
        while let Ok(value) = rx.pop() {
            seen.push(value);
        }
        producer.join().unwrap();
        assert_eq!(seen, [1, 2, 3]);
    });
}

#[test]
fn lock_free_ring_transfers_in_order_and_never_loses_a_wakeup() {
    transfers_in_order_without_lost_wakeups(ConnectorKind::LockFree);
}

#[test]
fn blocking_baseline_transfers_in_order() {
    transfers_in_order_without_lost_wakeups(ConnectorKind::Blocking);
}

/// A batch is published whole: the consumer, reading up to two at a time, observes either
/// nothing or the whole batch [10, 11], never 10 alone; and a full ring makes the producer park
/// until the consumer releases slots. (Publishing the batch's slots one at a time fails the
/// first assertion.)
#[test]
fn batches_are_published_whole_and_full_producer_is_woken() {
    model(|| {
        let (mut tx, mut rx) = connector::<u64>(ConnectorKind::LockFree, &config(2, 2)).unwrap();
        let producer = thread::spawn(move || {
            tx.push_batch(&[10, 11]).unwrap();
            tx.push(12).unwrap();
        });
        let mut reads: Vec<Vec<u64>> = Vec::new();
        loop {
            let mut read = Vec::new();
            if rx.wait_read_batch(2, |value| read.push(*value)).is_err() {
                break;
            }
            reads.push(read);
        }
        producer.join().unwrap();
        assert_eq!(reads[0], [10, 11], "the batch is observed whole or not at all: {reads:?}");
        assert_eq!(reads.concat(), [10, 11, 12]);
    });
}

/// A consumer that finds two or more headers ready over 4 slots (two batches of two) jumps
/// to the producer's catch-up index (every 2 slots under loom) and reads the slots below it,
/// which only that index's Release/Acquire pair orders after their writes (weakening either
/// side to Relaxed fails here as a causality violation).
#[test]
fn a_consumer_catching_up_reads_only_written_slots() {
    model(|| {
        let (mut tx, mut rx) = connector::<u64>(ConnectorKind::LockFree, &config(8, 8)).unwrap();
        let producer = thread::spawn(move || {
            for pair in [[1, 2], [3, 4], [5, 6]] {
                tx.push_batch(&pair).unwrap();
            }
        });
        let mut seen = Vec::new();
        while rx.wait_read_batch(8, |value| seen.push(*value)).is_ok() {}
        producer.join().unwrap();
        assert_eq!(seen, [1, 2, 3, 4, 5, 6]);
    });
}

/// A consumer behind a stream of single messages checks their headers two at a time under
/// loom (a line at a time otherwise) once it has followed two of them; the slots it then
/// reads are ordered after their writes only by those headers' Release/Acquire pairs
/// (weakening the span check's load to Relaxed fails here as a causality violation).
#[test]
fn a_consumer_behind_single_messages_reads_only_written_slots() {
    model(|| {
        let (mut tx, mut rx) = connector::<u64>(ConnectorKind::LockFree, &config(8, 8)).unwrap();
        let producer = thread::spawn(move || {
            for value in 1..=4 {
                tx.push(value).unwrap();
            }
        });
        let mut seen = Vec::new();
        while rx.wait_read_batch(8, |value| seen.push(*value)).is_ok() {}
        producer.join().unwrap();
        assert_eq!(seen, [1, 2, 3, 4]);
    });
}

/// A producer blocked on a full ring learns that the consumer is gone instead of hanging.
#[test]
fn dropped_consumer_releases_a_blocked_producer() {
    model(|| {
        let (mut tx, rx) = connector::<u64>(ConnectorKind::LockFree, &config(1, 1)).unwrap();
        let producer = thread::spawn(move || {
            // The first push succeeds unless the consumer is already gone; the second finds the
            // one-slot ring full (or the consumer gone) and must return, never hang.
            let _ = tx.push(1);
            assert!(tx.push(2).is_err());
        });
        drop(rx);
        producer.join().unwrap();
    });
}

/// Resizing while a producer routes: the producer round-robins two messages over the active
/// prefix of two consumer rings while a controller shrinks 2 → 1 (`grow == false`) or grows
/// 1 → 2. Whatever count each routing decision sees, every message arrives exactly once and
/// in order per ring; the consumer parked on an empty ring is woken by the first message routed
/// to it (activation needs no wake-up of its own), else loom reports a deadlock. (One consumer
/// thread drains both rings in turn: each holds every message, so the producer never waits;
/// a fourth thread made the model too large to finish.)
fn resize_while_routing_loses_nothing(grow: bool) {
    model(move || {
        let (initial, target) = if grow { (1, 2) } else { (2, 1) };
        let active = Arc::new(ActiveWorkers::new(initial, 2));
        let (mut tx0, mut rx0) = connector::<u64>(ConnectorKind::LockFree, &config(2, 2)).unwrap();
        let (mut tx1, mut rx1) = connector::<u64>(ConnectorKind::LockFree, &config(2, 2)).unwrap();
        let routing = active.clone();
        let producer = thread::spawn(move || {
            let mut next = 0;
            for value in 1..=2 {
                match routing.next_round_robin(&mut next) {
                    0 => tx0.push(value).unwrap(),
                    _ => tx1.push(value).unwrap(),
                }
            }
        });
        let controller = thread::spawn(move || active.set(target).unwrap());
        let mut seen = Vec::new();
        for rx in [&mut rx0, &mut rx1] {
            let mut seen_here = Vec::new();
            while let Ok(value) = rx.pop() {
                seen_here.push(value);
            }
            assert!(seen_here.is_sorted(), "{seen_here:?}");
            seen.extend(seen_here);
        }
        producer.join().unwrap();
        controller.join().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, [1, 2], "every message exactly once");
    });
}

#[test]
fn shrinking_while_routing_loses_nothing() {
    resize_while_routing_loses_nothing(false);
}

#[test]
fn growing_while_routing_loses_nothing() {
    resize_while_routing_loses_nothing(true);
}

/// The spill queue keeps order across its ring and its overflow while the consumer reads
/// concurrently: a one-slot ring makes the producer spill, and the consumer reads 1..=4 in
/// order. Reading the overflow before the ring, or the producer writing to the ring while the
/// overflow holds items (ignoring `spilled`), fails it.
#[test]
fn a_spill_queue_keeps_order_across_ring_and_overflow() {
    model(|| {
        let (mut tx, mut rx) = pipeline::spill::queue::<u64>(1).unwrap();
        let producer = thread::spawn(move || {
            for value in 1..=4 {
                tx.send(value);
            }
        });
        let mut seen = Vec::new();
        while seen.len() < 4 {
            if rx.read(2, |value| seen.push(*value)) == 0 {
                thread::yield_now();
            }
        }
        producer.join().unwrap();
        assert_eq!(seen, [1, 2, 3, 4]);
    });
}
