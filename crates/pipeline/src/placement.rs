//! CPU placement: read the machine's topology, plan which thread runs where, pin threads.
//!
//! The lean business tier gives every critical-path stage its own core, keeps those cores on one
//! socket (cache-coherent hand-offs stay on one die), moves ancillary stages elsewhere and leaves
//! a core to the OS. This module turns that policy into a [`PlacementPlan`]:
//!
//! 1. [`Topology::detect`] reads `/sys/devices/system/cpu` (online CPUs, SMT siblings, sockets),
//!    `/sys/devices/system/node` (NUMA nodes) and the calling process's affinity mask
//!    (`sched_getaffinity`), which already reflects `taskset` and cgroup cpusets.
//! 2. [`PlacementPlan::new`] assigns each requested thread a set of CPUs. Critical threads take
//!    whole physical cores on the socket with the most usable cores, while enough CPUs remain for
//!    the others; the remaining threads take one CPU each, ancillary ones preferring the other
//!    sockets. One core is left to the OS when the machine has more cores than threads: the
//!    one servicing most device interrupts (`/proc/interrupts`), and critical threads take the
//!    least interrupted cores first.
//! 3. When threads outnumber usable CPUs the plan says so ([`PlacementPlan::oversubscribed`]):
//!    critical threads still get cores of their own while one core remains for the rest, the
//!    rest share that remainder, and every spinning wait strategy must be downgraded, because a
//!    spinning thread that shares its CPU burns the time slice its peer needs to make progress.
//! 4. [`pin_current_thread`] applies one thread's CPU set with `sched_setaffinity`
//!    ([`pin_thread`] another's, for helper threads spawned before the plan). Pinning can
//!    fail (a cpuset changed underneath us, a sandbox forbids it); that is reported, never fatal.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use serde::Serialize;

use crate::wait::WaitStrategy;

/// A logical CPU number as the kernel names it (`cpuN`).
pub type CpuId = usize;

/// Why the topology could not be read or a thread could not be pinned.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// A /sys file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the read returned.
        source: std::io::Error,
    },
    /// A /sys file did not hold a CPU list.
    #[error("cannot parse {path}: {text:?} is not a CPU list such as \"0-3,8\"")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
    /// The affinity mask and the online CPUs have nothing in common.
    #[error("no online CPU is in this process's affinity mask")]
    NoUsableCpus,
    /// Pinning to no CPU at all was asked for.
    #[error("cannot pin to an empty CPU set")]
    EmptyCpuSet,
    /// The thread has not run far enough to record the id pinning needs.
    #[error("the thread to pin has not recorded its id yet")]
    ThreadNotStarted,
    /// A CPU number too large for the affinity mask type.
    #[error("CPU {cpu} is beyond the {limit} CPUs an affinity mask can name")]
    CpuOutOfRange {
        /// The CPU asked for.
        cpu: CpuId,
        /// CPUs the mask can name.
        limit: usize,
    },
    /// The affinity system call failed.
    #[error("{call} failed: {source}")]
    Affinity {
        /// The call that failed.
        call: &'static str,
        /// The error it returned.
        source: std::io::Error,
    },
}

/// One physical core: the logical CPUs (SMT siblings) that share its execution units.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PhysicalCore {
    /// The physical package (socket) it belongs to.
    pub socket: usize,
    /// Its core id within the socket, as /sys numbers it.
    pub core_id: usize,
    /// Online siblings, ascending.
    pub cpus: Vec<CpuId>,
}

/// One NUMA node and its online CPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// The node number.
    pub node: usize,
    /// Its online CPUs, ascending.
    pub cpus: Vec<CpuId>,
}

/// The machine as this process sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Topology {
    /// Online logical CPUs, ascending.
    pub online_cpus: Vec<CpuId>,
    /// Online CPUs this process may run on (affinity mask ∩ online), ascending. Never empty.
    pub usable_cpus: Vec<CpuId>,
    /// Physical cores with at least one online CPU, ordered by their lowest CPU.
    pub cores: Vec<PhysicalCore>,
    /// NUMA nodes; empty when the kernel exposes none.
    pub numa_nodes: Vec<NumaNode>,
    /// CPUs removed from the scheduler with `isolcpus=` (good homes for critical stages).
    pub isolated_cpus: Vec<CpuId>,
    /// The cgroup's CPU quota in CPUs (`None`: no quota); see [`crate::quota`].
    pub cpu_quota_cores: Option<f64>,
    /// Device interrupts each CPU has handled since boot (empty: unknown); see
    /// [`crate::interrupts`].
    pub device_interrupts: BTreeMap<CpuId, u64>,
}

