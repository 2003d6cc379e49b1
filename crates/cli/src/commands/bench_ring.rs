//! `leantier bench ring`: the flags, and the tables and report folder of a run of
//! [`experiments::ringbench::run`].

use std::path::PathBuf;

use experiments::plot::{BarChart, latency_percentile_plot};
use experiments::report::{Markdown, ReportDir, Table};
use experiments::ringbench::{
    CAPACITY_SLOTS, MESSAGE_BYTES, Ratio, RingReport, RingRun, Settings, ThroughputCell,
};
use stats::LatencyHistogram;

use crate::outcome::TargetMissed;

/// Ring throughput and latency against its peers, with the ratios.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Messages per throughput trial.
    #[arg(long, default_value_t = 2_000_000)]
    pub messages: u64,
    /// Trials per cell; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub trials: usize,
    /// Batch sizes to measure (comma separated, each 1..=256).
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub batches: Vec<usize>,
    /// Round trips per peer in the ping-pong latency test.
    #[arg(long, default_value_t = 200_000)]
    pub round_trips: u64,
    /// A short run (10× fewer messages and round trips, 3 trials) for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Pin the two benchmark threads to CPUs (`--placement false`: let the OS schedule them).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub placement: bool,
    /// The old spelling of `--placement false`, kept hidden for one release.
    #[arg(long, hide = true, conflicts_with = "placement")]
    pub no_pin: bool,
    /// Folder for the report (JSON, CSV, Markdown, SVG).
    #[arg(long, default_value = "leantier-report/bench-ring")]
    pub out: PathBuf,
    /// Exit with code 3 when a target is missed.
    #[arg(long)]
    pub check: bool,
}

impl Args {
    fn settings(&self) -> Settings {
        let settings = Settings {
            messages: self.messages,
            trials: self.trials,
            batches: self.batches.clone(),
            round_trips: self.round_trips,
            pin: self.placement && !self.no_pin,
        };
        if self.quick { settings.quick() } else { settings }
    }
}

/// Runs the benchmark, prints the tables and writes the report folder.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let RingRun { report, histograms } = experiments::ringbench::run(&args.settings())?;
    write_report(&args.out, &report, &histograms)?;
    let missed = report.missed_targets();
    if args.check && !missed.is_empty() {
        return Err(TargetMissed(missed).into());
    }
    Ok(())
}

/// The header of the ratio column: leantier's throughput divided by the row's, so above 1×
/// leantier is faster ("vs leantier" read as the row against leantier, backwards).
const RATIO_HEADER: &str = "leantier ÷ this queue";

fn throughput_table(throughput: &[ThroughputCell], ratios: &[Ratio]) -> Table {
    let mut table = Table::new(["message", "batch", "queue", "median Mmsg/s", RATIO_HEADER])
        .with_title("1 producer -> 1 consumer throughput (median of trials)");
    for ratio in ratios {
        for cell in throughput
            .iter()
            .filter(|c| c.message_bytes == ratio.message_bytes && c.batch == ratio.batch)
        {
            table.row([
                format!("{} B", cell.message_bytes),
                cell.batch.to_string(),
                cell.peer.to_string(),
                format!("{:.2}", cell.median_msgs_per_s / 1e6),
                format!("{:.2}x", ratio.leantier_msgs_per_s / cell.median_msgs_per_s),
            ]);
        }
    }
    table
}

fn latency_table(report: &RingReport) -> Table {
    let mut table =
        Table::new(["queue", "p50 ns", "p90 ns", "p99 ns", "p99.9 ns", "p99.99 ns", "max ns"])
            .with_title("ping-pong one-way hop (round trip / 2)");
    for row in &report.latency {
        let s = &row.one_way_ns;
        table.row([
            row.peer.to_string(),
            s.p50_ns.to_string(),
            s.p90_ns.to_string(),
            s.p99_ns.to_string(),
            s.p99_9_ns.to_string(),
            s.p99_99_ns.to_string(),
            s.max_ns.to_string(),
        ]);
    }
    table
}

fn wait_table(report: &RingReport) -> Table {
    let mut table =
        Table::new(["consumer waits by", "hop p50 ns", "hop p99 ns", "hop max ns", "idle CPU %"])
            .with_title("wait strategies: wake-up cost (ping-pong) and CPU burnt while idle");
    for cost in &report.wait_strategies {
        let s = &cost.one_way_ns;
        table.row([
            cost.strategy.to_string(),
            s.p50_ns.to_string(),
            s.p99_ns.to_string(),
            s.max_ns.to_string(),
            format!("{:.1}", cost.idle_cpu_fraction * 100.0),
        ]);
    }
    table
}

