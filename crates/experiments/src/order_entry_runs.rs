//! `exchange load`'s runs against one or more `exchange serve` targets: each rate in turn, or
//! each target's highest rate with p99 within a limit and every order accepted, searched side
//! by side; a line per run, the latency table and the report folder (a Markdown table and
//! CSV). The orders themselves are [`crate::order_entry_load`]'s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use stats::open_loop::duration_ns;

use crate::order_entry_load::{LoadOptions, LoadResult};
use crate::report::{Markdown, ReportDir, format_ns_as_us, latency_table};

/// The max-rate search's bounds (`--find-max`).
#[derive(Debug, Clone, Copy)]
pub struct MaxRateLimits {
    /// The latency limit on p99.
    pub p99_limit: Duration,
    /// The search's highest rate, orders/s.
    pub max_rate_per_s: f64,
}

/// What `exchange load` runs.
#[derive(Debug, Clone)]
pub struct LoadRuns {
    /// The options every run shares (the target and the plan are set per run).
    pub base: LoadOptions,
    /// Each target's address and name (for the tables).
    pub targets: Vec<(SocketAddr, String)>,
    /// Arrival rates (Poisson), orders/s, one run each; with a search, its start.
    pub rates: Vec<f64>,
    /// Time per rate (per search step).
    pub duration: Duration,
    /// Search each target's highest rate instead of the fixed rates.
    pub search: Option<MaxRateLimits>,
    /// The protocol's name, for the table's title.
    pub protocol: String,
    /// Sessions per target, for the table's title.
    pub sessions: u32,
    /// Report folder.
    pub out: PathBuf,
}

/// A Poisson plan at `rate_per_s` for `duration` (seed 1, as every `exchange load` run).
pub fn poisson_plan(rate_per_s: f64, duration: Duration) -> stats::open_loop::OpenLoopPlan {
    stats::open_loop::OpenLoopPlan {
        process: stats::open_loop::ArrivalProcess::Poisson { rate_per_s },
        seed: 1,
        duration,
    }
}

/// `exchange load`: the runs, a line each, then the latency table and the report folder.
pub fn run(runs: &LoadRuns) -> anyhow::Result<()> {
    let (rows, notes) = match runs.search {
        Some(limits) => find_max(runs, limits)?,
        None => fixed_rates(runs)?,
    };
    let rows: Vec<(&str, &stats::LatencySummary)> =
        rows.iter().map(|(label, summary)| (label.as_str(), summary)).collect();
    let table = latency_table(&rows).with_title(format!(
        "{} over TCP, {} session(s): intended send time → first report, µs",
        runs.protocol, runs.sessions
    ));
    println!("\n{table}");
    for note in &notes {
        println!("{note}");
    }
    let report = ReportDir::create(&runs.out)?;
    report.write_csv("latency.csv", &table)?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "exchange load").table(&table);
    for note in &notes {
        markdown.paragraph(note);
    }
    let path = report.write_markdown("report.md", markdown.as_str())?;
    println!("report: {}", path.display());
    Ok(())
}

/// One run against one target, with a line on what happened; a run the server answered
/// nothing to, or rejected every order of, is a failure that says why.
fn load_step(
    base: &LoadOptions,
    connect: SocketAddr,
    name: &str,
    rate: f64,
    duration: Duration,
) -> anyhow::Result<LoadResult> {
    let options = LoadOptions { connect, plan: poisson_plan(rate, duration), ..base.clone() };
    let result = crate::order_entry_load::run(&options)?;
    let reasons: Vec<String> =
        result.rejects.iter().map(|(reason, count)| format!("{reason} {count}")).collect();
    let reasons =
        if reasons.is_empty() { String::new() } else { format!(" ({})", reasons.join(", ")) };
    println!(
        "{name} {rate:.0}/s: sent {} answered {} rejected {}{reasons} achieved {:.0}/s, p50 {} p99 {} µs, generator lag p99 {} µs",
        result.sent,
        result.answered,
        result.rejected,
        result.sent as f64 / result.elapsed.as_secs_f64(),
        format_ns_as_us(result.latency.value_at_percentile_ns(50.0)),
        format_ns_as_us(result.latency.value_at_percentile_ns(99.0)),
        format_ns_as_us(result.send_lag.value_at_percentile_ns(99.0))
    );
    match failed_run(&result) {
        Some(why) => anyhow::bail!("{name} at {rate:.0}/s: {why}"),
        None => Ok(result),
    }
}

