//! Admission by work: the bytes of request bodies a process holds, not the number of requests.
//!
//! Why: the per-model bounds count requests, and a request's cost spans six orders of
//! magnitude (a 10 KB body against a 16 MB 2000×2000 one). Counted by requests, 48 concurrent
//! 2000×2000 requests were all read at once (2.9 GB of resident memory) and the small requests
//! behind them in the models' FIFO queues waited about 45 s. Here a request reserves its body's
//! bytes *before* the body is read: the declared `Content-Length` at once, a chunked body as its
//! chunks arrive. A body is the measure of a request's work: its operands take at most four times
//! its bytes (a cell is at least one digit and a comma, eight bytes once parsed), and its
//! multiplication and answer grow with them.
//!
//! Two lanes, so that large requests never delay small ones: bodies up to
//! [`LARGE_BODY_BYTES_MIN`] reserve from the small lane (`work_bytes_max`), larger ones from the
//! large lane (`large_work_bytes_max`, by default one largest body: large requests then run one
//! at a time). Each lane is a FIFO (tokio's fair semaphore), so a large request waits only
//! behind other large ones, and a small one never waits for room that a large one needs.
//! A request that finds no room waits up to `wait_timeout` (its bytes stay in the kernel's socket
//! buffers meanwhile, not in this process), then gets code 009 (HTTP 503).
//!
//! Costs per request when its lane has room (the common case): a compare-and-swap to reserve,
//! and an uncontended lock to release (tokio's fair semaphore hands released bytes to waiters
//! under its lock); a timer only when it must wait.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

/// Bodies above this size reserve from the large lane: 1 MiB is above the study's largest body
/// (the "high" complexity, 418 KB), so the study's loads never touch the large lane.
pub const LARGE_BODY_BYTES_MIN: usize = 1 << 20;
/// Default small lane: 64 MiB holds 150 bodies of the study's largest size at once, more than
/// its 60 users send.
pub const WORK_BYTES_MAX_DEFAULT: usize = 64 << 20;
/// Default large lane: one largest body (the default `body_bytes_max`).
pub const LARGE_WORK_BYTES_MAX_DEFAULT: usize = crate::server::BODY_BYTES_MAX_DEFAULT;
/// Default longest wait for room before code 009.
pub const ADMISSION_WAIT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// The bounds of one process's work admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkBounds {
    /// Body bytes in flight over requests whose body is at most [`LARGE_BODY_BYTES_MIN`].
    pub work_bytes_max: usize,
    /// Body bytes in flight over larger requests.
    pub large_work_bytes_max: usize,
    /// The longest a request waits for room before it is refused.
    pub wait_timeout: Duration,
}

impl Default for WorkBounds {
    fn default() -> Self {
        WorkBounds {
            work_bytes_max: WORK_BYTES_MAX_DEFAULT,
            large_work_bytes_max: LARGE_WORK_BYTES_MAX_DEFAULT,
            wait_timeout: ADMISSION_WAIT_TIMEOUT_DEFAULT,
        }
    }
}

impl WorkBounds {
    /// Why these bounds could refuse a body that `body_bytes_max` accepts, if they could: a
    /// reservation larger than its lane would wait forever.
    pub fn check(&self, body_bytes_max: usize) -> Result<(), String> {
        let small_needed = body_bytes_max.min(LARGE_BODY_BYTES_MIN);
        if self.work_bytes_max < small_needed {
            return Err(format!("work_bytes_max must be at least {small_needed}"));
        }
        if body_bytes_max > LARGE_BODY_BYTES_MIN && self.large_work_bytes_max < body_bytes_max {
            return Err("large_work_bytes_max must be at least body_bytes_max".into());
        }
        // A reservation is taken in one call, which counts in u32.
        if body_bytes_max > u32::MAX as usize {
            return Err(format!("body_bytes_max must be at most {}", u32::MAX));
        }
        let lane_max = self.work_bytes_max.max(self.large_work_bytes_max);
        if lane_max > Semaphore::MAX_PERMITS {
            return Err(format!("work bounds must be at most {}", Semaphore::MAX_PERMITS));
        }
        Ok(())
    }
}

/// One process's work admission: shared by every route and connection of the process.
pub struct WorkBudget {
    small: Semaphore,
    large: Semaphore,
    wait_timeout: Duration,
}

/// Bytes held for one request until it drops.
pub struct Reservation<'a> {
    permit: SemaphorePermit<'a>,
    large: bool,
}

impl WorkBudget {
    pub fn new(bounds: &WorkBounds) -> WorkBudget {
        WorkBudget {
            small: Semaphore::new(bounds.work_bytes_max),
            large: Semaphore::new(bounds.large_work_bytes_max),
            wait_timeout: bounds.wait_timeout,
        }
    }

    /// The longest [`reserve`](Self::reserve) and [`Reservation::grow`] wait.
    pub fn wait_timeout(&self) -> Duration {
        self.wait_timeout
    }

