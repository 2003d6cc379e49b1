//! The faults a run injects: a list drawn from the seed before the run starts, so a failing
//! run can be shrunk by dropping faults one at a time and replaying the rest.

use crate::error::SimError;
use crate::rng::Rng;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A process dies (no clean-up: unsynced store writes are lost) and restarts later.
    Crash,
    /// A process stops cleanly (an engine releases its lease) and restarts later.
    Stop,
    /// A process is paused (SIGSTOP) and resumes later, its timers and messages waiting.
    Pause,
    /// A pause then a clean stop at once on waking (SIGSTOP, SIGCONT, SIGTERM).
    PauseStop,
    /// A process is cut off from the broker and every other NATS peer for a while.
    Partition,
    /// NATS messages are lost (a share of them) for a while.
    Loss,
    /// NATS messages are delivered twice (a share of them) for a while.
    Duplicate,
    /// NATS messages are delayed up to seconds (a share of them), so they arrive reordered.
    Delay,
    /// A broker node dies; if it led, the stream leader is re-elected after a delay.
    BrokerKill,
    /// A process's wall clock jumps (its monotonic clock, which leases read, does not).
    ClockJump,
    /// An engine's machine loses power while writing back: its journal's unsynced sectors
    /// persist in part and the last one is torn; it restarts later.
    TornWrite,
    /// Bytes of a durable sector of an engine's journal flip; its machine then loses power and
    /// restarts later (recovery reads the damage).
    Corrupt,
    /// An engine's disk refuses writes for a while.
    DiskFull,
    /// The broker's object store (the snapshots) fails a share of puts and reads and delays
    /// the rest by up to 2 s for a while.
    ObjectStore,
}

impl FaultKind {
    /// Every kind, in the order `--faults` lists them.
    pub const ALL: [FaultKind; 14] = [
        FaultKind::Crash,
        FaultKind::Stop,
        FaultKind::Pause,
        FaultKind::PauseStop,
        FaultKind::Partition,
        FaultKind::Loss,
        FaultKind::Duplicate,
        FaultKind::Delay,
        FaultKind::BrokerKill,
        FaultKind::ClockJump,
        FaultKind::TornWrite,
        FaultKind::Corrupt,
        FaultKind::DiskFull,
        FaultKind::ObjectStore,
    ];

    /// The kind's name in `--faults`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::Stop => "stop",
            FaultKind::Pause => "pause",
            FaultKind::PauseStop => "pause-stop",
            FaultKind::Partition => "partition",
            FaultKind::Loss => "loss",
            FaultKind::Duplicate => "duplicate",
            FaultKind::Delay => "delay",
            FaultKind::BrokerKill => "broker-kill",
            FaultKind::ClockJump => "clock-jump",
            FaultKind::TornWrite => "torn-write",
            FaultKind::Corrupt => "corrupt",
            FaultKind::DiskFull => "disk-full",
            FaultKind::ObjectStore => "object-store",
        }
    }

    /// Parses a comma-separated list of kinds (`all`: every kind; `none`: no faults).
    pub fn parse_list(text: &str) -> Result<Vec<FaultKind>, SimError> {
        let mut kinds = Vec::new();
        for name in text.split(',').map(str::trim).filter(|name| !name.is_empty()) {
            match name {
                "all" => kinds.extend(FaultKind::ALL),
                "none" => {}
                _ => {
                    let kind = FaultKind::ALL.into_iter().find(|kind| kind.name() == name);
                    let kind = kind.ok_or_else(|| {
                        let known: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
                        SimError::BadInput(format!(
                            "unknown fault {name:?} (known: all, none, {})",
                            known.join(", ")
                        ))
                    })?;
                    kinds.push(kind);
                }
            }
        }
        kinds.sort_by_key(|kind| FaultKind::ALL.iter().position(|k| k == kind));
        kinds.dedup();
        Ok(kinds)
    }

    /// Whether the fault hits one process (the others hit the network or the broker).
    pub fn targets_process(self) -> bool {
        matches!(
            self,
            FaultKind::Crash
                | FaultKind::Stop
                | FaultKind::Pause
                | FaultKind::PauseStop
                | FaultKind::Partition
                | FaultKind::ClockJump
                | FaultKind::TornWrite
                | FaultKind::Corrupt
                | FaultKind::DiskFull
        )
    }
}

