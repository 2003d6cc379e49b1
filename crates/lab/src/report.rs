//! Results as terminal tables, a report folder (JSON, CSV, Markdown, SVG plots) and progress
//! bars.
//!
//! Every command prints a [`Table`] (aligned columns, numbers right-aligned) and writes the
//! same figures into a [`ReportDir`]: JSON for scripts (serde), CSV for spreadsheets, a
//! Markdown summary built with [`Markdown`], and SVG plots ([`LinePlot`], [`BarChart`],
//! [`latency_cdf_plot`]). The SVG is written by hand, a few hundred bytes of markup per
//! series, so plots need no fonts, no system libraries and no plotting crate; they open in
//! any browser and render inline on GitHub. Long runs show a [`progress_bar`], hidden when
//! stderr is not a terminal so logs and CI output stay clean.
//!
//! ```
//! use lab::report::{latency_cdf_plot, latency_table, Markdown, ReportDir, Table};
//! use lab::stats::LatencyHistogram;
//!
//! let latency = LatencyHistogram::from_samples_ns(&[9_000, 12_000, 15_000, 80_000]);
//! let table = latency_table(&[("20K msg/s", &latency.summary())]);
//! println!("{table}");
//!
//! let dir = tempfile::tempdir().unwrap();
//! let report = ReportDir::create(dir.path().join("report")).unwrap();
//! report.write_json("latency.json", &latency.summary()).unwrap();
//! report.write_csv("latency.csv", &table).unwrap();
//! let cdf = latency_cdf_plot("End-to-end latency", &[("20K msg/s", &latency)]).x_log();
//! report.write_svg("latency-cdf.svg", &cdf.to_svg()).unwrap();
//! let mut summary = Markdown::new();
//! summary.heading(1, "Demo").table(&table).image("latency CDF", "latency-cdf.svg");
//! report.write_markdown("README.md", summary.as_str()).unwrap();
//! ```

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::load::ThroughputSeries;
use crate::stats::{CumulativeBucket, FactorialAnalysis, LatencyHistogram, LatencySummary};

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
// SVG plots.

const PLOT_WIDTH_PX: f64 = 900.0;
const PLOT_HEIGHT_PX: f64 = 480.0;
const MARGIN_LEFT_PX: f64 = 80.0;
/// Room for legend labels of about 30 characters.
const MARGIN_RIGHT_PX: f64 = 270.0;
const MARGIN_TOP_PX: f64 = 40.0;
const MARGIN_BOTTOM_PX: f64 = 60.0;
const TICKS_TARGET: usize = 6;
/// Series with at most this many points are drawn with a marker at each point.
const MARKERS_POINTS_MAX: usize = 40;
/// Colour-blind-friendly palette (Okabe–Ito), cycled by series.
const PALETTE: [&str; 8] =
    ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"];

/// An axis scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Base-10 logarithmic; non-positive values are left out.
    Log10,
}

/// One named line of a [`LinePlot`].
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// An x-y line plot with a legend. Put units in the axis labels, e.g. `latency (µs)`.
#[derive(Clone, Debug, PartialEq)]
pub struct LinePlot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub y_scale: Scale,
    pub series: Vec<Series>,
}

