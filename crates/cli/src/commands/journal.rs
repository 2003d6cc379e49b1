//! `leantier journal ...`: the benchmark (`experiments::journal_bench`, so the journal
//! library carries no load driver or statistics dependency) and a read-only journal checker.

use std::path::PathBuf;
use std::time::Duration;

use super::values::{self, one_of};
use crate::outcome::{BadInput, TargetMissed};
use anyhow::Context;
use experiments::report::Table;
use ops::config::{load_toml, override_with};

use experiments::journal_bench::BenchConfig;
use journal::writer::Policy;

/// The safe store writer: benchmark it, or check a journal directory.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Throughput at 64/256/1024-byte records (group commit), the raw 4 KiB append + fdatasync
    /// baseline, and durable-reply latency per policy under open-loop load, in one run.
    Bench(Box<BenchArgs>),
    /// Validate a journal directory read-only with recovery's own rules (durable watermark,
    /// CRCs, sequence continuity, snapshot-covered damage, torn tail): exit 0 when recovery
    /// would start, 1 when it would refuse (the reason code is printed), 2 for a folder with no
    /// journal. On a folder of journals (a tier's `store/tier`: `shard-N`, `master`) each
    /// journal below it is checked, one line each, and the exit code is the worst.
    Check(CheckArgs),
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// TOML file with any `BenchConfig` fields; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory on the disk under test (journals are removed after each run).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Record payload sizes of the throughput runs, comma-separated (64, 256, 1024).
    #[arg(long, value_delimiter = ',')]
    pub record_bytes: Option<Vec<usize>>,
    /// Length of each throughput run, e.g. 1500ms.
    #[arg(long, alias = "throughput-ms", value_name = "DURATION", value_parser = values::millis)]
    pub throughput_duration: Option<Duration>,
    /// Samples of the raw 4 KiB append + fdatasync baseline.
    #[arg(long)]
    pub fsync_samples: Option<u64>,
    /// Arrival rate of the latency runs (Poisson), messages per second.
    #[arg(long, allow_negative_numbers = true)]
    pub rate: Option<f64>,
    /// Length of each latency run, e.g. 2s.
    #[arg(long, alias = "latency-ms", value_name = "DURATION", value_parser = values::millis)]
    pub latency_duration: Option<Duration>,
    /// Policies of the latency runs, comma-separated (sync, group, relaxed).
    #[arg(long, value_delimiter = ',', value_parser = one_of(&Policy::ALL, Policy::name))]
    pub policies: Option<Vec<Policy>>,
    /// Seed of the arrival schedule.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Wait strategy of the journal ring and the reply thread: spin, spin-yield, park,
    /// adaptive (on a shared or small machine, spinning steals the core it waits for).
    #[arg(long)]
    pub wait: Option<String>,
    /// Report folder: results.json, results.md, CSV tables and an SVG plot.
    #[arg(long, alias = "report", default_value = "leantier-report/journal-bench")]
    pub out: PathBuf,
    /// Exit with code 3 if a target is missed (>= 1M records/s at 64 B; group durable-reply
    /// p99 <= 2x the raw fdatasync p99).
    #[arg(long)]
    pub check: bool,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The journal directory, or a folder holding journals in its subfolders.
    #[arg(long)]
    pub dir: PathBuf,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.command {
        Command::Bench(bench_args) => run_bench(bench_args),
        Command::Check(check_args) => run_check(check_args),
    }
}

fn bench_config(args: &BenchArgs) -> anyhow::Result<BenchConfig> {
    let mut config: BenchConfig = load_toml(args.config.as_deref())?;
    override_with(&mut config.dir, &args.dir);
    override_with(&mut config.record_bytes, &args.record_bytes);
    override_with(&mut config.throughput_ms, &args.throughput_duration.map(values::whole_millis));
    override_with(&mut config.fsync_samples, &args.fsync_samples);
    override_with(&mut config.rate_per_s, &args.rate);
    override_with(&mut config.latency_ms, &args.latency_duration.map(values::whole_millis));
    override_with(&mut config.policies, &args.policies);
    override_with(&mut config.seed, &args.seed);
    override_with(&mut config.wait, &args.wait);
    let valid = config.rate_per_s > 0.0 && config.fsync_samples > 0 && config.throughput_ms > 0;
    if !valid {
        return Err(
            BadInput("rate, fsync-samples and throughput-duration must be > 0".into()).into()
        );
    }
    Ok(config)
}

fn run_bench(args: &BenchArgs) -> anyhow::Result<()> {
    let config = bench_config(args)?;
    let results = experiments::journal_bench::run_all(&config)?;
    let missed = experiments::journal_bench::write_report(&results, &args.out)?;
    if args.check && !missed.is_empty() {
        return Err(TargetMissed(missed).into());
    }
    Ok(())
}

/// How deep below `journal check --dir` journals are looked for: a tier's data folder holds
/// them one level down (`tier/shard-0`), a serve store two (`store/tier/shard-0`).
const JOURNAL_SEARCH_DEPTH_MAX: usize = 3;

