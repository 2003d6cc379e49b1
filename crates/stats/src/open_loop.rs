//! Open-loop schedules: arrival processes, the intended send times they give, and the sync
//! driver that issues each request at its time (the tier's start-up calibration and the cdr
//! pipeline's arrivals use them; the async, closed-loop and rate-search drivers are the
//! `experiments` crate's `load`).
//!
//! **Open loop, latency from the intended time.** A load generator that waits for a slow
//! response before sending the next request stops sending exactly when the system is slow,
//! so the requests that would have suffered are never sent and the stall vanishes from the
//! percentiles ("coordinated omission"). Here every request has an *intended* send time fixed
//! in advance by a seeded [`Schedule`]; the driver issues each request at that time or, when
//! it falls behind, as soon as it can, and latency is always measured from the intended
//! time. A stall therefore shows up in every request that was due during it. How late the
//! driver itself was is recorded separately (`send_lag`) so a saturated generator is visible.
//!
//! * [`ArrivalProcess`]: constant, Poisson, bursty on/off and batch arrivals, each with the
//!   same mean rate; [`Schedule`] turns one into intended offsets (deterministic per seed).
//! * [`drive_sync`]: a thread calls a closure at each intended time (sleeping, then spinning
//!   for the last few µs, see [`Pacer`]); the closure gets a [`Shot`] and records
//!   [`Shot::latency_ns`] when its response arrives. [`OpenLoopSteps`] is the same schedule
//!   for a caller that owns its loop.
//!
//! ```
//! use std::time::Duration;
//! use stats::LatencyHistogram;
//! use stats::open_loop::{ArrivalProcess, OpenLoopPlan, drive_sync};
//!
//! let plan = OpenLoopPlan {
//!     process: ArrivalProcess::Poisson { rate_per_s: 20_000.0 },
//!     seed: 7,
//!     duration: Duration::from_millis(20),
//! };
//! let mut latency = LatencyHistogram::new();
//! let report = drive_sync(&plan, |shot| {
//!     // ... send the request and wait for its response, then:
//!     latency.record_ns(shot.latency_ns());
//! })
//! .unwrap();
//! assert_eq!(latency.count(), report.sent);
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::BadInput;
use crate::histogram::LatencyHistogram;

pub use crate::pacer::{
    Pacer, SPIN_MARGIN_NS, SPIN_WINDOW_MAX_NS, SPIN_WINDOW_MIN_NS, SPIN_WINDOW_NS,
};

/// Timer slack of the sync driver's thread (`PR_SET_TIMERSLACK`): a sleep then overshoots by
/// the wake-up latency only (a few µs on a quiet host) rather than the default 50 µs slack,
/// and the [`Pacer`]'s spin window only has to cover that.
pub const TIMER_SLACK_NS: u64 = 1_000;

/// Highest rate a schedule accepts (one request per nanosecond).
pub const RATE_PER_S_MAX: f64 = 1e9;

const NS_PER_S: f64 = 1e9;

// ---------------------------------------------------------------------------------------------
// Arrival processes and schedules.

/// How requests arrive. Every variant has the same long-run mean rate `rate_per_s`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ArrivalProcess {
    /// Evenly spaced, exactly `rate_per_s`.
    Constant { rate_per_s: f64 },
    /// Exponential inter-arrival times (independent arrivals).
    Poisson { rate_per_s: f64 },
    /// On/off bursts: Poisson arrivals during `on_ns`, none during the following `off_ns`;
    /// the on-rate is `rate_per_s · (on + off) / on` so the mean stays `rate_per_s`.
    Bursty { rate_per_s: f64, on_ns: u64, off_ns: u64 },
    /// Batches of `batch_size` simultaneous requests; batches arrive as a Poisson process at
    /// `rate_per_s / batch_size`.
    Batch { rate_per_s: f64, batch_size: u32 },
}

impl ArrivalProcess {
    /// The long-run mean rate.
    pub fn rate_per_s(&self) -> f64 {
        match *self {
            Self::Constant { rate_per_s }
            | Self::Poisson { rate_per_s }
            | Self::Bursty { rate_per_s, .. }
            | Self::Batch { rate_per_s, .. } => rate_per_s,
        }
    }

    /// The same process at another mean rate (for rate searches).
    pub fn with_rate(&self, rate_per_s: f64) -> Self {
        let mut process = *self;
        match &mut process {
            Self::Constant { rate_per_s: r }
            | Self::Poisson { rate_per_s: r }
            | Self::Bursty { rate_per_s: r, .. }
            | Self::Batch { rate_per_s: r, .. } => *r = rate_per_s,
        }
        process
    }

