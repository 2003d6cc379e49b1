//! Paper 004, the web service: execution models × users × matrix sizes, closed loop, in
//! interleaved rounds, with the Python baselines where Flask is installed (`web matrix`'s
//! measurement), and the adaptive model the authors proposed as future work.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use lab::data::DataTable;
use lab::report::{BarChart, ReportDir};
use labs::web_load::CellResult;
use web::exec::Model;
use web::workload::Complexity;

use super::super::web_lab::{MatrixArgs, MedianCell, measure_matrix};
use super::published::PublishedPaper;
use super::{Claim, Figure, PaperResult, Scale};

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
    let (_, medians) = measure_matrix(&args)?;
    let cells: Vec<&CellResult> = medians.iter().map(|m| &m.median).collect();
    let python_note = match &python {
        Some(path) => format!(
            "Python baselines ({}, Flask) at low complexity × 10 users, first round",
            path.display()
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
        claims: claims(&cells, &args, python.is_some()),
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

fn matrix_args(scale: &Scale, python: Option<PathBuf>) -> MatrixArgs {
    let models = if scale.quick {
        vec![Model::Single, Model::Pool, Model::Pinned, Model::Adaptive]
    } else {
        Model::ALL.to_vec()
    };
    MatrixArgs {
        models,
        users: if scale.quick { vec![10, 30] } else { vec![10, 30, 60] },
        complexity: if scale.quick {
            vec![Complexity::Low, Complexity::High]
        } else {
            Complexity::ALL.to_vec()
        },
        duration: Duration::from_secs_f64(scale.seconds(0.3, 0.5)),
        warmup: Duration::from_millis(150),
        rounds: scale.repeats(3, 9),
        interval: Duration::from_millis(100),
        workers: None,
        python,
        python_app: PathBuf::from(PYTHON_APP),
        python_complexity: vec![Complexity::Low],
        python_duration: Duration::from_secs_f64(scale.seconds(2.0, 8.0)),
        python_users: vec![10],
        out: PathBuf::new(),
        check: false,
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

fn throughput(
    cells: &[&CellResult],
    target: &str,
    complexity: Complexity,
    users: usize,
) -> Option<f64> {
    cells
        .iter()
        .find(|c| c.target == target && c.complexity == complexity && c.users == users)
        .map(|c| c.throughput_per_s)
}

/// Over every user count at `complexity`: how many satisfy `holds(throughput of a, of b)`.
fn compare(
    cells: &[&CellResult],
    users_counts: &[usize],
    complexity: Complexity,
    a: &str,
    b: &[&str],
    holds: fn(f64, f64) -> bool,
) -> (String, Result<bool, String>) {
    let mut texts = Vec::new();
    let mut all = true;
    for &users in users_counts {
        let best_b =
            b.iter().filter_map(|m| throughput(cells, m, complexity, users)).reduce(f64::max);
        let Some((a_value, b_value)) = throughput(cells, a, complexity, users).zip(best_b) else {
            return (
                "incomplete".into(),
                Err(format!("{a} or {b:?} did not run at {} × {users}", complexity.name())),
            );
        };
        texts.push(format!("{users} users: {a_value:.0} vs {b_value:.0} req/s"));
        all &= holds(a_value, b_value);
    }
    (texts.join("; "), Ok(all))
}

fn claims(cells: &[&CellResult], args: &MatrixArgs, python: bool) -> Vec<Claim> {
    let (m, h) =
        compare(cells, &args.users, Complexity::Low, "single", &["pool", "pinned"], |a, b| {
            a >= MATCH_SHARE * b
        });
    let small = Claim::decide(
        "Single-threaded gives the highest throughput for small matrices (30 rows; Figs 15, 24)",
        &format!(
            "at low complexity, single ≥ {MATCH_SHARE} × the best of pool and pinned, at every user count"
        ),
        m,
        h,
    );
    let (m, h) = compare(cells, &args.users, Complexity::Low, "pool", &["single"], |a, b| a < b);
    let overhead = Claim::decide(
        "Computing one request's rows on a thread pool adds overhead for small matrices (Fig 14)",
        "at low complexity, pool < single at every user count",
        m,
        h,
    );
    let (m, h) =
        compare(cells, &args.users, Complexity::High, "pinned", &["single"], |a, b| a >= b);
    let large = Claim::decide(
        "Handling requests in parallel, one worker per core, wins as the work grows (Figs 18, 23, 24)",
        "at high complexity, pinned ≥ single at every user count",
        m,
        h,
    );
    let fixed = ["single", "pool", "pinned", "prefork"];
    let complexities = args.complexity.clone();
    let mut adaptive_texts = Vec::new();
    let mut adaptive_all = Ok(true);
    for complexity in complexities {
        let (m, h) = compare(cells, &args.users, complexity, "adaptive", &fixed, |a, b| {
            a >= MATCH_SHARE * b
        });
        adaptive_texts.push(format!("{}: {m}", complexity.name()));
        adaptive_all = adaptive_all.and_then(|all| h.map(|h| all && h));
    }
    let adaptive = Claim::decide(
        "Future work: a framework that picks the execution method per request by its size",
        &format!("adaptive ≥ {MATCH_SHARE} × the best fixed model in every cell"),
        adaptive_texts.join(" | "),
        adaptive_all,
    );
    let python_claim = if python {
        let (m, h) =
            compare(cells, &[10], Complexity::Low, "python-single", &["python-mp"], |a, b| a >= b);
        Claim::decide(
            "Python: a single process beats multiprocessing per request below 200 rows (Fig 24)",
            "at low complexity × 10 users, python-single ≥ python-mp",
            m,
            h,
        )
    } else {
        Claim::decide(
            "Python: a single process beats multiprocessing per request below 200 rows (Fig 24)",
            "at low complexity × 10 users, python-single ≥ python-mp",
            "not run".into(),
            Err("no Python interpreter with Flask on this machine (pip install -r bench/web-python/requirements.txt)".into()),
        )
    };
    vec![small, overhead, large, adaptive, python_claim]
}
