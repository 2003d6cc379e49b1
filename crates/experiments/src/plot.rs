//! SVG plots drawn with `plotters` (its SVG backend only: no fonts, no system libraries).
//!
//! [`LinePlot`] (x-y lines, linear or log axes, horizontal limit lines), [`BarChart`] (grouped
//! bars, optional min–max whiskers, a limit line) and [`latency_percentile_plot`], which draws
//! latency against the percentile on a log `1/(1−p)` axis, the convention of HdrHistogram's
//! plotter and wrk2: the tail (99%, 99.9%, 99.99%) gets as much room as the body. Every axis
//! takes a label with its unit, e.g. `latency (µs)`.

use plotters::coord::ranged1d::{AsRangedCoord, SegmentValue, ValueFormatter};
use plotters::prelude::*;

use crate::load::ThroughputSeries;
use stats::LatencyHistogram;

/// The drawing's size without its legend, which goes below it (never over the data).
const PLOT_SIZE_PX: (u32, u32) = (900, 480);
/// Font sizes at the SVG's own size: the page shows plots at that size where it is wide
/// enough, so tick labels and the legend read at 14.5 px, and at 11 px or more down to a 75%
/// scale.
/// (plotters writes `font-size` as these / 1.24: 18 gives 14.5 px.)
const TITLE_FONT_PX: u32 = 24;
const AXIS_FONT_PX: u32 = 19;
const TICK_FONT_PX: u32 = 18;
const LEGEND_FONT_PX: u32 = 18;
/// Height of one legend row, and the width a legend character takes at most (for wrapping).
const LEGEND_ROW_PX: u32 = 26;
const LEGEND_CHAR_PX: u32 = 9;
/// A linear y axis becomes logarithmic when its positive values span this factor or more.
const LOG_SPAN_MIN: f64 = 100.0;
/// Series with at most this many points get a marker per point (measured vs interpolated).
const MARKERS_POINTS_MAX: usize = 40;
/// Colour-blind-friendly palette (Okabe–Ito), cycled by series.
const PALETTE: [RGBColor; 7] = [
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x00, 0x00),
];
/// Limit lines are red, apart from every series colour.
const LIMIT_COLOUR: RGBColor = RGBColor(0xC0, 0x00, 0x00);
/// The percentile plot's x axis ends at 1/(1−p) = 10^this (p = 99.999%) at most.
const PERCENTILE_DECADES_MAX: i32 = 5;

/// An axis scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Base-10 logarithmic; non-positive values are left out.
    Log10,
    /// Log of 1/(1−p) for a percentile p, labelled as percentiles (`90%`, `99.9%`).
    Percentile,
}

/// One named line of a [`LinePlot`].
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A horizontal line at a limit, e.g. a p99 target.
#[derive(Clone, Debug, PartialEq)]
pub struct Limit {
    pub label: String,
    pub y: f64,
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
    pub limits: Vec<Limit>,
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
            limits: Vec::new(),
        }
    }

    /// Adds a line.
    pub fn series(mut self, label: &str, points: Vec<(f64, f64)>) -> Self {
        self.series.push(Series { label: label.into(), points });
        self
    }

    /// Adds a horizontal limit line at `y`.
    pub fn limit(mut self, label: &str, y: f64) -> Self {
        self.limits.push(Limit { label: label.into(), y });
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

    /// The points each series keeps on these axes (finite; positive on log axes).
    fn visible_series(&self) -> Vec<(&str, Vec<(f64, f64)>)> {
        let usable = |scale: Scale, v: f64| v.is_finite() && (scale == Scale::Linear || v > 0.0);
        let visible = |s: &Series| {
            let keep = |p: &&(f64, f64)| usable(self.x_scale, p.0) && usable(self.y_scale, p.1);
            s.points.iter().filter(keep).copied().collect()
        };
        self.series.iter().map(|s| (s.label.as_str(), visible(s))).collect()
    }

    /// Renders the plot as a standalone SVG document; a linear y axis whose values span
    /// [`LOG_SPAN_MIN`] or more is drawn logarithmic (small values stay readable).
    pub fn to_svg(&self) -> String {
        let ys = self.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        if self.y_scale == Scale::Linear && spans_decades(ys.chain(self.limits.iter().map(|l| l.y)))
        {
            let y_label = format!("{} (log scale)", self.y_label);
            return LinePlot { y_scale: Scale::Log10, y_label, ..self.clone() }.to_svg();
        }
        let series = self.visible_series();
        let xs = series.iter().flat_map(|(_, points)| points.iter().map(|p| p.0));
        let ys = series.iter().flat_map(|(_, points)| points.iter().map(|p| p.1));
        let x = axis_range(self.x_scale, xs);
        let y = axis_range(self.y_scale, ys.chain(self.limits.iter().map(|l| l.y)));
        let lines = Lines { plot: self, series: &series, x_span: x };
        let result = match (self.x_scale, self.y_scale) {
            (Scale::Linear, Scale::Linear) => lines.draw(x.0..x.1, y.0..y.1),
            (Scale::Linear, _) => lines.draw(x.0..x.1, (y.0..y.1).log_scale()),
            (_, Scale::Linear) => lines.draw((x.0..x.1).log_scale(), y.0..y.1),
            (_, _) => lines.draw((x.0..x.1).log_scale(), (y.0..y.1).log_scale()),
        };
        result.unwrap_or_else(|error| error_svg(&self.title, &error))
    }
}

