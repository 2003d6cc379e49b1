//! The two measurements, written once for every [`Peer`]: 1→1 throughput and pinned
//! ping-pong latency.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use pipeline::placement::{CpuId, Topology, pin_current_thread};

use super::peers::{Payload, Peer};
use stats::LatencyHistogram;

/// Slots in every queue under test (all peers get the same bound).
pub const CAPACITY_SLOTS: usize = 4096;
pub use super::peers::BATCH_SLOTS_MAX;
/// Share of ping-pong round trips discarded as warm-up (caches, branch predictors, pages).
const WARMUP_FRACTION: u64 = 10;

/// The CPUs the two benchmark threads are pinned to, if pinning is possible.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct CpuPair {
    pub producer: Option<CpuId>,
    pub consumer: Option<CpuId>,
}

impl CpuPair {
    /// Two CPUs on different physical cores, skipping the first core (left to the OS) when
    /// there are at least three; unpinned when there are fewer than two cores or `pin` is off.
    pub fn choose(pin: bool) -> CpuPair {
        let unpinned = CpuPair { producer: None, consumer: None };
        if !pin {
            return unpinned;
        }
        let Ok(topology) = Topology::detect() else { return unpinned };
        let cores = topology.usable_cores();
        let first_cpu = |index: usize| cores.get(index).and_then(|core| core.cpus.first().copied());
        match cores.len() {
            0 | 1 => unpinned,
            2 => CpuPair { producer: first_cpu(0), consumer: first_cpu(1) },
            _ => CpuPair { producer: first_cpu(1), consumer: first_cpu(2) },
        }
    }

    pub fn is_pinned(&self) -> bool {
        self.producer.is_some() && self.consumer.is_some()
    }
}

fn pin(cpu: Option<CpuId>) {
    if let Some(cpu) = cpu
        && let Err(error) = pin_current_thread(&[cpu])
    {
        tracing::warn!(cpu, %error, "could not pin benchmark thread; continuing unpinned");
    }
}

/// Moves `messages` from one thread to another in batches of `batch`; returns messages per
/// second, timed on the consumer from the common start until the last message arrives.
/// Fails if any message is lost, duplicated or reordered.
pub fn throughput<P: Peer<M>, M: Payload>(
    messages: u64,
    batch: usize,
    cpus: CpuPair,
) -> anyhow::Result<f64> {
    assert!((1..=BATCH_SLOTS_MAX).contains(&batch), "batch {batch} out of range");
    let (mut tx, mut rx) = P::build(CAPACITY_SLOTS, BATCH_SLOTS_MAX);
    let start = Arc::new(Barrier::new(2));
    let producer_start = start.clone();
    let producer = std::thread::spawn(move || {
        pin(cpus.producer);
        let mut buffer = vec![M::default(); batch];
        producer_start.wait();
        let mut next = 0u64;
        while next < messages {
            let n = (messages - next).min(batch as u64) as usize;
            for (offset, slot) in buffer[..n].iter_mut().enumerate() {
                *slot = M::with_seq(next + offset as u64);
            }
            P::send(&mut tx, &buffer[..n]);
            next += n as u64;
        }
    });
    let consumer = std::thread::spawn(move || {
        pin(cpus.consumer);
        start.wait();
        let started = Instant::now();
        let (mut received, mut in_order) = (0u64, true);
        while received < messages {
            let n = P::receive(&mut rx, BATCH_SLOTS_MAX, |message| {
                in_order &= message.seq() == received;
                received += 1;
            });
            if n == 0 {
                std::hint::spin_loop();
            }
        }
        (started.elapsed(), in_order)
    });
    producer.join().map_err(|_| anyhow::anyhow!("{} producer panicked", P::NAME))?;
    let (elapsed, in_order) =
        consumer.join().map_err(|_| anyhow::anyhow!("{} consumer panicked", P::NAME))?;
    anyhow::ensure!(in_order, "{}: messages arrived out of order or duplicated", P::NAME);
    Ok(messages as f64 / elapsed.as_secs_f64())
}

