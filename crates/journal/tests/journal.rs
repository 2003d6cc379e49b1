//! The journal over real files with real fsync: round trips, every policy, snapshots, and the
//! documented behaviour of each fault (torn tail, bit flip, missing segment, write errors).

use std::fs::File;
use std::io;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use journal::ledger::{TransferRecord, transfer_for};
use journal::segment::{self, SEGMENT_BYTES_MIN, SEGMENT_HEADER_BYTES};
use journal::snapshot::SnapshotStats;
use journal::writer::{SegmentIo, WriterStats};
use journal::{
    JournalConfig, JournalError, JournalReader, JournalWriter, Ledger, Policy, RecoverOptions,
    Recovered, Snapshotter, StateMachine, Validation, recover,
};

const SEED: u64 = 0x5EED;
/// Frame of a transfer: 16-byte header + 24-byte payload.
const FRAME_BYTES: u64 = 40;

fn config(policy: Policy, segment_bytes: u64) -> JournalConfig {
    JournalConfig {
        policy,
        segment_bytes,
        relaxed_flush_interval_us: 2_000,
        ..JournalConfig::default()
    }
}

fn open(dir: &Path) -> Recovered<Ledger> {
    recover::<Ledger>(dir, RecoverOptions::default()).expect("recovery succeeds")
}

/// Recovery's and `journal check`'s verdicts on `dir`, which must agree: `Ok` (with the
/// check's report) when recovery starts, else the reason code both give.
fn verdict(dir: &Path) -> Result<Validation, &'static str> {
    let checked = journal::validate::check(dir);
    let recovered = recover::<Ledger>(dir, RecoverOptions::default());
    match (checked, recovered) {
        (Ok(validation), Ok(_)) => Ok(validation),
        (Err(check), Err(recovery)) => {
            assert_eq!(check.reason(), recovery.reason(), "check: {check}\nrecovery: {recovery}");
            Err(recovery.reason())
        }
        (check, recovery) => {
            panic!("check and recovery disagree: {check:?} vs {:?}", recovery.map(|r| r.last_seq))
        }
    }
}

fn scratch_hash(last_seq: u64) -> u64 {
    Ledger::replay_from_scratch(SEED, last_seq).state_hash()
}

