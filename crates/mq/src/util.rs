//! The node's clocks; the load generator and the benchmark (`experiments::mq_load`, `experiments::mq_bench`)
//! stamp the store operations they make with the same wall clock.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (wall clock: message arrival stamps and leases).
pub fn now_us() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX)
}

/// Nanoseconds since `since`, saturating.
pub fn elapsed_ns(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX)
}
