//! The per-message budget of a `mq bench` phase: where the CPU went (the node's threads,
//! PostgreSQL's processes, the load generator, the whole host) and what crossed the wires,
//! each divided by the messages the phase moved.
//!
//! CPU times come from `/proc` (Linux; elsewhere the budget's CPU columns are empty):
//! - the node runs on its own tokio runtime whose threads are named [`NODE_THREAD_NAME`], so
//!   its CPU is the sum over `/proc/self/task/*/stat` of those threads;
//! - the load generator is this process minus the node's threads;
//! - PostgreSQL is its postmaster (with the children it has reaped) plus its live children,
//!   found from a backend's parent pid; a server on another host or in another pid namespace
//!   is not measurable (`None`);
//! - the host is `/proc/stat`'s busy time (all CPUs, every process, the kernel's interrupts).
//!
//! Resolution is one clock tick (10 ms): a 5-second phase at one busy core reads to 0.2%.

use serde::Serialize;

/// The name of the node's runtime threads in a bench (at most 15 bytes: the kernel's `comm`).
pub const NODE_THREAD_NAME: &str = "mq-bench-node";

/// Clock ticks per second of `/proc`'s CPU times (`USER_HZ`, 100 on every Linux ABI).
const TICKS_PER_S: f64 = 100.0;

/// CPU seconds read at one instant; `None` where a source cannot be read.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    process: Option<f64>,
    node_threads: Option<f64>,
    postgres: Option<f64>,
    host_busy: Option<f64>,
}

impl CpuSample {
    /// Reads every source; `postmaster` is PostgreSQL's postmaster pid when it is local.
    pub fn read(postmaster: Option<u32>) -> CpuSample {
        CpuSample {
            process: stat_ticks("/proc/self/stat", false).map(ticks_to_s),
            node_threads: node_thread_ticks().map(ticks_to_s),
            postgres: postmaster.and_then(postgres_ticks).map(ticks_to_s),
            host_busy: host_busy_ticks().map(ticks_to_s),
        }
    }
}

/// CPU microseconds per message of one phase.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CpuPerMessage {
    pub node_us: Option<f64>,
    pub postgres_us: Option<f64>,
    /// This process minus the node: the load generator (TCP clients or SQL connections).
    pub load_generator_us: Option<f64>,
    pub host_us: Option<f64>,
}

impl CpuPerMessage {
    /// The CPU between `before` and `after`, per message of `messages`.
    pub fn between(before: &CpuSample, after: &CpuSample, messages: u64) -> CpuPerMessage {
        let per = |f: fn(&CpuSample) -> Option<f64>| -> Option<f64> {
            let spent = f(after)? - f(before)?;
            (messages > 0).then(|| spent.max(0.0) * 1e6 / messages as f64)
        };
        let node_us = per(|s| s.node_threads);
        let process_us = per(|s| s.process);
        CpuPerMessage {
            node_us,
            postgres_us: per(|s| s.postgres),
            load_generator_us: process_us.map(|p| (p - node_us.unwrap_or(0.0)).max(0.0)),
            host_us: per(|s| s.host_busy),
        }
    }
}

fn ticks_to_s(ticks: u64) -> f64 {
    ticks as f64 / TICKS_PER_S
}

/// The fields of a `/proc/.../stat` line after the command name (which may hold spaces);
/// `fields[0]` is proc(5)'s field 3.
fn stat_fields(text: &str) -> Option<(&str, Vec<&str>)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?;
    Some((name, text.get(close + 2..)?.split_ascii_whitespace().collect()))
}

/// utime + stime (fields 14 and 15), plus the reaped children's cutime + cstime (16 and 17)
/// when `with_children`.
fn stat_ticks(path: &str, with_children: bool) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    let (_, fields) = stat_fields(&text)?;
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let own = field(14)? + field(15)?;
    Some(if with_children { own + field(16)? + field(17)? } else { own })
}

/// The CPU ticks of this process's threads named [`NODE_THREAD_NAME`].
fn node_thread_ticks() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let path = task.path().join("stat");
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let Some((name, fields)) = stat_fields(&text) else { continue };
        if name.starts_with(NODE_THREAD_NAME) {
            let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
            total += field(14).unwrap_or(0) + field(15).unwrap_or(0);
        }
    }
    Some(total)
}

/// The postmaster of the backend `backend_pid`, if that backend runs on this host.
pub fn postmaster_of(backend_pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{backend_pid}/stat")).ok()?;
    let (name, fields) = stat_fields(&text)?;
    // A pid of this host that is not a PostgreSQL process means the server is elsewhere.
    if !name.starts_with("postgres") {
        return None;
    }
    fields.get(1)?.parse().ok()
}

/// The postmaster's CPU with its reaped children, plus its live children's.
fn postgres_ticks(postmaster: u32) -> Option<u64> {
    let mut total = stat_ticks(&format!("/proc/{postmaster}/stat"), true)?;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, fields)) = stat_fields(&text) else { continue };
        if fields.get(1).and_then(|p| p.parse::<u32>().ok()) != Some(postmaster) {
            continue;
        }
        let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
        total += field(14).unwrap_or(0) + field(15).unwrap_or(0);
    }
    Some(total)
}

/// All CPUs' busy ticks: everything but idle and iowait (`/proc/stat`'s `cpu` line).
fn host_busy_ticks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> =
        line.split_ascii_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    let (idle, iowait) = (*values.get(3)?, *values.get(4)?);
    // Guest time (fields 9 and 10) is already counted in user time.
    let total: u64 = values.iter().take(8).sum();
    Some(total - idle - iowait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_parsed() {
        let line = "42 (a (b) c) S 7 42 42 0 -1 4194560 1 0 0 0 150 25 3 4 20 0 1 0";
        let (name, fields) = stat_fields(line).unwrap();
        assert_eq!(name, "a (b) c");
        assert_eq!(fields[0], "S");
        assert_eq!(fields[1], "7", "field 4 is the parent pid");
        assert_eq!(fields[14 - 3], "150");
    }

    #[test]
    fn this_process_spends_cpu_and_per_message_figures_divide_it() {
        let before = CpuSample::read(None);
        let spent = |s: &CpuSample| s.process.unwrap() - before.process.unwrap();
        // Spin until this process has spent 100 ms of CPU (however loaded the host is).
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while spent(&CpuSample::read(None)) < 0.1 && start.elapsed().as_secs() < 30 {
            for _ in 0..100_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
        let after = CpuSample::read(None);
        let cpu = CpuPerMessage::between(&before, &after, 1000);
        // ≥ 100 ms over 1000 messages: ≥ 100 µs each (more if other tests ran meanwhile).
        let load = cpu.load_generator_us.expect("/proc/self/stat is readable on Linux");
        assert!(load >= 100.0, "{load}");
        assert_eq!(cpu.node_us, Some(0.0), "no node threads run in this test");
        assert!(cpu.postgres_us.is_none());
        assert!(cpu.host_us.unwrap() > 0.0);
        assert!(CpuPerMessage::between(&before, &after, 0).host_us.is_none());
    }
}
