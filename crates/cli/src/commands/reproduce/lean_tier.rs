//! Paper 000, the lean business tier: CPU affinity + spinning vs none at 20K/40K/60K msg/s,
//! 1..6 publishers (R-Senders) with speedup, Karp–Flatt and Amdahl, and I/O on vs off the
//! critical path (`labs::exchange_experiments`).

use exchange::tier::TierConfig;
use lab::data::{Cell, DataTable};
use lab::report::{BarChart, LinePlot, ReportDir, latency_percentile_plot};
use lab::stats::{amdahl, median as median_of};
use labs::exchange_experiments::{
    self as experiments, JournalExperiment, PlacementPoint, SendersPoint,
};

use super::published::PublishedPaper;
use super::{Claim, Figure, PaperResult, Scale, Verdict, count_rule, median, us};

/// Work per published message in the senders experiment (the CLI's default).
const PUBLISH_WORK_NS: u64 = 2_000;
/// The senders experiment's arrival rate: the published bursty runs' order of magnitude.
const SENDERS_RATE_PER_S: f64 = 20_000.0;
/// The published publishers experiment dedicates 3 to 6 cores to the publishers.
const PUBLISHER_CORES_MIN: usize = 4;
/// Published: "I/O off the critical path: about 40% lower latency".
const IO_OFF_LATENCY_RATIO_MAX: f64 = 0.6;

pub fn run(
    scale: &Scale,
    paper: &PublishedPaper<'_>,
    dir: &ReportDir,
) -> anyhow::Result<PaperResult> {
    let seconds = scale.seconds(0.5, 3.0);
    let repeats = scale.repeats(1, 3);
    let mut placement = Vec::new();
    for _ in 0..repeats {
        placement.push(experiments::placement(seconds)?);
    }
    let senders = experiments::senders(SENDERS_RATE_PER_S, seconds, PUBLISH_WORK_NS)?;
    let fsync_samples = if scale.quick { 100 } else { 1_000 };
    let journal = experiments::journal_modes(&TierConfig::default(), seconds, fsync_samples, None)?;
    let files = write_hgrms(dir, &placement[0])?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut notes: Vec<String> = placement.iter().flatten().flat_map(|p| p.notes.clone()).collect();
    notes.sort();
    notes.dedup();
    let scope = format!(
        "in-process tier, Poisson arrivals, {seconds} s per run; placement experiment repeated {repeats}× at \
         20K/40K/60K msg/s; R-Senders 1..6 at {SENDERS_RATE_PER_S} msg/s with {PUBLISH_WORK_NS} ns of \
         work per message; journal sync/group/off at 20K/40K/60K. Placement notes: {}",
        if notes.is_empty() { "none".to_string() } else { notes.join("; ") }
    );
    let mut claims = affinity_claims(paper, &placement);
    claims.push(publishers_claim(&senders, cores));
    claims.extend(io_claims(&journal));
    let figures = vec![
        affinity_figure(paper, &placement),
        publishers_figure(paper, &senders),
        io_figure(&journal),
    ];
    Ok(PaperResult { scope, figures, claims, files })
}

fn hgrm_name(point: &PlacementPoint) -> String {
    format!("lean-tier-{}-{}k.hgrm", point.variant.replace('+', "-"), point.rate_per_s / 1_000.0)
}

fn write_hgrms(dir: &ReportDir, points: &[PlacementPoint]) -> anyhow::Result<Vec<String>> {
    let mut files = Vec::new();
    for point in points {
        let name = hgrm_name(point);
        dir.write_hgrm(&name, &point.end_to_end_histogram)?;
        files.push(name);
    }
    Ok(files)
}

/// The published row for a variant at a rate in Fig 5(b).
fn published_row(variant: &str, rate_per_s: f64) -> String {
    if variant.starts_with("placement") {
        format!("@{}K", rate_per_s / 1_000.0)
    } else {
        "Without CPU Affinity".to_string()
    }
}

