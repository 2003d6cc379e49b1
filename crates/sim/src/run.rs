//! One run from a seed, many runs, and the shrinking of a failure to the fewest faults that
//! still show it.

use crate::check::{Checker, Invariant, Violation};
use crate::error::SimError;
use crate::faults::{Fault, FaultKind, Target};
use crate::msg::{Addr, Event, Timer};
use crate::process::{SimClient, SimEngine, SimGateway};
use crate::rng::Rng;
use crate::settings::Settings;
use crate::world::World;

/// What a run did.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The hash of every event's time and receiver: equal for equal seeds and faults.
    pub trace_hash: u64,
    /// Simulated time covered, ns.
    pub simulated_ns: u64,
    /// Events handled.
    pub events: u64,
    /// Orders committed to the logs.
    pub committed: u64,
    /// Per shard, orders committed to its log.
    pub shard_committed: Vec<u64>,
    /// The faults injected.
    pub faults: Vec<Fault>,
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// The notable events before the end (faults, leaderships, restarts).
    pub journal: Vec<String>,
    /// Engine journal recoveries that refused (each a loss reported, not a violation).
    pub losses_reported: u64,
    /// Reports recomputed from the log for ranges older than the retained window.
    pub regenerated: u64,
    /// Reports the gateways' resyncs declared lost (past every window and the newest
    /// snapshot: reported, not a violation), over the gateway subjects.
    pub resynced: u64,
    /// Of those, reports at or after the newest snapshot's numbering: recomputable, lost
    /// only because production's retain answer starts where the gateway asked.
    pub resynced_recomputable: u64,
    /// Of those, reports the sessions lost (not routed before the resync).
    pub sessions_lost: u64,
    /// Snapshots the engines took.
    pub snapshots: u64,
    /// Log trims that moved a shard's log start.
    pub trims: u64,
    /// What the FIX sessions' resends did.
    pub sessions: crate::process::SessionTally,
    /// Snapshot puts that failed (the object store or the broker).
    pub snapshot_puts_failed: u64,
    /// Messages the gateways' stores lost to damaged records their recovery skipped before
    /// the synced end (reported by production, not a violation); the sessions skip them.
    pub store_lost: u64,
    /// Gateway crashes that flipped bytes of their store first (`gateway_store_corruption`).
    pub store_flips: u64,
    /// Gateway store writes a full disk refused (each batch held and tried again).
    pub store_writes_refused: u64,
}

/// Runs `settings` with every fault its seed draws.
pub fn run(settings: &Settings) -> Outcome {
    run_with(settings, settings.faults())
}

/// Runs `settings` with `faults` only (a shrunk list, or a chosen one).
pub fn run_with(settings: &Settings, faults: Vec<Fault>) -> Outcome {
    let engines = settings.shards * settings.engines;
    let checker = Checker::new(&settings.tier, settings.shards, settings.clients, engines);
    let mut world = World::new(settings.clone(), faults, checker);
    populate(&mut world);
    world.run_until(settings.end_ns());
    if world.checker.violation.is_none() {
        check_liveness(&mut world);
    }
    Outcome {
        seed: settings.seed,
        trace_hash: world.trace_hash(),
        simulated_ns: world.now_ns,
        events: world.events,
        committed: world.broker.committed(),
        shard_committed: world.broker.shards.iter().map(|shard| shard.log.len() as u64).collect(),
        faults: world.faults.clone(),
        violation: world.checker.violation.clone(),
        journal: world.journal.clone(),
        losses_reported: world.checker.losses_reported,
        regenerated: world.regenerated,
        resynced: world.resynced,
        resynced_recomputable: world.resynced_recomputable,
        sessions_lost: world.checker.resynced,
        snapshots: world.snapshots,
        trims: world.trims,
        sessions: world.sessions,
        snapshot_puts_failed: world.snapshot_puts_failed,
        store_lost: world.store_lost,
        store_flips: world.store_flips,
        store_writes_refused: world.store_writes_refused,
    }
}

