//! Latency histograms in nanoseconds: recording, merging, percentiles up to the maximum,
//! the standard summary, cumulative buckets and CDF points; and the median of a few values.
//!
//! Latencies are recorded into an HDR histogram ([`LatencyHistogram`]: 1 ns to 1 hour,
//! 3 significant digits, so every reported percentile is within 0.1% of the true value, up to
//! and including the maximum). Recording is a few arithmetic operations and one array
//! increment: each thread records into its own histogram and the histograms are
//! [`LatencyHistogram::merge`]d off the measured path.
//!
//! ```
//! use stats::LatencyHistogram;
//!
//! let mut latency = LatencyHistogram::new();
//! for ns in [12_000, 15_000, 9_000, 250_000] {
//!     latency.record_ns(ns);
//! }
//! let summary = latency.summary();
//! assert_eq!(summary.count, 4);
//! assert!(summary.max_ns >= 250_000);
//! // Cumulative % of requests within 10 µs buckets: 0-10 µs, 10-20 µs, ...
//! let buckets = latency.cumulative_buckets(10_000, 5);
//! assert_eq!(buckets[0].cumulative_percent, 25.0);
//! ```

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Smallest latency the histogram distinguishes from zero.
pub const LATENCY_NS_LOWEST: u64 = 1;
/// Largest latency the histogram tracks; larger values are clamped to it and counted in
/// [`LatencyHistogram::clamped_count`], so a stall is never silently lost.
pub const LATENCY_NS_HIGHEST: u64 = 3_600_000_000_000;
/// Significant decimal digits kept by every latency histogram (0.1% relative precision).
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// The percentiles every latency table of leantier shows, up to the maximum.
pub const STANDARD_PERCENTILES: [f64; 8] = [50.0, 90.0, 93.0, 95.0, 96.0, 99.0, 99.9, 99.99];