    /// Holds `bytes` in the lane of a body of that size, waiting up to the wait timeout;
    /// `None` when no room came.
    pub async fn reserve(&self, bytes: usize) -> Option<Reservation<'_>> {
        let large = bytes > LARGE_BODY_BYTES_MIN;
        let permit = self.acquire(self.lane(large), bytes).await?;
        Some(Reservation { permit, large })
    }

    fn lane(&self, large: bool) -> &Semaphore {
        if large { &self.large } else { &self.small }
    }

    async fn acquire<'a>(&self, lane: &'a Semaphore, bytes: usize) -> Option<SemaphorePermit<'a>> {
        // Checked against u32 by WorkBounds::check through body_bytes_max; a larger value
        // would wait for room that cannot exist, so it is refused instead.
        let permits = u32::try_from(bytes).ok()?;
        // The common case, without a timer: the lane has room now.
        if let Ok(permit) = lane.try_acquire_many(permits) {
            return Some(permit);
        }
        // The semaphore is never closed, so an error can only be the timeout.
        tokio::time::timeout(self.wait_timeout, lane.acquire_many(permits)).await.ok()?.ok()
    }
}

impl<'a> Reservation<'a> {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits()
    }

    /// Holds `more` bytes as well (a chunked body that grew), moving to the large lane when the
    /// total passes [`LARGE_BODY_BYTES_MIN`]; `false` when no room came within the wait
    /// timeout (what was held stays held until the reservation drops).
    pub async fn grow(&mut self, budget: &'a WorkBudget, more: usize) -> bool {
        let total = self.bytes() + more;
        if !self.large && total > LARGE_BODY_BYTES_MIN {
            // The large lane takes the whole body; the small lane's share is given back then.
            let Some(permit) = budget.acquire(&budget.large, total).await else {
                return false;
            };
            *self = Reservation { permit, large: true };
            return true;
        }
        let lane = if self.large { &budget.large } else { &budget.small };
        let Some(permit) = budget.acquire(lane, more).await else {
            return false;
        };
        self.permit.merge(permit);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(small: usize, large: usize) -> WorkBudget {
        let wait_timeout = Duration::from_millis(20);
        WorkBudget::new(&WorkBounds {
            work_bytes_max: small,
            large_work_bytes_max: large,
            wait_timeout,
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    /// A full large lane refuses the next large body and leaves the small lane's room to small
    /// bodies; room comes back when a reservation drops.
    #[test]
    fn large_bodies_wait_in_their_own_lane() {
        let large = LARGE_BODY_BYTES_MIN + 1;
        let budget = budget(2 * LARGE_BODY_BYTES_MIN, large);
        runtime().block_on(async {
            let first = budget.reserve(large).await.expect("the lane holds one");
            assert!(budget.reserve(large).await.is_none(), "the second waits, then is refused");
            let small = budget.reserve(LARGE_BODY_BYTES_MIN).await;
            assert!(small.is_some(), "small bodies keep their lane");
            drop(first);
            assert_eq!(budget.reserve(large).await.map(|r| r.bytes()), Some(large));
        });
    }

    /// A chunked body starts small and moves to the large lane as it grows, releasing its
    /// small-lane share; growth past the lane is refused.
    #[test]
    fn a_growing_body_moves_to_the_large_lane() {
        let budget = budget(LARGE_BODY_BYTES_MIN, 3 * LARGE_BODY_BYTES_MIN);
        runtime().block_on(async {
            let mut body = budget.reserve(0).await.unwrap();
            assert!(body.grow(&budget, LARGE_BODY_BYTES_MIN).await);
            assert_eq!(budget.small.available_permits(), 0);
            assert!(body.grow(&budget, 1).await);
            assert_eq!(budget.small.available_permits(), LARGE_BODY_BYTES_MIN, "given back");
            assert_eq!(body.bytes(), LARGE_BODY_BYTES_MIN + 1);
            assert!(body.grow(&budget, LARGE_BODY_BYTES_MIN).await);
            assert!(!body.grow(&budget, LARGE_BODY_BYTES_MIN).await, "past the lane");
            drop(body);
            assert_eq!(budget.large.available_permits(), 3 * LARGE_BODY_BYTES_MIN);
        });
    }

    #[test]
    fn bounds_that_could_never_admit_a_body_are_refused() {
        let bounds = WorkBounds::default();
        assert!(bounds.check(crate::server::BODY_BYTES_MAX_DEFAULT).is_ok());
        let error = bounds.check(2 * crate::server::BODY_BYTES_MAX_DEFAULT).unwrap_err();
        assert!(error.contains("large_work_bytes_max"), "{error}");
        let tiny = WorkBounds { work_bytes_max: 10, ..bounds };
        assert!(tiny.check(1000).unwrap_err().contains("work_bytes_max"));
        assert!(tiny.check(10).is_ok());
    }
}
