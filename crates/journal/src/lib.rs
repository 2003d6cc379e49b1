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
//! [`JournalConfig::segment_bytes`]) of frames `[len][crc32c][seq][payload]` ([`frame`]), and
//! snapshots `{seq:020}.snap` written atomically off the critical path ([`Snapshotter`]).
//! Names make the order unambiguous and a gap detectable.
//!
//! # Recovery
//!
//! [`recover`] loads the newest valid snapshot of a [`StateMachine`], replays the journal after
//! it and returns the state plus the [`Tail`] where a new writer resumes. A torn last record is
//! truncated with a warning; corruption followed by valid records, or a missing segment, stops
//! start-up with an error naming file, offset and sequence (`repair` truncates at corruption).
//! `src/bin/journal-crash-child.rs` and `tests/crash.rs` check all of this by SIGKILLing a
//! real process.
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

pub mod audit;
pub mod bench;
mod durable;
mod error;
pub mod frame;
pub mod ledger;
pub mod reader;
mod record;
mod recovery;
pub mod segment;
pub mod snapshot;
pub mod validate;
pub mod watermark;
pub mod writer;

pub use durable::DurableSeq;
pub use error::JournalError;
pub use ledger::Ledger;
pub use reader::JournalReader;
pub use record::{FixedRecord, Record};
pub use recovery::{RecoverOptions, Recovered, Repaired, StateMachine, recover, recover_from};
pub use snapshot::Snapshotter;
pub use validate::{Validation, validate};
pub use writer::{JournalConfig, JournalSender, JournalWriter, Policy, Tail};
