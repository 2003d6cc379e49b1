//! Per-stage metrics recorded per worker thread and merged off the hot path.
//!
//! Every worker owns a [`Recorder`]: plain counters and HDR histograms that only that thread
//! touches, so recording a message costs a few non-atomic adds and histogram increments, with
//! no shared cache line and no atomic read-modify-write. Workers hand their data to a
//! [`StageMetricsHub`] at most every [`PUBLISH_INTERVAL_NS`] by *swapping* their recorder for a
//! cleared spare (`try_lock` on the worker's mailbox, an O(1) pointer swap, never a wait);
//! whoever asks for a [`StageMetrics`] snapshot merges the filled recorders into the stage
//! totals on its own thread and returns the cleared ones as spares. A worker whose mailbox is
//! still full simply keeps recording and tries again at the next interval, so nothing is lost.
//!
//! Live snapshots therefore lag by up to the publish interval for busy workers (a parked worker
//! publishes when it wakes); the snapshot taken after the workers have exited is exact, because
//! every worker publishes unconditionally when it finishes.
//!
//! Time comes from [`now_ns`]: `Instant`, i.e. `clock_gettime(CLOCK_MONOTONIC)` through the
//! vDSO (about 20 ns, no system call), as nanoseconds since a process-wide epoch so that stamps
//! taken on different threads compare directly.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::Instant;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Largest latency a histogram resolves; larger values are clamped (one minute).
pub const LATENCY_NS_MAX: u64 = 60_000_000_000;
/// Largest queue depth recorded; covers the largest ring (`ring::CAPACITY_SLOTS_MAX`).
pub const QUEUE_DEPTH_MAX: u64 = 1 << 24;
/// Histogram precision: 3 significant digits (0.1% relative error).
pub const SIGNIFICANT_DIGITS: u8 = 3;
/// How often a busy worker offers its recorder to the hub (100 ms).
pub const PUBLISH_INTERVAL_NS: u64 = 100_000_000;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Monotonic nanoseconds since a process-wide epoch (vDSO `clock_gettime`, no system call).
#[inline]
pub fn now_ns() -> u64 {
    // u64 nanoseconds cover 584 years of uptime; the cast cannot truncate in practice.
    epoch().elapsed().as_nanos() as u64
}

/// `at` on the clock of [`now_ns`], without reading the clock: stamps a time already known, such
/// as an open-loop schedule's intended send time. An instant before the epoch (the first
/// `now_ns` or `instant_ns` call of the process) maps to 0.
#[inline]
pub fn instant_ns(at: Instant) -> u64 {
    at.saturating_duration_since(epoch()).as_nanos() as u64
}

fn histogram(high: u64) -> Histogram<u64> {
    Histogram::new_with_bounds(1, high, SIGNIFICANT_DIGITS)
        .expect("constant bounds 1..high with 3 significant digits are valid")
}

/// One worker's measurements since its last publish.
#[derive(Clone, Debug)]
pub struct Recorder {
    /// Messages handed to the handler.
    pub messages_in: u64,
    /// Messages the handler emitted.
    pub messages_out: u64,
    /// Time spent inside handlers.
    pub busy_ns: u64,
    /// Wall time covered by this recorder (busy + idle).
    pub elapsed_ns: u64,
    /// Handler time per message.
    pub service_ns: Histogram<u64>,
    /// Time from the upstream's publish to the start of handling (queueing + hand-off).
    pub hop_latency_ns: Histogram<u64>,
    /// Time from ingress to the end of handling, recorded by stages with no downstream.
    pub end_to_end_ns: Histogram<u64>,
    /// Input queue depth, sampled every [`crate::stage::DEPTH_SAMPLE_EVERY_ROUNDS`]th read round.
    pub queue_depth: Histogram<u64>,
    span_start_ns: u64,
}

impl Recorder {
    /// A recorder whose span starts now. Allocates its histograms: call at start-up only.
    pub fn new() -> Recorder {
        Recorder {
            messages_in: 0,
            messages_out: 0,
            busy_ns: 0,
            elapsed_ns: 0,
            service_ns: histogram(LATENCY_NS_MAX),
            hop_latency_ns: histogram(LATENCY_NS_MAX),
            end_to_end_ns: histogram(LATENCY_NS_MAX),
            queue_depth: histogram(QUEUE_DEPTH_MAX),
            span_start_ns: now_ns(),
        }
    }

    /// A batch of `count` messages handled in `busy_ns`: each is recorded with the batch's
    /// mean service time and the hop latency of its oldest message (an upper bound for the
    /// rest), so a batch costs two histogram updates, not two per message. Values out of
    /// range are clamped, never rejected.
    #[inline]
    pub fn record_batch(&mut self, count: u64, busy_ns: u64, oldest_hop_latency_ns: u64) {
        if count == 0 {
            return;
        }
        self.messages_in += count;
        self.busy_ns += busy_ns;
        self.service_ns.saturating_record_n(busy_ns / count, count);
        self.hop_latency_ns.saturating_record_n(oldest_hop_latency_ns, count);
    }

