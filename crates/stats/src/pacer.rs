//! The sync driver's clock: waits for each intended send time without holding a core it does
//! not need, and with one clock read per request when it is at or behind its schedule.
//!
//! Far from the next intended time it sleeps; for the last stretch (the *spin window*) it
//! spins on the clock, because a sleep overshoots by the kernel's wake-up latency. The window
//! adapts to that latency as measured on this host: after each sleep the pacer knows how late
//! it woke, keeps a slowly decaying maximum of those overshoots, and spins for that plus a
//! margin. On a quiet host a sleep overshoots by a few µs and the window shrinks towards
//! [`SPIN_WINDOW_MIN_NS`] (less CPU at low rates); on a loaded one it grows, up to
//! [`SPIN_WINDOW_MAX_NS`], so requests still leave on time. At rates whose gaps are shorter
//! than the window the pacer never sleeps: then the generator needs the core anyway.

use std::time::{Duration, Instant};

/// The spin window before the pacer has measured a sleep of this host.
pub const SPIN_WINDOW_NS: u64 = 15_000;
/// The smallest spin window: below it the sleep's own syscall cost dominates.
pub const SPIN_WINDOW_MIN_NS: u64 = 2_000;
/// The largest spin window: it bounds the CPU the pacer burns per request at low rates
/// (at 1,000 requests/s at most 5% of a core) however late this host's sleeps wake.
pub const SPIN_WINDOW_MAX_NS: u64 = 50_000;
/// Added to the measured overshoot, for the wake-ups a little later than the worst seen.
pub const SPIN_MARGIN_NS: u64 = 2_000;
/// The overshoot estimate forgets 1/`OVERSHOOT_DECAY` of itself per sleep, so one late wake
/// (a preemption) widens the window for a few dozen requests, not for the rest of the run.
const OVERSHOOT_DECAY: u64 = 16;

/// Waits for intended times; see the module docs.
#[derive(Debug)]
pub struct Pacer {
    /// Slowly decaying maximum of how late a sleep woke, ns.
    overshoot_ns: u64,
    sleeps: u64,
    /// Spins through every gap ([`Pacer::spinning`]).
    never_sleeps: bool,
}

impl Default for Pacer {
    fn default() -> Self {
        Pacer { overshoot_ns: SPIN_WINDOW_NS - SPIN_MARGIN_NS, sleeps: 0, never_sleeps: false }
    }
}

impl Pacer {
    /// A pacer that never sleeps: for a generator with a CPU of its own, where a sleep saves
    /// nothing anyone needs and its wake-up (hundreds of µs late now and then on a VM, whose
    /// idle vCPU the hypervisor must reschedule) would count in every latency measured from
    /// the intended send time.
    pub fn spinning() -> Pacer {
        Pacer { never_sleeps: true, ..Pacer::default() }
    }

    /// How long before an intended time the pacer stops sleeping and spins.
    pub fn spin_window(&self) -> Duration {
        let window_ns = self.overshoot_ns.saturating_add(SPIN_MARGIN_NS);
        Duration::from_nanos(window_ns.clamp(SPIN_WINDOW_MIN_NS, SPIN_WINDOW_MAX_NS))
    }

    /// How many times the pacer slept (each a syscall; none at rates above ~1/window).
    pub fn sleeps(&self) -> u64 {
        self.sleeps
    }

    /// Returns at `deadline` or as soon after as it can, with the clock reading it returned
    /// at: the request's issue time. Reads the clock once when `deadline` has passed already.
    #[inline]
    pub fn wait_until(&mut self, deadline: Instant) -> Instant {
        let mut now = Instant::now();
        if now >= deadline {
            return now;
        }
        let window = self.spin_window();
        if !self.never_sleeps && deadline - now > window {
            let wake = deadline - window;
            std::thread::sleep(wake - now);
            now = Instant::now();
            self.learn(now.saturating_duration_since(wake));
        }
        while now < deadline {
            std::hint::spin_loop();
            now = Instant::now();
        }
        now
    }

    /// Folds one sleep's overshoot into the estimate.
    fn learn(&mut self, overshoot: Duration) {
        self.sleeps += 1;
        let overshoot_ns = u64::try_from(overshoot.as_nanos()).unwrap_or(u64::MAX);
        let decayed = self.overshoot_ns - self.overshoot_ns / OVERSHOOT_DECAY;
        self.overshoot_ns = decayed.max(overshoot_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_measured_overshoot_within_its_bounds() {
        let mut pacer = Pacer::default();
        assert_eq!(pacer.spin_window(), Duration::from_nanos(SPIN_WINDOW_NS));
        pacer.learn(Duration::from_micros(40));
        assert_eq!(pacer.spin_window(), Duration::from_nanos(40_000 + SPIN_MARGIN_NS));
        for _ in 0..200 {
            pacer.learn(Duration::from_nanos(500));
        }
        // Decayed down to the 500 ns overshoot, plus the margin.
        assert_eq!(pacer.spin_window(), Duration::from_nanos(500 + SPIN_MARGIN_NS));
        pacer.learn(Duration::from_millis(5));
        assert_eq!(pacer.spin_window(), Duration::from_nanos(SPIN_WINDOW_MAX_NS));
        assert_eq!(pacer.sleeps(), 202);
    }

    #[test]
    fn a_spinning_pacer_never_sleeps_and_keeps_its_deadlines() {
        let mut pacer = Pacer::spinning();
        let start = Instant::now();
        for gap_us in [0, 50, 400, 2_000] {
            let deadline = start.max(Instant::now()) + Duration::from_micros(gap_us);
            assert!(pacer.wait_until(deadline) >= deadline, "returned before the deadline");
        }
        assert_eq!(pacer.sleeps(), 0);
    }

    #[test]
    fn never_returns_before_the_deadline_and_reports_when_it_did() {
        let mut pacer = Pacer::default();
        let start = Instant::now();
        for gap_us in [0, 3, 50, 400, 2_000] {
            let deadline = start.max(Instant::now()) + Duration::from_micros(gap_us);
            let issued = pacer.wait_until(deadline);
            assert!(issued >= deadline, "returned before the deadline");
            assert!(issued <= Instant::now());
        }
        let past = Instant::now() - Duration::from_millis(1);
        assert!(pacer.wait_until(past) > past, "a passed deadline returns at once, late");
    }
}
