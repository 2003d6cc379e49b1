//! Audit and error logging off the critical path.
//!
//! Each hot thread owns an [`AuditLogger`]: the producing end of its own `pipeline` ring of
//! fixed-size [`AuditRecord`]s (single writer per ring). [`AuditLogger::log`] is a `try_push`:
//! no allocation, no lock, no syscall (the timestamp is a vDSO clock read). When the ring is
//! full the record is dropped and counted, so a slow disk can never stall a hot thread. One
//! background thread drains every ring into a buffered file and flushes when the rings are
//! empty.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pipeline::{ConnectorKind, Receiver, RingConfig, Sender, TryPushError};

use crate::error::{JournalError, io_context};

/// Bytes of message text an audit record carries; longer text is cut at a char boundary.
pub const AUDIT_TEXT_BYTES: usize = 96;
/// Records the background writer takes from one ring before visiting the next.
const AUDIT_BATCH_RECORDS: usize = 256;
/// How long the background writer sleeps when every ring is empty.
const AUDIT_IDLE_SLEEP: Duration = Duration::from_millis(1);

/// What kind of line an audit record is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuditLevel {
    /// A business event kept for the audit trail.
    #[default]
    Audit,
    /// An error worth a person's attention.
    Error,
}

/// One log line, as plain data so it fits a pre-allocated ring slot.
#[derive(Clone, Copy, Debug)]
pub struct AuditRecord {
    /// When it was logged, in ns since the Unix epoch.
    pub at_unix_ns: u64,
    /// Audit or error.
    pub level: AuditLevel,
    /// A machine-readable reason code chosen by the caller.
    pub code: u16,
    /// The input sequence the line is about (0: none).
    pub seq: u64,
    text_bytes: u8,
    text: [u8; AUDIT_TEXT_BYTES],
}

impl Default for AuditRecord {
    fn default() -> Self {
        AuditRecord {
            at_unix_ns: 0,
            level: AuditLevel::Audit,
            code: 0,
            seq: 0,
            text_bytes: 0,
            text: [0; AUDIT_TEXT_BYTES],
        }
    }
}

impl AuditRecord {
    /// The line's text (truncated to the record's fixed size).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.text[..self.text_bytes as usize]).expect("cut at a char boundary")
    }
}

/// A hot thread's logging handle.
pub struct AuditLogger {
    tx: Sender<AuditRecord>,
    dropped: Arc<AtomicU64>,
}

impl AuditLogger {
    /// Queues a line; returns `false` (and counts a drop) when the ring is full. Never waits.
    #[inline]
    pub fn log(&mut self, level: AuditLevel, code: u16, seq: u64, text: &str) -> bool {
        let mut cut = text.len().min(AUDIT_TEXT_BYTES);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut record = AuditRecord {
            at_unix_ns: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            level,
            code,
            seq,
            text_bytes: cut as u8,
            ..AuditRecord::default()
        };
        record.text[..cut].copy_from_slice(&text.as_bytes()[..cut]);
        match self.tx.try_push(record) {
            Ok(()) => true,
            Err(TryPushError::Full(_) | TryPushError::Disconnected(_)) => {
                // Relaxed: a statistic read after the fact; it orders nothing.
                self.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Lines this logger dropped because its ring was full.
    pub fn dropped(&self) -> u64 {
        // Relaxed: see `log`.
        self.dropped.load(Ordering::Relaxed)
    }
}

/// What the background writer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditStats {
    /// Lines written to the log.
    pub written: u64,
    /// Lines dropped because a thread's ring was full (counted, never waited for).
    pub dropped: u64,
}

/// The background log writer.
pub struct AuditLog {
    thread: JoinHandle<Result<u64, JournalError>>,
    dropped: Vec<Arc<AtomicU64>>,
}

impl AuditLog {
    /// Opens (appends to) `path` and returns one logger per hot thread.
    pub fn spawn(
        path: &Path,
        loggers: usize,
        ring: &RingConfig,
    ) -> Result<(Vec<AuditLogger>, AuditLog), JournalError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_context(format!("opening audit log {}", path.display())))?;
        let mut handles = Vec::with_capacity(loggers);
        let mut receivers = Vec::with_capacity(loggers);
        let mut dropped = Vec::with_capacity(loggers);
        for _ in 0..loggers {
            let (tx, rx) = pipeline::connector::<AuditRecord>(ConnectorKind::LockFree, ring)
                .map_err(|e| JournalError::BadConfig(e.to_string()))?;
            let counter = Arc::new(AtomicU64::new(0));
            handles.push(AuditLogger { tx, dropped: Arc::clone(&counter) });
            receivers.push(rx);
            dropped.push(counter);
        }
        let context = format!("writing audit log {}", path.display());
        let thread = std::thread::Builder::new()
            .name("journal-audit".into())
            .spawn(move || {
                drain(receivers, std::io::BufWriter::new(file)).map_err(io_context(context))
            })
            .map_err(io_context("spawning the audit log thread".into()))?;
        Ok((handles, AuditLog { thread, dropped }))
    }