/// Recovers, then runs the core over `seqs`: apply, append, snapshot every `snapshot_every`.
fn run_core(
    dir: &Path,
    config: &JournalConfig,
    seqs: RangeInclusive<u64>,
    snapshot_every: u64,
) -> (Ledger, WriterStats, SnapshotStats) {
    let Recovered { mut state, tail, last_seq, .. } = open(dir);
    assert_eq!(last_seq + 1, *seqs.start(), "the run continues where recovery ended");
    let (mut journal, writer) = JournalWriter::spawn::<TransferRecord>(tail, config).unwrap();
    let mut snapshots = Snapshotter::spawn(dir.to_path_buf(), writer.durable()).unwrap();
    for seq in seqs {
        let record = transfer_for(SEED, seq);
        state.apply(seq, &record.payload);
        journal.append(record).unwrap();
        if config.policy == Policy::Sync {
            assert!(journal.durable().covers(seq), "sync returns only once the record is on disk");
        }
        // The tests want every snapshot taken; a real core would skip one and go on.
        while seq.is_multiple_of(snapshot_every) && !snapshots.offer(seq, &state) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    drop(journal);
    let stats = writer.join().unwrap();
    (state, stats, snapshots.finish().unwrap())
}

fn read_all(dir: &Path, from_seq: u64) -> Vec<(u64, Vec<u8>)> {
    let mut reader = JournalReader::open(dir, from_seq).unwrap();
    let mut records = Vec::new();
    while let Some((seq, payload)) = reader.next_record().unwrap() {
        records.push((seq, payload.to_vec()));
    }
    records
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    segment::list_segments(dir).unwrap().into_iter().map(|s| s.path).collect()
}

/// Offset of record `seq` inside the segment whose first record is `first_seq`.
fn offset_of(seq: u64, first_seq: u64) -> u64 {
    SEGMENT_HEADER_BYTES + (seq - first_seq) * FRAME_BYTES
}

fn flip_bit(path: &Path, offset: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[offset as usize] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn records_round_trip_across_segments_and_a_restart_resumes_the_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(Policy::Group, SEGMENT_BYTES_MIN);
    let (state, stats, _) = run_core(dir.path(), &config, 1..=1000, u64::MAX);
    assert_eq!(stats.records, 1000);
    assert!(stats.syncs <= stats.batches && stats.syncs >= 1);
    assert!(segments(dir.path()).len() >= 10, "8 KiB segments hold ~100 records each");
    let records = read_all(dir.path(), 1);
    assert_eq!(records.len(), 1000);
    for (seq, payload) in &records {
        assert_eq!(payload.as_slice(), &transfer_for(SEED, *seq).payload);
    }
    assert_eq!(
        read_all(dir.path(), 777)[0].0,
        777,
        "reading from a sequence skips earlier records"
    );

    let recovered = open(dir.path());
    assert_eq!((recovered.last_seq, recovered.replayed_records), (1000, 1000));
    assert_eq!(recovered.state, state);
    run_core(dir.path(), &config, 1001..=1500, u64::MAX);
    let recovered = open(dir.path());
    assert_eq!(recovered.last_seq, 1500);
    assert_eq!(recovered.state.state_hash(), scratch_hash(1500));
}

#[test]
fn every_policy_has_everything_durable_at_shutdown() {
    for policy in [Policy::Sync, Policy::Group, Policy::Relaxed] {
        let dir = tempfile::tempdir().unwrap();
        let (_, stats, _) = run_core(dir.path(), &config(policy, 64 * 1024), 1..=300, u64::MAX);
        assert_eq!(stats.records, 300, "{policy:?}");
        if policy == Policy::Sync {
            assert_eq!(stats.syncs, 300, "sync: one fsync per record");
        }
        let recovered = open(dir.path());
        assert_eq!(recovered.last_seq, 300, "{policy:?}");
        assert_eq!(recovered.state.state_hash(), scratch_hash(300), "{policy:?}");
    }
}

#[test]
fn the_blocking_connector_baseline_journals_the_same_records() {
    let dir = tempfile::tempdir().unwrap();
    let config = JournalConfig {
        connector: pipeline::ConnectorKind::Blocking,
        ..config(Policy::Group, SEGMENT_BYTES_MIN)
    };
    run_core(dir.path(), &config, 1..=500, u64::MAX);
    let recovered = open(dir.path());
    assert_eq!((recovered.last_seq, recovered.state.state_hash()), (500, scratch_hash(500)));
}

#[test]
fn relaxed_syncs_on_its_timer_while_the_core_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let tail = open(dir.path()).tail;
    let (mut journal, writer) =
        JournalWriter::spawn::<TransferRecord>(tail, &config(Policy::Relaxed, 64 * 1024)).unwrap();
    for seq in 1..=10 {
        journal.append(transfer_for(SEED, seq)).unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !journal.durable().covers(10) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(journal.durable().covers(10), "the timer flush made the idle tail durable");
    drop(journal);
    assert_eq!(writer.join().unwrap().records, 10);
}

#[test]
fn a_record_out_of_sequence_stops_the_writer_with_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let tail = open(dir.path()).tail;
    let (mut journal, writer) =
        JournalWriter::spawn::<TransferRecord>(tail, &config(Policy::Sync, SEGMENT_BYTES_MIN))
            .unwrap();
    journal.append(transfer_for(SEED, 1)).unwrap();
    assert!(
        journal.append(transfer_for(SEED, 3)).is_err(),
        "sync append reports the stopped writer"
    );
    drop(journal);
    let error = writer.join().unwrap_err();
    assert!(matches!(error, JournalError::OutOfSequence { expected: 2, got: 3 }), "{error}");
    assert_eq!(open(dir.path()).last_seq, 1);
}

