//! The safe store writer: a journal that runs beside the core instead of on its thread.
//!
//! # The design
//!
//! The core sequences its input and hands each record to the journal through a bounded
//! `pipeline` ring ([`JournalSender::append`]), then goes on with the next transaction. A
//! writer thread ([`JournalWriter`]) drains the ring in batches: one `pwrite` and one
//! `fdatasync` per batch (group commit), after which it publishes the highest durable
//! sequence number ([`DurableSeq`], one atomic). The response side holds each reply until the
//! durable sequence covers the input that caused it. Disk latency is thus off the critical
//! path (it delays replies, not the processing of the next input), and the sync cost is
//! shared by every record that arrived during the previous sync. Three [`Policy`]s make the
//! trade-off explicit: `sync` (wait for each record's fsync: I/O on the critical path),
//! `group` (the default) and `relaxed` (timer flush, replies not held, a loss window on
//! power failure).
//!
//! # On disk
//!
//! A journal directory holds segment files `{first_seq:020}.seg` (pre-allocated, rolled at
//! [`JournalConfig::segment_bytes`]) of frames `[len][crc32c][seq][payload]` ([`frame`]) after
//! a 4 KiB header page, snapshots `{seq:020}.snap` written atomically off the critical path
//! ([`Snapshotter`]), and the watermark file `journal.watermark`. Names make the order
//! unambiguous and a gap detectable. Format and rules in full: `docs/JOURNAL.md`.
//!
//! # The durable watermark
//!
//! Recovery must tell a torn write (never acknowledged: truncate it) from lost or damaged
//! acknowledged data (refuse), and a journal that merely ends from one that was cut. So the
//! journal records the highest sequence it ever made durable ([`watermark`]), checksummed, in
//! two places: two alternating slots in the header page of the segment being written, updated
//! by one 24-byte `pwrite` after each group commit's `fdatasync` and before the durable
//! sequence is published (no extra sync: it rides on the next one), and the watermark file
//! (two alternating checksummed slots, one write + `fdatasync` per update), updated when a
//! writer starts, when a segment is created (before any record goes into it) and at a clean
//! shutdown, so that deleting the newest segment, slots and all, is still detected. The
//! watermark is exact after a process crash or a clean shutdown; after a power failure it may
//! lag the acknowledged sequence by the last batch (whose slot write was waiting for the next
//! sync). Measured cost: `docs/benchmarks/journal.md`.
//!
//! # Recovery
//!
//! [`recover`] loads the newest valid snapshot of a [`StateMachine`], then runs the one
//! validation that `journal check` runs too ([`validate()`]), applying the records after the
//! snapshot as it reads them, and returns the state plus the [`Tail`] where a new writer
//! resumes. With `W` the durable watermark and `S` the snapshot: damage confined to records at
//! or below `S` is reported and start-up goes on (the snapshot holds them); a bad last record
//! above `W` is a torn write and is truncated; a journal that ends below `W` (missing or
//! truncated segment), a bad record at or below `W`, a bad record followed by valid ones, or a
//! gap stop start-up with a [`JournalError`] whose [`JournalError::reason`] is a stable code
//! and whose text names the file, offset and sequences. `repair` gets past every refusal but a
//! gap, after a warning naming the first discarded sequence and the watermark.
//! `tests/crash.rs` checks all of this by SIGKILLing a real process (its crash child).
//!
//! # Failure
//!
//! Any write or sync error stops the writer for good: [`DurableSeq::has_failed`] turns true,
//! the durable sequence stays at the last successful sync (so no reply for data that may be
//! lost is ever released), `append` returns [`JournalError::WriterStopped`], and
//! [`JournalWriter::join`] returns the error. A failed `fdatasync` is never retried.
//! Measured figures: `docs/benchmarks/journal.md`.
//!
//! # Logging
//!
//! [`audit`] moves audit and error lines off hot threads the same way: a ring per thread, a
//! background writer, drops counted rather than waiting.
//!
//! # Adopting it (e.g. the exchange)
//!
//! ```no_run
//! use journal::{FixedRecord, JournalConfig, JournalWriter, Ledger, RecoverOptions, Snapshotter};
//! use journal::{StateMachine, recover};
//! let dir = std::path::Path::new("data/journal");
//! // Start-up: the newest valid snapshot, then the journal after it.
//! let recovered = recover::<Ledger>(dir, RecoverOptions { repair: false })?;
//! let mut state = recovered.state;
//! let config = JournalConfig::default(); // group commit
//! let (mut journal, writer) = JournalWriter::spawn::<FixedRecord<24>>(recovered.tail, &config)?;
//! let durable = writer.durable(); // response side: release reply `seq` once durable.covers(seq)
//! let mut snapshots = Snapshotter::spawn(dir.to_path_buf(), writer.durable())?;
//! // The core, for each sequenced input:
//! let input = FixedRecord { seq: recovered.last_seq + 1, payload: [0; 24] };
//! state.apply(input.seq, &input.payload);
//! journal.append(input)?; // group: returns at once; sync: after the record's fdatasync
//! snapshots.offer(input.seq, &state); // every N inputs; never waits
//! // Shutdown: dropping the sender lets the writer drain and sync.
//! drop(journal);
//! writer.join()?;
//! snapshots.finish()?;
//! # Ok::<(), journal::JournalError>(())
//! ```

#![deny(missing_docs)]

// The README's examples compile (and run) as doctests, so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub mod audit;
mod durable;
mod error;
pub mod frame;
pub mod ledger;
pub mod reader;
mod record;
mod recovery;
pub mod segment;
pub mod snapshot;
mod state;
pub mod validate;
pub mod watermark;
pub mod writer;

pub use durable::DurableSeq;
pub use error::JournalError;
pub use ledger::Ledger;
pub use reader::JournalReader;
pub use record::{FixedRecord, Record};
pub use recovery::{RecoverOptions, Recovered, Repaired, recover, recover_from};
pub use snapshot::Snapshotter;
pub use state::StateMachine;
pub use validate::{Scan, Validation, validate};
pub use writer::{JournalConfig, JournalSender, JournalWriter, Policy, Tail};
