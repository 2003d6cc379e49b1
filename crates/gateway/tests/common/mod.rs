//! Helpers shared by the gateway's integration tests. Each test binary uses part of them.
#![allow(dead_code)]

use std::path::Path;

use exchange::durability::JournalMode;
use exchange::flow::UniverseConfig;
use exchange::tier::TierConfig;
use gateway::Settings;
use gateway::credentials::{self, Credential, Protocol};
use gateway::{Running, ServeOptions};

/// A server on a free loopback port (native only, metrics on), its store and the tier's
/// journal (off) under `store`, these credentials, and the reference universe of 4
/// instruments and `clients` clients; the tier parked (one thread per stage, costing no CPU
/// while idle: tests run side by side on a 2-CPU host; tests/layouts.rs runs `auto`).
pub fn serve_options(store: &Path, credentials: Vec<Credential>, clients: u32) -> ServeOptions {
    let tier = TierConfig {
        universe: UniverseConfig { instruments: 4, clients },
        journal: JournalMode::OFF,
        ..TierConfig::parked()
    };
    ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        fix_listen: None,
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        settings: Settings { store_dir: store.to_path_buf(), ..Settings::default() },
        credentials,
        tier,
        planned_rate_per_s: 20_000.0,
        journal_dir: store.join("tier"),
        also: None,
    }
}

/// Starts the gateway with a FIX listener (and a native one) on free loopback ports, its FIX
/// store in `store`, these credentials, and the reference universe of `clients` clients.
pub fn start_fix_server(store: &Path, credentials: Vec<Credential>, clients: u32) -> Running {
    let options = ServeOptions {
        fix_listen: Some("127.0.0.1:0".parse().unwrap()),
        metrics_listen: None,
        ..serve_options(store, credentials, clients)
    };
    gateway::start(options).unwrap()
}

/// Native-protocol credentials of clients 1..=3 (comp ids N1..N3), all with `secret`.
pub fn native_credentials(secret: &str) -> Vec<Credential> {
    let hash = credentials::hash_secret(secret.as_bytes()).unwrap();
    (1..=3)
        .map(|client| Credential {
            client,
            protocol: Protocol::Native,
            comp_id: format!("N{client}"),
            hash: hash.clone(),
        })
        .collect()
}