    /// Checks the parameters; the error says which one is wrong and why.
    pub fn validate(&self) -> Result<(), BadInput> {
        let rate = self.rate_per_s();
        if !(rate > 0.0 && rate <= RATE_PER_S_MAX) {
            return Err(BadInput(format!("rate_per_s {rate} is not in (0, {RATE_PER_S_MAX}]")));
        }
        match *self {
            Self::Bursty { on_ns: 0, .. } => Err(BadInput("bursty on_ns must be > 0".into())),
            Self::Batch { batch_size: 0, .. } => Err(BadInput("batch_size must be > 0".into())),
            _ => Ok(()),
        }
    }
}

/// Intended send offsets (ns since the start of the run), non-decreasing and endless;
/// the same process and seed always give the same sequence.
#[derive(Clone, Debug)]
pub struct Schedule {
    process: ArrivalProcess,
    rng: StdRng,
    index: u64,
    /// Time on the process's own clock (on-time only for bursty), ns.
    clock_ns: f64,
    batch_left: u32,
    batch_offset_ns: u64,
}

impl Schedule {
    pub fn new(process: ArrivalProcess, seed: u64) -> Result<Self, BadInput> {
        process.validate()?;
        Ok(Self {
            process,
            rng: StdRng::seed_from_u64(seed),
            index: 0,
            clock_ns: 0.0,
            batch_left: 0,
            batch_offset_ns: 0,
        })
    }

    /// An exponential gap with the given rate, in ns.
    fn exponential_ns(&mut self, rate_per_s: f64) -> f64 {
        // 1 − u is in (0, 1], so the logarithm is finite.
        let u: f64 = self.rng.random();
        -(1.0 - u).ln() * NS_PER_S / rate_per_s
    }
}

impl Iterator for Schedule {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let offset_ns = match self.process {
            ArrivalProcess::Constant { rate_per_s } => {
                // From the index, not by accumulation, so rounding never drifts.
                (self.index as f64 * NS_PER_S / rate_per_s) as u64
            }
            ArrivalProcess::Poisson { rate_per_s } => {
                let offset = self.clock_ns as u64;
                self.clock_ns += self.exponential_ns(rate_per_s);
                offset
            }
            ArrivalProcess::Bursty { rate_per_s, on_ns, off_ns } => {
                // Arrivals on an "on-time only" clock, mapped onto real time by inserting an
                // off period after every `on_ns` of on-time.
                let period_ns = (on_ns + off_ns) as f64;
                self.clock_ns += self.exponential_ns(rate_per_s * period_ns / on_ns as f64);
                let periods = (self.clock_ns / on_ns as f64).floor();
                (periods * period_ns + (self.clock_ns - periods * on_ns as f64)) as u64
            }
            ArrivalProcess::Batch { rate_per_s, batch_size } => {
                if self.batch_left == 0 {
                    self.batch_offset_ns = self.clock_ns as u64;
                    self.clock_ns += self.exponential_ns(rate_per_s / f64::from(batch_size));
                    self.batch_left = batch_size;
                }
                self.batch_left -= 1;
                self.batch_offset_ns
            }
        };
        self.index += 1;
        Some(offset_ns)
    }
}

/// An open-loop run: which arrivals, which seed, for how long.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenLoopPlan {
    pub process: ArrivalProcess,
    pub seed: u64,
    pub duration: Duration,
}

impl OpenLoopPlan {
    /// The intended offsets within the plan's duration.
    pub fn schedule(&self) -> Result<impl Iterator<Item = u64> + use<>, BadInput> {
        let duration_ns = u64::try_from(self.duration.as_nanos()).unwrap_or(u64::MAX);
        Ok(Schedule::new(self.process, self.seed)?.take_while(move |&ns| ns < duration_ns))
    }
}

// ---------------------------------------------------------------------------------------------
// Sync open-loop driver.

/// One request of an open-loop run, handed to the caller at (or after) its intended time.
#[derive(Clone, Copy, Debug)]
pub struct Shot {
    /// Position in the schedule, from 0.
    pub index: u64,
    /// When the request was due: latency is measured from here.
    pub intended: Instant,
    /// When the driver actually handed it over.
    pub issued: Instant,
}

impl Shot {
    /// Latency from the intended time until now (call it when the response arrives).
    pub fn latency_ns(&self) -> u64 {
        self.latency_ns_at(Instant::now())
    }

