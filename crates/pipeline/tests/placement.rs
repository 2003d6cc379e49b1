//! Placement: topology parsing from synthetic /sys trees, the placement policy, and a smoke
//! test on the real machine.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use pipeline::WaitStrategy;
use pipeline::placement::{
    PinnableThread, PlacementError, PlacementPlan, Role, ThreadRequest, Topology, current_affinity,
    pin_current_thread, pin_thread,
};

/// A core of a synthetic machine: (socket, core_id, SMT sibling CPUs).
type FakeCore<'a> = (usize, usize, &'a [usize]);

fn list(cpus: &[usize]) -> String {
    cpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// Writes the sysfs files `Topology::from_sysfs` reads for a machine made of `cores`, with one
/// NUMA node per socket.
fn fake_sys(root: &Path, cores: &[FakeCore]) {
    let cpu_dir = root.join("devices/system/cpu");
    let mut online: Vec<usize> = cores.iter().flat_map(|c| c.2.iter().copied()).collect();
    online.sort_unstable();
    fs::create_dir_all(&cpu_dir).unwrap();
    fs::write(cpu_dir.join("online"), format!("{}\n", list(&online))).unwrap();
    for &(socket, core_id, siblings) in cores {
        for cpu in siblings {
            let topology = cpu_dir.join(format!("cpu{cpu}/topology"));
            fs::create_dir_all(&topology).unwrap();
            fs::write(topology.join("physical_package_id"), format!("{socket}\n")).unwrap();
            fs::write(topology.join("core_id"), format!("{core_id}\n")).unwrap();
            fs::write(topology.join("thread_siblings_list"), format!("{}\n", list(siblings)))
                .unwrap();
        }
    }
    let mut sockets: Vec<usize> = cores.iter().map(|c| c.0).collect();
    sockets.dedup();
    for socket in sockets {
        let cpus: Vec<usize> =
            cores.iter().filter(|c| c.0 == socket).flat_map(|c| c.2.iter().copied()).collect();
        let node = root.join(format!("devices/system/node/node{socket}"));
        fs::create_dir_all(&node).unwrap();
        fs::write(node.join("cpulist"), list(&cpus)).unwrap();
    }
}

/// Two sockets of four cores with two hardware threads each, numbered as Linux does on x86:
/// first threads 0-7, their siblings 8-15.
const TWO_SOCKETS_SMT: [FakeCore<'static>; 8] = [
    (0, 0, &[0, 8]),
    (0, 1, &[1, 9]),
    (0, 2, &[2, 10]),
    (0, 3, &[3, 11]),
    (1, 0, &[4, 12]),
    (1, 1, &[5, 13]),
    (1, 2, &[6, 14]),
    (1, 3, &[7, 15]),
];

fn topology(cores: &[FakeCore], allowed: &[usize]) -> Topology {
    let dir = tempfile::tempdir().unwrap();
    fake_sys(dir.path(), cores);
    Topology::from_sysfs(dir.path(), allowed).unwrap()
}

fn requests(critical: usize, ancillary: usize) -> Vec<ThreadRequest> {
    let critical =
        (0..critical).map(|i| ThreadRequest { label: format!("core/{i}"), role: Role::Critical });
    let ancillary = (0..ancillary)
        .map(|i| ThreadRequest { label: format!("audit/{i}"), role: Role::Ancillary });
    critical.chain(ancillary).collect()
}

fn all_cpus(plan: &PlacementPlan) -> Vec<usize> {
    plan.threads.iter().flat_map(|t| t.cpus.iter().copied()).collect()
}

#[test]
fn reads_cores_sockets_and_numa_nodes_from_sysfs() {
    let all: Vec<usize> = (0..16).collect();
    let topology = topology(&TWO_SOCKETS_SMT, &all);
    assert_eq!(topology.online_cpus, all);
    assert_eq!(topology.usable_cpus, all);
    assert_eq!(topology.cores.len(), 8);
    assert_eq!(topology.sockets(), vec![0, 1]);
    assert_eq!(topology.cores[0].cpus, vec![0, 8]);
    assert_eq!((topology.cores[5].socket, topology.cores[5].core_id), (1, 1));
    assert_eq!(topology.numa_nodes.len(), 2);
    assert_eq!(topology.numa_nodes[1].cpus, vec![4, 5, 6, 7, 12, 13, 14, 15]);
    assert!(topology.isolated_cpus.is_empty());
}

#[test]
fn affinity_mask_limits_the_usable_cpus_and_cores() {
    let topology = topology(&TWO_SOCKETS_SMT, &[2, 3, 10, 99]);
    assert_eq!(topology.usable_cpus, vec![2, 3, 10]);
    let usable: Vec<Vec<usize>> = topology.usable_cores().into_iter().map(|c| c.cpus).collect();
    assert_eq!(usable, vec![vec![2, 10], vec![3]]);
}

#[test]
fn bad_sysfs_content_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    fake_sys(dir.path(), &TWO_SOCKETS_SMT);
    fs::write(dir.path().join("devices/system/cpu/online"), "0-x\n").unwrap();
    let error = Topology::from_sysfs(dir.path(), &[0]).unwrap_err();
    assert!(matches!(error, PlacementError::Parse { .. }), "{error}");
    assert!(error.to_string().contains("online"), "{error}");

    fs::write(dir.path().join("devices/system/cpu/online"), "0-15\n").unwrap();
    let error = Topology::from_sysfs(dir.path(), &[64]).unwrap_err();
    assert!(matches!(error, PlacementError::NoUsableCpus), "{error}");
}