/// A [`LinePlot`] with its visible points, ready to draw on some pair of coordinates.
struct Lines<'a> {
    plot: &'a LinePlot,
    series: &'a [(&'a str, Vec<(f64, f64)>)],
    x_span: (f64, f64),
}

impl Lines<'_> {
    fn draw<X, Y>(&self, x: X, y: Y) -> Result<String, String>
    where
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let plot = self.plot;
        let mut legend: Vec<LegendEntry> = self
            .series
            .iter()
            .enumerate()
            .map(|(i, (label, _))| LegendEntry::new(label, PALETTE[i % PALETTE.len()], Mark::Line))
            .collect();
        legend.extend(
            plot.limits.iter().map(|l| LegendEntry::new(&l.label, LIMIT_COLOUR, Mark::Dashed)),
        );
        let mut svg = String::new();
        {
            let (root, legend_area) = canvas(&mut svg, &legend)?;
            let mut chart = chart_builder(&root, &plot.title)
                .build_cartesian_2d(x, y)
                .map_err(|e| e.to_string())?;
            let x_format = |v: &f64| tick_label(plot.x_scale, *v);
            let y_format = |v: &f64| tick_label(plot.y_scale, *v);
            chart
                .configure_mesh()
                .x_desc(plot.x_label.as_str())
                .y_desc(plot.y_label.as_str())
                .x_label_formatter(&x_format)
                .y_label_formatter(&y_format)
                .label_style(("sans-serif", TICK_FONT_PX))
                .axis_desc_style(("sans-serif", AXIS_FONT_PX))
                .light_line_style(RGBColor(238, 238, 238))
                .draw()
                .map_err(|e| e.to_string())?;
            for (index, (_, points)) in self.series.iter().enumerate() {
                let colour = PALETTE[index % PALETTE.len()];
                let line = LineSeries::new(points.iter().copied(), colour.stroke_width(2));
                chart.draw_series(line).map_err(|e| e.to_string())?;
                if points.len() <= MARKERS_POINTS_MAX {
                    let dots = points.iter().map(|&p| Circle::new(p, 3, colour.filled()));
                    chart.draw_series(dots).map_err(|e| e.to_string())?;
                }
            }
            for limit in &plot.limits {
                let ends = [(self.x_span.0, limit.y), (self.x_span.1, limit.y)];
                let style = LIMIT_COLOUR.stroke_width(2);
                chart
                    .draw_series(DashedLineSeries::new(ends, 8, 5, style))
                    .map_err(|e| e.to_string())?;
            }
            draw_legend(&legend_area, &legend)?;
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }
}

fn chart_builder<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, ("sans-serif", TITLE_FONT_PX))
        .margin(14)
        .x_label_area_size(56)
        .y_label_area_size(88);
    builder
}

/// How a legend entry shows its series.
#[derive(Clone, Copy)]
enum Mark {
    Line,
    Dashed,
    Bar,
}