/// Bounces one message between two threads `round_trips` times over two queues and records
/// half of each round trip (the one-way hop) in nanoseconds.
pub fn ping_pong<P: Peer<M>, M: Payload>(
    round_trips: u64,
    cpus: CpuPair,
) -> anyhow::Result<LatencyHistogram> {
    let (mut ping_tx, mut ping_rx) = P::build(CAPACITY_SLOTS, BATCH_SLOTS_MAX);
    let (mut pong_tx, mut pong_rx) = P::build(CAPACITY_SLOTS, BATCH_SLOTS_MAX);
    let echo = std::thread::spawn(move || {
        pin(cpus.consumer);
        let mut echoed = 0;
        while echoed < round_trips {
            let mut message = M::default();
            if P::receive(&mut ping_rx, 1, |m| message = *m) == 1 {
                P::send(&mut pong_tx, std::slice::from_ref(&message));
                echoed += 1;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    pin(cpus.producer);
    let mut histogram = LatencyHistogram::new();
    let warmup = round_trips / WARMUP_FRACTION;
    for seq in 0..round_trips {
        let sent = Instant::now();
        P::send(&mut ping_tx, &[M::with_seq(seq)]);
        let mut echoed_seq = None;
        while P::receive(&mut pong_rx, 1, |m| echoed_seq = Some(m.seq())) == 0 {
            std::hint::spin_loop();
        }
        let round_trip = sent.elapsed();
        anyhow::ensure!(echoed_seq == Some(seq), "{}: echo out of order", P::NAME);
        if seq >= warmup {
            histogram.record_ns(duration_ns(round_trip) / 2);
        }
    }
    echo.join().map_err(|_| anyhow::anyhow!("{} echo thread panicked", P::NAME))?;
    unpin_current_thread();
    Ok(histogram)
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Gives the calling thread back every usable CPU after a pinned measurement.
fn unpin_current_thread() {
    if let Ok(topology) = Topology::detect()
        && let Err(error) = pin_current_thread(&topology.usable_cpus)
    {
        tracing::warn!(%error, "could not restore the benchmark thread's CPU affinity");
    }
}

/// How long an idle waiter is observed when measuring its CPU cost.
pub const IDLE_OBSERVATION: Duration = Duration::from_millis(200);

/// The share of one CPU that a consumer waiting with `strategy` burns while its ring stays
/// empty for [`IDLE_OBSERVATION`]: thread CPU time over wall time, both read by the waiter.
pub fn idle_cpu_fraction(strategy: pipeline::WaitStrategy) -> anyhow::Result<f64> {
    let config = pipeline::RingConfig { capacity_slots: 64, batch_slots_max: 64, wait: strategy };
    let (mut tx, mut rx) = pipeline::connector::<u64>(pipeline::ConnectorKind::LockFree, &config)?;
    let waiter = std::thread::spawn(move || {
        let (wall_start, cpu_start) = (Instant::now(), thread_cpu_time());
        let received = rx.wait_read_batch(1, |_| {});
        let (wall, cpu) = (wall_start.elapsed(), thread_cpu_time().saturating_sub(cpu_start));
        received.map(|_| cpu.as_secs_f64() / wall.as_secs_f64())
    });
    std::thread::sleep(IDLE_OBSERVATION);
    tx.push(1).map_err(|_| anyhow::anyhow!("idle waiter exited early"))?;
    let fraction = waiter.join().map_err(|_| anyhow::anyhow!("idle waiter panicked"))??;
    Ok(fraction)
}

/// CPU time of the calling thread (zero if the clock cannot be read).
pub(crate) fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs no other state.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// One-way line transfers below this many nanoseconds mean the two CPUs share a cache
/// (hyperthreads of one core, or cores under one L2): this VM measured 40–60 ns then, and
/// 180–270 ns when its vCPUs sat on cores that share only the L3 or less.
pub const SHARED_CACHE_TRANSFER_NS_MAX: u64 = 100;
/// Round trips the sharing probe times (after as many again of warm-up).
const PROBE_ROUND_TRIPS: u64 = 20_000;

/// Which cache the benchmark's two CPUs share, as a timing probe finds it: the host may put
/// a VM's two vCPUs on the hyperthreads of one core in one run and on separate cores in the
/// next, and the ratios of the ring to its peers differ between the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CacheSharing {
    /// Median one-way transfer of one cache line between the two CPUs, nanoseconds.
    pub line_transfer_ns: u64,
    /// `line_transfer_ns` < [`SHARED_CACHE_TRANSFER_NS_MAX`].
    pub shared: bool,
}

impl CacheSharing {
    /// "shared cache" or "separate caches", for labels.
    pub fn label(&self) -> &'static str {
        if self.shared { "shared cache" } else { "separate caches" }
    }
}

/// A counter alone on its pair of cache lines (the adjacent-line prefetcher pulls pairs).
#[repr(align(128))]
struct CacheLine(std::sync::atomic::AtomicU64);

/// Times one cache line bounced between the two CPUs (no queue: a counter each side bumps
/// in turn) and classifies the pair. Unpinned threads give whatever the scheduler chose.
pub fn probe_cache_sharing(cpus: CpuPair) -> anyhow::Result<CacheSharing> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let line = Arc::new(CacheLine(AtomicU64::new(0)));
    let rounds = 2 * PROBE_ROUND_TRIPS;
    let echo_line = line.clone();
    let echo = std::thread::spawn(move || {
        pin(cpus.consumer);
        for round in 0..rounds {
            // Acquire/Release: each side's turn follows the other's (the values carry the turn).
            while echo_line.0.load(Ordering::Acquire) != 2 * round + 1 {
                std::hint::spin_loop();
            }
            echo_line.0.store(2 * round + 2, Ordering::Release);
        }
    });
    pin(cpus.producer);
    let mut one_way_ns = Vec::with_capacity(PROBE_ROUND_TRIPS as usize);
    for round in 0..rounds {
        let sent = Instant::now();
        line.0.store(2 * round + 1, Ordering::Release);
        while line.0.load(Ordering::Acquire) != 2 * round + 2 {
            std::hint::spin_loop();
        }
        if round >= PROBE_ROUND_TRIPS {
            one_way_ns.push(duration_ns(sent.elapsed()) / 2);
        }
    }
    echo.join().map_err(|_| anyhow::anyhow!("cache sharing probe thread panicked"))?;
    unpin_current_thread();
    one_way_ns.sort_unstable();
    let line_transfer_ns = one_way_ns[one_way_ns.len() / 2];
    Ok(CacheSharing { line_transfer_ns, shared: line_transfer_ns < SHARED_CACHE_TRANSFER_NS_MAX })
}
