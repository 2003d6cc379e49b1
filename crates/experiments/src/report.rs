//! Results as terminal tables and a report folder (JSON, CSV, Markdown, `.hgrm`, SVG files).
//!
//! Every command prints a [`Table`] (aligned columns, numbers right-aligned) and writes the
//! same figures into a [`ReportDir`]: JSON for scripts (serde), CSV for spreadsheets, typed
//! [`DataTable`]s (numbers as numbers, units in the column names), HdrHistogram `.hgrm`
//! percentile distributions, a Markdown summary built with [`Markdown`], and SVG plots (drawn
//! by the `experiments` crate's `plot`, so that no server compiles a plotting library; its
//! `progress` has the long runs' progress bars).
//!
//! ```
//! use experiments::report::{latency_table, Markdown, ReportDir, Table};
//! use stats::LatencyHistogram;
//!
//! let latency = LatencyHistogram::from_samples_ns(&[9_000, 12_000, 15_000, 80_000]);
//! let table = latency_table(&[("20K msg/s", &latency.summary())]);
//! println!("{table}");
//!
//! let dir = tempfile::tempdir().unwrap();
//! let report = ReportDir::create(dir.path().join("report")).unwrap();
//! report.write_json("latency.json", &latency.summary()).unwrap();
//! report.write_csv("latency.csv", &table).unwrap();
//! report.write_hgrm("latency-20k.hgrm", &latency).unwrap();
//! report.write_svg("latency-percentiles.svg", "<svg></svg>").unwrap();
//! let mut summary = Markdown::new();
//! summary.heading(1, "Demo").table(&table).image("latency by percentile", "latency-percentiles.svg");
//! report.write_markdown("README.md", summary.as_str()).unwrap();
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use crate::data::{DataTable, hgrm};
use crate::load::ThroughputSeries;
use crate::statistics::FactorialAnalysis;
use stats::{CumulativeBucket, LatencyHistogram, LatencySummary};

// ---------------------------------------------------------------------------------------------
// Tables.

/// A table of text cells, rendered with aligned columns for the terminal, or as Markdown or
/// CSV. Cells that read as numbers (optionally with a unit suffix such as `%`, `x`, `µs`) are
/// right-aligned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    title: Option<String>,
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers and no rows.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Self { title: None, headers: headers.into_iter().map(Into::into).collect(), rows: vec![] }
    }

    /// Sets a title printed above the terminal rendering.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Appends a row. Missing trailing cells are left empty.
    ///
    /// # Panics
    /// If the row has more cells than the table has columns (a programming error).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        assert!(
            cells.len() <= self.headers.len(),
            "row has {} cells, table has {} columns",
            cells.len(),
            self.headers.len()
        );
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
        self
    }

    pub fn title(&self) -> Option<&str> {
        self.title.as_deref()
    }

    pub fn headers(&self) -> &[String] {
        &self.headers
    }

    pub fn rows(&self) -> &[Vec<String>] {
        &self.rows
    }

    fn column_widths(&self) -> Vec<usize> {
        (0..self.headers.len())
            .map(|column| {
                std::iter::once(&self.headers[column])
                    .chain(self.rows.iter().map(|row| &row[column]))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect()
    }

    /// GitHub-flavoured Markdown, numeric columns right-aligned.
    pub fn to_markdown(&self) -> String {
        let escape = |cell: &str| cell.replace('|', "\\|");
        let mut out = String::new();
        let line = |cells: &mut dyn Iterator<Item = String>| {
            format!("| {} |\n", cells.collect::<Vec<_>>().join(" | "))
        };
        out += &line(&mut self.headers.iter().map(|h| escape(h)));
        out += &line(&mut (0..self.headers.len()).map(|column| {
            if self.is_numeric_column(column) { "---:".into() } else { "---".into() }
        }));
        for row in &self.rows {
            out += &line(&mut row.iter().map(|cell| escape(cell)));
        }
        out
    }

    /// CSV (RFC 4180 quoting), header line first.
    pub fn to_csv(&self) -> String {
        let quote = |cell: &String| {
            if cell.contains([',', '"', '\n', '\r']) {
                format!("\"{}\"", cell.replace('"', "\"\""))
            } else {
                cell.clone()
            }
        };
        std::iter::once(&self.headers)
            .chain(&self.rows)
            .map(|row| row.iter().map(quote).collect::<Vec<_>>().join(",") + "\n")
            .collect()
    }

    fn is_numeric_column(&self, column: usize) -> bool {
        let mut cells = self.rows.iter().map(|row| &row[column]).filter(|c| !c.is_empty());
        let mut any = false;
        let all = cells.all(|cell| {
            any = true;
            is_numeric(cell)
        });
        any && all
    }
}

/// True when `cell` reads as a number, allowing a unit suffix (`12.5`, `-3`, `99.9%`,
/// `2.1x`, `40 µs`, `1,200`). Such cells are right-aligned.
pub fn is_numeric(cell: &str) -> bool {
    let trimmed = cell.trim();
    let number_end = trimmed
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit() || c == '.' || c == ',' || (i == 0 && "+-".contains(c)))
        })
        .map_or(trimmed.len(), |(i, _)| i);
    let (number, unit) = trimmed.split_at(number_end);
    let unit = unit.trim_start();
    number.chars().any(|c| c.is_ascii_digit())
        && number.replace(',', "").parse::<f64>().is_ok()
        && unit.chars().count() <= 4
        && unit.chars().all(|c| c.is_alphabetic() || "%/×".contains(c))
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(title) = &self.title {
            writeln!(f, "{title}")?;
        }
        let widths = self.column_widths();
        let write_row = |f: &mut fmt::Formatter<'_>, row: &[String], header: bool| {
            let mut line = String::new();
            for (column, (cell, &width)) in row.iter().zip(&widths).enumerate() {
                if column > 0 {
                    line += "  ";
                }
                let pad = width - cell.chars().count();
                let right = if header { self.is_numeric_column(column) } else { is_numeric(cell) };
                if right {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line += cell;
                } else {
                    line += cell;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            writeln!(f, "{}", line.trim_end())
        };
        write_row(f, &self.headers, true)?;
        let rule_width = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        writeln!(f, "{}", "-".repeat(rule_width))?;
        for row in &self.rows {
            write_row(f, row, false)?;
        }
        Ok(())
    }
}