/// Writes the first `bytes` of record `seq`'s frame after the journal's last record, as a
/// batch write cut short by a crash leaves it (never synced, so never acknowledged).
fn write_torn_frame(segment: &Path, seq: u64, first_seq: u64, bytes: usize) {
    let mut frame = vec![0u8; FRAME_BYTES as usize];
    frame[journal::frame::FRAME_HEADER_BYTES..].copy_from_slice(&transfer_for(SEED, seq).payload);
    journal::frame::seal(&mut frame, seq);
    let file = File::options().write(true).open(segment).unwrap();
    segment::write_all_at(&file, &frame[..bytes], offset_of(seq, first_seq)).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn a_torn_write_above_the_watermark_is_truncated_and_writing_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(Policy::Group, 1 << 20);
    run_core(dir.path(), &config, 1..=50, u64::MAX);
    let segment = segments(dir.path()).remove(0);
    let torn_at = offset_of(51, 1);
    write_torn_frame(&segment, 51, 1, 20);

    let checked = journal::validate::check(dir.path()).expect("check passes it");
    assert_eq!(checked.torn_tail.map(|t| t.offset), Some(torn_at), "check reports it too");
    assert_eq!(checked.watermark, 50);
    let recovered = open(dir.path());
    let torn = recovered.torn_tail.clone().expect("the torn tail is reported");
    assert_eq!((torn.file.as_path(), torn.offset), (segment.as_path(), torn_at));
    assert_eq!(recovered.last_seq, 50);
    assert_eq!(recovered.state.state_hash(), scratch_hash(50));
    let bytes = std::fs::read(&segment).unwrap();
    assert!(bytes[torn_at as usize..].iter().all(|&b| b == 0), "the torn bytes are gone");

    run_core(dir.path(), &config, 51..=80, u64::MAX);
    let recovered = open(dir.path());
    assert!(recovered.torn_tail.is_none());
    assert_eq!((recovered.last_seq, recovered.state.state_hash()), (80, scratch_hash(80)));
}

#[test]
fn a_segment_whose_creation_was_cut_short_is_removed_and_writing_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(Policy::Group, 1 << 20);
    run_core(dir.path(), &config, 1..=50, u64::MAX);
    for torn_length in [0, 4096] {
        // The crash hit between creating the file and writing its header.
        let torn = segment::segment_path(dir.path(), 51);
        File::create(&torn).unwrap().set_len(torn_length).unwrap();
        let recovered = open(dir.path());
        assert_eq!(recovered.last_seq, 50);
        assert!(!torn.exists(), "the headerless segment is removed");
    }
    run_core(dir.path(), &config, 51..=60, u64::MAX);
    assert_eq!(open(dir.path()).state.state_hash(), scratch_hash(60));
}

#[test]
fn a_bit_flip_mid_journal_stops_start_up_naming_file_offset_and_seq_and_repair_truncates() {
    let dir = tempfile::tempdir().unwrap();
    run_core(dir.path(), &config(Policy::Group, SEGMENT_BYTES_MIN), 1..=500, u64::MAX);
    let all = segment::list_segments(dir.path()).unwrap();
    let victim = &all[1];
    let seq = victim.first_seq + 10;
    let offset = offset_of(seq, victim.first_seq);
    flip_bit(&victim.path, offset + 20);

    let error = recover::<Ledger>(dir.path(), RecoverOptions::default()).unwrap_err();
    match &error {
        JournalError::Corrupt { file, offset: at, seq: at_seq } => {
            assert_eq!((file, *at, *at_seq), (&victim.path, offset, seq));
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    let message = error.to_string();
    assert!(
        message.contains(&victim.path.display().to_string())
            && message.contains(&offset.to_string()),
        "{message}"
    );

    let repaired = recover::<Ledger>(dir.path(), RecoverOptions { repair: true }).unwrap();
    let report = repaired.repaired.clone().expect("repair is reported");
    assert_eq!((report.first_discarded_seq, report.segments_removed), (seq, all.len() - 2));
    assert_eq!(report.reason, "corrupt");
    assert_eq!(repaired.last_seq, seq - 1);
    assert_eq!(repaired.state.state_hash(), scratch_hash(seq - 1));
    let again = open(dir.path());
    assert_eq!(again.last_seq, seq - 1, "after repair the journal opens cleanly");
}

#[test]
fn a_bit_flip_in_the_last_segment_with_records_after_it_is_corruption_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    run_core(dir.path(), &config(Policy::Group, 1 << 20), 1..=100, u64::MAX);
    let segment = segments(dir.path()).remove(0);
    flip_bit(&segment, offset_of(40, 1) + 3);
    let error = recover::<Ledger>(dir.path(), RecoverOptions::default()).unwrap_err();
    assert!(matches!(error, JournalError::Corrupt { seq: 40, .. }), "{error}");
}

#[test]
fn a_missing_segment_is_an_error_naming_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    run_core(dir.path(), &config(Policy::Group, SEGMENT_BYTES_MIN), 1..=500, u64::MAX);
    let all = segment::list_segments(dir.path()).unwrap();
    std::fs::remove_file(&all[2].path).unwrap();
    let error = recover::<Ledger>(dir.path(), RecoverOptions { repair: true }).unwrap_err();
    match error {
        JournalError::MissingSegment { expected_seq, found_first_seq, .. } => {
            assert_eq!((expected_seq, found_first_seq), (all[2].first_seq, all[3].first_seq));
        }
        other => panic!("expected MissingSegment, got {other}"),
    }
}

