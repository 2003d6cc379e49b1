//! Paper 003, the thread planner: the published optimizer on the published small server
//! (Goedel's service rates, 8 threads, 80% limit) against its published configurations, and
//! those configurations run on this machine's data-flow pipeline, measured vs predicted
//! throughput (`planner::optimize`, `cdr::validate`).

use crate::data::DataTable;
use crate::plot::BarChart;
use crate::report::ReportDir;
use cdr::run::NodeThreads;
use cdr::validate::{Configuration, ValidateSettings, summarize, validate};
use planner::network::Network;
use planner::optimize::{Goal, optimize_with};
use planner::options::{Budget, Options};

use super::published::PublishedPaper;
use super::verdict::{self, MIN_REPEATS, Verdict};
use super::{Claim, Figure, PaperResult, Scale};

const NODES: [&str; 4] = ["Decoder", "Converter", "Serializer", "Feeder"];
/// Measured / predicted throughput counts as a match within 1 ± this.
const RATIO_TOLERANCE: f64 = 0.25;

/// The optimizer's configuration and the published one, per mode.
struct PlanCheck {
    mode: &'static str,
    planned: Vec<u32>,
    published: Option<String>,
}

pub fn run(
    scale: &Scale,
    paper: &PublishedPaper<'_>,
    _dir: &ReportDir,
) -> anyhow::Result<PaperResult> {
    let checks = [("normal", false), ("fixed_feeder", true)]
        .into_iter()
        .map(|(mode, fixed)| plan_check(paper, mode, fixed))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let configurations: Vec<Configuration> = checks
        .iter()
        .filter_map(|check| {
            let [decoder, converter, serializer, feeder] =
                check.planned.iter().map(|&t| t as usize).collect::<Vec<_>>().try_into().ok()?;
            Some(Configuration {
                name: format!("{} ({})", check.mode.replace('_', " "), dashed(&check.planned)),
                threads: NodeThreads { decoder, converter, serializer, feeder },
                settings: Vec::new(),
            })
        })
        .collect();
    let scratch = tempfile::Builder::new().prefix("reproduce-planner-").tempdir()?;
    let settings = ValidateSettings {
        // Exactly MIN_REPEATS: the claim reads the rounds' min, median and max as its repeats.
        rounds: MIN_REPEATS,
        measure_duration: std::time::Duration::from_secs_f64(scale.seconds(0.2, 0.5)),
        run_duration: std::time::Duration::from_secs_f64(scale.seconds(0.6, 2.0)),
        scratch_dir: scratch.path().to_path_buf(),
        seed: 1,
        budget: Budget::Cpu,
    };
    let rounds = validate(&configurations, &settings, |_| {})?;
    let summaries = summarize(&configurations, &rounds);
    let scope = format!(
        "the optimizer (published semantics: Σ threads ≤ 8 cores, 80% limit, fixed nodes left out of \
         the check) on Goedel's published service rates; then its two configurations run flat out on \
         this machine's call-data pipeline (each node measured first, then predicted with the CPU \
         budget of this machine), {} round(s) of {} s",
        settings.rounds,
        settings.run_duration.as_secs_f64()
    );
    let mut claims = vec![plan_claim(&checks)];
    claims.push(prediction_claim(&summaries));
    Ok(PaperResult {
        scope,
        figures: vec![plans_figure(paper, &checks), prediction_figure(&summaries)],
        claims,
        files: Vec::new(),
    })
}

fn dashed(threads: &[u32]) -> String {
    threads.iter().map(u32::to_string).collect::<Vec<_>>().join("-")
}

/// Goedel's model from the published figures, planned for throughput.
fn plan_check(
    paper: &PublishedPaper<'_>,
    mode: &'static str,
    fixed_feeder: bool,
) -> anyhow::Result<PlanCheck> {
    let rate = |node: &str| {
        paper.number("table10_goedel_mean_service_rates", "node", node, "goedel_tickets_s")
    };
    let parameter =
        |name: &str| paper.number("optimizer_parameters_goedel", "parameter", name, "value");
    let limit =
        parameter("utilization threshold limU (over-utilized above)").unwrap_or(80.0) / 100.0;
    let cores = parameter("maximum threads on Goedel").unwrap_or(8.0);
    let mut model = format!("utilization_limit = {limit}\n[host]\ncores = {cores}\n");
    for (index, node) in NODES.iter().enumerate() {
        let service =
            rate(node).ok_or_else(|| anyhow::anyhow!("no published service rate for {node}"))?;
        model += &format!(
            "[[node]]\nname = \"{}\"\nservice_rate_per_s = {service}\n",
            node.to_lowercase()
        );
        if index == 0 {
            model += "external_share = 1.0\n";
        }
        if fixed_feeder && *node == "Feeder" {
            model += "fixed_threads = 1\n";
        }
    }
    for (from, to) in
        [("decoder", "converter"), ("converter", "serializer"), ("converter", "feeder")]
    {
        model += &format!("[[route]]\nfrom = \"{from}\"\nto = \"{to}\"\n");
    }
    let network = Network::new(toml::from_str(&model)?)?;
    let plan = optimize_with(&network, Goal::Throughput, Options::PUBLISHED)?;
    let published = paper.text(
        "table11_goedel_optimal_configurations",
        "method",
        "Analytical Model",
        &format!("{mode}_threads"),
    );
    Ok(PlanCheck { mode, planned: plan.threads, published })
}

