//! Shared by the delivery tests: edge child processes and waiting for consumers.

#![allow(dead_code)] // each test file uses a part

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use delivery::consumer::{SharedTally, next_seqs};
use delivery::edge::EdgeReport;
use delivery::wire::{BATCH_RECORDS_MAX, BatchHeader, Record, Stream};
use exchange::msg::Response;

/// Generous: the host is a loaded 2-core machine.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// A `delivery-edge` child process.
pub struct EdgeChild {
    pub child: Child,
    stdout: BufReader<ChildStdout>,
    pub address: SocketAddr,
}

impl EdgeChild {
    /// Starts the edge (optionally under `prefix_cmd`, e.g. `ip netns exec NS`).
    pub fn start(prefix_cmd: &[&str], nats_url: &str, outlet: u32, listen: &str) -> EdgeChild {
        let binary = env!("CARGO_BIN_EXE_delivery-edge");
        let mut command = match prefix_cmd.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let mut child = command
            .args(["--nats", nats_url, "--outlet", &outlet.to_string(), "--listen", listen])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning the edge child");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading the edge's first line");
        let address = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("edge said {line:?}, not `listening ADDR`"))
            .parse()
            .expect("a socket address");
        EdgeChild { child, stdout, address }
    }

    /// SIGTERM, then the report it prints.
    pub fn stop(mut self) -> EdgeReport {
        // SAFETY: kill(2) on our own child's pid with SIGTERM; no memory is involved.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "signalling the edge child");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("reading the edge's report");
        let status = self.child.wait().expect("waiting for the edge child");
        assert!(status.success(), "edge exited with {status}");
        let json = line.trim().strip_prefix("report ").expect("a `report JSON` line");
        serde_json::from_str(json).expect("an edge report")
    }
}

impl Drop for EdgeChild {
    /// A failed test must not leave edge processes behind (after `stop` this is a no-op).
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `tally` reached `target` next sequences (both streams).
pub fn wait_for(tally: &SharedTally, target: [u64; 2]) {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    while next_seqs(tally) != target {
        assert!(
            Instant::now() < deadline,
            "consumer stuck at {:?}, publisher at {target:?}",
            next_seqs(tally)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The publisher instance of the tests' hand-made batches.
pub const INSTANCE: u64 = 0x1ea7_1e55;

/// A full batch of edge 0's report stream from [`INSTANCE`], records `first_seq..` (empty
/// responses).
pub fn batch(first_seq: u64) -> Vec<u8> {
    batch_of(INSTANCE, first_seq, BATCH_RECORDS_MAX)
}

/// `count` records (0: a heartbeat) of edge 0's report stream from publisher `instance`,
/// at `first_seq..`.
pub fn batch_of(instance: u64, first_seq: u64, count: usize) -> Vec<u8> {
    batch_in_epoch(instance, 0, first_seq, count)
}

/// [`batch_of`], published by leadership `epoch`.
pub fn batch_in_epoch(instance: u64, epoch: u64, first_seq: u64, count: usize) -> Vec<u8> {
    let stream = Stream::Reports;
    let header = BatchHeader { stream, outlet: 0, instance, epoch, first_seq, count };
    let mut payload = Vec::new();
    header.write(&mut payload);
    for _ in 0..count {
        payload.extend_from_slice(&Record::encode(&Response::default(), 0, 0).0);
    }
    payload
}