#[test]
fn snapshots_bound_the_replay_prune_old_segments_and_a_damaged_one_falls_back() {
    let dir = tempfile::tempdir().unwrap();
    let (state, _, snapshot_stats) =
        run_core(dir.path(), &config(Policy::Group, SEGMENT_BYTES_MIN), 1..=2000, 500);
    assert_eq!(snapshot_stats.taken, 4);
    assert!(snapshot_stats.pause_ns_max > 0);
    let snapshots: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "snap"))
        .collect();
    assert_eq!(snapshots.len(), journal::snapshot::SNAPSHOTS_KEPT);
    let first_kept = segment::list_segments(dir.path()).unwrap()[0].first_seq;
    assert!(
        first_kept > 1000,
        "segments before the older kept snapshot are removed ({first_kept})"
    );

    let recovered = open(dir.path());
    assert_eq!(recovered.snapshot_seq, Some(2000));
    assert_eq!((recovered.last_seq, recovered.replayed_records), (2000, 0));
    assert_eq!(recovered.state, state);

    let newest = dir.path().join(format!("{:020}.snap", 2000));
    flip_bit(&newest, 100);
    let recovered = open(dir.path());
    assert_eq!(recovered.snapshot_seq, Some(1500), "falls back to the older snapshot");
    assert_eq!((recovered.last_seq, recovered.replayed_records), (2000, 500));
    assert_eq!(recovered.state.state_hash(), scratch_hash(2000));
}

/// Real file I/O that fails the `fail_at`-th write or sync with `errno`.
struct FailingIo {
    writes: u32,
    syncs: u32,
    fail_write_at: u32,
    fail_sync_at: u32,
    errno: i32,
}

impl SegmentIo for FailingIo {
    fn write_at(&mut self, file: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.writes += 1;
        if self.writes == self.fail_write_at {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        segment::write_all_at(file, bytes, offset)
    }

    fn sync_data(&mut self, file: &File) -> io::Result<()> {
        self.syncs += 1;
        if self.syncs == self.fail_sync_at {
            return Err(io::Error::from_raw_os_error(self.errno));
        }
        file.sync_data()
    }
}

/// Feeds records until the writer stops; returns (durable seq, error) and checks that
/// recovery holds at least every durable record, each applied once.
fn run_until_failure(io: FailingIo) -> (u64, JournalError) {
    let dir = tempfile::tempdir().unwrap();
    let tail = open(dir.path()).tail;
    let (mut journal, writer) =
        JournalWriter::spawn_with_io::<TransferRecord, _>(tail, &config(Policy::Sync, 1 << 20), io)
            .unwrap();
    let durable = writer.durable();
    let appended = (1..=1000)
        .take_while(|&seq| journal.append(transfer_for(SEED, seq)).is_ok())
        .count() as u64;
    drop(journal);
    let error = writer.join().unwrap_err();
    assert!(durable.has_failed());
    let durable_seq = durable.get();
    assert!(durable_seq <= appended && appended < 1000, "the core saw the failure ({appended})");
    let recovered = open(dir.path());
    assert!(recovered.last_seq >= durable_seq, "no acknowledged record lost");
    assert_eq!(recovered.state.state_hash(), scratch_hash(recovered.last_seq));
    (durable_seq, error)
}

#[test]
fn a_full_disk_stops_the_writer_without_acknowledging_the_failed_batch() {
    let io =
        FailingIo { writes: 0, syncs: 0, fail_write_at: 5, fail_sync_at: 0, errno: libc::ENOSPC };
    let (durable_seq, error) = run_until_failure(io);
    assert_eq!(durable_seq, 4, "sync policy: one record per write, four succeeded");
    assert!(error.to_string().contains("No space left on device"), "{error}");
}

#[test]
fn a_failed_fdatasync_is_not_retried_and_not_acknowledged() {
    let io = FailingIo { writes: 0, syncs: 0, fail_write_at: 0, fail_sync_at: 3, errno: libc::EIO };
    let (durable_seq, error) = run_until_failure(io);
    assert_eq!(durable_seq, 2);
    assert!(error.to_string().contains("fdatasync"), "{error}");
}

// The durable watermark (issue 17): no acknowledged record is discarded without a refusal,
// and `journal check` reaches recovery's verdict in every case.

/// Repairs `dir` and returns what was discarded.
fn repair(dir: &Path) -> (Recovered<Ledger>, journal::Repaired) {
    let recovered = recover::<Ledger>(dir, RecoverOptions { repair: true }).expect("repairs");
    let repaired = recovered.repaired.clone().expect("the repair is reported");
    (recovered, repaired)
}

#[test]
fn a_deleted_newest_segment_is_refused_even_with_a_snapshot_past_the_journal_end() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(Policy::Group, SEGMENT_BYTES_MIN);
    run_core(dir.path(), &config, 1..=1015, 490);
    let newest = segment::list_segments(dir.path()).unwrap().pop().unwrap();
    assert!(newest.first_seq <= 980, "the snapshot at 980 lies past the rest of the journal");
    std::fs::remove_file(&newest.path).unwrap();