fn affinity_figure(paper: &PublishedPaper<'_>, placement: &[Vec<PlacementPoint>]) -> Figure {
    let mut table = DataTable::new(
        "lean-tier-affinity-latency",
        "Affinity + spinning vs none + parking: end-to-end latency (µs) per rate, beside Fig 5(b)",
        [
            "repeat",
            "rate_msgs_per_s",
            "config",
            "p93_us",
            "p95_us",
            "p99_us",
            "p100_us",
            "published_p93_us",
            "published_p99_us",
            "published_p100_us",
        ],
    );
    for (repeat, points) in placement.iter().enumerate() {
        for point in points {
            let l = &point.end_to_end;
            let row = published_row(point.variant, point.rate_per_s);
            let published =
                |column| Cell::from(paper.number("fig5b_load_variation", "load", &row, column));
            table.push(vec![
                (repeat + 1).into(),
                point.rate_per_s.into(),
                point.variant.into(),
                us(l.p93_ns).into(),
                us(l.p95_ns).into(),
                us(l.p99_ns).into(),
                us(l.max_ns).into(),
                published("p93"),
                published("p99"),
                published("p100"),
            ]);
        }
    }
    let labels: Vec<String> = placement[0]
        .iter()
        .map(|p| format!("{} @{}K", p.variant, p.rate_per_s / 1_000.0))
        .collect();
    let series: Vec<(&str, &lab::stats::LatencyHistogram)> = labels
        .iter()
        .map(String::as_str)
        .zip(placement[0].iter().map(|p| &p.end_to_end_histogram))
        .collect();
    let mut plot = latency_percentile_plot("End-to-end latency by percentile (repeat 1)", &series);
    if let Some(p99) = paper.number("fig5b_load_variation", "load", "@60K", "p99") {
        plot = plot.limit("published p99 with affinity @60K", p99);
    }
    Figure {
        plot_svg: Some(plot.to_svg()),
        table,
        note: "Latency from each message's intended send time to its response, journal off (the \
               published response time excludes the disk). p100 is the maximum."
            .into(),
    }
}

fn affinity_claims(paper: &PublishedPaper<'_>, placement: &[Vec<PlacementPoint>]) -> Vec<Claim> {
    let p99_of = |points: &[PlacementPoint], variant: &str, rate: f64| {
        points
            .iter()
            .find(|p| p.variant.starts_with(variant) && p.rate_per_s == rate)
            .map(|p| us(p.end_to_end.p99_ns))
    };
    let pairs: Vec<(f64, f64)> = placement
        .iter()
        .flat_map(|points| {
            experiments::DEMO_RATES_PER_S.iter().filter_map(move |&rate| {
                Some((p99_of(points, "placement", rate)?, p99_of(points, "none", rate)?))
            })
        })
        .collect();
    let wins = pairs.iter().filter(|(pinned, free)| pinned < free).count();
    let needed = (2 * pairs.len()).div_ceil(3);
    let (measured, holds) = count_rule(wins, pairs.len(), needed);
    let affinity = Claim::decide(
        "CPU affinity + spinning cut the tail: p99 8650 → 180 µs (Fig 5)",
        &format!(
            "placement+spin p99 < none+park p99 in at least {needed} of the {} (rate, repeat) pairs",
            pairs.len()
        ),
        format!("lower in {measured}"),
        holds,
    );
    let mut within = Vec::new();
    for rate in experiments::DEMO_RATES_PER_S {
        let measured: Vec<f64> =
            placement.iter().filter_map(|points| p99_of(points, "placement", rate)).collect();
        let published =
            paper.number("fig5b_load_variation", "load", &published_row("placement", rate), "p99");
        if let (Some(measured), Some(published)) = (median(&measured), published) {
            within.push((rate, measured, published));
        }
    }
    let text: Vec<String> =
        within.iter().map(|(r, m, p)| format!("@{}K {m:.0} vs {p:.0} µs", r / 1_000.0)).collect();
    let holds = if within.is_empty() {
        Err("no published or measured p99".to_string())
    } else {
        Ok(within.iter().all(|(_, m, p)| m <= p))
    };
    let load = Claim::decide(
        "With affinity the p99 stays at 180/314/333 µs at 20K/40K/60K msg/s (Fig 5(b))",
        "median placement+spin p99 over the repeats ≤ the published p99 at every rate",
        text.join(", "),
        holds,
    );
    vec![affinity, load]
}

/// One publisher count's speedup figures.
struct PublisherRow {
    publishers: usize,
    /// p99 with one publisher / p99 with these.
    speedup: f64,
    /// The serial fraction this speedup implies (none for one publisher).
    karp_flatt: Option<f64>,
    /// Amdahl's speedup with the median serial fraction.
    amdahl_fit: f64,
}

