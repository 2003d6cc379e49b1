//! End-to-end runs of the cdr pipeline on real files and a real SQLite database (and real
//! PostgreSQL when `LEANTIER_PG_URL` is set).

use std::time::Duration;

use cdr::feed::DbTarget;
use cdr::run::{Arrivals, NodeThreads, RunSettings, run_pipeline};

fn settings(dir: &std::path::Path, database: DbTarget, arrivals: Arrivals) -> RunSettings {
    RunSettings {
        threads: NodeThreads { decoder: 2, converter: 1, serializer: 2, feeder: 1 },
        arrivals,
        online: None,
        out_dir: dir.to_path_buf(),
        database,
        fsync_every_records: 512,
        feed_batch_rows: cdr::feed::FEED_BATCH_ROWS_DEFAULT,
        malformed_every: 50,
        seed: 9,
    }
}

/// How long the generator runs in these tests.
const RUN: Duration = Duration::from_millis(300);

fn lines_in(dir: &std::path::Path, prefix: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with(prefix) {
            lines.extend(std::fs::read_to_string(&path).unwrap().lines().map(str::to_owned));
        }
    }
    lines
}

#[test]
fn every_ticket_reaches_files_and_sqlite_or_the_reject_file() {
    let dir = tempfile::tempdir().unwrap();
    let database = DbTarget::Sqlite(dir.path().join("cdr.sqlite"));
    let summary =
        run_pipeline(&settings(dir.path(), database.clone(), Arrivals::poisson(20_000.0, RUN)))
            .unwrap();
    assert!(summary.generated > 1000, "{summary:?}");
    let valid = summary.generated - summary.rejected;
    assert_eq!(summary.rejected, summary.generated / 50, "every 50th ticket is malformed");
    assert_eq!(summary.serialized, valid);
    assert_eq!(summary.inserted, valid);
    assert_eq!(database.count_rows().unwrap(), valid);
    // One output file per serializer worker, together holding every valid ticket once.
    let mut sequences: Vec<u64> = lines_in(dir.path(), "cdr-")
        .iter()
        .map(|line| line.split(',').next().unwrap().parse().unwrap())
        .collect();
    sequences.sort_unstable();
    sequences.dedup();
    assert_eq!(sequences.len() as u64, valid);
    assert!(dir.path().join("cdr-0.csv").exists() && dir.path().join("cdr-1.csv").exists());
    // Rejects carry the sequence, a reason code and the raw bytes.
    let rejects = lines_in(dir.path(), "rejects-");
    assert_eq!(rejects.len() as u64, summary.rejected);
    for line in &rejects {
        let fields: Vec<&str> = line.split(' ').collect();
        assert_eq!(fields.len(), 3, "{line}");
        assert_eq!(fields[0].parse::<u64>().unwrap() % 50, 49);
        assert!(fields[1].starts_with("bad_"), "{line}");
        assert_eq!(fields[2].len(), 128);
    }
    let decoder = summary.stages.iter().find(|s| s.name == "decoder").unwrap();
    assert_eq!(decoder.messages_in, summary.generated);
    assert_eq!(decoder.workers, 2);
}

