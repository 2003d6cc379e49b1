//! The event loop: one thread, one seeded generator, a queue of timed events (messages in
//! flight, timers, faults), and the network between the processes (NATS links that lose,
//! duplicate and delay; the clients' TCP connections, in order while they last).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::broker::Broker;
use crate::check::{Checker, Invariant};
use crate::faults::Fault;
use crate::msg::{Addr, Event, Msg, Timer};
use crate::process::{Life, SimClient, SimEngine, SimGateway};
use crate::rng::Rng;
use crate::settings::Settings;

struct Scheduled {
    at_ns: u64,
    order: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ns, self.order) == (other.at_ns, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ns, self.order).cmp(&(other.at_ns, other.order))
    }
}

/// Network faults in force.
#[derive(Debug, Default)]
pub struct NetFaults {
    /// Share of NATS messages lost, and until when.
    pub loss: (f64, u64),
    /// Share duplicated, and until when.
    pub duplicate: (f64, u64),
    /// Share delayed up to 2 s, and until when.
    pub delay: (f64, u64),
    /// Share of object-store puts and reads that fail (the rest delayed), and until when.
    pub object_store: (f64, u64),
}

/// The whole simulated system.
pub struct World {
    /// True time, ns.
    pub now_ns: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    order: u64,
    /// The run's one generator.
    pub rng: Rng,
    /// The run's settings.
    pub settings: Settings,
    /// The faults scheduled.
    pub faults: Vec<Fault>,
    /// The broker.
    pub broker: Broker,
    /// The shard's engine group.
    pub engines: Vec<SimEngine>,
    /// The gateways.
    pub gateways: Vec<SimGateway>,
    /// The clients.
    pub clients: Vec<SimClient>,
    /// Network faults in force.
    pub net: NetFaults,
    /// The invariants and the reference.
    pub checker: Checker,
    /// Notable events (faults, leaderships, restarts), for a failure's trace.
    pub journal: Vec<String>,
    /// Clients send no new orders after this.
    pub quiet: bool,
    trace: u64,
    /// Events handled.
    pub events: u64,
    /// Reports recomputed from the log for ranges older than the retained window.
    pub regenerated: u64,
    /// Reports the gateways' resyncs declared lost (older than every leader's window and the
    /// newest snapshot), over the gateway subjects.
    pub resynced: u64,
    /// Of those, reports at or after the newest snapshot's numbering (which production's
    /// regenerator could recompute, but its answer must start where the gateway asked).
    pub resynced_recomputable: u64,
    /// Messages the gateways' stores lost to damaged records recovery skipped (reported).
    pub store_lost: u64,
    /// Gateway crashes that flipped bytes of their store (`gateway_store_corruption`).
    pub store_flips: u64,
    /// Gateway store writes a full disk refused (each held and tried again).
    pub store_writes_refused: u64,
    /// Snapshots taken by the engines, and log trims that moved the log's start.
    pub snapshots: u64,
    /// See `snapshots`.
    pub trims: u64,
    /// Snapshot puts that failed (the object store or the broker).
    pub snapshot_puts_failed: u64,
    /// What the FIX sessions' resends did.
    pub sessions: crate::process::SessionTally,
}

/// Most journal lines kept (the newest).
const JOURNAL_MAX: usize = 4096;

impl World {
    /// An empty world (processes are added by `run`).
    pub fn new(settings: Settings, faults: Vec<Fault>, checker: Checker) -> World {
        World {
            now_ns: 0,
            queue: BinaryHeap::new(),
            order: 0,
            rng: Rng::new(settings.seed),
            broker: Broker::new(settings.lease_ttl_ns, settings.shards),
            settings,
            faults,
            engines: Vec::new(),
            gateways: Vec::new(),
            clients: Vec::new(),
            net: NetFaults::default(),
            checker,
            journal: Vec::new(),
            quiet: false,
            trace: 0xcbf2_9ce4_8422_2325,
            events: 0,
            regenerated: 0,
            resynced: 0,
            resynced_recomputable: 0,
            store_lost: 0,
            store_flips: 0,
            store_writes_refused: 0,
            snapshots: 0,
            trims: 0,
            snapshot_puts_failed: 0,
            sessions: crate::process::SessionTally::default(),
        }
    }

