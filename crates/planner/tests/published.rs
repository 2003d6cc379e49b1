//! The published method (thread budget, fixed nodes outside the check, stepping) beside the
//! refinement (CPU-demand budget, fixed nodes bound the rate): the paper's test vector, every
//! stop reason under both budgets, bisection against stepping, and the comparison.

use planner::PlanError;
use planner::compare::compare;
use planner::model::{HostSpec, NetworkSpec, NodeSpec, RouteSpec};
use planner::network::Network;
use planner::optimize::{Goal, Plan, Resource, StopReason, THREADS_PER_NODE_MAX, optimize_with};
use planner::options::{Budget, FixedNodes, Options, RateSearch};

const PUBLISHED: Options = Options::PUBLISHED;
const REFINED: Options = Options::REFINED;

fn route(from: &str, to: &str) -> RouteSpec {
    RouteSpec { from: from.into(), to: to.into(), jobs_per_job: 1.0 }
}

fn entry(name: &str, service_rate_per_s: f64) -> NodeSpec {
    NodeSpec { external_share: 1.0, ..NodeSpec::new(name, service_rate_per_s) }
}

/// The paper's host "Goedel": 8 cores, limit 0.8, measured μ in tickets/s, decoder →
/// converter → {serializer, feeder}, every ticket to both.
fn goedel() -> NetworkSpec {
    NetworkSpec {
        utilization_limit: 0.8,
        host: HostSpec { cores: 8.0, ..HostSpec::default() },
        node: vec![
            entry("decoder", 30_055.0),
            NodeSpec::new("converter", 18_672.0),
            NodeSpec::new("serializer", 6_146.0),
            NodeSpec::new("feeder", 94.0),
        ],
        route: vec![
            route("decoder", "converter"),
            route("converter", "serializer"),
            route("converter", "feeder"),
        ],
    }
}

fn goedel_fixed_feeder() -> NetworkSpec {
    let mut spec = goedel();
    spec.node[3].fixed_threads = Some(1);
    spec
}

/// a (μ 1000) → b (μ 100) on `cores` cores: b is the node that wants threads.
fn chain(cores: f64) -> NetworkSpec {
    NetworkSpec {
        host: HostSpec { cores, ..HostSpec::default() },
        node: vec![entry("a", 1000.0), NodeSpec::new("b", 100.0)],
        route: vec![route("a", "b")],
        ..NetworkSpec::default()
    }
}

fn plan(spec: &NetworkSpec, goal: Goal, options: Options) -> Plan {
    optimize_with(&Network::new(spec.clone()).unwrap(), goal, options).unwrap()
}

fn assert_near(actual: f64, expected: f64, relative: f64, what: &str) {
    assert!((actual - expected).abs() <= relative * expected, "{what}: {actual} vs {expected}");
}

#[test]
fn goedel_throughput_is_1_1_1_5_published_and_1_1_1_8_refined() {
    let published = plan(&goedel(), Goal::Throughput, PUBLISHED);
    assert_eq!(published.threads, vec![1, 1, 1, 5]);
    assert_eq!(published.stop, StopReason::ThreadBudget);
    assert_eq!(published.bottleneck, Resource::Node(3), "the feeder wanted a ninth thread");
    assert_eq!(published.thread_budget, Some(8));
    assert!(published.feasible && published.warnings.is_empty(), "{:?}", published.warnings);
    // Five feeders at 80% of 94 tickets/s each.
    assert_near(published.arrival_rate_per_s, 5.0 * 94.0 * 0.8, 1e-9, "rate");

    // The refinement counts the feeders' busy time, not their threads: 11 threads, CPU-bound.
    let refined = plan(&goedel(), Goal::Throughput, REFINED);
    assert_eq!(refined.threads, vec![1, 1, 1, 8]);
    assert_eq!(refined.stop, StopReason::CoreBudget);
    assert_near(refined.cpu_cores_demand, 0.8 * 8.0, 1e-9, "CPU demand");
}

#[test]
fn goedel_fixed_feeder_is_1_2_4_1_published_and_stops_at_the_feeder_refined() {
    let spec = goedel_fixed_feeder();
    let published = plan(&spec, Goal::Throughput, PUBLISHED);
    assert_eq!(published.threads, vec![1, 2, 4, 1]);
    assert_eq!(published.stop, StopReason::ThreadBudget);
    assert_eq!(published.bottleneck, Resource::Node(2), "the serializer wanted a fifth thread");
    // Four serializers at 80% of 6146 tickets/s each.
    let rate = 4.0 * 6146.0 * 0.8;
    assert_near(published.arrival_rate_per_s, rate, 1e-9, "rate");
    assert!(published.feasible, "the fixed feeder is outside the check");
    let [feeder] = published.fixed_nodes.as_slice() else { panic!("one fixed node") };
    assert_eq!((feeder.node, feeder.threads), (3, 1));
    assert_near(feeder.offered_utilization, rate / 94.0, 1e-9, "offered utilization");
    assert_near(feeder.backlog_growth_per_s, rate - 94.0, 1e-9, "backlog growth");
    assert_eq!(published.utilization_of(3), feeder.offered_utilization);
    let [warning] = published.warnings.as_slice() else { panic!("{:?}", published.warnings) };
    assert!(warning.contains("feeder") && warning.contains("queue grows by 19573"), "{warning}");

    let refined = plan(&spec, Goal::Throughput, REFINED);
    assert_eq!(refined.threads, vec![1, 1, 1, 1]);
    assert_eq!(refined.stop, StopReason::FixedNode);
    assert_eq!(refined.bottleneck, Resource::Node(3));
    assert_near(refined.arrival_rate_per_s, 0.8 * 94.0, 1e-9, "rate");
    assert!(refined.warnings.is_empty() && refined.fixed_nodes[0].backlog_growth_per_s == 0.0);
}

