//! The exchange tier's report as data people can load and a story that agrees with itself:
//! the layout that ran (not the one asked for), fused stages shown as fused, the generator's
//! row showing what it sent, and numeric tables named for what they hold.

use exchange::tier::STAGE_SPLITS;
use experiments::data::{Cell, DataTable};
use experiments::tier_load::RunResult;
use pipeline::metrics::StageMetrics;
use stats::{LatencyHistogram, LatencySummary};

/// The pipeline's name for the load generator when it runs inline.
const GENERATOR_STAGE: &str = "generator";

/// Picks one latency view of a run.
pub type LatencyOf = fn(&RunResult) -> &LatencyHistogram;

/// One stage of a run as the report shows it.
pub struct StageRow {
    pub stage: String,
    /// The thread group it ran in, e.g. `preprocess+core`.
    pub group: String,
    pub workers: usize,
    /// Messages handled (the generator: messages sent).
    pub messages: u64,
    pub throughput_per_s: f64,
    /// The thread group's measured utilization, on its first stage's row; `None` on the other
    /// stages fused into it (their thread's time is the group's, shown once).
    pub utilization: Option<f64>,
}

/// The group's index and label that runs `stage`, and `stage`'s position in it.
fn group_of(run: &RunResult, stage: &str) -> Option<(usize, String, usize)> {
    run.layout.groups.iter().enumerate().find_map(|(index, group)| {
        let position = group.stages.iter().position(|s| s.name() == stage)?;
        Some((index, group.label(), position))
    })
}

/// The stage's row: fused stages share their group's utilization, the generator shows what
/// it sent.
pub fn stage_row(run: &RunResult, stage: &StageMetrics) -> StageRow {
    let messages = if stage.stage == GENERATOR_STAGE { run.sent } else { stage.messages_in };
    let (group, utilization) = match group_of(run, &stage.stage) {
        Some((index, label, 0)) => (label, run.layout_utilization.get(index).copied()),
        Some((_, label, _)) => (label, None),
        None => (stage.stage.clone(), Some(stage.utilization)),
    };
    StageRow {
        stage: stage.stage.clone(),
        group,
        workers: stage.workers,
        messages,
        throughput_per_s: messages as f64 / run.elapsed_s.max(f64::MIN_POSITIVE),
        utilization,
    }
}

/// The layout that ran, in one sentence: groups with their workers, wait and CPUs.
pub fn layout_sentence(run: &RunResult) -> String {
    let groups: Vec<String> = run
        .layout
        .groups
        .iter()
        .enumerate()
        .map(|(index, group)| {
            let cpus = run.group_cpus(index);
            let cpus = if cpus.is_empty() {
                "floating".to_string()
            } else {
                format!(
                    "CPU {}",
                    cpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
                )
            };
            format!("{} ×{} {:?} ({cpus})", group.label(), group.workers, group.wait)
        })
        .collect();
    format!(
        "Layout that ran: {}; threads pinned: {}; load generator {}",
        groups.join(" | "),
        if run.pinned { "yes" } else { "no" },
        if run.layout.generator_inline {
            "inline on the first group's thread"
        } else {
            "on its own thread"
        },
    )
}

/// Rate, stage, group, workers, messages, throughput and utilization per stage and run.
pub fn stages_data(runs: &[RunResult]) -> DataTable {
    let mut table = DataTable::new(
        "stages",
        "Throughput and utilization per stage (a fused stage is counted in its group's first stage)",
        [
            "rate_msgs_per_s",
            "stage",
            "thread_group",
            "workers",
            "messages",
            "throughput_msgs_per_s",
            "utilization_pct",
        ],
    );
    for run in runs {
        for stage in &run.pipeline {
            let row = stage_row(run, stage);
            table.push(vec![
                run.rate_per_s.into(),
                row.stage.into(),
                row.group.into(),
                row.workers.into(),
                row.messages.into(),
                row.throughput_per_s.into(),
                row.utilization.map(|u| u * 100.0).into(),
            ]);
        }
    }
    table
}

fn latency_cells(rate_per_s: f64, series: &str, summary: &LatencySummary) -> Vec<Cell> {
    let mut cells = vec![rate_per_s.into(), series.into(), summary.count.into()];
    cells.extend(summary.quantiles_ns().map(|ns| Cell::from(ns as f64 / 1_000.0)));
    cells
}

/// Every latency of every run in µs: critical path, reply, the stage splits, generator lag.
pub fn latency_data(runs: &[RunResult]) -> DataTable {
    let quantiles =
        LatencySummary::QUANTILE_LABELS.map(|label| format!("{}_us", label.replace('.', "_")));
    let columns =
        ["rate_msgs_per_s", "series", "count"].into_iter().map(String::from).chain(quantiles);
    let mut table = DataTable::new(
        "latency",
        "Latency from the intended send time (µs) per run and series",
        columns,
    );
    for run in runs {
        let mut series: Vec<(String, &LatencyHistogram)> =
            vec![("critical_path".into(), &run.critical_path), ("reply".into(), &run.end_to_end)];
        series.extend(STAGE_SPLITS.iter().map(|s| format!("stage_{s}")).zip(&run.stage_latency));
        series.push(("generator_late".into(), &run.send_lag));
        for (name, histogram) in series {
            table.push(latency_cells(run.rate_per_s, &name, &histogram.summary()));
        }
    }
    table
}

/// Cumulative % within `width_ns` buckets, per run, for one view.
pub fn buckets_data(
    runs: &[RunResult],
    view: &str,
    latency: LatencyOf,
    width_ns: u64,
    buckets: usize,
) -> DataTable {
    let mut table = DataTable::new(
        &format!("buckets-{view}"),
        &format!("{view}: cumulative % of requests within each bucket"),
        ["rate_msgs_per_s", "bucket_upper_us", "cumulative_pct"],
    );
    for run in runs {
        for bucket in latency(run).cumulative_buckets(width_ns, buckets) {
            table.push(vec![
                run.rate_per_s.into(),
                bucket.upper_ns.map(|ns| ns as f64 / 1_000.0).into(),
                bucket.cumulative_percent.into(),
            ]);
        }
    }
    table
}
