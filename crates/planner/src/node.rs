//! Single-node queueing models: M/M/c/K (the planner's node), with M/M/c (Erlang C) and the
//! textbook M/M/1/K as independent cross-checks.
//!
//! Numerical method for M/M/c/K. With offered load `a = λ/μ` and `ρ = a/c`, the unnormalised
//! state weights are `a^n/n!` for `n ≤ c` and `a^c/c! · ρ^(n−c)` for `c < n ≤ K`. Factorials and
//! powers overflow long before `c = 256` or `K = 10^6`, so every weight is kept as a logarithm:
//! the head (`n < c`, at most `c` terms) is accumulated by the ratio recurrence
//! `ln w_n = ln w_(n−1) + ln a − ln n` into a running log-sum-exp, and the tail (`c ≤ n ≤ K`) is
//! one truncated geometric series summed in closed form with `expm1`, which keeps full relative
//! precision as `ρ → 1` (where the textbook `(1 − ρ^m)/(1 − ρ)` cancels catastrophically). The
//! tail's mean uses the same closed form with a series expansion for `|m·ln ρ| < 0.05`. Solving is
//! therefore O(c), independent of K, and never allocates.

use crate::error::PlanError;
use serde::Serialize;

/// Below this `|terms · ln ρ|` the tail mean uses its Taylor series: the closed form would
/// subtract two nearly equal numbers there. The first omitted term is below 1e-16 relative.
const TAIL_MEAN_SERIES_LIMIT: f64 = 0.05;

/// Steady-state measures of one node. Rates in jobs per second, times in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct NodeMetrics {
    /// Offered arrival rate λ.
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub arrival_rate_per_s: f64,
    /// Accepted arrival rate λ(1 − P_K); equals the node's throughput.
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub effective_rate_per_s: f64,
    /// Rate of arrivals that found the node full, λ·P_K.
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub loss_rate_per_s: f64,
    /// P_K: the probability that an arrival finds the node full.
    #[serde(serialize_with = "crate::round::serialize_probability")]
    pub blocking_probability: f64,
    /// P0: the probability that the node is empty.
    #[serde(serialize_with = "crate::round::serialize_probability")]
    pub idle_probability: f64,
    /// Mean busy fraction of the servers, λ_eff / (c·μ).
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub utilization: f64,
    /// L: mean jobs in the node (waiting and in service).
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub jobs_in_node: f64,
    /// Lq: mean jobs waiting.
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub jobs_in_queue: f64,
    /// W: mean time an accepted job spends in the node.
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub response_time_s: f64,
    /// Wq: mean time an accepted job waits before service.
    #[serde(serialize_with = "crate::round::serialize_measure")]
    pub waiting_time_s: f64,
}

/// An M/M/c/K node: Poisson arrivals, exponential service, `servers` identical servers and room
/// for `capacity_jobs` jobs in total (in service plus waiting); arrivals finding it full are lost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MmcK {
    arrival_rate_per_s: f64,
    service_rate_per_s: f64,
    servers: u32,
    capacity_jobs: u64,
}

/// A solved M/M/c/K node: its metrics and the state distribution.
#[derive(Debug, Clone, Copy)]
pub struct MmcKSolution {
    model: MmcK,
    ln_offered_load: f64,
    ln_rho: f64,
    /// ln Σ_{n<c} w_n (w_0 = 1).
    ln_head: f64,
    /// P(n < c) and P(n ≥ c).
    head_probability: f64,
    tail_probability: f64,
    /// ln Σ_{j=0}^{K−c} ρ^j.
    ln_tail_sum: f64,
    metrics: NodeMetrics,
}

fn check_rates(arrival_rate_per_s: f64, service_rate_per_s: f64) -> Result<(), PlanError> {
    if !(arrival_rate_per_s.is_finite() && arrival_rate_per_s >= 0.0) {
        return Err(PlanError::BadInput(format!(
            "arrival rate must be finite and >= 0, got {arrival_rate_per_s}"
        )));
    }
    if !(service_rate_per_s.is_finite() && service_rate_per_s > 0.0) {
        return Err(PlanError::BadInput(format!(
            "service rate μ must be finite and > 0, got {service_rate_per_s}"
        )));
    }
    Ok(())
}

