//! Paper 002, the messaging middleware: throughput vs clients, scale-up vs scale-out,
//! response time vs message size, a 2^2·r design with the allocation of variation, and the
//! sanity counts (`labs::mq_experiment`, nodes in this process over SQLite or PostgreSQL).

use lab::data::DataTable;
use lab::report::{BarChart, LinePlot, ReportDir};
use lab::stats::{FactorialAnalysis, factorial_2kr};
use labs::mq_experiment::{self as experiment, Experiment, ExperimentConfig, Point};
use labs::mq_load::LoadConfig;
use mq::server::NodeConfig;

use super::published::PublishedPaper;
use super::{Claim, Figure, PaperResult, Scale};

/// The published runs send 200-character messages.
const MESSAGE_BYTES: usize = 200;
/// Scale-up and scale-out agree when their throughputs are within this fraction.
const SCALE_AGREEMENT: f64 = 0.2;
/// Database connections "explain almost none" of the variation below this share (%).
const DB_SHARE_MAX_PCT: f64 = 10.0;

struct Measured {
    clients: Vec<Point>,
    scale: Vec<Point>,
    size: Vec<Point>,
    factorial: Vec<Point>,
    analysis: FactorialAnalysis,
}

pub fn run(
    scale: &Scale,
    paper: &PublishedPaper<'_>,
    _dir: &ReportDir,
) -> anyhow::Result<PaperResult> {
    let scratch = tempfile::tempdir()?;
    let store =
        scale.mq_store.clone().unwrap_or_else(|| format!("sqlite:{}", scratch.path().display()));
    let load = LoadConfig {
        clients: 8,
        connections: 8,
        message_bytes: MESSAGE_BYTES,
        // The measured window is what is left after warm-up and cool-down (≥ 1 s).
        duration_s: scale.seconds(2.0, 4.0),
        warmup_s: scale.seconds(0.3, 1.0),
        cooldown_s: scale.seconds(0.2, 0.5),
        ..LoadConfig::default()
    };
    let measured = measure(scale, &store, &load)?;
    let store_name = if store.starts_with("sqlite:") { "embedded SQLite" } else { "PostgreSQL" };
    let scope = format!(
        "nodes and closed-loop clients in this process over {store_name} (published: PostgreSQL on \
         separate t2.medium machines), {MESSAGE_BYTES}-byte messages, {} s runs (warm-up and cool-down \
         included); the 2^2·r design varies database workers × group commit (published: handlers × \
         connections, clients × nodes); no 30-minute stability run",
        load.duration_s
    );
    Ok(PaperResult {
        scope,
        figures: vec![
            clients_figure(&measured),
            scale_figure(paper, &measured),
            size_figure(&measured),
            factorial_figure(paper, &measured),
            sanity_figure(&measured),
        ],
        claims: claims(&measured),
        files: Vec::new(),
    })
}

/// Every experiment, one after another, on fresh nodes over `store`.
fn measure(scale: &Scale, store: &str, load: &LoadConfig) -> anyhow::Result<Measured> {
    let config = |levels: Vec<usize>| ExperimentConfig {
        store: store.to_string(),
        node: NodeConfig::default(),
        load: load.clone(),
        levels,
        replications: scale.repeats(2, 3),
    };
    let levels =
        |quick: &[usize], full: &[usize]| if scale.quick { quick.to_vec() } else { full.to_vec() };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (clients, scale_points, size, factorial) = runtime.block_on(async {
        let run = |kind, levels| {
            let config = config(levels);
            async move { experiment::run(kind, &config).await.map(|(points, _, _)| points) }
        };
        let clients = run(Experiment::Clients, levels(&[1, 4, 16], &[1, 4, 16, 32, 64])).await?;
        let scale_points = run(Experiment::Scale, levels(&[1, 2], &[1, 2, 4])).await?;
        let size =
            run(Experiment::Size, levels(&[200, 600, 2000], &[200, 600, 1000, 2000])).await?;
        let factorial = run(Experiment::Factorial, vec![1]).await?;
        anyhow::Ok((clients, scale_points, size, factorial))
    })?;
    let analysis = factorial_analysis(&factorial)?;
    Ok(Measured { clients, scale: scale_points, size, factorial, analysis })
}

