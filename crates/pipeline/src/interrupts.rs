//! Which CPUs service the machine's device interrupts, from `/proc/interrupts`.
//!
//! A thread spinning on the critical path loses the CPU for every interrupt routed to it: the
//! handler, its soft-interrupt work and, in a virtual machine, an exit to the host. A journal
//! writing with group commit makes the disk complete thousands of requests per second; on the
//! 2-vCPU development VM every one of them interrupted the critical thread (the disk's queue
//! is routed to CPU 1, which placement had given the critical thread because it handed CPU 0
//! to the OS by habit), and 25% of requests waited about 25 µs for it. So placement leaves the
//! most interrupted core to the OS and gives critical threads the least interrupted ones.
//!
//! The counts are cumulative since boot: they say where the kernel routes each device's
//! interrupts (its effective affinity), weighted by how busy each device has been. The
//! architectural lines (`LOC`, `RES`, `CAL`, `TLB`, ...) are left out: timer ticks and
//! inter-processor interrupts follow the threads, not the CPU.

use std::collections::BTreeMap;
use std::path::Path;

/// Device interrupts handled per CPU since boot, from the text of `/proc/interrupts`: the sum
/// over the numbered lines (one per interrupt source) of each CPU's column. CPUs are named by
/// the header ("CPU0 CPU1 ..." lists the online CPUs) with the kernel's number, the
/// placement's `usize` (this reader sits below the placement planner, which uses it).
/// `None` when the text is not in that format.
pub fn device_interrupts_per_cpu(text: &str) -> Option<BTreeMap<usize, u64>> {
    let mut lines = text.lines();
    let cpus: Vec<usize> = lines
        .next()?
        .split_whitespace()
        .map(|column| column.strip_prefix("CPU")?.parse().ok())
        .collect::<Option<_>>()?;
    if cpus.is_empty() {
        return None;
    }
    let mut totals: BTreeMap<usize, u64> = cpus.iter().map(|&cpu| (cpu, 0)).collect();
    for line in lines {
        let Some((source, counts)) = line.split_once(':') else { continue };
        if source.trim().parse::<u64>().is_err() {
            continue;
        }
        let mut columns = counts.split_whitespace();
        for &cpu in &cpus {
            let count: u64 = columns.next()?.parse().ok()?;
            *totals.get_mut(&cpu).expect("every header CPU has a total") += count;
        }
    }
    Some(totals)
}

/// This machine's device interrupts per CPU; empty when `/proc/interrupts` cannot be read or
/// parsed (placement then falls back to CPU order).
pub fn current_device_interrupts_per_cpu() -> BTreeMap<usize, u64> {
    std::fs::read_to_string(Path::new("/proc/interrupts"))
        .ok()
        .and_then(|text| device_interrupts_per_cpu(&text))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_VCPU_VM: &str = "           CPU0       CPU1       \n  \
         24:          1          0  IO-APIC   5-edge      ACPI:Ged\n  \
         36:          0   16462655 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0\n  \
         41:      18430          0 PCI-MSIX-0000:00:04.0   1-edge      virtio3-rx\n\
         NMI:          0          0   Non-maskable interrupts\n\
         LOC:   29703694   22904418   Local timer interrupts\n\
         CAL:   81254531   78104355   Function call interrupts\n\
         ERR:          0\n\
         MIS:          0\n";

    #[test]
    fn numbered_sources_are_summed_per_cpu_and_architectural_lines_left_out() {
        let totals = device_interrupts_per_cpu(TWO_VCPU_VM).expect("the VM's file parses");
        assert_eq!(totals, BTreeMap::from([(0, 18_431), (1, 16_462_655)]));
    }

    #[test]
    fn the_header_names_the_cpus_even_when_some_are_offline() {
        let text = "   CPU0   CPU2\n  5:   7   9   edge  eth0\n";
        let totals = device_interrupts_per_cpu(text).expect("parses");
        assert_eq!(totals, BTreeMap::from([(0, 7), (2, 9)]));
    }

    #[test]
    fn text_in_another_format_is_not_taken_for_counts() {
        assert_eq!(device_interrupts_per_cpu(""), None);
        assert_eq!(device_interrupts_per_cpu("hello world\n"), None);
        assert_eq!(device_interrupts_per_cpu("   CPU0   CPU1\n  5:   7   x   edge\n"), None);
        assert_eq!(device_interrupts_per_cpu("   CPU0   CPU1\n  5:   7\n"), None);
    }
}
