//! The `process_*` metrics every Prometheus client library exports, read from `/proc/self` at
//! scrape time (Linux; elsewhere the collector exports nothing): the names and meanings follow
//! the Prometheus client guidelines, so existing dashboards and alerts work unchanged.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// What one read of `/proc/self` found.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessSample {
    pub cpu_seconds: f64,
    pub resident_memory_bytes: i64,
    pub virtual_memory_bytes: i64,
    pub start_time_seconds: i64,
    pub threads: i64,
    pub open_fds: i64,
    pub max_fds: i64,
}

/// Registers the collector: `registry.register_collector(Box::new(ProcessCollector))`.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl ProcessSample {
    /// Reads this process's figures; `None` where `/proc/self/stat` cannot be read or parsed.
    pub fn read() -> Option<ProcessSample> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let fields = fields_after_name(&stat)?;
        let field = |n: usize| stat_field(&fields, n);
        let ticks = sysconf(libc::_SC_CLK_TCK)? as f64;
        let page_bytes = sysconf(libc::_SC_PAGESIZE)?;
        let started_ticks = field(22)?;
        Some(ProcessSample {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            resident_memory_bytes: (field(24)? * page_bytes) as i64,
            virtual_memory_bytes: field(23)? as i64,
            start_time_seconds: (boot_time_seconds()? + (started_ticks as f64 / ticks) as u64)
                as i64,
            threads: field(20)? as i64,
            open_fds: std::fs::read_dir("/proc/self/fd").map_or(0, |dir| dir.count() as i64),
            max_fds: max_fds(),
        })
    }
}

/// CPU seconds (user + system) process `pid` has used; `None` where its `/proc/PID/stat`
/// cannot be read or parsed (the process is gone, or not Linux).
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = fields_after_name(&stat)?;
    let ticks = sysconf(libc::_SC_CLK_TCK)? as f64;
    Some((stat_field(&fields, 14)? + stat_field(&fields, 15)?) as f64 / ticks)
}

/// The nice value for threads that do slow work on a client's behalf (argon2 hashing): they
/// may keep every core busy under a flood of logins, and the threads that serve sessions must
/// still run first when they have work.
pub const HASHING_NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority to `nice` (Linux: the nice value is per
/// thread; lowering needs no privilege, raising does).
pub fn set_this_threads_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid takes no arguments and cannot fail.
    let thread_id = unsafe { libc::gettid() } as libc::id_t;
    // SAFETY: setpriority changes one thread's priority (PRIO_PROCESS with a thread id applies
    // to that thread only); it takes no pointer.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, thread_id, nice) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The nice value of each thread of this process whose name starts with `prefix` (from
/// `/proc/self/task`); empty where none is named so, or not Linux.
pub fn nice_of_threads_named(prefix: &str) -> Vec<i64> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let named = |task: &std::path::Path| {
        std::fs::read_to_string(task.join("comm")).is_ok_and(|name| name.starts_with(prefix))
    };
    let nice = |task: &std::path::Path| {
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        fields_after_name(&stat)?.get(19 - 3)?.parse().ok()
    };
    let paths = tasks.filter_map(|task| Some(task.ok()?.path()));
    paths.filter(|task| named(task)).filter_map(|task| nice(&task)).collect()
}

/// Waits up to `timeout` until at least `count` threads named `prefix…` run at `nice` (threads
/// set their own priority when they start); the nice values last found, where they never did.
pub fn await_threads_at_nice(
    prefix: &str,
    count: usize,
    nice: i32,
    timeout: std::time::Duration,
) -> Result<(), Vec<i64>> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let found = nice_of_threads_named(prefix);
        if found.len() >= count && found.iter().all(|&n| n == i64::from(nice)) {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(found);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The fields of a `stat` line after the command name (field 2, in parentheses, which may hold
/// spaces): the first is field 3 of proc(5).
fn fields_after_name(stat: &str) -> Option<Vec<&str>> {
    Some(stat.get(stat.rfind(')')? + 2..)?.split_ascii_whitespace().collect())
}

/// Field `n` of proc(5)'s numbering, from [`fields_after_name`]'s list.
fn stat_field(fields: &[&str], n: usize) -> Option<u64> {
    fields.get(n - 3)?.parse().ok()
}

fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf reads a system constant; it takes no pointer.
    let value = unsafe { libc::sysconf(name) };
    u64::try_from(value).ok().filter(|&v| v > 0)
}

/// When the machine booted, in seconds since the epoch (`btime` in `/proc/stat`).
fn boot_time_seconds() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())
}

/// The soft limit on open descriptors.
fn max_fds() -> i64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we own and pass by a valid pointer.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc == 0 { i64::try_from(limit.rlim_cur).unwrap_or(i64::MAX) } else { -1 }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(sample) = ProcessSample::read() else { return Ok(()) };
        let cpu = ConstCounter::new(sample.cpu_seconds);
        let help = "user and system CPU time spent, in seconds";
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            help,
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            ("process_resident_memory_bytes", "resident memory size", sample.resident_memory_bytes),
            ("process_virtual_memory_bytes", "virtual memory size", sample.virtual_memory_bytes),
            (
                "process_start_time_seconds",
                "start time of the process since the epoch, in seconds",
                sample.start_time_seconds,
            ),
            ("process_threads", "OS threads in the process", sample.threads),
            ("process_open_fds", "open file descriptors", sample.open_fds),
            ("process_max_fds", "the limit on open file descriptors", sample.max_fds),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_processs_cpu_reads_by_pid_and_a_gone_one_reads_as_none() {
        let mine = cpu_seconds_of(std::process::id()).expect("this process by its pid");
        let sample = ProcessSample::read().expect("/proc/self/stat");
        assert!(mine >= 0.0 && mine <= sample.cpu_seconds, "{mine} against {sample:?}");
        assert_eq!(cpu_seconds_of(u32::MAX), None, "no process has that pid");
    }

    #[test]
    fn this_process_reads_as_alive_with_memory_threads_and_descriptors() {
        let before = ProcessSample::read().expect("/proc/self/stat");
        // Work that costs CPU time and holds a descriptor, so the second read must move.
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = ProcessSample::read().unwrap();
        assert!(after.resident_memory_bytes > 1 << 20, "{after:?}");
        assert!(after.threads >= 1 && after.max_fds > 0, "{after:?}");
        assert!(after.open_fds > before.open_fds - 1, "{before:?} {after:?}");
        assert!(after.cpu_seconds > before.cpu_seconds, "{before:?} {after:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        let age = now.as_secs() as i64 - after.start_time_seconds;
        assert!((0..3600).contains(&age), "started {age} s ago? {after:?}");
        drop(file);
    }
}
