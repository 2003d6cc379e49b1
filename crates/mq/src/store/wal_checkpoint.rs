//! The embedded store's WAL checkpoints, off the write path.
//!
//! Why: with SQLite's default (`wal_autocheckpoint = 1000` pages) the commit that takes the WAL
//! past 1,000 pages also copies every page of the WAL into the database file and fsyncs that
//! file before it returns, so every fourth batch of a thousand 1 KiB sends pays a second fsync
//! and megabytes of copying on the writer's thread (a quarter of the embedded send path's
//! samples under `perf`). Here the writer never checkpoints at that size: its commit hook wakes a
//! thread with its own connection, which runs a PASSIVE checkpoint while the writer goes on
//! (SQLite lets one checkpoint and one writer run at once on a WAL). When a checkpoint has
//! copied the whole WAL, the writer's next transaction starts the WAL over from its beginning,
//! so the file stays near the size at which the checkpointer is woken.
//!
//! Durability is unchanged: a commit is durable once its WAL frames are fsynced
//! (`synchronous=FULL`), before any checkpoint; a checkpoint interrupted by a crash is redone
//! from the WAL at the next open.
//!
//! The writer still finishes the job: SQLite starts the WAL over only when a write transaction
//! begins with every frame copied, which a background checkpoint never achieves under a steady
//! stream of commits (each copies up to the frame that was last when it began; the writer has
//! appended more by then). So from [`WRITER_CHECKPOINT_PAGES`] on, the writer runs a FULL
//! checkpoint after its commit: it waits for a background pass under way, copies what that pass
//! left (the last few commits' pages) and the next transaction starts the WAL over. That bounds
//! the WAL, and the writer copies a fraction of what it copied before.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use std::time::Duration;

use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, ErrorCode};

use crate::error::{MqError, Result};

/// WAL pages after a commit from which the checkpointer is woken (SQLite's autocheckpoint
/// default, so the WAL is as large as it would have been).
const BACKGROUND_CHECKPOINT_PAGES: i32 = 1_000;
/// WAL pages after a commit from which the writer checkpoints itself (the WAL's largest size,
/// 16 MiB of 4 KiB pages, plus one commit).
const WRITER_CHECKPOINT_PAGES: i32 = 4 * BACKGROUND_CHECKPOINT_PAGES;
/// How long the checkpointer waits before it tries a busy checkpoint again, and how many times
/// (a second in all; a writer's transaction lasts milliseconds).
const BUSY_PAUSE: Duration = Duration::from_millis(1);
const BUSY_TRIES_MAX: u32 = 1_000;

/// Starts the checkpointer of the database at `path` and sets `writer`'s commit hook to wake it.
/// The thread ends when `writer` is closed (the hook, which holds the only sender, is dropped).
pub(super) fn start(writer: &mut Connection, path: &Path) -> Result<()> {
    let checkpointer = Connection::open(path).map_err(|source| MqError::Sqlite {
        what: format!("opening {} for its WAL checkpoints", path.display()),
        source,
    })?;
    checkpointer.busy_timeout(super::sqlite::BUSY_TIMEOUT)?;
    // A checkpoint fsyncs the database file before it lets the WAL be reused; FULL, as the writer.
    checkpointer.pragma_update(None, "synchronous", "FULL")?;
    let (wake, woken) = sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("mq-sqlite-checkpoint".into())
        .spawn(move || run(&checkpointer, &woken))
        .map_err(|source| MqError::Io { what: "starting the WAL checkpointer".into(), source })?;
    writer.wal_hook(Some(move |wal: &mut Wal, pages: i32| after_commit(&wake, wal, pages)))?;
    Ok(())
}

