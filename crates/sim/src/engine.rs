//! An engine of the shard's group: the production tier replica (`GroupReplica`, which numbers
//! each gateway's reports as the group's publishers do) over the broker's log, leading through
//! the production lease core and publishing with its epoch.

use std::time::Duration;

use delivery::publish::{
    RegeneratedAnswer, RegenerationFailed, RetainSource, regenerated_answer, retain_source,
    subject_index, window_part,
};
use delivery::wire::{RetainRequest, Stream};
use exchange::msg::{Audience, CoreOutput, InboundOrder};
use replication::follow::LoggedOrder;
use replication::replay::{GroupReplica, REGENERATE_RECORDS_MAX};
use replication::snapshot::EngineSnapshot;

use crate::check::Invariant;
use crate::journal::EngineJournal;
use crate::msg::{Addr, Batch, Event, Msg, Timer};
use crate::process::{LeaseRequest, Life, SimEngine};
use crate::world::World;

/// How often an engine reads the log when it has caught up, ns.
const POLL_NS: u64 = 5_000_000;
/// How long an engine waits for a read's answer before asking again, ns.
const READ_TIMEOUT_NS: u64 = 100_000_000;
/// A leader's heartbeat period, ns.
const HEARTBEAT_NS: u64 = 100_000_000;
/// How long an engine's supervisor waits before starting it again after it exited, ns.
const ENGINE_RESTART_NS: u64 = 1_000_000_000;
/// Most reports per batch.
const BATCH_MAX: usize = 256;

impl World {
    /// Starts (or restarts) engine `n`: what its journal recovers, then the log after it.
    pub fn start_engine(&mut self, n: usize) {
        // Production's `starting_point` reads the newest snapshot first; a failed read ends
        // the process with the error, and its supervisor starts it again.
        if self.object_store_fails() {
            self.note(format!("engine {n}: reading the newest snapshot failed; it exits"));
            self.at(ENGINE_RESTART_NS, Event::Start(Addr::Engine(n)));
            return;
        }
        let ttl = Duration::from_nanos(self.settings.lease_ttl_ns);
        let life = std::mem::take(&mut self.engines[n].life);
        let journal = std::mem::take(&mut self.engines[n].journal);
        let journal_snapshot = self.engines[n].journal_snapshot.take();
        let next_request = self.engines[n].next_request;
        let shard = self.engines[n].shard;
        self.engines[n] = SimEngine::new(&self.settings.tier, ttl, shard);
        self.recover_journal(n, journal, journal_snapshot);
        self.restore_if_behind(n);
        let engine = &mut self.engines[n];
        engine.life =
            Life { up: true, paused: false, inc: life.inc + 1, stash: Vec::new(), ..life };
        engine.next_request = next_request;
        self.note(format!("engine {n} starts"));
        let jitter = self.rng.range(0, self.settings.renew_ns);
        self.timer(Addr::Engine(n), jitter, Timer::Lease);
        self.timer(Addr::Engine(n), 0, Timer::Poll);
        self.timer(Addr::Engine(n), HEARTBEAT_NS, Timer::Heartbeat);
    }

    /// Stops engine `n`: cleanly (its lease released, its journal synced) or by a crash (its
    /// machine's power: the journal's unsynced writes are lost).
    pub fn stop_engine(&mut self, n: usize, clean: bool) {
        if clean && let Some(target) = self.engines[n].lease.release() {
            let shard = self.engines[n].shard;
            self.send_nats(Addr::Engine(n), Addr::Broker, 0, Msg::Release { shard, target });
        }
        if clean {
            self.engines[n].journal.clean_stop(self.now_ns);
            self.checker.durable(n, self.engines[n].journal.acked);
        } else {
            self.engines[n].journal.power_loss(None);
        }
        let engine = &mut self.engines[n];
        engine.life.up = false;
        engine.life.paused = false;
        engine.life.stash.clear();
        let how = if clean { "stops" } else { "crashes" };
        self.note(format!("engine {n} {how}"));
    }

