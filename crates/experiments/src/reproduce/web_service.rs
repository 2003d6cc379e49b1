//! Paper 004, the web service: execution models × users × matrix sizes, closed loop, in
//! interleaved rounds, with the Python baselines where Flask is installed (`web matrix`'s
//! measurement), and the adaptive model the authors proposed as future work.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::data::DataTable;
use crate::plot::BarChart;
use crate::report::ReportDir;
use crate::web_load::CellResult;
use web::exec::Model;
use web::workload::Complexity;

use crate::web_lab::{MatrixSettings, MedianCell, measure_matrix};

use super::published::PublishedPaper;
use super::verdict::{self, MIN_REPEATS, Spread, Verdict};
use super::{Claim, Figure, PaperResult, Scale, median};

/// The Flask baseline, relative to the repository root.
const PYTHON_APP: &str = "bench/web-python/app.py";
/// "Matches the best" means at least this share of its throughput.
const MATCH_SHARE: f64 = 0.95;

pub fn run(
    scale: &Scale,
    _paper: &PublishedPaper<'_>,
    _dir: &ReportDir,
) -> anyhow::Result<PaperResult> {
    let python = python_with_flask(scale.python.clone());
    let args = matrix_args(scale, python.clone());
    let (samples, medians) = measure_matrix(&args)?;
    let python_note = match &python {
        Some(path) => format!(
            "Python baselines ({}, Flask) at low complexity × 10 users, first round only (one round decides nothing)",
            path.file_name().map_or("python".into(), |n| n.to_string_lossy())
        ),
        None => format!("no Python baselines: no interpreter with Flask, or no {PYTHON_APP} here"),
    };
    let scope = format!(
        "models {} × users {:?} × complexity {} in-process on loopback, {} interleaved rounds of {} s; {python_note}",
        args.models.iter().map(|m| m.name()).collect::<Vec<_>>().join("/"),
        args.users,
        args.complexity.iter().map(|c| c.name()).collect::<Vec<_>>().join("/"),
        args.rounds,
        args.duration.as_secs_f64()
    );
    Ok(PaperResult {
        scope,
        figures: vec![throughput_figure(&medians)],
        claims: claims(&samples, &args, python.is_some()),
        files: Vec::new(),
    })
}

/// `--python`, else `python3` if it imports flask; only where the baseline app is present.
fn python_with_flask(python: Option<PathBuf>) -> Option<PathBuf> {
    if !std::path::Path::new(PYTHON_APP).exists() {
        return None;
    }
    let python = python.unwrap_or_else(|| PathBuf::from("python3"));
    let imports = Command::new(&python).args(["-c", "import flask"]).output();
    imports.is_ok_and(|o| o.status.success()).then_some(python)
}

fn matrix_args(scale: &Scale, python: Option<PathBuf>) -> MatrixSettings {
    let models = if scale.quick {
        vec![Model::Single, Model::Pool, Model::Pinned, Model::Adaptive]
    } else {
        Model::ALL.to_vec()
    };
    MatrixSettings {
        models,
        users: if scale.quick { vec![10, 30] } else { vec![10, 30, 60] },
        complexity: if scale.quick {
            vec![Complexity::Low, Complexity::High]
        } else {
            Complexity::ALL.to_vec()
        },
        duration: Duration::from_secs_f64(scale.seconds(0.3, 0.5)),
        warmup: Duration::from_millis(150),
        rounds: scale.repeats(MIN_REPEATS, 9),
        interval: Duration::from_millis(100),
        workers: None,
        python,
        python_app: PathBuf::from(PYTHON_APP),
        python_complexity: vec![Complexity::Low],
        python_duration: Duration::from_secs_f64(scale.seconds(2.0, 8.0)),
        python_users: vec![10],
        out: PathBuf::new(),
        child_args: scale.child_args.clone(),
    }
}

fn throughput_figure(medians: &[MedianCell]) -> Figure {
    let mut table = DataTable::new(
        "web-throughput-by-model",
        "Throughput (median over rounds, with its range) and latency of the median round, per model and cell",
        [
            "model",
            "complexity",
            "matrix_rows",
            "users",
            "rounds",
            "throughput_req_per_s_median",
            "throughput_req_per_s_min",
            "throughput_req_per_s_max",
            "latency_p50_us",
            "latency_p99_us",
            "errors",
        ],
    );
    for m in medians {
        let r = &m.median;
        table.push(vec![
            r.target.as_str().into(),
            r.complexity.name().into(),
            r.complexity.rows().into(),
            r.users.into(),
            m.rounds.into(),
            r.throughput_per_s.into(),
            m.throughput_per_s_min.into(),
            m.throughput_per_s_max.into(),
            (r.latency.p50_ns as f64 / 1_000.0).into(),
            (r.latency.p99_ns as f64 / 1_000.0).into(),
            m.errors_all_rounds.into(),
        ]);
    }
    let mut keys: Vec<(Complexity, usize)> =
        medians.iter().map(|m| (m.median.complexity, m.median.users)).collect();
    keys.dedup();
    let mut targets: Vec<String> = medians.iter().map(|m| m.median.target.clone()).collect();
    targets.sort();
    targets.dedup();
    let categories: Vec<String> =
        keys.iter().map(|(c, u)| format!("{} × {u} users", c.name())).collect();
    let mut chart = BarChart::new(
        "Throughput per execution model (whiskers: range over rounds)",
        "throughput (req/s)",
        categories,
    );
    for target in &targets {
        let cell = |key: &(Complexity, usize)| {
            medians.iter().find(|m| {
                &m.median.target == target && (m.median.complexity, m.median.users) == *key
            })
        };
        let values =
            keys.iter().map(|k| cell(k).map_or(f64::NAN, |m| m.median.throughput_per_s)).collect();
        let ranges = keys
            .iter()
            .map(|k| cell(k).map(|m| (m.throughput_per_s_min, m.throughput_per_s_max)))
            .collect();
        chart = chart.group_with_ranges(target, values, ranges);
    }
    Figure {
        plot_svg: Some(chart.to_svg()),
        table,
        note: "Closed loop, no think time; the Python baselines run one round.".into(),
    }
}