/// The writer's commit hook: wakes the checkpointer past [`BACKGROUND_CHECKPOINT_PAGES`] (never
/// waiting: a full wake-up slot means it is already due to run) and finishes the checkpoint
/// itself past [`WRITER_CHECKPOINT_PAGES`]. Never fails: the commit it follows is durable, and
/// an error here would be reported as the commit's.
fn after_commit(wake: &SyncSender<()>, wal: &mut Wal, pages: i32) -> rusqlite::Result<()> {
    if pages >= WRITER_CHECKPOINT_PAGES {
        // FULL waits (the connection's busy timeout) for a background pass under way.
        if let Err(error) = wal.checkpoint_v2(CheckpointMode::FULL) {
            tracing::debug!(%error, pages, "the SQLite writer's own WAL checkpoint did not run");
        }
    } else if pages >= BACKGROUND_CHECKPOINT_PAGES {
        // Full: a wake-up is pending. Disconnected: the checkpointer stopped (it only does when
        // this hook is dropped), and the writer keeps the WAL bounded from the larger size on.
        let _ = wake.try_send(());
    }
    Ok(())
}

/// The checkpointer's loop: a checkpoint per wake-up (wake-ups that arrive while one runs are
/// folded into the next).
fn run(checkpointer: &Connection, woken: &Receiver<()>) {
    while woken.recv().is_ok() {
        checkpoint_when_free(checkpointer);
    }
}

/// Runs a PASSIVE checkpoint, trying again while it is refused as busy: it is while the writer's
/// transaction began on an empty WAL (that transaction reads the database file itself, holding
/// the WAL's read slot 0, which copying into the file needs); the writer's next transaction
/// reads through the WAL and lets the slot go.
fn checkpoint_when_free(checkpointer: &Connection) {
    for _ in 0..BUSY_TRIES_MAX {
        match checkpointer.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE) {
            Ok(_) => return,
            Err(error) if error.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
                std::thread::sleep(BUSY_PAUSE);
            }
            Err(error) => {
                tracing::warn!(%error, "the SQLite store's background WAL checkpoint failed");
                return;
            }
        }
    }
    tracing::debug!(
        "the SQLite store's background WAL checkpoint stayed busy; tried again at the next wake-up"
    );
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::store::SQLITE_DB_FILE;

    #[test]
    fn the_checkpointer_copies_the_wal_into_the_database_while_the_writer_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SQLITE_DB_FILE);
        let mut writer = new_table(&path);
        start(&mut writer, &path).unwrap();
        // About 1,600 pages (three 1 KB rows a page): past the size at which the checkpointer
        // is woken, under the size at which the writer checkpoints.
        write_rows(&mut writer, 12);
        // Without a checkpoint every page stays in the WAL and the database file holds the
        // schema's page alone.
        let database_pages = || std::fs::metadata(&path).unwrap().len() / 4096;
        let deadline = Instant::now() + Duration::from_secs(10);
        while database_pages() < 1_000 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            database_pages() >= 1_000,
            "{} database pages: no background checkpoint ran",
            database_pages()
        );
        let rows: i64 = writer.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 4_800);
    }

    #[test]
    fn the_writer_bounds_the_wal_under_a_steady_stream_of_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SQLITE_DB_FILE);
        let mut writer = new_table(&path);
        start(&mut writer, &path).unwrap();
        // About 6,700 pages, back to back: a background pass alone never catches up with the
        // last commit, so without the writer's own checkpoint the WAL would hold them all.
        write_rows(&mut writer, 50);
        let wal_bytes =
            std::fs::metadata(dir.path().join(format!("{SQLITE_DB_FILE}-wal"))).unwrap().len();
        // A WAL frame is a page and its 24-byte header; one commit of 400 rows is ~140 pages.
        let bound_bytes = (WRITER_CHECKPOINT_PAGES as u64 + 400) * (4096 + 24);
        assert!(
            wal_bytes <= bound_bytes,
            "the WAL grew to {wal_bytes} bytes (bound {bound_bytes})"
        );
        let rows: i64 = writer.query_row("SELECT count(*) FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(rows, 20_000);
    }

    fn new_table(path: &Path) -> Connection {
        let writer = Connection::open(path).unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.execute_batch("CREATE TABLE t (b BLOB NOT NULL)").unwrap();
        writer
    }

    /// Commits `transactions` transactions of 400 rows of 1,000 bytes.
    fn write_rows(writer: &mut Connection, transactions: usize) {
        let row = vec![7u8; 1000];
        for _ in 0..transactions {
            let tx = writer.transaction().unwrap();
            for _ in 0..400 {
                tx.execute("INSERT INTO t(b) VALUES (?1)", [&row]).unwrap();
            }
            tx.commit().unwrap();
        }
    }
}