    pub(crate) fn engine_timer(&mut self, n: usize, timer: Timer) {
        match timer {
            Timer::Lease => {
                self.note_progress(n);
                self.keep_lease(n);
                self.timer(Addr::Engine(n), self.settings.renew_ns, Timer::Lease);
            }
            Timer::Poll => {
                self.engines[n].journal.write(self.now_ns);
                self.journal_sync(n);
                self.poll(n);
            }
            Timer::JournalSynced(id) => {
                if let Some(acked) = self.engines[n].journal.synced(id) {
                    self.checker.durable(n, acked);
                    self.publish(n);
                }
                self.journal_sync(n);
            }
            Timer::Heartbeat => {
                self.heartbeat(n);
                self.timer(Addr::Engine(n), HEARTBEAT_NS, Timer::Heartbeat);
            }
            Timer::SnapshotPut => {
                if let Some(snapshot) = self.engines[n].pending_put.take() {
                    self.put_snapshot(n, snapshot);
                }
            }
            _ => {}
        }
    }

    /// A lease tick: renew a held lease or contend for a free one (one write in flight; one
    /// unanswered for a renewal period is given up, as the production tick's timeout does).
    fn keep_lease(&mut self, n: usize) {
        let now = self.now_ns;
        let engine = &mut self.engines[n];
        if engine.request.is_some_and(|r| now - r.sent_ns < self.settings.renew_ns) {
            return;
        }
        let started = engine.life.clock.monotonic(now);
        let held = engine.lease.valid_until(started).is_some();
        let expected = match (held, engine.lease.renewal()) {
            (true, Some(revision)) => revision,
            _ => engine.lease.begin_acquire(),
        };
        engine.next_request += 1;
        let id = engine.next_request;
        engine.request = Some(LeaseRequest { id, renewal: held, started, sent_ns: now });
        let msg = Msg::Cas { shard: engine.shard, engine: n, request: id, expected };
        self.send_nats(Addr::Engine(n), Addr::Broker, 0, msg);
        self.note_leadership(n);
    }

    fn poll(&mut self, n: usize) {
        let now = self.now_ns;
        let engine = &mut self.engines[n];
        if engine.read_sent_ns.is_none_or(|sent| now - sent >= READ_TIMEOUT_NS) {
            engine.read_sent_ns = Some(now);
            let from = engine.applied + 1;
            let msg = Msg::Read { shard: engine.shard, engine: n, from };
            self.send_nats(Addr::Engine(n), Addr::Broker, 0, msg);
        }
        self.timer(Addr::Engine(n), POLL_NS, Timer::Poll);
    }

    pub(crate) fn engine_receives(&mut self, n: usize, msg: Msg) {
        match msg {
            Msg::Records { from, orders } => self.apply(n, from, &orders),
            Msg::CasReply { request, outcome } => {
                let engine = &mut self.engines[n];
                let Some(sent) = engine.request.filter(|sent| sent.id == request) else { return };
                engine.request = None;
                if sent.renewal {
                    engine.lease.renewed(outcome, sent.started);
                } else {
                    engine.lease.acquired(outcome, sent.started);
                }
                self.note_leadership(n);
                self.publish(n);
            }
            Msg::Retain { gateway, from, .. } => self.answer_retain(n, gateway, from),
            _ => {}
        }
    }

    fn apply(&mut self, n: usize, from: u64, orders: &[InboundOrder]) {
        let engine = &mut self.engines[n];
        engine.read_sent_ns = None;
        if from != engine.applied + 1 {
            return;
        }
        self.apply_inputs(n, orders, true);
        self.journal_sync(n);
        self.publish(n);
        self.snapshot_if_due(n);
        if orders.len() == self.settings.read_max {
            self.poll(n);
        }
    }

