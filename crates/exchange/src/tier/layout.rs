//! The tier's layout: which stages share a thread (fused), how many workers each thread group
//! runs, which threads spin and which park, and which get a CPU of their own.
//!
//! [`plan`] is a pure function of the host (usable CPUs and the cgroup quota), each critical
//! stage's measured service time and the arrival rate. It tries every way of cutting the
//! critical chain pre-process → core → R-Processor → R-Sender into consecutive thread groups
//! (8 of them), models each group as an M/M/c node of the `planner` crate (service time: the
//! sum of its stages'; c: the fewest workers that keep it under [`UTILIZATION_TARGET`]), adds
//! a hand-off cost per ring between groups (a spinning receiver sees a message within
//! [`HOP_SPINNING_NS`], a parked one needs a wake-up, [`HOP_WAKE_UP_NS`]) and keeps the cut
//! with the lowest predicted latency. Groups spin, in path order, only while dedicated CPUs
//! are left (usable CPUs less the threads outside the tier, i.e. the load generator); the
//! rest park, on a CPU of their own while one is left, else floating (unplaced, unpinned).
//! So spinning threads never outnumber the CPUs, and on a 2-core host the tier asks the
//! placement plan for at most one CPU. With replies held for the journal (`group`, `sync`)
//! the R-Processor waits for fsyncs, so the chain is always cut after the core: the wait
//! stays off the critical path. The load generator, outside the tier, spins through its gaps
//! only when a free CPU is left over besides its own (see [`TierLayout::outside_threads_spin`]),
//! else it sleeps between distant requests.

use planner::node::Mmc;
use serde::{Deserialize, Serialize};

/// Highest utilization the planner gives a thread group: beyond it queueing delay grows
/// quickly (M/M/1 at 0.7 waits 2.3 service times).
pub const UTILIZATION_TARGET: f64 = 0.7;
/// Model parameter: mean hand-off latency through a ring to a spinning consumer. The ring
/// bench measures one-way hops of about 100 ns; this allows for a cache miss on the slot.
pub const HOP_SPINNING_NS: f64 = 200.0;
/// Model parameter: mean hand-off latency to a parked consumer (futex wake-up and the
/// scheduler putting the thread back on a CPU). Only its size against [`HOP_SPINNING_NS`]
/// and the service times matters: it makes every ring to a parked thread expensive.
pub const HOP_WAKE_UP_NS: f64 = 20_000.0;
/// Most workers the planner gives one group (matches `STAGE_WORKERS_MAX`).
pub const GROUP_WORKERS_MAX: usize = super::STAGE_WORKERS_MAX;

/// How the tier's stages are laid out on threads (TOML `layout`, flag `--layout`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutChoice {
    /// Planned from the host's usable CPUs and calibrated service times ([`plan`]); the
    /// configured worker counts, wait and placement are the planner's to choose.
    #[default]
    Auto,
    /// One thread per stage worker, as configured (the layout before fusion existed).
    ThreadPerStage,
}

impl LayoutChoice {
    pub const ALL: [LayoutChoice; 2] = [LayoutChoice::Auto, LayoutChoice::ThreadPerStage];

    /// The serde name.
    pub fn name(self) -> &'static str {
        match self {
            LayoutChoice::Auto => "auto",
            LayoutChoice::ThreadPerStage => "thread-per-stage",
        }
    }
}

impl std::fmt::Display for LayoutChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A stage of the tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierStage {
    Preprocess,
    Core,
    Rprocess,
    Sender,
    Events,
    Masterdata,
}

/// The critical chain, in path order.
pub const CHAIN: [TierStage; 4] =
    [TierStage::Preprocess, TierStage::Core, TierStage::Rprocess, TierStage::Sender];

impl TierStage {
    /// The pipeline stage's name.
    pub fn name(self) -> &'static str {
        match self {
            TierStage::Preprocess => "preprocess",
            TierStage::Core => "core",
            TierStage::Rprocess => "rprocess",
            TierStage::Sender => "sender",
            TierStage::Events => "events",
            TierStage::Masterdata => "masterdata",
        }
    }
}

