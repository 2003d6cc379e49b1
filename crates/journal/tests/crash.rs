//! Crash tests with a real process and real files: the crash child (`crash_child/mod.rs`,
//! run by re-executing this test binary) runs the ledger workload with group commit and is
//! SIGKILLed at random moments, then restarted on the same directory. After every restart:
//! every acknowledged input is reflected, none is applied twice, and the recovered state hash
//! equals a replay of the same input from scratch.
//!
//! `LEANTIER_CRASH_ITERATIONS` raises the iteration count (scripts/soak-journal).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use journal::{Ledger, StateMachine};
use rand::{Rng, SeedableRng};

mod crash_child;

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

/// Not a test of its own: the crash child's body, which the tests run in a process of their
/// own by re-executing this binary with [`crash_child::ARGS_ENV`] set.
#[test]
#[ignore = "the crash child; the other tests run it in a process of its own"]
fn crash_child_process() {
    if let Ok(args) = std::env::var(crash_child::ARGS_ENV) {
        crash_child::run(&args).expect("the crash child runs until killed or done");
    }
}

/// Starts the child, journaling at most `records_max` new records; returns it with its parsed
/// recovery line and the rest of its stdout.
fn start(
    dir: &Path,
    records_max: u64,
) -> (std::process::Child, Recovery, BufReader<std::process::ChildStdout>) {
    let args = crash_child::Args {
        dir: dir.to_path_buf(),
        seed: SEED,
        snapshot_every: 20_000,
        segment_bytes: 1 << 20,
        records_max,
    };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["crash_child_process", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(crash_child::ARGS_ENV, args.to_env())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the child starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // The test harness prints its own lines first.
    let mut line = String::new();
    while !line.starts_with("recovered ") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "child did not recover");
    }
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
        let (mut child, recovery, stdout) = start(dir.path(), u64::MAX);
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
    let (mut child, recovery, stdout) = start(dir.path(), 0);
    check(&recovery, acked, &mut scratch);
    assert!(child.wait().unwrap().success());
    drop(stdout);
    assert!(kills_after_acks * 2 >= iterations, "most runs acknowledged something before the kill");
    eprintln!("{iterations} kills, {acked} inputs acknowledged, recovered {}", recovery.last_seq);
}

/// The durable watermark survives a SIGKILL: cutting the journal just before the highest
/// acknowledged record (on a record boundary, so no CRC notices) is refused, where without
/// the watermark recovery would start one acknowledged record short.
#[test]
fn after_a_sigkill_cutting_the_last_acknowledged_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _, mut stdout) = start(dir.path(), u64::MAX);
    let mut line = String::new();
    while !line.starts_with("ack ") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "the child acknowledged nothing");
    }
    std::thread::sleep(Duration::from_millis(20));
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    let acked = highest_ack(stdout).max(line.trim()["ack ".len()..].parse().unwrap());
    // Cut the segment holding `acked` just before it and remove any later one.
    let mut segments = journal::segment::list_segments(dir.path()).unwrap();
    let holding = segments.iter().rposition(|s| s.first_seq <= acked).unwrap();
    for later in segments.drain(holding + 1..) {
        std::fs::remove_file(later.path).unwrap();
    }
    let segment = segments.pop().unwrap();
    // Transfer frames are 40 bytes (16-byte header + 24-byte payload).
    let cut = journal::segment::SEGMENT_HEADER_BYTES + (acked - segment.first_seq) * 40;
    std::fs::File::options().write(true).open(&segment.path).unwrap().set_len(cut).unwrap();

    let error = journal::recover::<Ledger>(dir.path(), journal::RecoverOptions::default())
        .expect_err("the cut acknowledged record is missed");
    let refusals = ["below-watermark", "newest-segment-missing"];
    assert!(refusals.contains(&error.reason()), "{error}");
    let checked = journal::validate::check(dir.path()).expect_err("check agrees");
    assert_eq!(checked.reason(), error.reason());
    eprintln!("acknowledged {acked}; refused: {error}");
}