#[test]
fn missing_topology_files_make_each_cpu_its_own_core() {
    let dir = tempfile::tempdir().unwrap();
    let cpu_dir = dir.path().join("devices/system/cpu");
    fs::create_dir_all(&cpu_dir).unwrap();
    fs::write(cpu_dir.join("online"), "0-2\n").unwrap();
    let topology = Topology::from_sysfs(dir.path(), &[0, 1, 2]).unwrap();
    assert_eq!(topology.cores.len(), 3);
    assert_eq!(topology.sockets(), vec![0]);
    assert!(topology.numa_nodes.is_empty());
}

#[test]
fn critical_threads_get_whole_cores_on_one_socket_and_the_os_keeps_a_core() {
    let topology = topology(&TWO_SOCKETS_SMT, &(0..16).collect::<Vec<_>>());
    let plan = PlacementPlan::new(&topology, &requests(3, 2));
    assert!(!plan.oversubscribed);
    assert_eq!(plan.os_reserved_cpus, vec![0, 8], "CPU 0's core is left to the OS");
    // Socket 0 lost a core to the OS, so socket 1 has the most free cores.
    assert_eq!(plan.critical_socket, Some(1));
    for thread in &plan.threads[..3] {
        assert!(thread.exclusive && thread.whole_core, "{thread:?}");
        assert!((4..8).contains(&thread.cpus[0]), "critical on socket 1: {thread:?}");
    }
    for thread in &plan.threads[3..] {
        assert!(thread.exclusive, "{thread:?}");
        assert!(
            [1, 2, 3, 9, 10, 11].contains(&thread.cpus[0]),
            "ancillary on socket 0: {thread:?}"
        );
    }
    let mut cpus = all_cpus(&plan);
    cpus.sort_unstable();
    cpus.dedup();
    assert_eq!(cpus.len(), 5, "every thread has its own CPU: {plan:?}");
}

#[test]
fn the_most_interrupted_core_goes_to_the_os_and_critical_threads_avoid_interrupts() {
    // The development VM: the disk's queue interrupts CPU 1, so CPU 0 is the quiet one.
    let two_cores: [FakeCore; 2] = [(0, 0, &[0]), (0, 1, &[1])];
    let vm = Topology {
        device_interrupts: BTreeMap::from([(0, 18_431), (1, 16_462_655)]),
        ..topology(&two_cores, &[0, 1])
    };
    let plan = PlacementPlan::new(&vm, &requests(1, 0));
    assert_eq!(plan.os_reserved_cpus, vec![1], "{plan:?}");
    assert_eq!(plan.threads[0].cpus, vec![0], "{plan:?}");

    // Eight cores, the network card's queues on CPUs 2 and 3 (and a little on 5): the OS gets
    // CPU 2's core, and critical threads take the uninterrupted cores before CPUs 3 and 5.
    let eight_cores: [FakeCore; 8] = [
        (0, 0, &[0]),
        (0, 1, &[1]),
        (0, 2, &[2]),
        (0, 3, &[3]),
        (0, 4, &[4]),
        (0, 5, &[5]),
        (0, 6, &[6]),
        (0, 7, &[7]),
    ];
    let eight = Topology {
        device_interrupts: BTreeMap::from([(2, 900_000), (3, 400_000), (5, 1_000)]),
        ..topology(&eight_cores, &(0..8).collect::<Vec<_>>())
    };
    let plan = PlacementPlan::new(&eight, &requests(5, 0));
    assert_eq!(plan.os_reserved_cpus, vec![2], "{plan:?}");
    let critical: Vec<usize> = plan.threads.iter().map(|t| t.cpus[0]).collect();
    assert_eq!(critical, vec![0, 1, 4, 6, 7], "{plan:?}");

    // Equal counts change nothing: CPU 0's core is the OS's, as without counts.
    let even = Topology {
        device_interrupts: BTreeMap::from([(0, 5), (1, 5)]),
        ..topology(&two_cores, &[0, 1])
    };
    assert_eq!(PlacementPlan::new(&even, &requests(1, 0)).os_reserved_cpus, vec![0]);
}