impl Topology {
    /// Reads the running machine: `/sys`, this process's affinity mask, its cgroup's CPU
    /// quota and where the device interrupts go.
    pub fn detect() -> Result<Topology, PlacementError> {
        let topology = Topology::from_sysfs(Path::new("/sys"), &current_affinity()?)?;
        let interrupts = crate::interrupts::current_device_interrupts_per_cpu();
        // Counts that leave out a usable CPU would make it look the quietest: use none then.
        let complete = topology.usable_cpus.iter().all(|cpu| interrupts.contains_key(cpu));
        Ok(Topology {
            device_interrupts: if complete { interrupts } else { BTreeMap::new() },
            ..topology.with_cpu_quota(crate::quota::current_cpu_quota_cores())
        })
    }

    /// The same machine under a CPU quota (in CPUs; `None`: none).
    pub fn with_cpu_quota(self, cpu_quota_cores: Option<f64>) -> Topology {
        Topology { cpu_quota_cores, ..self }
    }

    /// How many threads can run at once without sharing a CPU or being throttled: the usable
    /// CPUs, capped by the quota's whole CPUs (at least 1).
    pub fn usable_cpu_count(&self) -> usize {
        let cpus = self.usable_cpus.len();
        match self.cpu_quota_cores {
            // A quota of 1.5 CPUs cannot keep two spinning threads running: whole CPUs only.
            Some(quota) => cpus.min((quota.floor() as usize).max(1)),
            None => cpus,
        }
    }

    /// Reads a sysfs tree rooted at `sys_root` (normally `/sys`); `allowed_cpus` is the affinity
    /// mask. Missing per-CPU topology files (some containers) make each CPU its own core on
    /// socket 0, rather than failing.
    pub fn from_sysfs(sys_root: &Path, allowed_cpus: &[CpuId]) -> Result<Topology, PlacementError> {
        let cpu_dir = sys_root.join("devices/system/cpu");
        let online_cpus = read_cpu_list(&cpu_dir.join("online"))?;
        let usable_cpus: Vec<CpuId> =
            online_cpus.iter().copied().filter(|cpu| allowed_cpus.contains(cpu)).collect();
        if usable_cpus.is_empty() {
            return Err(PlacementError::NoUsableCpus);
        }
        let isolated_path = cpu_dir.join("isolated");
        let isolated_cpus =
            if isolated_path.exists() { read_cpu_list(&isolated_path)? } else { Vec::new() };
        Ok(Topology {
            cores: read_cores(&cpu_dir, &online_cpus)?,
            numa_nodes: read_numa_nodes(&sys_root.join("devices/system/node"))?,
            online_cpus,
            usable_cpus,
            isolated_cpus,
            cpu_quota_cores: None,
            device_interrupts: BTreeMap::new(),
        })
    }

    /// `cpus` CPUs (0..cpus) on one socket, one core each: the fallback when `/sys` cannot be
    /// read, which still lets the planner detect oversubscription.
    pub fn uniform(cpus: usize) -> Topology {
        let all: Vec<CpuId> = (0..cpus.max(1)).collect();
        Topology {
            cores: all
                .iter()
                .map(|&cpu| PhysicalCore { socket: 0, core_id: cpu, cpus: vec![cpu] })
                .collect(),
            online_cpus: all.clone(),
            usable_cpus: all,
            numa_nodes: Vec::new(),
            isolated_cpus: Vec::new(),
            cpu_quota_cores: None,
            device_interrupts: BTreeMap::new(),
        }
    }

    /// Distinct sockets (physical packages) with an online CPU, ascending.
    pub fn sockets(&self) -> Vec<usize> {
        let mut sockets: Vec<usize> = self.cores.iter().map(|core| core.socket).collect();
        sockets.sort_unstable();
        sockets.dedup();
        sockets
    }

    /// Physical cores restricted to usable CPUs; cores with no usable CPU are left out.
    pub fn usable_cores(&self) -> Vec<PhysicalCore> {
        self.cores
            .iter()
            .map(|core| PhysicalCore {
                cpus: core.cpus.iter().copied().filter(|c| self.usable_cpus.contains(c)).collect(),
                ..core.clone()
            })
            .filter(|core| !core.cpus.is_empty())
            .collect()
    }

