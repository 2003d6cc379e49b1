//! The reproduce runner behind `leantier reproduce`: each paper's experiments at a scale this machine can run, set beside
//! the published figures, with a verdict per claim decided by a rule the page states, in one
//! self-contained `index.html` (plots inline, no script, no network) and data files beside it.

mod delivery;
mod lean_tier;
mod machine;
mod middleware;
mod page;
mod planner;
mod published;
mod verdict;
mod web_service;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::data::DataTable;
use crate::report::ReportDir;

use machine::{CpuTicks, HostLoad, Machine};
use published::{Published, PublishedPaper};
use stats::BadInput;
pub use verdict::Verdict;

/// The papers, in order: id, short name, what runs them.
const PAPERS: [(&str, &str, PaperRunner); 5] = [
    ("000", "lean business tier", lean_tier::run),
    ("001", "response delivery", delivery::run),
    ("002", "messaging middleware", middleware::run),
    ("003", "thread planner", planner::run),
    ("004", "web service", web_service::run),
];

type PaperRunner = fn(&Scale, &PublishedPaper<'_>, &ReportDir) -> anyhow::Result<PaperResult>;

/// What `leantier reproduce` runs (its flags, in `leantier reproduce --help`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The quick scale (all five papers in minutes): fewer repeats, shorter runs.
    pub quick: bool,
    /// Only these papers (ids: 000 lean tier, 001 delivery, 002 middleware, 003 planner,
    /// 004 web service); all when empty.
    pub only: Vec<String>,
    /// Folder for index.html and the data files.
    pub out: PathBuf,
    /// Another copy of the published figures (TOML) instead of the embedded one.
    pub published: Option<PathBuf>,
    /// The message queue's store: `sqlite:DIR` or a `postgres://` URL (default: SQLite in a
    /// temporary folder).
    pub mq_store: Option<String>,
    /// Python interpreter with Flask for the web service's Python baselines.
    pub python: Option<PathBuf>,
    /// The arguments that make this program a prefork child (the web service's models).
    pub child_args: Vec<OsString>,
}

/// How much each experiment runs.
pub struct Scale {
    pub quick: bool,
    pub mq_store: Option<String>,
    pub python: Option<PathBuf>,
    /// The arguments that make this program a prefork child.
    pub child_args: Vec<OsString>,
}

impl Scale {
    /// Seconds of one measured run: `quick` or `full`.
    pub fn seconds(&self, quick: f64, full: f64) -> f64 {
        if self.quick { quick } else { full }
    }

    /// Repeats of one measurement: `quick` or `full`.
    pub fn repeats(&self, quick: usize, full: usize) -> usize {
        if self.quick { quick } else { full }
    }
}

/// A measured table with its plot.
pub struct Figure {
    pub table: DataTable,
    /// `None` for tables of counts that a plot would not help read.
    pub plot_svg: Option<String>,
    /// What ran and how to read it.
    pub note: String,
}

/// One published claim, the scope both sides were measured in, the rule that decides it,
/// what was measured and the verdict.
pub struct Claim {
    pub claim: String,
    /// What was compared with what: both sides measured here in the same run (and how), or
    /// a published figure of another scope shown for context.
    pub scope: String,
    pub rule: String,
    pub measured: String,
    pub verdict: Verdict,
}

impl Claim {
    pub fn new(claim: &str, scope: &str, rule: &str, measured: String, verdict: Verdict) -> Claim {
        Claim { claim: claim.into(), scope: scope.into(), rule: rule.into(), measured, verdict }
    }

    /// A published absolute figure taken in `published_scope` (another machine, another
    /// store) beside ours: shown, not judged.
    pub fn context(claim: &str, published_scope: &str, measured: String) -> Claim {
        Claim::new(
            claim,
            &format!("published: {published_scope}; measured: this machine"),
            "none: absolute figures of another scope are not comparable",
            measured,
            Verdict::Context(format!("published on {published_scope}")),
        )
    }
}

/// What one paper's reproduction found.
pub struct PaperResult {
    /// What ran, and what of the published set did not.
    pub scope: String,
    pub figures: Vec<Figure>,
    pub claims: Vec<Claim>,
    /// Other files written (hgrm), relative to the report folder.
    pub files: Vec<String>,
}

/// What became of a paper in this invocation.
pub enum Outcome {
    Ran(PaperResult),
    Failed(String),
    /// Left out by `--only`: the page still shows what was published.
    Skipped,
}

/// One paper as the page shows it.
pub struct PaperSection<'a> {
    pub paper: PublishedPaper<'a>,
    pub name: &'static str,
    pub elapsed: Duration,
    pub outcome: Outcome,
    /// What the rest of the host did while this paper ran.
    pub host: Option<HostLoad>,
}

