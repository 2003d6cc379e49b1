//! Wait strategies: what a thread does while its ring is empty (consumer) or full (producer).
//!
//! | strategy     | to notice new work                  | CPU while idle                 | use when                             |
//! |--------------|-------------------------------------|--------------------------------|--------------------------------------|
//! | `BusySpin`   | one cache-line transfer             | a whole core                   | a core is dedicated to the stage     |
//! | `SpinYield`  | spin, then one `sched_yield` round  | a whole core, yielded to peers | shared cores, low latency wanted     |
//! | `Park`       | a futex wake-up of a sleeping thread | next to nothing               | ancillary stages, oversubscribed hosts |
//! | `Adaptive`   | spin → yield → park                  | the spin/yield budget, then ~0 | the default                          |
//!
//! `leantier bench ring` measures both columns on the host at hand (hop latency by ping-pong
//! with the consumer waiting under each strategy, and the idle waiter's thread CPU time over
//! wall time); docs/BENCHMARKS.md records the figures.
//!
//! # The wake-up protocol (why a running consumer costs the producer no syscall)
//!
//! A [`Parker`] has a sleeper count, a mutex and a condition variable. A waiter that decides to
//! sleep takes the mutex, increments `sleepers`, issues a SeqCst fence and re-checks its
//! condition before `Condvar::wait`. A notifier first publishes its state (e.g. a batch header
//! with Release), issues a SeqCst fence and loads `sleepers`; only if it is non-zero does it
//! take the mutex and signal. The two SeqCst fences order "publish; fence; load sleepers"
//! against "sleepers += 1; fence; re-check": at least one side sees the other's store, so either
//! the waiter sees the new state and does not sleep, or the notifier sees the sleeper and
//! signals it. Because the waiter holds the mutex from its increment until `wait` atomically
//! releases it, a notifier that saw the sleeper cannot signal before the waiter is waiting.
//! When nobody sleeps, `notify` costs one fence and one load. `tests/loom.rs` model-checks this.

use crate::sync::AtomicUsize;
use crate::sync::{Arc, Condvar, Mutex, Ordering, fence, lock, spin_loop, yield_now};

/// Iterations of `spin_loop` before `Adaptive` starts yielding (a few µs on current CPUs).
pub const ADAPTIVE_SPINS_DEFAULT: u32 = 10_000;
/// `sched_yield` calls before `Adaptive` parks.
pub const ADAPTIVE_YIELDS_DEFAULT: u32 = 100;

/// What an idle consumer or a blocked producer does while it waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// Spin on the ring's index: lowest latency, burns the core. Only with a dedicated core.
    BusySpin,
    /// Spin `spins` times, then `sched_yield` in a loop.
    SpinYield {
        /// `spin_loop` iterations before the first yield.
        spins: u32,
    },
    /// Sleep on a condition variable until notified.
    Park,
    /// Spin `spins` times, yield `yields` times, then park.
    Adaptive {
        /// `spin_loop` iterations before the first yield.
        spins: u32,
        /// `sched_yield` calls before parking.
        yields: u32,
    },
}

impl Default for WaitStrategy {
    fn default() -> Self {
        WaitStrategy::Adaptive { spins: ADAPTIVE_SPINS_DEFAULT, yields: ADAPTIVE_YIELDS_DEFAULT }
    }
}

impl WaitStrategy {
    /// Whether a thread using this strategy may sleep, so its peer must notify it.
    ///
    /// ```
    /// use pipeline::WaitStrategy;
    ///
    /// assert!(WaitStrategy::Park.may_park());
    /// assert!(WaitStrategy::default().may_park(), "adaptive ends parked");
    /// assert!(!WaitStrategy::BusySpin.may_park());
    /// ```
    pub fn may_park(self) -> bool {
        matches!(self, WaitStrategy::Park | WaitStrategy::Adaptive { .. })
    }

    /// Whether this strategy keeps a core busy while idle (unsafe to use oversubscribed).
    ///
    /// ```
    /// use pipeline::WaitStrategy;
    ///
    /// assert!(WaitStrategy::SpinYield { spins: 100 }.spins_forever());
    /// assert!(!WaitStrategy::Adaptive { spins: 100, yields: 10 }.spins_forever());
    /// ```
    pub fn spins_forever(self) -> bool {
        matches!(self, WaitStrategy::BusySpin | WaitStrategy::SpinYield { .. })
    }

