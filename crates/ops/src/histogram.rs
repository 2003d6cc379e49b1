//! A latency histogram with fixed buckets for the hot path: recording is a binary search over
//! the bounds and two relaxed atomic additions (no lock, no allocation), so any thread may
//! record and a scrape on another thread reads a consistent-enough copy (each bucket exact;
//! the sum and count may differ by the recordings under way during the read, which Prometheus
//! tolerates as it does for any scrape racing updates).
//!
//! Buckets, unlike the quantiles of a summary, can be summed over servers and over time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Upper bounds in seconds, from 10 µs (a matching core's service time) to 10 s (a stuck
/// database commit): about three per decade, so any quantile is known within a factor ~2.5.
pub const LATENCY_BUCKETS_SECONDS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds in seconds for a service time of hundreds of nanoseconds (a matching core's,
/// about 200 ns here): from 100 ns to 10 ms, three per decade. With
/// [`LATENCY_BUCKETS_SECONDS`] every such time fell in the first bucket (10 µs) and no
/// quantile could be read.
pub const SERVICE_BUCKETS_SECONDS: [f64; 16] = [
    0.000_000_1,
    0.000_000_25,
    0.000_000_5,
    0.000_001,
    0.000_002_5,
    0.000_005,
    0.000_01,
    0.000_025,
    0.000_05,
    0.000_1,
    0.000_25,
    0.000_5,
    0.001,
    0.002_5,
    0.005,
    0.01,
];

/// A histogram of durations (see the module docs). Clones share the counts.
#[derive(Clone, Debug)]
pub struct BucketHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    bounds_ns: Vec<u64>,
    /// One per bound, plus the overflow bucket (`+Inf`); not cumulative.
    counts: Vec<AtomicU64>,
    sum_ns: AtomicU64,
}

impl Default for BucketHistogram {
    fn default() -> Self {
        BucketHistogram::with_bounds(&LATENCY_BUCKETS_SECONDS)
    }
}

impl BucketHistogram {
    /// A histogram of sub-microsecond service times ([`SERVICE_BUCKETS_SECONDS`]).
    pub fn service_times() -> BucketHistogram {
        BucketHistogram::with_bounds(&SERVICE_BUCKETS_SECONDS)
    }

    /// A histogram with these upper bounds in seconds (ascending).
    pub fn with_bounds(bounds_seconds: &[f64]) -> BucketHistogram {
        let bounds_ns: Vec<u64> = bounds_seconds.iter().map(|s| (s * 1e9).round() as u64).collect();
        assert!(bounds_ns.windows(2).all(|w| w[0] < w[1]), "bucket bounds must ascend");
        let counts = (0..=bounds_ns.len()).map(|_| AtomicU64::new(0)).collect();
        BucketHistogram { inner: Arc::new(Inner { bounds_ns, counts, sum_ns: AtomicU64::new(0) }) }
    }

    /// Records one duration in nanoseconds.
    pub fn record_ns(&self, ns: u64) {
        let inner = &*self.inner;
        let bucket = inner.bounds_ns.partition_point(|&bound| bound < ns);
        // Relaxed: statistics, read after the fact; they order no other memory.
        inner.counts[bucket].fetch_add(1, Ordering::Relaxed);
        inner.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Records the time since `start`.
    pub fn record_since(&self, start: std::time::Instant) {
        self.record_ns(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }

    /// Durations recorded so far.
    pub fn count(&self) -> u64 {
        self.inner.counts.iter().map(|count| count.load(Ordering::Relaxed)).sum()
    }
}

impl EncodeMetric for BucketHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let counts: Vec<u64> = inner.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let bounds = inner.bounds_ns.iter().map(|&ns| ns as f64 / 1e9).chain([f64::INFINITY]);
        // The encoder sums the buckets itself (Prometheus' are cumulative).
        let buckets: Vec<(f64, u64)> = bounds.zip(counts.iter().copied()).collect();
        let sum = inner.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_lands_in_the_first_bucket_whose_bound_holds_it() {
        let histogram = BucketHistogram::with_bounds(&[0.001, 0.01]);
        for ns in [1_000_000, 1_000_001, 20_000_000, 5] {
            histogram.record_ns(ns);
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("wait_seconds", "a wait", histogram.clone());
        let page = crate::endpoint::render(&registry);
        for line in [
            "wait_seconds_bucket{le=\"0.001\"} 2",
            "wait_seconds_bucket{le=\"0.01\"} 3",
            "wait_seconds_bucket{le=\"+Inf\"} 4",
            "wait_seconds_count 4",
        ] {
            assert!(page.lines().any(|l| l == line), "{line:?} missing from\n{page}");
        }
        assert_eq!(histogram.count(), 4);
    }

    #[test]
    fn service_times_of_hundreds_of_nanoseconds_spread_over_buckets() {
        let histogram = BucketHistogram::service_times();
        for ns in [150, 200, 400, 900] {
            histogram.record_ns(ns);
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("service_seconds", "a service time", histogram.clone());
        let page = crate::endpoint::render(&registry);
        for line in [
            "service_seconds_bucket{le=\"1e-07\"} 0",
            "service_seconds_bucket{le=\"2.5e-07\"} 2",
            "service_seconds_bucket{le=\"5e-07\"} 3",
            "service_seconds_bucket{le=\"1e-06\"} 4",
        ] {
            assert!(page.lines().any(|l| l == line), "{line:?} missing from\n{page}");
        }
    }
}