/// Mean service time per message of each critical stage, ns (in [`CHAIN`] order).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceTimes {
    pub preprocess_ns: f64,
    pub core_ns: f64,
    pub rprocess_ns: f64,
    pub sender_ns: f64,
}

impl ServiceTimes {
    fn of(&self, stage: TierStage) -> f64 {
        match stage {
            TierStage::Preprocess => self.preprocess_ns,
            TierStage::Core => self.core_ns,
            TierStage::Rprocess => self.rprocess_ns,
            TierStage::Sender => self.sender_ns,
            TierStage::Events | TierStage::Masterdata => 0.0,
        }
    }
}

/// What the layout is planned from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LayoutRequest {
    /// CPUs in the process's affinity mask.
    pub cpus: usize,
    /// The cgroup's `cpu.max` quota in CPUs (`None`: no quota).
    pub cpu_quota_cores: Option<f64>,
    /// Service times of stages fed by a ring (a group's first stage): their input crosses
    /// from another core, and a parked thread's first message after a wake-up is cold.
    pub service: ServiceTimes,
    /// Service times of stages fused after another on its thread (no ring before them):
    /// their input is still in the thread's cache, so they cost less (the core: 0.56 against
    /// 1.0 µs at 200K msg/s on the 2-vCPU VM, docs/benchmarks/tier-layout.md).
    pub fused_service: ServiceTimes,
    pub rate_per_s: f64,
    /// Replies are held until their input is durable (the R-Processor waits for fsyncs).
    pub holds_replies: bool,
    /// Busy threads outside the tier that need a CPU (the load generator).
    pub outside_threads: usize,
    /// CPUs other processes kept busy, measured just before the run (a shared host's CPUs
    /// are not dedicated: a thread spinning on one is preempted for whole time slices).
    pub busy_elsewhere_cpus: f64,
    /// Core shards: fixed by the configuration, not planned (the shard journals and the
    /// instrument-to-shard mapping persist across restarts).
    pub core_shards: usize,
    /// Every output must follow the input's order (a replicated engine): the pre-process
    /// gets one worker.
    pub ordered_outputs: bool,
}

/// How a thread group waits for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GroupWait {
    /// Busy-spins on a dedicated CPU, pinned.
    Spin,
    /// Parks on a CPU of its own, pinned.
    ParkDedicated,
    /// Parks without a CPU of its own: on whichever of the plan's floating CPUs (those no
    /// exclusive thread holds) the OS gives it.
    ParkFloating,
}

/// Consecutive stages run on the same threads (fused), `workers` threads of them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThreadGroup {
    pub stages: Vec<TierStage>,
    pub workers: usize,
    pub wait: GroupWait,
    /// λ · Σ service / workers (0 for the ancillary group, which the model does not cover).
    pub predicted_utilization: f64,
}

impl ThreadGroup {
    /// "preprocess+core".
    pub fn label(&self) -> String {
        self.stages.iter().map(|s| s.name()).collect::<Vec<_>>().join("+")
    }

    pub fn spins(&self) -> bool {
        self.wait == GroupWait::Spin
    }
}

/// The chosen layout.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierLayout {
    /// The critical chain's groups in path order, then the ancillary ones.
    pub groups: Vec<ThreadGroup>,
    /// CPUs the plan had: the affinity mask capped by the quota's whole CPUs.
    pub usable_cpus: usize,
    /// CPUs other processes kept busy when it was planned (not dedicated to the tier).
    pub busy_elsewhere_cpus: f64,
    /// Model prediction of the mean latency through the chain (no durability wait), ns.
    pub predicted_latency_ns: f64,
    /// Every cut saturates some group at this rate: the layout with the most headroom.
    pub saturated: bool,
    /// The threads outside the tier (the load generator) have a free CPU of their own in this
    /// plan with one more left over, so the generator spins through its gaps instead of
    /// sleeping: a sleep would save nothing the tier needs, and its late wake-ups would count
    /// in every latency.
    pub outside_threads_spin: bool,
    /// The load generator runs on the chain's first thread, before the pre-process, run to
    /// completion (`pipeline`'s stage fused after a source): chosen when that thread spins
    /// alone (one worker) and the generator would otherwise have no CPU of its own to spare,
    /// so it takes none; the CPU the plan kept for it is left to the journal and the OS.
    pub generator_inline: bool,
}

