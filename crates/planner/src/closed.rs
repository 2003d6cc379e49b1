//! Closed interactive systems: exact mean value analysis (MVA), asymptotic bounds, and the
//! operational laws used to check measured data.
//!
//! MVA (Reiser and Lavenberg) walks the population up from 0 to N clients: with `n − 1`
//! clients' queue lengths `Q_i`, an arriving job sees `R_i = S_i·(1 + Q_i)` per visit at a
//! queueing centre and `R_i = S_i` at a delay centre; then `X = n / (Z + Σ V_i·R_i)` and
//! `Q_i = X·V_i·R_i`. It is exact for product-form networks and costs O(N·M).

use crate::error::PlanError;
use serde::Serialize;

/// How a centre serves jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CentreKind {
    /// One server; jobs queue (a CPU, a disk, a single-threaded stage).
    Queueing,
    /// Infinite servers; no queueing (a fixed delay, think-like).
    Delay,
}

/// One service centre of a closed network.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Centre {
    /// Name for reports.
    pub name: String,
    /// Mean service time per visit, S_i.
    pub service_time_s: f64,
    /// Visits per job, V_i.
    pub visits: f64,
    /// Queueing or delay.
    pub kind: CentreKind,
}

impl Centre {
    /// Service demand per job, D_i = V_i·S_i.
    pub fn demand_s(&self) -> f64 {
        self.visits * self.service_time_s
    }
}

/// Exact MVA results for N clients.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MvaResult {
    /// Clients N.
    pub clients: u32,
    /// System throughput X (jobs per second).
    pub throughput_per_s: f64,
    /// System response time N/X − Z.
    pub response_time_s: f64,
    /// Residence time per visit R_i at each centre.
    pub response_time_per_visit_s: Vec<f64>,
    /// Mean jobs Q_i at each centre.
    pub queue_jobs: Vec<f64>,
    /// Utilization U_i = X·D_i (for a delay centre: mean jobs in service).
    pub utilization: Vec<f64>,
}

/// Asymptotic bounds on a closed interactive system (Denning and Buzen's ABA).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClosedBounds {
    /// X ≤ min(N/(D + Z), 1/D_max).
    pub throughput_upper_per_s: f64,
    /// X ≥ N/(N·D_q + D_delay + Z).
    pub throughput_lower_per_s: f64,
    /// R ≥ max(D, N·D_max − Z).
    pub response_time_lower_s: f64,
    /// R ≤ N·D_q + D_delay.
    pub response_time_upper_s: f64,
    /// N* = (D + Z)/D_max: beyond it the bottleneck saturates.
    pub knee_clients: f64,
}

fn check_closed(centres: &[Centre], think_time_s: f64) -> Result<(), PlanError> {
    if centres.is_empty() {
        return Err(PlanError::BadInput("a closed network needs at least one centre".into()));
    }
    if !(think_time_s.is_finite() && think_time_s >= 0.0) {
        return Err(PlanError::BadInput(format!("think time Z must be >= 0, got {think_time_s}")));
    }
    for centre in centres {
        let valid = |value: f64| value.is_finite() && value >= 0.0;
        if !(valid(centre.service_time_s) && valid(centre.visits)) {
            return Err(PlanError::BadInput(format!(
                "centre {}: service time and visits must be >= 0, got S = {}, V = {}",
                centre.name, centre.service_time_s, centre.visits
            )));
        }
    }
    Ok(())
}

