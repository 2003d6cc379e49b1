//! The crash child that `tests/crash.rs` kills: runs the exchange tier on a data directory
//! (recovering whatever the last run left there: newest snapshot, then the journal after it)
//! under open-loop load with the `group` journal and, with `--snapshot-every`, shard snapshots,
//! and prints `ack SHARD SEQ` whenever a reply for a higher input sequence of SHARD has been
//! delivered to a gateway (a reply released to the client). The test binary re-executes
//! itself with [`ARGS_ENV`] set (so the exchange library carries no crash child), its value the
//! child's `--name value` flags.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exchange::durability::{JournalMode, JournalOptions};
use exchange::tier::{ReleasedSeqs, TierConfig};
use experiments::tier_load::{RunOptions, run as run_tier};
use ops::child_flags::ChildFlags;

/// The environment variable whose value makes the test binary the crash child: its flags.
pub const ARGS_ENV: &str = "LEANTIER_EXCHANGE_CRASH_CHILD";

/// How often the reporter looks at the released sequences.
const ACK_POLL: Duration = Duration::from_micros(500);

/// Crash-test child: run the tier on a data directory until killed (or `--seconds` pass).
struct Args {
    /// Data directory of the shard journals.
    data: PathBuf,
    /// Core shards.
    core_shards: usize,
    /// Arrival rate, msg/s.
    rate: f64,
    /// Segment file size in bytes (small: recovery reads the last segment to its end).
    segment_bytes: u64,
    /// A snapshot of each shard every this many journaled inputs (0 = none).
    snapshot_every: u64,
    /// Run length, seconds.
    seconds: f64,
}

impl Args {
    fn parse(text: &str) -> Result<Args, ops::OpsError> {
        let known = ["data", "core-shards", "rate", "segment-bytes", "snapshot-every", "seconds"];
        let flags = ChildFlags::parse(text.split_whitespace().map(str::to_string), &known)?;
        Ok(Args {
            data: flags.required("data")?,
            core_shards: flags.get_or("core-shards", 2)?,
            rate: flags.get_or("rate", 5_000.0)?,
            segment_bytes: flags.get_or("segment-bytes", 1 << 20)?,
            snapshot_every: flags.get_or("snapshot-every", 0)?,
            seconds: flags.get_or("seconds", 60.0)?,
        })
    }
}

/// Runs the child with the flags in [`ARGS_ENV`]'s value `text` until killed (or `--seconds`
/// pass).
pub fn run(text: &str) -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse(text)?;
    let config = TierConfig {
        core_shards: args.core_shards,
        order_pool_slots: 1 << 14,
        journal: JournalMode::default(),
        snapshot_every_records: args.snapshot_every,
        ..TierConfig::default()
    };
    let released = ReleasedSeqs::new(args.core_shards);
    let stop = Arc::new(AtomicBool::new(false));
    let reporter = {
        let (released, stop) = (Arc::clone(&released), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut out = std::io::stdout();
            // A line of its own: the test harness may have printed the test's name without a
            // newline.
            writeln!(out).expect("stdout is open");
            let mut acked = vec![0u64; args.core_shards];
            // Relaxed: a shutdown flag, nothing is published through it.
            while !stop.load(Ordering::Relaxed) {
                for (shard, last) in acked.iter_mut().enumerate() {
                    let now = released.get(shard);
                    if now > *last {
                        *last = now;
                        writeln!(out, "ack {shard} {now}").expect("stdout is open");
                    }
                }
                out.flush().expect("stdout is open");
                std::thread::sleep(ACK_POLL);
            }
        })
    };
    let options = RunOptions {
        rate_per_s: args.rate,
        duration: Duration::from_secs_f64(args.seconds),
        record_inputs: false,
        journal: JournalOptions {
            data_dir: Some(args.data),
            repair: false,
            segment_bytes: args.segment_bytes,
            restore: None,
        },
        released: Some(released),
        stop: None,
        load: experiments::tier_load::LoadConfig::default(),
    };
    let result = run_tier(&config, options, |_| {});
    // Relaxed: see the reporter.
    stop.store(true, Ordering::Relaxed);
    reporter.join().expect("the reporter does not panic");
    Ok(result.map(|_| ())?)
}