    /// The strategy to use instead when threads outnumber usable cores: spinning threads would
    /// steal the core from the very thread they wait for.
    ///
    /// ```
    /// use pipeline::WaitStrategy;
    ///
    /// assert_eq!(WaitStrategy::BusySpin.for_oversubscribed(), WaitStrategy::default());
    /// assert_eq!(WaitStrategy::Park.for_oversubscribed(), WaitStrategy::Park);
    /// ```
    pub fn for_oversubscribed(self) -> WaitStrategy {
        if self.spins_forever() { WaitStrategy::default() } else { self }
    }
}

impl std::str::FromStr for WaitStrategy {
    type Err = String;

    /// Parses `spin`, `spin-yield`, `park` or `adaptive` (with default budgets).
    ///
    /// ```
    /// use pipeline::WaitStrategy;
    ///
    /// assert_eq!("park".parse(), Ok(WaitStrategy::Park));
    /// assert_eq!("adaptive".parse(), Ok(WaitStrategy::default()));
    /// assert!("sleep".parse::<WaitStrategy>().unwrap_err().contains("unknown wait strategy"));
    /// ```
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "spin" | "busy-spin" => Ok(WaitStrategy::BusySpin),
            "spin-yield" => Ok(WaitStrategy::SpinYield { spins: ADAPTIVE_SPINS_DEFAULT }),
            "park" => Ok(WaitStrategy::Park),
            "adaptive" => Ok(WaitStrategy::default()),
            other => Err(format!(
                "unknown wait strategy `{other}` (expected spin, spin-yield, park or adaptive)"
            )),
        }
    }
}

/// A wake-up point for one or more sleeping threads (see the module docs for the protocol).
#[derive(Debug, Default)]
pub struct Parker {
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wakeup: Condvar,
}

impl Parker {
    /// A parker nobody sleeps on yet, shared (`Arc`) because the waiter and every notifier
    /// hold it.
    ///
    /// ```
    /// use pipeline::Parker;
    ///
    /// let parker = Parker::new();
    /// parker.notify(); // nobody sleeps: one fence and one load, no syscall
    /// ```
    pub fn new() -> Arc<Parker> {
        Arc::new(Parker::default())
    }

    /// Wakes every thread parked here. Call after publishing the state they wait for.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use pipeline::{Parker, WaitStrategy, Waiter};
    ///
    /// let parker = Parker::new();
    /// let ready = Arc::new(AtomicBool::new(false));
    /// let waiter = Waiter::new(WaitStrategy::Park, parker.clone());
    /// let flag = ready.clone();
    /// let ready_now = move || flag.load(Ordering::Acquire);
    /// let sleeper = std::thread::spawn(move || waiter.wait_until(ready_now));
    /// ready.store(true, Ordering::Release); // publish first,
    /// parker.notify(); // then wake
    /// sleeper.join().unwrap();
    /// ```
    #[inline]
    pub fn notify(&self) {
        // SeqCst fence: orders our earlier publication before the `sleepers` load, pairing
        // with the fence in `park_until` (the Dekker argument in the module docs).
        fence(Ordering::SeqCst);
        // Relaxed: the fence above already provides the ordering.
        if self.sleepers.load(Ordering::Relaxed) != 0 {
            let _guard = lock(&self.lock);
            self.wakeup.notify_all();
        }
    }

