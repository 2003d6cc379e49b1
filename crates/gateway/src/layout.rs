//! Where `exchange serve` runs the engine step (pre-process checks, journal append, matching),
//! chosen from the CPUs the process may use.
//!
//! * [`Chosen::Inline`]: on the I/O thread, right after a session decodes a read's orders:
//!   decode → check → match → route → encode → write runs to completion on one thread. Nothing
//!   parks or notifies per order; the ingress and egress rings stay as the hand-off structures
//!   (a push and a read on the same thread, no atomics contended).
//! * [`Chosen::EngineThread`]: on a thread of its own (the I/O thread and the engine overlap
//!   their work), spinning pinned on a CPU nobody else is planned on when the host has one
//!   ([`ENGINE_SPIN_CPUS_MIN`]), parking otherwise. Each order then crosses threads twice
//!   (I/O → engine over the ingress ring, engine → I/O over the egress ring and a wake-up of
//!   the I/O thread's poll).
//!
//! `auto` takes the engine thread only where it can spin: a parked engine costs two thread
//! wake-ups per order, which on the 2-CPU development host made the engine-thread layout's
//! p50 several times the inline one's (docs/benchmarks/order-entry.md), and an engine spinning
//! without a CPU of its own takes that CPU from the I/O thread it waits for.

use pipeline::placement::{CpuId, PlacementPlan, Role, ThreadRequest, Topology};

/// Usable CPUs (affinity mask, capped by the cgroup quota) from which the engine thread spins
/// on a CPU of its own: one for the I/O thread, one for the engine, and at least one left for
/// the kernel, the store's syncer, the journal's writer and the release thread.
pub const ENGINE_SPIN_CPUS_MIN: usize = 3;

/// The layout asked for (`exchange serve --layout`, `layout` in the serve TOML).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Layout {
    /// Decide from the usable CPUs (see the module docs).
    #[default]
    Auto,
    Inline,
    EngineThread,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::Auto, Layout::Inline, Layout::EngineThread];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Auto => "auto",
            Layout::Inline => "inline",
            Layout::EngineThread => "engine-thread",
        }
    }
}

/// The layout the server runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chosen {
    Inline,
    /// `spin_cpu`: the CPU the engine is pinned to and spins on; `None`: it parks when idle.
    EngineThread {
        spin_cpu: Option<CpuId>,
    },
}

impl Chosen {
    pub fn name(&self) -> &'static str {
        match self {
            Chosen::Inline => "inline",
            Chosen::EngineThread { spin_cpu: Some(_) } => "engine-thread-spin",
            Chosen::EngineThread { spin_cpu: None } => "engine-thread-park",
        }
    }
}

/// The decision, with what it was based on (logged at start-up, served as metrics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutPlan {
    pub requested: Layout,
    pub chosen: Chosen,
    /// CPUs the process may use: the affinity mask capped by the cgroup quota.
    pub usable_cpus: usize,
    pub reason: String,
    /// Where the I/O thread may run: every usable CPU but a spinning engine's (`None`: no
    /// restriction), so the kernel never puts it, or the threads it starts, on the CPU the
    /// engine spins on.
    pub io_cpus: Option<Vec<CpuId>>,
}

