//! Paper 001, response delivery: runs 1–7 (blocking grid + 20 senders; lock-free + 20;
//! lock-free + dedicated cores with 6, 4, 3, 2, 1 senders), cumulative % per 10 µs bucket,
//! p90 and p99 at the gateway (`experiments::delivery_experiment`), repeated.

use crate::data::{Cell, DataTable};
use crate::delivery_experiment::{
    self as experiment, BUCKET_UPPERS_US, Experiment, LAYOUTS, Settings,
};
use crate::plot::{LinePlot, latency_percentile_plot};
use crate::report::ReportDir;
use crate::tier_load::Arrival;
use stats::LatencyHistogram;

use super::published::PublishedPaper;
use super::verdict::{self, MIN_REPEATS, Spread};
use super::{Claim, Figure, PaperResult, Scale, median, us};

const RATE_PER_S: f64 = 20_000.0;
/// The runs whose buckets the plot sets beside the published ones.
const PLOTTED_RUNS: [usize; 3] = [1, 2, 5];

/// One run's figures over the repeats.
struct RunFigures {
    run: usize,
    p90_us: Vec<f64>,
    p99_us: Vec<f64>,
    cumulative_pct: Vec<[f64; 10]>,
    throughput_per_s: Vec<f64>,
    histogram: LatencyHistogram,
}

pub fn run(
    scale: &Scale,
    paper: &PublishedPaper<'_>,
    dir: &ReportDir,
) -> anyhow::Result<PaperResult> {
    let seconds = scale.seconds(0.5, 2.0);
    let repeats = scale.repeats(MIN_REPEATS, 5);
    let settings =
        Settings { rate_per_s: RATE_PER_S, seconds, arrival: Arrival::Poisson, nats: None };
    let mut experiments = Vec::new();
    for _ in 0..repeats {
        experiments.push(experiment::run(&settings, |_| {})?);
    }
    let runs = per_run(&experiments);
    let mut files = Vec::new();
    for run in &runs {
        let name = format!("delivery-run{}.hgrm", run.run);
        dir.write_hgrm(&name, &run.histogram)?;
        files.push(name);
    }
    let scope = format!(
        "the seven published layouts in-process (the tier's own subscribers at the gateway; the NATS \
         leg runs with `leantier exchange delivery-experiment`), Poisson arrivals at {RATE_PER_S} \
         msg/s, {seconds} s per run, {repeats} repeats, runs interleaved within each repeat"
    );
    let claims = claims(paper, &runs);
    let figures = vec![runs_figure(paper, &runs), buckets_figure(paper, &runs)];
    Ok(PaperResult { scope, figures, claims, files })
}

fn per_run(experiments: &[Experiment]) -> Vec<RunFigures> {
    LAYOUTS
        .iter()
        .map(|layout| {
            let points: Vec<_> = experiments
                .iter()
                .filter_map(|e| e.points.iter().find(|p| p.layout.run == layout.run))
                .collect();
            let mut histogram = LatencyHistogram::new();
            points.iter().for_each(|p| histogram.merge(&p.histogram));
            RunFigures {
                run: layout.run,
                p90_us: points.iter().map(|p| us(p.latency.p90_ns)).collect(),
                p99_us: points.iter().map(|p| us(p.latency.p99_ns)).collect(),
                cumulative_pct: points.iter().map(|p| p.cumulative_percent).collect(),
                throughput_per_s: points.iter().map(|p| p.throughput_per_s).collect(),
                histogram,
            }
        })
        .collect()
}

fn min_max(values: &[f64]) -> (Cell, Cell) {
    let min = values.iter().copied().reduce(f64::min);
    let max = values.iter().copied().reduce(f64::max);
    (min.into(), max.into())
}

fn median_bucket(run: &RunFigures, index: usize) -> Option<f64> {
    median(&run.cumulative_pct.iter().map(|c| c[index]).collect::<Vec<_>>())
}

