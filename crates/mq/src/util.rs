//! The node's clocks (the load generator and the benchmark, `experiments::mq_load` and
//! `experiments::mq_bench`, stamp the store operations they make with the same wall clock), and
//! the rate limit of repeated log lines.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (wall clock: message arrival stamps and leases).
pub fn now_us() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
}

/// Nanoseconds since `since`, saturating.
pub fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Failed accepts and refused connections are logged at most once per interval, with a count.
pub const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Counts events and says when to log them: the first at once, then at most one line per
/// interval carrying how many happened since the last line.
pub(crate) struct RateLimitedLog {
    interval: Duration,
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl RateLimitedLog {
    pub(crate) fn new(interval: Duration) -> RateLimitedLog {
        RateLimitedLog { interval, last_logged: None, unlogged: 0 }
    }

    /// Notes one event at `now`; `Some(count)` when a line is due.
    pub(crate) fn note(&mut self, now: Instant) -> Option<u64> {
        self.unlogged += 1;
        if self.last_logged.is_some_and(|last| now.duration_since(last) < self.interval) {
            return None;
        }
        self.last_logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_events_is_logged_once_per_interval_with_its_count() {
        let mut log = RateLimitedLog::new(Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(log.note(t0), Some(1), "the first event is logged at once");
        let burst: Vec<_> = (1..=1000).map(|ms| log.note(t0 + Duration::from_millis(ms))).collect();
        assert!(burst.iter().all(Option::is_none), "no line within the interval");
        assert_eq!(log.note(t0 + Duration::from_secs(5)), Some(1001), "one line, with the count");
        assert_eq!(log.note(t0 + Duration::from_secs(6)), None);
    }
}