fn check_servers(servers: u32) -> Result<(), PlanError> {
    if servers == 0 {
        return Err(PlanError::BadInput("a node needs at least one server (thread)".into()));
    }
    Ok(())
}

impl MmcK {
    /// Validates the parameters: λ ≥ 0, μ > 0, c ≥ 1, K ≥ c.
    pub fn new(
        arrival_rate_per_s: f64,
        service_rate_per_s: f64,
        servers: u32,
        capacity_jobs: u64,
    ) -> Result<Self, PlanError> {
        check_rates(arrival_rate_per_s, service_rate_per_s)?;
        check_servers(servers)?;
        if capacity_jobs < u64::from(servers) {
            return Err(PlanError::BadInput(format!(
                "capacity K = {capacity_jobs} is below the server count c = {servers}"
            )));
        }
        Ok(Self { arrival_rate_per_s, service_rate_per_s, servers, capacity_jobs })
    }

    /// Solves the node in O(c) time.
    ///
    /// Probabilities are formed as ratios of the head (n < c) and tail (n ≥ c) masses, and
    /// within the tail as ratios of geometric sums rewritten so the large `(K−c)·ln ρ` terms
    /// cancel symbolically; so P_K and 1 − P_K both keep full relative precision even when the
    /// node is saturated (P_K → 1) and K = 10^6.
    pub fn solve(&self) -> MmcKSolution {
        let servers = f64::from(self.servers);
        let rho = self.arrival_rate_per_s / (servers * self.service_rate_per_s);
        let ln_rho = rho.ln();
        let ln_offered_load = ln_rho + servers.ln();
        if self.arrival_rate_per_s == 0.0 {
            return self.idle_solution(ln_offered_load, ln_rho);
        }
        // Head: n = 0..c−1 by the ratio recurrence; weight n for Σ n·p_n.
        let mut head = LogSumExp::with_first_term_zero();
        let mut ln_weight = 0.0;
        for n in 1..self.servers {
            ln_weight += ln_offered_load - f64::from(n).ln();
            head.add(ln_weight, f64::from(n));
        }
        let ln_head = head.ln_total();
        let ln_weight_c = ln_weight + ln_offered_load - servers.ln();
        // Tail: n = c..K, one geometric series in ρ with `tail_terms` terms.
        let tail_terms = self.capacity_jobs - u64::from(self.servers) + 1;
        let ln_tail_sum = ln_geometric_sum(ln_rho, tail_terms as f64);
        let ln_tail_over_head = ln_weight_c + ln_tail_sum - ln_head;
        let tail_probability = logistic(ln_tail_over_head);
        let head_probability = logistic(-ln_tail_over_head);

        let blocking_probability = tail_probability * ln_last_term_share(ln_rho, tail_terms).exp();
        let not_full_probability =
            head_probability + tail_probability * ln_geometric_sum_ratio(ln_rho, tail_terms).exp();
        let effective_rate_per_s = self.arrival_rate_per_s * not_full_probability;
        let busy_servers = head_probability * head.weighted_mean() + servers * tail_probability;
        let jobs_in_queue = tail_probability * truncated_geometric_mean(ln_rho, tail_terms as f64);
        let jobs_in_node = busy_servers + jobs_in_queue;
        let metrics = NodeMetrics {
            arrival_rate_per_s: self.arrival_rate_per_s,
            effective_rate_per_s,
            loss_rate_per_s: self.arrival_rate_per_s * blocking_probability,
            blocking_probability,
            idle_probability: head_probability * (-ln_head).exp(),
            utilization: effective_rate_per_s / (servers * self.service_rate_per_s),
            jobs_in_node,
            jobs_in_queue,
            response_time_s: jobs_in_node / effective_rate_per_s,
            waiting_time_s: jobs_in_queue / effective_rate_per_s,
        };
        MmcKSolution {
            model: *self,
            ln_offered_load,
            ln_rho,
            ln_head,
            head_probability,
            tail_probability,
            ln_tail_sum,
            metrics,
        }
    }