fn runs_figure(paper: &PublishedPaper<'_>, runs: &[RunFigures]) -> Figure {
    let bucket_columns = BUCKET_UPPERS_US.map(|u| format!("within_{u}us_pct"));
    let columns = ["run", "connector", "senders", "dedicated_cores"]
        .into_iter()
        .map(String::from)
        .chain(bucket_columns)
        .chain(
            [
                "p90_us_median",
                "p90_us_min",
                "p90_us_max",
                "p99_us_median",
                "p99_us_min",
                "p99_us_max",
                "published_p90_us",
                "published_p99_us",
                "throughput_msgs_per_s_median",
            ]
            .map(String::from),
        );
    let mut table = DataTable::new(
        "delivery-runs-latency",
        "Runs 1–7 at the gateway: cumulative % within each bucket (median over repeats), p90 and p99 (µs)",
        columns,
    );
    for (layout, run) in LAYOUTS.iter().zip(runs) {
        let published =
            |percentile: &str| Cell::from(published_percentile(paper, run.run, percentile));
        let (p90_min, p90_max) = min_max(&run.p90_us);
        let (p99_min, p99_max) = min_max(&run.p99_us);
        let mut cells = vec![
            run.run.into(),
            format!("{:?}", layout.connector).to_lowercase().into(),
            layout.senders.into(),
            if layout.placement { "yes" } else { "no" }.into(),
        ];
        cells.extend((0..BUCKET_UPPERS_US.len()).map(|i| Cell::from(median_bucket(run, i))));
        cells.extend([
            median(&run.p90_us).into(),
            p90_min,
            p90_max,
            median(&run.p99_us).into(),
            p99_min,
            p99_max,
        ]);
        cells.extend([published("90"), published("99"), median(&run.throughput_per_s).into()]);
        table.push(cells);
    }
    let labels: Vec<String> = runs.iter().map(|r| format!("run {}", r.run)).collect();
    let series: Vec<(&str, &LatencyHistogram)> =
        labels.iter().map(String::as_str).zip(runs.iter().map(|r| &r.histogram)).collect();
    let mut plot =
        latency_percentile_plot("Delivery latency by percentile (all repeats merged)", &series);
    if let Some(p99) = published_percentile(paper, 5, "99") {
        plot = plot.limit("published p99, run 5", p99);
    }
    Figure {
        plot_svg: Some(plot.to_svg()),
        table,
        note: "Latency from each message's intended send time to its receipt at the gateway."
            .into(),
    }
}

/// The prose's p90/p99 for a run (rows keyed by run and percentile).
fn published_percentile(paper: &PublishedPaper<'_>, run: usize, percentile: &str) -> Option<f64> {
    paper.row_number(
        "percentiles_text",
        &[("run", &run.to_string()), ("percentile", percentile)],
        "latency_us",
    )
}

fn buckets_figure(paper: &PublishedPaper<'_>, runs: &[RunFigures]) -> Figure {
    let mut table = DataTable::new(
        "delivery-buckets-published-vs-measured",
        "Cumulative % within each bucket, runs 1, 2 and 5: published vs measured (median over repeats)",
        ["bucket_upper_us", "run", "published_pct", "measured_pct"],
    );
    let mut plot = LinePlot::new(
        "Cumulative % of packets within each bucket",
        "bucket upper bound (µs)",
        "packets within (%)",
    );
    for run in runs.iter().filter(|r| PLOTTED_RUNS.contains(&r.run)) {
        let column = format!("run{}", run.run);
        let mut published_points = Vec::new();
        let mut measured_points = Vec::new();
        for (index, upper) in BUCKET_UPPERS_US.iter().enumerate() {
            let bucket = format!("{}-{upper}", upper - 9);
            let published = paper.number("table1_latency_buckets", "bucket", &bucket, &column);
            let measured = median_bucket(run, index);
            table.push(vec![(*upper).into(), run.run.into(), published.into(), measured.into()]);
            published_points.extend(published.map(|p| (*upper as f64, p)));
            measured_points.extend(measured.map(|m| (*upper as f64, m)));
        }
        plot = plot
            .series(&format!("run {} measured", run.run), measured_points)
            .series(&format!("run {} published", run.run), published_points);
    }
    Figure {
        plot_svg: Some(plot.to_svg()),
        table,
        note: "Published: Table 1 of the paper (2-socket Xeon); measured: this machine.".into(),
    }
}

