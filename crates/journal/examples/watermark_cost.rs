//! The marginal cost of the durable watermark on one group commit, measured on the disk under
//! `--dir` (default `target/watermark-cost`): pairs of samples, interleaved so host noise hits
//! both alike, of
//!
//! - `plain`: `pwrite` a 4 KiB batch at the end of a pre-allocated segment + `fdatasync`
//!   (what a group commit cost before the watermark), and
//! - `with slot`: the same plus the 24-byte watermark slot `pwrite` into the header page,
//!   written after the previous sync as the writer does, so each `fdatasync` also writes back
//!   the header page.
//!
//! Then, per segment (not per batch): creating a 64 MiB segment (what a roll cost before)
//! and updating the watermark file (what a roll now adds), `--rolls` samples each.
//!
//! The order within a pair alternates.
//!
//! `cargo run --release -p leantier-journal --example watermark_cost --
//!     [--dir DIR] [--samples N] [--rolls N]`

use std::path::PathBuf;
use std::time::Instant;

use journal::segment::{self, SEGMENT_HEADER_BYTES, write_all_at};
use journal::segment::{SLOT_OFFSETS, encode_slot};
use journal::watermark::{WatermarkFile, WatermarkStore};
use stats::LatencyHistogram;

const BATCH_BYTES: usize = 4096;
const SAMPLES_DEFAULT: u64 = 1000;
const ROLLS_DEFAULT: u64 = 30;
const SEGMENT_BYTES: u64 = segment::SEGMENT_BYTES_DEFAULT;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut dir, mut samples) = (PathBuf::from("target/watermark-cost"), SAMPLES_DEFAULT);
    let mut rolls = ROLLS_DEFAULT;
    while let Some(flag) = args.next() {
        let value = args.next().expect("a value after each flag");
        match flag.as_str() {
            "--dir" => dir = PathBuf::from(value),
            "--samples" => samples = value.parse().expect("--samples N"),
            "--rolls" => rolls = value.parse().expect("--rolls N"),
            other => panic!("unknown flag {other} (--dir, --samples, --rolls)"),
        }
    }
    let room = (SEGMENT_BYTES - SEGMENT_HEADER_BYTES) / BATCH_BYTES as u64;
    assert!(samples <= room, "at most {room} samples fit in one segment");
    std::fs::create_dir_all(&dir)?;
    let [mut plain, mut with_slot] = [LatencyHistogram::new(), LatencyHistogram::new()];
    let batch = [0x5Au8; BATCH_BYTES];
    // Real segments (pre-allocated, header page written), one per variant.
    let files = [1, 2].map(|first_seq| {
        let path = segment::segment_path(&dir, first_seq);
        if path.exists() {
            std::fs::remove_file(&path).expect("removing a previous run's segment");
        }
        (path, segment::create(&dir, first_seq, SEGMENT_BYTES).expect("creating a segment"))
    });
    for sample in 0..samples {
        let offset = SEGMENT_HEADER_BYTES + sample * BATCH_BYTES as u64;
        // Alternate which variant goes first, so neither profits from the other's sync.
        for index in [sample % 2, 1 - sample % 2].map(|i| i as usize) {
            let file = &files[index].1;
            let started = Instant::now();
            write_all_at(file, &batch, offset)?;
            file.sync_data()?;
            if index == 1 {
                let slot = encode_slot(2, sample + 1);
                write_all_at(file, &slot, SLOT_OFFSETS[(sample % 2) as usize])?;
            }
            let histogram = if index == 0 { &mut plain } else { &mut with_slot };
            histogram.record_duration(started.elapsed());
        }
    }
    for (path, _) in &files {
        std::fs::remove_file(path)?;
    }
    std::fs::remove_file(dir.join(journal::watermark::WATERMARK_FILE)).ok();
    println!("{samples} group commits of {BATCH_BYTES} B each, interleaved; µs");
    print_table(&[("plain", &plain), ("with slot", &with_slot)]);
    let [mut create, mut update] = [LatencyHistogram::new(), LatencyHistogram::new()];
    let mut watermarks = WatermarkStore::open(&dir).expect("opening the watermark file");
    for roll in 0..rolls {
        let started = Instant::now();
        drop(segment::create(&dir, 10 + roll, SEGMENT_BYTES).expect("creating a segment"));
        create.record_duration(started.elapsed());
        std::fs::remove_file(segment::segment_path(&dir, 10 + roll))?;
        let started = Instant::now();
        let watermark = WatermarkFile { newest_segment: 10 + roll, durable_seq: 9 + roll };
        watermarks.write(&watermark).expect("updating the watermark file");
        update.record_duration(started.elapsed());
    }
    println!("{rolls} segment rolls, interleaved; µs");
    print_table(&[("create 64 MiB segment", &create), ("+ watermark file", &update)]);
    Ok(())
}

fn print_table(rows: &[(&str, &LatencyHistogram)]) {
    println!("{:<22} {:>8} {:>8} {:>8} {:>8} {:>8}", "", "mean", "p50", "p90", "p99", "max");
    for &(name, histogram) in rows {
        let us = |percentile: f64| histogram.value_at_percentile_ns(percentile) as f64 / 1e3;
        println!(
            "{name:<22} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
            histogram.mean_ns() / 1e3,
            us(50.0),
            us(90.0),
            us(99.0),
            histogram.max_ns() as f64 / 1e3
        );
    }
}
