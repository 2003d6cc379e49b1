//! The server process `tests/restart.rs` kills with SIGKILL: the gateway with a native and a
//! FIX listener on free loopback ports over a store directory, the reference universe and a
//! credentials file, with `--journal group` the tier's journal in `STORE/tier`, and
//! cancel-on-disconnect only with `--cancel-on-disconnect-ms` (default off), and the tier
//! `--layout parked` (one parked thread per stage, the default) or `auto` (planned). Prints
//! `native ADDR` and `fix ADDR`, then serves until killed.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use exchange::durability::JournalMode;
use exchange::flow::UniverseConfig;
use exchange::tier::{LayoutChoice, TierConfig};
use gateway::Settings;
use gateway::{ServeOptions, start};
use ops::child_flags::ChildFlags;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let known =
        ["store", "credentials", "store-sync", "journal", "cancel-on-disconnect-ms", "layout"];
    let flags = ChildFlags::from_env(&known)?;
    let cancel_ms: u64 = flags.get_or("cancel-on-disconnect-ms", 0)?;
    let store: PathBuf = flags.required("store")?;
    let credentials: PathBuf = flags.required("credentials")?;
    let credentials = gateway::credentials::parse(&std::fs::read_to_string(credentials)?)?;
    let journal: String = flags.get_or("journal", "off".to_string())?;
    let journal = JournalMode::ALL
        .into_iter()
        .find(|mode| mode.name() == journal)
        .ok_or_else(|| format!("--journal {journal:?}: one of group, sync, relaxed, off"))?;
    let layout: String = flags.get_or("layout", "parked".to_string())?;
    let tier = match layout.as_str() {
        "parked" => TierConfig::parked(),
        "auto" => TierConfig { layout: LayoutChoice::Auto, ..TierConfig::default() },
        other => return Err(format!("--layout {other:?}: one of parked, auto").into()),
    };
    let universe = UniverseConfig { instruments: 4, clients: 16 };
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    let running = start(ServeOptions {
        listen: any,
        fix_listen: Some(any),
        metrics_listen: None,
        settings: Settings {
            store_dir: store.clone(),
            store_sync: flags.get_or("store-sync", true)?,
            cancel_on_disconnect: (cancel_ms > 0).then(|| Duration::from_millis(cancel_ms)),
            ..Settings::default()
        },
        credentials,
        tier: TierConfig { universe, journal, ..tier },
        planned_rate_per_s: 20_000.0,
        journal_dir: store.join("tier"),
        also: None,
    })?;
    let mut out = std::io::stdout();
    writeln!(out, "native {}", running.listen)?;
    writeln!(out, "fix {}", running.fix_listen.expect("asked for a FIX listener"))?;
    out.flush()?;
    running.wait();
    Ok(())
}
