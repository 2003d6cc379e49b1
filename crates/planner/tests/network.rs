//! Open feed-forward networks and the optimizer.

use planner::model::{HostSpec, NetworkSpec, NodeSpec, PipelineConfig, RouteSpec};
use planner::network::Network;
use planner::node::{MmcK, NodeMetrics};
use planner::optimize::{Goal, Plan, Resource, StopReason, optimize, optimize_with};
use planner::options::Options;

fn node(name: &str, service_rate_per_s: f64) -> NodeSpec {
    NodeSpec { buffer_slots: 64, ..NodeSpec::new(name, service_rate_per_s) }
}

fn route(from: &str, to: &str) -> RouteSpec {
    RouteSpec { from: from.into(), to: to.into(), jobs_per_job: 1.0 }
}

/// decoder → converter → {serializer, feeder}, the cdr shape.
fn cdr_spec(cores: f64) -> NetworkSpec {
    let mut decoder = node("decoder", 1000.0);
    decoder.external_share = 1.0;
    NetworkSpec {
        host: HostSpec { cores, ..HostSpec::default() },
        node: vec![
            decoder,
            node("converter", 600.0),
            node("serializer", 800.0),
            node("feeder", 300.0),
        ],
        route: vec![
            route("decoder", "converter"),
            route("converter", "serializer"),
            route("converter", "feeder"),
        ],
        ..NetworkSpec::default()
    }
}

/// leantier's refinement (CPU-demand budget, fixed nodes bound the rate), which the tests of
/// the core budget and of fixed bottlenecks below are about.
fn refined(network: &Network, goal: Goal) -> Plan {
    optimize_with(network, goal, Options::REFINED).unwrap()
}

fn solve(network: &Network, rate: f64, threads: &[u32]) -> Vec<NodeMetrics> {
    let mut metrics = vec![NodeMetrics::default(); threads.len()];
    network.evaluate(rate, threads, &mut metrics).unwrap();
    metrics
}

#[test]
fn fan_out_copies_and_blocking_thins_arrivals() {
    let network = Network::new(cdr_spec(8.0)).unwrap();
    let metrics = solve(&network, 900.0, &[1, 1, 1, 1]);
    // The decoder (μ = 1000, K = 65) at 900/s: the converter sees exactly what it accepted.
    let decoder = *MmcK::new(900.0, 1000.0, 1, 65).unwrap().solve().metrics();
    assert_eq!(metrics[0], decoder);
    assert_eq!(metrics[1].arrival_rate_per_s, decoder.effective_rate_per_s);
    // The converter (μ = 600) is overloaded: it blocks, so its successors see less than 900/s.
    assert!(metrics[1].blocking_probability > 0.3);
    let passed = metrics[1].effective_rate_per_s;
    assert!(passed < 600.0 && passed > 590.0, "{passed}");
    // Fan-out: both successors receive every job the converter accepted.
    assert_eq!(metrics[2].arrival_rate_per_s, passed);
    assert_eq!(metrics[3].arrival_rate_per_s, passed);
}

#[test]
fn split_routes_divide_the_flow() {
    let mut spec = cdr_spec(8.0);
    spec.route[1].jobs_per_job = 0.25;
    spec.route[2].jobs_per_job = 0.75;
    let network = Network::new(spec).unwrap();
    let metrics = solve(&network, 100.0, &[1, 1, 1, 1]);
    let passed = metrics[1].effective_rate_per_s;
    assert!((metrics[2].arrival_rate_per_s - 0.25 * passed).abs() < 1e-12);
    assert!((metrics[3].arrival_rate_per_s - 0.75 * passed).abs() < 1e-12);
    assert_eq!(network.visit_ratios(), vec![1.0, 1.0, 0.25, 0.75]);
}

#[test]
fn bounds_follow_the_slowest_node_and_longest_chain() {
    let network = Network::new(cdr_spec(8.0)).unwrap();
    assert_eq!(network.saturation_rate_per_s(&[1, 1, 1, 1]), 300.0);
    assert_eq!(network.saturation_rate_per_s(&[1, 1, 1, 4]), 600.0);
    let chain_s = 1.0 / 1000.0 + 1.0 / 600.0 + 1.0 / 300.0;
    assert!((network.min_response_time_s() - chain_s).abs() < 1e-15);
}

