//! Absolute `CLOCK_MONOTONIC` time, comparable across processes on one host.
//!
//! `pipeline::metrics::now_ns` counts from a per-process epoch, so a stamp taken in the engine
//! means nothing in an edge process. Records carry absolute monotonic nanoseconds instead:
//! the publisher converts the tier's stamps once with [`EpochOffset`].

use pipeline::metrics::now_ns;

/// `CLOCK_MONOTONIC` in nanoseconds (vDSO: no system call).
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec for the call's duration, and
    // CLOCK_MONOTONIC is always supported on Linux; the call only writes `now`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) cannot fail on Linux");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The distance between this process's `now_ns` epoch and `CLOCK_MONOTONIC`'s zero.
#[derive(Clone, Copy, Debug)]
pub struct EpochOffset {
    offset_ns: u64,
}

impl EpochOffset {
    /// Samples both clocks back to back (`Instant` is `CLOCK_MONOTONIC` on Linux, so the offset
    /// is constant; the error is the few ns between the two reads).
    pub fn measure() -> EpochOffset {
        let relative = now_ns();
        let absolute = monotonic_ns();
        EpochOffset { offset_ns: absolute.saturating_sub(relative) }
    }

    /// `relative_ns` (a `now_ns` stamp) as absolute monotonic nanoseconds.
    pub fn absolute(&self, relative_ns: u64) -> u64 {
        relative_ns + self.offset_ns
    }
}