    /// Drains and closes the log once every logger is dropped.
    pub fn join(self) -> Result<AuditStats, JournalError> {
        let written = match self.thread.join() {
            Ok(result) => result?,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        // Relaxed: the loggers are gone (joined through their ring's disconnect).
        let dropped = self.dropped.iter().map(|d| d.load(Ordering::Relaxed)).sum();
        Ok(AuditStats { written, dropped })
    }
}

fn drain(mut receivers: Vec<Receiver<AuditRecord>>, mut out: impl Write) -> std::io::Result<u64> {
    let mut written = 0u64;
    let mut failure = None;
    loop {
        let mut taken = 0;
        for rx in &mut receivers {
            taken += rx.read_batch(AUDIT_BATCH_RECORDS, |record| {
                let line = writeln!(
                    out,
                    "{} {:?} code={} seq={} {}",
                    record.at_unix_ns,
                    record.level,
                    record.code,
                    record.seq,
                    record.text()
                );
                if let Err(error) = line {
                    failure.get_or_insert(error);
                }
            });
        }
        if let Some(error) = failure {
            return Err(error);
        }
        written += taken as u64;
        if taken == 0 {
            out.flush()?;
            if receivers.iter_mut().all(|rx| rx.is_disconnected()) {
                return Ok(written);
            }
            std::thread::sleep(AUDIT_IDLE_SLEEP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(capacity_slots: usize) -> RingConfig {
        RingConfig {
            capacity_slots,
            batch_slots_max: capacity_slots,
            wait: pipeline::WaitStrategy::Park,
        }
    }

    #[test]
    fn lines_reach_the_file_and_long_text_is_cut_at_a_char_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let (mut loggers, log) = AuditLog::spawn(&path, 2, &ring(64)).unwrap();
        assert!(loggers[0].log(AuditLevel::Audit, 7, 42, "order accepted"));
        assert!(loggers[1].log(AuditLevel::Error, 9, 43, &"é".repeat(100)));
        drop(loggers);
        assert_eq!(log.join().unwrap(), AuditStats { written: 2, dropped: 0 });
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("Audit code=7 seq=42 order accepted"), "{text}");
        assert!(text.contains(&format!("Error code=9 seq=43 {}", "é".repeat(48))), "{text}");
    }

    #[test]
    fn a_full_ring_drops_and_counts_instead_of_blocking() {
        let (tx, rx) =
            pipeline::connector::<AuditRecord>(ConnectorKind::LockFree, &ring(4)).unwrap();
        let mut logger = AuditLogger { tx, dropped: Arc::new(AtomicU64::new(0)) };
        let accepted = (0..10).filter(|&i| logger.log(AuditLevel::Audit, 1, i, "x")).count();
        assert_eq!(accepted, 4);
        assert_eq!(logger.dropped(), 6);
        drop(rx);
    }
}
