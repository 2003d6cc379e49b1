//! leantier's ring against rtrb and disruptor, cell by cell, interleaved within each round so
//! that the host's state (which vCPUs share a core) is the same for all three: the quick A/B
//! companion of `leantier bench ring` when trying a change to the ring (median of 5 trials
//! per cell, the three queues' trials interleaved, as the bench does).
//!
//! `cargo run --release -p experiments --example cells -- [messages] [rounds] [batches] [round_trips]`
//! (batches comma separated, e.g. `1,16`; round_trips 0 skips the hop). Each round opens with
//! the cache-sharing probe: the host may move the two vCPUs between rounds.

use experiments::ringbench::harness::{CpuPair, ping_pong, probe_cache_sharing, throughput};
use experiments::ringbench::peers::{
    Disruptor, Leantier, Message8, Message64, Payload, Peer, Rtrb,
};
use stats::median;

/// One trial, in millions of messages per second.
fn mmsg<P: Peer<M>, M: Payload>(messages: u64, batch: usize, cpus: CpuPair) -> f64 {
    throughput::<P, M>(messages, batch, cpus).expect("throughput trial") / 1e6
}

const TRIALS: usize = 5;

/// [`TRIALS`] trials of each queue, interleaved (leantier, rtrb, disruptor, then again) so
/// that a change in the host's load or placement hits all three alike; prints the medians.
fn cell<M: Payload>(label: &str, messages: u64, batch: usize, cpus: CpuPair) {
    let mut trials: [Vec<f64>; 3] = Default::default();
    for _ in 0..TRIALS {
        trials[0].push(mmsg::<Leantier, M>(messages, batch, cpus));
        trials[1].push(mmsg::<Rtrb, M>(messages, batch, cpus));
        trials[2].push(mmsg::<Disruptor, M>(messages, batch, cpus));
    }
    let [ours, rtrb, disruptor] = trials.map(median);
    let ratio = ours / rtrb.max(disruptor);
    println!("{label:>4} x {batch:<3}  {ours:7.1}  {rtrb:7.1}  {disruptor:9.1}  {ratio:5.2}");
}

fn hop<P: Peer<Message8>>(round_trips: u64, cpus: CpuPair) -> u64 {
    ping_pong::<P, Message8>(round_trips, cpus).expect("ping-pong").value_at_percentile_ns(50.0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let messages = args.next().map_or(1_000_000, |a| a.parse().expect("messages"));
    let rounds: u32 = args.next().map_or(3, |a| a.parse().expect("rounds"));
    let batches: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,16".into())
        .split(',')
        .map(|b| b.parse().expect("batch"))
        .collect();
    let round_trips = args.next().map_or(100_000, |a| a.parse().expect("round trips"));
    let cpus = CpuPair::choose(true);
    println!("cell      leantier     rtrb  disruptor  ratio  (Mmsg/s; hop p50 ns)");
    for _ in 0..rounds {
        let sharing = probe_cache_sharing(cpus).expect("sharing probe");
        println!("line transfer {} ns: {}", sharing.line_transfer_ns, sharing.label());
        for &batch in &batches {
            cell::<Message8>("8B", messages, batch, cpus);
            cell::<Message64>("64B", messages, batch, cpus);
        }
        if round_trips > 0 {
            let (ours, rtrb) = (hop::<Leantier>(round_trips, cpus), hop::<Rtrb>(round_trips, cpus));
            let disruptor = hop::<Disruptor>(round_trips, cpus);
            let ratio = ours as f64 / rtrb.min(disruptor) as f64;
            println!("hop        {ours:7}  {rtrb:7}  {disruptor:9}  {ratio:5.2}");
        }
    }
}
