//! The invariants, checked as the run goes, and the single-process reference they compare
//! with: a `TierReplica` fed the broker's log as each input is committed.

use std::collections::VecDeque;

use exchange::msg::{Audience, CoreOutput, InboundOrder, OutputKind};
use exchange::tier::{TierConfig, TierReplica};

/// One property the simulated system must keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Invariant {
    /// At most one engine of a shard publishes at a time (one publishing epoch).
    OneEpoch,
    /// A gateway never accepts a batch of an older epoch than one it accepted before.
    StaleEpoch,
    /// A report sequence always carries the same bytes, from every engine.
    SameBytes,
    /// Every report a client gets equals the reference's for that place in its session.
    Reference,
    /// A session's sequence has no gap (a duplicate is dropped by the client, as FIX does).
    SessionGap,
    /// No order is filled beyond its quantity.
    Overfill,
    /// Every input an engine's journal acknowledged as durable is recovered, or its loss is
    /// reported (a refusal); recovered inputs equal the log's.
    DurableDropped,
    /// Once faults stop, every client gets every answer its orders have in the log.
    Liveness,
    /// No engine (live, or restarting from the newest snapshot) and no snapshot ever needs an
    /// input the log's trim removed.
    TrimPastNeed,
    /// A gateway's session store, recovered after a restart, still holds every message the
    /// gateway sent (after its sync), with the same bytes.
    StoreKeepsSent,
}

impl Invariant {
    /// Every invariant.
    pub const ALL: [Invariant; 10] = [
        Invariant::OneEpoch,
        Invariant::StaleEpoch,
        Invariant::SameBytes,
        Invariant::Reference,
        Invariant::SessionGap,
        Invariant::Overfill,
        Invariant::DurableDropped,
        Invariant::Liveness,
        Invariant::TrimPastNeed,
        Invariant::StoreKeepsSent,
    ];

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::OneEpoch => "one-publishing-epoch",
            Invariant::StaleEpoch => "no-stale-epoch-accepted",
            Invariant::SameBytes => "same-seq-same-bytes",
            Invariant::Reference => "answers-equal-reference",
            Invariant::SessionGap => "session-without-gaps",
            Invariant::Overfill => "no-overfill",
            Invariant::DurableDropped => "durable-never-dropped",
            Invariant::Liveness => "liveness",
            Invariant::TrimPastNeed => "trim-never-past-need",
            Invariant::StoreKeepsSent => "store-keeps-what-it-sent",
        }
    }
}

/// A broken invariant: which, when, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant.
    pub invariant: Invariant,
    /// When, true ns.
    pub at_ns: u64,
    /// What was seen.
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.at_ns as f64 / 1e9;
        write!(f, "{} at {at:.6} s: {}", self.invariant.name(), self.detail)
    }
}

/// The reference tiers (one per shard) and the first violation seen.
pub struct Checker {
    references: Vec<TierReplica>,
    /// Per shard, per client, the reference's reports in order (what the client's session
    /// must carry of that shard, in that order).
    expected: Vec<Vec<Vec<CoreOutput>>>,
    /// Per client, per shard, the reports its session carried so far.
    received: Vec<Vec<u64>>,
    /// Per shard, per gateway subject, every report sequence's bytes as first published.
    canonical: Vec<Vec<Vec<CoreOutput>>>,
    /// Per engine, the last input its journal acknowledged durable (since a reported loss).
    pub durable_acked: Vec<u64>,
    /// Journal recoveries that refused (losses reported, not silent).
    pub losses_reported: u64,
    /// Per client, per shard, the reports a gateway's resync declared lost, in session order:
    /// the session skips them (reported, not silent), the reference still holds them.
    lost: Vec<Vec<VecDeque<CoreOutput>>>,
    /// Per shard, per gateway subject, the last report a resync declared lost.
    resynced_upto: Vec<Vec<u64>>,
    /// Per client, per shard, the reports a gateway's store lost to damaged records recovery
    /// skipped (reported), not yet taken: the session skips them wherever they come.
    store_lost: Vec<Vec<Vec<CoreOutput>>>,
    /// Per client, the reports declared lost over the shards (skipped or not yet).
    lost_total: Vec<u64>,
    /// Reports of sessions declared lost by the gateways' resyncs.
    pub resynced: u64,
    /// The first violation.
    pub violation: Option<Violation>,
}