#[test]
fn published_consolidation_leaves_the_fixed_node_out_and_warns() {
    let goal = Goal::Consolidation { arrival_rate_per_s: 10_000.0 };
    let published = plan(&goedel_fixed_feeder(), goal, PUBLISHED);
    // 10 000/s: converter 0.54 and serializer 1.63 per thread, so 1, 1, 3 (0.54), feeder 1.
    assert_eq!(published.threads, vec![1, 1, 3, 1]);
    assert_eq!(published.stop, StopReason::AllUnderLimit);
    assert!(published.feasible);
    assert_eq!(published.warnings.len(), 1, "{:?}", published.warnings);
    let refined = plan(&goedel_fixed_feeder(), goal, REFINED);
    assert_eq!(refined.stop, StopReason::FixedNode);
    assert!(!refined.feasible);
}

/// One network per stop reason that both budgets reach, with the goal that reaches it.
fn shared_stop_cases() -> Vec<(&'static str, NetworkSpec, Goal, Options, StopReason)> {
    let all_under = NetworkSpec {
        host: HostSpec { cores: 16.0, ..HostSpec::default() },
        node: vec![entry("only", 100.0)],
        ..NetworkSpec::default()
    };
    let mut memory = chain(16.0);
    memory.host.memory_bytes = Some(3 << 30);
    memory.node[1].memory_bytes_per_thread = 1 << 30; // b may have 3 threads
    let mut fixed = chain(16.0);
    fixed.node[1].fixed_threads = Some(2);
    let mut disk = chain(64.0);
    disk.node[1].disk_bytes_per_job = 1000.0;
    disk.host.disk_bytes_per_s = Some(50_000.0); // 40 jobs/s at the limit, b carries 80
    let mut capped = chain(100_000.0);
    capped.node[0].service_rate_per_s = 1e6;
    capped.node[1].service_rate_per_s = 1.0; // 10 000/s needs 12 500 threads of b
    let consolidate = |arrival_rate_per_s| Goal::Consolidation { arrival_rate_per_s };
    let bounds = |budget| Options { budget, ..REFINED };
    let mut cases = Vec::new();
    for budget in [Budget::Threads, Budget::Cpu] {
        let options = Options { budget, ..PUBLISHED };
        cases.extend([
            (
                "all under",
                all_under.clone(),
                consolidate(250.0),
                options,
                StopReason::AllUnderLimit,
            ),
            ("memory", memory.clone(), Goal::Throughput, options, StopReason::Memory),
            ("fixed", fixed.clone(), Goal::Throughput, bounds(budget), StopReason::FixedNode),
            ("disk", disk.clone(), Goal::Throughput, options, StopReason::Bandwidth),
            ("cap", capped.clone(), consolidate(10_000.0), options, StopReason::ThreadCap),
        ]);
    }
    cases
}

#[test]
fn every_stop_reason_under_both_budgets() {
    let mut cases = shared_stop_cases();
    // The budgets' own stops: b takes threads until Σ threads = 4 cores (1 + 3, 240/s), or,
    // counting CPU demand 0.011 cores per ticket/s, until 3.2 cores (290.9/s) with 1 + 4.
    cases.push(("threads", chain(4.0), Goal::Throughput, PUBLISHED, StopReason::ThreadBudget));
    cases.push(("cpu", chain(4.0), Goal::Throughput, REFINED, StopReason::CoreBudget));
    for (name, spec, goal, options, stop) in cases {
        let plan = plan(&spec, goal, options);
        assert_eq!(plan.stop, stop, "{name} with {options:?}: {:?}", plan.threads);
        let budget_ok = plan.thread_budget.is_none_or(|b| plan.threads.iter().sum::<u32>() <= b);
        assert!(budget_ok, "{name}: {:?} over {:?}", plan.threads, plan.thread_budget);
        let expected_threads: &[u32] = match (name, options.budget) {
            ("all under", _) => &[4],
            ("memory", _) => &[1, 3],
            ("fixed", _) => &[1, 2],
            ("disk", _) => &[1, 1],
            ("cap", _) => &[1, THREADS_PER_NODE_MAX],
            ("threads", _) => &[1, 3],
            ("cpu", _) => &[1, 4],
            _ => unreachable!(),
        };
        assert_eq!(plan.threads, expected_threads, "{name} with {options:?}");
    }
    let rate = |spec, options| plan(&spec, Goal::Throughput, options).arrival_rate_per_s;
    assert_near(rate(chain(4.0), PUBLISHED), 3.0 * 100.0 * 0.8, 1e-9, "thread budget");
    assert_near(rate(chain(4.0), REFINED), 0.8 * 4.0 / (1.0 / 1000.0 + 1.0 / 100.0), 1e-9, "cpu");
}