fn populate(world: &mut World) {
    let settings = world.settings.clone();
    for n in 0..settings.shards * settings.engines {
        let ttl = std::time::Duration::from_nanos(settings.lease_ttl_ns);
        let shard = n / settings.engines;
        world.engines.push(SimEngine::new(&settings.tier, ttl, shard));
        world.engines[n].life.clock = drawn_clock(&mut world.rng);
        world.start_engine(n);
    }
    for n in 0..settings.gateways {
        world.gateways.push(SimGateway::new(settings.clients, settings.shards));
        world.gateways[n].life.clock = drawn_clock(&mut world.rng);
        world.start_gateway(n);
    }
    for n in 0..settings.clients {
        world.clients.push(SimClient::new(n % settings.gateways, settings.is_fix(n)));
        let start = world.rng.range(0, 100_000_000);
        world.timer(Addr::Client(n), start, Timer::Connect);
        let first = start + world.rng.exponential_ns(settings.order_gap_ns);
        world.timer(Addr::Client(n), first, Timer::Send);
    }
    for n in 0..world.faults.len() {
        let at = world.faults[n].at_ns;
        world.at(at, Event::FaultStarts(n));
    }
    world.at(settings.quiet_ns(), Event::Quiet);
}

/// A process's clocks: up to ±1000 ppm of skew, its own monotonic origin.
fn drawn_clock(rng: &mut Rng) -> crate::clock::ProcessClock {
    crate::clock::ProcessClock {
        skew_ppm: rng.range(0, 2_001) as i64 - 1_000,
        offset_ns: rng.range(0, 1 << 40),
        wall_offset_ns: rng.range(0, 1 << 50) as i64,
    }
}

/// Once faults stopped, every client is connected and has every answer the log holds for it.
fn check_liveness(world: &mut World) {
    for n in 0..world.clients.len() {
        let client = &world.clients[n];
        let expected = world.checker.expected_reports(n);
        if client.reports != expected || !client.unanswered.is_empty() {
            let detail = format!(
                "client {n}: {} of {expected} reports, {} orders unanswered, {:.1} s after the faults",
                client.reports,
                client.unanswered.len(),
                world.settings.settle_ns as f64 / 1e9
            );
            world.checker.fail(Invariant::Liveness, world.now_ns, detail);
            return;
        }
    }
}

impl World {
    pub(crate) fn fault_starts(&mut self, n: usize) {
        let fault = self.faults[n];
        self.note(format!("fault: {fault}"));
        let until = self.now_ns + fault.duration_ns;
        match (fault.kind, fault.target) {
            (FaultKind::Loss, _) => self.net.loss = (self.rng.unit() * 0.3, until),
            (FaultKind::Duplicate, _) => self.net.duplicate = (self.rng.unit() * 0.3, until),
            (FaultKind::Delay, _) => self.net.delay = (self.rng.unit() * 0.3, until),
            (FaultKind::ObjectStore, _) => {
                self.net.object_store = (0.2 + self.rng.unit() * 0.6, until);
            }
            (FaultKind::BrokerKill, Target::BrokerNode(node)) => {
                self.broker.kill_node(node, self.now_ns, &mut self.rng);
            }
            (FaultKind::ClockJump, target) => {
                if let Some(addr) = addr_of(target) {
                    let jump = fault.duration_ns as i64 - 10_000_000_000;
                    self.life_of(addr).clock.wall_offset_ns += jump;
                }
                return;
            }
            (FaultKind::Partition, target) => {
                if let Some(addr) = addr_of(target) {
                    self.life_of(addr).partitioned_until_ns = until;
                }
                return;
            }
            _ => self.hit_process(fault),
        }
        self.at(fault.duration_ns, Event::FaultEnds(n));
    }

    fn hit_process(&mut self, fault: Fault) {
        let Some(addr) = addr_of(fault.target) else { return };
        if !self.life_of(addr).up {
            return;
        }
        match (fault.kind, addr) {
            (FaultKind::Pause | FaultKind::PauseStop, _) => self.life_of(addr).paused = true,
            (FaultKind::Crash, _) => self.stop_process(addr, false),
            (FaultKind::Stop, _) => self.stop_process(addr, true),
            (FaultKind::TornWrite, Addr::Engine(n)) => {
                self.engines[n].journal.power_loss(Some(&mut self.rng));
                self.stop_engine(n, false);
            }
            (FaultKind::Corrupt, Addr::Engine(n)) => {
                self.stop_engine(n, false);
                self.corrupt_journal(n);
            }
            (FaultKind::DiskFull, Addr::Engine(n)) => {
                self.engines[n].journal.disk.full_until_ns = self.now_ns + fault.duration_ns;
            }
            (FaultKind::DiskFull, Addr::Gateway(n)) => {
                self.gateways[n].durable.disk.full_until_ns = self.now_ns + fault.duration_ns;
            }
            _ => {}
        }
    }