    /// Applies `orders` (the next inputs) to the replica, numbering each gateway's reports;
    /// `journaled`: write them to the journal (`false`: they came from it).
    fn apply_inputs(&mut self, n: usize, orders: &[InboundOrder], journaled: bool) {
        let now = self.now_ns;
        let engine = &mut self.engines[n];
        let shard = engine.shard;
        let mut numbered = Vec::new();
        for order in orders {
            let stream_seq = engine.applied + 1;
            let logged = LoggedOrder {
                stream_seq,
                last_in_message: true,
                order: *order,
                intended_abs_ns: 0,
            };
            let (retained, inputs) = (&mut engine.retained, &mut engine.retained_inputs);
            engine.replica.apply(&logged, &mut |index, seq, response| {
                let gateway = response.outlet as usize;
                if response.audience == Audience::Client
                    && index == subject_index(response.outlet, Stream::Reports)
                {
                    let output = CoreOutput { shard: shard as u32, ..response.output };
                    retained[gateway].push(output);
                    inputs[gateway].push(stream_seq);
                    numbered.push((gateway, seq, output));
                }
            });
            engine.applied = stream_seq;
            if journaled {
                engine.journal.queue(*order);
            }
        }
        engine.journal.write(now);
        for (gateway, seq, output) in numbered {
            self.checker.numbered(shard, gateway, seq, &output, now);
        }
    }

    /// Flips bytes of a durable sector of engine `n`'s journal, among the records its durable
    /// slots prove durable (above them, a damaged last record is indistinguishable from a
    /// write torn by the power failure, and production truncates it: docs/SIMULATION.md).
    pub(crate) fn corrupt_journal(&mut self, n: usize) {
        let end = self.engines[n].journal.proven_durable_end();
        let start = journal::segment::SEGMENT_HEADER_BYTES as usize;
        if end <= start {
            return;
        }
        let at = self.rng.range(start as u64, end as u64) as usize;
        self.engines[n].journal.disk.flip(at, &mut self.rng);
        self.note(format!("engine {n}: journal bytes at offset {at} flipped"));
    }

    /// Starts a journal sync if one is due; it completes after the disk's delay.
    fn journal_sync(&mut self, n: usize) {
        if let Some(id) = self.engines[n].journal.begin_sync() {
            let sync_ns = self.rng.range(200_000, 3_000_000);
            self.timer(Addr::Engine(n), sync_ns, Timer::JournalSynced(id));
        }
    }

    /// Restarting engine `n` recovers its journal through the production scan: every input it
    /// acknowledged durable comes back, or the scan refuses (a loss reported: the engine
    /// starts a new journal and replays the log).
    fn recover_journal(
        &mut self,
        n: usize,
        mut journal: EngineJournal,
        journal_snapshot: Option<EngineSnapshot>,
    ) {
        let acked = self.checker.durable_acked[n];
        match journal.recover() {
            Ok(recovered) => {
                if let Some(snapshot) = &journal_snapshot {
                    self.engines[n].restore(&self.settings.tier, snapshot);
                }
                self.engines[n].journal_snapshot = journal_snapshot;
                let first = recovered.first_seq;
                let last = first - 1 + recovered.orders.len() as u64;
                if last < acked {
                    let detail = format!(
                        "engine {n} acknowledged inputs up to {acked} as durable; its journal's \
                         recovery returned {last} and reported no loss"
                    );
                    self.checker.fail(Invariant::DurableDropped, self.now_ns, detail);
                }
                let log = &self.broker.shards[self.engines[n].shard].log;
                let skip = (first - 1) as usize;
                if let Some(at) = (0..recovered.orders.len())
                    .find(|&at| log.get(skip + at) != Some(&recovered.orders[at]))
                {
                    let seq = first + at as u64;
                    let detail =
                        format!("engine {n}'s journal recovered input {seq} unlike the log's");
                    self.checker.fail(Invariant::DurableDropped, self.now_ns, detail);
                }
                let torn = if recovered.torn_tail { " (a torn tail truncated)" } else { "" };
                if last > 0 || recovered.torn_tail {
                    self.note(format!(
                        "engine {n} recovers inputs {first}..={last} from its journal{torn}"
                    ));
                }
                self.engines[n].journal = journal;
                self.apply_inputs(n, &recovered.orders, false);
            }
            Err(reason) => {
                self.note(format!(
                    "engine {n}: its journal's recovery refuses ({reason}): the loss is reported; \
                     a new journal, the log replayed"
                ));
                self.checker.loss_reported(n);
                self.engines[n].journal = EngineJournal::created();
            }
        }
    }