impl TierLayout {
    pub fn spinning_threads(&self) -> usize {
        self.groups.iter().filter(|g| g.spins()).map(|g| g.workers).sum()
    }

    /// Threads that take a CPU of their own in the placement plan.
    pub fn placed_threads(&self) -> usize {
        let placed = self.groups.iter().filter(|g| g.wait != GroupWait::ParkFloating);
        placed.map(|g| g.workers).sum()
    }

    /// The group running `stage`.
    pub fn group_of(&self, stage: TierStage) -> &ThreadGroup {
        let group = self.groups.iter().find(|g| g.stages.contains(&stage));
        group.expect("every layout runs every stage")
    }

    /// Workers of `stage` (those of its group).
    pub fn workers_of(&self, stage: TierStage) -> usize {
        self.group_of(stage).workers
    }

    /// Whether `stage` runs fused after the stage before it.
    pub fn fused_after_previous(&self, stage: TierStage) -> bool {
        let group = self.group_of(stage);
        group.stages.first() != Some(&stage)
    }
}

/// Usable CPUs: the affinity mask capped by the quota's whole CPUs, at least 1 (a quota of 1.5
/// CPUs cannot keep two spinning threads running).
pub fn usable_cpus(cpus: usize, cpu_quota_cores: Option<f64>) -> usize {
    let cpus = cpus.max(1);
    match cpu_quota_cores {
        Some(quota) if quota.is_finite() => cpus.min((quota.floor() as usize).max(1)),
        _ => cpus,
    }
}

/// The usable CPUs that other processes leave free: a CPU counts as taken once they keep more
/// than half of it busy. (Rounding down instead made one 10 ms tick of other work in the
/// 100 ms load sample — 0.1 CPU, the sample's resolution — take a whole CPU from a 2-CPU
/// host's plan, and the critical thread parked instead of spinning: `leantier demo`'s 60K
/// run, p99 1.9 ms.)
fn free_cpus(usable: usize, busy_elsewhere_cpus: f64) -> usize {
    let busy = busy_elsewhere_cpus;
    let busy = if busy.is_finite() && busy > 0.0 { busy } else { 0.0 };
    (usable as f64 - busy).round().max(0.0) as usize
}

/// Plans the layout (see the module docs).
pub fn plan(request: &LayoutRequest) -> TierLayout {
    let usable = usable_cpus(request.cpus, request.cpu_quota_cores);
    let busy = request.busy_elsewhere_cpus;
    let free = free_cpus(usable, busy);
    let dedicated = free.saturating_sub(request.outside_threads);
    let mut best: Option<Candidate> = None;
    for cuts in 0..1u32 << (CHAIN.len() - 1) {
        // Bit b set: a ring (a thread boundary) between CHAIN[b] and CHAIN[b + 1].
        if request.holds_replies && cuts & 0b010 == 0 {
            continue; // the R-Processor's durability wait must not stall the core's thread
        }
        let Some(candidate) = Candidate::evaluate(request, cuts, dedicated) else {
            continue;
        };
        if best.as_ref().is_none_or(|incumbent| candidate.better_than(incumbent)) {
            best = Some(candidate);
        }
    }
    let chosen = best.expect("at least the fully cut chain is a candidate");
    let layout = chosen.into_layout(usable, busy);
    let outside_threads_spin = outside_threads_spin(&layout, request, free);
    let first = &layout.groups[0];
    let generator_inline =
        request.outside_threads > 0 && !outside_threads_spin && first.spins() && first.workers == 1;
    TierLayout { outside_threads_spin, generator_inline, ..layout }
}

