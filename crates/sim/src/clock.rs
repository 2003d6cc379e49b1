//! Simulated time: one true clock the event loop advances, and per process a monotonic clock
//! that runs at its own rate (skew) and a wall clock that may jump.

use std::time::Duration;

/// A process's monotonic instant, ns since the simulation's start on that process's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimInstant(pub u64);

impl std::ops::Add<Duration> for SimInstant {
    type Output = SimInstant;
    fn add(self, by: Duration) -> SimInstant {
        SimInstant(self.0.saturating_add(by.as_nanos() as u64))
    }
}

/// A process's clocks, read at the true time.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessClock {
    /// Rate error, parts per million (positive: runs fast).
    pub skew_ppm: i64,
    /// Where the monotonic clock stood at true time 0, ns.
    pub offset_ns: u64,
    /// Wall clock minus monotonic clock, ns (jumps change it).
    pub wall_offset_ns: i64,
}

impl ProcessClock {
    /// The monotonic reading at true time `true_ns`.
    pub fn monotonic(&self, true_ns: u64) -> SimInstant {
        let skewed = true_ns as i128 + true_ns as i128 * self.skew_ppm as i128 / 1_000_000;
        SimInstant(self.offset_ns + skewed.max(0) as u64)
    }

    /// The wall-clock reading at true time `true_ns`, ns since the epoch of the run.
    pub fn wall(&self, true_ns: u64) -> u64 {
        (self.monotonic(true_ns).0 as i64).saturating_add(self.wall_offset_ns).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fast_clock_gains_its_skew_and_a_wall_jump_leaves_the_monotonic_clock_alone() {
        let mut clock = ProcessClock { skew_ppm: 1_000, offset_ns: 5, wall_offset_ns: 0 };
        assert_eq!(clock.monotonic(1_000_000_000), SimInstant(1_001_000_005));
        clock.wall_offset_ns = -2_000_000_000;
        assert_eq!(clock.monotonic(1_000_000_000), SimInstant(1_001_000_005));
        assert_eq!(clock.wall(3_000_000_000), 1_003_000_005);
    }
}