#[test]
fn threads_the_plan_does_not_place_float_on_the_cpus_no_exclusive_thread_holds() {
    let two_cores: [FakeCore; 2] = [(0, 0, &[0]), (0, 1, &[1])];
    let plan = PlacementPlan::new(&topology(&two_cores, &[0, 1]), &requests(1, 0));
    assert_eq!(plan.threads[0].cpus, vec![1], "CPU 0's core is the OS's: {plan:?}");
    assert_eq!(plan.floating_cpus, vec![0], "not the critical thread's CPU: {plan:?}");

    let plan = PlacementPlan::new(&topology(&two_cores, &[0, 1]), &requests(1, 1));
    assert_eq!(plan.floating_cpus, vec![0, 1], "every CPU is held: float anywhere");

    let plan = PlacementPlan::new(&topology(&TWO_SOCKETS_SMT, &[5]), &requests(2, 1));
    assert_eq!(plan.floating_cpus, vec![5], "one shared CPU");
}

#[test]
fn smt_siblings_of_a_whole_core_do_not_float_and_the_quietest_sibling_is_taken() {
    let smt_pairs: [FakeCore; 3] = [(0, 0, &[0, 3]), (0, 1, &[1, 4]), (0, 2, &[2, 5])];
    let quiet_sibling = Topology {
        // Core {0,3} takes most interrupts (the OS's); in core {1,4} CPU 1 takes some, CPU 4 none.
        device_interrupts: BTreeMap::from([(0, 9_000), (3, 9_000), (1, 500), (4, 0)]),
        ..topology(&smt_pairs, &[0, 1, 2, 3, 4, 5])
    };
    let plan = PlacementPlan::new(&quiet_sibling, &requests(1, 0));
    assert_eq!(plan.os_reserved_cpus, vec![0, 3], "{plan:?}");
    assert!(plan.threads[0].whole_core, "{plan:?}");
    assert_eq!(plan.threads[0].cpus, vec![2], "core {{2,5}} has no interrupts: {plan:?}");
    assert_eq!(plan.floating_cpus, vec![0, 1, 3, 4], "not CPU 2 nor its sibling 5: {plan:?}");

    let two = PlacementPlan::new(&quiet_sibling, &requests(2, 0));
    assert_eq!(two.threads[1].cpus, vec![4], "the quieter sibling of core {{1,4}}: {two:?}");
}

#[test]
fn critical_threads_give_up_smt_siblings_when_the_others_need_them() {
    let smt_pair: [FakeCore; 2] = [(0, 0, &[0, 2]), (0, 1, &[1, 3])];
    let topology = topology(&smt_pair, &[0, 1, 2, 3]);
    let plan = PlacementPlan::new(&topology, &requests(1, 3));
    assert!(!plan.oversubscribed);
    assert!(plan.os_reserved_cpus.is_empty());
    assert!(!plan.threads[0].whole_core, "a whole core would leave 2 CPUs for 3 threads");
    let mut cpus = all_cpus(&plan);
    cpus.sort_unstable();
    assert_eq!(cpus, vec![0, 1, 2, 3]);
    assert!(plan.notes.iter().any(|n| n.contains("no core left to the OS")), "{:?}", plan.notes);
}

#[test]
fn oversubscription_is_reported_and_spinning_is_downgraded() {
    let two_cores: [FakeCore; 2] = [(0, 0, &[0]), (0, 1, &[1])];
    let topology = topology(&two_cores, &[0, 1]);
    let plan = PlacementPlan::new(&topology, &requests(1, 2));
    assert!(plan.oversubscribed);
    assert!(plan.notes.iter().any(|n| n.contains("oversubscribed")), "{:?}", plan.notes);
    assert!(plan.threads[0].exclusive, "the critical thread keeps a core: {plan:?}");
    let critical_cpu = plan.threads[0].cpus[0];
    for thread in &plan.threads[1..] {
        assert!(!thread.exclusive);
        assert_eq!(thread.cpus.len(), 1);
        assert_ne!(thread.cpus[0], critical_cpu, "ancillary threads share the other core");
    }
    assert!(plan.effective_wait(WaitStrategy::BusySpin).may_park());
    assert!(plan.effective_wait(WaitStrategy::SpinYield { spins: 10 }).may_park());
    assert_eq!(plan.effective_wait(WaitStrategy::Park), WaitStrategy::Park);

    let fits = PlacementPlan::new(&topology, &requests(1, 1));
    assert!(!fits.oversubscribed);
    assert_eq!(fits.effective_wait(WaitStrategy::BusySpin), WaitStrategy::BusySpin);
}

