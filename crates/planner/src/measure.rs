//! The measurement module: a node's service rate and CPU share per job on this host, and the
//! host's resources.
//!
//! A node is measured alone on the calling thread, running its real work flat out on generated
//! input: `jobs / wall time` is its service rate per thread (μ) and `thread CPU time / wall
//! time` its CPU share (1.0 when CPU-bound, lower when it waits on fsync or a database). CPU
//! time comes from `CLOCK_THREAD_CPUTIME_ID`, so other threads and processes do not count.
//! A pipeline crate implements [`Workload`] to turn these measurements into a model file.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::PlanError;
use crate::model::{HostSpec, NetworkSpec};

/// Bytes written (then fsynced) to estimate the disk's sustained write bandwidth.
const DISK_PROBE_BYTES: usize = 16 << 20;
/// Size of each write of the disk probe.
const DISK_PROBE_CHUNK_BYTES: usize = 1 << 20;

/// A pipeline whose nodes the planner can measure (implemented by e.g. `cdr`).
pub trait Workload {
    /// The name used on the command line (`leantier plan measure NAME`).
    fn name(&self) -> &str;
    /// Measures every node alone for about `duration_per_node`, using `scratch_dir` for files,
    /// and returns the network model (host resources included). `settings` are the
    /// workload's own `KEY=VALUE` options (e.g. an fsync policy); unknown keys are bad input.
    fn measure(
        &self,
        duration_per_node: Duration,
        scratch_dir: &Path,
        settings: &[(String, String)],
    ) -> Result<NetworkSpec, PlanError>;
}

fn cpu_clock_ns(clock: libc::clockid_t) -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; the thread and process CPU clocks are
    // supported on every Linux kernel this crate targets; the call writes only through it.
    let status = unsafe { libc::clock_gettime(clock, &mut now) };
    assert_eq!(status, 0, "clock_gettime({clock}) failed");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// CPU time consumed by the calling thread, in nanoseconds.
pub fn thread_cpu_time_ns() -> u64 {
    cpu_clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time consumed by the whole process (all threads), in nanoseconds.
pub fn process_cpu_time_ns() -> u64 {
    cpu_clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Cores this process can actually get: one busy thread per core for `duration`, summing the
/// CPU time they received over the wall time. On a shared host this is below the core count,
/// and it is the budget the pipeline really has.
pub fn available_cores(duration: Duration) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Instant::now();
    let cpu_ns: u64 = std::thread::scope(|scope| {
        let spinners: Vec<_> = (0..cores)
            .map(|_| {
                scope.spawn(|| {
                    let cpu_start_ns = thread_cpu_time_ns();
                    while start.elapsed() < duration {
                        std::hint::spin_loop();
                    }
                    thread_cpu_time_ns() - cpu_start_ns
                })
            })
            .collect();
        spinners.into_iter().map(|spinner| spinner.join().unwrap_or(0)).sum()
    });
    (cpu_ns as f64 * 1e-9 / start.elapsed().as_secs_f64()).clamp(0.01, cores as f64)
}

/// What one node did while measured alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeSample {
    /// Jobs completed.
    pub jobs: u64,
    /// Wall-clock time of the run.
    pub wall_s: f64,
    /// CPU time of the measuring thread.
    pub cpu_s: f64,
}

impl NodeSample {
    /// μ: jobs per second of one busy thread, as measured (on a shared host, slowed by the
    /// time the thread waited for a core).
    pub fn service_rate_per_s(&self) -> f64 {
        self.jobs as f64 / self.wall_s
    }

    /// CPU time per job over wall time per job, clamped to (0, 1].
    pub fn cpu_share(&self) -> f64 {
        (self.cpu_s / self.wall_s).clamp(f64::MIN_POSITIVE, 1.0)
    }

    /// Service time per job on an uncontended core, split into CPU and off-CPU (I/O) time:
    /// `core_fraction` is the share of a core one busy thread gets on this host (1.0 when
    /// idle), so of the wall time per job, `cpu / core_fraction` was spent computing or
    /// waiting for a core, and the rest waiting on I/O. `overhead_cpu_s` is CPU time per job
    /// the node pays outside its own work (the stage runtime's hop).
    pub fn uncontended(&self, core_fraction: f64, overhead_cpu_s: f64) -> ServiceTime {
        let jobs = self.jobs as f64;
        let work_cpu_s = self.cpu_s / jobs;
        let io_s = (self.wall_s / jobs - work_cpu_s / core_fraction.clamp(0.01, 1.0)).max(0.0);
        ServiceTime { cpu_s: work_cpu_s + overhead_cpu_s, io_s }
    }
}

/// A job's service time on an uncontended core.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServiceTime {
    /// CPU time per job.
    pub cpu_s: f64,
    /// Off-CPU time per job (I/O, fsync, database round trips).
    pub io_s: f64,
}

impl ServiceTime {
    /// μ = 1 / (cpu + io).
    pub fn service_rate_per_s(&self) -> f64 {
        1.0 / (self.cpu_s + self.io_s)
    }

    /// cpu / (cpu + io), in (0, 1].
    pub fn cpu_share(&self) -> f64 {
        (self.cpu_s / (self.cpu_s + self.io_s)).clamp(f64::MIN_POSITIVE, 1.0)
    }
}