impl LinePlot {
    pub fn new(title: &str, x_label: &str, y_label: &str) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            series: Vec::new(),
        }
    }

    /// Adds a line.
    pub fn series(mut self, label: &str, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series { label: label.into(), points });
        self
    }

    /// Logarithmic x axis.
    pub fn x_log(mut self) -> Self {
        self.x_scale = Scale::Log10;
        self
    }

    /// Logarithmic y axis.
    pub fn y_log(mut self) -> Self {
        self.y_scale = Scale::Log10;
        self
    }

    /// Renders the plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let usable = |scale: Scale, v: f64| v.is_finite() && (scale == Scale::Linear || v > 0.0);
        let visible: Vec<Vec<(f64, f64)>> = self
            .series
            .iter()
            .map(|s| {
                let keep =
                    |&&(x, y): &&(f64, f64)| usable(self.x_scale, x) && usable(self.y_scale, y);
                s.points.iter().filter(keep).copied().collect()
            })
            .collect();
        let all = visible.iter().flatten();
        let x_axis = Axis::fit(self.x_scale, all.clone().map(|p| p.0), false);
        let y_axis = Axis::fit(self.y_scale, all.map(|p| p.1), false);
        let mut svg = svg_open(&self.title);
        frame(&mut svg, &x_axis, &y_axis, &self.x_label, &self.y_label);
        for (index, points) in visible.iter().enumerate() {
            let coordinates: Vec<String> = points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", x_axis.to_px_x(x), y_axis.to_px_y(y)))
                .collect();
            let colour = PALETTE[index % PALETTE.len()];
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                coordinates.join(" ")
            );
            // Sparse series (a few measured rates) get a dot per measurement, so a reader
            // can tell measured points from the interpolating line.
            if points.len() <= MARKERS_POINTS_MAX {
                for point in &coordinates {
                    let (x, y) = point.split_once(',').expect("formatted as x,y");
                    let _ = writeln!(svg, r#"<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>"#);
                }
            }
        }
        legend(&mut svg, self.series.iter().map(|s| s.label.as_str()), "line");
        svg + "</svg>\n"
    }
}

/// A grouped bar chart: one group of bars per category, one bar colour per named group.
#[derive(Clone, Debug, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (label, one value per category).
    pub groups: Vec<(String, Vec<f64>)>,
}

impl BarChart {
    pub fn new<S: Into<String>>(
        title: &str,
        y_label: &str,
        categories: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            title: title.into(),
            y_label: y_label.into(),
            categories: categories.into_iter().map(Into::into).collect(),
            groups: Vec::new(),
        }
    }

    /// Adds one bar per category; missing values are left out, non-finite ones drawn as 0.
    pub fn group(mut self, label: &str, values: Vec<f64>) -> Self {
        self.groups.push((label.into(), values));
        self
    }

    /// Renders the chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
        let values = self.groups.iter().flat_map(|(_, values)| values.iter().map(|&v| finite(v)));
        let y_axis = Axis::fit(Scale::Linear, values.chain([0.0]), true);
        let categories = self.categories.len().max(1) as f64;
        let x_axis = Axis::categories(categories);
        let mut svg = svg_open(&self.title);
        frame(&mut svg, &x_axis, &y_axis, "", &self.y_label);
        let slot_px = x_axis.length_px() / categories;
        let bar_px = slot_px * 0.8 / self.groups.len().max(1) as f64;
        let zero_px = y_axis.to_px_y(0.0);
        for (category_index, category) in self.categories.iter().enumerate() {
            let slot_left = MARGIN_LEFT_PX + slot_px * category_index as f64;
            for (group_index, (_, values)) in self.groups.iter().enumerate() {
                let Some(&value) = values.get(category_index) else { continue };
                let top_px = y_axis.to_px_y(finite(value));
                let _ = writeln!(
                    svg,
                    r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                    slot_left + slot_px * 0.1 + bar_px * group_index as f64,
                    top_px.min(zero_px),
                    bar_px,
                    (zero_px - top_px).abs(),
                    PALETTE[group_index % PALETTE.len()],
                    escape_xml(&format!("{category}: {}", format_tick(value)))
                );
            }
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                slot_left + slot_px / 2.0,
                PLOT_HEIGHT_PX - MARGIN_BOTTOM_PX + 18.0,
                escape_xml(category)
            );
        }
        legend(&mut svg, self.groups.iter().map(|(label, _)| label.as_str()), "bar");
        svg + "</svg>\n"
    }
}

/// Latency CDFs, one line per histogram: x is latency in µs, y the % of messages at or below
/// it. Chain `.x_log()` for long tails.
pub fn latency_cdf_plot(title: &str, series: &[(&str, &LatencyHistogram)]) -> LinePlot {
    let mut plot = LinePlot::new(title, "latency (µs)", "messages at or below (%)");
    for (label, histogram) in series {
        let points = histogram
            .cdf_points()
            .iter()
            .map(|&(ns, f)| (ns as f64 / 1_000.0, f * 100.0))
            .collect();
        plot = plot.series(label, points);
    }
    plot
}

