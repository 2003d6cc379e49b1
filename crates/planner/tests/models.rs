//! Published test vectors and cross-checks of the single-node and closed models.
//!
//! Each vector was recomputed independently by direct summation of the unnormalised state
//! weights (a^n/n! for n ≤ c, a^c/c!·ρ^(n−c) above) in double precision, and agrees with the
//! published value to the digits published.

use planner::closed::{
    Centre, CentreKind, asymptotic_bounds, interactive_response_time_law, littles_law, mva,
    utilization_law,
};
use planner::node::{Mmc, MmcK, mm1k_closed_form};

fn assert_close(actual: f64, expected: f64, tolerance: f64, what: &str) {
    assert!(
        (actual - expected).abs() <= tolerance,
        "{what}: got {actual}, expected {expected} ± {tolerance}"
    );
}

#[test]
fn mmck_lambda40_mu30_c3_k7() {
    let solution = MmcK::new(40.0, 30.0, 3, 7).unwrap().solve();
    let m = solution.metrics();
    assert_close(m.idle_probability, 0.255037, 5e-7, "P0");
    assert_close(m.response_time_s, 0.036517, 5e-7, "W");
    assert_close(solution.probability(0), m.idle_probability, 1e-15, "P(0) = P0");
}

#[test]
fn mmck_lambda50_mu10_c4_k6() {
    let solution = MmcK::new(50.0, 10.0, 4, 6).unwrap().solve();
    assert_close(solution.metrics().blocking_probability, 0.293543, 5e-7, "P_K");
    assert_close(solution.probability(6), 0.293543, 5e-7, "P(6)");
}

#[test]
fn mmck_lambda3_mu2_c2_k5() {
    let m = *MmcK::new(3.0, 2.0, 2, 5).unwrap().solve().metrics();
    // Published truncated, not rounded: direct summation gives P0 = 0.1793345009,
    // P_K = 0.0851138354 and Wq = 0.2308575804 (rounding would end in 5, 4 and 8), hence ± 1e-6.
    assert_close(m.idle_probability, 0.179334, 1e-6, "P0");
    assert_close(m.blocking_probability, 0.085113, 1e-6, "P_K");
    // Published as 2.00595 (5 decimals); direct summation gives 2.0059544658.
    assert_close(m.jobs_in_node, 2.00595, 5e-6, "L");
    assert_close(m.waiting_time_s, 0.230857, 1e-6, "Wq");
    assert_close(m.effective_rate_per_s, 3.0 * (1.0 - 0.0851138353765324), 1e-12, "λ_eff");
    assert_close(m.loss_rate_per_s, 3.0 * 0.0851138353765324, 1e-12, "loss rate");
    assert_close(m.utilization, m.effective_rate_per_s / 4.0, 1e-15, "U from λ_eff");
}

#[test]
fn jain_mva_example() {
    let centre = |name: &str, service_time_s, visits| Centre {
        name: name.into(),
        service_time_s,
        visits,
        kind: CentreKind::Queueing,
    };
    let centres =
        [centre("cpu", 0.125, 16.0), centre("disk_a", 0.3, 10.0), centre("disk_b", 0.2, 5.0)];
    let result = mva(&centres, 20, 4.0).unwrap();
    assert_close(result.throughput_per_s, 0.3332, 5e-5, "X");
    for (got, want) in result.response_time_per_visit_s.iter().zip([0.373, 4.854, 0.300]) {
        assert_close(*got, want, 5e-4, "R_i");
    }
    for (got, want) in result.queue_jobs.iter().zip([1.991, 16.177, 0.500]) {
        assert_close(*got, want, 5e-4, "Q_i");
    }
    // 20/0.3332465 − 4 = 56.0156, published rounded as 56.02.
    assert_close(result.response_time_s, 56.02, 5e-3, "N/X − Z");
    // The operational laws hold on MVA's own output.
    let queued: f64 = result.queue_jobs.iter().sum();
    assert!(littles_law(queued, result.throughput_per_s, result.response_time_s).holds(1e-9));
    let law =
        interactive_response_time_law(result.response_time_s, 20, result.throughput_per_s, 4.0);
    assert!(law.holds(1e-9));
    let disk =
        utilization_law(result.utilization[1], result.throughput_per_s, centres[1].demand_s());
    assert!(disk.holds(1e-12));
}

#[test]
fn laws_flag_inconsistent_measurements() {
    // 100 jobs/s at 5 ms each is 50% busy; a measured 70% breaks the utilization law.
    let check = utilization_law(0.7, 100.0, 0.005);
    assert!(!check.holds(0.15), "{check:?}");
    assert_close(check.relative_error(), 0.4, 1e-12, "relative error");
    assert!(littles_law(10.0, 100.0, 0.1).holds(1e-12));
    assert!(!interactive_response_time_law(1.0, 10, 5.0, 0.5).holds(0.1));
}

#[test]
fn mva_lies_within_asymptotic_bounds() {
    let centres = [
        Centre {
            name: "cpu".into(),
            service_time_s: 0.01,
            visits: 3.0,
            kind: CentreKind::Queueing,
        },
        Centre {
            name: "disk".into(),
            service_time_s: 0.02,
            visits: 2.0,
            kind: CentreKind::Queueing,
        },
        Centre { name: "lan".into(), service_time_s: 0.05, visits: 1.0, kind: CentreKind::Delay },
    ];
    for clients in [1, 2, 5, 10, 40, 200] {
        let exact = mva(&centres, clients, 1.0).unwrap();
        let bounds = asymptotic_bounds(&centres, clients, 1.0).unwrap();
        assert!(exact.throughput_per_s <= bounds.throughput_upper_per_s * (1.0 + 1e-12));
        assert!(exact.throughput_per_s >= bounds.throughput_lower_per_s * (1.0 - 1e-12));
        assert!(exact.response_time_s >= bounds.response_time_lower_s * (1.0 - 1e-12));
        assert!(exact.response_time_s <= bounds.response_time_upper_s * (1.0 + 1e-12));
    }
    // With one client nothing queues: X = 1/(D + Z) exactly.
    let one = mva(&centres, 1, 1.0).unwrap();
    assert_close(one.throughput_per_s, 1.0 / (0.03 + 0.04 + 0.05 + 1.0), 1e-12, "X(1)");
}

