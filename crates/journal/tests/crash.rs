//! Crash tests with a real process and real files: `journal-crash-child` runs the ledger
//! workload with group commit and is SIGKILLed at random moments, then restarted on the same
//! directory. After every restart: every acknowledged input is reflected, none is applied
//! twice, and the recovered state hash equals a replay of the same input from scratch.
//!
//! `LEANTIER_CRASH_ITERATIONS` raises the iteration count (scripts/soak-journal).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use journal::{Ledger, StateMachine};
use rand::{Rng, SeedableRng};

const SEED: u64 = 42;
const ITERATIONS_DEFAULT: u32 = 20;
/// Each run lives this long (uniformly random) before the SIGKILL.
const RUN_MS: std::ops::Range<u64> = 5..120;

struct Recovery {
    last_seq: u64,
    applied: u64,
    out_of_order: u64,
    hash: u64,
}

fn parse_recovered(line: &str) -> Recovery {
    let field = |name: &str| -> u64 {
        let prefix = format!("{name}=");
        let value = line.split(' ').find_map(|word| word.strip_prefix(&prefix));
        value.unwrap_or_else(|| panic!("no {name} in {line:?}")).parse().unwrap()
    };
    Recovery {
        last_seq: field("last_seq"),
        applied: field("applied"),
        out_of_order: field("out_of_order"),
        hash: field("hash"),
    }
}

/// Starts the child; returns it with its parsed recovery line and the rest of its stdout.
fn start(
    dir: &Path,
    extra: &[&str],
) -> (std::process::Child, Recovery, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_journal-crash-child"))
        .arg("--dir")
        .arg(dir)
        .args([
            "--seed",
            &SEED.to_string(),
            "--snapshot-every",
            "20000",
            "--segment-bytes",
            "1048576",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the child starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("recovered "), "child did not recover: {line:?}");
    (child, parse_recovered(&line), stdout)
}

/// Every `ack N` line the client received (including those still in the pipe at the kill).
fn highest_ack(stdout: BufReader<std::process::ChildStdout>) -> u64 {
    stdout
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| line.strip_prefix("ack ").map(|n| n.parse::<u64>().unwrap()))
        .max()
        .unwrap_or(0)
}

/// Incremental replay of the input from scratch (restarts only ever move forward).
struct Scratch(Ledger);

impl Scratch {
    fn hash_at(&mut self, last_seq: u64) -> u64 {
        if self.0.last_seq() > last_seq {
            self.0 = Ledger::default();
        }
        for seq in self.0.last_seq() + 1..=last_seq {
            self.0.apply(seq, &journal::ledger::transfer_for(SEED, seq).payload);
        }
        self.0.state_hash()
    }
}

fn check(recovery: &Recovery, acked: u64, scratch: &mut Scratch) {
    assert!(
        recovery.last_seq >= acked,
        "acknowledged up to {acked} but recovered only {}",
        recovery.last_seq
    );
    assert_eq!(recovery.applied, recovery.last_seq, "each input applied exactly once");
    assert_eq!(recovery.out_of_order, 0);
    assert_eq!(
        recovery.hash,
        scratch.hash_at(recovery.last_seq),
        "recovered state == replay from scratch"
    );
}

#[test]
fn sigkill_at_random_moments_never_loses_an_acknowledged_input() {
    let iterations = std::env::var("LEANTIER_CRASH_ITERATIONS")
        .map_or(ITERATIONS_DEFAULT, |v| v.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    let mut scratch = Scratch(Ledger::default());
    let mut acked = 0;
    let mut kills_after_acks = 0;
    for _ in 0..iterations {
        let (mut child, recovery, stdout) = start(dir.path(), &[]);
        check(&recovery, acked, &mut scratch);
        std::thread::sleep(Duration::from_millis(rng.random_range(RUN_MS)));
        child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
        child.wait().unwrap();
        let highest = highest_ack(stdout);
        if highest > acked {
            kills_after_acks += 1;
            acked = highest;
        }
    }
    let (mut child, recovery, stdout) = start(dir.path(), &["--records-max", "0"]);
    check(&recovery, acked, &mut scratch);
    assert!(child.wait().unwrap().success());
    drop(stdout);
    assert!(kills_after_acks * 2 >= iterations, "most runs acknowledged something before the kill");
    eprintln!("{iterations} kills, {acked} inputs acknowledged, recovered {}", recovery.last_seq);
}
