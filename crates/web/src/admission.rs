//! Admission by work: the bytes a process holds for its requests, not the number of requests.
//!
//! Why: the per-model bounds count requests, and a request's cost spans six orders of
//! magnitude (a 10 KB body against a 16 MB 2000×2000 one). Counted by requests, 48 concurrent
//! 2000×2000 requests were all read at once (2.9 GB of resident memory) and the small requests
//! behind them in the models' FIFO queues waited about 45 s. Here a request reserves its body's
//! bytes *before* the body is read: the declared `Content-Length` at once, a chunked body as its
//! chunks arrive.
//!
//! The body is not the whole of a request's work: a 106 KB body describing 4096×1 · 1×1024
//! has a 4-million-cell product (32 MiB of `i64`) and an 88 MB answer, and 24 connections that
//! sent such bodies and never read drove the process to 2 GB. So once a request is parsed, and
//! before it is multiplied, it holds the larger of its body and its product plus its answer
//! (known from the shapes and the operands' largest cells: [`crate::api::Request::work_bytes`]);
//! an answer whose worst case (from the shapes alone) is beyond `answer_bytes_max` is refused
//! before any cell is read (code 014). The reservation then travels
//! with the answer ([`Reservation`] is owned, not borrowed) and is released when the answer's
//! last byte has been handed to the socket, or the connection closes: an answer that its client
//! does not read keeps its room until the connection's write progress timeout (the idle
//! timeout, [`crate::conn`]) closes the connection.
//!
//! Two lanes, so that large requests never delay small ones: work up to
//! [`LARGE_WORK_BYTES_MIN`] reserves from the small lane (`work_bytes_max`), more from the large
//! lane (`large_work_bytes_max`, by default one largest request: large requests then run one at
//! a time). Each lane is a FIFO (tokio's fair semaphore), so a large request waits only behind
//! other large ones, and a small one never waits for room that a large one needs. A request
//! that finds no room waits up to `wait_timeout` (its body stays in the kernel's socket buffers
//! meanwhile, not in this process), then gets code 009 (HTTP 503).
//!
//! Fairness between connections: one connection holds at most `connection_work_bytes_max`
//! whatever it pipelines and however little it reads; past that its request gets code 009 at
//! once (waiting would not help: only that connection's own client can free its room). Together
//! with the per-address connection bound ([`crate::conn`]) this bounds what one source can pin.
//!
//! Costs per request when its lane has room (the common case): a compare-and-swap to reserve
//! the body, one more when the answer needs more than the body held, two relaxed atomic adds
//! for the connection's share, and an uncontended lock to release (tokio's fair semaphore hands
//! released bytes to waiters under its lock); a timer only when it must wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default request-body bound: 16 MiB holds a 2000×2000 matrix of 3-digit cells.
pub const BODY_BYTES_MAX_DEFAULT: usize = 16 << 20;
/// Work above this reserves from the large lane: 1 MiB is above the study's largest request
/// (the "high" complexity: a 418 KB body; 726 KB of product and answer), so the study's loads
/// never touch the large lane.
pub const LARGE_WORK_BYTES_MIN: usize = 1 << 20;
/// Default small lane: 64 MiB holds 92 of the study's largest requests at once, more than its
/// 60 users send.
pub const WORK_BYTES_MAX_DEFAULT: usize = 64 << 20;
/// Default large lane: one largest body (the default `body_bytes_max`), which is also more than
/// the largest answer's work (the default `answer_bytes_max` and its product: 11 MiB).
pub const LARGE_WORK_BYTES_MAX_DEFAULT: usize = BODY_BYTES_MAX_DEFAULT;
/// Default share of one connection: one largest request, so no request that a client could
/// send alone is refused by it, while a connection that pipelines without reading its answers
/// pins no more than that.
pub const CONNECTION_WORK_BYTES_MAX_DEFAULT: usize = BODY_BYTES_MAX_DEFAULT;
/// Default longest wait for room before code 009.
pub const ADMISSION_WAIT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// The bounds of one process's work admission (bytes of bodies, products and answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkBounds {
    /// Work bytes in flight over requests whose work is at most [`LARGE_WORK_BYTES_MIN`].
    pub work_bytes_max: usize,
    /// Work bytes in flight over larger requests.
    pub large_work_bytes_max: usize,
    /// Work bytes one connection may hold at once, over both lanes.
    pub connection_work_bytes_max: usize,
    /// The longest a request waits for room before it is refused.
    pub wait_timeout: Duration,
}

