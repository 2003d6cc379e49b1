//! One owner per store: a server or run that writes a data directory (a gateway store, a tier's
//! journals, an SQLite database) takes [`StoreLock`] on it first and holds it for its life, so
//! that a second process started on the same directory is refused before it reads or cuts
//! anything, instead of writing beside the first (two writers lose each other's records).
//!
//! The lock is an advisory `flock` on a file [`LOCK_FILE`] in the directory. The kernel
//! releases it when the holder's process ends, however it ends, so a crashed holder never
//! blocks a restart: what the file holds (the holder's pid, start time and command) is only
//! shown to the process that is refused, and the next holder overwrites it. The file itself
//! stays: removing it on exit would let a process that opened it just before lock an inode
//! nobody else can find any more, and two processes would own the store again.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use crate::OpsError;

/// The lock file's name inside the directory it guards.
pub const LOCK_FILE: &str = "LOCK";

/// The longest command a lock file keeps.
const COMMAND_CHARS_MAX: usize = 200;

/// Who holds a store, as its lock file says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// The holder's process id (`None`: the file names none yet, as between a holder's lock
    /// and its write).
    pub pid: Option<u32>,
    /// When the holder's process started, RFC 3339 UTC.
    pub started: Option<String>,
    /// The holder's command: the program's file name and the subcommand words before the
    /// first flag (`leantier exchange serve`), cut at 200 characters (`COMMAND_CHARS_MAX`).
    pub command: Option<String>,
}

impl Holder {
    /// This process.
    fn this_process() -> Holder {
        let started_s = crate::process::ProcessSample::read()
            .map(|sample| sample.start_time_seconds.max(0) as u64)
            .unwrap_or_else(|| UNIX_EPOCH.elapsed().unwrap_or_default().as_secs());
        let started = UNIX_EPOCH + Duration::from_secs(started_s);
        let command = command_words(std::env::args());
        Holder {
            pid: Some(std::process::id()),
            started: Some(humantime::format_rfc3339_seconds(started).to_string()),
            command: Some(command.chars().take(COMMAND_CHARS_MAX).collect()),
        }
    }

    /// The lock file's text: one `key=value` per line.
    fn to_text(&self) -> String {
        let fields = [
            ("pid", self.pid.map(|pid| pid.to_string())),
            ("started", self.started.clone()),
            ("command", self.command.clone()),
        ];
        let mut text = String::new();
        for (key, value) in fields {
            if let Some(value) = value {
                // One line per field: a newline in the command would start a bogus one.
                text.push_str(&format!("{key}={}\n", value.replace('\n', " ")));
            }
        }
        text
    }

    /// Reads a lock file's text; unknown or malformed lines are left out.
    fn from_text(text: &str) -> Holder {
        let mut holder = Holder::default();
        for (key, value) in text.lines().filter_map(|line| line.split_once('=')) {
            match key {
                "pid" => holder.pid = value.trim().parse().ok(),
                "started" => holder.started = Some(value.trim().to_string()),
                "command" => holder.command = Some(value.to_string()),
                _ => {}
            }
        }
        holder
    }
}

/// The program's file name and the words after it up to the first flag: what an operator needs
/// to tell which server holds a store, without the flags' values (a `--nats-password` or a URL
/// with credentials must not land in a file others may read, or in another process's error).
fn command_words(args: impl Iterator<Item = String>) -> String {
    let mut args = args;
    let program = args.next().unwrap_or_default();
    let program = Path::new(&program).file_name().map(|name| name.to_string_lossy().into_owned());
    let words = args.take_while(|arg| !arg.starts_with('-'));
    program.into_iter().chain(words).collect::<Vec<_>>().join(" ")
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(pid) = self.pid else {
            return f.write_str("a process whose lock file names no holder yet");
        };
        write!(f, "pid {pid}")?;
        if let Some(started) = &self.started {
            write!(f, ", started {started}")?;
        }
        if let Some(command) = &self.command {
            write!(f, ", command `{command}`")?;
        }
        Ok(())
    }
}