    /// λ = 0: the node is always empty; an arriving job would be served at once.
    fn idle_solution(&self, ln_offered_load: f64, ln_rho: f64) -> MmcKSolution {
        let metrics = NodeMetrics {
            idle_probability: 1.0,
            response_time_s: 1.0 / self.service_rate_per_s,
            ..NodeMetrics::default()
        };
        MmcKSolution {
            model: *self,
            ln_offered_load,
            ln_rho,
            ln_head: 0.0,
            head_probability: 1.0,
            tail_probability: 0.0,
            ln_tail_sum: 0.0,
            metrics,
        }
    }
}

impl MmcKSolution {
    /// The node's steady-state measures.
    pub fn metrics(&self) -> &NodeMetrics {
        &self.metrics
    }

    /// P_n: the probability of `jobs` jobs in the node (0 beyond K). O(min(n, c)).
    pub fn probability(&self, jobs: u64) -> f64 {
        let model = &self.model;
        let servers = u64::from(model.servers);
        if jobs > model.capacity_jobs {
            return 0.0;
        }
        if model.arrival_rate_per_s == 0.0 {
            return if jobs == 0 { 1.0 } else { 0.0 };
        }
        if jobs < servers {
            let mut ln_weight = 0.0;
            for n in 1..=jobs {
                ln_weight += self.ln_offered_load - (n as f64).ln();
            }
            return self.head_probability * (ln_weight - self.ln_head).exp();
        }
        // ρ^j / Σ_{i≤m} ρ^i, with the largest term factored out first when ρ > 1.
        let j = (jobs - servers) as f64;
        let last = (model.capacity_jobs - servers) as f64;
        let ln_share = if self.ln_rho > 0.0 {
            -(last - j) * self.ln_rho - ln_geometric_sum(-self.ln_rho, last + 1.0)
        } else {
            j * self.ln_rho - self.ln_tail_sum
        };
        self.tail_probability * ln_share.exp()
    }
}

/// 1 / (1 + e^(−x)) without overflow.
fn logistic(x: f64) -> f64 {
    if x >= 0.0 { 1.0 / (1.0 + (-x).exp()) } else { x.exp() / (1.0 + x.exp()) }
}

/// ln(ρ^(n−1) / Σ_{j<n} ρ^j): the share of the last of `n` geometric terms.
fn ln_last_term_share(x: f64, terms: u64) -> f64 {
    if x > 0.0 {
        -ln_geometric_sum(-x, terms as f64)
    } else {
        (terms - 1) as f64 * x - ln_geometric_sum(x, terms as f64)
    }
}

/// ln(Σ_{j<n−1} ρ^j / Σ_{j<n} ρ^j): the share of all but the last of `n` geometric terms.
fn ln_geometric_sum_ratio(x: f64, terms: u64) -> f64 {
    let n = terms as f64;
    if x > 0.0 {
        // Both sums factored as in `ln_geometric_sum`; their leading powers differ by ρ.
        -x + ln_geometric_sum(-x, n - 1.0) - ln_geometric_sum(-x, n)
    } else {
        ln_geometric_sum(x, n - 1.0) - ln_geometric_sum(x, n)
    }
}

/// Running `ln Σ e^(x_i)` and `Σ w_i·e^(x_i) / Σ e^(x_i)`, rescaled whenever a larger exponent
/// arrives so no term overflows.
struct LogSumExp {
    ln_max: f64,
    sum: f64,
    weighted_sum: f64,
}

impl LogSumExp {
    /// Starts with the term e^0 (the weight of state 0), whose weight is 0.
    fn with_first_term_zero() -> Self {
        Self { ln_max: 0.0, sum: 1.0, weighted_sum: 0.0 }
    }

    fn add(&mut self, ln_term: f64, weight: f64) {
        if ln_term > self.ln_max {
            let scale = (self.ln_max - ln_term).exp();
            self.sum *= scale;
            self.weighted_sum *= scale;
            self.ln_max = ln_term;
        }
        let term = (ln_term - self.ln_max).exp();
        self.sum += term;
        self.weighted_sum += weight * term;
    }