impl Default for WorkBounds {
    fn default() -> Self {
        WorkBounds {
            work_bytes_max: WORK_BYTES_MAX_DEFAULT,
            large_work_bytes_max: LARGE_WORK_BYTES_MAX_DEFAULT,
            connection_work_bytes_max: CONNECTION_WORK_BYTES_MAX_DEFAULT,
            wait_timeout: ADMISSION_WAIT_TIMEOUT_DEFAULT,
        }
    }
}

impl WorkBounds {
    /// Why these bounds could refuse a request that the size limits accept, if they could: a
    /// reservation larger than its lane, or than a connection's share, would never be granted.
    /// `request_work_max` is the most one request can need (the larger of `body_bytes_max` and
    /// [`crate::api::SizeLimits::answer_work_bytes_max`]).
    pub fn check(&self, request_work_max: usize) -> Result<(), String> {
        let small_needed = request_work_max.min(LARGE_WORK_BYTES_MIN);
        if self.work_bytes_max < small_needed {
            return Err(format!("work_bytes_max must be at least {small_needed}"));
        }
        let large = request_work_max > LARGE_WORK_BYTES_MIN;
        if large && self.large_work_bytes_max < request_work_max {
            return Err(format!(
                "large_work_bytes_max must be at least {request_work_max} (body_bytes_max, and \
                 answer_bytes_max with its product)"
            ));
        }
        if self.connection_work_bytes_max < request_work_max {
            return Err(format!("connection_work_bytes_max must be at least {request_work_max}"));
        }
        // A reservation is taken in one call, which counts in u32.
        if request_work_max > u32::MAX as usize {
            return Err(format!("a request's work must be at most {} bytes", u32::MAX));
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
    lanes: Arc<Lanes>,
}

struct Lanes {
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    connection_bytes_max: usize,
    wait_timeout: Duration,
}

/// What one connection holds of the budget: the bytes of its live reservations.
#[derive(Debug, Default)]
pub struct ConnectionWork {
    held_bytes: AtomicUsize,
}

impl ConnectionWork {
    /// The bytes this connection's reservations hold now.
    pub fn held_bytes(&self) -> usize {
        // Relaxed: a count checked against a bound, ordered by nothing else.
        self.held_bytes.load(Ordering::Relaxed)
    }
}

/// Why a reservation was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// The lane had no room (within the wait timeout, when waiting).
    Lane,
    /// The connection already holds `held_bytes`, and this would take it past its share.
    Connection { held_bytes: usize, share_bytes: usize },
}

/// Bytes held for one request until it drops: with its answer, once the answer is written or
/// its connection closes. Owned, so it can travel with the request to a worker and back.
pub struct Reservation {
    permit: OwnedSemaphorePermit,
    large: bool,
    lanes: Arc<Lanes>,
    connection: Arc<ConnectionWork>,
}

/// How a reservation grows to a new total: the lane and permits to take, and whether the total
/// moves to the large lane (the small lane's share is given back then).
#[derive(Clone, Copy)]
struct Growth {
    more: usize,
    permits: u32,
    large: bool,
    moving: bool,
}

impl WorkBudget {
    pub fn new(bounds: &WorkBounds) -> WorkBudget {
        let lanes = Lanes {
            small: Arc::new(Semaphore::new(bounds.work_bytes_max)),
            large: Arc::new(Semaphore::new(bounds.large_work_bytes_max)),
            connection_bytes_max: bounds.connection_work_bytes_max,
            wait_timeout: bounds.wait_timeout,
        };
        WorkBudget { lanes: Arc::new(lanes) }
    }

    /// The longest [`reserve`](Self::reserve) and [`Reservation::hold`] wait.
    pub fn wait_timeout(&self) -> Duration {
        self.lanes.wait_timeout
    }