/// The factorial's responses (throughput per replication, runs in sign-table order).
fn factorial_analysis(points: &[Point]) -> anyhow::Result<FactorialAnalysis> {
    let responses: Vec<Vec<f64>> = (0..4)
        .map(|run| {
            points.iter().filter(|p| p.level == run).map(|p| p.result.throughput_per_s).collect()
        })
        .collect();
    Ok(factorial_2kr(&["db_workers", "group_commit"], &responses, labs::mq_load::CONFIDENCE)?)
}

fn clients_figure(measured: &Measured) -> Figure {
    let mut table = DataTable::new(
        "mq-throughput-vs-clients",
        "Throughput and response time as closed-loop clients increase",
        [
            "clients",
            "throughput_req_per_s",
            "throughput_ci_low_req_per_s",
            "throughput_ci_high_req_per_s",
            "response_mean_us",
            "response_p99_us",
            "bottleneck",
        ],
    );
    for p in &measured.clients {
        let r = &p.result;
        table.push(vec![
            p.level.into(),
            r.throughput_per_s.into(),
            r.throughput_ci.map(|c| c.0).into(),
            r.throughput_ci.map(|c| c.1).into(),
            (r.response_mean_ns / 1_000.0).into(),
            (r.response.p99_ns as f64 / 1_000.0).into(),
            r.bottleneck.split(':').next().unwrap_or("").into(),
        ]);
    }
    let points =
        measured.clients.iter().map(|p| (p.level as f64, p.result.throughput_per_s)).collect();
    let plot = LinePlot::new("Throughput vs clients", "closed-loop clients", "throughput (req/s)")
        .series("measured", points);
    Figure {
        plot_svg: Some(plot.to_svg()),
        table,
        note: "Clients without think time, half sends, half pops.".into(),
    }
}

fn scale_figure(paper: &PublishedPaper<'_>, measured: &Measured) -> Figure {
    let mut table = DataTable::new(
        "mq-scale-up-vs-scale-out",
        "Scale-up (×handlers and database workers on one node) vs scale-out (× nodes)",
        [
            "mode",
            "factor",
            "throughput_req_per_s",
            "response_mean_us",
            "published_throughput_req_per_s",
        ],
    );
    let published = |up: bool, factor: usize| {
        let (key, column) = if up {
            ("table2_scale_up", "client_handlers")
        } else {
            ("table3_scale_out", "middlewares")
        };
        let level = if up { (5 * factor).to_string() } else { factor.to_string() };
        paper.number(key, column, &level, "throughput_req_s")
    };
    let mut series: [Vec<(f64, f64)>; 4] = Default::default();
    for p in &measured.scale {
        let up = p.label.starts_with("scale-up");
        let published = published(up, p.level);
        table.push(vec![
            if up { "scale-up" } else { "scale-out" }.into(),
            p.level.into(),
            p.result.throughput_per_s.into(),
            (p.result.response_mean_ns / 1_000.0).into(),
            published.into(),
        ]);
        let base = if up { 0 } else { 1 };
        series[base].push((p.level as f64, p.result.throughput_per_s));
        series[base + 2].extend(published.map(|y| (p.level as f64, y)));
    }
    let [up, out, published_up, published_out] = series;
    let plot = LinePlot::new(
        "Scale-up vs scale-out",
        "factor (× resources or nodes)",
        "throughput (req/s)",
    )
    .series("scale-up measured", up)
    .series("scale-out measured", out)
    .series("scale-up published (Table 2)", published_up)
    .series("scale-out published (Table 3)", published_out);
    Figure {
        plot_svg: Some(plot.to_svg()),
        table,
        note: "Same client population at every factor here; the published runs add 15 clients per factor.".into(),
    }
}