/// Speedup of the p99 over one publisher, the Karp–Flatt serial fraction it implies, and
/// Amdahl's speedup with the median serial fraction.
fn publishers_rows(senders: &[SendersPoint]) -> Vec<PublisherRow> {
    let base = senders.first().map_or(0.0, |p| us(p.latency.p99_ns));
    let speedups: Vec<(usize, f64)> = senders
        .iter()
        .map(|p| (p.senders, base / us(p.latency.p99_ns).max(f64::MIN_POSITIVE)))
        .collect();
    let karp_flatt =
        |n: usize, s: f64| (n > 1).then(|| lab::stats::karp_flatt(s, n as f64).ok()).flatten();
    let serial: Vec<f64> = speedups.iter().filter_map(|&(n, s)| karp_flatt(n, s)).collect();
    let serial = if serial.is_empty() { 1.0 } else { median_of(serial).clamp(0.0, 1.0) };
    speedups
        .iter()
        .map(|&(n, s)| PublisherRow {
            publishers: n,
            speedup: s,
            karp_flatt: karp_flatt(n, s),
            amdahl_fit: amdahl(serial, n as f64).unwrap_or(f64::NAN),
        })
        .collect()
}

/// The published p99 speedup for `n` publishers (Table 2; the 3-core run for 6).
fn published_speedup(paper: &PublishedPaper<'_>, n: usize) -> Option<f64> {
    let config = match n {
        1 => return Some(1.0),
        6 => "6 Pubs - 3C".to_string(),
        n => format!("{n} Pubs"),
    };
    paper.number("table2_parallelisation_99pct", "config", &config, "speedup")
}

fn publishers_figure(paper: &PublishedPaper<'_>, senders: &[SendersPoint]) -> Figure {
    let mut table = DataTable::new(
        "lean-tier-publishers-speedup",
        "1..6 publishers (R-Senders): p99 speedup over one, Karp–Flatt serial fraction, Amdahl fit, beside Table 2",
        [
            "publishers",
            "mean_us",
            "p90_us",
            "p99_us",
            "speedup_p99",
            "karp_flatt_serial_fraction",
            "amdahl_speedup_fit",
            "published_speedup_p99",
        ],
    );
    let rows = publishers_rows(senders);
    for (point, row) in senders.iter().zip(&rows) {
        table.push(vec![
            row.publishers.into(),
            (point.latency.mean_ns / 1_000.0).into(),
            us(point.latency.p90_ns).into(),
            us(point.latency.p99_ns).into(),
            row.speedup.into(),
            row.karp_flatt.into(),
            row.amdahl_fit.into(),
            published_speedup(paper, row.publishers).into(),
        ]);
    }
    let x = |row: &PublisherRow| row.publishers as f64;
    let plot = LinePlot::new(
        "Speedup of the p99 over one publisher",
        "publishers (R-Senders)",
        "speedup (×)",
    )
    .series("measured", rows.iter().map(|r| (x(r), r.speedup)).collect())
    .series("Amdahl fit (median Karp–Flatt)", rows.iter().map(|r| (x(r), r.amdahl_fit)).collect())
    .series(
        "published (Table 2, 99%)",
        rows.iter().filter_map(|r| Some((x(r), published_speedup(paper, r.publishers)?))).collect(),
    )
    .limit("no speedup", 1.0);
    Figure {
        plot_svg: Some(plot.to_svg()),
        table,
        note: format!(
            "Speedup = p99 with one publisher / p99 with n (the published definition); Karp–Flatt \
             e = (1/S − 1/n)/(1 − 1/n); Amdahl S(n) = 1/(e + (1 − e)/n) with the median e. \
             {PUBLISH_WORK_NS} ns of work per message."
        ),
    }
}

fn publishers_claim(senders: &[SendersPoint], cores: usize) -> Claim {
    let rows = publishers_rows(senders);
    let best = rows
        .iter()
        .filter(|r| (2..=5).contains(&r.publishers))
        .map(|r| (r.publishers, r.speedup))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let six = rows.iter().find(|r| r.publishers == 6).map(|r| r.speedup);
    let measured = match (best, six) {
        (Some((n, s)), Some(six)) => format!("best {s:.2}× at {n}; {six:.2}× at 6"),
        _ => "incomplete".into(),
    };
    let holds = match (best, six) {
        _ if cores < PUBLISHER_CORES_MIN => Err(format!(
            "{cores} cores: the published run dedicates 3–6 cores to the publishers alone"
        )),
        (Some((_, s)), Some(six)) => Ok(s > 1.05 && six < s),
        _ => Err("a sender count did not run".into()),
    };
    Claim::decide(
        "Speedup rises up to about 4 publishers, then falls (Tables 1–4)",
        "best p99 speedup at 2–5 publishers > 1.05 and the speedup at 6 below it",
        measured,
        holds,
    )
}