    assert_eq!(verdict(dir.path()).unwrap_err(), "newest-segment-missing");
    let error = recover::<Ledger>(dir.path(), RecoverOptions::default()).unwrap_err();
    let message = error.to_string();
    assert!(message.contains(&newest.path.display().to_string()), "names the file: {message}");
    assert!(message.contains("at least 1015"), "names the watermark: {message}");

    let (recovered, repaired) = repair(dir.path());
    assert_eq!(repaired.reason, "newest-segment-missing");
    assert_eq!((repaired.first_discarded_seq, repaired.watermark), (981, 1015));
    assert_eq!((recovered.snapshot_seq, recovered.last_seq), (Some(980), 980));
    let after = verdict(dir.path()).expect("starts after the repair");
    let lost = &after.covered;
    assert_eq!(
        (lost.len(), lost[0].last_seq),
        (1, 980),
        "lost records under the snapshot: {lost:?}"
    );
    run_core(dir.path(), &config, 981..=1100, u64::MAX);
    assert_eq!(open(dir.path()).state.state_hash(), scratch_hash(1100));
}

#[test]
fn a_segment_truncated_on_a_record_boundary_is_refused_naming_the_missing_records() {
    let dir = tempfile::tempdir().unwrap();
    run_core(dir.path(), &config(Policy::Group, 1 << 20), 1..=300, u64::MAX);
    let segment = segments(dir.path()).remove(0);
    File::options().write(true).open(&segment).unwrap().set_len(offset_of(251, 1)).unwrap();

    assert_eq!(verdict(dir.path()).unwrap_err(), "below-watermark");
    let error = recover::<Ledger>(dir.path(), RecoverOptions::default()).unwrap_err();
    assert!(error.to_string().contains("251..=300"), "{error}");

    let (recovered, repaired) = repair(dir.path());
    assert_eq!((repaired.reason, repaired.first_discarded_seq), ("below-watermark", 251));
    assert_eq!(recovered.last_seq, 250);
    assert_eq!(verdict(dir.path()).expect("starts after the repair").watermark, 250);
}