fn size_figure(measured: &Measured) -> Figure {
    let mut table = DataTable::new(
        "mq-response-vs-message-size",
        "Response time vs message size, split into middleware and database time",
        [
            "message_bytes",
            "throughput_req_per_s",
            "response_mean_us",
            "response_p99_us",
            "middleware_mean_us",
            "db_mean_us",
            "queue_wait_mean_us",
        ],
    );
    for p in &measured.size {
        let r = &p.result;
        table.push(vec![
            p.level.into(),
            r.throughput_per_s.into(),
            (r.response_mean_ns / 1_000.0).into(),
            (r.response.p99_ns as f64 / 1_000.0).into(),
            (r.middleware.mean_ns / 1_000.0).into(),
            (r.db.mean_ns / 1_000.0).into(),
            (r.queue_wait.mean_ns / 1_000.0).into(),
        ]);
    }
    let series = |f: &dyn Fn(&Point) -> f64| {
        measured.size.iter().map(|p| (p.level as f64, f(p))).collect::<Vec<_>>()
    };
    let plot =
        LinePlot::new("Response time vs message size", "message size (bytes)", "mean time (µs)")
            .series("response (client)", series(&|p| p.result.response_mean_ns / 1_000.0))
            .series("middleware", series(&|p| p.result.middleware.mean_ns / 1_000.0))
            .series("database", series(&|p| p.result.db.mean_ns / 1_000.0));
    Figure { plot_svg: Some(plot.to_svg()), table, note: "Means over the measured window.".into() }
}

fn factorial_figure(paper: &PublishedPaper<'_>, measured: &Measured) -> Figure {
    let analysis = &measured.analysis;
    let mut table = DataTable::new(
        "mq-factorial-allocation-of-variation",
        &format!(
            "2^2·{} design on throughput: effects (req/s) and allocation of variation (%)",
            measured.factorial.len() / 4
        ),
        ["effect", "q_req_per_s", "variation_pct", "ci_low_req_per_s", "ci_high_req_per_s"],
    );
    table.push(vec!["mean (q0)".into(), analysis.mean.into()]);
    for effect in &analysis.effects {
        table.push(vec![
            effect.name.as_str().into(),
            effect.value.into(),
            effect.variation_percent.into(),
            effect.ci_low.into(),
            effect.ci_high.into(),
        ]);
    }
    table.push(vec!["error".into(), lab::data::Cell::Missing, analysis.error_percent.into()]);
    let names: Vec<String> =
        analysis.effects.iter().map(|e| e.name.clone()).chain(["error".into()]).collect();
    let shares: Vec<f64> = analysis
        .effects
        .iter()
        .map(|e| e.variation_percent)
        .chain([analysis.error_percent])
        .collect();
    let published_db = paper.number(
        "allocation_of_variation_handlers_x_connections",
        "quantity",
        "share_A_pct",
        "value",
    );
    let mut chart =
        BarChart::new("Allocation of variation of throughput", "share of variation (%)", names)
            .group("measured", shares);
    if let Some(share) = published_db {
        chart =
            chart.limit(&format!("published share of database connections ({share:.4}%)"), share);
    }
    Figure {
        plot_svg: Some(chart.to_svg()),
        table,
        note: "A = database workers (base vs 4×), B = group commit (off vs on).".into(),
    }
}

fn all_points(measured: &Measured) -> impl Iterator<Item = &Point> {
    measured.clients.iter().chain(&measured.scale).chain(&measured.size).chain(&measured.factorial)
}

fn sanity_figure(measured: &Measured) -> Figure {
    let mut table = DataTable::new(
        "mq-sanity-counts",
        "Sanity: what the clients counted vs what the middleware counted, per run",
        [
            "configuration",
            "client_sends_ok",
            "middleware_sends",
            "client_pops_ok",
            "middleware_pops",
            "protocol_errors",
            "failed_requests",
            "sanity_ok",
        ],
    );
    for p in all_points(measured) {
        let r = &p.result;
        table.push(vec![
            p.label.as_str().into(),
            r.counts.sends_ok.into(),
            r.middleware_sends.into(),
            r.counts.pops_ok.into(),
            r.middleware_pops.into(),
            r.counts.protocol_errors.into(),
            r.failed_requests.into(),
            if r.sanity_ok { "yes" } else { "no" }.into(),
        ]);
    }
    Figure {
        plot_svg: None,
        table,
        note: "A reply that does not match its request counts as a protocol error.".into(),
    }
}