/// A process a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// Engine `n` (of the shard's group).
    Engine(usize),
    /// Gateway `n`.
    Gateway(usize),
    /// Broker node `n`.
    BrokerNode(usize),
    /// Every NATS link.
    Network,
}

/// One scheduled fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// When it starts, true ns.
    pub at_ns: u64,
    /// What it is.
    pub kind: FaultKind,
    /// Whom it hits.
    pub target: Target,
    /// How long it lasts (down, paused, cut off, active), ns; for a clock jump, the jump.
    pub duration_ns: u64,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = match self.target {
            Target::Engine(n) => format!("engine {n}"),
            Target::Gateway(n) => format!("gateway {n}"),
            Target::BrokerNode(n) => format!("broker node {n}"),
            Target::Network => "the network".to_string(),
        };
        let (at, lasting) = (self.at_ns as f64 / 1e9, self.duration_ns as f64 / 1e9);
        write!(f, "{at:>8.3} s  {:<11} {target} for {lasting:.3} s", self.kind.name())
    }
}

/// How many processes of each kind a schedule may hit.
#[derive(Clone, Copy, Debug)]
pub struct Cast {
    /// Engines of the shard's group.
    pub engines: usize,
    /// Gateways.
    pub gateways: usize,
    /// Broker nodes.
    pub broker_nodes: usize,
}

/// Draws `count` faults of `kinds` in `0..window_ns` from `rng` (its own stream: the schedule
/// does not depend on what the run draws).
pub fn schedule(
    rng: &mut Rng,
    kinds: &[FaultKind],
    count: usize,
    window_ns: u64,
    cast: Cast,
) -> Vec<Fault> {
    if kinds.is_empty() {
        return Vec::new();
    }
    let mut faults: Vec<Fault> = (0..count)
        .map(|_| {
            let kind = kinds[rng.range(0, kinds.len() as u64) as usize];
            let at_ns = rng.range(500_000_000, window_ns.max(500_000_001));
            let processes = (cast.engines + cast.gateways) as u64;
            let target = match kind {
                FaultKind::BrokerKill => {
                    Target::BrokerNode(rng.range(0, cast.broker_nodes as u64) as usize)
                }
                FaultKind::Loss
                | FaultKind::Duplicate
                | FaultKind::Delay
                | FaultKind::ObjectStore => Target::Network,
                // Power and media faults of the engines' journals (none in the cast: the fault
                // hits nothing; a gateway's store tears and flips at its crashes).
                FaultKind::TornWrite | FaultKind::Corrupt => match cast.engines {
                    0 => Target::Network,
                    engines => Target::Engine(rng.range(0, engines as u64) as usize),
                },
                // An engine's journal or a gateway's session store fills up.
                FaultKind::DiskFull => match rng.range(0, processes.max(1)) as usize {
                    _ if processes == 0 => Target::Network,
                    n if n < cast.engines => Target::Engine(n),
                    n => Target::Gateway(n - cast.engines),
                },
                _ => match rng.range(0, processes) as usize {
                    n if n < cast.engines => Target::Engine(n),
                    n => Target::Gateway(n - cast.engines),
                },
            };
            let duration_ns = match kind {
                FaultKind::ClockJump => rng.range(0, 20_000_000_000),
                FaultKind::Pause | FaultKind::PauseStop => rng.range(200_000_000, 3_000_000_000),
                _ => rng.range(100_000_000, 4_000_000_000),
            };
            Fault { at_ns, kind, target, duration_ns }
        })
        .collect();
    faults.sort_by_key(|fault| fault.at_ns);
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_lists_parse_and_an_unknown_name_is_refused_with_the_known_ones() {
        let kinds = FaultKind::parse_list("pause, crash,pause").unwrap();
        assert_eq!(kinds, [FaultKind::Crash, FaultKind::Pause]);
        assert_eq!(FaultKind::parse_list("all").unwrap().len(), FaultKind::ALL.len());
        assert!(FaultKind::parse_list("none").unwrap().is_empty());
        let error = FaultKind::parse_list("crash,meteor").unwrap_err().to_string();
        assert!(error.contains("meteor") && error.contains("broker-kill"), "{error}");
    }
}
