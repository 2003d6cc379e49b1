//! The CPU time a process may use, from its cgroup's CPU quota.
//!
//! The affinity mask says *which* CPUs a thread may run on; a container's quota says *how much*
//! CPU time the whole process gets: `cpu.max` = "150000 100000" (cgroup v2) or
//! `cpu.cfs_quota_us` / `cpu.cfs_period_us` (v1) lets it use 1.5 CPUs' worth of time per period
//! on however many CPUs it sees. A layout that gives a spinning thread to each of 8 visible CPUs
//! under a 2-CPU quota is throttled for most of every period, so the usable cores are
//! `min(affinity CPUs, quota)`. Quotas nest: the effective one is the smallest on the path from
//! the process's cgroup up to the root.

use std::path::Path;

/// The quota in CPUs (`quota / period`) of the cgroup of the process whose `/proc/<pid>/cgroup`
/// text is given, read under `cgroup_root` (normally `/sys/fs/cgroup`); `None` when unlimited
/// or unreadable.
pub fn cpu_quota_cores(proc_cgroup: &str, cgroup_root: &Path) -> Option<f64> {
    let mut quotas = Vec::new();
    for line in proc_cgroup.lines() {
        // "ID:CONTROLLERS:PATH"; v2's unified line has ID 0 and no controllers.
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            for dir in ancestors(cgroup_root, path) {
                quotas.extend(read(&dir.join("cpu.max")).and_then(|text| parse_cpu_max(&text)));
            }
        } else if controllers.split(',').any(|controller| controller == "cpu") {
            let root = cgroup_root.join(controllers);
            for dir in ancestors(&root, path) {
                let quota = read(&dir.join("cpu.cfs_quota_us"));
                let period = read(&dir.join("cpu.cfs_period_us"));
                quotas.extend(quota.zip(period).and_then(|(q, p)| parse_cfs(&q, &p)));
            }
        }
    }
    quotas.into_iter().reduce(f64::min)
}

/// This process's quota in CPUs, `None` when it has none.
pub fn current_cpu_quota_cores() -> Option<f64> {
    let proc_cgroup = read(Path::new("/proc/self/cgroup"))?;
    cpu_quota_cores(&proc_cgroup, Path::new("/sys/fs/cgroup"))
}

/// The directories from the cgroup at `path` (under `root`) up to `root`.
fn ancestors<'a>(root: &'a Path, path: &'a str) -> impl Iterator<Item = std::path::PathBuf> + 'a {
    let relative = Path::new(path.trim_start_matches('/'));
    relative.ancestors().map(move |ancestor| root.join(ancestor))
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// cgroup v2 `cpu.max`: "max PERIOD" (no limit) or "QUOTA PERIOD" in µs.
fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut fields = text.split_whitespace();
    let quota = fields.next()?;
    let period: f64 = fields.next()?.parse().ok()?;
    let quota: f64 = quota.parse().ok()?; // "max" does not parse: no limit
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// cgroup v1: `cpu.cfs_quota_us` (-1: no limit) over `cpu.cfs_period_us`.
fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    let quota: f64 = quota.trim().parse().ok()?;
    let period: f64 = period.trim().parse().ok()?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, relative: &str, text: &str) {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn v2_quota_is_the_smallest_on_the_path_to_the_root() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "cpu.max", "max 100000\n");
        write(root.path(), "app/cpu.max", "300000 100000\n");
        write(root.path(), "app/worker/cpu.max", "max 100000\n");
        let quota = cpu_quota_cores("0::/app/worker\n", root.path());
        assert_eq!(quota, Some(3.0));
        write(root.path(), "app/worker/cpu.max", "150000 100000\n");
        assert_eq!(cpu_quota_cores("0::/app/worker\n", root.path()), Some(1.5));
        assert_eq!(cpu_quota_cores("0::/\n", root.path()), None, "the root has no limit");
    }

    #[test]
    fn v1_quota_reads_the_cpu_controller() {
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
        write(root.path(), "cpu,cpuacct/cpu.cfs_period_us", "100000\n");
        write(root.path(), "cpu,cpuacct/job/cpu.cfs_quota_us", "200000\n");
        write(root.path(), "cpu,cpuacct/job/cpu.cfs_period_us", "100000\n");
        let proc_cgroup = "4:memory:/job\n3:cpu,cpuacct:/job\n0::/\n";
        assert_eq!(cpu_quota_cores(proc_cgroup, root.path()), Some(2.0));
        assert_eq!(cpu_quota_cores("3:cpu,cpuacct:/\n", root.path()), None);
    }

    #[test]
    fn unreadable_or_odd_files_mean_no_limit() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(cpu_quota_cores("0::/missing\n", root.path()), None);
        write(root.path(), "x/cpu.max", "garbage\n");
        assert_eq!(cpu_quota_cores("0::/x\n", root.path()), None);
        assert_eq!(cpu_quota_cores("not a cgroup line\n", root.path()), None);
        assert_eq!(parse_cpu_max("0 100000"), None);
        assert_eq!(parse_cfs("50000", "100000"), Some(0.5));
    }
}