    /// Holds `bytes` for a request of `connection` in the lane of that much work, waiting up to
    /// the wait timeout for the lane (not for the connection's share: only its own client can
    /// free that).
    pub async fn reserve(
        &self,
        bytes: usize,
        connection: &Arc<ConnectionWork>,
    ) -> Result<Reservation, Shortfall> {
        // Zero permits are always available: an empty reservation in the small lane.
        let permit = Arc::clone(&self.lanes.small)
            .try_acquire_many_owned(0)
            .expect("the lanes are never closed");
        let mut reservation = Reservation {
            permit,
            large: false,
            lanes: Arc::clone(&self.lanes),
            connection: Arc::clone(connection),
        };
        reservation.hold(bytes).await?;
        Ok(reservation)
    }
}

impl Lanes {
    fn lane(&self, large: bool) -> &Arc<Semaphore> {
        if large { &self.large } else { &self.small }
    }
}

impl Reservation {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.permit.num_permits()
    }

    /// Holds `total` bytes in all, waiting up to the wait timeout for the lane; moves to the
    /// large lane when `total` passes [`LARGE_WORK_BYTES_MIN`]. On a shortfall, what was held
    /// stays held until the reservation drops.
    pub async fn hold(&mut self, total: usize) -> Result<(), Shortfall> {
        let Some(growth) = self.growth(total)? else {
            return Ok(());
        };
        let lane = Arc::clone(self.lanes.lane(growth.large));
        let permit = match Arc::clone(&lane).try_acquire_many_owned(growth.permits) {
            Ok(permit) => Ok(permit),
            // The lanes are never closed, so an error can only be the timeout.
            Err(_) => tokio::time::timeout(
                self.lanes.wait_timeout,
                lane.acquire_many_owned(growth.permits),
            )
            .await
            .map_err(|_| ())
            .and_then(|acquired| acquired.map_err(|_| ())),
        };
        self.commit(growth, permit.ok())
    }

    /// [`hold`](Self::hold) without waiting: for a worker thread, which must not block.
    pub fn try_hold(&mut self, total: usize) -> Result<(), Shortfall> {
        let Some(growth) = self.growth(total)? else {
            return Ok(());
        };
        let lane = Arc::clone(self.lanes.lane(growth.large));
        self.commit(growth, lane.try_acquire_many_owned(growth.permits).ok())
    }

    /// How to grow to `total`, with the connection's share already claimed for it; `None`
    /// when `total` is already held.
    fn growth(&self, total: usize) -> Result<Option<Growth>, Shortfall> {
        let held = self.bytes();
        if total <= held {
            return Ok(None);
        }
        let more = total - held;
        let large = self.large || total > LARGE_WORK_BYTES_MIN;
        let moving = large && !self.large;
        // A permit count beyond u32 could never be granted (WorkBounds::check keeps every
        // request that the size limits accept below it).
        let permits =
            u32::try_from(if moving { total } else { more }).map_err(|_| Shortfall::Lane)?;
        // Relaxed: the share is a bound on a count, ordered by nothing else.
        let share_bytes = self.lanes.connection_bytes_max;
        let before = self.connection.held_bytes.fetch_add(more, Ordering::Relaxed);
        if before + more > share_bytes {
            self.connection.held_bytes.fetch_sub(more, Ordering::Relaxed);
            return Err(Shortfall::Connection { held_bytes: before, share_bytes });
        }
        Ok(Some(Growth { more, permits, large, moving }))
    }