    /// Latency from the intended time until `now`.
    pub fn latency_ns_at(&self, now: Instant) -> u64 {
        duration_ns(now.saturating_duration_since(self.intended))
    }

    /// How late the driver issued this request.
    pub fn send_lag_ns(&self) -> u64 {
        duration_ns(self.issued.saturating_duration_since(self.intended))
    }
}

/// `duration` in nanoseconds, saturating at `u64::MAX` (584 years).
pub fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// What a sync open-loop run did.
#[derive(Clone, Debug)]
pub struct DriveReport {
    pub sent: u64,
    pub elapsed: Duration,
    /// How late each request was issued; a high tail means the generator (or the closure
    /// it calls) could not keep up and the latencies include that wait.
    pub send_lag: LatencyHistogram,
    /// How often the generator slept between requests (none when the gaps were shorter than
    /// its spin window), and the spin window it ended with.
    pub sleeps: u64,
    pub spin_window: Duration,
}

impl DriveReport {
    pub fn achieved_rate_per_s(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
    }
}

/// Calls `send` once per intended time of `plan`, on this thread. When `send` takes longer
/// than the gap to the next intended time, the next calls happen immediately, late, and
/// their [`Shot::latency_ns`] includes the delay. Between requests the thread sleeps while
/// the next one is far and spins only for the [`Pacer`]'s short window before it: a generator
/// that spins through every gap holds a core that the system under test may need.
///
/// Per request the driver reads the clock once when it is at or behind its schedule (the
/// read that ends the wait is the issue time) and records the send lag; it sustains several
/// million requests per second on one core (`leantier bench load-gen` measures it).
pub fn drive_sync(plan: &OpenLoopPlan, send: impl FnMut(Shot)) -> Result<DriveReport, BadInput> {
    drive_sync_with(plan, Pacer::default(), send)
}

/// [`drive_sync`] with a pacer of the caller's choice, e.g. [`Pacer::spinning`] for a
/// generator that has a CPU of its own.
pub fn drive_sync_with(
    plan: &OpenLoopPlan,
    pacer: Pacer,
    send: impl FnMut(Shot),
) -> Result<DriveReport, BadInput> {
    Ok(drive_steps_with(OpenLoopSteps::new(plan)?, pacer, send))
}

/// [`drive_sync_with`] over steps of the caller's making, e.g. ones that end early on a stop
/// signal ([`OpenLoopSteps::until`]).
pub fn drive_steps_with(
    mut steps: OpenLoopSteps,
    mut pacer: Pacer,
    mut send: impl FnMut(Shot),
) -> DriveReport {
    set_timer_slack(TIMER_SLACK_NS);
    while let Some(intended) = steps.next_intended() {
        let issued = pacer.wait_until(intended);
        send(steps.issue(issued));
    }
    DriveReport { sleeps: pacer.sleeps(), spin_window: pacer.spin_window(), ..steps.report() }
}

/// An open-loop schedule stepped without waiting, for a driver whose thread has other work
/// (a load generator run inline on a tier's critical thread): between its other work it
/// calls [`OpenLoopSteps::due`] and issues every shot whose intended time has come. The
/// clock starts at the first call. [`drive_sync_with`] steps the same schedule, waiting on
/// its pacer for each shot.
pub struct OpenLoopSteps {
    schedule: Box<dyn Iterator<Item = u64> + Send>,
    start: Option<Instant>,
    /// The next shot's index and offset from the start, ns (`None`: the schedule is done).
    next: Option<(u64, u64)>,
    send_lag: LatencyHistogram,
    sent: u64,
    /// Ends the schedule early once set (a stop signal): no shot is issued after it.
    stop: Option<Arc<AtomicBool>>,
}

impl OpenLoopSteps {
    pub fn new(plan: &OpenLoopPlan) -> Result<OpenLoopSteps, BadInput> {
        let mut schedule: Box<dyn Iterator<Item = u64> + Send> = Box::new(plan.schedule()?);
        let next = schedule.next().map(|offset_ns| (0, offset_ns));
        Ok(OpenLoopSteps {
            schedule,
            start: None,
            next,
            send_lag: LatencyHistogram::new(),
            sent: 0,
            stop: None,
        })
    }

    /// The same steps, ending early once `stop` is set (`None`: at the schedule's end only).
    pub fn until(self, stop: Option<Arc<AtomicBool>>) -> OpenLoopSteps {
        OpenLoopSteps { stop, ..self }
    }