/// Throughput over time, one line per run: x is seconds since the measured window opened (the
/// end of each interval), y the completions of that interval per second.
pub fn throughput_over_time_plot(title: &str, series: &[(&str, &ThroughputSeries)]) -> LinePlot {
    let mut plot = LinePlot::new(title, "time in the measured window (s)", "completions per s");
    for (label, run) in series {
        let step_s = run.interval.as_secs_f64();
        let points = (1..)
            .zip(run.rates_per_s())
            .map(|(index, rate)| (f64::from(index) * step_s, rate))
            .collect();
        plot = plot.series(label, points);
    }
    plot
}

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

/// One axis: the data range mapped onto pixels, with tick positions.
struct Axis {
    scale: Scale,
    low: f64,
    high: f64,
    ticks: Vec<f64>,
    labelled_ticks: bool,
}

impl Axis {
    /// Fits the axis around `values` (an empty set gives 0..1 or 1..10).
    fn fit(scale: Scale, values: impl Iterator<Item = f64>, from_zero: bool) -> Self {
        let (mut low, mut high) =
            values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if !low.is_finite() {
            (low, high) = if scale == Scale::Log10 { (1.0, 10.0) } else { (0.0, 1.0) };
        }
        if from_zero {
            low = low.min(0.0);
        }
        match scale {
            Scale::Linear => {
                if high - low <= f64::EPSILON * high.abs().max(1.0) {
                    (low, high) =
                        (low - 0.5 * low.abs().max(1.0), high + 0.5 * high.abs().max(1.0));
                }
                let step = nice_step((high - low) / TICKS_TARGET as f64);
                let (low, high) = ((low / step).floor() * step, (high / step).ceil() * step);
                let count = ((high - low) / step).round() as usize;
                let ticks = (0..=count).map(|i| low + step * i as f64).collect();
                Self { scale, low, high, ticks, labelled_ticks: true }
            }
            Scale::Log10 => {
                let (low_decade, mut high_decade) = (low.log10().floor(), high.log10().ceil());
                if high_decade <= low_decade {
                    high_decade = low_decade + 1.0;
                }
                let ticks =
                    (low_decade as i32..=high_decade as i32).map(|e| 10f64.powi(e)).collect();
                let (low, high) = (10f64.powf(low_decade), 10f64.powf(high_decade));
                Self { scale, low, high, ticks, labelled_ticks: true }
            }
        }
    }

    /// A categorical x axis: no numeric ticks.
    fn categories(count: f64) -> Self {
        Self { scale: Scale::Linear, low: 0.0, high: count, ticks: vec![], labelled_ticks: false }
    }

    fn unit(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => (v - self.low) / (self.high - self.low),
            Scale::Log10 => (v.log10() - self.low.log10()) / (self.high.log10() - self.low.log10()),
        }
    }

    fn length_px(&self) -> f64 {
        PLOT_WIDTH_PX - MARGIN_LEFT_PX - MARGIN_RIGHT_PX
    }

    fn to_px_x(&self, v: f64) -> f64 {
        MARGIN_LEFT_PX + self.unit(v) * self.length_px()
    }

    fn to_px_y(&self, v: f64) -> f64 {
        let height_px = PLOT_HEIGHT_PX - MARGIN_TOP_PX - MARGIN_BOTTOM_PX;
        PLOT_HEIGHT_PX - MARGIN_BOTTOM_PX - self.unit(v) * height_px
    }
}