/// What recovery's validation said of one journal.
type Checked = (PathBuf, Result<journal::Validation, journal::JournalError>);

/// Runs recovery's own validation ([`journal::validate::check`]) and prints its verdict; a
/// refusal is the error (with its reason code), a folder with no journal in or below it is
/// bad input. A folder without a journal of its own but with journals below it has each of
/// them checked.
fn run_check(args: &CheckArgs) -> anyhow::Result<()> {
    let dir = &args.dir;
    if !dir.is_dir() {
        return Err(BadInput(format!("{} is not a directory", dir.display())).into());
    }
    let mut found = Vec::new();
    journals_below(dir, JOURNAL_SEARCH_DEPTH_MAX, &mut found)?;
    match found.as_slice() {
        [(only, _)] if only == dir => check_one(dir),
        [] => Err(BadInput(format!(
            "{}: no journal here (reason: empty): no segment, no snapshot, no watermark file, \
             in it or in its subfolders; recovery would start a new, empty journal",
            dir.display()
        ))
        .into()),
        _ => check_each(dir, &found),
    }
}

/// `dir` when it holds a journal (sound or not); else, down to `depth` levels, each
/// subfolder's journals, in name order.
fn journals_below(
    dir: &std::path::Path,
    depth: usize,
    found: &mut Vec<Checked>,
) -> anyhow::Result<()> {
    let checked = journal::validate::check(dir);
    if !matches!(&checked, Ok(verdict) if verdict.empty) {
        found.push((dir.to_path_buf(), checked));
        return Ok(());
    }
    if depth == 0 {
        return Ok(());
    }
    let listing = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    let mut subfolders = Vec::new();
    for entry in listing {
        let path = entry.with_context(|| format!("listing {}", dir.display()))?.path();
        if path.is_dir() {
            subfolders.push(path);
        }
    }
    subfolders.sort();
    for subfolder in subfolders {
        journals_below(&subfolder, depth - 1, found)?;
    }
    Ok(())
}

/// One line per journal below `dir` with its verdict; an error naming those recovery would
/// refuse (exit 1) when there are any.
fn check_each(dir: &std::path::Path, found: &[Checked]) -> anyhow::Result<()> {
    for checked in found {
        println!("{}", verdict_line(checked));
    }
    let refused: Vec<String> = found
        .iter()
        .filter(|(_, checked)| checked.is_err())
        .map(|(path, _)| path.display().to_string())
        .collect();
    anyhow::ensure!(
        refused.is_empty(),
        "{} of the {} journals below {}: recovery would refuse to start ({})",
        refused.len(),
        found.len(),
        dir.display(),
        refused.join(", ")
    );
    Ok(())
}

/// "ok PATH: …" or "refused PATH (reason: R): …".
fn verdict_line((path, checked): &Checked) -> String {
    let path = path.display();
    match checked {
        Ok(verdict) => {
            let or_dash = |seq: Option<u64>| seq.map_or("-".to_string(), |s| s.to_string());
            let torn =
                if verdict.torn_tail.is_some() { ", a torn tail start-up truncates" } else { "" };
            format!(
                "ok {path}: segments {}, last seq {}, durable watermark {}, snapshot {}, \
                 covered damage {}{torn}",
                verdict.segments,
                verdict.last_seq,
                verdict.watermark,
                or_dash(verdict.snapshot_seq),
                verdict.covered.len()
            )
        }
        Err(error) => {
            let why = ops::error_chain(error);
            format!("refused {path} (reason: {}): {why}", error.reason())
        }
    }
}

/// The one journal in `dir`, in full: its table, covered damage and torn tail.
fn check_one(dir: &std::path::Path) -> anyhow::Result<()> {
    let verdict = journal::validate::check(dir).map_err(|error| {
        let reason = error.reason();
        anyhow::Error::new(error).context(format!(
            "{}: recovery would refuse to start (reason: {reason})",
            dir.display()
        ))
    })?;
    if verdict.empty {
        return Err(BadInput(format!(
            "{}: no journal here (reason: empty): no segment, no snapshot, no watermark file; \
             recovery would start a new, empty journal",
            dir.display()
        ))
        .into());
    }
    println!("{}", check_table(&verdict));
    for damage in &verdict.covered {
        println!(
            "warning (covered): {:?} in {} at offset {}: records {}..={} are damaged but covered \
             by snapshot {}; recovery starts from it",
            damage.kind,
            damage.file.display(),
            damage.offset,
            damage.first_seq,
            damage.last_seq,
            verdict.snapshot_seq.unwrap_or(0)
        );
    }
    if let Some(path) = &verdict.torn_segment {
        println!("segment {} has no header: start-up will remove it (no data)", path.display());
    }
    match &verdict.torn_tail {
        Some(torn) => println!(
            "torn last record in {} at offset {} (above the durable watermark {}): start-up will \
             truncate it (never acknowledged)",
            torn.file.display(),
            torn.offset,
            verdict.watermark
        ),
        None => println!("ok: every durable record present and valid, sequence continuous"),
    }
    Ok(())
}