    /// The next shot, issued at `now`, if its intended time is at or before `now`.
    pub fn due(&mut self, now: Instant) -> Option<Shot> {
        self.start.get_or_insert(now);
        (self.next_intended()? <= now).then(|| self.issue(now))
    }

    /// When the next shot is due (the clock starts at the first call); `None` when done.
    fn next_intended(&mut self) -> Option<Instant> {
        // Acquire: pairs with the stopper's Release; one load per shot costs next to nothing.
        if self.stop.as_ref().is_some_and(|stop| stop.load(Ordering::Acquire)) {
            self.next = None;
        }
        let start = *self.start.get_or_insert_with(Instant::now);
        self.next.map(|(_, offset_ns)| start + Duration::from_nanos(offset_ns))
    }

    /// Issues the next shot at `issued` and records its lag; call after `next_intended`
    /// returned `Some`.
    fn issue(&mut self, issued: Instant) -> Shot {
        // Not through `next_intended`: a stop set since that call must not take back the shot
        // the caller already waited for.
        let (index, offset_ns) = self.next.expect("a shot is pending");
        let start = self.start.expect("next_intended started the clock");
        let intended = start + Duration::from_nanos(offset_ns);
        self.next = self.schedule.next().map(|offset_ns| (index + 1, offset_ns));
        let shot = Shot { index, intended, issued };
        self.send_lag.record_ns(shot.send_lag_ns());
        self.sent += 1;
        shot
    }

    /// Shots issued so far.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Every shot of the schedule was issued.
    pub fn finished(&self) -> bool {
        self.next.is_none()
    }

    /// What was issued, as [`drive_sync`] reports it (no sleeps: this stepper never waits).
    pub fn report(&self) -> DriveReport {
        DriveReport {
            sent: self.sent,
            elapsed: self.start.map_or(Duration::ZERO, |start| start.elapsed()),
            send_lag: self.send_lag.clone(),
            sleeps: 0,
            spin_window: Duration::ZERO,
        }
    }
}

