//! Instructions per message on each side of leantier's ring, rtrb and disruptor, counted by
//! valgrind (this VM's perf has no hardware counters): one thread sends the same `batch`
//! messages `sends_per_read` times, then reads them all back (at most 256 per call), so no
//! cache line crosses cores and only the code is measured. `send_batches` and `read_all` are
//! never inlined, so callgrind reports each side's instructions as their inclusive cost:
//!
//! ```sh
//! cargo build --release -p experiments --example instructions
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/ring.cg \
//!     target/release/examples/instructions 1 1 100000
//! callgrind_annotate --inclusive=yes /tmp/ring.cg | grep -E 'send_batches|read_all'
//! ```
//!
//! Arguments: `batch sends_per_read messages [leantier|rtrb|disruptor]`. Divide each function's count by `messages`
//! (printed); each count includes one call and return per `send_batches`/`read_all` call,
//! the same for every queue. docs/benchmarks/ring.md has the figures.

use experiments::ringbench::peers::{Disruptor, Leantier, Message8, Payload, Peer, Rtrb};

/// Sends `buffer` `sends` times.
#[inline(never)]
fn send_batches<P: Peer<Message8>>(tx: &mut P::Tx, buffer: &[Message8], sends: usize) {
    for _ in 0..sends {
        P::send(tx, buffer);
    }
}

/// Reads until `expected` messages arrived; returns the sum of their sequence numbers.
#[inline(never)]
fn read_all<P: Peer<Message8>>(rx: &mut P::Rx, expected: usize) -> u64 {
    let (mut sum, mut read) = (0, 0);
    while read < expected {
        read += P::receive(rx, 256, |message| sum += message.seq());
    }
    sum
}

fn transfer<P: Peer<Message8>>(batch: usize, sends_per_read: usize, messages: u64) {
    let (mut tx, mut rx) = P::build(4096, 256);
    let buffer: Vec<Message8> = (0..batch as u64).map(Message8::with_seq).collect();
    let per_round = batch * sends_per_read;
    let expected_sum = sends_per_read as u64 * buffer.iter().map(Payload::seq).sum::<u64>();
    let mut sent = 0;
    while sent < messages {
        send_batches::<P>(&mut tx, &buffer, sends_per_read);
        assert_eq!(read_all::<P>(&mut rx, per_round), expected_sum, "{}: every message", P::NAME);
        sent += per_round as u64;
    }
    println!("{}: {sent} messages", P::NAME);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut number = |name: &str, default: u64| {
        args.next().map_or(default, |a| a.parse().unwrap_or_else(|_| panic!("{name}: {a}")))
    };
    let batch = number("batch", 1) as usize;
    let sends_per_read = number("sends_per_read", 1) as usize;
    let messages = number("messages", 100_000);
    assert!((1..=256).contains(&(batch * sends_per_read)), "batch × sends_per_read ≤ 256");
    match std::env::args().nth(4).as_deref() {
        Some("rtrb") => transfer::<Rtrb>(batch, sends_per_read, messages),
        Some("disruptor") => transfer::<Disruptor>(batch, sends_per_read, messages),
        _ => transfer::<Leantier>(batch, sends_per_read, messages),
    }
}