#[test]
fn a_budget_the_start_exceeds_is_reported_not_refused() {
    let mut spec = goedel();
    spec.host.cores = 2.9; // a budget of 2 threads for 4 nodes
    let plan = plan(&spec, Goal::Throughput, PUBLISHED);
    assert_eq!(plan.threads, vec![1, 1, 1, 1]);
    assert_eq!(
        (plan.stop, plan.thread_budget, plan.feasible),
        (StopReason::ThreadBudget, Some(2), false)
    );
    assert!(plan.warnings.iter().any(|w| w.contains("thread budget is 2")), "{:?}", plan.warnings);
}

/// Every network above whose goal is throughput, under both semantics.
fn throughput_cases() -> Vec<(String, NetworkSpec, Options)> {
    let mut cases = Vec::new();
    for options in [PUBLISHED, REFINED] {
        cases.push(("goedel".into(), goedel(), options));
        cases.push(("goedel fixed feeder".into(), goedel_fixed_feeder(), options));
        cases.push(("chain".into(), chain(4.0), options));
    }
    for (name, spec, goal, options, _) in shared_stop_cases() {
        if goal == Goal::Throughput {
            cases.push((name.into(), spec, options));
        }
    }
    cases
}

#[test]
fn bisection_and_stepping_agree_within_the_step() {
    for step in [0.001, 0.05] {
        for (name, spec, options) in throughput_cases() {
            let bisection = plan(&spec, Goal::Throughput, options);
            let stepped_options = options.with_rate_search(RateSearch::Step(step));
            let stepped = plan(&spec, Goal::Throughput, stepped_options);
            let what = format!("{name}, {options:?}, step {step}");
            assert_eq!(stepped.threads, bisection.threads, "{what}");
            assert_eq!((stepped.stop, stepped.bottleneck), (bisection.stop, bisection.bottleneck));
            let (low, high) = (stepped.arrival_rate_per_s, bisection.arrival_rate_per_s);
            assert!(low <= high * (1.0 + 1e-9), "{what}: stepped {low} above bisection {high}");
            assert!(
                high < low * (1.0 + step),
                "{what}: stepped {low} more than a step below {high}"
            );
            assert!(stepped.feasible, "{what}");
        }
    }
}

#[test]
fn comparison_shows_both_plans_per_node() {
    let network = Network::new(goedel_fixed_feeder()).unwrap();
    let comparison = compare(&network, Goal::Throughput, RateSearch::Bisection).unwrap();
    assert_eq!(comparison.published.options, PUBLISHED);
    assert_eq!(comparison.refined.options, REFINED);
    let rows = comparison.rows(&network);
    let threads: Vec<[u32; 2]> = rows.iter().map(|row| row.threads).collect();
    assert_eq!(threads, vec![[1, 1], [2, 1], [4, 1], [1, 1]]);
    let feeder = &rows[3];
    assert!(feeder.fixed && feeder.node == "feeder");
    assert!(feeder.utilization[0] > 200.0, "published: offered load {:?}", feeder.utilization);
    assert_near(feeder.utilization[1], 0.8, 1e-9, "refined: the feeder at the limit");
    assert_eq!(comparison.published.bottleneck_name(&network), "serializer");
    assert_eq!(comparison.refined.bottleneck_name(&network), "feeder");
}

#[test]
fn options_and_models_that_cannot_plan_are_bad_input() {
    let network = Network::new(goedel()).unwrap();
    for step in [0.0, -0.1, 1e-9, 2.0, f64::NAN] {
        let options = PUBLISHED.with_rate_search(RateSearch::Step(step));
        let error = optimize_with(&network, Goal::Throughput, options).unwrap_err();
        assert!(error.to_string().contains("rate step"), "{step}: {error}");
    }
    // Published: the only node is fixed and left out of the check, and the thread budget is
    // not a device, so nothing bounds the rate; both searches say so instead of looping.
    let mut spec = chain(8.0);
    spec.node.truncate(1);
    spec.route.clear();
    spec.node[0].fixed_threads = Some(1);
    let network = Network::new(spec).unwrap();
    for search in [RateSearch::Bisection, RateSearch::Step(0.05)] {
        let options = PUBLISHED.with_rate_search(search);
        let error = optimize_with(&network, Goal::Throughput, options).unwrap_err();
        assert!(error.to_string().contains("nothing limits"), "{search:?}: {error}");
        assert!(matches!(error, PlanError::BadInput(_)), "{error}");
    }
    let bounded = Options { fixed_nodes: FixedNodes::BoundsRate, ..PUBLISHED };
    assert_eq!(
        optimize_with(&network, Goal::Throughput, bounded).unwrap().stop,
        StopReason::FixedNode
    );
}
