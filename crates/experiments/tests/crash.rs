//! Crash test with a real process and real files: the crash child (`crash_child/mod.rs`, this
//! test binary re-executed) runs the tier with `--data DIR`, the `group` journal and a shard
//! snapshot every [`SNAPSHOT_EVERY`] inputs under open-loop load and is SIGKILLed at random
//! moments (mid-write of a journal batch or of a snapshot included), then restarted on the
//! same directory. After every kill: every reply the client saw (`ack SHARD SEQ`) is reflected
//! in the recovered state of its shard, each input is applied exactly once (the snapshot's
//! inputs plus the replayed ones, no more), and the recovered state equals a replay of every
//! input from scratch.
//!
//! Snapshots make the tier delete the journal segments they cover, so the test keeps its own
//! hard link to every segment file it sees after a kill: the linked inode outlives the
//! tier's deletion, and the replay from scratch reads those links. Segments are large enough
//! that no segment is created and deleted within one run, and the replay's gap check would
//! catch one that was.
//!
//! `LEANTIER_CRASH_ITERATIONS` raises the iteration count.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use exchange::core::CoreLimits;
use exchange::durability::{ShardState, decode};
use exchange::flow::{UniverseConfig, reference_master_data};
use journal::{JournalReader, RecoverOptions, StateMachine, recover_from};
use rand::{Rng, SeedableRng};

mod crash_child;

const SEED: u64 = 42;
const ITERATIONS_DEFAULT: u32 = 20;
const CORE_SHARDS: usize = 2;
/// The child's order pool (kept in step with `crash_child`).
const ORDER_POOL_SLOTS: u32 = 1 << 14;
/// Each run lives this long (uniformly random) after its first ack before the SIGKILL.
const RUN_MS: std::ops::Range<u64> = 20..200;
/// Journaled inputs per shard between two snapshots.
const SNAPSHOT_EVERY: u64 = 100;
/// Segment size: about 1 300 records, several times what one run journals per shard.
const SEGMENT_BYTES: u64 = 64 * 1024;

fn fresh_state() -> ShardState {
    let listings = reference_master_data(&UniverseConfig::default()).listings();
    ShardState::new(
        &listings,
        CoreLimits { order_pool_slots: ORDER_POOL_SLOTS, ..CoreLimits::default() },
    )
}

/// Reads every `ack SHARD SEQ` line the client received (those still in the pipe included).
fn highest_acks(stdout: BufReader<std::process::ChildStdout>, acked: &mut [u64]) {
    for line in stdout.lines().map_while(Result::ok) {
        let mut words = line.split(' ');
        assert_eq!(words.next(), Some("ack"), "unexpected child output {line:?}");
        let shard: usize = words.next().unwrap().parse().unwrap();
        let seq: u64 = words.next().unwrap().parse().unwrap();
        acked[shard] = acked[shard].max(seq);
    }
}

/// Hard-links every segment file of `dir` not linked yet into `archive`.
fn archive_segments(dir: &Path, archive: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let target = archive.join(path.file_name().unwrap());
        if path.extension().is_some_and(|e| e == "seg") && !target.exists() {
            std::fs::hard_link(&path, &target).unwrap();
        }
    }
}

/// What recovering one shard found.
struct Checked {
    last_seq: u64,
    from_snapshot: bool,
}

/// Recovers one shard as the tier does, and checks it against `acked` and a replay from
/// scratch of every input (read from the archived segments); returns what it found.
fn check_shard(dir: &Path, archive: &Path, acked: u64) -> Checked {
    let recovered = recover_from(dir, RecoverOptions::default(), fresh_state).expect("recovers");
    assert!(
        recovered.last_seq >= acked,
        "{}: a reply for sequence {acked} was released but only {} recovered",
        dir.display(),
        recovered.last_seq
    );
    let from_seq = recovered.snapshot_seq.unwrap_or(0);
    assert_eq!(recovered.replayed_records, recovered.last_seq - from_seq, "each input once");
    assert!(recovered.state.undecodable.is_none());
    archive_segments(dir, archive);
    let mut scratch = fresh_state();
    let mut reader = JournalReader::open(archive, 1).expect("opens");
    let mut expected_seq = 1;
    while let Some((seq, payload)) = reader.next_record().expect("valid after recovery") {
        assert_eq!(seq, expected_seq, "gap-free, no duplicate");
        scratch.process(&decode(seq, payload).expect("decodes"), &mut |_| {});
        expected_seq += 1;
    }
    assert_eq!(expected_seq - 1, recovered.last_seq);
    assert_eq!(recovered.state.state_hash(), scratch.state_hash(), "recovered == replay");
    assert_eq!(recovered.state.state_digest(), scratch.state_digest(), "books too");
    Checked { last_seq: recovered.last_seq, from_snapshot: recovered.snapshot_seq.is_some() }
}