/// Calls `step(node)` (which does some jobs and returns how many) on this thread until
/// `duration` has passed, then `finish(node)` (which completes any buffered work, e.g. a final
/// batch or fsync) inside the measured time. The error is the caller's own (the node's work
/// fails in its terms); a node that completed no job converts into it.
pub fn measure_node<Node, E: From<PlanError>>(
    duration: Duration,
    node: &mut Node,
    mut step: impl FnMut(&mut Node) -> Result<u64, E>,
    finish: impl FnOnce(&mut Node) -> Result<(), E>,
) -> Result<NodeSample, E> {
    let cpu_start_ns = thread_cpu_time_ns();
    let start = Instant::now();
    let mut jobs = 0;
    while start.elapsed() < duration {
        jobs += step(node)?;
    }
    finish(node)?;
    let wall_s = start.elapsed().as_secs_f64();
    let cpu_s = (thread_cpu_time_ns() - cpu_start_ns) as f64 * 1e-9;
    if jobs == 0 {
        let why = format!("the node completed no job in {wall_s:.3} s");
        return Err(PlanError::NothingMeasured(why).into());
    }
    Ok(NodeSample { jobs, wall_s, cpu_s })
}

/// Detects the host: the cores this process can get (see [`available_cores`]), available
/// memory, disk write bandwidth (measured with a 16 MiB write and fsync in `scratch_dir`) and
/// the fastest non-loopback interface's speed.
pub fn detect_host(scratch_dir: &Path, cores_probe: Duration) -> Result<HostSpec, PlanError> {
    Ok(HostSpec {
        cores: available_cores(cores_probe),
        memory_bytes: available_memory_bytes(),
        disk_bytes_per_s: Some(disk_write_bytes_per_s(scratch_dir)?),
        network_bytes_per_s: network_bytes_per_s(),
    })
}

fn available_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn disk_write_bytes_per_s(scratch_dir: &Path) -> Result<f64, PlanError> {
    let path = scratch_dir.join("leantier-disk-probe.bin");
    let chunk = vec![0x5a_u8; DISK_PROBE_CHUNK_BYTES];
    let probe = || {
        let start = Instant::now();
        let mut file = std::fs::File::create(&path)?;
        for _ in 0..DISK_PROBE_BYTES / DISK_PROBE_CHUNK_BYTES {
            file.write_all(&chunk)?;
        }
        file.sync_all()?;
        let elapsed_s = start.elapsed().as_secs_f64();
        std::fs::remove_file(&path)?;
        Ok(DISK_PROBE_BYTES as f64 / elapsed_s)
    };
    let what = || format!("probing the disk's write bandwidth with {}", path.display());
    probe().map_err(|source| PlanError::Io { what: what(), source })
}

/// Link speed from sysfs (Mbit/s → bytes/s); `None` when no interface reports one.
fn network_bytes_per_s() -> Option<f64> {
    let interfaces = std::fs::read_dir("/sys/class/net").ok()?;
    interfaces
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name() != "lo")
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("speed")).ok())
        .filter_map(|speed| speed.trim().parse::<i64>().ok())
        .filter(|&mbit| mbit > 0)
        .max()
        .map(|mbit| mbit as f64 * 1e6 / 8.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_loop_is_cpu_bound_and_sleep_is_not() {
        let busy = measure_node::<_, PlanError>(
            Duration::from_millis(50),
            &mut 0_u64,
            |sink| {
                for i in 0..10_000_u64 {
                    *sink = std::hint::black_box(sink.wrapping_mul(31).wrapping_add(i));
                }
                Ok(1)
            },
            |_| Ok(()),
        )
        .unwrap();
        let sleepy = measure_node::<_, PlanError>(
            Duration::from_millis(50),
            &mut (),
            |_| {
                std::thread::sleep(Duration::from_millis(5));
                Ok(1)
            },
            |_| Ok(()),
        )
        .unwrap();
        // Sleeping costs almost no CPU. Busy work would be 1.0 on an idle core; on a loaded
        // host the thread gets a fraction of one, still far above the sleeper's.
        assert!(sleepy.cpu_share() < 0.05, "{sleepy:?}");
        assert!(busy.cpu_share() > 5.0 * sleepy.cpu_share(), "{busy:?} vs {sleepy:?}");
        assert!(busy.cpu_s <= busy.wall_s * 1.01, "one thread cannot use more than its wall time");
        assert!(sleepy.service_rate_per_s() < 210.0, "{sleepy:?}");
        // The sleeper's time is off-CPU; the busy loop's is CPU once contention is removed.
        let sleep_time = sleepy.uncontended(busy.cpu_share(), 0.0);
        assert!(sleep_time.io_s > 0.004 && sleep_time.cpu_share() < 0.05, "{sleep_time:?}");
        let busy_time = busy.uncontended(busy.cpu_share(), 0.0);
        assert!(busy_time.cpu_share() > 0.99, "{busy_time:?}");
    }

    #[test]
    fn host_detection_reports_cores_and_a_disk_rate() {
        let dir = tempfile::tempdir().unwrap();
        let host = detect_host(dir.path(), Duration::from_millis(50)).unwrap();
        let nominal = std::thread::available_parallelism().unwrap().get() as f64;
        assert!(host.cores > 0.0 && host.cores <= nominal, "{host:?}");
        assert!(host.disk_bytes_per_s.unwrap() > 0.0);
        assert!(!dir.path().join("leantier-disk-probe.bin").exists());
    }
}