#[test]
fn mmck_with_one_server_matches_textbook_mm1k() {
    for (lambda, mu, k) in [(1.0, 2.0, 10), (3.0, 2.0, 20), (5.0, 5.0, 7), (0.9, 1.0, 300)] {
        let ours = *MmcK::new(lambda, mu, 1, k).unwrap().solve().metrics();
        let book = mm1k_closed_form(lambda, mu, k).unwrap();
        for (what, a, b) in [
            ("P0", ours.idle_probability, book.idle_probability),
            ("P_K", ours.blocking_probability, book.blocking_probability),
            ("L", ours.jobs_in_node, book.jobs_in_node),
            ("Lq", ours.jobs_in_queue, book.jobs_in_queue),
            ("W", ours.response_time_s, book.response_time_s),
        ] {
            assert!(
                (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                "{what} λ={lambda} μ={mu} K={k}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn mmck_with_huge_buffer_matches_erlang_c() {
    for (lambda, mu, c) in [(40.0, 30.0, 3), (200.0, 1.0, 256), (9.5, 1.0, 10), (1.0, 10.0, 1)] {
        let ours = *MmcK::new(lambda, mu, c, 1_000_000).unwrap().solve().metrics();
        let erlang = Mmc::new(lambda, mu, c).unwrap().metrics();
        for (what, a, b) in [
            ("P0", ours.idle_probability, erlang.idle_probability),
            ("Lq", ours.jobs_in_queue, erlang.jobs_in_queue),
            ("W", ours.response_time_s, erlang.response_time_s),
            ("U", ours.utilization, erlang.utilization),
        ] {
            assert!(
                (a - b).abs() <= 1e-9 * b.abs().max(1e-12),
                "{what} λ={lambda} c={c}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn erlang_c_known_value() {
    // a = 2 erlangs on c = 3 servers: Erlang B = (8/6)/(1+2+2+8/6) = 4/19, C = B/(1−ρ(1−B)) = 4/9.
    let mmc = Mmc::new(2.0, 1.0, 3).unwrap();
    assert_close(mmc.wait_probability(), 4.0 / 9.0, 1e-15, "Erlang C");
    assert!(Mmc::new(3.0, 1.0, 3).is_err(), "ρ = 1 is unstable");
}

#[test]
fn extreme_parameters_stay_finite_and_normalised() {
    let cases = [
        (256.0 * 1.0, 1.0, 256, 1_000_000), // ρ = 1 exactly, biggest c and K
        (256.0 * (1.0 + 1e-12), 1.0, 256, 1_000_000), // ρ just above 1
        (256.0 * (1.0 - 1e-12), 1.0, 256, 1_000_000), // ρ just below 1
        (1e6, 1.0, 256, 1_000_000),         // ρ ≫ 1: almost always full
        (1e-6, 1.0, 256, 1_000_000),        // nearly idle
        (5.0, 1.0, 1, 1_000_000),           // ρ = 5, one server
    ];
    for (lambda, mu, c, k) in cases {
        let solution = MmcK::new(lambda, mu, c, k).unwrap().solve();
        let m = solution.metrics();
        for value in [m.idle_probability, m.blocking_probability, m.jobs_in_node, m.response_time_s]
        {
            assert!(value.is_finite() && value >= 0.0, "λ={lambda}: {m:?}");
        }
        assert!(m.utilization <= 1.0 + 1e-12, "{m:?}");
        // Busy servers from the distribution equal λ_eff/μ (flow balance).
        let busy = m.jobs_in_node - m.jobs_in_queue;
        assert!((busy - m.effective_rate_per_s / mu).abs() <= 1e-9 * busy.max(1.0), "{m:?}");
    }
    // At ρ = 1 the tail is uniform: Lq = P_tail·(K−c)/2 and P_K = P_c.
    let flat = MmcK::new(256.0, 1.0, 256, 1_000_000).unwrap().solve();
    assert_close(flat.probability(1_000_000), flat.probability(256), 1e-18, "flat tail");
    let overload = MmcK::new(1e6, 1.0, 256, 1_000_000).unwrap().solve();
    assert_close(overload.metrics().utilization, 1.0, 1e-9, "saturated");
    assert!(overload.metrics().blocking_probability > 0.999);
}

#[test]
fn bad_parameters_are_rejected_with_reasons() {
    let cases = [
        (MmcK::new(1.0, 0.0, 1, 1).unwrap_err().to_string(), "μ"),
        (MmcK::new(-1.0, 1.0, 1, 1).unwrap_err().to_string(), "arrival rate"),
        (MmcK::new(1.0, 1.0, 0, 1).unwrap_err().to_string(), "server"),
        (MmcK::new(1.0, 1.0, 4, 3).unwrap_err().to_string(), "capacity"),
        (MmcK::new(f64::NAN, 1.0, 1, 1).unwrap_err().to_string(), "arrival rate"),
    ];
    for (message, needle) in cases {
        assert!(message.contains(needle), "{message:?} should mention {needle}");
    }
}