/// Formats nanoseconds as microseconds with three significant digits or more
/// (`0.085`, `1.25`, `12.5`, `125`, `1250`).
pub fn format_ns_as_us(ns: u64) -> String {
    let us = ns as f64 / 1_000.0;
    match us {
        _ if us < 1.0 => format!("{us:.3}"),
        _ if us < 10.0 => format!("{us:.2}"),
        _ if us < 100.0 => format!("{us:.1}"),
        _ => format!("{us:.0}"),
    }
}

/// A latency table in µs: one row per (name, summary) with count, min, p50 .. p99.99, max.
pub fn latency_table(rows: &[(&str, &LatencySummary)]) -> Table {
    let headers = ["", "count"]
        .into_iter()
        .map(String::from)
        .chain(LatencySummary::QUANTILE_LABELS.iter().map(|label| format!("{label} µs")));
    let mut table = Table::new(headers);
    for (name, summary) in rows {
        let cells = [name.to_string(), summary.count.to_string()]
            .into_iter()
            .chain(summary.quantiles_ns().map(format_ns_as_us));
        table.row(cells);
    }
    table
}

/// A table of cumulative % within latency buckets: `≤ 10 µs | 52.1%`, ..., `> 300 µs | 100%`.
pub fn cumulative_buckets_table(buckets: &[CumulativeBucket]) -> Table {
    let mut table = Table::new(["latency", "count", "cumulative %"]);
    for bucket in buckets {
        let range = match bucket.upper_ns {
            Some(upper_ns) => format!("≤ {} µs", format_ns_as_us(upper_ns)),
            None => format!("> {} µs", format_ns_as_us(bucket.lower_ns)),
        };
        table.row([range, bucket.count.to_string(), format!("{:.2}%", bucket.cumulative_percent)]);
    }
    table
}