fn check_table(verdict: &journal::Validation) -> Table {
    let mut table = Table::new([
        "segments",
        "first segment",
        "last seq",
        "durable watermark",
        "snapshot",
        "covered damage",
    ])
    .with_title("Journal check");
    let or_dash = |seq: Option<u64>| seq.map_or("-".to_string(), |s| s.to_string());
    table.row([
        verdict.segments.to_string(),
        or_dash(verdict.first_segment_seq),
        verdict.last_seq.to_string(),
        verdict.watermark.to_string(),
        or_dash(verdict.snapshot_seq),
        verdict.covered.len().to_string(),
    ]);
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use journal::ledger::{TransferRecord, transfer_for};
    use journal::segment::{self, SEGMENT_BYTES_MIN, SEGMENT_HEADER_BYTES};
    use journal::writer::{JournalConfig, JournalWriter, Tail};

    #[test]
    fn check_passes_a_sound_journal_and_names_the_file_of_a_corrupt_one() {
        let dir = tempfile::tempdir().unwrap();
        write_journal(dir.path());
        let args = CheckArgs { dir: dir.path().to_path_buf() };
        run_check(&args).unwrap();

        let victim = segment::list_segments(dir.path()).unwrap().remove(0).path;
        let mut bytes = std::fs::read(&victim).unwrap();
        bytes[SEGMENT_HEADER_BYTES as usize + 100] ^= 1;
        std::fs::write(&victim, bytes).unwrap();
        let error = run_check(&args).unwrap_err();
        let message = format!("{error:#}");
        assert!(
            message.contains(&victim.display().to_string()) && message.contains("reason: corrupt"),
            "{message}"
        );
        let exit = crate::outcome::exit_code(&Err(error));
        assert_eq!(exit, crate::outcome::EXIT_RUNTIME_ERROR);
    }

    /// A journal of 300 transfers in `dir`.
    fn write_journal(dir: &std::path::Path) {
        std::fs::create_dir_all(dir).unwrap();
        let tail = Tail { dir: dir.to_path_buf(), next_seq: 1, open_segment: None };
        let config = JournalConfig { segment_bytes: SEGMENT_BYTES_MIN, ..JournalConfig::default() };
        let (mut journal, writer) = JournalWriter::spawn::<TransferRecord>(tail, &config).unwrap();
        for seq in 1..=300 {
            journal.append(transfer_for(1, seq)).unwrap();
        }
        drop(journal);
        writer.join().unwrap();
    }

    /// A tier's folder (`tier/shard-0`, `tier/master`, beside a lock file): each journal is
    /// checked, and one recovery would refuse makes the whole check fail naming it.
    #[test]
    fn check_on_a_folder_of_journals_checks_each_and_fails_on_the_worst() {
        let dir = tempfile::tempdir().unwrap();
        let tier = dir.path().join("tier");
        let (shard, master) = (tier.join("shard-0"), tier.join("master"));
        write_journal(&shard);
        write_journal(&master);
        std::fs::write(tier.join("LOCK"), "pid=1\n").unwrap();
        let mut found = Vec::new();
        journals_below(dir.path(), JOURNAL_SEARCH_DEPTH_MAX, &mut found).unwrap();
        let paths: Vec<&PathBuf> = found.iter().map(|(path, _)| path).collect();
        assert_eq!(paths, [&master, &shard], "both journals, in name order");
        let lines: Vec<String> = found.iter().map(verdict_line).collect();
        assert!(lines.iter().all(|line| line.starts_with("ok ")), "{lines:#?}");
        assert!(lines[1].contains("last seq 300"), "{lines:#?}");
        run_check(&CheckArgs { dir: tier.clone() }).unwrap();

        let victim = segment::list_segments(&shard).unwrap().remove(0).path;
        let mut bytes = std::fs::read(&victim).unwrap();
        bytes[SEGMENT_HEADER_BYTES as usize + 100] ^= 1;
        std::fs::write(&victim, bytes).unwrap();
        let mut found = Vec::new();
        journals_below(&tier, JOURNAL_SEARCH_DEPTH_MAX, &mut found).unwrap();
        let line = verdict_line(&found[1]);
        assert!(line.starts_with("refused ") && line.contains("reason: corrupt"), "{line}");
        let error = run_check(&CheckArgs { dir: tier }).unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains(&shard.display().to_string()), "{message}");
        assert!(!message.contains(&master.display().to_string()), "{message}");
        let exit = crate::outcome::exit_code(&Err(error));
        assert_eq!(exit, crate::outcome::EXIT_RUNTIME_ERROR);
    }

    #[test]
    fn check_on_a_folder_with_no_journal_is_bad_input_not_ok() {
        let dir = tempfile::tempdir().unwrap();
        let error = run_check(&CheckArgs { dir: dir.path().to_path_buf() }).unwrap_err();
        assert!(format!("{error:#}").contains("reason: empty"), "{error:#}");
        let exit = crate::outcome::exit_code(&Err(error));
        assert_eq!(exit, crate::outcome::EXIT_BAD_INPUT);
    }
}
