//! The process the crash tests kill: recovers a [`Ledger`] from `--dir`, prints what it
//! recovered, then runs the core over the deterministic transfer stream `--seed` with the
//! `group` policy, printing `ack N` whenever the durable sequence reaches N (a reply released
//! to the client). `tests/crash.rs` and `scripts/soak-journal` SIGKILL it at random moments.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use journal::ledger::{TransferRecord, transfer_for};
use journal::{
    JournalConfig, JournalWriter, Ledger, RecoverOptions, Snapshotter, StateMachine, recover,
};
use lab::child_flags::ChildFlags;
use lab::error::BadInput;

/// How often the reply thread looks at the durable sequence.
const ACK_POLL: Duration = Duration::from_micros(200);

/// Crash-test child: recover, then journal a deterministic ledger workload until killed.
struct Args {
    /// Journal directory.
    dir: PathBuf,
    /// Seed of the deterministic input stream.
    seed: u64,
    /// Offer a snapshot every this many records.
    snapshot_every: u64,
    /// Segment file size in bytes.
    segment_bytes: u64,
    /// Stop after this many new records (default: run until killed).
    records_max: u64,
}

impl Args {
    fn from_env() -> Result<Args, BadInput> {
        let known = ["dir", "seed", "snapshot-every", "segment-bytes", "records-max"];
        let flags = ChildFlags::from_env(&known)?;
        Ok(Args {
            dir: flags.required("dir")?,
            seed: flags.get_or("seed", 1)?,
            snapshot_every: flags.get_or("snapshot-every", 50_000)?,
            segment_bytes: flags
                .get_or("segment-bytes", journal::segment::SEGMENT_BYTES_DEFAULT)?,
            records_max: flags.get_or("records-max", u64::MAX)?,
        })
    }
}

fn main() -> Result<(), journal::JournalError> {
    let args =
        Args::from_env().map_err(|BadInput(reason)| journal::JournalError::BadConfig(reason))?;
    let recovered = recover::<Ledger>(&args.dir, RecoverOptions::default())?;
    let mut state = recovered.state;
    let mut out = std::io::stdout();
    writeln!(
        out,
        "recovered last_seq={} applied={} out_of_order={} hash={} snapshot_seq={} replayed={} torn_tail={}",
        recovered.last_seq,
        state.applied(),
        state.out_of_order(),
        state.state_hash(),
        recovered.snapshot_seq.unwrap_or(0),
        recovered.replayed_records,
        recovered.torn_tail.is_some()
    )
    .and_then(|()| out.flush())
    .expect("stdout is open");

    let config = JournalConfig { segment_bytes: args.segment_bytes, ..JournalConfig::default() };
    let (mut journal, writer) = JournalWriter::spawn::<TransferRecord>(recovered.tail, &config)?;
    let mut snapshots = Snapshotter::spawn(args.dir.clone(), writer.durable())?;
    let stop = Arc::new(AtomicBool::new(false));
    let replies = {
        let (durable, stop) = (writer.durable(), Arc::clone(&stop));
        let mut acked = recovered.last_seq;
        std::thread::spawn(move || {
            // Relaxed: a shutdown flag; the final durable value is read after it anyway.
            while !stop.load(Ordering::Relaxed) {
                let now = durable.get();
                if now > acked {
                    acked = now;
                    writeln!(out, "ack {acked}")
                        .and_then(|()| out.flush())
                        .expect("stdout is open");
                }
                std::thread::sleep(ACK_POLL);
            }
        })
    };
    let first = recovered.last_seq + 1;
    for seq in first..first.saturating_add(args.records_max) {
        let record = transfer_for(args.seed, seq);
        state.apply(seq, &record.payload);
        journal.append(record)?;
        if seq.is_multiple_of(args.snapshot_every) {
            snapshots.offer(seq, &state);
        }
    }
    drop(journal);
    writer.join()?;
    snapshots.finish()?;
    // Relaxed: see the reply thread.
    stop.store(true, Ordering::Relaxed);
    replies.join().expect("the reply thread does not panic");
    Ok(())
}