/// `leantier reproduce`: runs the papers, writes the page and data files, and fails (exit 1)
/// when a paper's run failed.
pub fn run(args: &Settings) -> anyhow::Result<()> {
    let unknown: Vec<&String> =
        args.only.iter().filter(|id| !PAPERS.iter().any(|(p, _, _)| p == id)).collect();
    if !unknown.is_empty() {
        return Err(BadInput(format!("--only: no paper {unknown:?} (000 … 004)")).into());
    }
    let published = Published::load(args.published.as_deref())?;
    let dir = ReportDir::create(&args.out)?;
    let scale = Scale {
        quick: args.quick,
        mq_store: args.mq_store.clone(),
        python: args.python.clone(),
        child_args: args.child_args.clone(),
    };
    let started = Instant::now();
    let load_average_before = machine::load_average();
    let before = HostLoad::before_run();
    if let Some(host) = before.filter(HostLoad::loaded) {
        println!("the host is loaded before the run ({}): every verdict will say so", host.text());
    }
    let ticks = CpuTicks::now();
    let mut sections = Vec::new();
    for (id, name, runner) in PAPERS {
        let paper = published.paper(id)?;
        if !args.only.is_empty() && !args.only.iter().any(|o| o == id) {
            let elapsed = Duration::ZERO;
            let outcome = Outcome::Skipped;
            sections.push(PaperSection { paper, name, elapsed, outcome, host: None });
            continue;
        }
        println!("paper {id} ({name}) …");
        let paper_started = Instant::now();
        let paper_ticks = CpuTicks::now();
        let outcome = match runner(&scale, &paper, &dir) {
            Ok(result) => {
                write_figures(&dir, &result.figures)?;
                Outcome::Ran(result)
            }
            Err(error) => {
                eprintln!("paper {id}: the run failed: {error:#}");
                Outcome::Failed(format!("{error:#}"))
            }
        };
        let elapsed = paper_started.elapsed();
        let host = HostLoad::between(paper_ticks, CpuTicks::now());
        let host_text = host.map_or(String::new(), |h| format!("; {}", h.verdict_text()));
        println!("paper {id} done in {:.1} s{host_text}", elapsed.as_secs_f64());
        sections.push(PaperSection { paper, name, elapsed, outcome, host });
    }
    let machine = Machine::describe(ticks, before, load_average_before);
    dir.write_data(&machine.table())?;
    let invocation = invocation(args);
    let html = page::render(&sections, &machine, &invocation, started.elapsed());
    let index = dir.write_text("index.html", &html)?;
    write_verdicts(&dir, &sections)?;
    println!("{}", page::summary_lines(&sections));
    println!("Report: {} ({:.0} s in all)", index.display(), started.elapsed().as_secs_f64());
    failed_papers(&sections)
}

/// The command as the page shows it: its flags without local paths (the output folder, the
/// figures' copy, the interpreter) and without a database URL's credentials.
fn invocation(args: &Settings) -> String {
    let mut words = vec!["leantier reproduce".to_string()];
    if args.quick {
        words.push("--quick".into());
    }
    if !args.only.is_empty() {
        words.push(format!("--only {}", args.only.join(",")));
    }
    if args.published.is_some() {
        words.push("--published FILE".into());
    }
    if let Some(store) = &args.mq_store {
        let kind = store.split(':').next().unwrap_or("");
        words.push(format!("--mq-store {kind}:…"));
    }
    if let Some(python) = &args.python {
        let name = python.file_name().map_or("python".into(), |n| n.to_string_lossy());
        words.push(format!("--python {name}"));
    }
    words.join(" ")
}

