//! Helpers shared by the gateway's integration tests. Each test binary uses part of them.
#![allow(dead_code)]

use std::path::Path;

use exchange::flow::{UniverseConfig, reference_master_data};
use gateway::credentials::{self, Credential, Protocol};
use gateway::hub::Settings;
use gateway::server::{self, Running, ServeOptions};

/// Starts the gateway with a FIX listener (and a native one) on free loopback ports, its FIX
/// store in `store`, these credentials, and the reference universe of `clients` clients.
pub fn start_fix_server(store: &Path, credentials: Vec<Credential>, clients: u32) -> Running {
    let options = ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        fix_listen: Some("127.0.0.1:0".parse().unwrap()),
        metrics_listen: None,
        settings: Settings { store_dir: store.to_path_buf(), ..Settings::default() },
        credentials,
        master: reference_master_data(&UniverseConfig { instruments: 4, clients }),
        core_limits: Default::default(),
        ring: Default::default(),
        journal: Default::default(),
        // What `auto` picks on a 2-CPU host (inline); tests/layouts.rs runs the others.
        layout: gateway::layout::Layout::Auto,
        topology: pipeline::placement::Topology::uniform(2),
    };
    server::start(options).unwrap()
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