    fn ln_total(&self) -> f64 {
        self.ln_max + self.sum.ln()
    }

    fn weighted_mean(&self) -> f64 {
        self.weighted_sum / self.sum
    }
}

/// `ln Σ_{j=0}^{terms−1} e^(j·x)` without overflow or cancellation.
fn ln_geometric_sum(x: f64, terms: f64) -> f64 {
    if x == 0.0 {
        terms.ln()
    } else if x < 0.0 {
        // (1 − e^(terms·x)) / (1 − e^x), both factors in (0, 1].
        (-(terms * x).exp_m1()).ln() - (-x.exp_m1()).ln()
    } else {
        // Factor out the largest term: Σ e^(jx) = e^((terms−1)x) · Σ e^(−jx).
        (terms - 1.0) * x + ln_geometric_sum(-x, terms)
    }
}

/// Mean of `j` under weights `e^(j·x)`, `j = 0..terms−1`: `(f(terms·x) − f(x)) / x` with
/// `f(y) = y / (1 − e^(−y))`, or its Taylor series near `x = 0`.
fn truncated_geometric_mean(x: f64, terms: f64) -> f64 {
    let y = terms * x;
    if y.abs() < TAIL_MEAN_SERIES_LIMIT {
        // f(y) = 1 + y/2 + y²/12 − y⁴/720 + y⁶/30240 − …
        let n2 = terms * terms;
        let n4 = n2 * n2;
        return (terms - 1.0) / 2.0 + (n2 - 1.0) * x / 12.0 - (n4 - 1.0) * x.powi(3) / 720.0
            + (n4 * n2 - 1.0) * x.powi(5) / 30240.0;
    }
    let f = |y: f64| y / -(-y).exp_m1();
    (f(y) - f(x)) / x
}

/// An M/M/c node (infinite buffer), solved with the Erlang-B recurrence (Erlang C).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mmc {
    arrival_rate_per_s: f64,
    service_rate_per_s: f64,
    servers: u32,
}

impl Mmc {
    /// Validates λ ≥ 0, μ > 0, c ≥ 1 and stability ρ = λ/(cμ) < 1.
    pub fn new(
        arrival_rate_per_s: f64,
        service_rate_per_s: f64,
        servers: u32,
    ) -> Result<Self, PlanError> {
        check_rates(arrival_rate_per_s, service_rate_per_s)?;
        check_servers(servers)?;
        let rho = arrival_rate_per_s / (f64::from(servers) * service_rate_per_s);
        if rho >= 1.0 {
            return Err(PlanError::BadInput(format!(
                "M/M/c is unstable: ρ = λ/(cμ) = {rho:.6} >= 1 (use M/M/c/K for a finite buffer)"
            )));
        }
        Ok(Self { arrival_rate_per_s, service_rate_per_s, servers })
    }

    /// Erlang C: the probability that an arrival waits.
    pub fn wait_probability(&self) -> f64 {
        let offered_load = self.arrival_rate_per_s / self.service_rate_per_s;
        let rho = offered_load / f64::from(self.servers);
        // Erlang B by B(k) = a·B(k−1) / (k + a·B(k−1)): every step stays in [0, 1].
        let mut erlang_b = 1.0;
        for k in 1..=self.servers {
            erlang_b = offered_load * erlang_b / (f64::from(k) + offered_load * erlang_b);
        }
        erlang_b / (1.0 - rho * (1.0 - erlang_b))
    }