/// A paper whose run failed fails the command (exit 1), once the page that shows the failure
/// is written: a script or CI that reads only the exit status must not take it for a result.
fn failed_papers(sections: &[PaperSection<'_>]) -> anyhow::Result<()> {
    let failed: Vec<&str> = sections
        .iter()
        .filter(|section| matches!(section.outcome, Outcome::Failed(_)))
        .map(|section| section.paper.id)
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    anyhow::bail!("the run of paper {} failed (the report shows why)", failed.join(", "))
}

/// `verdicts.csv`/`.json`: one row per claim, for scripts and CI.
fn write_verdicts(dir: &ReportDir, sections: &[PaperSection<'_>]) -> anyhow::Result<()> {
    let mut table = DataTable::new(
        "verdicts",
        "Verdict per claim",
        ["paper", "claim", "scope", "rule", "measured", "verdict", "why", "host_during_paper"],
    );
    for section in sections {
        let result = match &section.outcome {
            Outcome::Ran(result) => result,
            Outcome::Failed(_) => {
                table.push(vec![section.paper.id.into(), "the run failed".into()]);
                continue;
            }
            Outcome::Skipped => continue,
        };
        let host = section.host.map_or("not measured".into(), |h| h.verdict_text());
        for claim in &result.claims {
            let (verdict, why) = page::verdict_words(&claim.verdict);
            table.push(vec![
                section.paper.id.into(),
                claim.claim.as_str().into(),
                claim.scope.as_str().into(),
                claim.rule.as_str().into(),
                claim.measured.as_str().into(),
                verdict.into(),
                why.into(),
                host.as_str().into(),
            ]);
        }
    }
    dir.write_data(&table)?;
    Ok(())
}

/// Writes each figure's data files and plot (the page inlines the plot too).
fn write_figures(dir: &ReportDir, figures: &[Figure]) -> anyhow::Result<()> {
    for figure in figures {
        dir.write_data(&figure.table)?;
        if let Some(svg) = &figure.plot_svg {
            dir.write_svg(&format!("{}.svg", figure.table.name), svg)?;
        }
    }
    Ok(())
}

/// The median of `values` (NaN-free), `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| stats::median(values.to_vec()))
}

/// Nanoseconds as µs.
pub fn us(ns: u64) -> f64 {
    ns as f64 / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section<'a>(
        published: &'a Published,
        id: &'static str,
        outcome: Outcome,
        host: Option<HostLoad>,
    ) -> PaperSection<'a> {
        let paper = published.paper(id).unwrap();
        PaperSection { paper, name: "test", elapsed: Duration::from_secs(1), outcome, host }
    }

    #[test]
    fn the_page_shows_every_paper_with_its_verdicts_scopes_and_host() {
        let published = Published::load(None).unwrap();
        let mut table = DataTable::new("t-measured", "Measured here", ["rate_msgs_per_s"]);
        table.push(vec![20_000.0.into()]);
        let plot = crate::plot::LinePlot::new("p", "x (s)", "y (µs)").series("s", vec![(1.0, 2.0)]);
        let claims = vec![
            Claim::new("c1", "same run s1", "rule 1", "m1".into(), Verdict::Reproduced),
            Claim::new("c2", "same run s2", "rule 2", "m2".into(), Verdict::NotReproduced),
            Claim::new(
                "c3",
                "s3",
                "rule 3",
                "m3".into(),
                Verdict::NotMeasurable("no cores".into()),
            ),
            Claim::new("c4", "s4", "rule 4", "m4".into(), Verdict::Inconclusive("overlap".into())),
            Claim::context("c5", "a 2-socket Xeon", "m5".into()),
        ];
        let figure = Figure { table, plot_svg: Some(plot.to_svg()), note: "n".into() };
        let result =
            PaperResult { scope: "s".into(), figures: vec![figure], claims, files: vec![] };
        let loaded = HostLoad { other_cores: 1.5, steal_pct: 0.0, cores: 2 };
        let sections = vec![
            section(&published, "000", Outcome::Ran(result), Some(loaded)),
            section(&published, "001", Outcome::Failed("boom".into()), None),
            section(&published, "002", Outcome::Skipped, None),
            section(&published, "003", Outcome::Skipped, None),
            section(&published, "004", Outcome::Skipped, None),
        ];
        let machine = Machine::describe(CpuTicks::now(), None, "0.10 0.20 0.30".into());
        let html = page::render(&sections, &machine, "leantier reproduce", Duration::from_secs(3));
        for id in ["000", "001", "002", "003", "004"] {
            assert!(html.contains(&format!("id=\"paper-{id}\"")), "{id}");
        }
        for needle in [
            "class=\"reproduced\"",
            "class=\"not-reproduced\"",
            "not measurable here: no cores",
            "class=\"inconclusive\"",
            "inconclusive: overlap",
            "class=\"context\"",
            "context only: published on a 2-socket Xeon",
            "same run s1",
            "on a loaded host: other processes kept 1.50 of 2 cores busy",
            "<svg",
            "The run failed: boom",
            "Not run this time",
            "Fig 5(b)",
        ] {
            assert!(html.contains(needle), "missing {needle}");
        }
        assert!(!html.contains("<script"), "no script");
        let summary = page::summary_lines(&sections);
        assert!(summary.contains("000 c2: not reproduced [m2] (on a loaded host"), "{summary}");
    }

    #[test]
    fn the_invocation_shows_no_local_path_or_credentials() {
        let args = Settings {
            quick: true,
            only: vec!["004".into()],
            out: PathBuf::from("/home/someone/report"),
            published: Some(PathBuf::from("/home/someone/published.toml")),
            mq_store: Some("postgres://user:secret@db/leantier".into()),
            python: Some(PathBuf::from("/home/someone/venv/bin/python3")),
            child_args: Vec::new(),
        };
        let text = invocation(&args);
        assert_eq!(
            text,
            "leantier reproduce --quick --only 004 --published FILE --mq-store postgres:… --python python3"
        );
    }
}
