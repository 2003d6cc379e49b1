//! How many messages each consumer read returns, leantier against disruptor, in the 1→1
//! throughput setting of `leantier bench ring` (same capacity, same batch, consumer polled with
//! a spin, reading up to `BATCH_SLOTS_MAX`). The histogram tells which side is the bottleneck:
//! reads of about one producer batch mean the consumer keeps up and pays a `tail` transfer per
//! batch; reads of `BATCH_SLOTS_MAX` mean the ring runs full and the transfers are amortised
//! (docs/benchmarks/ring.md, "Why the 8 B batch-16 cell was at 0.5×").
//!
//! `cargo run --release -p experiments --example read_sizes -- [messages] [batch] [trials]`

use std::time::Instant;

use experiments::ringbench::harness::{BATCH_SLOTS_MAX, CAPACITY_SLOTS, CpuPair};
use experiments::ringbench::peers::{Disruptor, Leantier, Message8, Payload, Peer};
use pipeline::placement::pin_current_thread;

/// Buckets by bit length: bucket `b` counts reads of `2^(b-1) ..= 2^b - 1` messages.
const BUCKETS: usize = usize::BITS as usize - BATCH_SLOTS_MAX.leading_zeros() as usize + 1;

fn pin(cpu: Option<pipeline::placement::CpuId>) {
    if let Some(cpu) = cpu {
        pin_current_thread(&[cpu]).expect("pin benchmark thread");
    }
}

/// One trial: messages per second, empty polls per message, and the read-size histogram.
fn trial<P: Peer<Message8>>(messages: u64, batch: usize, cpus: CpuPair) -> (f64, f64, Vec<u64>) {
    let (mut tx, mut rx) = P::build(CAPACITY_SLOTS, BATCH_SLOTS_MAX);
    let producer = std::thread::spawn(move || {
        pin(cpus.producer);
        let mut buffer = vec![Message8::default(); batch];
        let mut next = 0;
        while next < messages {
            for (offset, slot) in buffer.iter_mut().enumerate() {
                *slot = Message8::with_seq(next + offset as u64);
            }
            P::send(&mut tx, &buffer);
            next += batch as u64;
        }
    });
    let consumer = std::thread::spawn(move || {
        pin(cpus.consumer);
        let (mut histogram, mut empty_polls, mut received) = (vec![0u64; BUCKETS], 0u64, 0u64);
        let mut in_order = true;
        let started = Instant::now();
        while received < messages {
            // The same per-message work as the harness's consumer.
            let n = P::receive(&mut rx, BATCH_SLOTS_MAX, |message| {
                in_order &= message.seq() == received;
                received += 1;
            });
            if n == 0 {
                empty_polls += 1;
                std::hint::spin_loop();
            } else {
                histogram[(usize::BITS - n.leading_zeros()) as usize] += 1;
            }
        }
        let rate = messages as f64 / started.elapsed().as_secs_f64();
        assert!(in_order, "{}: messages arrived out of order", P::NAME);
        (rate, empty_polls as f64 / messages as f64, histogram)
    });
    producer.join().expect("producer");
    consumer.join().expect("consumer")
}

fn report<P: Peer<Message8>>(messages: u64, batch: usize, cpus: CpuPair) {
    let (rate, empty_polls_per_message, histogram) = trial::<P>(messages, batch, cpus);
    let buckets: Vec<String> = (1..BUCKETS)
        .map(|b| format!("{}-{}:{}", 1u64 << (b - 1), (1u64 << b) - 1, histogram[b]))
        .collect();
    println!(
        "{:<14} {:>7.1} Mmsg/s  empty polls/msg {:.3}  reads by size {}",
        P::NAME,
        rate / 1e6,
        empty_polls_per_message,
        buckets.join(" ")
    );
}

fn main() {
    let arg = |index: usize, default: u64| {
        std::env::args().nth(index).map_or(default, |text| text.parse().expect("a number"))
    };
    let (messages, batch, trials) = (arg(1, 10_000_000), arg(2, 16) as usize, arg(3, 3));
    assert!((1..=BATCH_SLOTS_MAX).contains(&batch), "batch must be 1..={BATCH_SLOTS_MAX}");
    let messages = messages - messages % batch as u64;
    let cpus = CpuPair::choose(true);
    for _ in 0..trials {
        report::<Leantier>(messages, batch, cpus);
        report::<Disruptor>(messages, batch, cpus);
    }
}
