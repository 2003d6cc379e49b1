//! Property tests of the M/M/c/K solver.

use planner::node::{Mmc, MmcK};
use proptest::prelude::*;

fn relative_gap(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-300)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn probabilities_sum_to_one(
        lambda in 0.01f64..500.0, mu in 0.1f64..50.0, servers in 1u32..=64, buffer in 0u64..2000,
    ) {
        let solution = MmcK::new(lambda, mu, servers, u64::from(servers) + buffer).unwrap().solve();
        let capacity = u64::from(servers) + buffer;
        let total: f64 = (0..=capacity).map(|n| solution.probability(n)).sum();
        prop_assert!((total - 1.0).abs() < 1e-9, "Σ P_n = {}", total);
        prop_assert_eq!(solution.probability(capacity + 1), 0.0);
        let m = solution.metrics();
        prop_assert!(relative_gap(solution.probability(capacity), m.blocking_probability) < 1e-9);
        // L and Lq from the distribution agree with the closed-form tail.
        let l: f64 = (0..=capacity).map(|n| n as f64 * solution.probability(n)).sum();
        prop_assert!(relative_gap(l, m.jobs_in_node) < 1e-8, "L {} vs {}", l, m.jobs_in_node);
    }

    #[test]
    fn littles_law_holds(
        lambda in 0.01f64..1e5, mu in 0.1f64..1e4, servers in 1u32..=256, buffer in 0u64..1_000_000,
    ) {
        let m = *MmcK::new(lambda, mu, servers, u64::from(servers) + buffer).unwrap().solve().metrics();
        prop_assert!(relative_gap(m.jobs_in_node, m.effective_rate_per_s * m.response_time_s) < 1e-12);
        prop_assert!(relative_gap(m.jobs_in_queue, m.effective_rate_per_s * m.waiting_time_s) < 1e-12
            || m.jobs_in_queue < 1e-300);
        prop_assert!((m.response_time_s - m.waiting_time_s - 1.0 / mu).abs() <= 1e-9 * m.response_time_s);
        prop_assert!((0.0..=1.0 + 1e-12).contains(&m.utilization));
    }

    #[test]
    fn more_servers_never_hurt(
        lambda in 0.01f64..1000.0, mu in 0.1f64..100.0, servers in 1u32..64, extra in 1u64..500,
    ) {
        let capacity = u64::from(servers) + extra;
        let fewer = *MmcK::new(lambda, mu, servers, capacity).unwrap().solve().metrics();
        let more = *MmcK::new(lambda, mu, servers + 1, capacity).unwrap().solve().metrics();
        let slack = |x: f64| x * (1.0 + 1e-9) + 1e-12;
        prop_assert!(more.blocking_probability <= slack(fewer.blocking_probability));
        prop_assert!(more.jobs_in_queue <= slack(fewer.jobs_in_queue));
        prop_assert!(more.waiting_time_s <= slack(fewer.waiting_time_s));
        prop_assert!(more.effective_rate_per_s >= fewer.effective_rate_per_s * (1.0 - 1e-12));
    }

    #[test]
    fn bigger_buffers_block_less_and_hold_more(
        lambda in 0.01f64..1000.0, mu in 0.1f64..100.0, servers in 1u32..64, buffer in 0u64..5000,
    ) {
        let capacity = u64::from(servers) + buffer;
        let small = *MmcK::new(lambda, mu, servers, capacity).unwrap().solve().metrics();
        let large = *MmcK::new(lambda, mu, servers, capacity + 1).unwrap().solve().metrics();
        prop_assert!(large.blocking_probability <= small.blocking_probability * (1.0 + 1e-9) + 1e-300);
        prop_assert!(large.jobs_in_node >= small.jobs_in_node * (1.0 - 1e-12));
        prop_assert!(large.effective_rate_per_s >= small.effective_rate_per_s * (1.0 - 1e-12));
    }

    #[test]
    fn large_k_converges_to_erlang_c(
        mu in 0.1f64..100.0, servers in 1u32..=256, rho in 0.01f64..0.95,
    ) {
        let lambda = rho * f64::from(servers) * mu;
        let finite = *MmcK::new(lambda, mu, servers, u64::from(servers) + 1_000_000).unwrap().solve().metrics();
        let infinite = Mmc::new(lambda, mu, servers).unwrap().metrics();
        prop_assert!(relative_gap(finite.response_time_s, infinite.response_time_s) < 1e-9);
        prop_assert!(relative_gap(finite.idle_probability, infinite.idle_probability) < 1e-9);
        prop_assert!((finite.jobs_in_queue - infinite.jobs_in_queue).abs() < 1e-9 * infinite.jobs_in_node);
    }

    #[test]
    fn continuous_across_rho_equals_one(servers in 1u32..=256, buffer in 1u64..1_000_000, mu in 0.5f64..10.0) {
        let at = |rho: f64| *MmcK::new(rho * f64::from(servers) * mu, mu, servers, u64::from(servers) + buffer)
            .unwrap().solve().metrics();
        let (below, exact, above) = (at(1.0 - 1e-10), at(1.0), at(1.0 + 1e-10));
        for (a, b) in [(below, exact), (above, exact)] {
            prop_assert!(relative_gap(a.jobs_in_queue, b.jobs_in_queue) < 1e-4, "{:?} vs {:?}", a, b);
            prop_assert!(relative_gap(a.blocking_probability, b.blocking_probability) < 1e-4);
        }
    }
}
