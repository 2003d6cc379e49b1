//! Optimizer cost: a 64-core, 4-node network in throughput and consolidation modes.
//! Target (issue 5): under 100 ms per optimization. Timed with leantier's refinement (CPU-demand
//! budget), the semantics the documented figures were taken with.

use criterion::{Criterion, criterion_group, criterion_main};
use planner::model::{HostSpec, NetworkSpec, NodeSpec, RouteSpec};
use planner::network::Network;
use planner::optimize::{Goal, optimize_with};
use planner::options::Options;

fn node(name: &str, service_rate_per_s: f64, cpu_share: f64) -> NodeSpec {
    NodeSpec { cpu_share, ..NodeSpec::new(name, service_rate_per_s) }
}

fn route(from: &str, to: &str) -> RouteSpec {
    RouteSpec { from: from.into(), to: to.into(), jobs_per_job: 1.0 }
}

/// The cdr shape on a 64-core host: decoder → converter → {serializer, feeder}.
fn cdr_network_64_cores() -> Network {
    let mut decoder = node("decoder", 40_000.0, 1.0);
    decoder.external_share = 1.0;
    let spec = NetworkSpec {
        host: HostSpec { cores: 64.0, ..HostSpec::default() },
        node: vec![
            decoder,
            node("converter", 25_000.0, 1.0),
            node("serializer", 30_000.0, 0.6),
            node("feeder", 8_000.0, 0.3),
        ],
        route: vec![
            route("decoder", "converter"),
            route("converter", "serializer"),
            route("converter", "feeder"),
        ],
        ..NetworkSpec::default()
    };
    Network::new(spec).expect("valid network")
}

fn bench_optimize(c: &mut Criterion) {
    let network = cdr_network_64_cores();
    let plan = optimize_with(&network, Goal::Throughput, Options::REFINED).expect("plan");
    println!(
        "64-core 4-node throughput plan: threads {:?}, rate {:.0}/s, {} network solves",
        plan.threads, plan.arrival_rate_per_s, plan.evaluations
    );
    c.bench_function("optimize_throughput_64_cores_4_nodes", |b| {
        b.iter(|| {
            optimize_with(std::hint::black_box(&network), Goal::Throughput, Options::REFINED)
                .expect("plan")
        })
    });
    let goal = Goal::Consolidation { arrival_rate_per_s: 0.5 * plan.arrival_rate_per_s };
    c.bench_function("optimize_consolidation_64_cores_4_nodes", |b| {
        b.iter(|| {
            optimize_with(std::hint::black_box(&network), goal, Options::REFINED).expect("plan")
        })
    });
}

criterion_group!(benches, bench_optimize);
criterion_main!(benches);
