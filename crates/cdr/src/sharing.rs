//! What the isolated node measurements leave out when the pipeline's threads share the cores:
//! a usable core share and the runtime's CPU per hand-off under the configuration's own thread
//! counts, both measured by a short probe (issue 19, item 7).
//!
//! Each node measured alone gives its CPU time per job; the cores' bound divides the cores by
//! the CPU time per ticket. A flat-out pipeline with more threads than cores falls short of
//! that bound in two ways (docs/benchmarks/planner.md, 3.4): measured / predicted = (cores
//! used / cores) × (c_model / c_run). Cores sit idle although tickets wait (a thread
//! saturated while the others park on empty or full rings, wake-up latency), and each
//! hand-off costs more CPU with five or six threads on two cores than in the one-worker hop
//! calibration. Neither is a property of one node, so neither is in a per-node μ.
//!
//! The probe replays the configuration without its real work and without I/O: the cdr graph's
//! shape with the configuration's worker counts on the stage runtime of `cdr run`, every node
//! burning its measured CPU time per job in a spin loop. Over the probe, `process CPU / wall /
//! cores available` is the usable core share and `(process CPU / ticket − the work burned per
//! ticket) / hops` the CPU per hop. [`Sharing::apply`] puts both into the model: each node's
//! CPU time per job carries the probe's hop cost instead of the calibrated one, and the
//! host's cores are scaled by the usable share.

use std::time::Duration;

use planner::measure::thread_cpu_time_ns;
use planner::model::NetworkSpec;
use serde::Serialize;

use crate::error::{CdrError, Result};
use crate::measure::{PROBE_HOPS_PER_TICKET, ProbeWork, run_probe_graph, spin};
use crate::run::NodeThreads;

/// Thread CPU time the spin-loop calibration runs for.
const SPIN_CALIBRATION: Duration = Duration::from_millis(20);
/// Iterations per calibration step (a few hundred microseconds of CPU).
const SPIN_CALIBRATION_STEP_ITERATIONS: u64 = 1 << 18;

/// The model's nodes in the probe graph's order (source, first stage, second stage, file
/// sink, database sink).
const PROBE_NODE_NAMES: [&str; 5] = ["generator", "decoder", "converter", "serializer", "feeder"];

/// What the sharing probe measured for one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sharing {
    /// Cores the probe used over the cores available just before it, in (0, 1].
    pub usable_core_share: f64,
    /// Runtime CPU time per hop with the configuration's thread counts.
    pub hop_cpu_s: f64,
}

/// Spin-loop iterations per second of thread CPU time on this host (measured in CPU time, so
/// a loaded host does not bias it).
fn spin_iterations_per_cpu_s() -> f64 {
    let cpu_start_ns = thread_cpu_time_ns();
    let mut iterations = 0;
    while thread_cpu_time_ns() - cpu_start_ns < SPIN_CALIBRATION.as_nanos() as u64 {
        spin(SPIN_CALIBRATION_STEP_ITERATIONS);
        iterations += SPIN_CALIBRATION_STEP_ITERATIONS;
    }
    iterations as f64 / ((thread_cpu_time_ns() - cpu_start_ns) as f64 * 1e-9)
}

/// Each probe node's own CPU time per job (without the runtime's hop), from `model`, whose
/// nodes' CPU times include `calibrated_hop_cpu_s` (all but the generator).
fn work_cpu_s(model: &NetworkSpec, calibrated_hop_cpu_s: f64) -> Result<[f64; 5]> {
    let mut work = [0.0; 5];
    for (slot, name) in work.iter_mut().zip(PROBE_NODE_NAMES) {
        let node = model.node.iter().find(|node| node.name == name);
        let missing = || CdrError::BadInput(format!("the model has no node {name}"));
        let node = node.ok_or_else(missing)?;
        let hop_cpu_s = if name == "generator" { 0.0 } else { calibrated_hop_cpu_s };
        *slot = (node.cpu_share / node.service_rate_per_s - hop_cpu_s).max(0.0);
    }
    Ok(work)
}

impl Sharing {
    /// Runs the probe for `duration` with `threads` (the generator one), each node burning its
    /// CPU time per job from `model` (measured alone, including `calibrated_hop_cpu_s` per
    /// hop); `cores_available` is what the host gave this process just before.
    pub fn probe(
        model: &NetworkSpec,
        calibrated_hop_cpu_s: f64,
        threads: NodeThreads,
        duration: Duration,
        cores_available: f64,
    ) -> Result<Sharing> {
        let work = work_cpu_s(model, calibrated_hop_cpu_s)?;
        let iterations_per_s = spin_iterations_per_cpu_s();
        let spins_per_job = work.map(|cpu_s| (cpu_s * iterations_per_s).round() as u64);
        let run = run_probe_graph(duration, threads.as_array(), &ProbeWork { spins_per_job })?;
        let work_per_ticket_s: f64 = work.iter().sum();
        Ok(Sharing::from_probe(
            run.cpu_s / run.wall_s,
            run.cpu_s / run.tickets as f64,
            work_per_ticket_s,
            cores_available,
        ))
    }

