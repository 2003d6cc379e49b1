//! What a run simulates: the shape, the faults drawn, the timings.

use exchange::flow::UniverseConfig;
use exchange::tier::TierConfig;

use crate::error::SimError;
use crate::faults::{self, Cast, Fault, FaultKind};
use crate::rng::Rng;

/// What a run simulates.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The seed of every random choice.
    pub seed: u64,
    /// Shards: each its own engine group, lease and input stream; an order goes to the shard
    /// of its instrument (`instrument % shards`).
    pub shards: usize,
    /// Engines of each shard's group.
    pub engines: usize,
    /// Gateways.
    pub gateways: usize,
    /// Clients (each on gateway `client % gateways`).
    pub clients: usize,
    /// Percent of each gateway's clients on FIX sessions (spread evenly); the rest native.
    pub fix_percent: u64,
    /// Whether a gateway's crash may tear its store's write-back (half the time: a random
    /// share of the unsynced sectors persists, the last torn). On by default: production's
    /// store recovered part of a batch never synced, its reports without their routed
    /// position, until batches got end markers (docs/SIMULATION.md, found and fixed).
    pub gateway_store_tears: bool,
    /// Whether a gateway's crash flips 1–8 bytes of its store first (a damaged disk), among
    /// the bytes its durable batch ends claim synced. On by default: production's recovery
    /// ended the store at the damaged record and cut what followed as a torn tail (under
    /// 8 MiB), sent messages with it, until batch ends carried the synced end
    /// (docs/SIMULATION.md, found and fixed).
    pub gateway_store_corruption: bool,
    /// Whether an `object-store` fault also fails the regenerator's snapshot reads. On by
    /// default: production's retain answer fell back to the window on a failed read, and the
    /// gateway resynced reports the group could recompute, until a failed regeneration
    /// answered "nothing yet" (docs/SIMULATION.md, found and fixed).
    pub regenerator_read_faults: bool,
    /// The fault kinds drawn.
    pub fault_kinds: Vec<FaultKind>,
    /// Faults drawn per run.
    pub fault_count: usize,
    /// Whether process faults may hit gateways too (`false`: engines only).
    pub gateway_faults: bool,
    /// Whether process faults may hit engines (`false`: gateways only; disk faults then
    /// hit nothing, only the engines have a simulated disk).
    pub engine_faults: bool,
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
    /// Inputs between an engine's snapshots (0: none; production's
    /// `SNAPSHOT_EVERY_INPUTS_DEFAULT` is 100,000, small here so that runs trim the log and
    /// restart engines from snapshots).
    pub snapshot_every: u64,
    /// The tier the engines and the reference run.
    pub tier: TierConfig,
}

impl Settings {
    /// The benchmark's shape: 3 engines, 2 gateways, 100 clients, every fault kind.
    pub fn new(seed: u64) -> Settings {
        let tier = TierConfig {
            outlets: 2,
            universe: UniverseConfig { instruments: 4, clients: 128 },
            order_pool_slots: 8192,
            ended_order_ids: 8192,
            ordered_outputs: true,
            ..TierConfig::default()
        };
        Settings {
            seed,
            shards: 1,
            engines: 3,
            gateways: 2,
            clients: 100,
            fix_percent: 50,
            gateway_store_tears: true,
            regenerator_read_faults: true,
            gateway_store_corruption: true,
            fault_kinds: FaultKind::ALL.to_vec(),
            fault_count: 12,
            gateway_faults: true,
            engine_faults: true,
            fault_window_ns: 20_000_000_000,
            settle_ns: 10_000_000_000,
            order_gap_ns: 200_000_000,
            lease_ttl_ns: replication::lease::LEASE_TTL_DEFAULT.as_nanos() as u64,
            renew_ns: replication::lease::LEASE_RENEW_DEFAULT.as_nanos() as u64,
            read_max: 256,
            retain_records: 256,
            snapshot_every: 1000,
            tier,
        }
    }

    /// Whether client `n` runs a FIX session: `fix_percent` of each gateway's clients,
    /// spread evenly over them.
    pub fn is_fix(&self, n: usize) -> bool {
        let k = (n / self.gateways) as u64;
        (k + 1) * self.fix_percent / 100 > k * self.fix_percent / 100
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
        let engines = if self.engine_faults { self.shards * self.engines } else { 0 };
        let cast = Cast { engines, gateways, broker_nodes: crate::broker::BROKER_NODES };
        faults::schedule(&mut rng, &self.fault_kinds, self.fault_count, self.fault_window_ns, cast)
    }

    /// Refuses a shape the simulator cannot run.
    pub fn validate(&self) -> Result<(), SimError> {
        let fits = self.shards > 0 && self.engines > 0 && self.gateways > 0 && self.clients > 0;
        if !fits || self.clients > self.tier.universe.clients as usize {
            return Err(SimError::BadInput(format!(
                "shards, engines, gateways and clients must be > 0 and clients ≤ {}",
                self.tier.universe.clients
            )));
        }
        if self.fix_percent > 100 {
            return Err(SimError::BadInput("the FIX share is a percent: 0 to 100".into()));
        }
        if self.gateways as u32 != self.tier.outlets {
            return Err(SimError::BadInput("the tier's gateways must equal the gateways".into()));
        }
        Ok(())
    }
}