fn plans_figure(paper: &PublishedPaper<'_>, checks: &[PlanCheck]) -> Figure {
    let mut table = DataTable::new(
        "planner-goedel-configurations",
        "Threads per node: the optimizer on Goedel's published rates vs the published optimum (Table 11)",
        [
            "node",
            "service_rate_tickets_per_s",
            "normal_planned_threads",
            "normal_published_threads",
            "fixed_feeder_planned_threads",
            "fixed_feeder_published_threads",
        ],
    );
    let published_threads = |check: &PlanCheck| -> Vec<f64> {
        check
            .published
            .as_deref()
            .unwrap_or("")
            .split('-')
            .map(|t| t.parse().unwrap_or(f64::NAN))
            .collect()
    };
    let (normal, fixed) = (&checks[0], &checks[1]);
    for (index, node) in NODES.iter().enumerate() {
        let threads = |check: &PlanCheck| check.planned.get(index).map(|&t| f64::from(t));
        table.push(vec![
            (*node).into(),
            paper
                .number("table10_goedel_mean_service_rates", "node", node, "goedel_tickets_s")
                .into(),
            threads(normal).into(),
            published_threads(normal).get(index).copied().into(),
            threads(fixed).into(),
            published_threads(fixed).get(index).copied().into(),
        ]);
    }
    let mut chart =
        BarChart::new("Threads per node on Goedel: planned here vs published", "threads", NODES);
    for check in checks {
        chart = chart
            .group(
                &format!("{} planned", check.mode),
                check.planned.iter().map(|&t| f64::from(t)).collect(),
            )
            .group(&format!("{} published", check.mode), published_threads(check));
    }
    Figure {
        plot_svg: Some(chart.to_svg()),
        table,
        note: "The model's inputs are the published Table 10 rates.".into(),
    }
}

fn plan_claim(checks: &[PlanCheck]) -> Claim {
    let measured = checks
        .iter()
        .map(|c| {
            format!(
                "{}: {} (published {})",
                c.mode,
                dashed(&c.planned),
                c.published.as_deref().unwrap_or("?")
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let verdict = if checks.iter().any(|c| c.published.is_none()) {
        Verdict::NotMeasurable("a published configuration is missing".to_string())
    } else if checks.iter().all(|c| c.published.as_deref() == Some(dashed(&c.planned).as_str())) {
        Verdict::Reproduced
    } else {
        Verdict::NotReproduced
    };
    Claim::new(
        "The optimizer finds the best configurations on Goedel: (1-1-1-5), and (1-2-4-1) with a fixed feeder (Table 11)",
        "the published model's own inputs (Table 10 rates, 8 cores, 80% limit): an exact \
         computation, the same whatever machine runs it",
        "the optimizer's threads per node equal the published ones in both modes",
        measured,
        verdict,
    )
}

fn prediction_figure(summaries: &[cdr::validate::ConfigurationSummary]) -> Figure {
    let mut table = DataTable::new(
        "planner-measured-vs-predicted",
        "The configurations on this machine's pipeline: predicted vs measured maximum throughput (median over rounds)",
        [
            "configuration",
            "predicted_bottleneck",
            "predicted_tickets_per_s",
            "measured_tickets_per_s",
            "ratio_median",
            "ratio_min",
            "ratio_max",
        ],
    );
    for s in summaries {
        table.push(vec![
            s.configuration.as_str().into(),
            s.predicted_bottleneck.as_str().into(),
            s.predicted_per_s_median.into(),
            s.measured_per_s_median.into(),
            s.ratio_median.into(),
            s.ratio_min.into(),
            s.ratio_max.into(),
        ]);
    }
    let names: Vec<String> = summaries.iter().map(|s| s.configuration.clone()).collect();
    let chart =
        BarChart::new("Maximum throughput: predicted vs measured", "throughput (tickets/s)", names)
            .group("predicted", summaries.iter().map(|s| s.predicted_per_s_median).collect())
            .group_with_ranges(
                "measured",
                summaries.iter().map(|s| s.measured_per_s_median).collect(),
                summaries
                    .iter()
                    .map(|s| {
                        Some((
                            s.ratio_min * s.predicted_per_s_median,
                            s.ratio_max * s.predicted_per_s_median,
                        ))
                    })
                    .collect(),
            );
    Figure { plot_svg: Some(chart.to_svg()), table, note: "Whiskers: the range of measured/predicted over the rounds, scaled by the median prediction.".into() }
}

fn prediction_claim(summaries: &[cdr::validate::ConfigurationSummary]) -> Claim {
    let measured = summaries
        .iter()
        .map(|s| {
            format!(
                "{}: {:.2} ({:.2}–{:.2}, {MIN_REPEATS} rounds)",
                s.configuration, s.ratio_median, s.ratio_min, s.ratio_max
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    // With MIN_REPEATS rounds, min, median and max are the rounds themselves.
    let parts = summaries
        .iter()
        .map(|s| {
            let rounds = [s.ratio_min, s.ratio_median, s.ratio_max];
            verdict::inside(&rounds, 1.0 - RATIO_TOLERANCE, 1.0 + RATIO_TOLERANCE)
        })
        .collect();
    Claim::new(
        "Measured-then-calculated predictions match the measured best configurations",
        "prediction and measurement both made here, in the same round, on this machine's pipeline",
        &format!(
            "measured/predicted throughput within 1 ± {RATIO_TOLERANCE} in every round, for every \
             configuration"
        ),
        measured,
        verdict::all_of(parts),
    )
}