/// Sets the calling thread's timer slack (how late the kernel may fire its sleeps' timers);
/// a failure only costs precision, so it is logged and ignored.
fn set_timer_slack(slack_ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes an unsigned long by value and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, slack_ns as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!("PR_SET_TIMERSLACK failed: {}", std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_issue_each_shot_once_its_intended_time_has_come() {
        let plan = OpenLoopPlan {
            process: ArrivalProcess::Constant { rate_per_s: 1_000.0 },
            seed: 1,
            duration: Duration::from_millis(10),
        };
        let mut steps = OpenLoopSteps::new(&plan).unwrap();
        let start = Instant::now();
        let first = steps.due(start).expect("the first shot is due at the start");
        assert_eq!((first.index, first.intended, first.issued), (0, start, start));
        assert!(steps.due(start).is_none(), "the next one is 1 ms later");
        let late = start + Duration::from_millis(4);
        let indexes: Vec<u64> = std::iter::from_fn(|| steps.due(late)).map(|s| s.index).collect();
        assert_eq!(indexes, [1, 2, 3, 4], "every shot due by then, in order, issued late");
        assert!(!steps.finished());
        let end = start + Duration::from_secs(1);
        assert_eq!(std::iter::from_fn(|| steps.due(end)).count(), 5);
        assert!(steps.finished());
        let report = steps.report();
        assert_eq!((report.sent, report.send_lag.count()), (10, 10));
        assert!(report.send_lag.max_ns() >= 990_000_000, "the last was issued ~990 ms late");
    }

    fn offsets(process: ArrivalProcess, seed: u64, count: usize) -> Vec<u64> {
        Schedule::new(process, seed).unwrap().take(count).collect()
    }

    #[test]
    fn constant_schedule_is_evenly_spaced() {
        let got = offsets(ArrivalProcess::Constant { rate_per_s: 1_000.0 }, 0, 4);
        assert_eq!(got, [0, 1_000_000, 2_000_000, 3_000_000]);
        let plan = OpenLoopPlan {
            process: ArrivalProcess::Constant { rate_per_s: 30_000.0 },
            seed: 0,
            duration: Duration::from_secs(1),
        };
        assert_eq!(plan.schedule().unwrap().count(), 30_000);
    }

    #[test]
    fn poisson_schedule_has_the_mean_rate_and_is_deterministic() {
        let process = ArrivalProcess::Poisson { rate_per_s: 50_000.0 };
        let got = offsets(process, 42, 100_000);
        // 100 000 arrivals at 50K/s take 2 s; the sum's relative sd is 1/√n = 0.3%.
        let seconds = *got.last().unwrap() as f64 / 1e9;
        assert!((seconds - 2.0).abs() < 0.04, "{seconds}");
        // Exponential gaps: coefficient of variation 1.
        let gaps: Vec<f64> = got.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((sd / mean - 1.0).abs() < 0.03, "cv {}", sd / mean);
        assert!(got.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(got, offsets(process, 42, 100_000));
        assert_ne!(got, offsets(process, 43, 100_000));
    }

    #[test]
    fn bursty_schedule_sends_only_when_on_and_keeps_the_mean_rate() {
        let (on_ns, off_ns) = (1_000_000, 4_000_000);
        let process = ArrivalProcess::Bursty { rate_per_s: 10_000.0, on_ns, off_ns };
        let got: Vec<u64> =
            Schedule::new(process, 1).unwrap().take_while(|&ns| ns < 2_000_000_000).collect();
        assert!(got.iter().all(|ns| ns % (on_ns + off_ns) < on_ns));
        // 20 000 expected in 2 s; sd √20000 ≈ 141.
        assert!((got.len() as f64 - 20_000.0).abs() < 1_000.0, "{}", got.len());
    }

    #[test]
    fn batch_schedule_sends_groups_with_the_mean_rate() {
        let process = ArrivalProcess::Batch { rate_per_s: 80_000.0, batch_size: 8 };
        let got = offsets(process, 3, 80_000);
        for batch in got.chunks(8) {
            assert!(batch.iter().all(|&ns| ns == batch[0]));
        }
        let distinct = got.chunks(8).map(|b| b[0]).collect::<Vec<_>>();
        assert!(distinct.windows(2).all(|w| w[0] < w[1]));
        let seconds = *got.last().unwrap() as f64 / 1e9;
        assert!((seconds - 1.0).abs() < 0.05, "{seconds}");
    }

    #[test]
    fn invalid_processes_are_bad_input() {
        for process in [
            ArrivalProcess::Constant { rate_per_s: 0.0 },
            ArrivalProcess::Poisson { rate_per_s: f64::NAN },
            ArrivalProcess::Bursty { rate_per_s: 10.0, on_ns: 0, off_ns: 1 },
            ArrivalProcess::Batch { rate_per_s: 10.0, batch_size: 0 },
        ] {
            assert!(Schedule::new(process, 0).is_err(), "{process:?}");
        }
        let parsed: ArrivalProcess =
            toml::from_str("kind = \"bursty\"\nrate_per_s = 5.0\non_ns = 10\noff_ns = 20\n")
                .unwrap();
        assert_eq!(
            parsed.with_rate(7.0),
            ArrivalProcess::Bursty { rate_per_s: 7.0, on_ns: 10, off_ns: 20 }
        );
    }

    /// A stall in the system under test must show up in every request that was due during
    /// it; measuring from the actual send (coordinated omission) shows only one slow call.
    #[test]
    fn sync_driver_measures_from_intended_time_through_a_stall() {
        const STALL: Duration = Duration::from_millis(30);
        let plan = OpenLoopPlan {
            process: ArrivalProcess::Constant { rate_per_s: 2_000.0 },
            seed: 0,
            duration: Duration::from_millis(100),
        };
        let mut from_intended = LatencyHistogram::new();
        let mut from_send = LatencyHistogram::new();
        let report = drive_sync(&plan, |shot| {
            if shot.index == 20 {
                std::thread::sleep(STALL);
            }
            let now = Instant::now();
            from_intended.record_ns(shot.latency_ns_at(now));
            from_send.record_ns(duration_ns(now - shot.issued));
        })
        .unwrap();
        assert_eq!(report.sent, 200);
        // Requests 21.. were due at 10.5 ms, 11 ms, ... while the stall lasted until ≥ 40 ms:
        // those due before 30 ms waited ≥ 10 ms (at least 39 of them).
        let slow = |h: &LatencyHistogram| h.count() - count_below(h, 10_000_000);
        assert!(slow(&from_intended) >= 39, "{}", slow(&from_intended));
        assert!(from_intended.max_ns() >= 29_000_000);
        // Only the stalled call itself is slow from the send (a few more if this loaded test
        // machine preempts the thread for 10 ms).
        assert!(slow(&from_send) <= 5, "{}", slow(&from_send));
        assert!(report.send_lag.max_ns() >= 29_000_000);
    }

    fn count_below(histogram: &LatencyHistogram, limit_ns: u64) -> u64 {
        histogram.as_hdr().count_between(0, limit_ns - 1)
    }
}