/// Plans `requested` on `topology`.
pub fn plan(requested: Layout, topology: &Topology) -> LayoutPlan {
    let usable_cpus = topology.usable_cpu_count();
    let spin_cpu = spin_cpu(topology);
    let (chosen, reason) = match (requested, spin_cpu) {
        (Layout::Inline, _) => (Chosen::Inline, "asked for".to_string()),
        (Layout::EngineThread, Some(cpu)) => (
            Chosen::EngineThread { spin_cpu: Some(cpu) },
            format!("asked for; CPU {cpu} is free for the engine to spin on"),
        ),
        (Layout::EngineThread, None) => (
            Chosen::EngineThread { spin_cpu: None },
            format!(
                "asked for; fewer than {ENGINE_SPIN_CPUS_MIN} usable CPUs, so the engine parks \
                 when idle"
            ),
        ),
        (Layout::Auto, Some(cpu)) => (
            Chosen::EngineThread { spin_cpu: Some(cpu) },
            format!(
                "{usable_cpus} usable CPUs ≥ {ENGINE_SPIN_CPUS_MIN}: the engine spins on CPU \
                 {cpu} of its own"
            ),
        ),
        (Layout::Auto, None) => (
            Chosen::Inline,
            format!(
                "{usable_cpus} usable CPUs < {ENGINE_SPIN_CPUS_MIN}: no CPU for a spinning \
                 engine, and a parked one costs two wake-ups per order"
            ),
        ),
    };
    let io_cpus = match chosen {
        Chosen::EngineThread { spin_cpu: Some(cpu) } => {
            Some(topology.usable_cpus.iter().copied().filter(|&c| c != cpu).collect())
        }
        Chosen::Inline | Chosen::EngineThread { spin_cpu: None } => None,
    };
    LayoutPlan { requested, chosen, usable_cpus, reason, io_cpus }
}

/// The CPU a spinning engine thread gets: planned as critical beside the I/O thread, only
/// when neither shares a CPU and a core is left to the rest.
fn spin_cpu(topology: &Topology) -> Option<CpuId> {
    if topology.usable_cpu_count() < ENGINE_SPIN_CPUS_MIN {
        return None;
    }
    let critical = |label: &str| ThreadRequest { label: label.into(), role: Role::Critical };
    let plan = PlacementPlan::new(topology, &[critical("gateway-io"), critical("gateway-engine")]);
    let engine = &plan.threads[1];
    let free = !plan.oversubscribed && !plan.os_reserved_cpus.is_empty() && engine.exclusive;
    free.then(|| engine.cpus[0])
}

/// The running host's topology; a host whose `/sys` cannot be read counts as its affinity
/// mask's CPUs, one core each, under its quota.
pub fn detect_topology() -> Topology {
    Topology::detect().unwrap_or_else(|error| {
        tracing::warn!(%error, "CPU topology unreadable; assuming one core per usable CPU");
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Topology::uniform(cpus).with_cpu_quota(pipeline::quota::current_cpu_quota_cores())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_runs_inline_below_the_spin_threshold_and_spins_from_it() {
        for cpus in 1..ENGINE_SPIN_CPUS_MIN {
            let plan = plan(Layout::Auto, &Topology::uniform(cpus));
            assert_eq!(plan.chosen, Chosen::Inline, "{cpus} CPUs");
            assert_eq!(plan.usable_cpus, cpus);
        }
        let plan = plan(Layout::Auto, &Topology::uniform(ENGINE_SPIN_CPUS_MIN));
        let Chosen::EngineThread { spin_cpu: Some(cpu) } = plan.chosen else {
            panic!("expected a spinning engine: {plan:?}");
        };
        assert_ne!(cpu, 0, "CPU 0's core is left to the OS");
        let io_cpus = plan.io_cpus.expect("the I/O thread kept off the engine's CPU");
        assert!(!io_cpus.contains(&cpu) && io_cpus.len() == ENGINE_SPIN_CPUS_MIN - 1);
    }

    #[test]
    fn a_quota_below_the_threshold_keeps_auto_inline() {
        let topology = Topology::uniform(8).with_cpu_quota(Some(2.5));
        let plan = plan(Layout::Auto, &topology);
        assert_eq!((plan.chosen, plan.usable_cpus), (Chosen::Inline, 2));
    }

    #[test]
    fn an_explicit_engine_thread_parks_without_a_free_cpu() {
        let plan = plan(Layout::EngineThread, &Topology::uniform(2));
        assert_eq!(plan.chosen, Chosen::EngineThread { spin_cpu: None });
        assert_eq!(super::plan(Layout::Inline, &Topology::uniform(16)).chosen, Chosen::Inline);
    }
}
