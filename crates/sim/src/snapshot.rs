//! The engines' snapshots and the log's trim: every engine snapshots its replica every
//! `snapshot_every` inputs into the broker's snapshot store (the newest kept), notes its
//! progress every lease period, and the leader trims its shard's log after its snapshot by
//! production's rule (`replication::snapshot::trim_keep_from`, below the snapshot and every
//! live progress note). A restarting engine continues from the newest snapshot when its
//! journal ends before it. The invariant `trim-never-past-need` is checked at every trim and
//! every read.

use replication::snapshot::EngineSnapshot;

use crate::check::Invariant;
use crate::journal::EngineJournal;
use crate::msg::{Addr, Timer};
use crate::world::World;

impl World {
    /// Engine `n` notes how far it applied its shard's log (production's `note_progress`,
    /// every lease period; a note lives `PROGRESS_TTL`).
    pub(crate) fn note_progress(&mut self, n: usize) {
        if self.broker.available(self.now_ns) {
            let (shard, applied) = (self.engines[n].shard, self.engines[n].applied);
            self.broker.note_progress(shard, n, applied, self.now_ns);
        }
    }

    /// After `snapshot_every` inputs since its last one, engine `n` stores a snapshot of its
    /// replica and notes its progress; the leader then trims the log (a deposed one never
    /// does: production's `SnapshotTaker::write`).
    pub(crate) fn snapshot_if_due(&mut self, n: usize) {
        let every = self.settings.snapshot_every;
        let engine = &self.engines[n];
        let due = every > 0 && engine.applied - engine.snapshot_taken >= every;
        if !due || engine.pending_put.is_some() || !self.broker.available(self.now_ns) {
            return;
        }
        let snapshot = engine.replica.snapshot();
        self.engines[n].snapshot_taken = snapshot.stream_seq;
        match self.object_store_delay() {
            0 => self.put_snapshot(n, snapshot),
            delay_ns => {
                self.engines[n].pending_put = Some(snapshot);
                self.timer(Addr::Engine(n), delay_ns, Timer::SnapshotPut);
            }
        }
    }

    /// Engine `n`'s put of `snapshot` completes: stored (unless the object store or the
    /// broker fails it: production warns and neither notes nor trims), its progress noted,
    /// and the leader (checked now, after the put, as production's gate is) trims the log.
    pub(crate) fn put_snapshot(&mut self, n: usize, snapshot: EngineSnapshot) {
        let (shard, seq) = (self.engines[n].shard, snapshot.stream_seq);
        if !self.broker.available(self.now_ns) || self.object_store_fails() {
            self.snapshot_puts_failed += 1;
            self.note(format!("engine {n}: the snapshot put at input {seq} failed"));
            return;
        }
        self.broker.put_snapshot(shard, snapshot);
        self.broker.note_progress(shard, n, seq, self.now_ns);
        self.snapshots += 1;
        if self.engines[n].epoch(self.now_ns).is_none() {
            return;
        }
        let before = self.broker.shards[shard].first_seq;
        let first_seq = self.broker.trim(shard, seq, self.now_ns);
        if first_seq > before {
            self.trims += 1;
            self.note(format!("engine {n} trims shard {shard}'s log to start at {first_seq}"));
            self.check_trim(shard, first_seq);
        }
    }

    /// Whether an object-store operation fails now (an `object-store` fault's share).
    pub(crate) fn object_store_fails(&mut self) -> bool {
        let (share, until) = self.net.object_store;
        self.now_ns < until && self.rng.chance(share)
    }

    /// How long an object-store put takes now, ns (0: at once; up to 2 s during a fault).
    fn object_store_delay(&mut self) -> u64 {
        if self.now_ns < self.net.object_store.1 {
            self.rng.range(1_000_000, 2_000_000_000)
        } else {
            0
        }
    }

    /// `trim-never-past-need`: every live engine of `shard` (paused ones too) and its newest
    /// snapshot still find every input they need after the log now starting at `first_seq`.
    fn check_trim(&mut self, shard: usize, first_seq: u64) {
        let snapshot_seq = self.broker.shards[shard].snapshot.as_ref().map_or(0, |s| s.stream_seq);
        if snapshot_seq + 1 < first_seq {
            let detail = format!(
                "shard {shard}'s log trimmed to start at {first_seq}, its newest snapshot is at \
                 {snapshot_seq}"
            );
            return self.checker.fail(Invariant::TrimPastNeed, self.now_ns, detail);
        }
        let behind = self.engines.iter().enumerate().find(|(_, engine)| {
            engine.shard == shard && engine.life.up && engine.applied + 1 < first_seq
        });
        if let Some((n, engine)) = behind {
            let detail = format!(
                "shard {shard}'s log trimmed to start at {first_seq}; engine {n} (up{}) needs it \
                 from {}",
                if engine.life.paused { ", paused" } else { "" },
                engine.applied + 1
            );
            self.checker.fail(Invariant::TrimPastNeed, self.now_ns, detail);
        }
    }

    /// A starting engine `n` whose journal ends before its shard's newest snapshot continues
    /// from that snapshot (a new journal after it), then notes its progress before it reads
    /// the log, as production's `starting_point` does.
    pub(crate) fn restore_if_behind(&mut self, n: usize) {
        let shard = self.engines[n].shard;
        let newest = self.broker.shards[shard].snapshot.as_ref();
        if let Some(snapshot) = newest.filter(|s| s.stream_seq > self.engines[n].applied) {
            let seq = snapshot.stream_seq;
            let snapshot = snapshot.clone();
            let engine = &mut self.engines[n];
            engine.restore(&self.settings.tier, &snapshot);
            engine.journal = EngineJournal::starting_at(seq + 1);
            engine.journal_snapshot = Some(snapshot);
            self.note(format!("engine {n} restores shard {shard}'s snapshot at input {seq}"));
        }
        let applied = self.engines[n].applied;
        self.broker.note_progress(shard, n, applied, self.now_ns);
    }
}
