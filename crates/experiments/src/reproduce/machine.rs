//! The machine a reproduction ran on, as the page states it beside every measured table:
//! cores, CPU model, kernel, load average, and whether a VM's host took CPU time from it
//! (steal time over the run: a host that stops busy vCPUs shows up there, and every tail
//! latency measured meanwhile carries its pauses).

use crate::data::DataTable;

/// CPU time counters of `/proc/stat`'s first line and of this process, in clock ticks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTicks {
    total: u64,
    /// user + nice + system + irq + softirq: time some process or the kernel ran.
    busy: u64,
    steal: u64,
    /// This process's and its waited-for children's user + system time (`/proc/self/stat`).
    own: u64,
}

impl CpuTicks {
    /// Now; zeros where `/proc/stat` cannot be read (not Linux).
    pub fn now() -> CpuTicks {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let fields: Vec<u64> = text
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let field = |index: usize| fields.get(index).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        CpuTicks {
            total: fields.iter().take(8).sum(),
            busy: field(0) + field(1) + field(2) + field(5) + field(6),
            steal: field(7),
            own: own_ticks(),
        }
    }
}

/// utime + stime + cutime + cstime of `/proc/self/stat` (fields 14–17, after the command
/// name, which may hold spaces, in parentheses).
fn own_ticks() -> u64 {
    let text = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = text.rsplit_once(')').map_or("", |(_, rest)| rest);
    // After the name: state is field 3, so utime (14) is the 12th field from here.
    after_name.split_whitespace().skip(11).take(4).filter_map(|f| f.parse::<u64>().ok()).sum()
}

/// Other processes use more than this share of the machine's cores: a loaded host.
pub const LOADED_OTHER_SHARE: f64 = 0.1;
/// The hypervisor takes more than this share of CPU time (steal, %): a loaded host.
pub const LOADED_STEAL_PCT: f64 = 1.0;

/// What the rest of the host did over an interval: the cores other processes kept busy
/// (every busy tick not this process's) and the hypervisor's steal.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostLoad {
    pub other_cores: f64,
    pub steal_pct: f64,
    pub cores: usize,
}

impl HostLoad {
    /// Between two readings; `None` when no tick passed (or not Linux).
    pub fn between(from: CpuTicks, to: CpuTicks) -> Option<HostLoad> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let ticks = to.total.checked_sub(from.total).filter(|&t| t > 0)? as f64;
        let busy = to.busy.saturating_sub(from.busy);
        let other = busy.saturating_sub(to.own.saturating_sub(from.own)) as f64;
        Some(HostLoad {
            other_cores: other / ticks * cores as f64,
            steal_pct: to.steal.saturating_sub(from.steal) as f64 * 100.0 / ticks,
            cores,
        })
    }

    /// The host over the next second, before anything of ours runs.
    pub fn before_run() -> Option<HostLoad> {
        let from = CpuTicks::now();
        std::thread::sleep(std::time::Duration::from_secs(1));
        HostLoad::between(from, CpuTicks::now())
    }

    /// Other processes above [`LOADED_OTHER_SHARE`] of the cores, or steal above
    /// [`LOADED_STEAL_PCT`].
    pub fn loaded(&self) -> bool {
        self.other_cores > LOADED_OTHER_SHARE * self.cores as f64
            || self.steal_pct > LOADED_STEAL_PCT
    }

    /// [`HostLoad::text`], saying whether that makes a loaded host.
    pub fn verdict_text(&self) -> String {
        let verdict = if self.loaded() { "a loaded host" } else { "a quiet host" };
        format!("{}: {verdict}", self.text())
    }

    pub fn text(&self) -> String {
        format!(
            "other processes kept {:.2} of {} cores busy, steal {:.2}%",
            self.other_cores, self.cores, self.steal_pct
        )
    }
}

/// What the page says about the machine.
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub load_average_before: String,
    pub load_average: String,
    pub hypervisor: bool,
    /// Share of CPU time the host took between two readings, in %.
    pub steal_pct: Option<f64>,
    /// The host over one second before the first paper.
    pub before: Option<HostLoad>,
}