/// Whether the load generator spins: only while a free CPU is still left over once it and
/// every placed tier thread have one (the CPU `pipeline::placement` leaves to the OS). A VM
/// whose vCPUs are all busy is stopped by its host for milliseconds at a time
/// (`scripts/probe-host-stops`: on the 2-vCPU development VM, none longer than 0.4 ms with one
/// vCPU spinning, several of 2–40 ms per second with both), so spinning on the last CPU costs
/// more in the tail than a sleep's late wake-up; the generator then sleeps between distant
/// requests (its pacer spins through short gaps anyway).
fn outside_threads_spin(layout: &TierLayout, request: &LayoutRequest, free_cpus: usize) -> bool {
    let left = free_cpus.saturating_sub(layout.placed_threads());
    request.outside_threads > 0 && left > request.outside_threads
}

/// A group's service time per message: its first stage's time as a ring-fed stage, the
/// others' as fused stages.
fn group_service_ns(request: &LayoutRequest, stages: &[TierStage]) -> f64 {
    let fed_by_a_ring = stages.first().map_or(0.0, |&first| request.service.of(first));
    let fused: f64 = stages.iter().skip(1).map(|&stage| request.fused_service.of(stage)).sum();
    fed_by_a_ring + fused
}

/// One way of cutting the chain, evaluated.
struct Candidate {
    groups: Vec<ThreadGroup>,
    /// Dedicated CPUs left after the chain's groups.
    dedicated_left: usize,
    /// Highest utilization of any group (≥ 1: saturated).
    peak_utilization: f64,
    latency_ns: f64,
}

impl Candidate {
    /// `None` when the cut cannot run: fused stages share their workers, so the one-worker
    /// R-Processor cannot share a thread with more than one core shard.
    fn evaluate(request: &LayoutRequest, cuts: u32, dedicated: usize) -> Option<Candidate> {
        let mut groups: Vec<ThreadGroup> = Vec::new();
        for (index, &stage) in CHAIN.iter().enumerate() {
            let starts_group = index == 0 || cuts & (1 << (index - 1)) != 0;
            if starts_group {
                groups.push(ThreadGroup {
                    stages: Vec::new(),
                    workers: 1,
                    wait: GroupWait::ParkFloating,
                    predicted_utilization: 0.0,
                });
            }
            groups.last_mut().expect("the first stage starts a group").stages.push(stage);
        }
        let mut dedicated_left = dedicated;
        let (mut latency_ns, mut peak_utilization) = (0.0, 0.0f64);
        for group in &mut groups {
            let service_ns = group_service_ns(request, &group.stages);
            // The R-Processor is one worker (it orders every shard's replies) and the core has
            // its configured shards; other groups get the fewest workers under the target.
            let (single, core) = (
                group.stages.contains(&TierStage::Rprocess),
                group.stages.contains(&TierStage::Core),
            );
            let ordered = request.ordered_outputs && group.stages.contains(&TierStage::Preprocess);
            group.workers = match (single, core) {
                (true, true) if request.core_shards != 1 => return None,
                (true, _) => 1,
                (false, true) => request.core_shards.max(1),
                (false, false) if ordered => 1,
                (false, false) => workers_for(request.rate_per_s, service_ns.max(1.0)),
            };
            group.predicted_utilization =
                request.rate_per_s * service_ns * 1e-9 / group.workers as f64;
            peak_utilization = peak_utilization.max(group.predicted_utilization);
            group.wait = if group.workers <= dedicated_left {
                dedicated_left -= group.workers;
                GroupWait::Spin
            } else {
                GroupWait::ParkFloating
            };
            let hop_ns = if group.spins() { HOP_SPINNING_NS } else { HOP_WAKE_UP_NS };
            latency_ns += hop_ns + sojourn_ns(request.rate_per_s, service_ns, group.workers);
        }
        Some(Candidate { groups, dedicated_left, peak_utilization, latency_ns })
    }