/// The 1, 2, 5 × 10^k step closest above `raw`.
fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// Short tick label: up to 4 significant digits, no trailing zeros, k/M suffixes.
fn format_tick(v: f64) -> String {
    let (scaled, suffix) = match v.abs() {
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e4 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let text = format!("{scaled:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    let text = if text == "-0" { "0" } else { text };
    format!("{text}{suffix}")
}

fn escape_xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

fn svg_open(title: &str) -> String {
    format!(
        concat!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" "#,
            r#"viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#,
            "\n<title>{t}</title>\n",
            r#"<rect width="100%" height="100%" fill="white"/>"#,
            "\n",
            r#"<text x="{cx}" y="24" text-anchor="middle" font-size="16">{t}</text>"#,
            "\n"
        ),
        w = PLOT_WIDTH_PX,
        h = PLOT_HEIGHT_PX,
        cx = (PLOT_WIDTH_PX - MARGIN_RIGHT_PX + MARGIN_LEFT_PX) / 2.0,
        t = escape_xml(title)
    )
}

/// Axes, grid lines, tick labels and axis labels.
fn frame(svg: &mut String, x_axis: &Axis, y_axis: &Axis, x_label: &str, y_label: &str) {
    let (left, right) = (MARGIN_LEFT_PX, PLOT_WIDTH_PX - MARGIN_RIGHT_PX);
    let (top, bottom) = (MARGIN_TOP_PX, PLOT_HEIGHT_PX - MARGIN_BOTTOM_PX);
    for &tick in &y_axis.ticks {
        let y = y_axis.to_px_y(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{right}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left - 6.0,
            y + 4.0,
            format_tick(tick)
        );
    }
    for &tick in x_axis.ticks.iter().filter(|_| x_axis.labelled_ticks) {
        let x = x_axis.to_px_x(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{bottom}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            bottom + 18.0,
            format_tick(tick)
        );
    }
    let _ =
        writeln!(svg, r#"<path d="M{left},{top} V{bottom} H{right}" fill="none" stroke="black"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (left + right) / 2.0,
        PLOT_HEIGHT_PX - 16.0,
        escape_xml(x_label)
    );
    let middle = (top + bottom) / 2.0;
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{middle:.1}" text-anchor="middle" transform="rotate(-90 18 {middle:.1})">{}</text>"#,
        escape_xml(y_label)
    );
}