/// The critical path's p50 (µs) under journal `mode` at `rate`.
fn critical_p50(journal: &JournalExperiment, rate: f64, mode: &str) -> Option<f64> {
    let point = journal.points.iter().find(|p| p.rate_per_s == rate && p.journal.name() == mode)?;
    Some(us(point.critical_path.p50_ns))
}

fn io_figure(journal: &JournalExperiment) -> Figure {
    let mut table = DataTable::new(
        "lean-tier-io-on-off-critical-path",
        "Journal I/O on the path (sync) vs off it (group, off): latency (µs) per rate",
        [
            "rate_msgs_per_s",
            "journal",
            "requests",
            "critical_path_p50_us",
            "critical_path_p99_us",
            "reply_p50_us",
            "reply_p99_us",
            "fsyncs",
            "raw_fdatasync_p99_us",
        ],
    );
    for point in &journal.points {
        table.push(vec![
            point.rate_per_s.into(),
            point.journal.name().into(),
            point.sent.into(),
            us(point.critical_path.p50_ns).into(),
            us(point.critical_path.p99_ns).into(),
            us(point.reply.p50_ns).into(),
            us(point.reply.p99_ns).into(),
            point.fsyncs.into(),
            us(journal.raw_fdatasync_4k.p99_ns).into(),
        ]);
    }
    let rates = experiments::DEMO_RATES_PER_S.map(|r| format!("{}K msg/s", r / 1_000.0));
    let p50 = |mode: &str| -> Vec<f64> {
        let p50_at = |&rate: &f64| critical_p50(journal, rate, mode).unwrap_or(f64::NAN);
        experiments::DEMO_RATES_PER_S.iter().map(p50_at).collect()
    };
    let chart = BarChart::new(
        "Critical-path p50 with the journal's fsync on vs off the path",
        "critical-path p50 (µs)",
        rates,
    )
    .group("sync: fsync on the critical path", p50("sync"))
    .group("group: fsync behind it", p50("group"))
    .group("journal off", p50("off"));
    Figure {
        plot_svg: Some(chart.to_svg()),
        table,
        note: "Critical path: arrival → response ready; reply: → response released (after its input's \
               fsync under sync and group). sync runs stop after a few hundred requests."
            .into(),
    }
}

fn io_claims(journal: &JournalExperiment) -> Vec<Claim> {
    let ratios: Vec<(f64, f64)> = experiments::DEMO_RATES_PER_S
        .iter()
        .filter_map(|&rate| {
            // Under sync the critical path itself waits for each input's fsync; under group
            // the writer syncs behind it. Same measure, the I/O on vs off the path.
            let on_path = critical_p50(journal, rate, "sync")?;
            let off_path = critical_p50(journal, rate, "group")?;
            Some((rate, off_path / on_path.max(f64::MIN_POSITIVE)))
        })
        .collect();
    let text: Vec<String> =
        ratios.iter().map(|(r, x)| format!("@{}K {x:.2e}×", r / 1_000.0)).collect();
    let holds = if ratios.is_empty() {
        Err("no sync or group run".to_string())
    } else {
        Ok(ratios.iter().all(|r| r.1 <= IO_OFF_LATENCY_RATIO_MAX))
    };
    let whole = Claim::decide(
        "Taking I/O off the critical path cuts latency by about 40% (Table 6(a): core 30 → 18 µs)",
        &format!(
            "critical-path p50 with I/O off the path (group) ≤ {IO_OFF_LATENCY_RATIO_MAX} × reply p50 with I/O on it (sync), at every rate"
        ),
        text.join(", "),
        holds,
    );
    let per_stage = Claim {
        claim: "…and throughput rises about 40% per stage (pre-process, core, R-process, R-sender, publisher; Table 6)".into(),
        rule: "per-stage latency and throughput with I/O on vs off".into(),
        measured: "critical path as a whole only".into(),
        verdict: Verdict::NotMeasurable(
            "the tier journals the sequenced input once, behind the core; there is no per-stage logging to switch on or off".into(),
        ),
    };
    vec![whole, per_stage]
}