    /// Stable candidates by latency, then fewer threads; saturated ones by headroom.
    fn better_than(&self, other: &Candidate) -> bool {
        let (stable, other_stable) = (self.peak_utilization < 1.0, other.peak_utilization < 1.0);
        if stable != other_stable {
            return stable;
        }
        if !stable {
            return self.peak_utilization < other.peak_utilization;
        }
        let threads = |c: &Candidate| c.groups.iter().map(|g| g.workers).sum::<usize>();
        // Within 1%: a tie on latency, broken by fewer threads.
        if (self.latency_ns - other.latency_ns).abs() <= 0.01 * other.latency_ns {
            return threads(self) < threads(other);
        }
        self.latency_ns < other.latency_ns
    }

    /// Parked chain groups get the dedicated CPUs left, then the ancillary stages do: their
    /// own threads with two CPUs left, fused on one otherwise (floating without one).
    fn into_layout(mut self, usable_cpus: usize, busy_elsewhere_cpus: f64) -> TierLayout {
        for group in self.groups.iter_mut().filter(|g| !g.spins()) {
            if group.workers <= self.dedicated_left {
                self.dedicated_left -= group.workers;
                group.wait = GroupWait::ParkDedicated;
            }
        }
        let ancillary = |stages: Vec<TierStage>, wait| ThreadGroup {
            stages,
            workers: 1,
            wait,
            predicted_utilization: 0.0,
        };
        let (events, master) = (TierStage::Events, TierStage::Masterdata);
        match self.dedicated_left {
            0 => self.groups.push(ancillary(vec![events, master], GroupWait::ParkFloating)),
            1 => self.groups.push(ancillary(vec![events, master], GroupWait::ParkDedicated)),
            _ => {
                self.groups.push(ancillary(vec![events], GroupWait::ParkDedicated));
                self.groups.push(ancillary(vec![master], GroupWait::ParkDedicated));
            }
        }
        TierLayout {
            groups: self.groups,
            usable_cpus,
            busy_elsewhere_cpus,
            predicted_latency_ns: self.latency_ns,
            saturated: self.peak_utilization >= 1.0,
            outside_threads_spin: false,
            generator_inline: false,
        }
    }
}

/// The fewest workers keeping `rate_per_s` × `service_ns` per worker under the target.
fn workers_for(rate_per_s: f64, service_ns: f64) -> usize {
    let offered = rate_per_s * service_ns * 1e-9;
    let workers = (offered / UTILIZATION_TARGET).ceil() as usize;
    workers.clamp(1, GROUP_WORKERS_MAX)
}