/// The throughput of every round of `target` in one cell.
fn throughputs(
    samples: &[CellResult],
    target: &str,
    complexity: Complexity,
    users: usize,
) -> Vec<f64> {
    samples
        .iter()
        .filter(|c| c.target == target && c.complexity == complexity && c.users == users)
        .map(|c| c.throughput_per_s)
        .collect()
}

/// A rule on two sides' rounds (`a`'s and the best of `b`'s).
type Rule = fn(&[f64], &[f64]) -> Verdict;

/// At every user count at `complexity`: `rule(rounds of a, rounds of the best of b by median)`.
fn compare(
    samples: &[CellResult],
    users_counts: &[usize],
    complexity: Complexity,
    a: &str,
    b: &[&str],
    rule: Rule,
) -> (String, Verdict) {
    let mut texts = Vec::new();
    let mut parts = Vec::new();
    for &users in users_counts {
        let ours = throughputs(samples, a, complexity, users);
        let best = b
            .iter()
            .map(|m| (*m, throughputs(samples, m, complexity, users)))
            .filter_map(|(m, values)| Some((m, median(&values)?, values)))
            .max_by(|x, y| x.1.total_cmp(&y.1));
        let (Some((best_name, _, theirs)), false) = (best, ours.is_empty()) else {
            let why = format!("{a} or {b:?} did not run at {} × {users}", complexity.name());
            return ("incomplete".into(), Verdict::NotMeasurable(why));
        };
        let spread =
            |values: &[f64]| Spread::of(values).map_or("none".into(), |s| s.text(" req/s"));
        texts.push(format!(
            "{users} users: {a} {} vs {best_name} {}",
            spread(&ours),
            spread(&theirs)
        ));
        parts.push(rule(&ours, &theirs));
    }
    (texts.join("; "), verdict::all_of(parts))
}

/// Every model measured here in the same interleaved rounds.
const SAME_RUN: &str = "every model measured here in the same interleaved rounds, same cell \
     (complexity × users), closed loop on loopback";

fn claims(samples: &[CellResult], args: &MatrixSettings, python: bool) -> Vec<Claim> {
    let matches_best: Rule = |a, b| verdict::at_least(a, b, MATCH_SHARE);
    let (m, v) =
        compare(samples, &args.users, Complexity::Low, "single", &["pool", "pinned"], matches_best);
    let small = Claim::new(
        "Single-threaded gives the highest throughput for small matrices (30 rows; Figs 15, 24)",
        SAME_RUN,
        &format!(
            "at low complexity and every user count, every round of single ≥ {MATCH_SHARE} × every \
             round of the better of pool and pinned"
        ),
        m,
        v,
    );
    let (m, v) = compare(samples, &args.users, Complexity::Low, "pool", &["single"], |a, b| {
        verdict::below(a, b, 1.0)
    });
    let overhead = Claim::new(
        "Computing one request's rows on a thread pool adds overhead for small matrices (Fig 14)",
        SAME_RUN,
        "at low complexity and every user count, every round of pool below every round of single",
        m,
        v,
    );
    let (m, v) = compare(samples, &args.users, Complexity::High, "pinned", &["single"], |a, b| {
        verdict::at_least(a, b, 1.0)
    });
    let large = Claim::new(
        "Handling requests in parallel, one worker per core, wins as the work grows (Figs 18, 23, 24)",
        SAME_RUN,
        "at high complexity and every user count, every round of pinned ≥ every round of single",
        m,
        v,
    );
    let fixed = ["single", "pool", "pinned", "prefork"];
    let mut adaptive_texts = Vec::new();
    let mut adaptive_parts = Vec::new();
    for &complexity in &args.complexity {
        let (m, v) = compare(samples, &args.users, complexity, "adaptive", &fixed, matches_best);
        adaptive_texts.push(format!("{}: {m}", complexity.name()));
        adaptive_parts.push(v);
    }
    let adaptive = Claim::new(
        "Future work: a framework that picks the execution method per request by its size",
        SAME_RUN,
        &format!(
            "in every cell, every round of adaptive ≥ {MATCH_SHARE} × every round of the best fixed model"
        ),
        adaptive_texts.join(" | "),
        verdict::all_of(adaptive_parts),
    );
    vec![small, overhead, large, adaptive, python_claim(samples, python)]
}

fn python_claim(samples: &[CellResult], python: bool) -> Claim {
    let claim =
        "Python: a single process beats multiprocessing per request below 200 rows (Fig 24)";
    let rule =
        "at low complexity × 10 users, every round of python-single ≥ every round of python-mp";
    let scope = "both Python baselines measured here in the same interleaved rounds, same cell";
    if !python {
        return Claim::new(
            claim,
            scope,
            rule,
            "not run".into(),
            Verdict::NotMeasurable("no Python interpreter with Flask on this machine (pip install -r bench/web-python/requirements.txt)".into()),
        );
    }
    let (m, v) =
        compare(samples, &[10], Complexity::Low, "python-single", &["python-mp"], |a, b| {
            verdict::at_least(a, b, 1.0)
        });
    Claim::new(claim, scope, rule, m, v)
}
