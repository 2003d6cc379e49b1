//! Compaction: the store's file is append-only, so without it every message any session ever
//! got stays on disk and is read at every start. Once the file passes
//! [`StoreOptions::bytes_max`], [`Log::compact`] rewrites it as what recovery needs, and
//! nothing else:
//!
//! - per native client, its replay window (the newest `replay_events_max` events, what
//!   recovery keeps anyway) after a [`kind::NATIVE_NEXT`] naming the first one's sequence
//!   number, so numbering goes on even when the window is empty;
//! - per FIX session, its next inbound MsgSeqNum, the highest OrderID it sent
//!   ([`kind::FIX_ORDER_ID_MAX`]), its newest `fix_resend_window` sent messages (older ones
//!   are answered with a gap fill on a ResendRequest) and every ExecutionReport of an order
//!   still open (the ClOrdID map is rebuilt from them at start);
//! - last, every open order of every client ([`kind::OPEN_ORDER`]) for cancel-on-disconnect.
//!
//! Crash safety: the compacted file is written beside the store, synced, then recovered and
//! compared with what the old file recovers (a mismatch keeps the old file), renamed over it
//! and the directory synced. A crash at any point leaves either the old file or the new one
//! whole under the store's name, each holding every record that was durable. Everything
//! written so far goes into the compacted file (the batch is committed first), so nothing
//! held for a sync is lost with the old inode; the syncer is handed the new file.
//!
//! Compaction runs on the I/O thread between units of work (it reads the whole file and
//! writes what it keeps: a pause once per `bytes_max` bytes of traffic, traded for a store
//! and a start-up that no longer grow without bound).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, PoisonError};

use super::{FILE_NAME, Log, Recovered, StoreError, encode_record, kind, recover};
use crate::native::{self, ServerMsg};

/// A FIX session's messages after compaction: (MsgSeqNum, payload offset, length).
pub type FixIndex = Vec<(u64, u64, u32)>;

impl Log {
    /// Whether the file, with the batch not yet written, has passed its bound.
    pub fn compaction_due(&self) -> bool {
        !self.write_failed && self.end + self.pending.len() as u64 >= self.compact_at
    }

    /// Rewrites the store as what recovery needs (module docs) and replaces the file;
    /// returns each FIX session's new index (its kept messages moved). On an error the old
    /// file stays and the next try waits until the file has doubled.
    pub fn compact(&mut self) -> Result<HashMap<u32, FixIndex>, StoreError> {
        let before = self.end;
        let result = self.compact_now();
        match &result {
            Ok(_) => {
                tracing::info!(path = %self.path.display(), before, after = self.end, "gateway store compacted")
            }
            Err(_) => self.compact_at = before.saturating_mul(2).max(self.options.bytes_max),
        }
        result
    }

    fn compact_now(&mut self) -> Result<HashMap<u32, FixIndex>, StoreError> {
        self.commit();
        let path = self.path.clone();
        let io = |source| StoreError::Io { path: path.display().to_string(), source };
        let mismatch =
            |why: String| StoreError::CompactionMismatch { path: path.display().to_string(), why };
        if self.write_failed {
            return Err(mismatch("a write failed: the store holds all output".into()));
        }
        // The pending batch's offsets name the old file: it must be written first.
        if self.refusing {
            return Err(mismatch("a full disk refused the pending batch".into()));
        }
        let replay_events_max = self.options.replay_events_max;
        // A handle of its own: the store's handle appends, its position is at the end.
        let (old, scanned) =
            recover(&File::open(&path).map_err(io)?, replay_events_max).map_err(io)?;
        let end = scanned.end;
        if end != self.end {
            return Err(mismatch(format!("read {end} valid bytes of {}", self.end)));
        }
        let temp = path.with_file_name(format!("{FILE_NAME}.compact"));
        let written = self.compacted(&old).and_then(|bytes| write_synced(&temp, &bytes));
        written.map_err(io)?;
        let (kept, kept_scanned) =
            recover(&File::open(&temp).map_err(io)?, replay_events_max).map_err(io)?;
        let kept_end = kept_scanned.end;
        if let Err(why) = same_recovery(&old, &kept) {
            let _ = std::fs::remove_file(&temp);
            return Err(mismatch(why));
        }
        std::fs::rename(&temp, &path).map_err(io)?;
        self.adopt(kept_end)?;
        Ok(kept.fix.into_iter().map(|(client, fix)| (client, fix.index)).collect())
    }

    /// Switches to the compacted file now under the store's name. Past the rename, a
    /// failure leaves the store holding all output: writes to the old, unlinked file would be
    /// lost.
    fn adopt(&mut self, end: u64) -> Result<(), StoreError> {
        let io = |source| StoreError::Io { path: self.path.display().to_string(), source };
        let dir = self.path.parent().unwrap_or(std::path::Path::new("."));
        let opened = File::open(dir).and_then(|dir| dir.sync_all()).and_then(|()| {
            let file = OpenOptions::new().read(true).append(true).open(&self.path)?;
            Ok((file.try_clone()?, file))
        });
        let (for_syncer, file) = opened.map_err(|error| {
            tracing::error!(path = %self.path.display(), %error, "gateway store: reopening after compaction failed; holding all output");
            self.write_failed = true;
            io(error)
        })?;
        if let Some((shared, _)) = &self.sync {
            *shared.file.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(for_syncer);
        }
        self.file = file;
        self.end = end;
        // Synced whole before the rename; nothing written to the old file is pending.
        self.synced_end = end;
        self.unsynced.clear();
        self.compact_at = end.saturating_mul(2).max(self.options.bytes_max);
        Ok(())
    }

