//! End-to-end runs of the cdr pipeline on real files and a real SQLite database (and real
//! PostgreSQL when `LEANTIER_PG_URL` is set).

use std::time::Duration;

use cdr::feed::DbTarget;
use cdr::run::{NodeThreads, RunSettings, run_pipeline};

fn settings(dir: &std::path::Path, database: DbTarget, rate_per_s: Option<f64>) -> RunSettings {
    RunSettings {
        threads: NodeThreads { decoder: 2, converter: 1, serializer: 2, feeder: 1 },
        rate_per_s,
        duration: Duration::from_millis(300),
        out_dir: dir.to_path_buf(),
        database,
        fsync_every_records: 512,
        malformed_every: 50,
        seed: 9,
    }
}

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
    let summary = run_pipeline(&settings(dir.path(), database.clone(), Some(20_000.0))).unwrap();
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
    let mut run = settings(dir.path(), database.clone(), None);
    run.threads.feeder = 2;
    let summary = run_pipeline(&run).unwrap();
    let valid = summary.generated - summary.rejected;
    assert!(valid > 0);
    assert_eq!(summary.inserted, valid);
    assert_eq!(database.count_rows().unwrap(), valid);
    database.drop_table().unwrap();
}