    /// Hands every new report to the publisher: sent with the epoch while the lease is
    /// valid, withheld (sequenced and retained only) otherwise.
    fn publish(&mut self, n: usize) {
        let epoch = self.engines[n].epoch(self.now_ns);
        for gateway in 0..self.gateways.len() {
            loop {
                let engine = &mut self.engines[n];
                let (done, all) = (engine.published[gateway], engine.releasable(gateway));
                if done == all {
                    break;
                }
                let upto = all.min(done + BATCH_MAX as u64);
                engine.published[gateway] = upto;
                let Some(epoch) = epoch else { continue };
                let outputs = engine.retained_from(gateway, done + 1, upto - done).to_vec();
                let shard = engine.shard;
                let batch = Batch {
                    shard,
                    epoch,
                    first_seq: done + 1,
                    last_seq: all,
                    outputs,
                    reply: None,
                };
                self.send_batch(n, gateway, batch);
            }
        }
    }

    fn heartbeat(&mut self, n: usize) {
        let Some(epoch) = self.engines[n].epoch(self.now_ns) else { return };
        for gateway in 0..self.gateways.len() {
            let last_seq = self.engines[n].published[gateway];
            let (shard, first_seq) = (self.engines[n].shard, last_seq + 1);
            let batch =
                Batch { shard, epoch, first_seq, last_seq, outputs: Vec::new(), reply: None };
            self.send_batch(n, gateway, batch);
        }
    }

    /// The leader's retain service (production's `Shared::answer`): a range older than the
    /// window of the last `retain_records` reports (`retain_source`) is recomputed from the
    /// newest snapshot and the log; when it cannot be (the snapshot is past it), or the range
    /// is the window's, the window's part answers (`window_part`), from its oldest record on:
    /// the gateway resyncs what lies before. A regeneration that fails (a snapshot read)
    /// answers no records numbered where the gateway asked (`regenerated_answer`'s retry):
    /// the gateway asks again.
    fn answer_retain(&mut self, n: usize, gateway: usize, from: u64) {
        let Some(epoch) = self.engines[n].epoch(self.now_ns) else { return };
        let next_seq = self.engines[n].releasable(gateway) + 1;
        let base = self.engines[n].retained_base[gateway];
        let oldest = next_seq.saturating_sub(self.settings.retain_records).max(base + 1);
        let request = RetainRequest { from_seq: from.max(1), to_seq: next_seq - 1 };
        let regenerated = match retain_source(&request, oldest, true) {
            RetainSource::Regenerate { from, last } => {
                let last = last.min(from + BATCH_MAX as u64 - 1);
                let regenerated = self.regenerate(n, gateway, from, last);
                match (regenerated_answer(&regenerated), regenerated) {
                    (RegeneratedAnswer::Records, Ok(records)) => Some((from, records)),
                    // Production's "nothing yet": no records, numbered where it asked.
                    (RegeneratedAnswer::Retry, _) => Some((from, Vec::new())),
                    _ => None,
                }
            }
            RetainSource::Window => None,
        };
        let (first_seq, outputs) = regenerated.unwrap_or_else(|| {
            // No records (count 0) when the gateway is ahead of this engine (a leader
            // still catching up): numbered where it asked.
            let (first_seq, count) = window_part(&request, oldest, next_seq);
            let count = count.min(BATCH_MAX as u64);
            (first_seq, self.engines[n].retained_from(gateway, first_seq, count).to_vec())
        });
        let shard = self.engines[n].shard;
        let last_seq = next_seq - 1;
        let batch = Batch { shard, epoch, first_seq, last_seq, outputs, reply: Some(from) };
        self.send_batch(n, gateway, batch);
    }

