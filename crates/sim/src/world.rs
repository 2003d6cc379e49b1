//! The event loop: one thread, one seeded generator, a queue of timed events (messages in
//! flight, timers, faults), and the network between the processes (NATS links that lose,
//! duplicate and delay; the clients' TCP connections, in order while they last).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use exchange::msg::{CoreOutput, InboundOrder};
use replication::lease::{CasOutcome, ReleaseTarget};

use crate::broker::Broker;
use crate::check::Checker;
use crate::client::SimClient;
use crate::clock::ProcessClock;
use crate::engine::SimEngine;
use crate::faults::Fault;
use crate::gateway::SimGateway;
use crate::rng::Rng;
use crate::run::Settings;

/// Who a message or timer is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    /// The broker (its stream leader).
    Broker,
    /// Engine `n`.
    Engine(usize),
    /// Gateway `n`.
    Gateway(usize),
    /// Client `n`.
    Client(usize),
}

impl Addr {
    fn code(self) -> u64 {
        match self {
            Addr::Broker => 0,
            Addr::Engine(n) => 1 << 16 | n as u64,
            Addr::Gateway(n) => 2 << 16 | n as u64,
            Addr::Client(n) => 3 << 16 | n as u64,
        }
    }
}

/// A batch of reports (or a heartbeat: no outputs) from an engine to a gateway.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The publishing leadership's epoch.
    pub epoch: u64,
    /// The sequence of `outputs[0]` (the next one, for a heartbeat).
    pub first_seq: u64,
    /// The publisher's last sequence so far.
    pub last_seq: u64,
    /// The reports.
    pub outputs: Vec<CoreOutput>,
}

/// What travels between processes (each variant's line says what its fields are).
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub enum Msg {
    /// Client → gateway: a session starts (again), having received up to `last_seq`.
    Hello { client: usize, last_seq: u64 },
    /// Client → gateway: a request.
    Order { client: usize, order: InboundOrder },
    /// Gateway → client: the session's report `seq`, on connection `conn`.
    Report { conn: u32, seq: u64, output: CoreOutput },
    /// Gateway → broker: append with de-duplication by (gateway, run, counter).
    Append { gateway: usize, run: u32, counter: u64, order: InboundOrder },
    /// Broker → gateway: appended.
    AppendAck { counter: u64 },
    /// Engine → broker: the inputs from `from` on.
    Read { engine: usize, from: u64 },
    /// Broker → engine: inputs from `from` on.
    Records { from: u64, orders: Vec<InboundOrder> },
    /// Engine → broker: a lease write expecting `expected`.
    Cas { engine: usize, request: u64, expected: u64 },
    /// Broker → engine: the write's outcome.
    CasReply { request: u64, outcome: CasOutcome },
    /// Engine → broker: a lease release.
    Release { target: ReleaseTarget },
    /// Engine → gateway: reports or a heartbeat.
    Batch(Box<Batch>),
    /// Gateway → every engine: the leader's retained reports from `from` on.
    Retain { gateway: usize, from: u64 },
}

/// A process's own timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    /// Engine: keep or contend for the lease.
    Lease,
    /// Engine: read the log.
    Poll,
    /// Engine: a leader's heartbeat.
    Heartbeat,
    /// Engine: its journal's sync `id` completed.
    JournalSynced(u64),
    /// Gateway: resend unacknowledged appends, retry a retain request.
    Retry,
    /// Gateway: the store's write `epoch` is synced.
    Synced(u64),
    /// Client: connect (again).
    Connect,
    /// Client: send the next order.
    Send,
}

/// Something that happens at a time (each variant's line says what its fields are).
#[allow(missing_docs)]
#[derive(Clone, Debug)]
pub enum Event {
    /// A message arrives (`conn`: the receiver's incarnation it was meant for, 0: any).
    Deliver { to: Addr, conn: u32, msg: Msg },
    /// A timer of the process's incarnation `inc` fires.
    Timer { to: Addr, inc: u32, timer: Timer },
    /// Fault `n` of the schedule starts.
    FaultStarts(usize),
    /// Fault `n` of the schedule ends.
    FaultEnds(usize),
    /// Faults are over and clients stop sending new orders.
    Quiet,
}

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

/// Whether a process runs, and what waits for it while it is paused.
#[derive(Debug, Default)]
pub struct Life {
    /// Running (or paused); `false`: dead or stopped.
    pub up: bool,
    /// Paused: its events wait in `stash`.
    pub paused: bool,
    /// Its incarnation (grows at every start).
    pub inc: u32,
    /// Events that arrived while paused, in arrival order.
    pub stash: Vec<Event>,
    /// Its clocks.
    pub clock: ProcessClock,
    /// Cut off from NATS until this true time.
    pub partitioned_until_ns: u64,
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
            broker: Broker::new(settings.lease_ttl_ns),
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
            Msg::Append { gateway, run, counter, order } => {
                let (_, new) = self.broker.append((gateway, run, counter), order);
                if new {
                    self.checker.committed(&order);
                }
                self.send_nats(
                    Addr::Broker,
                    Addr::Gateway(gateway),
                    run,
                    Msg::AppendAck { counter },
                );
            }
            Msg::Read { engine, from } => {
                let orders = self.broker.read(from, self.settings.read_max).to_vec();
                let inc = self.engines[engine].life.inc;
                self.send_nats(
                    Addr::Broker,
                    Addr::Engine(engine),
                    inc,
                    Msg::Records { from, orders },
                );
            }
            Msg::Cas { engine, request, expected } => {
                let outcome = self.broker.lease_cas(expected, now);
                let inc = self.engines[engine].life.inc;
                let reply = Msg::CasReply { request, outcome };
                self.send_nats(Addr::Broker, Addr::Engine(engine), inc, reply);
            }
            Msg::Release { target } => self.broker.lease_delete(target, now),
            _ => {}
        }
    }
}