/// An HDR histogram of latencies in nanoseconds (1 ns .. 1 h, 3 significant digits).
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    histogram: Histogram<u64>,
    clamped_count: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram; allocates its counts array once (about 200 KiB).
    pub fn new() -> Self {
        let histogram = Histogram::new_with_bounds(
            LATENCY_NS_LOWEST,
            LATENCY_NS_HIGHEST,
            LATENCY_SIGNIFICANT_DIGITS,
        )
        .expect("constant histogram bounds are valid");
        Self { histogram, clamped_count: 0 }
    }

    /// Builds a histogram from raw samples.
    pub fn from_samples_ns(samples_ns: &[u64]) -> Self {
        let mut histogram = Self::new();
        for &latency_ns in samples_ns {
            histogram.record_ns(latency_ns);
        }
        histogram
    }

    /// Records one latency. Values above [`LATENCY_NS_HIGHEST`] are clamped and counted.
    #[inline]
    pub fn record_ns(&mut self, latency_ns: u64) {
        self.record_n_ns(latency_ns, 1);
    }

    /// Records `count` occurrences of one latency.
    #[inline]
    pub fn record_n_ns(&mut self, latency_ns: u64, count: u64) {
        let clamped_ns = latency_ns.min(LATENCY_NS_HIGHEST);
        if clamped_ns != latency_ns {
            self.clamped_count += count;
        }
        // Cannot fail: the value is within the bounds and the counts are u64.
        self.histogram.saturating_record_n(clamped_ns, count);
    }

    /// Records a [`Duration`] (saturating at [`LATENCY_NS_HIGHEST`]).
    #[inline]
    pub fn record_duration(&mut self, latency: Duration) {
        self.record_ns(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Adds every count of `other` to this histogram.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.histogram.add(&other.histogram).expect("histograms share the same bounds");
        self.clamped_count += other.clamped_count;
    }

    /// Empties the histogram, keeping its allocation.
    pub fn reset(&mut self) {
        self.histogram.reset();
        self.clamped_count = 0;
    }

    /// Number of recorded values.
    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.histogram.is_empty()
    }

    /// Number of values that exceeded [`LATENCY_NS_HIGHEST`] and were recorded as it.
    pub fn clamped_count(&self) -> u64 {
        self.clamped_count
    }

    /// Smallest recorded value (0 when empty).
    pub fn min_ns(&self) -> u64 {
        if self.is_empty() { 0 } else { self.histogram.min() }
    }

    /// Largest recorded value, to histogram precision (0 when empty).
    pub fn max_ns(&self) -> u64 {
        self.histogram.max()
    }

    /// Mean of the recorded values (0 when empty).
    pub fn mean_ns(&self) -> f64 {
        self.histogram.mean()
    }

    /// Standard deviation of the recorded values (0 when empty).
    pub fn stdev_ns(&self) -> f64 {
        self.histogram.stdev()
    }

    /// The value at `percentile` (0..=100); 100 gives the maximum.
    pub fn value_at_percentile_ns(&self, percentile: f64) -> u64 {
        self.histogram.value_at_percentile(percentile.clamp(0.0, 100.0))
    }

    /// The values at each of `percentiles` (0..=100), in the given order.
    pub fn percentiles(&self, percentiles: &[f64]) -> Vec<PercentileValue> {
        percentiles
            .iter()
            .map(|&percentile| PercentileValue {
                percentile,
                value_ns: self.value_at_percentile_ns(percentile),
            })
            .collect()
    }

    /// The standard summary: count, min, mean, p50 .. p99.99 and max.
    pub fn summary(&self) -> LatencySummary {
        let at = |percentile| self.value_at_percentile_ns(percentile);
        LatencySummary {
            count: self.count(),
            min_ns: self.min_ns(),
            mean_ns: self.mean_ns(),
            p50_ns: at(50.0),
            p90_ns: at(90.0),
            p93_ns: at(93.0),
            p95_ns: at(95.0),
            p96_ns: at(96.0),
            p99_ns: at(99.0),
            p99_9_ns: at(99.9),
            p99_99_ns: at(99.99),
            max_ns: self.max_ns(),
        }
    }

    /// Cumulative % of values within consecutive buckets of `width_ns`: bucket `i` covers
    /// latencies in `(i·width, (i+1)·width]` (bucket 0 includes 0), e.g. with 10 µs: 0-10 µs,
    /// 10-20 µs, ... Buckets stop once 100% is reached or after `buckets_max` buckets; values
    /// beyond the last bucket are gathered into a final bucket with `upper_ns: None`.
    ///
    /// Each value is placed by the highest value HDR considers equivalent to it (within 0.1%),
    /// so a latency is never reported in a bucket below the one it belongs to; a value within
    /// 0.1% below a bucket boundary may be counted in the next bucket.
    pub fn cumulative_buckets(&self, width_ns: u64, buckets_max: usize) -> Vec<CumulativeBucket> {
        let total = self.count();
        if total == 0 || width_ns == 0 || buckets_max == 0 {
            return Vec::new();
        }
        let mut counts = vec![0_u64; buckets_max];
        let mut overflow_count = 0;
        for value in self.histogram.iter_recorded() {
            let index = value.value_iterated_to().saturating_sub(1) / width_ns;
            match counts.get_mut(usize::try_from(index).unwrap_or(usize::MAX)) {
                Some(count) => *count += value.count_at_value(),
                None => overflow_count += value.count_at_value(),
            }
        }
        let mut buckets = Vec::new();
        let mut cumulative_count = 0;
        for (index, &count) in (0_u64..).zip(counts.iter()) {
            cumulative_count += count;
            buckets.push(CumulativeBucket {
                lower_ns: index * width_ns,
                upper_ns: Some((index + 1) * width_ns),
                count,
                cumulative_count,
                cumulative_percent: percent(cumulative_count, total),
            });
            if cumulative_count == total {
                return buckets;
            }
        }
        buckets.push(CumulativeBucket {
            lower_ns: width_ns * buckets_max as u64,
            upper_ns: None,
            count: overflow_count,
            cumulative_count: total,
            cumulative_percent: 100.0,
        });
        buckets
    }

    /// Points of the empirical CDF: (latency ns, fraction of values ≤ it), one per distinct
    /// recorded HDR bucket, ending at (max, 1.0). For CDF plots.
    pub fn cdf_points(&self) -> Vec<(u64, f64)> {
        let total = self.count() as f64;
        let mut cumulative = 0_u64;
        self.histogram
            .iter_recorded()
            .map(|value| {
                cumulative += value.count_at_value();
                (value.value_iterated_to(), cumulative as f64 / total)
            })
            .collect()
    }

    /// The underlying HDR histogram, for anything this wrapper does not expose.
    pub fn as_hdr(&self) -> &Histogram<u64> {
        &self.histogram
    }
}

fn percent(part: u64, total: u64) -> f64 {
    part as f64 * 100.0 / total as f64
}

/// One percentile and its value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PercentileValue {
    /// In 0..=100.
    pub percentile: f64,
    pub value_ns: u64,
}

/// The standard latency summary of leantier reports (nanoseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub min_ns: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p93_ns: u64,
    pub p95_ns: u64,
    pub p96_ns: u64,
    pub p99_ns: u64,
    pub p99_9_ns: u64,
    pub p99_99_ns: u64,
    pub max_ns: u64,
}