#[test]
fn a_bit_flip_in_the_last_durable_record_is_corruption_not_a_torn_write() {
    let dir = tempfile::tempdir().unwrap();
    run_core(dir.path(), &config(Policy::Group, 1 << 20), 1..=100, u64::MAX);
    let segment = segments(dir.path()).remove(0);
    flip_bit(&segment, offset_of(100, 1) + 20);
    let damaged = std::fs::read(&segment).unwrap();

    assert_eq!(verdict(dir.path()).unwrap_err(), "corrupt-durable");
    let error = recover::<Ledger>(dir.path(), RecoverOptions::default()).unwrap_err();
    assert!(
        matches!(error, JournalError::CorruptDurable { seq: 100, watermark: 100, .. }),
        "{error}"
    );
    assert_eq!(std::fs::read(&segment).unwrap(), damaged, "nothing was truncated");

    let (recovered, repaired) = repair(dir.path());
    assert_eq!((repaired.reason, repaired.first_discarded_seq), ("corrupt-durable", 100));
    assert_eq!(repaired.truncated.map(|cut| cut.offset), Some(offset_of(100, 1)));
    assert_eq!((recovered.last_seq, recovered.state.state_hash()), (99, scratch_hash(99)));
}

#[test]
fn damage_covered_by_the_snapshot_is_reported_by_both_and_damage_past_it_refused_by_both() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(Policy::Group, SEGMENT_BYTES_MIN);
    run_core(dir.path(), &config, 1..=1050, 500);
    let holding = |seq: u64| {
        let all = segment::list_segments(dir.path()).unwrap();
        all.into_iter().rfind(|s| s.first_seq <= seq).unwrap()
    };
    let covered = holding(700);
    flip_bit(&covered.path, offset_of(700, covered.first_seq) + 20);

    let checked = verdict(dir.path()).expect("covered damage does not stop start-up");
    assert_eq!(checked.covered.len(), 1);
    let damage = &checked.covered[0];
    assert_eq!((damage.first_seq, damage.last_seq, &damage.file), (700, 700, &covered.path));
    let recovered = open(dir.path());
    assert_eq!((recovered.snapshot_seq, recovered.replayed_records), (Some(1000), 50));
    assert_eq!(recovered.state.state_hash(), scratch_hash(1050));

    let past = holding(1020);
    flip_bit(&past.path, offset_of(1020, past.first_seq) + 20);
    assert_eq!(verdict(dir.path()).unwrap_err(), "corrupt");
}

#[test]
fn folders_without_segments_empty_new_or_emptied_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let checked = journal::validate::check(dir.path()).unwrap();
    assert!(checked.empty, "no files at all: no journal here");
    assert_eq!(open(dir.path()).last_seq, 0, "recovery starts a new journal there");

    // A writer that started and stopped without a record: a journal, with a watermark of 0.
    let (journal, writer) = JournalWriter::spawn::<TransferRecord>(
        open(dir.path()).tail,
        &config(Policy::Group, 1 << 20),
    )
    .unwrap();
    drop(journal);
    writer.join().unwrap();
    let checked = verdict(dir.path()).expect("a new, empty journal starts");
    assert!(!checked.empty && checked.watermark == 0 && checked.last_seq == 0, "{checked:?}");

    run_core(dir.path(), &config(Policy::Group, SEGMENT_BYTES_MIN), 1..=400, 300);
    for path in segments(dir.path()) {
        std::fs::remove_file(path).unwrap();
    }
    assert_eq!(verdict(dir.path()).unwrap_err(), "newest-segment-missing");
    std::fs::remove_file(dir.path().join(journal::watermark::WATERMARK_FILE)).unwrap();
    assert_eq!(verdict(dir.path()).unwrap_err(), "watermark-missing", "a snapshot remains");
    // Repair can only rebuild from what is left: the snapshot (records after it are gone).
    let repaired = recover::<Ledger>(dir.path(), RecoverOptions { repair: true }).unwrap();
    assert_eq!((repaired.snapshot_seq, repaired.last_seq), (Some(300), 300));
}

