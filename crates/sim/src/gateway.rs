//! A gateway without a tier: clients' orders appended to the log (de-duplicated by message
//! id, resent until acknowledged), reports read through the production epoch fence
//! (`delivery::edge::EpochFence`), recovered from the leader's window on a gap, routed
//! through the production routed positions (`gateway::routed::RoutedPositions`) and kept in
//! a store whose unsynced writes a crash loses.

use delivery::edge::Fenced;
use delivery::publish::subject_index;
use delivery::wire::Stream;
use exchange::msg::InboundOrder;
use gateway::routed::{DurableInputs, RoutedPositions};

use crate::check::Invariant;
use crate::msg::{Addr, Batch, Msg, Timer};
use crate::process::{Feed, Unwritten};
use crate::world::World;

/// The gateway's retry period, ns.
const RETRY_NS: u64 = 100_000_000;
/// How long an append or a retain request waits for its answer before it is sent again, ns.
const RESEND_AFTER_NS: u64 = 300_000_000;

impl World {
    /// Starts (or restarts) gateway `n` from its durable store.
    pub fn start_gateway(&mut self, n: usize) {
        self.recover_store(n);
        let (slots, shards) = (self.settings.tier.outlets, self.settings.shards as u32);
        let gateway = &mut self.gateways[n];
        gateway.life.up = true;
        gateway.life.paused = false;
        gateway.life.inc += 1;
        // Production's draw, through its seam, from the run's one seeded generator.
        gateway.run_id = gateway::new_run_id(&mut self.rng);
        gateway.feeds = gateway.durable.restart_seqs.iter().map(|seq| Feed::from(*seq)).collect();
        gateway.routed = RoutedPositions::recovered(gateway.durable.positions.clone());
        gateway.routed.share(DurableInputs::new(shards, slots));
        gateway.pending.clear();
        gateway.unwritten = Unwritten::default();
        gateway.sessions.fill(None);
        gateway.appends.clear();
        let from = gateway.durable.restart_seqs.clone();
        self.note(format!("gateway {n} starts, reading each shard's reports from {from:?}"));
        self.timer(Addr::Gateway(n), RETRY_NS, Timer::Retry);
    }

    /// Stops gateway `n`; a crash loses its unsynced writes (a clean stop syncs them first).
    pub fn stop_gateway(&mut self, n: usize, clean: bool) {
        if clean {
            self.synced(n, u64::MAX);
        } else {
            self.store_power_loss(n);
        }
        let gateway = &mut self.gateways[n];
        gateway.life.up = false;
        gateway.life.paused = false;
        gateway.life.stash.clear();
        gateway.pending.clear();
        // Never written, never sent: gone with the process (production's pending batch).
        gateway.unwritten = Unwritten::default();
        let how = if clean { "stops" } else { "crashes" };
        self.note(format!("gateway {n} {how}"));
        for client in 0..self.clients.len() {
            if self.clients[client].gateway == n {
                self.disconnect(client);
            }
        }
    }

    pub(crate) fn gateway_timer(&mut self, n: usize, timer: Timer) {
        match timer {
            Timer::Retry => {
                let now = self.now_ns;
                let stale: Vec<(u64, InboundOrder)> = self.gateways[n]
                    .appends
                    .iter_mut()
                    .filter(|(_, (_, sent))| now - *sent >= RESEND_AFTER_NS)
                    .map(|(counter, (order, sent))| {
                        *sent = now;
                        (*counter, *order)
                    })
                    .collect();
                for (counter, order) in stale {
                    self.append(n, counter, order);
                }
                for shard in 0..self.settings.shards {
                    let sent = self.gateways[n].feeds[shard].retain_sent_ns;
                    if sent.is_some_and(|sent| now - sent >= RESEND_AFTER_NS) {
                        self.ask_retain(n, shard);
                    }
                }
                // Production tries a refused batch again at its next commit (a read, a routed
                // batch, a timer): here at this timer, or at the next batch.
                if !self.gateways[n].unwritten.bytes.is_empty() {
                    self.write_unwritten(n);
                }
                self.timer(Addr::Gateway(n), RETRY_NS, Timer::Retry);
            }
            Timer::Synced(epoch) => self.synced(n, epoch),
            _ => {}
        }
    }

    pub(crate) fn gateway_receives(&mut self, n: usize, conn: u32, msg: Msg) {
        match msg {
            Msg::Hello { client, last_seq } => self.native_login(n, conn, client, last_seq),
            Msg::Logon { client } => self.fix_logon(n, conn, client),
            Msg::ResendRequest { client, begin } => self.fix_resend(n, conn, client, begin),
            Msg::Order { order, .. } => {
                let gateway = &mut self.gateways[n];
                gateway.next_counter += 1;
                let counter = gateway.next_counter;
                gateway.appends.insert(counter, (order, self.now_ns));
                self.append(n, counter, order);
            }
            Msg::AppendAck { counter } => {
                self.gateways[n].appends.remove(&counter);
            }
            Msg::Batch(batch) => self.on_batch(n, &batch),
            _ => {}
        }
    }