/// Exact MVA for `clients` clients with think time `think_time_s`.
pub fn mva(centres: &[Centre], clients: u32, think_time_s: f64) -> Result<MvaResult, PlanError> {
    check_closed(centres, think_time_s)?;
    let count = centres.len();
    let mut queue_jobs = vec![0.0; count];
    let mut residence_s = vec![0.0; count];
    let mut throughput_per_s = 0.0;
    for population in 1..=clients {
        for (index, centre) in centres.iter().enumerate() {
            residence_s[index] = match centre.kind {
                CentreKind::Queueing => centre.service_time_s * (1.0 + queue_jobs[index]),
                CentreKind::Delay => centre.service_time_s,
            };
        }
        let cycle_s: f64 =
            think_time_s + centres.iter().zip(&residence_s).map(|(c, r)| c.visits * r).sum::<f64>();
        throughput_per_s = f64::from(population) / cycle_s;
        for (index, centre) in centres.iter().enumerate() {
            queue_jobs[index] = throughput_per_s * centre.visits * residence_s[index];
        }
    }
    let response_time_s =
        if clients == 0 { 0.0 } else { f64::from(clients) / throughput_per_s - think_time_s };
    let utilization = centres.iter().map(|centre| throughput_per_s * centre.demand_s()).collect();
    Ok(MvaResult {
        clients,
        throughput_per_s,
        response_time_s,
        response_time_per_visit_s: residence_s,
        queue_jobs,
        utilization,
    })
}

/// Asymptotic bounds for `clients` clients.
pub fn asymptotic_bounds(
    centres: &[Centre],
    clients: u32,
    think_time_s: f64,
) -> Result<ClosedBounds, PlanError> {
    check_closed(centres, think_time_s)?;
    let demand_of =
        |kind| -> f64 { centres.iter().filter(|c| c.kind == kind).map(Centre::demand_s).sum() };
    let queueing_s = demand_of(CentreKind::Queueing);
    let delay_s = demand_of(CentreKind::Delay);
    let total_s = queueing_s + delay_s;
    let max_s = centres
        .iter()
        .filter(|c| c.kind == CentreKind::Queueing)
        .map(Centre::demand_s)
        .fold(0.0, f64::max);
    let n = f64::from(clients);
    Ok(ClosedBounds {
        throughput_upper_per_s: (n / (total_s + think_time_s)).min(1.0 / max_s),
        throughput_lower_per_s: n / (n * queueing_s + delay_s + think_time_s),
        response_time_lower_s: total_s.max(n * max_s - think_time_s),
        response_time_upper_s: n * queueing_s + delay_s,
        knee_clients: (total_s + think_time_s) / max_s,
    })
}

/// One operational law checked on measured data: `measured` against what the law predicts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LawCheck {
    /// Which law.
    pub law: &'static str,
    /// The measured quantity.
    pub measured: f64,
    /// The law's value from the other measurements.
    pub predicted: f64,
}

impl LawCheck {
    /// |measured − predicted| / predicted (0 when both are 0).
    pub fn relative_error(&self) -> f64 {
        if self.predicted == 0.0 {
            return if self.measured == 0.0 { 0.0 } else { f64::INFINITY };
        }
        ((self.measured - self.predicted) / self.predicted).abs()
    }

    /// Whether the data agree with the law within `tolerance` (relative).
    pub fn holds(&self, tolerance: f64) -> bool {
        self.relative_error() <= tolerance
    }
}

/// Utilization law: U = X·D (measured busy fraction vs throughput times demand per job).
pub fn utilization_law(
    measured_utilization: f64,
    throughput_per_s: f64,
    demand_s: f64,
) -> LawCheck {
    LawCheck {
        law: "utilization law U = X·D",
        measured: measured_utilization,
        predicted: throughput_per_s * demand_s,
    }
}

/// Little's law: N = X·R (measured mean jobs inside vs throughput times response time).
pub fn littles_law(measured_jobs: f64, throughput_per_s: f64, response_time_s: f64) -> LawCheck {
    LawCheck {
        law: "Little's law N = X·R",
        measured: measured_jobs,
        predicted: throughput_per_s * response_time_s,
    }
}

/// Interactive response-time law: R = N/X − Z.
pub fn interactive_response_time_law(
    measured_response_time_s: f64,
    clients: u32,
    throughput_per_s: f64,
    think_time_s: f64,
) -> LawCheck {
    LawCheck {
        law: "interactive response-time law R = N/X − Z",
        measured: measured_response_time_s,
        predicted: f64::from(clients) / throughput_per_s - think_time_s,
    }
}
