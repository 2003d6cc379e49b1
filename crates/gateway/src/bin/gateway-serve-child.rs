//! The server process `tests/restart.rs` kills with SIGKILL: the gateway with a native and a
//! FIX listener on free loopback ports over a store directory, the reference universe and a
//! credentials file, with `--journal group` the engine's input journal in `STORE/engine`, and
//! cancel-on-disconnect only with `--cancel-on-disconnect-ms` (default off), and the serve
//! layout of `--layout` (default auto). Prints `native ADDR` and `fix ADDR`, then serves until killed.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use exchange::durability::JournalMode;
use exchange::flow::{UniverseConfig, reference_master_data};
use gateway::engine::EngineJournal;
use gateway::hub::Settings;
use gateway::layout::Layout;
use gateway::server::{ServeOptions, start};
use lab::child_flags::ChildFlags;

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
    let layout: String = flags.get_or("layout", "auto".to_string())?;
    let layout = Layout::ALL
        .into_iter()
        .find(|l| l.name() == layout)
        .ok_or_else(|| format!("--layout {layout:?}: one of auto, inline, engine-thread"))?;
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
        master: reference_master_data(&UniverseConfig { instruments: 4, clients: 16 }),
        core_limits: Default::default(),
        ring: Default::default(),
        journal: EngineJournal { mode: journal, dir: store.join("engine") },
        layout,
        topology: gateway::layout::detect_topology(),
    })?;
    let mut out = std::io::stdout();
    writeln!(out, "native {}", running.listen)?;
    writeln!(out, "fix {}", running.fix_listen.expect("asked for a FIX listener"))?;
    out.flush()?;
    running.wait();
    Ok(())
}