/// The 1, 5 and 15-minute load averages.
pub fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The CPU as `/proc/cpuinfo` names it, with family, model and stepping (a VM often shows
/// only "AMD EPYC"; the numbers tell the generation) and the generation where known.
pub fn cpu_model(cpuinfo: &str) -> String {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let name = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let number = |name: &str| field(name).and_then(|v| v.parse::<u32>().ok());
    let (Some(family), Some(model)) = (number("cpu family"), number("model")) else {
        return name;
    };
    let vendor = field("vendor_id").unwrap_or_default();
    let generation =
        cpu_generation(&vendor, family, model).map_or(String::new(), |g| format!(", {g}"));
    let stepping = number("stepping").map_or(String::new(), |s| format!(" stepping {s}"));
    format!("{name} (family {family} model {model}{stepping}{generation})")
}

/// The microarchitecture of a few server CPUs a reproduction is likely to meet.
fn cpu_generation(vendor: &str, family: u32, model: u32) -> Option<&'static str> {
    Some(match (vendor, family, model) {
        ("AuthenticAMD", 23, 0..=0x0f) => "Zen/Zen+ (EPYC 7001 Naples)",
        ("AuthenticAMD", 23, 0x30..=0x3f) => "Zen 2 (EPYC 7002 Rome)",
        ("AuthenticAMD", 25, 0..=0x0f) => "Zen 3 (EPYC 7003 Milan)",
        ("AuthenticAMD", 25, 0x10..=0x1f) => "Zen 4 (EPYC 9004 Genoa)",
        ("AuthenticAMD", 25, 0xa0..=0xaf) => "Zen 4c (EPYC 97x4 Bergamo)",
        ("AuthenticAMD", 26, _) => "Zen 5 (EPYC 9005 Turin)",
        ("GenuineIntel", 6, 0x55) => "Skylake-SP/Cascade Lake",
        ("GenuineIntel", 6, 0x6a | 0x6c) => "Ice Lake-SP",
        ("GenuineIntel", 6, 0x8f) => "Sapphire Rapids",
        ("GenuineIntel", 6, 0xcf) => "Emerald Rapids",
        ("GenuineIntel", 6, 0xad | 0xae) => "Granite Rapids",
        _ => return None,
    })
}

impl Machine {
    /// The machine now, with steal time since `since`, the host's load before the run and
    /// the load averages at its start.
    pub fn describe(
        since: CpuTicks,
        before: Option<HostLoad>,
        load_average_before: String,
    ) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let read =
            |path: &str| std::fs::read_to_string(path).unwrap_or_default().trim().to_string();
        let now = CpuTicks::now();
        let ticks = now.total.saturating_sub(since.total);
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpu_model(&cpuinfo),
            kernel: read("/proc/sys/kernel/osrelease"),
            load_average_before,
            load_average: load_average(),
            hypervisor: cpuinfo
                .lines()
                .any(|l| l.starts_with("flags") && l.contains(" hypervisor")),
            steal_pct: (ticks > 0)
                .then(|| now.steal.saturating_sub(since.steal) as f64 * 100.0 / ticks as f64),
            before,
        }
    }

    /// Whether the host stopped vCPUs, in words.
    pub fn steal_verdict(&self) -> String {
        match (self.hypervisor, self.steal_pct) {
            (_, Some(steal)) if steal > 0.0 => format!(
                "yes: the host took {steal:.2}% of CPU time during the run (steal); tails include its pauses"
            ),
            (true, _) => "a VM; no steal time counted during the run".to_string(),
            (false, _) => "no hypervisor flag; no steal time counted".to_string(),
        }
    }

    pub fn table(&self) -> DataTable {
        let mut table = DataTable::new("machine", "The machine of this run", ["property", "value"]);
        table.push(vec!["cores (usable)".into(), self.cores.into()]);
        table.push(vec!["CPU model".into(), self.cpu_model.as_str().into()]);
        table.push(vec!["kernel".into(), self.kernel.as_str().into()]);
        table.push(vec![
            "load average (1, 5, 15 min) at the start".into(),
            self.load_average_before.as_str().into(),
        ]);
        table.push(vec![
            "the host in the second before the run".into(),
            self.before.map_or("not measured (no /proc/stat)".into(), |h| h.verdict_text()).into(),
        ]);
        table.push(vec![
            "load average (1, 5, 15 min) at the end".into(),
            self.load_average.as_str().into(),
        ]);
        table.push(vec!["host stops busy vCPUs (steal time)".into(), self.steal_verdict().into()]);
        table
    }

    /// One line for every measured table's footnote.
    pub fn line(&self) -> String {
        format!(
            "{} cores, {}, Linux {}, load average {} at the start; steal: {}",
            self.cores,
            self.cpu_model,
            self.kernel,
            self.load_average_before,
            self.steal_pct.map_or("unknown".to_string(), |s| format!("{s:.2}%"))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_model_names_the_generation_a_vm_hides() {
        let cpuinfo = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n\
                       model name\t: AMD EPYC\nstepping\t: 1\n";
        assert_eq!(
            cpu_model(cpuinfo),
            "AMD EPYC (family 25 model 17 stepping 1, Zen 4 (EPYC 9004 Genoa))"
        );
        assert_eq!(cpu_model("model name\t: Some CPU\n"), "Some CPU");
    }

    #[test]
    fn host_load_counts_other_processes_and_steal_against_thresholds() {
        let from = CpuTicks { total: 0, busy: 0, steal: 0, own: 0 };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // 1000 ticks over all cores; we used 400 of the 450 busy ones.
        let quiet = CpuTicks { total: 1_000, busy: 450, steal: 0, own: 400 };
        let load = HostLoad::between(from, quiet).unwrap();
        assert!((load.other_cores - 0.05 * cores).abs() < 1e-9, "{load:?}");
        assert!(!load.loaded(), "5% of the machine is below the threshold");
        let busy = CpuTicks { own: 100, ..quiet };
        assert!(HostLoad::between(from, busy).unwrap().loaded(), "35% of the machine by others");
        let stolen = CpuTicks { steal: 20, ..quiet };
        assert!(HostLoad::between(from, stolen).unwrap().loaded(), "2% steal");
        assert!(HostLoad::between(quiet, quiet).is_none(), "no tick passed");
    }
}
