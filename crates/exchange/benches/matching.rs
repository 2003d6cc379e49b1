//! Matching core alone, single thread: orders per second over the reference flow (new limit
//! orders around a moving mid with 20% crossing, 5% immediate, 25% cancels, 10% replaces),
//! pre-validated so only the core is timed. Target: >= 5M orders/s (exchange-core, a Java
//! engine, reports about 5M operations/s per order book). Also the output hash alone (what
//! a shard adds to every output it produces), per output.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use exchange::core::{CoreLimits, MatchingCore};
use exchange::flow::{FlowConfig, FlowGenerator, UniverseConfig, reference_master_data};
use exchange::msg::{CoreOutput, OutputHash, SequencedInput};
use exchange::preprocess::check_against;

/// Inputs per measured iteration.
const INPUTS_PER_ITERATION: usize = 200_000;
const TARGET_ORDERS_PER_S: f64 = 5.0e6;

fn sequenced_flow(instruments: u32) -> (Vec<SequencedInput>, Vec<exchange::book::Listing>) {
    let universe = UniverseConfig { instruments, clients: 256 };
    let master = reference_master_data(&universe);
    let flow = FlowConfig { invalid_share: 0.0, ..FlowConfig::default() };
    let mut generator = FlowGenerator::new(universe, flow);
    let inputs = (1..=INPUTS_PER_ITERATION as u64)
        .map(|seq| {
            let (request, _) = generator.next_request();
            let routed = check_against(&master, &request).expect("valid flow");
            SequencedInput {
                seq,
                instrument: routed.instrument,
                command: routed.command,
                ..Default::default()
            }
        })
        .collect();
    (inputs, master.listings())
}

fn matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("matching_core");
    group.throughput(Throughput::Elements(INPUTS_PER_ITERATION as u64));
    group.sample_size(10);
    for instruments in [1u32, 64] {
        let (inputs, listings) = sequenced_flow(instruments);
        let mut best_ns = f64::MAX;
        group.bench_function(format!("reference_flow/{instruments}_instruments"), |b| {
            b.iter_batched_ref(
                || MatchingCore::new(&listings, CoreLimits::default()),
                |core| {
                    let start = std::time::Instant::now();
                    let mut outputs = 0u64;
                    for input in &inputs {
                        core.process(input, &mut |_| outputs += 1);
                    }
                    best_ns = best_ns.min(start.elapsed().as_nanos() as f64);
                    outputs
                },
                BatchSize::PerIteration,
            )
        });
        let orders_per_s = INPUTS_PER_ITERATION as f64 / (best_ns / 1e9);
        println!(
            "matching_core/{instruments}_instruments: best {:.2}M orders/s, ratio to the 5M/s target {:.2}",
            orders_per_s / 1e6,
            orders_per_s / TARGET_ORDERS_PER_S
        );
    }
    group.finish();
}

/// Outputs hashed per pass, few enough to stay in cache as a shard's latest output does.
const HASHED_OUTPUTS_PER_PASS: usize = 4096;
const HASH_PASSES_PER_ITERATION: usize = 64;

fn output_hash(c: &mut Criterion) {
    let (inputs, listings) = sequenced_flow(64);
    let mut core = MatchingCore::new(&listings, CoreLimits::default());
    let mut outputs: Vec<CoreOutput> = Vec::new();
    for input in &inputs {
        core.process(input, &mut |output| outputs.push(*output));
    }
    outputs.truncate(HASHED_OUTPUTS_PER_PASS);
    let mut group = c.benchmark_group("output_hash");
    group.throughput(Throughput::Elements((outputs.len() * HASH_PASSES_PER_ITERATION) as u64));
    group.sample_size(10);
    group.bench_function("reference_flow_outputs", |b| {
        b.iter(|| {
            let mut hash = OutputHash::default();
            for _ in 0..HASH_PASSES_PER_ITERATION {
                for output in &outputs {
                    hash.update(output);
                }
            }
            hash.digest()
        })
    });
    group.finish();
}

criterion_group!(benches, matching, output_hash);
criterion_main!(benches);