/// Every run measured here in the same repeats, interleaved within each.
const SAME_RUN: &str = "both runs measured here in the same repeats (runs interleaved within each), \
     same rate and arrivals, latency at the gateway";

fn claims(paper: &PublishedPaper<'_>, runs: &[RunFigures]) -> Vec<Claim> {
    let run = |n: usize| runs.iter().find(|r| r.run == n);
    let (Some(blocking), Some(lock_free), Some(three)) = (run(1), run(2), run(5)) else {
        return Vec::new();
    };
    let spread = |values: &[f64]| Spread::of(values).map_or("none".into(), |s| s.text(" µs"));
    let lock_free_claim = Claim::new(
        "Lock-free queues beat the blocking shared-memory grid: p90 90 → 60 µs (run 2 vs run 1)",
        SAME_RUN,
        "every run 2 p90 below every run 1 p90 (the repeats' ranges separate)",
        format!("run 2 {} vs run 1 {}", spread(&lock_free.p90_us), spread(&blocking.p90_us)),
        verdict::below(&lock_free.p90_us, &blocking.p90_us, 1.0),
    );
    let dedicated_claim = Claim::new(
        "Lock-free + dedicated cores with 3 senders (run 5) cuts p99 from 140 to 60 µs",
        SAME_RUN,
        "every run 5 p99 below every run 1 p99 (the repeats' ranges separate)",
        format!("run 5 {} vs run 1 {}", spread(&three.p99_us), spread(&blocking.p99_us)),
        verdict::below(&three.p99_us, &blocking.p99_us, 1.0),
    );
    let middle = [4, 5, 6]
        .iter()
        .filter_map(|&n| Some((n, run(n)?, median(&run(n)?.p99_us)?)))
        .min_by(|a, b| a.2.total_cmp(&b.2));
    let middle_claim = match (middle, run(7)) {
        (Some((n, best, _)), Some(one)) => Claim::new(
            "A middle number of senders on dedicated cores is best; one sender cannot keep up (runs 3–7)",
            SAME_RUN,
            "the p99s of the best of runs 4–6 (4, 3, 2 senders; lowest median) all below those of run 7 (1 sender)",
            format!("run {n} {} vs run 7 {}", spread(&best.p99_us), spread(&one.p99_us)),
            verdict::below(&best.p99_us, &one.p99_us, 1.0),
        ),
        _ => Claim::new(
            "A middle number of senders on dedicated cores is best; one sender cannot keep up (runs 3–7)",
            SAME_RUN,
            "the best of runs 4–6 below run 7",
            "incomplete".into(),
            verdict::Verdict::NotMeasurable("a run is missing".into()),
        ),
    };
    let published_120 = paper.number("table1_latency_buckets", "bucket", "111-120", "run5");
    let measured_120: Vec<f64> =
        three.cumulative_pct.iter().map(|c| c[BUCKET_UPPERS_US.len() - 1]).collect();
    let bucket_claim = Claim::context(
        "Run 5 delivers 99.975% of packets within 120 µs (Table 1)",
        "the paper's two-socket Xeon",
        format!(
            "published {}%, measured {}",
            published_120.map_or("?".into(), |p| format!("{p:.3}")),
            Spread::of(&measured_120).map_or("none".into(), |s| s.text("%"))
        ),
    );
    vec![lock_free_claim, dedicated_claim, middle_claim, bucket_claim]
}