    /// The compacted file's bytes for what `old` recovered.
    fn compacted(&self, old: &Recovered) -> std::io::Result<Vec<u8>> {
        // A marked store (`record::scan`): one batch, whole, between its two markers.
        let mut out = Vec::new();
        crate::record::end_batch(&mut out, 0);
        let mut frame = Vec::with_capacity(native::FRAME_BYTES_MAX);
        for (&client, stream) in sorted(&old.native) {
            let first = stream.next_seq.saturating_sub(stream.events.len() as u64);
            encode_record(&mut out, kind::NATIVE_NEXT, client, &[&first.to_le_bytes()]);
            for (seq, event) in (first..).zip(&stream.events) {
                frame.clear();
                native::encode_server(&ServerMsg::Sequenced { seq, event: *event }, &mut frame);
                encode_record(&mut out, kind::NATIVE_EVENT, client, &[&frame]);
            }
            if stream.reserved > stream.next_seq {
                let reserved = stream.reserved.to_le_bytes();
                encode_record(&mut out, kind::NATIVE_RESERVED, client, &[&reserved]);
            }
        }
        let window = self.options.fix_resend_window;
        for (&client, fix) in sorted(&old.fix) {
            encode_record(&mut out, kind::FIX_NEXT_IN, client, &[&fix.next_in.to_le_bytes()]);
            let max = fix.order_id_max.to_le_bytes();
            encode_record(&mut out, kind::FIX_ORDER_ID_MAX, client, &[&max]);
            if fix.next_out_reserved > 0 {
                let reserved = fix.next_out_reserved.to_le_bytes();
                encode_record(&mut out, kind::FIX_NEXT_OUT, client, &[&reserved]);
            }
            let open = old.open.get(&client);
            let window_from = fix.index.len().saturating_sub(window);
            for (at, &(seq, offset, len)) in fix.index.iter().enumerate() {
                let order_id = fix.order_ids.get(at).copied().unwrap_or(0);
                let of_open_order =
                    order_id != 0 && open.is_some_and(|o| o.contains_key(&order_id));
                if at >= window_from || of_open_order {
                    let message = self.read_at(offset, len as usize)?;
                    encode_record(
                        &mut out,
                        kind::FIX_SENT,
                        client,
                        &[&seq.to_le_bytes(), &message],
                    );
                }
            }
        }
        let mut routed: Vec<_> = old.routed.iter().collect();
        routed.sort_unstable_by_key(|(key, _)| **key);
        for (&(shard, slot), &position) in routed {
            let payload = crate::routed::encode(shard, slot, position);
            encode_record(&mut out, kind::ROUTED, 0, &[&payload]);
        }
        for (&client, open) in sorted(&old.open) {
            for (&token, &instrument) in sorted(open) {
                let parts: [&[u8]; 2] = [&token.to_le_bytes(), &instrument.to_le_bytes()];
                encode_record(&mut out, kind::OPEN_ORDER, client, &parts);
            }
        }
        // The file is synced whole before it replaces the store: its end claims all of it.
        let whole = out.len() as u64;
        crate::record::end_batch(&mut out, whole);
        Ok(out)
    }
}

/// A map's entries by key (the compacted file is the same for the same state).
fn sorted<V>(map: &HashMap<u32, V>) -> Vec<(&u32, &V)> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_unstable_by_key(|(key, _)| **key);
    entries
}

/// Writes `bytes` as the whole of a new file at `path` and syncs it.
fn write_synced(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Whether the compacted file recovers what the old one did: the same native streams and
/// open orders, and per FIX session the same sequence numbers and highest OrderID.
fn same_recovery(old: &Recovered, kept: &Recovered) -> Result<(), String> {
    if old.native != kept.native {
        return Err("the native streams differ".into());
    }
    if old.routed != kept.routed {
        return Err("the routed reports' positions differ".into());
    }
    let open = |r: &Recovered| -> HashMap<u32, HashMap<u32, u32>> {
        r.open.iter().filter(|(_, o)| !o.is_empty()).map(|(c, o)| (*c, o.clone())).collect()
    };
    if open(old) != open(kept) {
        return Err("the open orders differ".into());
    }
    for (client, fix) in &old.fix {
        let Some(compacted) = kept.fix.get(client) else {
            return Err(format!("FIX session {client} is missing"));
        };
        let last = |index: &FixIndex| index.last().map(|m| m.0);
        let same = (fix.next_in, fix.order_id_max, last(&fix.index))
            == (compacted.next_in, compacted.order_id_max, last(&compacted.index));
        if !same {
            return Err(format!("FIX session {client}'s sequence numbers differ"));
        }
    }
    Ok(())
}