fn legend<'a>(svg: &mut String, labels: impl Iterator<Item = &'a str>, mark: &str) {
    let x = PLOT_WIDTH_PX - MARGIN_RIGHT_PX + 16.0;
    for (index, label) in labels.enumerate() {
        let y = MARGIN_TOP_PX + 10.0 + 20.0 * index as f64;
        let colour = PALETTE[index % PALETTE.len()];
        let symbol = if mark == "bar" {
            format!(r#"<rect x="{x}" y="{:.1}" width="16" height="10" fill="{colour}"/>"#, y - 5.0)
        } else {
            format!(
                r#"<line x1="{x}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{colour}" stroke-width="2"/>"#,
                x + 16.0
            )
        };
        let _ = writeln!(
            svg,
            r#"{symbol}<text x="{:.1}" y="{:.1}">{}</text>"#,
            x + 22.0,
            y + 4.0,
            escape_xml(label)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Progress bars.

/// A progress bar of `length` steps on stderr; hidden when stderr is not a terminal.
pub fn progress_bar(length: u64, message: impl Into<Cow<'static, str>>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{msg:24} [{bar:40.cyan/blue}] {pos}/{len} {elapsed_precise} (eta {eta})",
    )
    .expect("constant template is valid")
    .progress_chars("=> ");
    ProgressBar::new(length).with_style(style).with_message(message)
}

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
        let plot = throughput_over_time_plot("t", &[("steady", &steady)]);
        assert_eq!(plot.series[0].points, vec![(0.25, 40.0), (0.5, 80.0), (0.75, 120.0)]);
        assert!(plot.to_svg().contains("steady"));
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

    /// Checks that every element is closed in order; returns the names of the opened elements.
    fn assert_well_formed(svg: &str) -> Vec<String> {
        assert!(svg.starts_with("<svg "), "{svg}");
        let mut open: Vec<String> = Vec::new();
        let mut seen = Vec::new();
        let mut rest = svg;
        while let Some(start) = rest.find('<') {
            let end = rest[start..].find('>').expect("unterminated tag") + start;
            let tag = &rest[start + 1..end];
            assert!(!tag.contains('<'), "nested '<' in {tag}");
            let name: String =
                tag.trim_start_matches('/').chars().take_while(|c| c.is_alphanumeric()).collect();
            if let Some(closing) = tag.strip_prefix('/') {
                assert_eq!(open.pop().as_deref(), Some(closing.trim()), "mismatched </{closing}>");
            } else {
                if !tag.ends_with('/') {
                    open.push(name.clone());
                }
                seen.push(name);
            }
            let text_after =
                &rest[end + 1..rest[end + 1..].find('<').map_or(rest.len(), |i| i + end + 1)];
            assert!(!text_after.contains('>'), "stray '>' in text {text_after:?}");
            rest = &rest[end + 1..];
        }
        assert!(open.is_empty(), "unclosed elements {open:?}");
        assert_eq!(rest.trim(), "");
        seen
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
        let analysis = crate::stats::factorial_2kr(&["cache", "memory"], &responses, 0.9).unwrap();
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

    #[test]
    fn line_plot_svg_is_well_formed_with_labels_and_escaping() {
        let plot = LinePlot::new("p99 <vs> rate & senders", "rate (msg/s)", "p99 (µs)")
            .series("1 sender", vec![(20_000.0, 12.0), (40_000.0, 15.0), (60_000.0, 40.0)])
            .series("2 senders", vec![(20_000.0, 10.0), (40_000.0, 11.0), (f64::NAN, 1.0)]);
        let svg = plot.to_svg();
        let elements = assert_well_formed(&svg);
        assert_eq!(elements.iter().filter(|e| *e == "polyline").count(), 2);
        // One marker per drawable point (the NaN point is left out).
        assert_eq!(elements.iter().filter(|e| *e == "circle").count(), 5);
        for text in [
            "1 sender",
            "2 senders",
            "rate (msg/s)",
            "p99 (µs)",
            "p99 &lt;vs&gt; rate &amp; senders",
        ] {
            assert!(svg.contains(text), "missing {text}");
        }
        assert!(!svg.contains("NaN"));
        assert!(svg.contains(">60k<"), "x tick labels use k suffix: {svg}");
    }

    #[test]
    fn latency_cdf_on_log_axis_has_decade_ticks() {
        let latency = LatencyHistogram::from_samples_ns(&[2_000, 30_000, 400_000]);
        let svg = latency_cdf_plot("CDF", &[("60K msg/s", &latency)]).x_log().to_svg();
        assert_well_formed(&svg);
        for tick in [">1<", ">10<", ">100<", ">1000<"] {
            assert!(svg.contains(tick), "missing tick {tick}");
        }
        assert!(svg.contains("60K msg/s"));
        // The CDF ends at 100%.
        assert!(svg.contains(">100<"));
    }

    #[test]
    fn bar_chart_svg_has_one_bar_per_value() {
        let chart = BarChart::new("Throughput", "msg/s", ["single", "pool"])
            .group("10 users", vec![1_000.0, 3_000.0])
            .group("60 users", vec![1_100.0, 5_500.0]);
        let svg = chart.to_svg();
        let elements = assert_well_formed(&svg);
        // One background rect, 4 bars, 2 legend swatches.
        assert_eq!(elements.iter().filter(|e| *e == "rect").count(), 7);
        for text in ["single", "pool", "10 users", "60 users", "msg/s", "pool: 5500"] {
            assert!(svg.contains(text), "missing {text}");
        }
    }

    #[test]
    fn empty_plots_still_render() {
        assert_well_formed(&LinePlot::new("empty", "x", "y").x_log().to_svg());
        assert_well_formed(&BarChart::new("empty", "y", Vec::<String>::new()).to_svg());
    }

    #[test]
    fn nice_steps_and_tick_labels() {
        assert_eq!(nice_step(0.3), 0.5);
        assert_eq!(nice_step(13.0), 20.0);
        assert_eq!(nice_step(1.0), 1.0);
        assert_eq!(format_tick(2.5), "2.5");
        assert_eq!(format_tick(60_000.0), "60k");
        assert_eq!(format_tick(1_500_000.0), "1.5M");
        assert_eq!(format_tick(-0.0), "0");
    }

    #[test]
    fn progress_bar_is_hidden_exactly_when_stderr_is_not_a_terminal() {
        let bar = progress_bar(10, "test");
        assert_eq!(bar.is_hidden(), !std::io::stderr().is_terminal());
        bar.inc(3);
        assert_eq!(bar.position(), 3);
    }
}