    /// Ingress-to-done latency of a message leaving the pipeline.
    #[inline]
    pub fn record_end_to_end(&mut self, latency_ns: u64) {
        self.end_to_end_ns.saturating_record(latency_ns);
    }

    /// Records one sample of an inbound ring's depth, in slots.
    #[inline]
    pub fn record_queue_depth(&mut self, depth_slots: u64) {
        self.queue_depth.saturating_record(depth_slots);
    }

    /// Counts `count` messages emitted downstream.
    #[inline]
    pub fn add_messages_out(&mut self, count: u64) {
        self.messages_out += count;
    }

    /// Adds handler time, in ns.
    #[inline]
    pub fn add_busy_ns(&mut self, busy_ns: u64) {
        self.busy_ns += busy_ns;
    }

    /// Adds `other` into `self` (histograms of one configuration cannot overflow each other).
    pub fn merge(&mut self, other: &Recorder) {
        self.messages_in += other.messages_in;
        self.messages_out += other.messages_out;
        self.busy_ns += other.busy_ns;
        self.elapsed_ns += other.elapsed_ns;
        for (total, part) in [
            (&mut self.service_ns, &other.service_ns),
            (&mut self.hop_latency_ns, &other.hop_latency_ns),
            (&mut self.end_to_end_ns, &other.end_to_end_ns),
            (&mut self.queue_depth, &other.queue_depth),
        ] {
            total.add(part).expect("histograms built by `histogram()` share bounds");
        }
    }

    /// Empties the recorder and starts a new span at `now_ns` (no allocation).
    fn restart(&mut self, now_ns: u64) {
        self.messages_in = 0;
        self.messages_out = 0;
        self.busy_ns = 0;
        self.elapsed_ns = 0;
        self.service_ns.reset();
        self.hop_latency_ns.reset();
        self.end_to_end_ns.reset();
        self.queue_depth.reset();
        self.span_start_ns = now_ns;
    }