/// While the writer runs (no clean shutdown yet, as after `kill -9`), the watermark file
/// trails the durable sequence by at most WATERMARK_NOTE_INTERVAL, not since the writer's
/// start: where a segment's own slots are damaged, it still names what was durable.
#[test]
fn the_watermark_file_follows_the_durable_sequence_while_the_writer_runs() {
    let dir = tempfile::tempdir().unwrap();
    let Recovered { tail, .. } = open(dir.path());
    let config = config(Policy::Group, SEGMENT_BYTES_MIN);
    let (mut journal, writer) = JournalWriter::spawn::<TransferRecord>(tail, &config).unwrap();
    let durable = writer.durable();
    let mut append_until_durable = |seqs: RangeInclusive<u64>| {
        let last = *seqs.end();
        for seq in seqs {
            journal.append(transfer_for(SEED, seq)).unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !durable.covers(last) {
            assert!(std::time::Instant::now() < deadline, "records not durable");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    append_until_durable(1..=10);
    std::thread::sleep(journal::writer::WATERMARK_NOTE_INTERVAL);
    append_until_durable(11..=20);
    let noted = journal::watermark::read_file(dir.path()).unwrap().expect("a watermark file");
    // The first sync after the interval notes what it made durable: all of 11..=20 when one sync
    // took them, fewer when a loaded host let the writer sync 11 alone first; never 10 or less.
    assert!(
        (11..=20).contains(&noted.durable_seq),
        "noted {} after the interval passed; a sync after it made 11..=20 durable",
        noted.durable_seq
    );
    drop(journal);
    writer.join().unwrap();
}

// Blank watermark slots (issue 29): the newest segment's slots are the only proof of how far
// it was durable once the watermark file holds an old value.

/// Writes `slots` (raw bytes, zeros: blank) into the two watermark slots of `path`.
fn write_slots(path: &Path, slots: [[u8; journal::segment::SLOT_BYTES]; 2]) {
    let file = File::options().write(true).open(path).unwrap();
    for (slot, offset) in slots.iter().zip(journal::segment::SLOT_OFFSETS) {
        segment::write_all_at(&file, slot, offset).unwrap();
    }
    file.sync_all().unwrap();
}

#[test]
fn a_newest_segment_with_blank_watermark_slots_is_refused_and_repair_accepts_its_end() {
    use journal::watermark::{WatermarkFile, WatermarkStore};
    let dir = tempfile::tempdir().unwrap();
    let config = config(Policy::Group, 1 << 20);
    run_core(dir.path(), &config, 1..=300, u64::MAX);
    let segment = segments(dir.path()).remove(0);
    // After a kill -9 the watermark file may still hold its value from the writer's start;
    // then both slots blanked and the tail cut on a record boundary.
    let start = WatermarkFile { newest_segment: 1, durable_seq: 0 };
    WatermarkStore::open(dir.path()).unwrap().write(&start).unwrap();
    write_slots(&segment, [[0; journal::segment::SLOT_BYTES]; 2]);
    File::options().write(true).open(&segment).unwrap().set_len(offset_of(251, 1)).unwrap();

    assert_eq!(verdict(dir.path()).unwrap_err(), "watermark-slots-blank");
    let error = recover::<Ledger>(dir.path(), RecoverOptions::default()).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("1..=250"), "names the records: {message}");
    assert!(message.contains(&segment.display().to_string()), "names the file: {message}");

    let (recovered, repaired) = repair(dir.path());
    assert_eq!((repaired.reason, repaired.first_discarded_seq), ("watermark-slots-blank", 251));
    assert_eq!((recovered.last_seq, recovered.state.state_hash()), (250, scratch_hash(250)));
    assert_eq!(verdict(dir.path()).expect("starts after the repair").watermark, 250);
    run_core(dir.path(), &config, 251..=260, u64::MAX);
    assert_eq!(open(dir.path()).state.state_hash(), scratch_hash(260));
}

#[test]
fn fresh_segments_are_not_taken_for_blank_watermark_slots() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(Policy::Group, 1 << 20);
    run_core(dir.path(), &config, 1..=50, u64::MAX);
    let first = segments(dir.path()).remove(0);
    // Killed between the first sync and its slot write: only the creation slot is valid.
    let creation_slot = journal::segment::encode_slot(1, 0);
    write_slots(&first, [creation_slot, [0; journal::segment::SLOT_BYTES]]);
    assert_eq!(verdict(dir.path()).expect("the creation slot is valid").last_seq, 50);

    // A new segment whose header page was cut between its first sector and its slot's: no
    // record went into it, nothing is lost.
    segment::create(dir.path(), 51, 1 << 20).unwrap();
    let newest = segment::segment_path(dir.path(), 51);
    write_slots(&newest, [[0; journal::segment::SLOT_BYTES]; 2]);
    assert_eq!(verdict(dir.path()).expect("a segment without records").last_seq, 50);
    run_core(dir.path(), &config, 51..=60, u64::MAX);
    assert_eq!(open(dir.path()).state.state_hash(), scratch_hash(60));
}
