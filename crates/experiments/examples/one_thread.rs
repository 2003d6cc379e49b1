//! The ring's instruction cost alone: one thread sends one message and reads it back, again
//! and again, so no cache line crosses between cores. leantier against rtrb and disruptor,
//! nanoseconds per send + receive, five rounds (docs/benchmarks/ring.md, "The hop").
//!
//! `cargo run --release -p experiments --example one_thread -- [messages]`

use std::time::Instant;

use experiments::ringbench::peers::{Disruptor, Leantier, Message8, Payload, Peer, Rtrb};

fn ns_per_message<P: Peer<Message8>>(messages: u64) -> f64 {
    let (mut tx, mut rx) = P::build(4096, 256);
    let mut read = 0;
    let start = Instant::now();
    for seq in 0..messages {
        P::send(&mut tx, &[Message8::with_seq(seq)]);
        read += P::receive(&mut rx, 1, |m| assert_eq!(m.seq(), seq));
    }
    let elapsed = start.elapsed();
    assert_eq!(read as u64, messages, "{}: every message read back", P::NAME);
    elapsed.as_nanos() as f64 / messages as f64
}

fn main() {
    let messages = std::env::args().nth(1).map_or(10_000_000, |a| a.parse().expect("messages"));
    for _ in 0..5 {
        let ours = ns_per_message::<Leantier>(messages);
        let rtrb = ns_per_message::<Rtrb>(messages);
        let disruptor = ns_per_message::<Disruptor>(messages);
        println!("leantier {ours:.1} ns  rtrb {rtrb:.1} ns  disruptor {disruptor:.1} ns");
    }
}
