//! `leantier demo`: `experiments::demo` (`exchange serve` in-process on loopback driven by
//! open-loop native sessions), or with `--in-process` the tier's own critical path.

use experiments::demo::DemoSettings;

use super::exchange::DemoArgs;

/// `leantier demo`.
pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if args.in_process {
        return super::exchange::run_in_process_demo(args);
    }
    experiments::demo::run(&DemoSettings {
        quick: args.quick,
        out: args.out.clone(),
        p99_limit: args.p99_limit,
        journal: args.journal,
        layout: args.layout,
    })
}