    /// Schedules `event` `after_ns` from now.
    pub fn at(&mut self, after_ns: u64, event: Event) {
        self.order += 1;
        let at_ns = self.now_ns.saturating_add(after_ns);
        self.queue.push(Reverse(Scheduled { at_ns, order: self.order, event }));
    }

    /// Schedules `timer` for `to`'s current incarnation.
    pub fn timer(&mut self, to: Addr, after_ns: u64, timer: Timer) {
        let inc = self.life(to).map_or(0, |life| life.inc);
        self.at(after_ns, Event::Timer { to, inc, timer });
    }

    /// Notes a notable event for a failure's trace.
    pub fn note(&mut self, line: String) {
        if self.journal.len() == JOURNAL_MAX {
            self.journal.drain(..JOURNAL_MAX / 2);
        }
        self.journal.push(format!("{:>10.6} s  {line}", self.now_ns as f64 / 1e9));
    }

    /// The trace hash so far (every event's time, kind and receiver).
    pub fn trace_hash(&self) -> u64 {
        self.trace
    }

    fn mix(&mut self, value: u64) {
        self.trace = (self.trace ^ value).wrapping_mul(0x0000_0100_0000_01b3);
    }

    /// A process's life (`None` for the broker).
    pub fn life(&self, addr: Addr) -> Option<&Life> {
        match addr {
            Addr::Broker => None,
            Addr::Engine(n) => Some(&self.engines[n].life),
            Addr::Gateway(n) => Some(&self.gateways[n].life),
            Addr::Client(n) => Some(&self.clients[n].life),
        }
    }

    fn life_mut(&mut self, addr: Addr) -> Option<&mut Life> {
        match addr {
            Addr::Broker => None,
            Addr::Engine(n) => Some(&mut self.engines[n].life),
            Addr::Gateway(n) => Some(&mut self.gateways[n].life),
            Addr::Client(n) => Some(&mut self.clients[n].life),
        }
    }

    /// Sends over NATS: lost while either end is cut off, and as the network faults say.
    pub fn send_nats(&mut self, from: Addr, to: Addr, conn: u32, msg: Msg) {
        let cut = |world: &World, addr: Addr| {
            world.life(addr).is_some_and(|life| life.partitioned_until_ns > world.now_ns)
        };
        if cut(self, from) || cut(self, to) {
            return;
        }
        let now = self.now_ns;
        if now < self.net.loss.1 && self.rng.chance(self.net.loss.0) {
            return;
        }
        let copies =
            if now < self.net.duplicate.1 && self.rng.chance(self.net.duplicate.0) { 2 } else { 1 };
        for _ in 0..copies {
            let mut delay = self.rng.range(50_000, 1_000_000);
            if now < self.net.delay.1 && self.rng.chance(self.net.delay.0) {
                delay += self.rng.range(0, 2_000_000_000);
            }
            self.at(delay, Event::Deliver { to, conn, msg: msg.clone() });
        }
    }

    /// Sends over a client's TCP connection `conn` (in order; gone with the connection).
    pub fn send_tcp(&mut self, client: usize, to: Addr, conn: u32, msg: Msg) {
        let delay = self.rng.range(50_000, 500_000);
        let link = &mut self.clients[client];
        let (last, conn) = match to {
            Addr::Client(_) => (&mut link.down_last_ns, conn),
            _ => (&mut link.up_last_ns, conn),
        };
        let at_ns = (self.now_ns + delay).max(*last + 1);
        *last = at_ns;
        let after = at_ns - self.now_ns;
        self.at(after, Event::Deliver { to, conn, msg });
    }

    /// Runs until `end_ns` or the first violation; the trace hash.
    pub fn run_until(&mut self, end_ns: u64) {
        while let Some(Reverse(next)) = self.queue.pop() {
            if next.at_ns > end_ns || self.checker.violation.is_some() {
                break;
            }
            self.now_ns = next.at_ns;
            self.events += 1;
            self.dispatch(next.event);
        }
        self.now_ns = self.now_ns.max(end_ns);
    }

