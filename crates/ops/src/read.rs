//! Counters and gauges read at scrape time: a server keeps the atomics it already has (its
//! hot path unchanged) and registers a function that reads one.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! let sent = Arc::new(AtomicU64::new(3));
//! let mut registry = ops::Registry::default();
//! let read = Arc::clone(&sent);
//! registry.register("sent", "messages sent", ops::read::counter(move || read.load(Ordering::Relaxed)));
//! let page = ops::endpoint::render(&registry);
//! assert!(page.contains("sent_total 3"), "{page}");
//! ```

use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;

type Read<T> = Arc<dyn Fn() -> T + Send + Sync>;

/// A counter whose value a function reads at scrape time.
#[derive(Clone)]
pub struct ReadCounter(Read<u64>);

/// A gauge whose value a function reads at scrape time.
#[derive(Clone)]
pub struct ReadGauge(Read<i64>);

/// A counter read by `read` (which must never decrease).
pub fn counter(read: impl Fn() -> u64 + Send + Sync + 'static) -> ReadCounter {
    ReadCounter(Arc::new(read))
}

/// A gauge read by `read`.
pub fn gauge(read: impl Fn() -> i64 + Send + Sync + 'static) -> ReadGauge {
    ReadGauge(Arc::new(read))
}

impl std::fmt::Debug for ReadCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadCounter")
    }
}

impl std::fmt::Debug for ReadGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadGauge")
    }
}

impl EncodeMetric for ReadCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&(self.0)(), None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

impl EncodeMetric for ReadGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&(self.0)())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Gauge
    }
}
