//! The process the crash tests kill: recovers a [`Ledger`] from its directory, prints what it
//! recovered, then runs the core over the deterministic transfer stream of its seed with the
//! `group` policy, printing `ack N` whenever the durable sequence reaches N (a reply released
//! to the client). `tests/crash.rs` runs it by re-executing its own test binary with
//! [`ARGS_ENV`] set (so the journal library carries no crash child or flag parser), and
//! SIGKILLs it at random moments; `scripts/soak-journal` runs that test longer.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use journal::ledger::{TransferRecord, transfer_for};
use journal::{
    JournalConfig, JournalWriter, Ledger, RecoverOptions, Snapshotter, StateMachine, recover,
};

/// How often the reply thread looks at the durable sequence.
const ACK_POLL: Duration = Duration::from_micros(200);

/// The environment variable that carries the child's arguments: `dir seed snapshot_every
/// segment_bytes records_max`, separated by tabs (the directory may hold spaces).
pub const ARGS_ENV: &str = "LEANTIER_JOURNAL_CRASH_CHILD";

/// Crash-test child: recover, then journal a deterministic ledger workload until killed.
pub struct Args {
    /// Journal directory.
    pub dir: PathBuf,
    /// Seed of the deterministic input stream.
    pub seed: u64,
    /// Offer a snapshot every this many records.
    pub snapshot_every: u64,
    /// Segment file size in bytes.
    pub segment_bytes: u64,
    /// Stop after this many new records (`u64::MAX`: run until killed).
    pub records_max: u64,
}

impl Args {
    /// The value of [`ARGS_ENV`] that makes a child of these arguments.
    pub fn to_env(&self) -> String {
        let Args { dir, seed, snapshot_every, segment_bytes, records_max } = self;
        format!("{}\t{seed}\t{snapshot_every}\t{segment_bytes}\t{records_max}", dir.display())
    }

    fn from_env(text: &str) -> Args {
        let fields: Vec<&str> = text.split('\t').collect();
        let number = |at: usize| -> u64 {
            fields[at].parse().unwrap_or_else(|_| panic!("field {at} of {ARGS_ENV}: {text:?}"))
        };
        assert_eq!(fields.len(), 5, "{ARGS_ENV}: {text:?}");
        Args {
            dir: PathBuf::from(fields[0]),
            seed: number(1),
            snapshot_every: number(2),
            segment_bytes: number(3),
            records_max: number(4),
        }
    }
}

/// Runs the child with the arguments in [`ARGS_ENV`]'s value `text`.
pub fn run(text: &str) -> Result<(), journal::JournalError> {
    let args = Args::from_env(text);
    let recovered = recover::<Ledger>(&args.dir, RecoverOptions::default())?;
    let mut state = recovered.state;
    let mut out = std::io::stdout();
    // A line of its own: the test harness may have printed the test's name without a newline.
    writeln!(
        out,
        "\nrecovered last_seq={} applied={} out_of_order={} hash={} snapshot_seq={} replayed={} torn_tail={}",
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