    fn park_until(&self, ready: &mut impl FnMut() -> bool) {
        let mut guard = lock(&self.lock);
        // Relaxed: ordered by the SeqCst fence that follows, and by the mutex for other sleepers.
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        loop {
            // SeqCst fence: pairs with the one in `notify` (module docs).
            fence(Ordering::SeqCst);
            if ready() {
                break;
            }
            guard = self.wakeup.wait(guard).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Applies a [`WaitStrategy`], parking on a [`Parker`] when the strategy allows it.
#[derive(Debug, Clone)]
pub struct Waiter {
    strategy: WaitStrategy,
    parker: Arc<Parker>,
}

impl Waiter {
    /// A waiter that applies `strategy` and, when the strategy parks, sleeps on `parker`.
    ///
    /// ```
    /// use pipeline::{Parker, WaitStrategy, Waiter};
    ///
    /// let waiter = Waiter::new(WaitStrategy::BusySpin, Parker::new());
    /// waiter.wait_until(|| true); // ready at once: returns without spinning
    /// ```
    pub fn new(strategy: WaitStrategy, parker: Arc<Parker>) -> Self {
        Waiter { strategy, parker }
    }

    /// The strategy this waiter applies.
    ///
    /// ```
    /// use pipeline::{Parker, WaitStrategy, Waiter};
    ///
    /// let waiter = Waiter::new(WaitStrategy::Park, Parker::new());
    /// assert_eq!(waiter.strategy(), WaitStrategy::Park);
    /// ```
    pub fn strategy(&self) -> WaitStrategy {
        self.strategy
    }

    /// The parker that peers must [`Parker::notify`] after publishing what this waiter awaits.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pipeline::{Parker, WaitStrategy, Waiter};
    ///
    /// let parker = Parker::new();
    /// let waiter = Waiter::new(WaitStrategy::Park, parker.clone());
    /// assert!(Arc::ptr_eq(waiter.parker(), &parker));
    /// ```
    pub fn parker(&self) -> &Arc<Parker> {
        &self.parker
    }

    /// Returns once `ready()` is true. `ready` must be cheap and side-effect free: it is
    /// polled in the spin phase and re-checked under the parker's protocol before sleeping.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use pipeline::{Parker, WaitStrategy, Waiter};
    ///
    /// // Adaptive: spins, yields, then parks until the counter reaches 3.
    /// let strategy = WaitStrategy::Adaptive { spins: 10, yields: 1 };
    /// let waiter = Waiter::new(strategy, Parker::new());
    /// let counter = Arc::new(AtomicU32::new(0));
    /// let (count, parker) = (counter.clone(), waiter.parker().clone());
    /// let ticker = std::thread::spawn(move || {
    ///     for _ in 0..3 {
    ///         count.fetch_add(1, Ordering::Release);
    ///         parker.notify();
    ///     }
    /// });
    /// waiter.wait_until(|| counter.load(Ordering::Acquire) >= 3);
    /// assert_eq!(counter.load(Ordering::Acquire), 3);
    /// ticker.join().unwrap();
    /// ```
    pub fn wait_until(&self, mut ready: impl FnMut() -> bool) {
        if ready() {
            return;
        }
        match self.strategy {
            WaitStrategy::BusySpin => {
                spin_until(&mut ready, u32::MAX, true);
            }
            WaitStrategy::SpinYield { spins } => {
                if !spin_until(&mut ready, spins, false) {
                    while !ready() {
                        yield_now();
                    }
                }
            }
            WaitStrategy::Park => self.parker.park_until(&mut ready),
            WaitStrategy::Adaptive { spins, yields } => {
                if spin_until(&mut ready, spins, false) || yield_until(&mut ready, yields) {
                    return;
                }
                self.parker.park_until(&mut ready);
            }
        }
    }
}

/// Spins up to `spins` polls (forever if `forever`); true if `ready` became true.
#[inline]
fn spin_until(ready: &mut impl FnMut() -> bool, spins: u32, forever: bool) -> bool {
    let mut remaining = spins;
    loop {
        if ready() {
            return true;
        }
        if !forever {
            if remaining == 0 {
                return false;
            }
            remaining -= 1;
        }
        spin_loop();
    }
}

fn yield_until(ready: &mut impl FnMut() -> bool, yields: u32) -> bool {
    for _ in 0..yields {
        if ready() {
            return true;
        }
        yield_now();
    }
    ready()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn every_strategy_wakes_when_the_condition_is_published() {
        let strategies = [
            WaitStrategy::BusySpin,
            WaitStrategy::SpinYield { spins: 10 },
            WaitStrategy::Park,
            WaitStrategy::Adaptive { spins: 10, yields: 2 },
        ];
        for strategy in strategies {
            let parker = Parker::new();
            let flag = Arc::new(AtomicBool::new(false));
            let waiter = Waiter::new(strategy, parker.clone());
            let flag_for_waiter = flag.clone();
            let handle = std::thread::spawn(move || {
                waiter.wait_until(|| flag_for_waiter.load(Ordering::Acquire))
            });
            std::thread::sleep(Duration::from_millis(5));
            flag.store(true, Ordering::Release);
            parker.notify();
            handle.join().unwrap();
        }
    }

    #[test]
    fn spinning_strategies_downgrade_when_oversubscribed() {
        assert!(WaitStrategy::BusySpin.for_oversubscribed().may_park());
        assert!(WaitStrategy::SpinYield { spins: 1 }.for_oversubscribed().may_park());
        assert_eq!(WaitStrategy::Park.for_oversubscribed(), WaitStrategy::Park);
    }

    #[test]
    fn parses_names_and_rejects_unknown_ones() {
        assert_eq!("spin".parse::<WaitStrategy>(), Ok(WaitStrategy::BusySpin));
        assert_eq!("park".parse::<WaitStrategy>(), Ok(WaitStrategy::Park));
        assert!("sleepy".parse::<WaitStrategy>().unwrap_err().contains("sleepy"));
    }
}