impl Checker {
    /// A reference of `tier` per shard, for `clients` clients and `engines` engines in all.
    pub fn new(tier: &TierConfig, shards: usize, clients: usize, engines: usize) -> Checker {
        let reference =
            || TierReplica::new(tier.starting_master_data(), tier.core_limits(), tier.outlets);
        Checker {
            references: (0..shards).map(|_| reference()).collect(),
            expected: vec![vec![Vec::new(); clients]; shards],
            received: vec![vec![0; shards]; clients],
            canonical: vec![vec![Vec::new(); tier.outlets as usize]; shards],
            durable_acked: vec![0; engines],
            losses_reported: 0,
            lost: vec![vec![VecDeque::new(); shards]; clients],
            store_lost: vec![vec![Vec::new(); shards]; clients],
            resynced_upto: vec![vec![0; tier.outlets as usize]; shards],
            lost_total: vec![0; clients],
            resynced: 0,
            violation: None,
        }
    }

    /// Records the first violation (later ones follow from it).
    pub fn fail(&mut self, invariant: Invariant, at_ns: u64, detail: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation { invariant, at_ns, detail });
        }
    }

    /// Engine `engine`'s journal acknowledged every input up to `seq` as durable.
    pub fn durable(&mut self, engine: usize, seq: u64) {
        self.durable_acked[engine] = self.durable_acked[engine].max(seq);
    }

    /// Engine `engine`'s journal recovery refused: what it acknowledged is reported lost.
    pub fn loss_reported(&mut self, engine: usize) {
        self.durable_acked[engine] = 0;
        self.losses_reported += 1;
    }

    /// Feeds `shard`'s reference one committed input.
    pub fn committed(&mut self, shard: usize, order: &InboundOrder) {
        let expected = &mut self.expected[shard];
        self.references[shard].apply(order, &mut |response| {
            let client = response.output.client as usize;
            if response.audience == Audience::Client && client < expected.len() {
                expected[client].push(CoreOutput { shard: shard as u32, ..response.output });
            }
        });
    }

    /// Every report the log holds for `client`, over the shards, but those a resync
    /// declared lost.
    pub fn expected_reports(&self, client: usize) -> u64 {
        let all: u64 = self.expected.iter().map(|shard| shard[client].len() as u64).sum();
        all - self.lost_total[client]
    }

    /// Report `seq` of `shard`'s gateway subject `gateway` as first numbered, if it was.
    pub fn numbered_report(&self, shard: usize, gateway: usize, seq: u64) -> Option<CoreOutput> {
        self.canonical[shard][gateway].get(seq.checked_sub(1)? as usize).copied()
    }

    /// The part of `gateway`'s resync of `shard`'s reports `first..=last` no resync of that
    /// subject declared before.
    pub fn newly_resynced(
        &mut self,
        shard: usize,
        gateway: usize,
        first: u64,
        last: u64,
    ) -> std::ops::RangeInclusive<u64> {
        let upto = &mut self.resynced_upto[shard][gateway];
        let from = first.max(*upto + 1);
        *upto = (*upto).max(last);
        from..=last
    }

    /// A gateway's resync declared `report` of `client`'s session lost before it was routed:
    /// the session skips it (reported, not silent; the reference still holds it).
    pub fn lost(&mut self, client: usize, shard: usize, report: CoreOutput) {
        if let Some(lost) = self.lost.get_mut(client) {
            lost[shard].push_back(report);
            self.lost_total[client] += 1;
            self.resynced += 1;
        }
    }

    /// A gateway's store lost `report` of `client`'s session (damaged records recovery skipped,
    /// reported) before the client took it: the session skips it.
    pub fn store_lost(&mut self, client: usize, report: CoreOutput) {
        let shard = (report.shard as usize).min(self.expected.len() - 1);
        if let Some(lost) = self.store_lost.get_mut(client) {
            lost[shard].push(report);
            self.lost_total[client] += 1;
        }
    }

    /// Checks report `seq` of `shard`'s gateway subject `gateway` against every earlier copy.
    pub fn numbered(
        &mut self,
        shard: usize,
        gateway: usize,
        seq: u64,
        output: &CoreOutput,
        at_ns: u64,
    ) {
        let known = &mut self.canonical[shard][gateway];
        match known.get(seq as usize - 1) {
            Some(first) if first != output => {
                let (first, then) = (brief(first), brief(output));
                let detail =
                    format!("shard {shard} gateway {gateway} report {seq}: {first} then {then}");
                self.fail(Invariant::SameBytes, at_ns, detail);
            }
            Some(_) => {}
            None if known.len() as u64 + 1 == seq => known.push(*output),
            None => {
                let detail = format!(
                    "shard {shard} gateway {gateway} report {seq} numbered past {}",
                    known.len()
                );
                self.fail(Invariant::SameBytes, at_ns, detail);
            }
        }
    }

    /// Checks report `seq` of `client`'s session against the reference of its shard: the
    /// session's reports of each shard, in order, are that shard's reference's.
    pub fn answered(&mut self, client: usize, seq: u64, output: &CoreOutput, at_ns: u64) {
        let shard = (output.shard as usize).min(self.expected.len() - 1);
        self.skip_lost(client, shard);
        let nth = self.received[client][shard];
        self.received[client][shard] += 1;
        let expected = self.expected[shard][client].get(nth as usize).copied();
        if expected.as_ref() != Some(output) {
            let expected = expected.as_ref().map_or("nothing".to_string(), brief);
            let detail = format!(
                "client {client} report {seq} (shard {shard}'s {}th): got {}, the reference {expected}",
                nth + 1,
                brief(output)
            );
            self.fail(Invariant::Reference, at_ns, detail);
        }
    }
}

