//! Criterion view of `leantier bench ring`: the same harness, leantier against the fastest
//! peers, 8-byte messages at batch 1, 16 and 256, threads unpinned (criterion runs many short
//! samples; the CLI command pins and reports percentiles and ratios).
//! Run: `cargo bench -p experiments --bench ring`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use experiments::ringbench::harness::{CpuPair, throughput};
use experiments::ringbench::peers::{Disruptor, Leantier, Message8, Rtrb};

fn ring_throughput(c: &mut Criterion) {
    let cpus = CpuPair { producer: None, consumer: None };
    let mut group = c.benchmark_group("spsc_8B");
    group.measurement_time(Duration::from_secs(3)).sample_size(10);
    const MESSAGES: u64 = 1_000_000;
    group.throughput(Throughput::Elements(MESSAGES));
    for batch in [1, 16, 256] {
        let as_time = |rate_per_s: f64| Duration::from_secs_f64(MESSAGES as f64 / rate_per_s);
        let run = |measure: fn(u64, usize, CpuPair) -> anyhow::Result<f64>| {
            move |iterations: u64| {
                (0..iterations).map(|_| as_time(measure(MESSAGES, batch, cpus).unwrap())).sum()
            }
        };
        group.bench_function(BenchmarkId::new("leantier", batch), |b| {
            b.iter_custom(run(throughput::<Leantier, Message8>))
        });
        group.bench_function(BenchmarkId::new("rtrb", batch), |b| {
            b.iter_custom(run(throughput::<Rtrb, Message8>))
        });
        group.bench_function(BenchmarkId::new("disruptor", batch), |b| {
            b.iter_custom(run(throughput::<Disruptor, Message8>))
        });
    }
    group.finish();
}

criterion_group!(benches, ring_throughput);
criterion_main!(benches);
