//! Helpers shared by the integration tests that run nodes as child processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Starts an `mq-node` child on a free loopback port with `db_workers` database workers and
/// the `extra` flags; returns it with the address read from its stderr. Its stderr keeps being
/// drained so the child never blocks on a full pipe.
pub fn spawn_node(store: &str, db_workers: usize, extra: &[&str]) -> (Child, String) {
    let workers = db_workers.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mq-node"))
        .args(["--listen", "127.0.0.1:0", "--store", store, "--db-workers", &workers])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("node printed its address").unwrap();
        if let Some(rest) = line.strip_prefix("mq node listening on ") {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}