    /// Device interrupts `cpu` has handled (0 when unknown).
    pub fn cpu_device_interrupts(&self, cpu: CpuId) -> u64 {
        self.device_interrupts.get(&cpu).copied().unwrap_or(0)
    }

    /// Device interrupts the CPUs of `core` have handled (0 when unknown).
    pub fn core_device_interrupts(&self, core: &PhysicalCore) -> u64 {
        core.cpus.iter().map(|&cpu| self.cpu_device_interrupts(cpu)).sum()
    }
}

fn read_trimmed(path: &Path) -> Result<String, PlacementError> {
    fs::read_to_string(path)
        .map(|text| text.trim().to_owned())
        .map_err(|source| PlacementError::Read { path: path.to_owned(), source })
}

fn read_cpu_list(path: &Path) -> Result<Vec<CpuId>, PlacementError> {
    let text = read_trimmed(path)?;
    parse_cpu_list(&text).ok_or_else(|| PlacementError::Parse { path: path.to_owned(), text })
}

fn read_number(path: &Path) -> Result<usize, PlacementError> {
    let text = read_trimmed(path)?;
    text.parse().map_err(|_| PlacementError::Parse { path: path.to_owned(), text })
}

/// Parses the kernel's CPU list format ("0-3,8,10-11"; empty means none). `None` if malformed.
pub fn parse_cpu_list(text: &str) -> Option<Vec<CpuId>> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|part| !part.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last): (CpuId, CpuId) = (first.parse().ok()?, last.parse().ok()?);
                if first > last {
                    return None;
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Groups online CPUs into physical cores by their SMT sibling list.
fn read_cores(cpu_dir: &Path, online_cpus: &[CpuId]) -> Result<Vec<PhysicalCore>, PlacementError> {
    // Keyed by the core's lowest sibling, so the result is ordered by lowest CPU.
    let mut cores: BTreeMap<CpuId, PhysicalCore> = BTreeMap::new();
    for &cpu in online_cpus {
        let topology = cpu_dir.join(format!("cpu{cpu}/topology"));
        if !topology.join("thread_siblings_list").exists() {
            cores.insert(cpu, PhysicalCore { socket: 0, core_id: cpu, cpus: vec![cpu] });
            continue;
        }
        let siblings = read_cpu_list(&topology.join("thread_siblings_list"))?;
        let online_siblings: Vec<CpuId> =
            siblings.into_iter().filter(|c| online_cpus.contains(c)).collect();
        let key = online_siblings.first().copied().unwrap_or(cpu);
        if cores.contains_key(&key) {
            continue;
        }
        let core = PhysicalCore {
            socket: read_number(&topology.join("physical_package_id"))?,
            core_id: read_number(&topology.join("core_id"))?,
            cpus: if online_siblings.is_empty() { vec![cpu] } else { online_siblings },
        };
        cores.insert(key, core);
    }
    Ok(cores.into_values().collect())
}

fn read_numa_nodes(node_dir: &Path) -> Result<Vec<NumaNode>, PlacementError> {
    let Ok(entries) = fs::read_dir(node_dir) else {
        return Ok(Vec::new());
    };
    let mut nodes = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(node) = name.to_str().and_then(|n| n.strip_prefix("node")?.parse().ok()) else {
            continue;
        };
        nodes.push(NumaNode { node, cpus: read_cpu_list(&entry.path().join("cpulist"))? });
    }
    nodes.sort_by_key(|n| n.node);
    Ok(nodes)
}

