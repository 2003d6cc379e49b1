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
use crate::stats::LatencyHistogram;

const PLOT_SIZE_PX: (u32, u32) = (900, 480);
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

    /// Renders the plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
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
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, PLOT_SIZE_PX).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
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
                .light_line_style(RGBColor(238, 238, 238))
                .draw()
                .map_err(|e| e.to_string())?;
            for (index, (label, points)) in self.series.iter().enumerate() {
                let colour = PALETTE[index % PALETTE.len()];
                let line = LineSeries::new(points.iter().copied(), colour.stroke_width(2));
                chart
                    .draw_series(line)
                    .map_err(|e| e.to_string())?
                    .label(*label)
                    .legend(move |(x, y)| legend_mark(x, y, colour));
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
                    .map_err(|e| e.to_string())?
                    .label(limit.label.as_str())
                    .legend(|(x, y)| legend_mark(x, y, LIMIT_COLOUR));
            }
            draw_legend(&mut chart)?;
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
        .caption(title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(78);
    builder
}

fn legend_mark(x: i32, y: i32, colour: RGBColor) -> PathElement<(i32, i32)> {
    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
}

fn draw_legend<'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()
        .map_err(|e| e.to_string())
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

    fn y_range(&self) -> (f64, f64) {
        let finite = |v: &f64| v.is_finite();
        let values = self.groups.iter().flat_map(|(_, values)| values.iter().copied());
        let whiskers = self.ranges.iter().flatten().flatten().map(|r| r.1);
        let limit = self.limit.iter().map(|l| l.y);
        let high = values.chain(whiskers).chain(limit).filter(finite).fold(0.0, f64::max);
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
        let y = self.y_range();
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, PLOT_SIZE_PX).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let mut chart = chart_builder(&root, &self.title)
                .build_cartesian_2d((0..segments).into_segmented(), y.0..y.1)
                .map_err(|e| e.to_string())?;
            let x_format = |segment: &SegmentValue<u32>| self.segment_label(segment);
            let y_format = |v: &f64| tick_label(Scale::Linear, *v);
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(segments as usize)
                .x_label_formatter(&x_format)
                .y_label_formatter(&y_format)
                .y_desc(self.y_label.as_str())
                .light_line_style(RGBColor(238, 238, 238))
                .draw()
                .map_err(|e| e.to_string())?;
            self.draw_bars(&mut chart)?;
            if let Some(limit) = &self.limit {
                let ends = [(SegmentValue::Exact(0), limit.y), (SegmentValue::Last, limit.y)];
                chart
                    .draw_series(LineSeries::new(ends, LIMIT_COLOUR.stroke_width(2)))
                    .map_err(|e| e.to_string())?
                    .label(limit.label.as_str())
                    .legend(|(x, y)| legend_mark(x, y, LIMIT_COLOUR));
            }
            draw_legend(&mut chart)?;
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }

    fn draw_bars<'a>(
        &self,
        chart: &mut ChartContext<'a, SVGBackend<'a>, BarCoordinates>,
    ) -> Result<(), String> {
        let slots = self.slots() as u32;
        for (group_index, ((label, values), ranges)) in
            self.groups.iter().zip(&self.ranges).enumerate()
        {
            let colour = PALETTE[group_index % PALETTE.len()];
            let at = |category: usize| category as u32 * slots + group_index as u32;
            let bars = values.iter().enumerate().map(|(category, &value)| {
                let value = if value.is_finite() { value } else { 0.0 };
                let corners = [
                    (SegmentValue::Exact(at(category)), 0.0),
                    (SegmentValue::Exact(at(category) + 1), value),
                ];
                Rectangle::new(corners, colour.filled())
            });
            chart.draw_series(bars).map_err(|e| e.to_string())?.label(label.as_str()).legend(
                move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], colour.filled()),
            );
            let whiskers = ranges.iter().enumerate().filter_map(|(category, range)| {
                let (low, high) = (*range)?;
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
}