    fn append(&mut self, n: usize, counter: u64, order: InboundOrder) {
        let (run, run_id) = (self.gateways[n].life.inc, self.gateways[n].run_id);
        let shard = order.instrument as usize % self.settings.shards;
        let msg = Msg::Append { shard, gateway: n, run, run_id, counter, order };
        self.send_nats(Addr::Gateway(n), Addr::Broker, 0, msg);
    }

    /// Asks `shard`'s engines for its retained reports from the feed's next on (the leader
    /// answers).
    fn ask_retain(&mut self, n: usize, shard: usize) {
        let feed = &mut self.gateways[n].feeds[shard];
        feed.retain_sent_ns = Some(self.now_ns);
        let from = feed.next_seq;
        for engine in 0..self.engines.len() {
            if self.engines[engine].shard == shard {
                let msg = Msg::Retain { shard, gateway: n, from };
                self.send_nats(Addr::Gateway(n), Addr::Engine(engine), 0, msg);
            }
        }
    }

    fn on_batch(&mut self, n: usize, batch: &Batch) {
        let shard = batch.shard;
        let feed = &mut self.gateways[n].feeds[shard];
        if feed.fence.admit(batch.epoch) == Fenced::Stale {
            return;
        }
        if batch.epoch < feed.newest_accepted {
            let detail = format!(
                "gateway {n} accepted shard {shard}'s epoch {} after epoch {}",
                batch.epoch, feed.newest_accepted
            );
            self.checker.fail(Invariant::StaleEpoch, self.now_ns, detail);
            return;
        }
        feed.newest_accepted = batch.epoch;
        let answers_this_gap = batch.reply == Some(feed.next_seq);
        if answers_this_gap && batch.first_seq > feed.next_seq {
            self.resync(n, shard, batch.first_seq - 1);
        }
        let feed = &mut self.gateways[n].feeds[shard];
        let next = feed.next_seq;
        if batch.first_seq > next || (batch.outputs.is_empty() && batch.last_seq >= next) {
            if feed.retain_sent_ns.is_none() {
                self.ask_retain(n, shard);
            }
            return;
        }
        let skip = (next - batch.first_seq) as usize;
        if skip >= batch.outputs.len() {
            return;
        }
        feed.retain_sent_ns = None;
        let gateway = &mut self.gateways[n];
        let mut reports = Vec::new();
        for output in &batch.outputs[skip..] {
            let feed = &mut gateway.feeds[shard];
            let stream_seq = feed.next_seq;
            feed.next_seq += 1;
            if output.seq != 0 && output.seq != feed.input.0 {
                feed.input = (output.seq, stream_seq);
            }
            if gateway.routed.admit(output) {
                reports.push((output.client as usize, *output));
            }
        }
        self.write(n, shard, reports);
        if self.gateways[n].feeds[shard].next_seq <= batch.last_seq {
            self.ask_retain(n, shard);
        }
    }

    /// Production's resync: the leader's answer starts after the feed's next report, so
    /// everything up to `last` is lost for good (older than its window and its group's newest
    /// snapshot). The feed moves past it and the checker is told, report by report, which
    /// sessions lose what: those this gateway had not routed yet (the routed positions admit
    /// them, so they stay behind the feed as if they had passed).
    fn resync(&mut self, n: usize, shard: usize, last: u64) {
        let first = self.gateways[n].feeds[shard].next_seq;
        self.note(format!("gateway {n}: shard {shard}'s reports {first}..={last} lost: resync"));
        // Production's rule loses a range only from before the newest snapshot's numbering
        // (the regenerator recomputes anything after it): a loss of what the group could
        // still recompute is one no client should see.
        let index = subject_index(n as u32, Stream::Reports);
        let snapshot = self.broker.shards[shard].snapshot.as_ref();
        let recomputable_from = snapshot.map_or(1, |snapshot| snapshot.next_seqs[index]);
        if first >= recomputable_from {
            let detail = format!(
                "gateway {n} resynced shard {shard}'s reports {first}..={last}; the group \
                 recomputes every report from {recomputable_from} on"
            );
            self.checker.fail(Invariant::Liveness, self.now_ns, detail);
        }
        // Production's answer must start where the gateway asked, so the part the group
        // could recompute (after the snapshot's numbering) is lost with the rest.
        self.resynced_recomputable += (last + 1).saturating_sub(recomputable_from.max(first));
        self.gateways[n].feeds[shard].next_seq = last + 1;
        // A restarted gateway may resync a range again: the checker counts each report once.
        for seq in self.checker.newly_resynced(shard, n, first, last) {
            let Some(report) = self.checker.numbered_report(shard, n, seq) else {
                let detail =
                    format!("gateway {n} resynced shard {shard}'s report {seq}, never numbered");
                return self.checker.fail(Invariant::Liveness, self.now_ns, detail);
            };
            let client = report.client as usize;
            if self.gateways[n].routed.admit(&report) && client < self.clients.len() {
                // The session is told its order's report is lost (not silent): the client
                // stops waiting for it.
                self.clients[client].answered(&report);
                self.checker.lost(client, shard, report);
            }
        }
        self.resynced += last + 1 - first;
    }
}