/// The calling thread's affinity mask (for the main thread: the process's, i.e. what
/// `taskset` and the cgroup cpuset allow).
pub fn current_affinity() -> Result<Vec<CpuId>, PlacementError> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 names the calling thread; `set` is a valid, writable cpu_set_t and the size
    // passed is its exact size.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        let source = std::io::Error::last_os_error();
        return Err(PlacementError::Affinity { call: "sched_getaffinity", source });
    }
    let cpus = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` < CPU_SETSIZE, the bit range of `set`.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect();
    Ok(cpus)
}

/// Restricts the calling thread to `cpus` (`sched_setaffinity` on thread id 0 = this thread).
pub fn pin_current_thread(cpus: &[CpuId]) -> Result<(), PlacementError> {
    let set = cpu_set(cpus)?;
    // SAFETY: pid 0 names the calling thread; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        let source = std::io::Error::last_os_error();
        return Err(PlacementError::Affinity { call: "sched_setaffinity", source });
    }
    Ok(())
}

/// A helper thread's kernel thread id, which the thread records itself when it starts, so
/// that another thread can pin it later ([`pin_thread`]): helper threads spawned before the
/// placement plan existed (journal writers, snapshot followers) are moved onto
/// [`PlacementPlan::floating_cpus`] once it does.
///
/// Why not `pthread_setaffinity_np` on the `JoinHandle`: glibc passes the thread's kernel id,
/// which the kernel clears to 0 when the thread exits, and 0 names the *calling* thread; a
/// helper that had stopped early would have moved the caller instead. A recorded id of an
/// exited thread just fails (`ESRCH`).
#[derive(Clone, Debug, Default)]
pub struct PinnableThread(Arc<AtomicI32>);

impl PinnableThread {
    /// Records the calling thread as the one to pin; call it first thing in the thread.
    pub fn record_current(&self) {
        // SAFETY: gettid has no preconditions and cannot fail.
        let tid = unsafe { libc::gettid() };
        // Release: pairs with `pin_thread`'s Acquire (nothing else is published with it).
        self.0.store(tid, Ordering::Release);
    }
}

/// Restricts the thread recorded in `thread` to `cpus`; an error if it has not recorded
/// itself yet or has exited.
pub fn pin_thread(thread: &PinnableThread, cpus: &[CpuId]) -> Result<(), PlacementError> {
    let set = cpu_set(cpus)?;
    // Acquire: pairs with `record_current`'s Release.
    let tid = thread.0.load(Ordering::Acquire);
    if tid == 0 {
        return Err(PlacementError::ThreadNotStarted);
    }
    // SAFETY: `tid` is a recorded, non-zero thread id (never 0, which would name the caller);
    // `set` is a valid cpu_set_t of the size passed. An exited thread makes the call fail.
    let rc = unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        let source = std::io::Error::last_os_error();
        return Err(PlacementError::Affinity { call: "sched_setaffinity", source });
    }
    Ok(())
}

/// `cpus` as the kernel's CPU set.
fn cpu_set(cpus: &[CpuId]) -> Result<libc::cpu_set_t, PlacementError> {
    if cpus.is_empty() {
        return Err(PlacementError::EmptyCpuSet);
    }
    let limit = libc::CPU_SETSIZE as usize;
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= limit {
            return Err(PlacementError::CpuOutOfRange { cpu, limit });
        }
        // SAFETY: `cpu` < CPU_SETSIZE was checked above, so the bit is inside `set`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    Ok(set)
}

/// Whether a thread is on the critical path of a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Role {
    /// Gets a dedicated core on the critical socket.
    Critical,
    /// Runs wherever is left, preferring the other sockets.
    Ancillary,
}

/// One thread the plan must place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadRequest {
    /// For reports and warnings, e.g. "core/0" (stage "core", worker 0).
    pub label: String,
    /// How the plan treats it (a dedicated core or a shared one).
    pub role: Role,
}

/// Where one thread runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ThreadPlacement {
    /// The request's label.
    pub label: String,
    /// The request's role.
    pub role: Role,
    /// The affinity set to pin to; never empty.
    pub cpus: Vec<CpuId>,
    /// No other planned thread may run on these CPUs.
    pub exclusive: bool,
    /// The thread also owns the SMT siblings of its CPU (they are left idle).
    pub whole_core: bool,
}

/// The result of planning: one [`ThreadPlacement`] per request, in request order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlacementPlan {
    /// One placement per request, in request order.
    pub threads: Vec<ThreadPlacement>,
    /// CPUs of the core left to the OS (interrupts, housekeeping), if one was left.
    pub os_reserved_cpus: Vec<CpuId>,
    /// The socket holding the critical-path cores, if any thread is critical.
    pub critical_socket: Option<usize>,
    /// More threads than usable CPUs: some threads share CPUs and must not spin.
    pub oversubscribed: bool,
    /// Where threads the plan does not place run (floating stages, a process's helper
    /// threads such as journal writers): the usable CPUs no exclusive placement holds, so that
    /// waking up they do not preempt a spinning critical thread; all usable CPUs when the
    /// exclusive placements hold every one.
    pub floating_cpus: Vec<CpuId>,
    /// Human-readable remarks (what was compromised and why), also logged by the runtime.
    pub notes: Vec<String>,
}

impl PlacementPlan {
    /// Plans `requests` onto the usable CPUs of `topology` (see the module docs for the policy).
    pub fn new(topology: &Topology, requests: &[ThreadRequest]) -> PlacementPlan {
        let mut cores = topology.usable_cores();
        let usable_cpu_count = topology.usable_cpu_count();
        let oversubscribed = requests.len() > usable_cpu_count;
        let mut notes = Vec::new();
        if oversubscribed {
            let quota = topology
                .cpu_quota_cores
                .map_or(String::new(), |quota| format!(" (cgroup quota {quota:.2} CPUs)"));
            notes.push(format!(
                "oversubscribed: {} threads on {usable_cpu_count} usable CPUs{quota}; threads \
                 share CPUs and spinning waits are downgraded to adaptive",
                requests.len()
            ));
        }
        for core in &mut cores {
            // A thread given one CPU of a core gets its quietest sibling (stable: CPU order
            // on ties).
            core.cpus.sort_by_key(|&cpu| topology.cpu_device_interrupts(cpu));
        }
        cores.sort_by_cached_key(|core| topology.core_device_interrupts(core));
        let os_reserved_cpus = if cores.len() > requests.len() {
            take_most_interrupted(topology, &mut cores).cpus
        } else {
            Vec::new()
        };
        if os_reserved_cpus.is_empty() && !requests.is_empty() {
            notes.push(format!(
                "no core left to the OS: {} threads on {} usable cores",
                requests.len(),
                topology.usable_cores().len()
            ));
        }
        let has_critical = requests.iter().any(|r| r.role == Role::Critical);
        let critical_socket = has_critical.then(|| busiest_socket(&cores)).flatten();
        let mut allocator = Allocator { cores, critical_socket, oversubscribed };
        let threads = allocator.place(requests, &mut notes);
        let floating_cpus = floating_cpus(topology, &threads);
        PlacementPlan {
            threads,
            os_reserved_cpus,
            critical_socket,
            oversubscribed,
            floating_cpus,
            notes,
        }
    }

    /// The wait strategy a thread may actually use: spinning is downgraded to
    /// [`WaitStrategy::Adaptive`] when the plan is oversubscribed, since a spinner that shares
    /// its CPU delays the very thread it is waiting for.
    pub fn effective_wait(&self, requested: WaitStrategy) -> WaitStrategy {
        if self.oversubscribed { requested.for_oversubscribed() } else { requested }
    }
}

/// Removes the core that services most device interrupts from `cores` and returns it: the
/// core left to the OS ([`crate::interrupts`] says why). `cores` is sorted least interrupted
/// first (stable, so in CPU order among equals), which puts the most interrupted at the end;
/// of several with that count the lowest in CPU order is taken, so that with equal or unknown
/// counts CPU 0's core goes to the OS, as it always did.
fn take_most_interrupted(topology: &Topology, cores: &mut Vec<PhysicalCore>) -> PhysicalCore {
    let most = cores.last().map_or(0, |core| topology.core_device_interrupts(core));
    let first_of_most = cores.iter().position(|core| topology.core_device_interrupts(core) == most);
    cores.remove(first_of_most.expect("the caller checked there are cores"))
}

/// The usable CPUs no exclusive placement holds (with the SMT siblings of a thread that owns
/// its whole core); all of them when none is left.
fn floating_cpus(topology: &Topology, threads: &[ThreadPlacement]) -> Vec<CpuId> {
    let mut held: Vec<CpuId> = Vec::new();
    for thread in threads.iter().filter(|thread| thread.exclusive) {
        held.extend(&thread.cpus);
        if thread.whole_core {
            let cores = topology.cores.iter();
            let own = cores.filter(|core| thread.cpus.iter().any(|cpu| core.cpus.contains(cpu)));
            held.extend(own.flat_map(|core| core.cpus.iter().copied()));
        }
    }
    let free: Vec<CpuId> =
        topology.usable_cpus.iter().copied().filter(|cpu| !held.contains(cpu)).collect();
    if free.is_empty() { topology.usable_cpus.clone() } else { free }
}

/// The socket with the most usable cores (ties: the lowest socket number).
fn busiest_socket(cores: &[PhysicalCore]) -> Option<usize> {
    let mut per_socket: BTreeMap<usize, usize> = BTreeMap::new();
    for core in cores {
        *per_socket.entry(core.socket).or_default() += 1;
    }
    // max_by_key returns the last maximum; iterate in reverse so ties pick the lowest socket.
    per_socket.into_iter().rev().max_by_key(|&(_, count)| count).map(|(socket, _)| socket)
}

/// The planning state: cores not yet handed out.
struct Allocator {
    cores: Vec<PhysicalCore>,
    critical_socket: Option<usize>,
    oversubscribed: bool,
}

impl Allocator {
    fn place(
        &mut self,
        requests: &[ThreadRequest],
        notes: &mut Vec<String>,
    ) -> Vec<ThreadPlacement> {
        let mut placed: Vec<Option<ThreadPlacement>> = vec![None; requests.len()];
        // Phase 1: whole cores for critical threads while the others still fit.
        for (index, request) in requests.iter().enumerate() {
            let unplaced_after = placed.iter().filter(|p| p.is_none()).count() - 1;
            if request.role == Role::Critical && self.can_take_whole_core(unplaced_after) {
                let core = self.take_core(Role::Critical);
                placed[index] = Some(placement(request, core.cpus[..1].to_vec(), true, true));
                if Some(core.socket) != self.critical_socket {
                    notes.push(format!(
                        "{}: critical path spills to socket {}",
                        request.label, core.socket
                    ));
                }
            }
        }
        // Phase 2: one CPU each for the rest, or a shared set when there are too few.
        let unplaced: Vec<usize> = (0..requests.len()).filter(|&i| placed[i].is_none()).collect();
        if self.oversubscribed {
            let shared: Vec<CpuId> = self.cores.iter().flat_map(|c| c.cpus.clone()).collect();
            for index in unplaced {
                placed[index] = Some(placement(&requests[index], shared.clone(), false, false));
            }
        } else {
            for index in unplaced {
                let cpu = self.take_cpu(requests[index].role);
                placed[index] = Some(placement(&requests[index], vec![cpu], true, false));
            }
        }
        placed.into_iter().map(|p| p.expect("every request is placed in phase 1 or 2")).collect()
    }

    /// A critical thread may take a whole core if the CPUs left afterwards still hold the
    /// `unplaced_after` other threads (one CPU each, or one shared core when oversubscribed).
    fn can_take_whole_core(&self, unplaced_after: usize) -> bool {
        let Some(core) = self.next_core(Role::Critical) else {
            return false;
        };
        let cpus_left = self.cores.iter().map(|c| c.cpus.len()).sum::<usize>() - core.cpus.len();
        if self.oversubscribed {
            self.cores.len() > 1 || unplaced_after == 0
        } else {
            cpus_left >= unplaced_after
        }
    }

    /// The core a thread of `role` should get next: critical threads prefer the critical
    /// socket, ancillary threads the others; least interrupted first within a preference
    /// (the order `PlacementPlan::new` sorted the cores in).
    fn next_core_index(&self, role: Role) -> Option<usize> {
        let on_critical = |core: &PhysicalCore| Some(core.socket) == self.critical_socket;
        let preferred = |core: &PhysicalCore| on_critical(core) == (role == Role::Critical);
        let first_preferred = self.cores.iter().position(preferred);
        first_preferred.or(if self.cores.is_empty() { None } else { Some(0) })
    }

    fn next_core(&self, role: Role) -> Option<&PhysicalCore> {
        self.next_core_index(role).map(|i| &self.cores[i])
    }

    fn take_core(&mut self, role: Role) -> PhysicalCore {
        let index = self.next_core_index(role).expect("caller checked a core is free");
        self.cores.remove(index)
    }

    /// Takes one CPU, leaving its SMT siblings available to other threads.
    fn take_cpu(&mut self, role: Role) -> CpuId {
        let index =
            self.next_core_index(role).expect("non-oversubscribed plans have a CPU per thread");
        let core = &mut self.cores[index];
        let cpu = core.cpus.remove(0);
        if core.cpus.is_empty() {
            self.cores.remove(index);
        }
        cpu
    }
}

fn placement(
    request: &ThreadRequest,
    cpus: Vec<CpuId>,
    exclusive: bool,
    whole_core: bool,
) -> ThreadPlacement {
    ThreadPlacement {
        label: request.label.clone(),
        role: request.role,
        cpus,
        exclusive,
        whole_core,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_ranges_singles_and_empty() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a-b"), None);
    }
}