/// The held lock on a data directory; the lock is released when this drops (or the process
/// ends).
#[derive(Debug)]
pub struct StoreLock {
    /// The open lock file: the `flock` lives as long as this descriptor.
    _file: File,
    path: PathBuf,
}

impl StoreLock {
    /// Takes the lock on `dir` (created if missing), or says who holds it: fails with
    /// [`OpsError::Held`] when another process (or another `StoreLock` of this one) holds it,
    /// [`OpsError::Lock`] when the file cannot be made, locked or written. Never waits.
    pub fn acquire(dir: &Path) -> Result<StoreLock, OpsError> {
        let path = dir.join(LOCK_FILE);
        let failed = |what| {
            let path = path.clone();
            move |source| OpsError::Lock { what, path, source }
        };
        std::fs::create_dir_all(dir).map_err(failed("creating the directory of"))?;
        // Not truncated on open: a refused process must still read the holder's text.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(failed("opening"))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                // A holder between its lock and its write leaves the file empty: unnamed.
                let _ = file.read_to_string(&mut text);
                return Err(OpsError::Held { path, holder: Holder::from_text(&text) });
            }
            Err(TryLockError::Error(source)) => return Err(failed("locking")(source)),
        }
        // The text a crashed holder left is replaced, not appended to.
        file.set_len(0).map_err(failed("writing"))?;
        file.seek(SeekFrom::Start(0)).map_err(failed("writing"))?;
        file.write_all(Holder::this_process().to_text().as_bytes()).map_err(failed("writing"))?;
        Ok(StoreLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_a_held_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = StoreLock::acquire(dir.path()).unwrap();
        assert_eq!(held.path(), dir.path().join(LOCK_FILE));
        let Err(OpsError::Held { path, holder }) = StoreLock::acquire(dir.path()) else {
            panic!("a held directory was locked twice");
        };
        assert_eq!(path, dir.path().join(LOCK_FILE));
        assert_eq!(holder.pid, Some(std::process::id()));
        let shown = OpsError::Held { path, holder }.to_string();
        assert!(shown.contains(&format!("pid {}", std::process::id())), "{shown}");
        assert!(shown.contains("started 20"), "{shown}");
    }

    #[test]
    fn a_released_lock_is_taken_again_and_stale_text_does_not_matter() {
        let dir = tempfile::tempdir().unwrap();
        // What a crashed holder leaves: its text, no lock (the kernel dropped it).
        let stale = "pid=4294967\nstarted=2001-01-01T00:00:00Z\ncommand=gone with a long tail\n";
        std::fs::write(dir.path().join(LOCK_FILE), stale).unwrap();
        let first = StoreLock::acquire(dir.path()).unwrap();
        let text = std::fs::read_to_string(first.path()).unwrap();
        assert_eq!(Holder::from_text(&text).pid, Some(std::process::id()), "{text}");
        assert!(!text.contains("tail"), "the stale text was not replaced: {text}");
        drop(first);
        StoreLock::acquire(dir.path()).expect("a dropped lock is free again");
    }

    #[test]
    fn the_command_kept_is_the_program_and_its_subcommands_without_flag_values() {
        let args = ["/opt/bin/leantier", "exchange", "serve", "--nats-password", "hunter2", "x"];
        let command = command_words(args.iter().map(|arg| arg.to_string()));
        assert_eq!(command, "leantier exchange serve");
    }

    #[test]
    fn a_lock_file_without_a_holder_reads_as_unnamed() {
        let holder = Holder::from_text("");
        assert_eq!(holder, Holder::default());
        assert!(holder.to_string().contains("names no holder"), "{holder}");
        let back = Holder::from_text(&Holder::this_process().to_text());
        assert_eq!(back, Holder::this_process());
    }
}
