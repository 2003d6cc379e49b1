//! Criterion benchmarks: framing cost per record, and group-commit throughput of the real
//! writer on real files (each sample writes `iters` records and waits until all are durable).
//! `leantier journal bench` is the full benchmark with the fdatasync baseline and latency.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use journal::frame::{self, FRAME_HEADER_BYTES};
use journal::{FixedRecord, JournalConfig, JournalWriter, Tail};

fn framing(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    for payload_bytes in [64usize, 256, 1024] {
        let mut buffer = vec![0x42u8; FRAME_HEADER_BYTES + payload_bytes];
        group.throughput(Throughput::Elements(1));
        group.bench_with_input(
            BenchmarkId::new("seal+decode", payload_bytes),
            &payload_bytes,
            |b, _| {
                let mut seq = 0u64;
                b.iter(|| {
                    seq += 1;
                    frame::seal(&mut buffer, seq);
                    matches!(frame::decode(&buffer), frame::Decoded::Valid { .. })
                });
            },
        );
    }
    group.finish();
}

fn group_commit<const N: usize>(iters: u64) -> Duration {
    // The target directory, not /tmp: /tmp may be a tmpfs, where fdatasync costs nothing.
    let dir =
        tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir on the target disk");
    let tail = Tail { dir: dir.path().to_path_buf(), next_seq: 1, open_segment: None };
    let (mut journal, writer) =
        JournalWriter::spawn::<FixedRecord<N>>(tail, &JournalConfig::default()).unwrap();
    let started = Instant::now();
    for seq in 1..=iters {
        journal.append(FixedRecord { seq, payload: [7; N] }).unwrap();
    }
    drop(journal);
    writer.join().unwrap();
    started.elapsed()
}

fn throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("group_commit");
    group.sample_size(10).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(1));
    group.bench_function("64B", |b| b.iter_custom(group_commit::<64>));
    group.bench_function("256B", |b| b.iter_custom(group_commit::<256>));
    group.bench_function("1024B", |b| b.iter_custom(group_commit::<1024>));
    group.finish();
}

criterion_group!(benches, framing, throughput);
criterion_main!(benches);