/// Cumulative % within `width_ns` buckets for several series side by side, one column per
/// series (e.g. the same system at several arrival rates), `buckets_max` rows plus a final
/// "beyond" row. A series whose buckets stopped early has reached 100%; an empty one shows 0%.
pub fn cumulative_buckets_comparison_table(
    series: &[(&str, &LatencyHistogram)],
    width_ns: u64,
    buckets_max: usize,
) -> Table {
    let columns: Vec<Vec<CumulativeBucket>> = series
        .iter()
        .map(|(_, histogram)| histogram.cumulative_buckets(width_ns, buckets_max))
        .collect();
    let headers = std::iter::once("latency".to_string())
        .chain(series.iter().map(|(label, _)| format!("cum % {label}")));
    let mut table = Table::new(headers);
    for index in 0..buckets_max {
        let upper_ns = (index as u64 + 1) * width_ns;
        let cells = columns.iter().map(|buckets| {
            let percent = match buckets.get(index) {
                Some(bucket) if bucket.upper_ns.is_some() => bucket.cumulative_percent,
                _ if buckets.is_empty() => 0.0,
                _ => 100.0,
            };
            format!("{percent:.2}%")
        });
        table.row(std::iter::once(format!("≤ {} µs", format_ns_as_us(upper_ns))).chain(cells));
    }
    let beyond = format!("> {} µs", format_ns_as_us(width_ns * buckets_max as u64));
    let totals = columns.iter().map(|b| if b.is_empty() { "0.00%" } else { "100.00%" });
    table.row(std::iter::once(beyond).chain(totals.map(String::from)));
    table
}

/// A table of a 2^k·r analysis: one row per effect (value, % of variation, confidence
/// interval, whether it excludes zero), then the mean and the error's share.
pub fn factorial_table(analysis: &FactorialAnalysis) -> Table {
    let confidence = format!("{}% CI", analysis.confidence * 100.0);
    let mut table =
        Table::new(["effect", "value", "variation %", confidence.as_str(), "significant"]);
    let number = |v: f64| format!("{v:.4}");
    table.row(["mean (q0)".to_string(), number(analysis.mean)]);
    for effect in &analysis.effects {
        let interval = match (effect.ci_low, effect.ci_high) {
            (Some(low), Some(high)) => format!("({}, {})", number(low), number(high)),
            _ => "n/a (r = 1)".to_string(),
        };
        let significant = match effect.is_significant() {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        };
        table.row([
            effect.name.clone(),
            number(effect.value),
            format!("{:.2}%", effect.variation_percent),
            interval,
            significant.to_string(),
        ]);
    }
    table.row(["error".to_string(), String::new(), format!("{:.2}%", analysis.error_percent)]);
    table
}

// ---------------------------------------------------------------------------------------------
// Report folder and Markdown.

/// A folder of report files. File names are plain names (no directories, no `..`).
#[derive(Clone, Debug)]
pub struct ReportDir {
    root: PathBuf,
}

impl ReportDir {
    /// Creates the folder (and its parents) if needed.
    pub fn create(root: impl Into<PathBuf>) -> anyhow::Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot create report folder {}", root.display()))?;
        Ok(Self { root })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Writes `contents` to `name` in the folder and returns the file's path.
    pub fn write_text(&self, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
        let valid = !name.is_empty()
            && name != "."
            && name != ".."
            && !name.contains(['/', '\\'])
            && Path::new(name).file_name().is_some();
        anyhow::ensure!(valid, "report file name {name:?} must be a plain file name");
        let path = self.root.join(name);
        std::fs::write(&path, contents)
            .with_context(|| format!("cannot write report file {}", path.display()))?;
        Ok(path)
    }

    /// Writes `value` as pretty-printed JSON.
    pub fn write_json<T: Serialize + ?Sized>(
        &self,
        name: &str,
        value: &T,
    ) -> anyhow::Result<PathBuf> {
        let text = serde_json::to_string_pretty(value).context("cannot encode report JSON")?;
        self.write_text(name, &(text + "\n"))
    }

    /// Writes `table` as CSV.
    pub fn write_csv(&self, name: &str, table: &Table) -> anyhow::Result<PathBuf> {
        self.write_text(name, &table.to_csv())
    }

    pub fn write_markdown(&self, name: &str, markdown: &str) -> anyhow::Result<PathBuf> {
        self.write_text(name, markdown)
    }

    pub fn write_svg(&self, name: &str, svg: &str) -> anyhow::Result<PathBuf> {
        self.write_text(name, svg)
    }

    /// Writes `table` as `<name>.csv` and `<name>.json`; returns the CSV's path.
    pub fn write_data(&self, table: &DataTable) -> anyhow::Result<PathBuf> {
        self.write_json(&format!("{}.json", table.name), &table.to_json())?;
        self.write_text(&format!("{}.csv", table.name), &table.to_csv())
    }

    /// Writes `histogram`'s percentile distribution in HdrHistogram's `.hgrm` format.
    pub fn write_hgrm(&self, name: &str, histogram: &LatencyHistogram) -> anyhow::Result<PathBuf> {
        self.write_text(name, &hgrm(histogram))
    }
}

/// A Markdown document built block by block.
#[derive(Clone, Debug, Default)]
pub struct Markdown {
    text: String,
}