    /// Gateway `gateway`'s reports `from..=last` recomputed from the log through a fresh
    /// group replica, as production's `replication::replay::Regenerator` does: one run
    /// recomputes up to `REGENERATE_RECORDS_MAX` records from `from` and is kept for the
    /// requests that follow (no snapshot: from the log's start; the log read is instant here).
    /// Each record is checked against the numbering every engine gave it.
    fn regenerate(
        &mut self,
        n: usize,
        gateway: usize,
        from: u64,
        last: u64,
    ) -> Result<Vec<CoreOutput>, RegenerationFailed> {
        let kept = self.engines[n].regenerated.as_ref().filter(|(subject, first, records)| {
            *subject == gateway && *first <= from && last < first + records.len() as u64
        });
        if let Some((_, first, records)) = kept {
            return Ok(records[(from - first) as usize..=(last - first) as usize].to_vec());
        }
        let records = self.replay(n, gateway, from)?;
        self.regenerated += records.len() as u64;
        let wanted = records.iter().take((last + 1 - from) as usize).copied().collect();
        self.engines[n].regenerated = Some((gateway, from, records));
        Ok(wanted)
    }

    /// Replays engine `n`'s shard's log (what it applied) from the newest snapshot for
    /// gateway `gateway`'s reports from `from` on, at most `REGENERATE_RECORDS_MAX`; none
    /// when the snapshot is past `from` (the inputs before it were trimmed away), as
    /// production's `Regenerator` does.
    fn replay(
        &mut self,
        n: usize,
        gateway: usize,
        from: u64,
    ) -> Result<Vec<CoreOutput>, RegenerationFailed> {
        // Production's `Regenerator` reads the newest snapshot; a failed read fails the
        // regeneration (`regenerated_answer`: the leader answers "nothing yet").
        if self.settings.regenerator_read_faults && self.object_store_fails() {
            self.note(format!("engine {n}: regenerating from the newest snapshot: read failed"));
            return Err(RegenerationFailed("the snapshot read failed".into()));
        }
        let (applied, shard) = (self.engines[n].applied as usize, self.engines[n].shard);
        let snapshot = self.broker.shards[shard].snapshot.as_ref();
        let mut replica = GroupReplica::starting(&self.settings.tier, snapshot)
            .expect("a snapshot of this tier (the group writes only its own)");
        let index = subject_index(gateway as u32, Stream::Reports);
        if replica.next_seq(index) > from {
            return Ok(Vec::new());
        }
        let after = (replica.applied_seq() as usize).min(applied);
        let last = from + REGENERATE_RECORDS_MAX - 1;
        let mut outputs = Vec::new();
        for (at, order) in self.broker.shards[shard].log[after..applied].iter().enumerate() {
            if replica.next_seq(index) > last {
                break;
            }
            let stream_seq = (after + at) as u64 + 1;
            let logged = LoggedOrder {
                stream_seq,
                last_in_message: true,
                order: *order,
                intended_abs_ns: 0,
            };
            replica.apply(&logged, &mut |subject, seq, response| {
                if subject == index && (from..=last).contains(&seq) {
                    outputs.push((seq, CoreOutput { shard: shard as u32, ..response.output }));
                }
            });
        }
        for (seq, output) in &outputs {
            self.checker.numbered(shard, gateway, *seq, output, self.now_ns);
        }
        Ok(outputs.into_iter().map(|(_, output)| output).collect())
    }

    /// Publishes `batch`, checking first that no other engine of the group may publish now
    /// under another epoch.
    fn send_batch(&mut self, n: usize, gateway: usize, batch: Batch) {
        let now = self.now_ns;
        for (other, engine) in self.engines.iter().enumerate() {
            if other == n || engine.shard != self.engines[n].shard {
                continue;
            }
            if let Some(theirs) = engine.epoch(now).filter(|theirs| *theirs != batch.epoch) {
                let detail = format!(
                    "engine {n} publishes under epoch {} while engine {other} holds epoch {theirs}",
                    batch.epoch
                );
                self.checker.fail(Invariant::OneEpoch, now, detail);
            }
        }
        self.send_nats(Addr::Engine(n), Addr::Gateway(gateway), 0, Msg::Batch(Box::new(batch)));
    }

    fn note_leadership(&mut self, n: usize) {
        let epoch = self.engines[n].epoch(self.now_ns);
        if epoch != self.engines[n].leading {
            self.engines[n].leading = epoch;
            let line = match epoch {
                Some(epoch) => format!("engine {n} leads (epoch {epoch})"),
                None => format!("engine {n} no longer leads"),
            };
            self.note(line);
        }
    }
}