    /// The probe's figures from what it measured: `cores_used` (process CPU / wall), its CPU
    /// per ticket and the work it burned per ticket.
    fn from_probe(
        cores_used: f64,
        cpu_s_per_ticket: f64,
        work_per_ticket_s: f64,
        cores_available: f64,
    ) -> Sharing {
        Sharing {
            usable_core_share: (cores_used / cores_available).clamp(0.01, 1.0),
            hop_cpu_s: ((cpu_s_per_ticket - work_per_ticket_s) / PROBE_HOPS_PER_TICKET).max(0.0),
        }
    }

    /// Puts the probe into `model`: every node but the generator pays this hop cost per job
    /// instead of `calibrated_hop_cpu_s` (its off-CPU time unchanged, so μ and the CPU share
    /// move together), and the host's cores shrink to the usable share.
    pub fn apply(&self, model: &mut NetworkSpec, calibrated_hop_cpu_s: f64) {
        for node in model.node.iter_mut().filter(|node| node.name != "generator") {
            let cpu_s = node.cpu_share / node.service_rate_per_s;
            let io_s = (1.0 / node.service_rate_per_s - cpu_s).max(0.0);
            let cpu_s = (cpu_s - calibrated_hop_cpu_s + self.hop_cpu_s).max(f64::MIN_POSITIVE);
            node.service_rate_per_s = 1.0 / (cpu_s + io_s);
            node.cpu_share = (cpu_s / (cpu_s + io_s)).clamp(f64::MIN_POSITIVE, 1.0);
        }
        model.host.cores *= self.usable_core_share;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use planner::model::NodeSpec;

    fn model() -> NetworkSpec {
        let mut io_bound = NodeSpec::new("feeder", 1.0 / 4e-6);
        io_bound.cpu_share = 0.5; // 2 µs CPU + 2 µs waiting per job
        let mut spec = NetworkSpec {
            node: vec![
                NodeSpec::new("generator", 1.0 / 1e-6),
                NodeSpec::new("decoder", 1.0 / 2e-6),
                NodeSpec::new("converter", 1.0 / 2e-6),
                NodeSpec::new("serializer", 1.0 / 2e-6),
                io_bound,
            ],
            ..NetworkSpec::default()
        };
        spec.host.cores = 2.0;
        spec
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
    }

    #[test]
    fn the_probe_splits_idle_cores_from_dearer_hops() {
        // Work per ticket 1 + 4 × (2 − 0.5) µs = 7 µs; the probe spent 10 µs per ticket on 1.5
        // of 2 cores: 0.75 µs per hop (0.25 more than calibrated), a quarter of the cores idle.
        let work = work_cpu_s(&model(), 0.5e-6).unwrap();
        assert!(close(work.iter().sum(), 7e-6), "{work:?}");
        let sharing = Sharing::from_probe(1.5, 10e-6, 7e-6, 2.0);
        assert!(close(sharing.usable_core_share, 0.75), "{sharing:?}");
        assert!(close(sharing.hop_cpu_s, 0.75e-6), "{sharing:?}");
        // A probe that found every core busy and hops as calibrated leaves the model alone.
        let neutral = Sharing::from_probe(2.0, 7e-6 + 4.0 * 0.5e-6, 7e-6, 2.0);
        let mut unchanged = model();
        neutral.apply(&mut unchanged, 0.5e-6);
        for (node, before) in unchanged.node.iter().zip(&model().node) {
            assert!(close(node.service_rate_per_s, before.service_rate_per_s), "{node:?}");
        }
        assert_eq!(unchanged.host.cores, 2.0);
    }

    #[test]
    fn applying_the_probe_lowers_the_cores_and_charges_the_measured_hop() {
        let mut spec = model();
        let sharing = Sharing { usable_core_share: 0.8, hop_cpu_s: 1.0e-6 };
        sharing.apply(&mut spec, 0.5e-6);
        assert!(close(spec.host.cores, 1.6));
        let rate = |name: &str| spec.node.iter().find(|n| n.name == name).unwrap();
        // The generator makes no hop; the decoder's 2 µs become 2.5 µs, all CPU.
        assert!(close(rate("generator").service_rate_per_s, 1e6));
        assert!(close(rate("decoder").service_rate_per_s, 1.0 / 2.5e-6));
        assert!(close(rate("decoder").cpu_share, 1.0));
        // The feeder keeps its 2 µs off CPU: 2.5 µs CPU of 4.5 µs.
        assert!(close(rate("feeder").service_rate_per_s, 1.0 / 4.5e-6));
        assert!(close(rate("feeder").cpu_share, 2.5 / 4.5));
    }

    #[test]
    fn a_short_probe_measures_a_share_and_a_hop_cost() {
        let threads = NodeThreads { decoder: 1, converter: 2, serializer: 1, feeder: 1 };
        let sharing =
            Sharing::probe(&model(), 0.5e-6, threads, Duration::from_millis(50), 2.0).unwrap();
        assert!(sharing.usable_core_share > 0.0 && sharing.usable_core_share <= 1.0);
        assert!(sharing.hop_cpu_s.is_finite() && sharing.hop_cpu_s >= 0.0, "{sharing:?}");
    }
}