#[test]
fn bad_models_are_rejected_with_reasons() {
    type Mutation = Box<dyn Fn(&mut NetworkSpec)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|s| s.node[1].service_rate_per_s = 0.0), "converter: service_rate_per_s"),
        (Box::new(|s| s.node[1].service_rate_per_s = -5.0), "μ"),
        (Box::new(|s| s.node[0].external_share = -1.0), "external_share"),
        (Box::new(|s| s.route[0].jobs_per_job = -0.5), "jobs_per_job"),
        (Box::new(|s| s.route.push(route("feeder", "decoder"))), "cycle"),
        (Box::new(|s| s.route.push(route("converter", "databse"))), "unknown node databse"),
        (Box::new(|s| s.node[2].name = "feeder".into()), "used twice"),
        (Box::new(|s| s.utilization_limit = 1.0), "utilization_limit"),
        (Box::new(|s| s.node[3].cpu_share = 0.0), "cpu_share"),
        (Box::new(|s| s.node[0].external_share = 0.0), "nothing enters"),
    ];
    for (mutate, needle) in cases {
        let mut spec = cdr_spec(8.0);
        mutate(&mut spec);
        let error = Network::new(spec).unwrap_err().to_string();
        assert!(error.contains(needle), "{error:?} should mention {needle}");
    }
    let network = Network::new(cdr_spec(8.0)).unwrap();
    let unknown = network.index_of("nope").unwrap_err().to_string();
    assert!(unknown.contains("unknown node name nope"), "{unknown}");
    let goal = Goal::Consolidation { arrival_rate_per_s: -1.0 };
    assert!(optimize(&network, goal).unwrap_err().to_string().contains("arrival rate"));
}

#[test]
fn consolidation_single_node_by_hand() {
    // λ = 250, μ = 100: 3 threads give U ≈ 0.83 > 0.8, 4 give ≈ 0.625.
    let mut only = node("only", 100.0);
    only.external_share = 1.0;
    let spec = NetworkSpec {
        host: HostSpec { cores: 16.0, ..HostSpec::default() },
        node: vec![only],
        ..NetworkSpec::default()
    };
    let network = Network::new(spec).unwrap();
    let plan = optimize(&network, Goal::Consolidation { arrival_rate_per_s: 250.0 }).unwrap();
    assert_eq!(plan.threads, vec![4]);
    assert!(plan.feasible);
    assert_eq!(plan.stop, StopReason::AllUnderLimit);
    assert!(plan.metrics[0].utilization < 0.8 && plan.metrics[0].utilization > 0.6);
}

/// Every thread vector with 1..=max threads per node, for brute-force comparisons.
fn all_thread_vectors(nodes: usize, max: u32) -> Vec<Vec<u32>> {
    let mut out = vec![vec![]];
    for _ in 0..nodes {
        out = out
            .into_iter()
            .flat_map(|v| {
                (1..=max).map(move |t| {
                    let mut w = v.clone();
                    w.push(t);
                    w
                })
            })
            .collect();
    }
    out
}

fn max_utilization(network: &Network, rate: f64, threads: &[u32]) -> f64 {
    solve(network, rate, threads).iter().map(|m| m.utilization).fold(0.0, f64::max)
}

#[test]
fn consolidation_matches_brute_force_minimum() {
    let network = Network::new(cdr_spec(64.0)).unwrap();
    for rate in [150.0, 700.0, 1500.0, 2600.0] {
        let plan = optimize(&network, Goal::Consolidation { arrival_rate_per_s: rate }).unwrap();
        assert!(plan.feasible);
        let best = all_thread_vectors(4, 12)
            .into_iter()
            .filter(|t| max_utilization(&network, rate, t) <= 0.8)
            .map(|t| t.iter().sum::<u32>())
            .min()
            .unwrap();
        assert_eq!(plan.threads.iter().sum::<u32>(), best, "rate {rate}: {:?}", plan.threads);
    }
}

/// Highest rate with every node and the CPU under 0.8, by an independent bisection.
fn brute_max_rate(network: &Network, threads: &[u32]) -> f64 {
    let cores = network.spec().host.cores;
    let (mut low, mut high) = (0.0, 1e6);
    for _ in 0..60 {
        let middle = 0.5 * (low + high);
        let metrics = solve(network, middle, threads);
        let nodes_ok = metrics.iter().all(|m| m.utilization <= 0.8);
        if nodes_ok && network.cpu_cores_demand(&metrics) <= 0.8 * cores {
            low = middle
        } else {
            high = middle
        }
    }
    low
}

#[test]
fn throughput_matches_brute_force_within_core_budget() {
    let mut spec = cdr_spec(7.0);
    spec.node[2].cpu_share = 0.5; // an I/O-bound serializer uses half a core while busy
    let network = Network::new(spec).unwrap();
    let plan = refined(&network, Goal::Throughput);
    assert_eq!(plan.stop, StopReason::CoreBudget);
    assert_eq!(plan.bottleneck, Resource::Cpu);
    assert!((plan.cpu_cores_demand - 0.8 * 7.0).abs() < 1e-6, "{}", plan.cpu_cores_demand);
    let best = all_thread_vectors(4, 6)
        .into_iter()
        .map(|t| brute_max_rate(&network, &t))
        .fold(0.0, f64::max);
    assert!(
        (plan.arrival_rate_per_s - best).abs() <= 1e-6 * best,
        "{} vs {best}",
        plan.arrival_rate_per_s
    );
    // And it got there with no thread to spare: dropping any one lowers the rate.
    for node in 0..4 {
        let mut fewer = plan.threads.clone();
        if fewer[node] > 1 {
            fewer[node] -= 1;
            assert!(brute_max_rate(&network, &fewer) < best * (1.0 - 1e-6), "{fewer:?}");
        }
    }
}