    pub(crate) fn fault_ends(&mut self, n: usize) {
        let fault = self.faults[n];
        let Some(addr) = addr_of(fault.target) else {
            if let (FaultKind::BrokerKill, Target::BrokerNode(node)) = (fault.kind, fault.target) {
                self.broker.restart_node(node, self.now_ns, &mut self.rng);
            }
            return;
        };
        match fault.kind {
            FaultKind::Pause if self.life_of(addr).paused => self.resume(addr),
            FaultKind::PauseStop if self.life_of(addr).paused => {
                // Woken and stopped at once: nothing it waited for runs first.
                self.life_of(addr).paused = false;
                self.stop_process(addr, true);
                let down_ns = self.rng.range(100_000_000, 2_000_000_000);
                self.at(down_ns, Event::FaultEnds(n));
            }
            FaultKind::Crash
            | FaultKind::Stop
            | FaultKind::PauseStop
            | FaultKind::TornWrite
            | FaultKind::Corrupt
                if !self.life_of(addr).up =>
            {
                match addr {
                    Addr::Engine(e) => self.start_engine(e),
                    Addr::Gateway(g) => self.start_gateway(g),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn stop_process(&mut self, addr: Addr, clean: bool) {
        match addr {
            Addr::Engine(n) => self.stop_engine(n, clean),
            Addr::Gateway(n) => self.stop_gateway(n, clean),
            _ => {}
        }
    }

    fn life_of(&mut self, addr: Addr) -> &mut crate::process::Life {
        match addr {
            Addr::Engine(n) => &mut self.engines[n].life,
            Addr::Gateway(n) => &mut self.gateways[n].life,
            Addr::Client(n) => &mut self.clients[n].life,
            Addr::Broker => unreachable!("the broker's faults are its nodes'"),
        }
    }
}

fn addr_of(target: Target) -> Option<Addr> {
    match target {
        Target::Engine(n) => Some(Addr::Engine(n)),
        Target::Gateway(n) => Some(Addr::Gateway(n)),
        Target::BrokerNode(_) | Target::Network => None,
    }
}

/// A failing run shrunk: the faults kept (indices into the seed's drawn list) and the run
/// with only those.
#[derive(Clone, Debug)]
pub struct Shrunk {
    /// Indices of the faults kept, into [`Settings::faults`].
    pub kept: Vec<usize>,
    /// The run with only those faults.
    pub outcome: Outcome,
}

/// Runs `settings` with only the drawn faults at `kept` (indices into [`Settings::faults`]);
/// `Err` names an index past the list.
pub fn run_keeping(settings: &Settings, kept: &[usize]) -> Result<Outcome, SimError> {
    let drawn = settings.faults();
    let mut faults = Vec::with_capacity(kept.len());
    for &index in kept {
        let fault = drawn.get(index).ok_or_else(|| {
            SimError::BadInput(format!(
                "fault {index}: seed {} draws {} faults",
                settings.seed,
                drawn.len()
            ))
        })?;
        faults.push(*fault);
    }
    Ok(run_with(settings, faults))
}

/// Drops faults one at a time while the run still breaks the same invariant: the fewest
/// faults found that still show it (`None`: the run did not fail).
pub fn shrink(settings: &Settings, failed: &Outcome) -> Option<Shrunk> {
    let invariant = failed.violation.as_ref()?.invariant;
    let mut best = Shrunk { kept: (0..failed.faults.len()).collect(), outcome: failed.clone() };
    let mut at = best.kept.len();
    while at > 0 {
        at -= 1;
        let mut fewer = best.kept.clone();
        fewer.remove(at);
        let outcome = run_keeping(settings, &fewer).expect("indices of the drawn list");
        if outcome.violation.as_ref().is_some_and(|v| v.invariant == invariant) {
            best = Shrunk { kept: fewer, outcome };
        }
    }
    Some(best)
}

/// Parses a seed file: one seed per line (decimal or 0x-hex), `#` comments and blank lines
/// allowed.
pub fn parse_seeds(text: &str) -> Result<Vec<u64>, SimError> {
    let mut seeds = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let parsed = match line.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => line.parse(),
        };
        let seed = parsed.map_err(|e| {
            SimError::BadInput(format!(
                "seed file line {}: {line:?} is not a u64 seed ({e})",
                number + 1
            ))
        })?;
        seeds.push(seed);
    }
    if seeds.is_empty() {
        return Err(SimError::BadInput("the seed file holds no seed".into()));
    }
    Ok(seeds)
}