/// Mean time in an M/M/c node (waiting + service), ns; infinite when unstable.
fn sojourn_ns(rate_per_s: f64, service_ns: f64, workers: usize) -> f64 {
    let service_rate_per_s = 1e9 / service_ns.max(1.0);
    match Mmc::new(rate_per_s, service_rate_per_s, workers as u32) {
        Ok(node) => node.metrics().response_time_s * 1e9,
        Err(_) => f64::INFINITY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Service times of the order of the tier's on a laptop-class core.
    const SERVICE: ServiceTimes = ServiceTimes {
        preprocess_ns: 300.0,
        core_ns: 1_200.0,
        rprocess_ns: 150.0,
        sender_ns: 250.0,
    };

    fn request(cpus: usize, quota: Option<f64>, rate_per_s: f64, holds: bool) -> LayoutRequest {
        LayoutRequest {
            cpus,
            cpu_quota_cores: quota,
            service: SERVICE,
            fused_service: SERVICE,
            rate_per_s,
            holds_replies: holds,
            outside_threads: 1,
            core_shards: 1,
            ordered_outputs: false,
            busy_elsewhere_cpus: 0.0,
        }
    }

    /// What every layout must satisfy.
    fn check_invariants(layout: &TierLayout, request: &LayoutRequest) {
        let chain: Vec<TierStage> = layout
            .groups
            .iter()
            .flat_map(|g| g.stages.iter().copied())
            .filter(|s| CHAIN.contains(s))
            .collect();
        assert_eq!(chain, CHAIN, "each chain stage once, in path order: {layout:?}");
        for stage in [TierStage::Events, TierStage::Masterdata] {
            assert_eq!(layout.groups.iter().filter(|g| g.stages.contains(&stage)).count(), 1);
        }
        let usable = usable_cpus(request.cpus, request.cpu_quota_cores);
        assert!(layout.spinning_threads() + request.outside_threads.min(usable) <= usable.max(1));
        if layout.outside_threads_spin {
            let free = free_cpus(usable, request.busy_elsewhere_cpus);
            let spinning = layout.placed_threads() + request.outside_threads;
            assert!(spinning < free, "a CPU is left over besides the generator's: {layout:?}");
        }
        assert!(layout.placed_threads() <= usable, "no oversubscription: {layout:?}");
        if request.holds_replies {
            assert!(!layout.fused_after_previous(TierStage::Rprocess), "{layout:?}");
        }
        assert_eq!(layout.workers_of(TierStage::Rprocess), 1);
        assert_eq!(layout.workers_of(TierStage::Core), request.core_shards);
        if !layout.saturated {
            for group in &layout.groups {
                // Only the groups whose workers are fixed may run past the target.
                let single = group.stages.contains(&TierStage::Rprocess)
                    || group.stages.contains(&TierStage::Core);
                assert!(group.predicted_utilization <= UTILIZATION_TARGET + 1e-9 || single);
                assert!(group.predicted_utilization < 1.0, "{layout:?}");
            }
        }
    }

    #[test]
    fn two_cores_fuse_the_chain_on_one_spinning_thread_and_float_the_rest() {
        for rate in [20_000.0, 60_000.0] {
            let request = request(2, None, rate, false);
            let layout = plan(&request);
            check_invariants(&layout, &request);
            assert_eq!(layout.groups[0].stages, CHAIN, "{layout:?}");
            assert!(layout.groups[0].spins());
            assert_eq!(layout.spinning_threads(), 1);
            let ancillary = layout.group_of(TierStage::Events);
            assert_eq!(ancillary.stages, [TierStage::Events, TierStage::Masterdata]);
            assert_eq!(ancillary.wait, GroupWait::ParkFloating);
            assert_eq!(layout.placed_threads(), 1);
            assert!(!layout.outside_threads_spin, "no CPU would be left over: {layout:?}");
        }
        // One CPU: nothing spins, the generator included.
        let single = request(1, None, 20_000.0, false);
        let layout = plan(&single);
        check_invariants(&layout, &single);
        assert_eq!(layout.spinning_threads(), 0);
        assert!(!layout.outside_threads_spin, "{layout:?}");
    }

    #[test]
    fn held_replies_cut_the_chain_after_the_core() {
        let request = request(2, None, 60_000.0, true);
        let layout = plan(&request);
        check_invariants(&layout, &request);
        assert_eq!(layout.groups[0].stages, [TierStage::Preprocess, TierStage::Core]);
        assert!(layout.groups[0].spins());
        assert_eq!(layout.group_of(TierStage::Rprocess).wait, GroupWait::ParkFloating);
        assert_eq!(layout.spinning_threads(), 1);
        assert!(!layout.outside_threads_spin, "no CPU would be left over: {layout:?}");
    }

    #[test]
    fn four_cores_give_the_ancillary_stages_a_cpu_and_keep_spinning_within_bounds() {
        let request = request(4, None, 60_000.0, true);
        let layout = plan(&request);
        check_invariants(&layout, &request);
        // Three dedicated CPUs: both chain groups spin, the ancillary pair gets the last one.
        assert_eq!(layout.spinning_threads(), 2, "{layout:?}");
        let ancillary = layout.group_of(TierStage::Events);
        assert_eq!(ancillary.wait, GroupWait::ParkDedicated);
        assert_eq!(ancillary.stages.len(), 2);
    }

    #[test]
    fn fused_stages_are_planned_at_their_fused_service_times() {
        // 8 CPUs, 400K msg/s: the chain at its ring-fed times (1.9 µs per message) would be
        // 76% of one thread, whose queueing delay then outweighs the hops of a cut chain; at
        // the times its stages take when fused after the pre-process (a third of them, as the
        // core on the development VM), one thread is 33% busy and the fused chain is fastest.
        let ring_fed = request(8, None, 400_000.0, false);
        assert!(plan(&ring_fed).groups.iter().filter(|g| CHAIN.contains(&g.stages[0])).count() > 1);
        let fused_service = ServiceTimes {
            core_ns: SERVICE.core_ns / 3.0,
            rprocess_ns: SERVICE.rprocess_ns / 3.0,
            sender_ns: SERVICE.sender_ns / 3.0,
            ..SERVICE
        };
        let fused = LayoutRequest { fused_service, ..ring_fed };
        let layout = plan(&fused);
        check_invariants(&layout, &fused);
        let chain = layout.group_of(TierStage::Preprocess);
        assert_eq!(chain.stages, CHAIN, "{layout:?}");
        let expected = 400_000.0 * (300.0 + (1_200.0 + 150.0 + 250.0) / 3.0) * 1e-9;
        assert!((chain.predicted_utilization - expected).abs() < 1e-9, "{layout:?}");
    }

    #[test]
    fn sixteen_cores_at_a_high_rate_spread_the_chain_over_spinning_workers() {
        let request = LayoutRequest { core_shards: 4, ..request(16, None, 1_000_000.0, false) };
        let layout = plan(&request);
        check_invariants(&layout, &request);
        assert!(!layout.saturated, "{layout:?}");
        // 1.9 µs per message at 1M msg/s cannot run on one thread: the chain is cut, the
        // R-Processor apart from the four shards.
        assert!(!layout.fused_after_previous(TierStage::Rprocess), "{layout:?}");
        let preprocess = layout.group_of(TierStage::Preprocess);
        assert!(preprocess.predicted_utilization <= UTILIZATION_TARGET, "{layout:?}");
        let chain_groups = || layout.groups.iter().filter(|g| CHAIN.contains(&g.stages[0]));
        assert!(chain_groups().all(ThreadGroup::spins), "{layout:?}");
        assert_eq!(layout.group_of(TierStage::Masterdata).stages, [TierStage::Masterdata]);
        assert!(layout.outside_threads_spin, "CPUs are left over for the generator: {layout:?}");
    }

    #[test]
    fn ordered_outputs_keep_the_pre_process_on_one_worker() {
        // 3 µs per request at 1M requests/s: the pre-process alone would get several workers.
        let slow = ServiceTimes { preprocess_ns: 3_000.0, ..SERVICE };
        let fast = request(16, None, 1_000_000.0, false);
        let free = LayoutRequest { service: slow, fused_service: slow, ..fast };
        assert!(plan(&free).workers_of(TierStage::Preprocess) > 1, "{:?}", plan(&free));
        let ordered = LayoutRequest { ordered_outputs: true, ..free };
        let layout = plan(&ordered);
        check_invariants(&layout, &ordered);
        assert_eq!(layout.workers_of(TierStage::Preprocess), 1, "{layout:?}");
    }

    #[test]
    fn sixty_four_cores_follow_the_quota() {
        let free = request(64, None, 60_000.0, false);
        let layout = plan(&free);
        check_invariants(&layout, &free);
        assert_eq!(layout.usable_cpus, 64);
        let chain_groups = || layout.groups.iter().filter(|g| CHAIN.contains(&g.stages[0]));
        assert!(chain_groups().all(ThreadGroup::spins), "{layout:?}");
        // A quota of 2.5 CPUs on the same machine plans like a 2-core host.
        let quota = request(64, Some(2.5), 60_000.0, false);
        let capped = plan(&quota);
        check_invariants(&capped, &quota);
        assert_eq!(capped.usable_cpus, 2);
        assert_eq!(capped, plan(&request(2, None, 60_000.0, false)));
        // Under one CPU of quota nothing may spin: the load generator has the only CPU.
        let tiny = request(64, Some(0.5), 20_000.0, false);
        let parked = plan(&tiny);
        check_invariants(&parked, &tiny);
        assert_eq!(parked.spinning_threads(), 0);
        assert_eq!(parked.placed_threads(), 0);
    }

    #[test]
    fn quota_sixteen_cores_and_saturation() {
        let request = request(16, Some(4.0), 60_000.0, false);
        let layout = plan(&request);
        check_invariants(&layout, &request);
        assert_eq!(layout.usable_cpus, 4);
        assert!(layout.spinning_threads() <= 3);
        // A rate no cut can carry (one core shard alone is at 1 200%) is reported saturated.
        let overload = LayoutRequest { rate_per_s: 10_000_000.0, ..request };
        let layout = plan(&overload);
        assert!(layout.saturated);
        assert!(layout.group_of(TierStage::Core).predicted_utilization >= 1.0, "{layout:?}");
    }

    #[test]
    fn cpus_busy_elsewhere_are_not_dedicated() {
        // A 2-core host whose other processes keep 1.5 CPUs busy: nothing may spin, and the
        // chain still runs fused (every ring would cost a wake-up).
        let loaded =
            LayoutRequest { busy_elsewhere_cpus: 1.5, ..request(2, None, 60_000.0, false) };
        let layout = plan(&loaded);
        check_invariants(&layout, &loaded);
        assert_eq!(layout.spinning_threads(), 0, "{layout:?}");
        assert!(!layout.outside_threads_spin, "{layout:?}");
        assert_eq!(layout.groups[0].stages, CHAIN);
        // On 16 CPUs with 4 busy elsewhere the chain still gets a spinning thread.
        let shared =
            LayoutRequest { busy_elsewhere_cpus: 4.0, ..request(16, None, 60_000.0, true) };
        let layout = plan(&shared);
        check_invariants(&layout, &shared);
        assert!(layout.groups[0].spins());
        assert!(layout.placed_threads() <= 16 - 4);
    }

    #[test]
    fn a_tick_of_other_work_leaves_the_cpu_free() {
        // 0.1 CPU is one 10 ms tick in the 100 ms load sample: the 2-CPU host still spins its
        // critical thread. 0.6 CPU busy elsewhere takes the CPU.
        assert_eq!((free_cpus(2, 0.1), free_cpus(2, 0.6), free_cpus(2, 2.5)), (2, 1, 0));
        assert_eq!((free_cpus(4, f64::NAN), free_cpus(4, -1.0)), (4, 4));
        let noise = LayoutRequest { busy_elsewhere_cpus: 0.1, ..request(2, None, 60_000.0, false) };
        let layout = plan(&noise);
        check_invariants(&layout, &noise);
        assert!(layout.groups[0].spins(), "{layout:?}");
    }

    #[test]
    fn choice_names_round_trip() {
        for choice in LayoutChoice::ALL {
            let json = serde_json::to_value(choice).unwrap();
            assert_eq!(json, choice.name());
            assert_eq!(serde_json::from_value::<LayoutChoice>(json).unwrap(), choice);
        }
        assert_eq!(usable_cpus(8, Some(1.5)), 1);
        assert_eq!(usable_cpus(8, Some(0.2)), 1);
        assert_eq!(usable_cpus(3, Some(16.0)), 3);
    }
}