/// Why a run measured nothing the server accepted: no order was answered, or every one was
/// rejected (named by its main reason). `None` when some order was accepted, or none sent.
fn failed_run(result: &LoadResult) -> Option<String> {
    if result.sent > 0 && result.answered == 0 {
        return Some(format!("none of the {} orders sent was answered", result.sent));
    }
    let (reason, count) = result.main_reject()?;
    (result.rejected == result.answered).then(|| {
        format!(
            "every order was rejected, {count} of {} {reason}: do --instruments (prices, \
             lots) and the session's client match the server's files?",
            result.rejected
        )
    })
}

type Rows = Vec<(String, stats::LatencySummary)>;

fn fixed_rates(runs: &LoadRuns) -> anyhow::Result<(Rows, Vec<String>)> {
    let mut rows = Vec::new();
    for &rate in &runs.rates {
        for (connect, name) in &runs.targets {
            let result = load_step(&runs.base, *connect, name, rate, runs.duration)?;
            rows.push((format!("{name} {rate:.0}/s"), result.latency.summary()));
        }
    }
    Ok((rows, Vec::new()))
}

/// Each target's highest rate with p99 within the limit and every order accepted, searched
/// side by side; with two targets, the ratio of the first's rate to the second's.
fn find_max(runs: &LoadRuns, limits: MaxRateLimits) -> anyhow::Result<(Rows, Vec<String>)> {
    let names: Vec<&str> = runs.targets.iter().map(|(_, name)| name.as_str()).collect();
    let plan = crate::load::RateSearchPlan {
        start_rate_per_s: runs.rates[0],
        min_rate_per_s: runs.rates[0].min(limits.max_rate_per_s) / 16.0,
        max_rate_per_s: limits.max_rate_per_s,
        percentile: 99.0,
        limit_ns: duration_ns(limits.p99_limit),
        precision: 0.1,
    };
    let step = |target: usize, rate: f64| -> anyhow::Result<stats::LatencyHistogram> {
        let (connect, name) = &runs.targets[target];
        let result = load_step(&runs.base, *connect, name, rate, runs.duration)?;
        if result.answered < result.sent || result.rejected > 0 {
            println!("  (fails: every order must be accepted)");
            return Ok(stats::LatencyHistogram::new());
        }
        Ok(result.latency)
    };
    let reports = crate::order_entry_load::search_side_by_side(plan, runs.targets.len(), step)?;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let limit_us = limits.p99_limit.as_micros();
    for (report, name) in reports.iter().zip(&names) {
        let best = report.last_passing_rate_per_s;
        let step = report.steps.iter().rev().find(|s| s.passed && Some(s.rate_per_s) == best);
        match step {
            Some(step) => rows.push((format!("{name} {:.0}/s", step.rate_per_s), step.summary)),
            None => notes.push(format!("{name}: no rate met p99 ≤ {limit_us} µs")),
        }
        notes.push(format!(
            "{name}: highest rate with p99 ≤ {limit_us} µs {}, lowest failing {}",
            best.map_or("none".into(), |r| format!("{r:.0}/s")),
            report
                .first_failing_rate_per_s
                .map_or("none (max reached)".into(), |r| format!("{r:.0}/s"))
        ));
    }
    if let [Some(first), Some(second)] = [0, 1].map(|i| reports.get(i)?.last_passing_rate_per_s) {
        notes.push(format!("ratio {} / {}: {:.1}×", names[0], names[1], first / second));
    }
    Ok((rows, notes))
}