impl Checker {
    /// Steps `client`'s place in `shard`'s reference past the reports declared lost that
    /// come next there (a resync's range is a run of the session's reports).
    fn skip_lost(&mut self, client: usize, shard: usize) {
        loop {
            let nth = self.received[client][shard] as usize;
            let Some(next) = self.expected[shard][client].get(nth) else { break };
            let lost = &mut self.lost[client][shard];
            let store_lost = &mut self.store_lost[client][shard];
            if lost.front() == Some(next) {
                lost.pop_front();
            } else if let Some(at) = store_lost.iter().position(|report| report == next) {
                store_lost.swap_remove(at);
            } else {
                break;
            }
            self.received[client][shard] += 1;
        }
    }
}

/// A report in one line: what, for which order, caused by which input.
pub fn brief(output: &CoreOutput) -> String {
    format!(
        "{:?} of order {:#x} (input {}, qty {}, leaves {})",
        output.kind, output.order_id, output.seq, output.qty, output.leaves_qty
    )
}

/// Per order, what a client sent and what it was told filled (no fill beyond the quantity).
#[derive(Clone, Debug, Default)]
pub struct FillBook {
    /// (order id, quantity, filled so far), newest last.
    orders: Vec<(u64, u32, u64)>,
}

impl FillBook {
    /// An order sent (a resend keeps the first).
    pub fn sent(&mut self, order_id: u64, qty: u32) {
        if !self.orders.iter().any(|(id, _, _)| *id == order_id) {
            self.orders.push((order_id, qty, 0));
        }
    }

    /// A replace sent: the order may now fill up to `qty` more (a bound that holds whenever
    /// the replace takes effect).
    pub fn replaced(&mut self, order_id: u64, qty: u32) {
        if let Some(order) = self.orders.iter_mut().find(|(id, _, _)| *id == order_id) {
            order.1 = order.1.saturating_add(qty);
        }
    }

    /// A report received; `Err` with the detail when it fills beyond the order's quantity.
    pub fn report(&mut self, output: &CoreOutput) -> Result<(), String> {
        if !matches!(output.kind, OutputKind::PartiallyFilled | OutputKind::Filled) {
            return Ok(());
        }
        let Some(order) = self.orders.iter_mut().find(|(id, _, _)| *id == output.order_id) else {
            return Ok(());
        };
        order.2 += u64::from(output.qty);
        if order.2 > u64::from(order.1) {
            return Err(format!("order {} filled {} of {}", order.0, order.2, order.1));
        }
        Ok(())
    }
}