#[test]
fn postgres_feeder_stores_every_valid_ticket() {
    let Ok(url) = std::env::var("LEANTIER_PG_URL") else {
        println!("skipped: LEANTIER_PG_URL not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let table = format!("leantier_cdr_test_{}", std::process::id());
    let database = DbTarget::Postgres { url, table };
    database.drop_table().unwrap();
    let mut run = settings(dir.path(), database.clone(), Arrivals::FlatOut(RUN));
    run.threads.feeder = 2;
    let summary = run_pipeline(&run).unwrap();
    let valid = summary.generated - summary.rejected;
    assert!(valid > 0);
    assert_eq!(summary.inserted, valid);
    assert_eq!(database.count_rows().unwrap(), valid);
    database.drop_table().unwrap();
}

/// A model whose decoder, converter and serializer need one thread per 800 tickets/s, so a
/// profile of 500 → 4000 → 500 tickets/s makes the controller grow them to the maximum and
/// shrink them back (the real nodes are far faster: the model only drives the decisions).
fn slow_model() -> planner::model::NetworkSpec {
    use planner::model::{HostSpec, NetworkSpec, NodeSpec, RouteSpec};
    let mut generator = NodeSpec::new("generator", 1e7);
    generator.fixed_threads = Some(1);
    generator.external_share = 1.0;
    let mut feeder = NodeSpec::new("feeder", 1e7);
    feeder.fixed_threads = Some(1);
    let route =
        |from: &str, to: &str| RouteSpec { from: from.into(), to: to.into(), jobs_per_job: 1.0 };
    NetworkSpec {
        host: HostSpec { cores: 64.0, ..HostSpec::default() },
        node: vec![
            generator,
            NodeSpec::new("decoder", 1000.0),
            NodeSpec::new("converter", 1000.0),
            NodeSpec::new("serializer", 1000.0),
            feeder,
        ],
        route: vec![
            route("generator", "decoder"),
            route("decoder", "converter"),
            route("converter", "serializer"),
            route("converter", "feeder"),
        ],
        ..NetworkSpec::default()
    }
}

#[test]
fn online_resizes_grow_and_shrink_without_losing_or_duplicating_a_ticket() {
    use cdr::online::REPLAN_RATE_CHANGE_MIN_DEFAULT;
    use cdr::run::{OnlineSettings, RateStep};
    const MAX_THREADS: usize = 4;
    let dir = tempfile::tempdir().unwrap();
    let database = DbTarget::Sqlite(dir.path().join("cdr.sqlite"));
    let step =
        |rate_per_s: f64, ms: u64| RateStep { rate_per_s, duration: Duration::from_millis(ms) };
    // Long enough steps that a controller slowed down by a loaded host (debug-build metrics
    // snapshots, little CPU) still sees one interval mostly inside each of them.
    let profile = Arrivals::Steps(vec![step(500.0, 600), step(4000.0, 2000), step(500.0, 2500)]);
    let mut run = settings(dir.path(), database.clone(), profile);
    run.threads = NodeThreads { decoder: 1, converter: 1, serializer: 1, feeder: 1 };
    let max_threads = NodeThreads {
        decoder: MAX_THREADS,
        converter: MAX_THREADS,
        serializer: MAX_THREADS,
        feeder: 1,
    };
    run.online = Some(OnlineSettings {
        model: slow_model(),
        planned_rate_per_s: 500.0,
        max_threads,
        control_interval: Duration::from_millis(200),
        replan_rate_change_min: REPLAN_RATE_CHANGE_MIN_DEFAULT,
    });
    let summary = run_pipeline(&run).unwrap();

    // The controller grew the resizable nodes, then shrank them back to one thread.
    let replans: Vec<&Vec<u32>> =
        summary.timeline.iter().filter_map(|p| p.replan_threads.as_ref()).collect();
    let grown = replans.iter().position(|threads| threads[1] > 1);
    let grown = grown.unwrap_or_else(|| panic!("never grew: {:?}", summary.timeline));
    let shrunk = replans[grown..].iter().any(|threads| threads[1..4] == [1, 1, 1]);
    assert!(shrunk, "never shrank: {:?}", summary.timeline);
    assert!(replans.iter().all(|threads| threads[4] == 1), "the feeder stays fixed");
    assert!(summary.timeline.iter().all(|p| p.threads[1] <= MAX_THREADS as u32));

    // Accounting across the resizes: generated = decoded + rejected; every converted ticket is
    // once in the serializer files and once in the database.
    let stage = |name: &str| summary.stages.iter().find(|s| s.name == name).unwrap().clone();
    let (decoder, converter) = (stage("decoder"), stage("converter"));
    assert!(summary.generated > 2000, "{summary:?}");
    assert_eq!(decoder.messages_in, summary.generated);
    assert_eq!(converter.messages_in + summary.rejected, summary.generated);
    let converted = converter.messages_out;
    assert_eq!(converted, summary.generated - summary.rejected);
    let mut sequences: Vec<u64> = lines_in(dir.path(), "cdr-")
        .iter()
        .map(|line| line.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(sequences.len() as u64, converted, "serializer file records");
    sequences.sort_unstable();
    sequences.dedup();
    assert_eq!(sequences.len() as u64, converted, "no record twice");
    assert_eq!(database.count_rows().unwrap(), converted, "feeder database rows");
    assert_eq!(summary.serialized, converted);
    assert_eq!(summary.inserted, converted);
    assert_eq!(lines_in(dir.path(), "rejects-").len() as u64, summary.rejected);
}
