//! The Serializer: appends CSV lines to one file per worker, with an fsync policy.
//!
//! One file per worker means no two threads share a file descriptor or a lock; the order of
//! lines within a file is the order the worker received them.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::convert::Converted;

/// Bytes buffered in user space before a `write` system call.
pub const WRITE_BUFFER_BYTES: usize = 64 << 10;
/// Default fsync policy: one `fdatasync` per this many records.
pub const FSYNC_EVERY_RECORDS_DEFAULT: u64 = 4096;

/// One serializer worker's output file.
pub struct Serializer {
    writer: BufWriter<File>,
    path: PathBuf,
    /// 0 = never fsync except when finishing.
    fsync_every_records: u64,
    records_since_sync: u64,
    records_written: u64,
}

impl Serializer {
    /// Opens (appending) `dir/cdr-<worker>.csv`.
    pub fn create(dir: &Path, worker: usize, fsync_every_records: u64) -> io::Result<Self> {
        let path = dir.join(format!("cdr-{worker}.csv"));
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(Self {
            writer: BufWriter::with_capacity(WRITE_BUFFER_BYTES, file),
            path,
            fsync_every_records,
            records_since_sync: 0,
            records_written: 0,
        })
    }

    /// Appends one record; every `fsync_every_records` records, flushes and fdatasyncs.
    pub fn write(&mut self, converted: &Converted) -> io::Result<()> {
        self.writer.write_all(converted.line())?;
        self.records_written += 1;
        self.records_since_sync += 1;
        if self.fsync_every_records > 0 && self.records_since_sync >= self.fsync_every_records {
            self.sync()?;
        }
        Ok(())
    }

    /// Flushes and fdatasyncs everything written so far.
    pub fn sync(&mut self) -> io::Result<()> {
        self.writer.flush()?;
        self.writer.get_ref().sync_data()?;
        self.records_since_sync = 0;
        Ok(())
    }

    /// Records written by this worker.
    pub fn records_written(&self) -> u64 {
        self.records_written
    }

    /// The file this worker writes.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
