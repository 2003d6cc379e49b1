//! The machine a reproduction ran on, as the page states it beside every measured table:
//! cores, CPU model, kernel, load average, and whether a VM's host took CPU time from it
//! (steal time over the run: a host that stops busy vCPUs shows up there, and every tail
//! latency measured meanwhile carries its pauses).

use lab::data::DataTable;

/// CPU time counters of `/proc/stat`'s first line, in ticks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTicks {
    total: u64,
    steal: u64,
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
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        CpuTicks { total: fields.iter().take(8).sum(), steal: fields.get(7).copied().unwrap_or(0) }
    }
}

/// What the page says about the machine.
pub struct Machine {
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub load_average: String,
    pub hypervisor: bool,
    /// Share of CPU time the host took between two readings, in %.
    pub steal_pct: Option<f64>,
}

impl Machine {
    /// The machine now, with steal time since `since`.
    pub fn describe(since: CpuTicks) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| {
                line.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim())
            })
            .unwrap_or("unknown")
            .to_string();
        let read =
            |path: &str| std::fs::read_to_string(path).unwrap_or_default().trim().to_string();
        let now = CpuTicks::now();
        let ticks = now.total.saturating_sub(since.total);
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel: read("/proc/sys/kernel/osrelease"),
            load_average: read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
            hypervisor: cpuinfo
                .lines()
                .any(|l| l.starts_with("flags") && l.contains(" hypervisor")),
            steal_pct: (ticks > 0)
                .then(|| now.steal.saturating_sub(since.steal) as f64 * 100.0 / ticks as f64),
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
            "load average (1, 5, 15 min) at the end".into(),
            self.load_average.as_str().into(),
        ]);
        table.push(vec!["host stops busy vCPUs (steal time)".into(), self.steal_verdict().into()]);
        table
    }

    /// One line for every measured table's footnote.
    pub fn line(&self) -> String {
        format!(
            "{} cores, {}, Linux {}, load average {}; steal: {}",
            self.cores,
            self.cpu_model,
            self.kernel,
            self.load_average,
            self.steal_pct.map_or("unknown".to_string(), |s| format!("{s:.2}%"))
        )
    }
}
