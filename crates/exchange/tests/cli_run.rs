//! `leantier exchange run --config FILE` end to end: the config is read, flags override it,
//! the report folder gets its JSON, Markdown and SVG files, and bad input is `BadInput`.

use exchange::cli::{Args, ExchangeCommand, MAX_RATE_P99_LIMIT_US_DEFAULT, RunArgs, run};
use lab::outcome::BadInput;

fn run_args(config: std::path::PathBuf, out: std::path::PathBuf) -> RunArgs {
    RunArgs {
        config: Some(config),
        rates: vec![5_000.0],
        seconds: 0.3,
        find_max: false,
        p99_limit_us: MAX_RATE_P99_LIMIT_US_DEFAULT,
        preprocess_workers: None,
        core_shards: Some(2),
        senders: None,
        wait: None,
        placement: None,
        arrival: None,
        journal: None,
        snapshot_every: Some(300),
        data: None,
        repair: false,
        out,
    }
}

#[test]
fn run_with_a_config_file_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tier.toml");
    std::fs::write(&config, "preprocess_workers = 1\nsenders = 3\narrival = \"bursty\"\n[universe]\ninstruments = 8\nclients = 16\n").unwrap();
    let out = dir.path().join("report");
    run(&Args { command: ExchangeCommand::Run(run_args(config, out.clone())) }).expect("run");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["config"]["senders"], 3, "from the file");
    assert_eq!(report["config"]["core_shards"], 2, "from the flag");
    let first = &report["runs"][0];
    assert!(first["sent"].as_u64().unwrap() > 500);
    assert_eq!(first["end_to_end"]["count"], first["sent"], "every request answered");
    let snapshots = &first["journal"][0]["snapshots"];
    assert!(snapshots["taken"].as_u64().unwrap() >= 1, "--snapshot-every: {snapshots}");
    assert_eq!(first["critical_path"]["count"], first["sent"], "both latencies per request");
    assert_eq!(first["journal_mode"], "group", "journaling is on by default");
    for shard in first["journal"].as_array().unwrap() {
        assert!(shard["writer"]["records"].as_u64().unwrap() > 0, "{shard}");
        assert!(shard["writer"]["syncs"].as_u64().unwrap() > 0, "{shard}");
    }
    assert_eq!(first["output_hashes"].as_array().unwrap().len(), 2);
    for file in ["summary.md", "latency-cdf.svg", "stage-breakdown.svg"] {
        let text = std::fs::read_to_string(out.join(file)).unwrap();
        assert!(!text.is_empty(), "{file}");
    }
}

#[test]
fn unknown_config_key_and_bad_values_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "shards = 2\n").unwrap();
    let error = run(&Args {
        command: ExchangeCommand::Run(run_args(config.clone(), dir.path().join("r"))),
    })
    .unwrap_err();
    assert!(error.downcast_ref::<BadInput>().is_some(), "{error}");
    std::fs::write(&config, "ring_slots = 1000\n").unwrap();
    let error =
        run(&Args { command: ExchangeCommand::Run(run_args(config, dir.path().join("r"))) })
            .unwrap_err();
    assert!(error.downcast_ref::<BadInput>().is_some(), "{error}");
}

#[derive(clap::Parser)]
enum Top {
    Demo(exchange::cli::DemoArgs),
    Exchange(Args),
}

#[test]
fn command_line_definitions_are_consistent_and_parse() {
    use clap::{CommandFactory, Parser};
    Top::command().debug_assert();
    let parsed = Top::try_parse_from([
        "leantier",
        "exchange",
        "senders",
        "--rate",
        "1000",
        "--seconds",
        "0.5",
    ])
    .unwrap();
    let Top::Exchange(Args { command: ExchangeCommand::Senders(senders) }) = parsed else {
        panic!("senders")
    };
    assert_eq!((senders.rate, senders.common.seconds), (1_000.0, 0.5));
    assert!(Top::try_parse_from(["leantier", "demo", "--quick", "--p99-limit-us", "x"]).is_err());
    let run = ["leantier", "exchange", "run", "--wait", "spin-yield", "--arrival", "bursty"];
    let parsed = Top::try_parse_from(run.into_iter().chain(["--journal", "off"])).unwrap();
    let Top::Exchange(Args { command: ExchangeCommand::Run(flags) }) = parsed else {
        panic!("run")
    };
    assert_eq!(flags.wait, Some(exchange::tier::WaitChoice::SpinYield));
    assert_eq!(flags.arrival, Some(exchange::tier::Arrival::Bursty));
    assert_eq!(flags.journal, Some(exchange::durability::JournalMode::OFF));
    let Top::Demo(demo) = Top::try_parse_from(["leantier", "demo"]).unwrap() else {
        panic!("demo")
    };
    assert_eq!(demo.journal, exchange::durability::JournalMode::default(), "group by default");
    for bad in [["--wait", "sleepy"], ["--journal", "maybe"], ["--arrival", "never"]] {
        let args = ["leantier", "exchange", "run"].into_iter().chain(bad);
        assert!(Top::try_parse_from(args).is_err(), "{bad:?}");
    }
}