#[test]
fn one_cpu_shared_by_everyone_when_nothing_else_is_usable() {
    let topology = topology(&TWO_SOCKETS_SMT, &[5]);
    let plan = PlacementPlan::new(&topology, &requests(2, 1));
    assert!(plan.oversubscribed);
    assert!(plan.threads.iter().all(|t| t.cpus == vec![5] && !t.exclusive), "{plan:?}");
}

#[test]
fn pinning_rejects_impossible_cpu_sets() {
    assert!(matches!(pin_current_thread(&[]), Err(PlacementError::EmptyCpuSet)));
    let error = pin_current_thread(&[1 << 20]).unwrap_err();
    assert!(matches!(error, PlacementError::CpuOutOfRange { .. }), "{error}");
}

#[test]
fn real_machine_topology_and_pinning() {
    let topology = Topology::detect().expect("this machine's /sys is readable");
    assert!(!topology.usable_cpus.is_empty());
    assert!(topology.usable_cpus.iter().all(|c| topology.online_cpus.contains(c)));
    assert!(!topology.cores.is_empty());
    let cpu = *topology.usable_cpus.last().unwrap();
    // Pin a scratch thread so the test harness's threads keep their affinity.
    let pinned = std::thread::spawn(move || {
        pin_current_thread(&[cpu]).map(|()| current_affinity().unwrap())
    })
    .join()
    .unwrap();
    assert_eq!(pinned.unwrap(), vec![cpu]);
}

#[test]
fn a_cgroup_quota_below_the_visible_cpus_oversubscribes_the_plan() {
    let four_cores: [FakeCore; 4] = [(0, 0, &[0]), (0, 1, &[1]), (0, 2, &[2]), (0, 3, &[3])];
    let unlimited = topology(&four_cores, &[0, 1, 2, 3]);
    assert_eq!(unlimited.usable_cpu_count(), 4);
    assert!(!PlacementPlan::new(&unlimited, &requests(2, 1)).oversubscribed);
    let quota = unlimited.with_cpu_quota(Some(2.5));
    assert_eq!(quota.usable_cpu_count(), 2, "whole CPUs of the quota");
    let plan = PlacementPlan::new(&quota, &requests(2, 1));
    assert!(plan.oversubscribed, "3 threads under a 2.5-CPU quota");
    assert!(plan.notes.iter().any(|n| n.contains("quota 2.50")), "{:?}", plan.notes);
    assert!(plan.effective_wait(WaitStrategy::BusySpin).may_park());
    let tiny = quota.with_cpu_quota(Some(0.5));
    assert_eq!(tiny.usable_cpu_count(), 1, "never below one CPU");
}

#[test]
fn another_thread_is_pinned_by_its_recorded_id_and_an_exited_one_is_an_error() {
    let usable = Topology::detect().expect("this machine's /sys is readable").usable_cpus;
    let target = *usable.last().expect("a usable CPU");
    let pinnable = PinnableThread::default();
    assert!(matches!(pin_thread(&pinnable, &[target]), Err(PlacementError::ThreadNotStarted)));

    let (recorder, pinned) = (pinnable.clone(), std::sync::Arc::new(std::sync::Barrier::new(2)));
    let (recorded, checked) = (std::sync::Arc::new(std::sync::Barrier::new(2)), pinned.clone());
    let recorded_in_thread = recorded.clone();
    let thread = std::thread::spawn(move || {
        recorder.record_current();
        recorded_in_thread.wait();
        checked.wait();
        current_affinity().unwrap()
    });
    recorded.wait();
    let caller_before = current_affinity().unwrap();
    pin_thread(&pinnable, &[target]).expect("a running thread can be pinned");
    pinned.wait();
    assert_eq!(thread.join().unwrap(), vec![target], "the thread runs where it was pinned");
    assert_eq!(current_affinity().unwrap(), caller_before, "the caller is left as it was");

    // The thread has exited: pinning it fails, and never falls back on the caller.
    let error = pin_thread(&pinnable, &[target]).unwrap_err();
    assert!(matches!(error, PlacementError::Affinity { .. }), "{error}");
    assert_eq!(current_affinity().unwrap(), caller_before);
}
