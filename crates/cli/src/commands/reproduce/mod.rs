//! `leantier reproduce`: each paper's experiments at a scale this machine can run, set beside
//! the published figures, with a verdict per claim decided by a rule the page states, in one
//! self-contained `index.html` (plots inline, no script, no network) and data files beside it.

mod delivery;
mod lean_tier;
mod machine;
mod middleware;
mod page;
mod planner;
mod published;
mod web_service;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lab::data::DataTable;
use lab::report::ReportDir;

use crate::outcome::BadInput;
use machine::{CpuTicks, Machine};
use published::{Published, PublishedPaper};

/// The papers, in order: id, short name, what runs them.
const PAPERS: [(&str, &str, PaperRunner); 5] = [
    ("000", "lean business tier", lean_tier::run),
    ("001", "response delivery", delivery::run),
    ("002", "messaging middleware", middleware::run),
    ("003", "thread planner", planner::run),
    ("004", "web service", web_service::run),
];

type PaperRunner = fn(&Scale, &PublishedPaper<'_>, &ReportDir) -> anyhow::Result<PaperResult>;

/// Arguments of `leantier reproduce`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The quick scale (all five papers in minutes): fewer repeats, shorter runs.
    #[arg(long)]
    pub quick: bool,
    /// Only these papers (comma-separated ids: 000 lean tier, 001 delivery, 002 middleware,
    /// 003 planner, 004 web service).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Folder for index.html and the data files.
    #[arg(long, default_value = "leantier-report/reproduce")]
    pub out: PathBuf,
    /// Another copy of the published figures (TOML) instead of the embedded one.
    #[arg(long)]
    pub published: Option<PathBuf>,
    /// The message queue's store: `sqlite:DIR` or a `postgres://` URL [default: SQLite in a
    /// temporary folder].
    #[arg(long, env = "LEANTIER_PG_URL")]
    pub mq_store: Option<String>,
    /// Python interpreter with Flask for the web service's Python baselines [default:
    /// `python3` when it imports flask; otherwise the baselines are reported not measurable].
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// How much each experiment runs.
pub struct Scale {
    pub quick: bool,
    pub mq_store: Option<String>,
    pub python: Option<PathBuf>,
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

/// A claim's verdict.
pub enum Verdict {
    Reproduced,
    NotReproduced,
    NotMeasurable(String),
}

/// One published claim, the rule that decides it, what was measured and the verdict.
pub struct Claim {
    pub claim: String,
    pub rule: String,
    pub measured: String,
    pub verdict: Verdict,
}

impl Claim {
    /// A claim decided by `holds` (`None`: the data needed is missing, with why).
    pub fn decide(claim: &str, rule: &str, measured: String, holds: Result<bool, String>) -> Claim {
        let verdict = match holds {
            Ok(true) => Verdict::Reproduced,
            Ok(false) => Verdict::NotReproduced,
            Err(why) => Verdict::NotMeasurable(why),
        };
        Claim { claim: claim.into(), rule: rule.into(), measured, verdict }
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
}

/// `leantier reproduce`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let unknown: Vec<&String> =
        args.only.iter().filter(|id| !PAPERS.iter().any(|(p, _, _)| p == id)).collect();
    if !unknown.is_empty() {
        return Err(BadInput(format!("--only: no paper {unknown:?} (000 … 004)")).into());
    }
    let published = Published::load(args.published.as_deref())?;
    let dir = ReportDir::create(&args.out)?;
    let scale =
        Scale { quick: args.quick, mq_store: args.mq_store.clone(), python: args.python.clone() };
    let started = Instant::now();
    let ticks = CpuTicks::now();
    let mut sections = Vec::new();
    for (id, name, runner) in PAPERS {
        let paper = published.paper(id)?;
        if !args.only.is_empty() && !args.only.iter().any(|o| o == id) {
            let elapsed = Duration::ZERO;
            sections.push(PaperSection { paper, name, elapsed, outcome: Outcome::Skipped });
            continue;
        }
        println!("paper {id} ({name}) …");
        let paper_started = Instant::now();
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
        println!("paper {id} done in {:.1} s", elapsed.as_secs_f64());
        sections.push(PaperSection { paper, name, elapsed, outcome });
    }
    let machine = Machine::describe(ticks);
    dir.write_data(&machine.table())?;
    let invocation = std::env::args().collect::<Vec<_>>().join(" ");
    let html = page::render(&sections, &machine, &invocation, started.elapsed());
    let index = dir.write_text("index.html", &html)?;
    write_verdicts(&dir, &sections)?;
    println!("{}", page::summary_lines(&sections));
    println!("Report: {} ({:.0} s in all)", index.display(), started.elapsed().as_secs_f64());
    failed_papers(&sections)
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
        ["paper", "claim", "rule", "measured", "verdict", "why_not_measurable"],
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
        for claim in &result.claims {
            let (verdict, why) = page::verdict_words(&claim.verdict);
            table.push(vec![
                section.paper.id.into(),
                claim.claim.as_str().into(),
                claim.rule.as_str().into(),
                claim.measured.as_str().into(),
                verdict.into(),
                why.into(),
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

/// "k of n" and whether k reaches `needed`.
pub fn count_rule(wins: usize, total: usize, needed: usize) -> (String, Result<bool, String>) {
    if total == 0 {
        return ("no measurement".into(), Err("nothing was measured".into()));
    }
    (format!("{wins} of {total}"), Ok(wins >= needed))
}

/// The median of `values` (NaN-free), `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| lab::stats::median(values.to_vec()))
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
    ) -> PaperSection<'a> {
        let paper = published.paper(id).unwrap();
        PaperSection { paper, name: "test", elapsed: Duration::from_secs(1), outcome }
    }

    #[test]
    fn count_rule_states_k_of_n_and_needs_a_measurement() {
        assert_eq!(count_rule(4, 5, 4), ("4 of 5".to_string(), Ok(true)));
        assert_eq!(count_rule(3, 5, 4).1, Ok(false));
        assert!(count_rule(0, 0, 1).1.is_err());
    }

    #[test]
    fn the_page_shows_every_paper_with_its_verdicts_and_plots() {
        let published = Published::load(None).unwrap();
        let mut table = DataTable::new("t-measured", "Measured here", ["rate_msgs_per_s"]);
        table.push(vec![20_000.0.into()]);
        let plot = lab::report::LinePlot::new("p", "x (s)", "y (µs)").series("s", vec![(1.0, 2.0)]);
        let claims = vec![
            Claim::decide("c1", "rule 1", "m1".into(), Ok(true)),
            Claim::decide("c2", "rule 2", "m2".into(), Ok(false)),
            Claim::decide("c3", "rule 3", "m3".into(), Err("no cores".into())),
        ];
        let figure = Figure { table, plot_svg: Some(plot.to_svg()), note: "n".into() };
        let result =
            PaperResult { scope: "s".into(), figures: vec![figure], claims, files: vec![] };
        let sections = vec![
            section(&published, "000", Outcome::Ran(result)),
            section(&published, "001", Outcome::Failed("boom".into())),
            section(&published, "002", Outcome::Skipped),
            section(&published, "003", Outcome::Skipped),
            section(&published, "004", Outcome::Skipped),
        ];
        let machine = Machine::describe(CpuTicks::now());
        let html = page::render(&sections, &machine, "leantier reproduce", Duration::from_secs(3));
        for id in ["000", "001", "002", "003", "004"] {
            assert!(html.contains(&format!("id=\"paper-{id}\"")), "{id}");
        }
        for needle in [
            "class=\"reproduced\"",
            "class=\"not-reproduced\"",
            "not measurable here: no cores",
            "<svg",
            "The run failed: boom",
            "Not run this time",
            "Fig 5(b)",
        ] {
            assert!(html.contains(needle), "missing {needle}");
        }
        assert!(!html.contains("<script"), "no script");
        let summary = page::summary_lines(&sections);
        assert!(summary.contains("000 c2: not reproduced [m2]"), "{summary}");
    }
}