    /// Steady-state measures (no blocking: P_K = 0, λ_eff = λ).
    pub fn metrics(&self) -> NodeMetrics {
        let servers = f64::from(self.servers);
        let offered_load = self.arrival_rate_per_s / self.service_rate_per_s;
        let rho = offered_load / servers;
        let jobs_in_queue = self.wait_probability() * rho / (1.0 - rho);
        let service_time_s = 1.0 / self.service_rate_per_s;
        let (response_time_s, waiting_time_s) = if self.arrival_rate_per_s == 0.0 {
            (service_time_s, 0.0)
        } else {
            let waiting_time_s = jobs_in_queue / self.arrival_rate_per_s;
            (waiting_time_s + service_time_s, waiting_time_s)
        };
        // P0 = 1 / (Σ_{n<c} a^n/n! + a^c/(c!·(1−ρ))), summed in log space.
        let ln_offered_load = offered_load.ln();
        let mut sum = LogSumExp::with_first_term_zero();
        let mut ln_weight = 0.0;
        for n in 1..self.servers {
            ln_weight += ln_offered_load - f64::from(n).ln();
            sum.add(ln_weight, 0.0);
        }
        ln_weight += ln_offered_load - servers.ln();
        sum.add(ln_weight - (-rho).ln_1p(), 0.0);
        NodeMetrics {
            arrival_rate_per_s: self.arrival_rate_per_s,
            effective_rate_per_s: self.arrival_rate_per_s,
            loss_rate_per_s: 0.0,
            blocking_probability: 0.0,
            idle_probability: (-sum.ln_total()).exp(),
            utilization: rho,
            jobs_in_node: jobs_in_queue + offered_load,
            jobs_in_queue,
            response_time_s,
            waiting_time_s,
        }
    }
}

/// The textbook closed form of M/M/1/K, `P_n = (1−ρ)ρ^n / (1−ρ^(K+1))`. Kept deliberately
/// naive as an independent check of [`MmcK`]; it is only valid while `ρ^(K+1)` is finite.
pub fn mm1k_closed_form(
    arrival_rate_per_s: f64,
    service_rate_per_s: f64,
    capacity_jobs: u64,
) -> Result<NodeMetrics, PlanError> {
    check_rates(arrival_rate_per_s, service_rate_per_s)?;
    if capacity_jobs == 0 {
        return Err(PlanError::BadInput("M/M/1/K needs K >= 1".into()));
    }
    let rho = arrival_rate_per_s / service_rate_per_s;
    let k = capacity_jobs as f64;
    let rho_k1 = rho.powf(k + 1.0);
    if !rho_k1.is_finite() {
        return Err(PlanError::BadInput(format!(
            "M/M/1/K closed form overflows: ρ^(K+1) for ρ = {rho}"
        )));
    }
    let (idle_probability, blocking_probability, jobs_in_node) = if rho == 1.0 {
        (1.0 / (k + 1.0), 1.0 / (k + 1.0), k / 2.0)
    } else {
        let p0 = (1.0 - rho) / (1.0 - rho_k1);
        (p0, p0 * rho.powf(k), rho / (1.0 - rho) - (k + 1.0) * rho_k1 / (1.0 - rho_k1))
    };
    let effective_rate_per_s = arrival_rate_per_s * (1.0 - blocking_probability);
    let jobs_in_queue = jobs_in_node - (1.0 - idle_probability);
    Ok(NodeMetrics {
        arrival_rate_per_s,
        effective_rate_per_s,
        loss_rate_per_s: arrival_rate_per_s * blocking_probability,
        blocking_probability,
        idle_probability,
        utilization: 1.0 - idle_probability,
        jobs_in_node,
        jobs_in_queue,
        response_time_s: jobs_in_node / effective_rate_per_s,
        waiting_time_s: jobs_in_queue / effective_rate_per_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_mean_series_and_closed_form_meet_at_the_switch() {
        let terms = 1000.0;
        let below = truncated_geometric_mean(0.049_999 / terms, terms);
        let above = truncated_geometric_mean(0.050_001 / terms, terms);
        assert!((below - above).abs() / below < 1e-6, "{below} vs {above}");
    }

    #[test]
    fn geometric_sum_matches_direct_summation() {
        for &x in &[-0.3, -1e-9, 0.0, 1e-9, 0.2] {
            let direct: f64 = (0..50).map(|j| (f64::from(j) * x).exp()).sum();
            assert!((ln_geometric_sum(x, 50.0) - direct.ln()).abs() < 1e-12, "x = {x}");
        }
    }
}