impl Markdown {
    pub fn new() -> Self {
        Self::default()
    }

    fn block(&mut self, block: &str) -> &mut Self {
        if !self.text.is_empty() {
            self.text.push('\n');
        }
        self.text += block;
        if !block.ends_with('\n') {
            self.text.push('\n');
        }
        self
    }

    /// `# text` with `level` hashes (1..=6).
    pub fn heading(&mut self, level: usize, text: &str) -> &mut Self {
        self.block(&format!("{} {text}", "#".repeat(level.clamp(1, 6))))
    }

    pub fn paragraph(&mut self, text: &str) -> &mut Self {
        self.block(text)
    }

    pub fn table(&mut self, table: &Table) -> &mut Self {
        match table.title() {
            Some(title) => self.block(&format!("**{title}**\n\n{}", table.to_markdown())),
            None => self.block(&table.to_markdown()),
        }
    }

    /// An image, e.g. an SVG plot in the same report folder.
    pub fn image(&mut self, alt: &str, relative_path: &str) -> &mut Self {
        self.block(&format!("![{alt}]({relative_path})"))
    }

    pub fn code_block(&mut self, language: &str, code: &str) -> &mut Self {
        self.block(&format!("```{language}\n{}\n```", code.trim_end()))
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

// ---------------------------------------------------------------------------------------------
// Throughput tables.

/// Throughput over time as a table: one row per interval (its end, in seconds), one column of
/// completions per second per run; a run with fewer intervals leaves its cells empty.
pub fn throughput_over_time_table(series: &[(&str, &ThroughputSeries)]) -> Table {
    let headers = std::iter::once("t (s)".to_string())
        .chain(series.iter().map(|(label, _)| format!("{label} (per s)")));
    let mut table = Table::new(headers);
    let rates: Vec<Vec<f64>> = series.iter().map(|(_, run)| run.rates_per_s()).collect();
    let longest = series
        .iter()
        .max_by_key(|(_, run)| run.counts.len())
        .map_or((0, Duration::ZERO), |(_, run)| (run.counts.len(), run.interval));
    for index in 0..longest.0 {
        let end_s = (index + 1) as f64 * longest.1.as_secs_f64();
        let cells =
            rates.iter().map(|run| run.get(index).map_or(String::new(), |r| format!("{r:.1}")));
        table.row(std::iter::once(format!("{end_s:.3}")).chain(cells));
    }
    table
}

// ---------------------------------------------------------------------------------------------
// Progress bars.

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_over_time_has_one_point_per_interval() {
        let interval = Duration::from_millis(250);
        let steady = ThroughputSeries { interval, counts: vec![10, 20, 30] };
        let short = ThroughputSeries { interval, counts: vec![5] };
        let table = throughput_over_time_table(&[("steady", &steady), ("short", &short)]);
        assert_eq!(table.headers(), ["t (s)", "steady (per s)", "short (per s)"]);
        assert_eq!(table.rows()[0], ["0.250", "40.0", "20.0"]);
        assert_eq!(table.rows()[2], ["0.750", "120.0", ""]);
    }

    #[test]
    fn bucket_comparison_puts_series_side_by_side_and_fills_finished_ones() {
        let fast = LatencyHistogram::from_samples_ns(&[5_000, 15_000]);
        let slow = LatencyHistogram::from_samples_ns(&[5_000, 15_000, 25_000, 95_000]);
        let table = cumulative_buckets_comparison_table(
            &[("fast", &fast), ("slow", &slow), ("empty", &LatencyHistogram::new())],
            10_000,
            3,
        );
        assert_eq!(table.headers(), ["latency", "cum % fast", "cum % slow", "cum % empty"]);
        let column = |c: usize| table.rows().iter().map(|r| r[c].as_str()).collect::<Vec<_>>();
        assert_eq!(column(1), ["50.00%", "100.00%", "100.00%", "100.00%"]);
        assert_eq!(column(2), ["25.00%", "50.00%", "75.00%", "100.00%"]);
        assert_eq!(column(3), ["0.00%", "0.00%", "0.00%", "0.00%"]);
        assert_eq!(table.rows()[3][0], "> 30.0 µs");
    }

    #[test]
    fn table_aligns_columns_and_right_aligns_numbers() {
        let mut table = Table::new(["name", "p99 µs", "share"]).with_title("Latency");
        table.row(["ring", "1.25", "99.5%"]).row(["blocking baseline", "120", "0.5%"]);
        let text = table.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Latency");
        assert_eq!(lines[1], "name               p99 µs  share");
        assert_eq!(lines[2], "-".repeat(17 + 2 + 6 + 2 + 5));
        assert_eq!(lines[3], "ring                 1.25  99.5%");
        assert_eq!(lines[4], "blocking baseline     120   0.5%");
    }

    #[test]
    fn numeric_cells_allow_units_but_not_words() {
        for number in ["12", "-3.5", "1,200", "99.9%", "2.1x", "40 µs", "1.5 ms", "+7"] {
            assert!(is_numeric(number), "{number}");
        }
        for text in ["", "ring", "p99", "-", "12 messages", "1.2.3", "v2"] {
            assert!(!is_numeric(text), "{text}");
        }
    }

    #[test]
    fn markdown_and_csv_render_the_same_cells() {
        let mut table = Table::new(["mode", "rate"]);
        table.row(["a|b", "10"]).row(["x, \"y\"", "20"]);
        assert_eq!(
            table.to_markdown(),
            "| mode | rate |\n| --- | ---: |\n| a\\|b | 10 |\n| x, \"y\" | 20 |\n"
        );
        assert_eq!(table.to_csv(), "mode,rate\na|b,10\n\"x, \"\"y\"\"\",20\n");
    }

    #[test]
    fn latency_tables_show_microseconds() {
        let summary = LatencyHistogram::from_samples_ns(&[85, 1_250, 12_500, 125_000]).summary();
        let table = latency_table(&[("e2e", &summary)]);
        assert_eq!(table.headers()[2], "min µs");
        assert_eq!(table.rows()[0][..3], ["e2e", "4", "0.085"]);
        assert_eq!(table.rows()[0].last().unwrap(), "125");
        let buckets =
            LatencyHistogram::from_samples_ns(&[5_000, 25_000]).cumulative_buckets(10_000, 2);
        let table = cumulative_buckets_table(&buckets);
        assert_eq!(table.rows()[0], ["≤ 10.0 µs", "1", "50.00%"]);
        assert_eq!(table.rows()[2], ["> 20.0 µs", "1", "100.00%"]);
    }

    #[test]
    fn factorial_table_lists_effects_and_error() {
        let responses = vec![
            vec![15.0, 18.0, 12.0],
            vec![45.0, 48.0, 51.0],
            vec![25.0, 28.0, 19.0],
            vec![75.0, 75.0, 81.0],
        ];
        let analysis =
            crate::statistics::factorial_2kr(&["cache", "memory"], &responses, 0.9).unwrap();
        let table = factorial_table(&analysis);
        assert_eq!(table.headers()[3], "90% CI");
        assert_eq!(table.rows()[0][..2], ["mean (q0)", "41.0000"]);
        assert_eq!(table.rows()[1][..3], ["cache", "21.5000", "78.88%"]);
        assert_eq!(table.rows()[3][0], "cache×memory");
        assert_eq!(table.rows()[1][4], "yes");
        assert_eq!(table.rows()[4][..3], ["error", "", "1.45%"]);
    }

    #[test]
    fn report_dir_writes_json_that_roundtrips_and_rejects_paths() {
        let dir = tempfile::tempdir().unwrap();
        let report = ReportDir::create(dir.path().join("a/b")).unwrap();
        let summary = LatencyHistogram::from_samples_ns(&[1_000, 2_000, 3_000]).summary();
        let path = report.write_json("summary.json", &summary).unwrap();
        let back: LatencySummary =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!((back.mean_ns - summary.mean_ns).abs() < 1e-9);
        assert_eq!(LatencySummary { mean_ns: summary.mean_ns, ..back }, summary);
        let mut table = Table::new(["k"]);
        table.row(["v"]);
        let csv = report.write_csv("t.csv", &table).unwrap();
        assert_eq!(std::fs::read_to_string(csv).unwrap(), "k\nv\n");
        for bad in ["", "..", "../x.json", "a/b.json"] {
            assert!(report.write_text(bad, "x").is_err(), "{bad}");
        }
    }

    #[test]
    fn markdown_blocks_are_separated() {
        let mut table = Table::new(["a"]);
        table.row(["1"]);
        let mut doc = Markdown::new();
        doc.heading(2, "Result").paragraph("Text.").table(&table).image("cdf", "cdf.svg");
        assert_eq!(
            doc.as_str(),
            "## Result\n\nText.\n\n| a |\n| ---: |\n| 1 |\n\n![cdf](cdf.svg)\n"
        );
    }
}