fn claims(measured: &Measured) -> Vec<Claim> {
    let mut claims = scaling_claims(measured);
    claims.extend(design_claims(measured));
    claims
}

/// Throughput against clients, and scale-up against scale-out.
fn scaling_claims(measured: &Measured) -> Vec<Claim> {
    let throughput = |points: &[Point], pick: &dyn Fn(&Point) -> bool| {
        points.iter().find(|p| pick(p)).map(|p| p.result.throughput_per_s)
    };
    let first = measured.clients.first().map(|p| p.result.throughput_per_s);
    let last = measured.clients.last().map(|p| p.result.throughput_per_s);
    let clients = Claim::decide(
        "Throughput rises with the clients until the middleware saturates (Fig 10: beyond 40 clients per node)",
        "throughput at the most clients > throughput at one client",
        format!("{:.0} → {:.0} req/s", first.unwrap_or(f64::NAN), last.unwrap_or(f64::NAN)),
        first.zip(last).map(|(a, b)| b > a).ok_or_else(|| "no runs".to_string()),
    );
    let mut levels: Vec<usize> =
        measured.scale.iter().map(|p| p.level).filter(|&l| l > 1).collect();
    levels.dedup();
    let ratios: Vec<(usize, f64)> = levels
        .iter()
        .filter_map(|&level| {
            let up = throughput(&measured.scale, &|p| {
                p.level == level && p.label.starts_with("scale-up")
            })?;
            let out = throughput(&measured.scale, &|p| {
                p.level == level && p.label.starts_with("scale-out")
            })?;
            Some((level, out / up))
        })
        .collect();
    let scale = Claim::decide(
        "Scale-up and scale-out give the same throughput (Tables 2–3: 388.5 vs 388.3 req/s at ×2)",
        &format!(
            "scale-out / scale-up throughput within 1 ± {SCALE_AGREEMENT} at every factor > 1"
        ),
        ratios.iter().map(|(l, r)| format!("×{l}: {r:.2}")).collect::<Vec<_>>().join(", "),
        if ratios.is_empty() {
            Err("no factor > 1 ran".into())
        } else {
            Ok(ratios.iter().all(|r| (r.1 - 1.0).abs() <= SCALE_AGREEMENT))
        },
    );
    vec![clients, scale]
}

/// Message size, the factorial's allocation of variation, and the sanity counts.
fn design_claims(measured: &Measured) -> Vec<Claim> {
    let response = |p: Option<&Point>| p.map(|p| p.result.response_mean_ns / 1_000.0);
    let (small, large) = (response(measured.size.first()), response(measured.size.last()));
    let size = Claim::decide(
        "Response time grows with the message size (Fig 12)",
        "mean response time at the largest size ≥ at the smallest",
        format!("{:.0} → {:.0} µs", small.unwrap_or(f64::NAN), large.unwrap_or(f64::NAN)),
        small.zip(large).map(|(s, l)| l >= s).ok_or_else(|| "no runs".to_string()),
    );
    let db_share = measured
        .analysis
        .effects
        .iter()
        .find(|e| e.name == "db_workers")
        .map(|e| e.variation_percent);
    let factorial = Claim::decide(
        "Database connections explain almost none of the throughput's variation (0.0008%; handlers 99.99%)",
        &format!("database workers' share of the variation < {DB_SHARE_MAX_PCT}%"),
        format!("{:.2}%", db_share.unwrap_or(f64::NAN)),
        db_share.map(|s| s < DB_SHARE_MAX_PCT).ok_or_else(|| "no analysis".to_string()),
    );
    let runs = all_points(measured).count();
    let sane = all_points(measured)
        .filter(|p| p.result.sanity_ok && p.result.counts.protocol_errors == 0)
        .count();
    let sanity = Claim::decide(
        "Counts at the clients, middleware and database agree; every reply matches its request",
        "sanity checks pass and no protocol error in every run",
        format!("{sane} of {runs} runs"),
        Ok(runs > 0 && sane == runs),
    );
    vec![size, factorial, sanity]
}