    /// Takes `permit` for `growth`, or gives the connection's claim back when none came.
    fn commit(
        &mut self,
        growth: Growth,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<(), Shortfall> {
        let Some(permit) = permit else {
            self.connection.held_bytes.fetch_sub(growth.more, Ordering::Relaxed);
            return Err(Shortfall::Lane);
        };
        if growth.moving {
            // The small lane's share is released as the old permit drops.
            self.permit = permit;
            self.large = true;
        } else {
            self.permit.merge(permit);
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // The permit gives its bytes back to the lane as it drops; the share is counted here.
        self.connection.held_bytes.fetch_sub(self.bytes(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(small: usize, large: usize, share: usize) -> WorkBudget {
        WorkBudget::new(&WorkBounds {
            work_bytes_max: small,
            large_work_bytes_max: large,
            connection_work_bytes_max: share,
            wait_timeout: Duration::from_millis(20),
        })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
    }

    fn connection() -> Arc<ConnectionWork> {
        Arc::new(ConnectionWork::default())
    }

    /// A full large lane refuses the next large request and leaves the small lane's room to
    /// small ones; room comes back when a reservation drops.
    #[test]
    fn large_requests_wait_in_their_own_lane() {
        let large = LARGE_WORK_BYTES_MIN + 1;
        let budget = budget(2 * LARGE_WORK_BYTES_MIN, large, usize::MAX);
        runtime().block_on(async {
            let first = budget.reserve(large, &connection()).await.expect("the lane holds one");
            let second = budget.reserve(large, &connection()).await.err();
            assert_eq!(second, Some(Shortfall::Lane), "the second waits, then is refused");
            let small = budget.reserve(LARGE_WORK_BYTES_MIN, &connection()).await;
            assert!(small.is_ok(), "small requests keep their lane");
            drop(first);
            assert_eq!(budget.reserve(large, &connection()).await.map(|r| r.bytes()), Ok(large));
        });
    }

    /// A reservation starts small and moves to the large lane as it grows (a chunked body, or
    /// an answer larger than its body), releasing its small-lane share; growth past the lane is
    /// refused, and a worker's growth without waiting too.
    #[test]
    fn a_growing_reservation_moves_to_the_large_lane() {
        let budget = budget(LARGE_WORK_BYTES_MIN, 3 * LARGE_WORK_BYTES_MIN, usize::MAX);
        runtime().block_on(async {
            let mut work = budget.reserve(0, &connection()).await.unwrap();
            assert_eq!(work.hold(LARGE_WORK_BYTES_MIN).await, Ok(()));
            assert_eq!(budget.lanes.small.available_permits(), 0);
            assert_eq!(work.try_hold(LARGE_WORK_BYTES_MIN + 1), Ok(()));
            assert_eq!(budget.lanes.small.available_permits(), LARGE_WORK_BYTES_MIN, "given back");
            assert_eq!(work.bytes(), LARGE_WORK_BYTES_MIN + 1);
            assert_eq!(work.hold(2 * LARGE_WORK_BYTES_MIN + 1).await, Ok(()));
            assert_eq!(work.try_hold(4 * LARGE_WORK_BYTES_MIN), Err(Shortfall::Lane));
            assert_eq!(work.hold(4 * LARGE_WORK_BYTES_MIN).await, Err(Shortfall::Lane));
            assert_eq!(work.try_hold(10), Ok(()), "what is held needs no room");
            drop(work);
            assert_eq!(budget.lanes.large.available_permits(), 3 * LARGE_WORK_BYTES_MIN);
        });
    }

    /// One connection holds at most its share over all its reservations, refused at once (not
    /// after the wait); another connection still gets room, and the share comes back with the
    /// reservations.
    #[test]
    fn a_connection_holds_at_most_its_share() {
        let budget = budget(1 << 20, LARGE_WORK_BYTES_MAX_DEFAULT, 1000);
        runtime().block_on(async {
            let greedy = connection();
            let answer = budget.reserve(600, &greedy).await.unwrap();
            let mut next = budget.reserve(300, &greedy).await.unwrap();
            let started = tokio::time::Instant::now();
            let refused = next.hold(500).await;
            assert_eq!(refused, Err(Shortfall::Connection { held_bytes: 900, share_bytes: 1000 }));
            assert!(started.elapsed() < Duration::from_millis(20), "refused without waiting");
            assert_eq!(greedy.held_bytes(), 900, "a refusal claims nothing");
            assert!(budget.reserve(1000, &connection()).await.is_ok(), "others keep their share");
            drop(answer);
            assert_eq!(next.hold(900).await, Ok(()));
            drop(next);
            assert_eq!(greedy.held_bytes(), 0);
        });
    }

    #[test]
    fn bounds_that_could_never_admit_a_request_are_refused() {
        let bounds = WorkBounds::default();
        assert!(bounds.check(BODY_BYTES_MAX_DEFAULT).is_ok());
        let error = bounds.check(2 * BODY_BYTES_MAX_DEFAULT).unwrap_err();
        assert!(error.contains("large_work_bytes_max"), "{error}");
        let tiny = WorkBounds { work_bytes_max: 10, ..bounds };
        assert!(tiny.check(1000).unwrap_err().contains("work_bytes_max"));
        assert!(tiny.check(10).is_ok());
        let stingy = WorkBounds { connection_work_bytes_max: 10, ..bounds };
        assert!(stingy.check(11).unwrap_err().contains("connection_work_bytes_max"));
    }
}