fn targets_table(report: &RingReport) -> Table {
    let mut table = Table::new(["target", "measured", "required", "met"]).with_title("targets");
    for target in &report.targets {
        let met = if target.met { "yes" } else { "NO" };
        table.row([
            target.name.clone(),
            target.measured.clone(),
            target.target.clone(),
            met.into(),
        ]);
    }
    table
}

fn write_report(
    out: &std::path::Path,
    report: &RingReport,
    histograms: &[LatencyHistogram],
) -> anyhow::Result<()> {
    let tables = [
        throughput_table(&report.throughput, &report.ratios),
        latency_table(report),
        wait_table(report),
        targets_table(report),
    ];
    for table in &tables {
        println!("{table}");
    }
    let dir = ReportDir::create(out)?;
    dir.write_json("ring.json", report)?;
    dir.write_csv("throughput.csv", &tables[0])?;
    dir.write_csv("latency.csv", &tables[1])?;
    dir.write_csv("wait-strategies.csv", &tables[2])?;
    let labelled: Vec<(&str, &LatencyHistogram)> =
        report.latency.iter().map(|row| row.peer).zip(histograms).collect();
    dir.write_svg(
        "latency-percentiles.svg",
        &latency_percentile_plot("one-way hop latency", &labelled).to_svg(),
    )?;
    let mut markdown = Markdown::new();
    markdown.heading(1, "leantier bench ring");
    markdown.paragraph(&format!(
        "CPUs: producer {:?}, consumer {:?}; capacity {} slots; {} messages × {} trials per cell.",
        report.cpus.producer,
        report.cpus.consumer,
        CAPACITY_SLOTS,
        report.messages_per_trial,
        report.trials
    ));
    for &message_bytes in &MESSAGE_BYTES {
        let name = format!("throughput-{message_bytes}B.svg");
        dir.write_svg(&name, &throughput_chart(report, message_bytes).to_svg())?;
        markdown.image(&format!("throughput {message_bytes} B"), &name);
    }
    for table in &tables {
        markdown.table(table);
    }
    markdown.image("latency by percentile", "latency-percentiles.svg");
    dir.write_markdown("README.md", markdown.as_str())?;
    println!("report: {}", dir.path().display());
    Ok(())
}

fn throughput_chart(report: &RingReport, message_bytes: usize) -> BarChart {
    let batches: Vec<usize> = report
        .ratios
        .iter()
        .filter(|r| r.message_bytes == message_bytes)
        .map(|r| r.batch)
        .collect();
    let mut chart = BarChart::new(
        &format!("throughput, {message_bytes}-byte messages"),
        "million messages / s",
        batches.iter().map(|batch| format!("batch {batch}")),
    );
    for peer in experiments::ringbench::peer_names() {
        let values = batches
            .iter()
            .map(|&batch| {
                report
                    .throughput
                    .iter()
                    .find(|c| {
                        c.peer == peer && c.batch == batch && c.message_bytes == message_bytes
                    })
                    .map_or(0.0, |c| c.median_msgs_per_s / 1e6)
            })
            .collect();
        chart = chart.group(peer, values);
    }
    chart
}

#[cfg(test)]
mod tests {
    use super::*;

    /// leantier at 2 M msg/s beside a queue at 1 M: the row of the slower queue reads 2.00x
    /// under a header that says which way the division goes.
    #[test]
    fn the_ratio_column_says_leantier_over_the_row() {
        let cell = |peer, median_msgs_per_s| ThroughputCell {
            peer,
            message_bytes: 64,
            batch: 1,
            trials_msgs_per_s: vec![median_msgs_per_s],
            median_msgs_per_s,
        };
        let ratio = Ratio {
            message_bytes: 64,
            batch: 1,
            leantier_msgs_per_s: 2e6,
            best_peer: "slow",
            best_peer_msgs_per_s: 1e6,
            ratio: 2.0,
        };
        let table = throughput_table(&[cell("leantier", 2e6), cell("slow", 1e6)], &[ratio]);
        assert_eq!(table.headers()[4], "leantier ÷ this queue");
        let slow = table.rows().iter().find(|row| row[2] == "slow").unwrap();
        assert_eq!(slow[4], "2.00x");
    }
}