struct LegendEntry {
    label: String,
    colour: RGBColor,
    mark: Mark,
}

impl LegendEntry {
    fn new(label: &str, colour: RGBColor, mark: Mark) -> LegendEntry {
        LegendEntry { label: label.into(), colour, mark }
    }

    /// Width of the mark, the gap and the label.
    fn width_px(&self) -> u32 {
        40 + LEGEND_CHAR_PX * self.label.chars().count() as u32 + 24
    }
}

/// The entries' positions, left to right and wrapped at the plot's width: (x, row).
fn legend_layout(entries: &[LegendEntry]) -> Vec<(u32, u32)> {
    let (mut x, mut row) = (12, 0);
    let mut at = Vec::with_capacity(entries.len());
    for entry in entries {
        if x > 12 && x + entry.width_px() > PLOT_SIZE_PX.0 {
            (x, row) = (12, row + 1);
        }
        at.push((x, row));
        x += entry.width_px();
    }
    at
}

/// A drawing area of the SVG backend.
type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A white drawing of the plot's size with room below for `legend`'s rows: (plot, legend).
fn canvas<'a>(svg: &'a mut String, legend: &[LegendEntry]) -> Result<(Area<'a>, Area<'a>), String> {
    let rows = legend_layout(legend).last().map_or(0, |&(_, row)| row + 1);
    let height = PLOT_SIZE_PX.1 + rows * LEGEND_ROW_PX + if rows > 0 { 10 } else { 0 };
    let root = SVGBackend::with_string(svg, (PLOT_SIZE_PX.0, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    Ok(root.split_vertically(PLOT_SIZE_PX.1))
}

/// The legend under the plot, outside the data.
fn draw_legend(area: &Area<'_>, entries: &[LegendEntry]) -> Result<(), String> {
    let style = TextStyle::from(("sans-serif", LEGEND_FONT_PX).into_font()).pos(
        plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Left,
            plotters::style::text_anchor::VPos::Center,
        ),
    );
    for (entry, (x, row)) in entries.iter().zip(legend_layout(entries)) {
        let (x, y) = (x as i32, (row * LEGEND_ROW_PX + LEGEND_ROW_PX / 2) as i32);
        let stroke = entry.colour.stroke_width(3);
        let drawn = match entry.mark {
            Mark::Line => area.draw(&PathElement::new(vec![(x, y), (x + 30, y)], stroke)),
            Mark::Dashed => {
                area.draw(&PathElement::new(vec![(x, y), (x + 12, y)], stroke)).and_then(|()| {
                    area.draw(&PathElement::new(vec![(x + 18, y), (x + 30, y)], stroke))
                })
            }
            Mark::Bar => {
                area.draw(&Rectangle::new([(x + 4, y - 7), (x + 26, y + 7)], entry.colour.filled()))
            }
        };
        drawn.map_err(|e| e.to_string())?;
        let text = Text::new(entry.label.clone(), (x + 40, y), style.clone());
        area.draw(&text).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Whether the positive finite values span [`LOG_SPAN_MIN`] or more (and none is ≤ 0).
fn spans_decades(values: impl Iterator<Item = f64>) -> bool {
    let values: Vec<f64> = values.filter(|v| v.is_finite()).collect();
    if values.iter().any(|&v| v <= 0.0) {
        return false;
    }
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    low.is_finite() && high / low >= LOG_SPAN_MIN
}

/// The axis's data range: linear from 0 (or the minimum, if negative) to 5% over the
/// maximum; log from the decade at or below the minimum to the decade at or above the maximum.
fn axis_range(scale: Scale, values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (low, high) = values
        .filter(|v| v.is_finite() && (scale == Scale::Linear || *v > 0.0))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    match scale {
        _ if low > high => {
            if scale == Scale::Linear {
                (0.0, 1.0)
            } else {
                (1.0, 10.0)
            }
        }
        Scale::Linear => {
            let low = low.min(0.0);
            let high = if high > low { high * 1.05 } else { low + 1.0 };
            (low, high)
        }
        Scale::Log10 | Scale::Percentile => {
            let low = 10f64.powf(low.log10().floor());
            let high = 10f64.powf(high.log10().ceil()).max(low * 10.0);
            (low, high)
        }
    }
}

/// Short tick label: up to 4 significant digits, no trailing zeros, k/M suffixes; on a
/// percentile axis the percentile that 1/(1−p) = v stands for.
fn tick_label(scale: Scale, v: f64) -> String {
    if scale == Scale::Percentile {
        let percent = 100.0 * (1.0 - 1.0 / v);
        let text = format!("{percent:.4}");
        return format!("{}%", text.trim_end_matches('0').trim_end_matches('.'));
    }
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

/// A plot that could not be drawn still says so where the plot would be.
fn error_svg(title: &str, error: &str) -> String {
    let escape = |t: &str| t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"60\">\
         <text x=\"10\" y=\"30\">{}: plot failed: {}</text></svg>\n",
        escape(title),
        escape(error)
    )
}

/// Bars: segments for the categories' bars and gaps, the value on a linear axis.
type BarCoordinates = Cartesian2d<
    plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordu32>,
    plotters::coord::types::RangedCoordf64,
>;

/// A grouped bar chart: one group of bars per category, one bar colour per named group.
#[derive(Clone, Debug, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub y_label: String,
    pub categories: Vec<String>,
    /// (label, one value per category).
    pub groups: Vec<(String, Vec<f64>)>,
    /// Per group, per category: the (low, high) whisker drawn over the bar.
    pub ranges: Vec<Vec<Option<(f64, f64)>>>,
    pub limit: Option<Limit>,
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
            ranges: Vec::new(),
            limit: None,
        }
    }

    /// Adds one bar per category; missing values are left out, non-finite ones drawn as 0.
    pub fn group(self, label: &str, values: Vec<f64>) -> Self {
        let ranges = vec![None; values.len()];
        self.group_with_ranges(label, values, ranges)
    }

    /// Adds one bar per category with a low–high whisker (e.g. the range over repeats).
    pub fn group_with_ranges(
        mut self,
        label: &str,
        values: Vec<f64>,
        ranges: Vec<Option<(f64, f64)>>,
    ) -> Self {
        self.groups.push((label.into(), values));
        self.ranges.push(ranges);
        self
    }

    /// Adds a horizontal limit line at `y`.
    pub fn limit(mut self, label: &str, y: f64) -> Self {
        self.limit = Some(Limit { label: label.into(), y });
        self
    }

    /// Renders the chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        self.draw().unwrap_or_else(|error| error_svg(&self.title, &error))
    }

    /// Segments per category: one per group and one gap.
    fn slots(&self) -> usize {
        self.groups.len().max(1) + 1
    }

    /// Every bar, whisker end and limit that has a value.
    fn values(&self) -> impl Iterator<Item = f64> + '_ {
        let values = self.groups.iter().flat_map(|(_, values)| values.iter().copied());
        let whiskers = self.ranges.iter().flatten().flatten().flat_map(|r| [r.0, r.1]);
        let limit = self.limit.iter().map(|l| l.y);
        values.chain(whiskers).chain(limit).filter(|v| v.is_finite())
    }

    /// Whether the y axis is logarithmic: the positive values span [`LOG_SPAN_MIN`] or more
    /// (on a linear axis the small bars would vanish beside the large).
    fn log_axis(&self) -> bool {
        spans_decades(self.values().filter(|v| *v > 0.0))
    }

    /// Where a value is drawn: itself, or its log10 on a log axis (whose ticks then name the
    /// powers of ten); a non-positive value on a log axis sits at the axis' base.
    fn y_of(&self, value: f64, log: bool, base: f64) -> f64 {
        match (log, value.is_finite()) {
            (_, false) => base,
            (false, true) => value,
            (true, true) if value > 0.0 => value.log10(),
            (true, true) => base,
        }
    }

    fn y_range(&self, log: bool) -> (f64, f64) {
        if log {
            let positive = self.values().filter(|v| *v > 0.0);
            let (low, high) =
                positive.fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
            return (low.log10().floor(), high.log10().ceil().max(low.log10().floor() + 1.0));
        }
        let high = self.values().fold(0.0, f64::max);
        (0.0, if high > 0.0 { high * 1.1 } else { 1.0 })
    }

    /// The label under a segment: the category's name under its middle bar, else nothing.
    fn segment_label(&self, segment: &SegmentValue<u32>) -> String {
        let slots = self.slots() as u32;
        match segment {
            SegmentValue::CenterOf(index) if index % slots == (slots - 1) / 2 => {
                self.categories.get((index / slots) as usize).cloned().unwrap_or_default()
            }
            _ => String::new(),
        }
    }

    fn draw(&self) -> Result<String, String> {
        let slots = self.slots() as u32;
        let segments = (self.categories.len().max(1) as u32) * slots;
        let log = self.log_axis();
        let y = self.y_range(log);
        let mut legend: Vec<LegendEntry> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, (label, _))| LegendEntry::new(label, PALETTE[i % PALETTE.len()], Mark::Bar))
            .collect();
        legend.extend(
            self.limit.iter().map(|l| LegendEntry::new(&l.label, LIMIT_COLOUR, Mark::Line)),
        );
        let y_label =
            if log { format!("{} (log scale)", self.y_label) } else { self.y_label.clone() };
        let mut svg = String::new();
        {
            let (root, legend_area) = canvas(&mut svg, &legend)?;
            let mut chart = chart_builder(&root, &self.title)
                .build_cartesian_2d((0..segments).into_segmented(), y.0..y.1)
                .map_err(|e| e.to_string())?;
            let x_format = |segment: &SegmentValue<u32>| self.segment_label(segment);
            let y_format =
                |v: &f64| tick_label(Scale::Linear, if log { 10f64.powf(*v) } else { *v });
            // On a log axis one tick per power of ten.
            let y_ticks = if log { (y.1 - y.0) as usize + 1 } else { 10 };
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(segments as usize)
                .y_labels(y_ticks)
                .x_label_formatter(&x_format)
                .y_label_formatter(&y_format)
                .y_desc(y_label.as_str())
                .label_style(("sans-serif", TICK_FONT_PX))
                .axis_desc_style(("sans-serif", AXIS_FONT_PX))
                .light_line_style(RGBColor(238, 238, 238))
                .draw()
                .map_err(|e| e.to_string())?;
            self.draw_bars(&mut chart, log, y.0)?;
            if let Some(limit) = &self.limit {
                let at = self.y_of(limit.y, log, y.0);
                let ends = [(SegmentValue::Exact(0), at), (SegmentValue::Last, at)];
                chart
                    .draw_series(LineSeries::new(ends, LIMIT_COLOUR.stroke_width(2)))
                    .map_err(|e| e.to_string())?;
            }
            draw_legend(&legend_area, &legend)?;
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }

    fn draw_bars<'a>(
        &self,
        chart: &mut ChartContext<'a, SVGBackend<'a>, BarCoordinates>,
        log: bool,
        base: f64,
    ) -> Result<(), String> {
        let slots = self.slots() as u32;
        for (group_index, ((_, values), ranges)) in self.groups.iter().zip(&self.ranges).enumerate()
        {
            let colour = PALETTE[group_index % PALETTE.len()];
            let at = |category: usize| category as u32 * slots + group_index as u32;
            let bars = values.iter().enumerate().map(|(category, &value)| {
                let corners = [
                    (SegmentValue::Exact(at(category)), base),
                    (SegmentValue::Exact(at(category) + 1), self.y_of(value, log, base)),
                ];
                Rectangle::new(corners, colour.filled())
            });
            chart.draw_series(bars).map_err(|e| e.to_string())?;
            let whiskers = ranges.iter().enumerate().filter_map(|(category, range)| {
                let (low, high) = (*range)?;
                let (low, high) = (self.y_of(low, log, base), self.y_of(high, log, base));
                let middle = SegmentValue::CenterOf(at(category));
                Some(PathElement::new(
                    vec![(middle.clone(), low), (middle, high)],
                    BLACK.stroke_width(2),
                ))
            });
            chart.draw_series(whiskers).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Latency against the percentile, one line per histogram: x is the percentile on a log
/// `1/(1−p)` axis (so 90%, 99%, 99.9% are evenly spaced), y the latency in µs (log).
pub fn latency_percentile_plot(title: &str, series: &[(&str, &LatencyHistogram)]) -> LinePlot {
    let mut plot =
        LinePlot::new(title, "percentile (log scale of 1/(1−p))", "latency (µs)").y_log();
    plot.x_scale = Scale::Percentile;
    for (label, histogram) in series {
        plot = plot.series(label, percentile_points(histogram));
    }
    plot
}

/// (1/(1−p), latency µs) at 0, 50, 75, 87.5, … percent (halving the distance to 100% each step,
/// several points per halving), up to the largest p the count supports, then the maximum.
fn percentile_points(histogram: &LatencyHistogram) -> Vec<(f64, f64)> {
    if histogram.is_empty() {
        return Vec::new();
    }
    let count = histogram.count() as f64;
    let top = (1.0 - 1.0 / count).min(1.0 - 10f64.powi(-PERCENTILE_DECADES_MAX));
    let mut points = Vec::new();
    let mut inverse_tail = 1.0_f64;
    while 1.0 - 1.0 / inverse_tail <= top {
        let percentile = 100.0 * (1.0 - 1.0 / inverse_tail);
        let latency_us = histogram.value_at_percentile_ns(percentile) as f64 / 1_000.0;
        points.push((inverse_tail, latency_us));
        inverse_tail *= 10f64.powf(0.1);
    }
    points.push((1.0 / (1.0 - top), histogram.max_ns() as f64 / 1_000.0));
    points
}

/// Throughput over time, one line per run: x is seconds since the measured window opened (the
/// end of each interval), y the completions of that interval per second.
pub fn throughput_over_time_plot(title: &str, series: &[(&str, &ThroughputSeries)]) -> LinePlot {
    let mut plot =
        LinePlot::new(title, "time in the measured window (s)", "throughput (completions/s)");
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

#[cfg(test)]
mod tests {
    use super::*;

    fn count(svg: &str, needle: &str) -> usize {
        svg.matches(needle).count()
    }

    #[test]
    fn line_plot_has_labels_series_and_a_limit_line() {
        let svg = LinePlot::new("p99 <vs> rate", "rate (msg/s)", "p99 (µs)")
            .series("1 sender", vec![(20_000.0, 12.0), (40_000.0, 15.0), (60_000.0, 40.0)])
            .series("2 senders", vec![(20_000.0, 10.0), (f64::NAN, 1.0)])
            .limit("p99 limit 30 µs", 30.0)
            .to_svg();
        assert!(svg.starts_with("<svg"), "{svg}");
        for text in ["1 sender", "2 senders", "rate (msg/s)", "p99 (µs)", "p99 limit 30 µs", "60k"]
        {
            assert!(svg.contains(text), "missing {text}");
        }
        assert!(svg.contains("p99 &lt;vs&gt; rate"), "the title is escaped");
        assert!(!svg.contains("NaN"));
        assert_eq!(count(&svg, "<circle"), 4, "one marker per drawable point");
    }

    #[test]
    fn percentile_plot_spaces_the_tail_by_decades() {
        let samples: Vec<u64> = (1..=10_000).map(|i| i * 100).collect();
        let latency = LatencyHistogram::from_samples_ns(&samples);
        let plot = latency_percentile_plot("tail", &[("20K msg/s", &latency)]);
        let points = &plot.series[0].points;
        assert_eq!(points[0], (1.0, latency.value_at_percentile_ns(0.0) as f64 / 1_000.0));
        assert_eq!(points.last().unwrap().1, latency.max_ns() as f64 / 1_000.0);
        assert!(points.iter().any(|p| (p.0 - 100.0).abs() < 1e-6), "a point at 99%");
        let svg = plot.to_svg();
        for tick in ["90%", "99%", "99.9%", "latency (µs)", "20K msg/s"] {
            assert!(svg.contains(tick), "missing {tick}");
        }
    }

    #[test]
    fn bar_chart_draws_one_bar_per_value_with_whiskers() {
        let chart = BarChart::new("Max rate", "rate (msg/s)", ["volatile", "durable"])
            .group_with_ranges(
                "median of 3",
                vec![1_000.0, 3_000.0],
                vec![Some((900.0, 1_100.0)), None],
            )
            .limit("published 60K", 2_500.0);
        let svg = chart.to_svg();
        for text in ["volatile", "durable", "median of 3", "rate (msg/s)", "published 60K"] {
            assert!(svg.contains(text), "missing {text}");
        }
        // Background, 2 bars, a legend swatch and the legend box.
        assert!(count(&svg, "<rect") >= 4, "{svg}");
    }

    #[test]
    fn empty_plots_still_render() {
        assert!(LinePlot::new("empty", "x", "y").x_log().to_svg().starts_with("<svg"));
        assert!(BarChart::new("empty", "y", Vec::<String>::new()).to_svg().starts_with("<svg"));
        let none = latency_percentile_plot("none", &[("empty", &LatencyHistogram::new())]);
        assert!(none.to_svg().starts_with("<svg"));
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(tick_label(Scale::Linear, 2.5), "2.5");
        assert_eq!(tick_label(Scale::Linear, 60_000.0), "60k");
        assert_eq!(tick_label(Scale::Log10, 1_500_000.0), "1.5M");
        assert_eq!(tick_label(Scale::Linear, -0.0), "0");
        assert_eq!(tick_label(Scale::Percentile, 1_000.0), "99.9%");
        assert_eq!(tick_label(Scale::Percentile, 1.0), "0%");
    }

    #[test]
    fn bars_spanning_decades_get_a_log_axis_and_small_bars_stay_visible() {
        let chart = BarChart::new("I/O", "p50 (µs)", ["20K", "40K"])
            .group("sync", vec![170_000.0, 150_000.0])
            .group("group", vec![12.0, 15.0])
            .group("off", vec![3.0, 4.0]);
        assert!(chart.log_axis());
        let svg = chart.to_svg();
        assert!(svg.contains("p50 (µs) (log scale)"), "the axis says so");
        for tick in ["1", "10", "100", "1000", "10k", "100k", "1M"] {
            assert!(
                svg.contains(&format!(">\n{tick}\n</text>")),
                "a tick per decade: missing {tick}"
            );
        }
        // Within one decade the axis stays linear.
        let near = BarChart::new("t", "y", ["a"]).group("g", vec![10.0]).group("h", vec![50.0]);
        assert!(!near.log_axis());
        assert!(!near.to_svg().contains("log scale"));
        // A line plot spanning decades too; one with a zero stays linear.
        let lines =
            LinePlot::new("l", "x", "latency (µs)").series("s", vec![(1.0, 2.0), (2.0, 5_000.0)]);
        assert!(lines.to_svg().contains("latency (µs) (log scale)"));
        let zero = LinePlot::new("l", "x", "y").series("s", vec![(1.0, 0.0), (2.0, 5_000.0)]);
        assert!(!zero.to_svg().contains("log scale"));
    }

    /// The y coordinate of the first `<text …>` element holding `text`.
    fn text_y(svg: &str, text: &str) -> f64 {
        let end = svg.find(&format!(">\n{text}\n<")).unwrap_or_else(|| panic!("no {text}"));
        let start = svg[..end].rfind("<text").unwrap();
        let y = svg[start..end].split(" y=\"").nth(1).unwrap().split('"').next().unwrap();
        y.parse().unwrap()
    }

    #[test]
    fn the_legend_sits_below_the_data_and_wraps() {
        let mut plot = LinePlot::new("p", "x (s)", "y (µs)");
        for i in 0..8 {
            plot = plot.series(
                &format!("a fairly long series name number {i}"),
                vec![(1.0, 1.0), (2.0, 3.0)],
            );
        }
        let svg = plot.to_svg();
        let height: f64 =
            svg.split("height=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        assert!(
            height > f64::from(PLOT_SIZE_PX.1) + f64::from(LEGEND_ROW_PX),
            "rows added: {height}"
        );
        let first = text_y(&svg, "a fairly long series name number 0");
        let last = text_y(&svg, "a fairly long series name number 7");
        assert!(first > f64::from(PLOT_SIZE_PX.1), "below the plot area: {first}");
        assert!(last > first, "wrapped onto another row");
        let legend_px = f64::from(LEGEND_FONT_PX) / 1.24;
        assert!(
            legend_px >= 14.0 && svg.contains(&format!("font-size=\"{legend_px:.1}")),
            "legend font"
        );
    }
}