    fn dispatch(&mut self, event: Event) {
        match event {
            Event::Deliver { to, conn, msg } => {
                self.mix(self.now_ns ^ to.code() << 40);
                if let Some(msg) = self.admit(to, conn, Event::Deliver { to, conn, msg }) {
                    self.deliver(to, conn, msg);
                }
            }
            Event::Timer { to, inc, timer } => {
                self.mix(self.now_ns ^ to.code() << 40 ^ 1 << 63);
                if self.life(to).is_some_and(|life| life.inc == inc && life.up) {
                    if self.life(to).is_some_and(|life| life.paused) {
                        let stash = Event::Timer { to, inc, timer };
                        if let Some(life) = self.life_mut(to) {
                            life.stash.push(stash);
                        }
                        return;
                    }
                    self.on_timer(to, timer);
                }
            }
            Event::FaultStarts(n) => self.fault_starts(n),
            Event::FaultEnds(n) => self.fault_ends(n),
            Event::Quiet => self.quiet = true,
            Event::Start(Addr::Engine(n)) if !self.engines[n].life.up => self.start_engine(n),
            Event::Start(_) => {}
        }
    }

    /// The message of `event` if its receiver takes it now; stashed while paused, dropped
    /// when the receiver is down or is not the incarnation it was meant for.
    fn admit(&mut self, to: Addr, conn: u32, event: Event) -> Option<Msg> {
        let Event::Deliver { msg, .. } = event else { return None };
        let Some(life) = self.life_mut(to) else { return Some(msg) };
        if !life.up || (conn != 0 && conn != life.inc) {
            return None;
        }
        if life.paused {
            life.stash.push(Event::Deliver { to, conn, msg });
            return None;
        }
        Some(msg)
    }

    fn deliver(&mut self, to: Addr, conn: u32, msg: Msg) {
        match to {
            Addr::Broker => self.broker_receives(msg),
            Addr::Engine(n) => self.engine_receives(n, msg),
            Addr::Gateway(n) => self.gateway_receives(n, conn, msg),
            Addr::Client(n) => self.client_receives(n, msg),
        }
    }

    fn on_timer(&mut self, to: Addr, timer: Timer) {
        match to {
            Addr::Engine(n) => self.engine_timer(n, timer),
            Addr::Gateway(n) => self.gateway_timer(n, timer),
            Addr::Client(n) => self.client_timer(n, timer),
            Addr::Broker => {}
        }
    }

    /// Resumes a paused process: what waited for it happens now, in order.
    pub fn resume(&mut self, addr: Addr) {
        let Some(life) = self.life_mut(addr) else { return };
        life.paused = false;
        let stash = std::mem::take(&mut life.stash);
        for event in stash {
            self.at(0, event);
        }
    }

    fn broker_receives(&mut self, msg: Msg) {
        if !self.broker.available(self.now_ns) {
            return;
        }
        let now = self.now_ns;
        match msg {
            Msg::Append { shard, gateway, run, run_id, counter, order } => {
                let (_, new) = self.broker.append(shard, (gateway, run_id, counter), order);
                if new {
                    self.checker.committed(shard, &order);
                }
                self.send_nats(
                    Addr::Broker,
                    Addr::Gateway(gateway),
                    run,
                    Msg::AppendAck { counter },
                );
            }
            Msg::Read { shard, engine, from } => {
                let Some(orders) = self.broker.read(shard, from, self.settings.read_max) else {
                    // A read sent before the engine moved on (a delayed message) needs nothing.
                    let reader = &self.engines[engine];
                    if !reader.life.up || reader.applied + 1 != from {
                        return;
                    }
                    let first = self.broker.shards[shard].first_seq;
                    let detail = format!(
                        "engine {engine} reads shard {shard}'s log from {from}; it starts at {first}"
                    );
                    return self.checker.fail(Invariant::TrimPastNeed, now, detail);
                };
                let orders = orders.to_vec();
                let inc = self.engines[engine].life.inc;
                self.send_nats(
                    Addr::Broker,
                    Addr::Engine(engine),
                    inc,
                    Msg::Records { from, orders },
                );
            }
            Msg::Cas { shard, engine, request, expected } => {
                let outcome = self.broker.lease_cas(shard, expected, now);
                let inc = self.engines[engine].life.inc;
                let reply = Msg::CasReply { request, outcome };
                self.send_nats(Addr::Broker, Addr::Engine(engine), inc, reply);
            }
            Msg::Release { shard, target } => self.broker.lease_delete(shard, target, now),
            _ => {}
        }
    }
}
