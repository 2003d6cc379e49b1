//! One run from a seed, many runs, and the shrinking of a failure to the fewest faults that
//! still show it.

use exchange::flow::UniverseConfig;
use exchange::tier::TierConfig;

use crate::check::{Checker, Invariant, Violation};
use crate::client::SimClient;
use crate::engine::SimEngine;
use crate::error::SimError;
use crate::faults::{self, Cast, Fault, FaultKind, Target};
use crate::gateway::SimGateway;
use crate::rng::Rng;
use crate::world::{Addr, Event, Timer, World};

/// What a run simulates.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The seed of every random choice.
    pub seed: u64,
    /// Engines of the shard's group.
    pub engines: usize,
    /// Gateways.
    pub gateways: usize,
    /// Clients (each on gateway `client % gateways`).
    pub clients: usize,
    /// The fault kinds drawn.
    pub fault_kinds: Vec<FaultKind>,
    /// Faults drawn per run.
    pub fault_count: usize,
    /// Whether process faults may hit gateways too (`false`: engines only).
    pub gateway_faults: bool,
    /// Faults start within this much simulated time, ns.
    pub fault_window_ns: u64,
    /// After the faults and the quiet start, how long the run goes on for answers, ns.
    pub settle_ns: u64,
    /// A client's mean time between orders, ns.
    pub order_gap_ns: u64,
    /// The lease's TTL and renewal period, ns.
    pub lease_ttl_ns: u64,
    /// See `lease_ttl_ns`.
    pub renew_ns: u64,
    /// Most inputs per log read.
    pub read_max: usize,
    /// Reports each engine keeps per gateway subject in its retained window (production's
    /// `--retain-records`, small here so gateways fall behind it).
    pub retain_records: u64,
    /// The tier the engines and the reference run.
    pub tier: TierConfig,
}

impl Settings {
    /// The benchmark's shape: 3 engines, 2 gateways, 100 clients, every fault kind.
    pub fn new(seed: u64) -> Settings {
        let tier = TierConfig {
            gateways: 2,
            universe: UniverseConfig { instruments: 4, clients: 128 },
            order_pool_slots: 8192,
            ended_order_ids: 8192,
            ordered_outputs: true,
            ..TierConfig::default()
        };
        Settings {
            seed,
            engines: 3,
            gateways: 2,
            clients: 100,
            fault_kinds: FaultKind::ALL.to_vec(),
            fault_count: 12,
            gateway_faults: true,
            fault_window_ns: 20_000_000_000,
            settle_ns: 10_000_000_000,
            order_gap_ns: 200_000_000,
            lease_ttl_ns: replication::lease::LEASE_TTL_DEFAULT.as_nanos() as u64,
            renew_ns: replication::lease::LEASE_RENEW_DEFAULT.as_nanos() as u64,
            read_max: 256,
            retain_records: 256,
            tier,
        }
    }

    /// When faults stop and clients send no new orders, ns (the last fault has ended).
    pub fn quiet_ns(&self) -> u64 {
        self.fault_window_ns + 4_000_000_000
    }

    /// When the run ends, ns.
    pub fn end_ns(&self) -> u64 {
        self.quiet_ns() + self.settle_ns
    }

    /// The faults this seed draws (their own stream, independent of the run's draws).
    pub fn faults(&self) -> Vec<Fault> {
        let mut rng = Rng::new(self.seed ^ 0x6661_756c_7473);
        let gateways = if self.gateway_faults { self.gateways } else { 0 };
        let cast =
            Cast { engines: self.engines, gateways, broker_nodes: crate::broker::BROKER_NODES };
        faults::schedule(&mut rng, &self.fault_kinds, self.fault_count, self.fault_window_ns, cast)
    }

    /// Refuses a shape the simulator cannot run.
    pub fn validate(&self) -> Result<(), SimError> {
        let fits = self.engines > 0 && self.gateways > 0 && self.clients > 0;
        if !fits || self.clients > self.tier.universe.clients as usize {
            return Err(SimError::BadInput(format!(
                "engines, gateways and clients must be > 0 and clients ≤ {}",
                self.tier.universe.clients
            )));
        }
        if self.gateways as u32 != self.tier.gateways {
            return Err(SimError::BadInput("the tier's gateways must equal the gateways".into()));
        }
        Ok(())
    }
}

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
    /// Orders committed to the log.
    pub committed: u64,
    /// The faults injected.
    pub faults: Vec<Fault>,
    /// The first violation, if any.
    pub violation: Option<Violation>,
    /// The notable events before the end (faults, leaderships, restarts).
    pub journal: Vec<String>,
}

/// Runs `settings` with every fault its seed draws.
pub fn run(settings: &Settings) -> Outcome {
    run_with(settings, settings.faults())
}

/// Runs `settings` with `faults` only (a shrunk list, or a chosen one).
pub fn run_with(settings: &Settings, faults: Vec<Fault>) -> Outcome {
    let checker = Checker::new(&settings.tier, settings.clients, settings.engines);
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
        committed: world.broker.log.len() as u64,
        faults: world.faults.clone(),
        violation: world.checker.violation.clone(),
        journal: world.journal.clone(),
    }
}

fn populate(world: &mut World) {
    let settings = world.settings.clone();
    for n in 0..settings.engines {
        let ttl = std::time::Duration::from_nanos(settings.lease_ttl_ns);
        world.engines.push(SimEngine::new(&settings.tier, ttl));
        world.engines[n].life.clock = drawn_clock(&mut world.rng);
        world.start_engine(n);
    }
    for n in 0..settings.gateways {
        world.gateways.push(SimGateway::new(settings.clients));
        world.gateways[n].life.clock = drawn_clock(&mut world.rng);
        world.start_gateway(n);
    }
    for n in 0..settings.clients {
        world.clients.push(SimClient::new(n % settings.gateways));
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
        let expected = world.checker.expected[n].len() as u64;
        if client.last_seq != expected || !client.unanswered.is_empty() {
            let detail = format!(
                "client {n}: {} of {expected} reports, {} orders unanswered, {:.1} s after the faults",
                client.last_seq,
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

    fn life_of(&mut self, addr: Addr) -> &mut crate::world::Life {
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