impl LatencySummary {
    /// Column labels matching [`LatencySummary::quantiles_ns`].
    pub const QUANTILE_LABELS: [&'static str; 10] =
        ["min", "p50", "p90", "p93", "p95", "p96", "p99", "p99.9", "p99.99", "max"];

    /// min, p50 .. p99.99, max in the order of [`LatencySummary::QUANTILE_LABELS`].
    pub fn quantiles_ns(&self) -> [u64; 10] {
        [
            self.min_ns,
            self.p50_ns,
            self.p90_ns,
            self.p93_ns,
            self.p95_ns,
            self.p96_ns,
            self.p99_ns,
            self.p99_9_ns,
            self.p99_99_ns,
            self.max_ns,
        ]
    }
}

/// One bucket of [`LatencyHistogram::cumulative_buckets`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CumulativeBucket {
    /// Exclusive lower bound (bucket 0 includes 0).
    pub lower_ns: u64,
    /// Inclusive upper bound; `None` for the final "beyond the last bucket" bucket.
    pub upper_ns: Option<u64>,
    /// Values in this bucket.
    pub count: u64,
    /// Values in this and every lower bucket.
    pub cumulative_count: u64,
    /// `cumulative_count` as a percentage of all values.
    pub cumulative_percent: f64,
}

// ---------------------------------------------------------------------------------------------

/// The median of `values` (the mean of the middle two for an even count); NaN for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 { values[middle] } else { (values[middle - 1] + values[middle]) / 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
        (actual - expected).abs() <= tolerance
    }

    #[test]
    fn summary_of_one_to_ten_thousand_is_exact_within_hdr_precision() {
        let samples: Vec<u64> = (1..=10_000).collect();
        let summary = LatencyHistogram::from_samples_ns(&samples).summary();
        assert_eq!(summary.count, 10_000);
        assert_eq!(summary.min_ns, 1);
        assert!(close(summary.mean_ns, 5_000.5, 5.0), "{}", summary.mean_ns);
        // 3 significant digits: each value is within 0.1% of the exact order statistic.
        for (actual, exact) in [
            (summary.p50_ns, 5_000),
            (summary.p90_ns, 9_000),
            (summary.p93_ns, 9_300),
            (summary.p95_ns, 9_500),
            (summary.p96_ns, 9_600),
            (summary.p99_ns, 9_900),
            (summary.p99_9_ns, 9_990),
            (summary.p99_99_ns, 9_999),
            (summary.max_ns, 10_000),
        ] {
            assert!(
                close(actual as f64, exact as f64, exact as f64 * 0.001),
                "{actual} vs {exact}"
            );
        }
    }

    #[test]
    fn percentiles_of_arbitrary_list_and_maximum() {
        let latency = LatencyHistogram::from_samples_ns(&[100, 200, 300, 400, 1_000_000]);
        let values = latency.percentiles(&[20.0, 80.0, 100.0]);
        assert_eq!(values[0].value_ns, 100);
        assert_eq!(values[1].value_ns, 400);
        assert!(close(values[2].value_ns as f64, 1_000_000.0, 1_000.0));
    }

    #[test]
    fn merge_adds_counts_and_clamping_is_counted() {
        let mut a = LatencyHistogram::from_samples_ns(&[10, 20]);
        let b = LatencyHistogram::from_samples_ns(&[30, u64::MAX]);
        a.merge(&b);
        assert_eq!(a.count(), 4);
        assert_eq!(a.clamped_count(), 1);
        assert!(a.max_ns() >= LATENCY_NS_HIGHEST);
        let empty = LatencyHistogram::new();
        assert_eq!(empty.summary(), LatencySummary::default());
    }

    #[test]
    fn cumulative_buckets_of_ten_microseconds() {
        // 0-10 µs: 2 values, 10-20 µs: 1, 20-30 µs: 0, 30-40 µs: 1.
        let latency = LatencyHistogram::from_samples_ns(&[3_000, 9_990, 15_000, 35_000]);
        let buckets = latency.cumulative_buckets(10_000, 100);
        let percents: Vec<f64> = buckets.iter().map(|b| b.cumulative_percent).collect();
        assert_eq!(percents, vec![50.0, 75.0, 75.0, 100.0]);
        assert_eq!(buckets[1].lower_ns, 10_000);
        assert_eq!(buckets[1].upper_ns, Some(20_000));
        assert_eq!(buckets[3].count, 1);
        // Capped at 2 buckets: the rest is one overflow bucket.
        let capped = latency.cumulative_buckets(10_000, 2);
        assert_eq!(capped.len(), 3);
        assert_eq!(capped[2].upper_ns, None);
        assert_eq!(capped[2].count, 1);
        assert_eq!(capped[2].cumulative_percent, 100.0);
    }

    #[test]
    fn cdf_points_end_at_one() {
        let latency = LatencyHistogram::from_samples_ns(&[5, 5, 7, 9]);
        let points = latency.cdf_points();
        assert_eq!(points, vec![(5, 0.5), (7, 0.75), (9, 1.0)]);
    }
}