    /// Closes the current span at `now_ns`, adding it to the elapsed time.
    fn close_span(&mut self, now_ns: u64) {
        self.elapsed_ns += now_ns.saturating_sub(self.span_start_ns);
        self.span_start_ns = now_ns;
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

/// Where one worker leaves a filled recorder and picks up a cleared one.
struct Mailbox {
    filled: Option<Box<Recorder>>,
    spare: Option<Box<Recorder>>,
}

/// The shared side of one stage's metrics: one mailbox per worker plus the merged totals.
pub struct StageMetricsHub {
    stage: String,
    mailboxes: Vec<Mutex<Mailbox>>,
    totals: Mutex<Recorder>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves plain counters behind; the data stays usable.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl StageMetricsHub {
    /// A hub for `workers` workers of `stage`, with one spare recorder per worker.
    pub fn new(stage: &str, workers: usize) -> Arc<StageMetricsHub> {
        let mailboxes = (0..workers)
            .map(|_| Mutex::new(Mailbox { filled: None, spare: Some(Box::default()) }))
            .collect();
        Arc::new(StageMetricsHub {
            stage: stage.to_owned(),
            mailboxes,
            totals: Mutex::new(Recorder::new()),
        })
    }

    /// The recorder handle for worker `worker` (each worker index must be used by one thread).
    pub fn worker(self: &Arc<Self>, worker: usize) -> WorkerMetrics {
        assert!(worker < self.mailboxes.len(), "worker {worker} of {}", self.mailboxes.len());
        WorkerMetrics {
            hub: self.clone(),
            worker,
            recorder: Box::default(),
            next_publish_ns: now_ns() + PUBLISH_INTERVAL_NS,
        }
    }

    /// Merges everything the workers have published and returns the stage's totals.
    pub fn snapshot(&self) -> StageMetrics {
        let mut totals = lock(&self.totals);
        for mailbox in &self.mailboxes {
            let mut mailbox = lock(mailbox);
            if let Some(mut filled) = mailbox.filled.take() {
                totals.merge(&filled);
                filled.restart(0);
                mailbox.spare = Some(filled);
            }
        }
        StageMetrics::from_recorder(&self.stage, self.mailboxes.len(), &totals)
    }
}

/// One worker's view: its private [`Recorder`] plus the way to publish it.
pub struct WorkerMetrics {
    hub: Arc<StageMetricsHub>,
    worker: usize,
    recorder: Box<Recorder>,
    next_publish_ns: u64,
}

impl WorkerMetrics {
    /// The thread-private recorder (record into it freely; nothing here is shared).
    #[inline]
    pub fn recorder(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    /// Publishes if the interval has passed; `now_ns` is a stamp the caller already has.
    #[inline]
    pub fn maybe_publish(&mut self, now_ns: u64) {
        if now_ns >= self.next_publish_ns {
            self.try_publish(now_ns);
        }
    }

    /// Swaps the recorder into the mailbox if the mailbox is free and has a spare; never waits.
    fn try_publish(&mut self, now_ns: u64) {
        self.next_publish_ns = now_ns + PUBLISH_INTERVAL_NS;
        let mut mailbox = match self.hub.mailboxes[self.worker].try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        if mailbox.filled.is_some() {
            return;
        }
        let Some(mut spare) = mailbox.spare.take() else { return };
        self.recorder.close_span(now_ns);
        spare.span_start_ns = now_ns;
        std::mem::swap(&mut self.recorder, &mut spare);
        mailbox.filled = Some(spare);
    }

    /// Final publish when the worker exits: merges straight into the totals (waits for locks;
    /// this is the exit path, not the hot path).
    pub fn finish(mut self) {
        self.recorder.close_span(now_ns());
        lock(&self.hub.totals).merge(&self.recorder);
    }
}

/// A distribution's summary (latencies in ns, depths in slots).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    /// Samples recorded.
    pub count: u64,
    /// Smallest sample.
    pub min: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p99_9: u64,
    /// 99.99th percentile.
    pub p99_99: u64,
    /// Largest sample.
    pub max: u64,
}

impl Distribution {
    /// Summarises `histogram`; an empty one gives all zeros (no NaN mean in reports).
    pub fn from_histogram(histogram: &Histogram<u64>) -> Distribution {
        if histogram.is_empty() {
            return Distribution::default();
        }
        Distribution {
            count: histogram.len(),
            min: histogram.min(),
            mean: histogram.mean(),
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p99_9: histogram.value_at_quantile(0.999),
            p99_99: histogram.value_at_quantile(0.9999),
            max: histogram.max(),
        }
    }
}

/// A snapshot of one stage, summed over its workers (serialisable for reports and endpoints).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageMetrics {
    /// The stage's name, as declared.
    pub stage: String,
    /// Workers summed over.
    pub workers: usize,
    /// Messages read from inbound rings (for a source: messages it emitted).
    pub messages_in: u64,
    /// Messages emitted downstream.
    pub messages_out: u64,
    /// Handler time, summed over workers.
    pub busy_ns: u64,
    /// Worker time not spent in handlers (waiting, reading, emitting), summed over workers.
    pub idle_ns: u64,
    /// busy / (busy + idle): the mean fraction of a worker spent in the handler, 0..=1.
    pub utilization: f64,
    /// Handler time per message (per batch in a fused stage), ns.
    pub service_ns: Distribution,
    /// From the upstream publish to the start of handling, ns.
    pub hop_latency_ns: Distribution,
    /// From ingress to the end of handling, recorded by stages with no downstream, ns.
    pub end_to_end_ns: Distribution,
    /// Inbound ring depth, sampled, in slots.
    pub queue_depth_slots: Distribution,
    /// The merged histograms, for CDF plots and further merging (not serialised).
    #[serde(skip)]
    pub histograms: Option<Box<Recorder>>,
}

impl StageMetrics {
    fn from_recorder(stage: &str, workers: usize, totals: &Recorder) -> StageMetrics {
        let busy_ns = totals.busy_ns;
        // A batch's busy time is added before the span closes, so busy <= elapsed; max() only
        // guards the report against a clock read reordered around the span boundary.
        let elapsed_ns = totals.elapsed_ns.max(busy_ns);
        StageMetrics {
            stage: stage.to_owned(),
            workers,
            messages_in: totals.messages_in,
            messages_out: totals.messages_out,
            busy_ns,
            idle_ns: elapsed_ns - busy_ns,
            utilization: if elapsed_ns == 0 { 0.0 } else { busy_ns as f64 / elapsed_ns as f64 },
            service_ns: Distribution::from_histogram(&totals.service_ns),
            hop_latency_ns: Distribution::from_histogram(&totals.hop_latency_ns),
            end_to_end_ns: Distribution::from_histogram(&totals.end_to_end_ns),
            queue_depth_slots: Distribution::from_histogram(&totals.queue_depth),
            histograms: Some(Box::new(totals.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_maps_onto_the_same_clock_as_now() {
        let before_ns = now_ns();
        let at = Instant::now();
        let after_ns = now_ns();
        let at_ns = instant_ns(at);
        assert!(before_ns <= at_ns && at_ns <= after_ns, "{before_ns} <= {at_ns} <= {after_ns}");
        // An instant 1 ms from now is 1 ms further on the same clock.
        let later_ns = instant_ns(at + std::time::Duration::from_millis(1));
        assert_eq!(later_ns - at_ns, 1_000_000);
    }

    #[test]
    fn clock_is_monotonic_and_advances() {
        let first = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let second = now_ns();
        assert!(second >= first + 2_000_000, "{first} -> {second}");
    }

    #[test]
    fn distribution_of_an_empty_histogram_is_zero() {
        assert_eq!(
            Distribution::from_histogram(&histogram(LATENCY_NS_MAX)),
            Distribution::default()
        );
    }
}