#[test]
fn io_bound_nodes_may_exceed_the_core_count() {
    let mut spec = cdr_spec(2.0);
    for node in &mut spec.node {
        node.cpu_share = 0.1;
    }
    let network = Network::new(spec).unwrap();
    let plan = refined(&network, Goal::Throughput);
    assert!(plan.threads.iter().sum::<u32>() > 2, "{:?}", plan.threads);
    assert!(plan.cpu_cores_demand <= 0.8 * 2.0 + 1e-9);
    assert_eq!(plan.stop, StopReason::CoreBudget);
}

#[test]
fn fixed_feeder_stops_throughput_and_consolidation_cleanly() {
    let mut spec = cdr_spec(16.0);
    spec.node[3].fixed_threads = Some(1);
    let network = Network::new(spec).unwrap();
    let plan = refined(&network, Goal::Throughput);
    assert_eq!(plan.stop, StopReason::FixedNode);
    assert_eq!(plan.bottleneck, Resource::Node(3));
    assert_eq!(plan.threads[3], 1);
    assert!((plan.metrics[3].utilization - 0.8).abs() < 1e-6);
    // 240/s is what one feeder at μ = 300 carries at 80%.
    assert!((plan.arrival_rate_per_s - 240.0).abs() < 1.0, "{}", plan.arrival_rate_per_s);
    let over = refined(&network, Goal::Consolidation { arrival_rate_per_s: 400.0 });
    assert!(!over.feasible);
    assert_eq!(over.stop, StopReason::FixedNode);
}

#[test]
fn core_budget_and_bandwidth_limits_stop_cleanly() {
    // 2000/s needs 2000 · (1/1000 + 1/600 + 1/800 + 1/300) = 14.5 busy cores; the host has 4.
    let network = Network::new(cdr_spec(4.0)).unwrap();
    let plan = refined(&network, Goal::Consolidation { arrival_rate_per_s: 2000.0 });
    assert!(!plan.feasible);
    assert_eq!(plan.stop, StopReason::CoreBudget);
    assert_eq!(plan.bottleneck, Resource::Cpu);

    let mut spec = cdr_spec(64.0);
    spec.node[2].disk_bytes_per_job = 1000.0;
    spec.host.disk_bytes_per_s = Some(500_000.0);
    let network = Network::new(spec).unwrap();
    let plan = refined(&network, Goal::Throughput);
    assert_eq!(plan.stop, StopReason::Bandwidth);
    assert_eq!(plan.bottleneck, Resource::Disk);
    // 80% of 500 kB/s at 1000 B/job = 400 jobs/s.
    assert!((plan.arrival_rate_per_s - 400.0).abs() < 0.5, "{}", plan.arrival_rate_per_s);
}

#[test]
fn memory_limit_is_checked_from_the_start() {
    let mut spec = cdr_spec(8.0);
    spec.host.memory_bytes = Some(3 << 30);
    for node in &mut spec.node {
        node.memory_bytes_per_thread = 1 << 30;
    }
    let error = optimize(&Network::new(spec.clone()).unwrap(), Goal::Throughput).unwrap_err();
    assert!(error.to_string().contains("memory"), "{error}");
    spec.host.memory_bytes = Some(5 << 30);
    let plan = optimize(&Network::new(spec).unwrap(), Goal::Throughput).unwrap();
    assert_eq!(plan.stop, StopReason::Memory);
    assert_eq!(plan.threads.iter().sum::<u32>(), 5);
}

#[test]
fn config_round_trips_through_toml() {
    let config = PipelineConfig {
        goal: "throughput".into(),
        arrival_rate_per_s: 1234.5,
        bottleneck: "feeder".into(),
        model: cdr_spec(2.0),
        node: vec![planner::model::NodeConfig {
            name: "feeder".into(),
            threads: 3,
            ..Default::default()
        }],
    };
    let text = toml::to_string(&config).unwrap();
    let back: PipelineConfig = toml::from_str(&text).unwrap();
    assert_eq!(back, config);
    assert_eq!(back.threads_of("feeder"), Some(3));
    assert_eq!(back.threads_of("nope"), None);
}