/// Not a test of its own: the crash child's body, which the test runs in a process of its own
/// by re-executing this binary with [`crash_child::ARGS_ENV`] set.
#[test]
#[ignore = "the crash child; the crash test runs it in a process of its own"]
fn crash_child_process() {
    if let Ok(flags) = std::env::var(crash_child::ARGS_ENV) {
        crash_child::run(&flags).expect("the crash child runs until killed or done");
    }
}

#[test]
fn sigkill_under_load_never_loses_a_released_reply() {
    let iterations = std::env::var("LEANTIER_CRASH_ITERATIONS")
        .map_or(ITERATIONS_DEFAULT, |v| v.parse().unwrap());
    let data = tempfile::tempdir().unwrap();
    let archive = tempfile::tempdir().unwrap();
    for shard in 0..CORE_SHARDS {
        std::fs::create_dir(archive.path().join(format!("shard-{shard}"))).unwrap();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED);
    let mut acked = [0u64; CORE_SHARDS];
    let mut recovered = [0u64; CORE_SHARDS];
    let (mut kills_after_acks, mut snapshot_recoveries) = (0, 0);
    for _ in 0..iterations {
        let flags = format!(
            "--data {} --core-shards {CORE_SHARDS} --rate 3000 --snapshot-every {SNAPSHOT_EVERY} \
             --segment-bytes {SEGMENT_BYTES}",
            data.path().display()
        );
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "crash_child_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(crash_child::ARGS_ENV, flags)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the child starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        // Kill only once the tier is up (its first ack; the test harness prints its own lines
        // first), at a random moment after that.
        let mut first = String::new();
        while !first.starts_with("ack ") {
            first.clear();
            let read = stdout.read_line(&mut first).unwrap();
            assert!(read > 0, "the child exited before its first reply: {:?}", child.wait());
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(RUN_MS)));
        child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
        let status = child.wait().unwrap();
        assert!(!status.success() && status.code().is_none(), "killed, not exited: {status}");
        let before = acked;
        highest_acks(BufReader::new(stdout.into_inner()), &mut acked);
        let first_words: Vec<&str> = first.trim().split(' ').collect();
        let shard: usize = first_words[1].parse().unwrap();
        acked[shard] = acked[shard].max(first_words[2].parse().unwrap());
        if acked != before {
            kills_after_acks += 1;
        }
        for (shard, last) in recovered.iter_mut().enumerate() {
            let name = format!("shard-{shard}");
            let checked =
                check_shard(&data.path().join(&name), &archive.path().join(&name), acked[shard]);
            assert!(checked.last_seq >= *last, "recovered sequence went back");
            *last = checked.last_seq;
            snapshot_recoveries += u32::from(checked.from_snapshot);
        }
    }
    assert!(kills_after_acks * 2 >= iterations, "most runs released replies before the kill");
    assert!(snapshot_recoveries * 2 >= iterations, "most recoveries started from a snapshot");
    let pruned = (0..CORE_SHARDS).any(|shard| {
        !data.path().join(format!("shard-{shard}")).join(format!("{:020}.seg", 1)).exists()
    });
    assert!(pruned, "snapshots made the first segment obsolete and it was removed");
    eprintln!(
        "{iterations} kills; released up to {acked:?}; recovered {recovered:?}; \
         {snapshot_recoveries} shard recoveries from a snapshot"
    );
}
