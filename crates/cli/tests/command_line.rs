//! The real `leantier` binary: its command tree, exit codes, and `exchange run --config FILE`
//! end to end (the config is read, flags override it, the report folder gets its JSON,
//! Markdown and SVG files, and bad input exits with code 2).

use std::path::Path;
use std::process::{Command, Output};

fn leantier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leantier")).args(args).output().expect("leantier runs")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every command and subcommand answers `--help` with exit code 0.
#[test]
fn every_command_has_help() {
    let commands: &[&[&str]] = &[
        &[],
        &["demo"],
        &["exchange"],
        &["exchange", "run"],
        &["exchange", "placement"],
        &["exchange", "senders"],
        &["exchange", "journal-experiment"],
        &["exchange", "layout-bench"],
        &["exchange", "serve"],
        &["exchange", "client"],
        &["exchange", "load"],
        &["exchange", "hash-secret"],
        &["exchange", "edge"],
        &["exchange", "gateway"],
        &["exchange", "publish"],
        &["exchange", "delivery-experiment"],
        &["exchange", "delivery-bench"],
        &["bench", "ring"],
        &["bench", "load-gen"],
        &["mq", "serve"],
        &["mq", "client"],
        &["mq", "load"],
        &["mq", "bench"],
        &["mq", "experiment"],
        &["web", "serve"],
        &["web", "load"],
        &["web", "matrix"],
        &["web", "body"],
        &["web", "ratio"],
        &["plan", "measure"],
        &["plan", "optimize"],
        &["plan", "node"],
        &["cdr", "run"],
        &["cdr", "validate"],
        &["journal", "bench"],
        &["journal", "check"],
        &["sim"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let output = leantier(&args);
        assert_eq!(code(&output), 0, "{args:?}: {}", text(&output.stderr));
        assert!(text(&output.stdout).contains("Usage: leantier"), "{args:?}");
    }
}

#[test]
fn bad_flags_exit_with_code_2() {
    for args in [
        &["demo", "--p99-limit", "x"][..],
        &["exchange", "run", "--duration", "3 parsecs"],
        &["mq", "load", "--think=-5ms"],
        &["exchange", "run", "--journal", "bogus"],
        &["exchange", "run", "--wait", "sleepy"],
        &["exchange", "run", "--arrival", "never"],
        &["exchange", "run", "--layout", "sideways"],
        &["exchange", "serve", "--config", "x.toml", "--layout", "sideways"],
        &["web", "serve", "--adaptive-layout", "bogus"],
        &["bench", "ring", "--batches", "512", "--quick"],
        &["no-such-command"],
    ] {
        let output = leantier(args);
        assert_eq!(code(&output), 2, "{args:?}: {}", text(&output.stderr));
    }
}

#[test]
fn a_duration_without_a_unit_it_knows_is_refused_clearly() {
    let output = leantier(&["exchange", "load", "--duration", "5 fortnights"]);
    assert_eq!(code(&output), 2);
    let error = text(&output.stderr);
    assert!(error.contains("--duration") && error.contains("e.g. 3s, 500ms"), "{error}");
}

/// `LEANTIER_EXCHANGE_SECRET` is the name; the old `LEANTIER_SECRET` is still read when it is
/// unset, for one release.
#[test]
fn the_exchange_secret_comes_from_its_env_name_or_the_deprecated_one() {
    let client = |env: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leantier"));
        command.args(["exchange", "client", "--client", "1", "--connect", "127.0.0.1:1"]);
        command.env_remove("LEANTIER_EXCHANGE_SECRET").env_remove("LEANTIER_SECRET");
        if let Some(name) = env {
            command.env(name, "pw");
        }
        command.stdin(std::process::Stdio::null()).output().unwrap()
    };
    let missing = client(None);
    assert_eq!(code(&missing), 2, "no secret is bad input");
    assert!(text(&missing.stderr).contains("LEANTIER_EXCHANGE_SECRET"), "names the variable");
    // With a secret the client gets as far as connecting: port 1 refuses (runtime error).
    for name in ["LEANTIER_EXCHANGE_SECRET", "LEANTIER_SECRET"] {
        let output = client(Some(name));
        assert_eq!(code(&output), 1, "{name}: {}", text(&output.stderr));
    }
}

#[test]
fn web_body_prints_a_request() {
    let output = leantier(&["web", "body", "--complexity", "low"]);
    assert_eq!(code(&output), 0);
    let body: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = body["matrixOne"]["rows"].as_array().expect("matrixOne has rows");
    assert_eq!(rows.len(), 30, "low is 30 rows");
}

fn exchange_run(config: &Path, out: &Path) -> Output {
    let (config, out) = (config.to_str().unwrap(), out.to_str().unwrap());
    leantier(&[
        "exchange",
        "run",
        "--config",
        config,
        "--rate",
        "5000",
        "--duration",
        "300ms",
        "--core-shards",
        "2",
        "--snapshot-every",
        "300",
        "--out",
        out,
    ])
}

#[test]
fn exchange_run_with_a_config_file_writes_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tier.toml");
    let file = "preprocess_workers = 1\nsenders = 3\n[universe]\ninstruments = 8\nclients = 16\n\
                [load]\narrival = \"bursty\"\n";
    std::fs::write(&config, file).unwrap();
    let out = dir.path().join("report");
    let output = exchange_run(&config, &out);
    assert_eq!(code(&output), 0, "{}", text(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["config"]["senders"], 3, "from the file");
    assert_eq!(report["config"]["core_shards"], 2, "from the flag");
    assert_eq!(report["load"]["arrival"], "bursty", "the generator's settings under [load]");
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
    for file in ["summary.md", "latency-percentiles.svg", "stage-breakdown.svg", "latency.csv"] {
        let text = std::fs::read_to_string(out.join(file)).unwrap();
        assert!(!text.is_empty(), "{file}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("Layout that ran:"), "the header is the layout that ran: {summary}");
    let stages = std::fs::read_to_string(out.join("stages.csv")).unwrap();
    assert!(stages.starts_with("rate_msgs_per_s,stage,thread_group,workers,messages,"), "{stages}");
    assert!(!stages.contains("K/s"), "rates are numbers: {stages}");
}

/// An unknown paper is bad input (exit 2) before anything runs. What a run writes (every
/// paper's section, verdicts.csv, the page in a browser) is checked on `reproduce --quick
/// --only 003` by scripts/test-reproduce-browser, which CI runs: running it here too cost
/// CI the same half minute twice.
#[test]
fn reproduce_refuses_unknown_paper_ids() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_leantier"))
        .args(["reproduce", "--quick", "--only", "999", "--out"])
        .arg(dir.path().join("reproduce"))
        .output()
        .unwrap();
    assert_eq!(code(&output), 2, "an unknown paper is bad input");
    assert!(text(&output.stderr).contains("no paper"), "{}", text(&output.stderr));
    assert!(!dir.path().join("reproduce").exists(), "nothing written");
}

#[test]
fn exchange_run_refuses_unknown_config_keys_and_bad_values_with_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    for (contents, named) in [
        ("shards = 2\n", "shards"),
        ("ring_slots = 1000\n", "ring_slots"),
        ("seed = 3\n", "`seed` is a load generator setting: put it under [load]"),
        ("[load]\nrate = 3\n", "rate"),
    ] {
        std::fs::write(&config, contents).unwrap();
        let output = exchange_run(&config, &dir.path().join("r"));
        assert_eq!(code(&output), 2, "{contents}: {}", text(&output.stderr));
        assert!(text(&output.stderr).contains(named), "{}", text(&output.stderr));
    }
}

/// Writes `clients.txt` in `dir`: native client 1 (alice) with secret `pw`, hashed by
/// `exchange hash-secret`.
fn write_credentials(dir: &std::path::Path) {
    use std::io::Write;
    use std::process::Stdio;
    let mut hasher = Command::new(env!("CARGO_BIN_EXE_leantier"))
        .args(["exchange", "hash-secret"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    hasher.stdin.take().unwrap().write_all(b"pw\n").unwrap();
    let hash = text(&hasher.wait_with_output().unwrap().stdout);
    std::fs::write(dir.join("clients.txt"), format!("1 native alice {}", hash.trim())).unwrap();
}

/// Runs `exchange client` as client 1 (secret `pw`) against `addr` with `script` on stdin.
fn run_client(addr: &str, script: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_leantier"))
        .args(["exchange", "client", "--connect", addr, "--client", "1", "--secret", "pw"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// `exchange hash-secret`, `exchange serve --config` and `exchange client` end to end: a
/// scripted buy and sell cross, and a bad script line exits with code 2.
#[test]
fn exchange_serve_trades_with_a_scripted_client() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    write_credentials(dir.path());
    std::fs::write(dir.path().join("serve.toml"), "credentials = \"clients.txt\"\n").unwrap();
    let config = dir.path().join("serve.toml");
    let mut server = Command::new(env!("CARGO_BIN_EXE_leantier"))
        .args([
            "exchange",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    BufReader::new(server.stdout.take().unwrap()).read_line(&mut first_line).unwrap();
    let addr = first_line
        .trim()
        .strip_prefix("native listening on ")
        .expect("the listen line")
        .to_string();
    let client = |script: &str| run_client(&addr, script);
    let traded = client("buy 1 1 10 101000\nsell 2 1 4 101000\n");
    let bad = client("hold 1 1\n");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(code(&traded), 0, "{}", text(&traded.stderr));
    let out = text(&traded.stdout);
    assert!(out.contains(" filled order 2") && out.contains("partially filled order 1"), "{out}");
    assert_eq!(code(&bad), 2, "a bad script line is bad input: {}", text(&bad.stderr));
}

/// `exchange serve` stops on SIGTERM: it drains, exits 0, and a restart over the same store
/// and journal still has the order it acknowledged before the stop.
#[test]
fn exchange_serve_drains_on_sigterm_and_keeps_what_it_acknowledged() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    write_credentials(dir.path());
    let config = dir.path().join("serve.toml");
    let tier = "[tier]\nlayout = \"thread-per-stage\"\nwait = \"park\"\npreprocess_workers = 1\nsenders = 1\n";
    std::fs::write(&config, format!("credentials = \"clients.txt\"\n{tier}")).unwrap();
    let serve = || {
        let mut server = Command::new(env!("CARGO_BIN_EXE_leantier"))
            .args(["exchange", "serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let addr = first.strip_prefix("native listening on ").expect("the listen line").to_string();
        (server, addr, lines)
    };
    let client = |addr: &str, script: &str| text(&run_client(addr, script).stdout);
    let (mut server, addr, mut lines) = serve();
    let rested = client(&addr, "buy 1 1 10 101000\n");
    assert!(rested.contains("accepted order 1"), "{rested}");
    let killed = Command::new("kill").args(["-TERM", &server.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "no exit within 15 s of SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0), "a drained stop exits 0");
    let printed: Vec<String> = lines.by_ref().map_while(Result::ok).collect();
    assert!(printed.iter().any(|line| line == "stopped on SIGTERM"), "{printed:?}");

    let (mut server, addr, _) = serve();
    let traded = client(&addr, "sell 2 1 4 101000\n");
    let _ = server.kill();
    let _ = server.wait();
    assert!(traded.contains(" filled order 2"), "the acknowledged buy survived the stop: {traded}");
}

/// Every server's `--print-config` prints its effective configuration (flags over the file,
/// defaults filled in) as TOML its `--config` reads back to the same configuration.
#[test]
fn print_config_prints_what_config_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    for file in ["instruments.toml", "clients.toml", "credentials.txt"] {
        std::fs::copy(configs.join(file), dir.path().join(file)).unwrap();
    }
    let shipped = configs.join("serve.toml");
    let printed: [(&str, Vec<&str>, &str); 3] = [
        (
            "serve.toml",
            vec![
                "exchange",
                "serve",
                "--config",
                shipped.to_str().unwrap(),
                "--fix-listen",
                "127.0.0.1:9401",
            ],
            "fix_listen = \"127.0.0.1:9401\"",
        ),
        ("node.toml", vec!["mq", "serve", "--hashing-threads", "3"], "hashing_threads = 3"),
        ("web.toml", vec!["web", "serve", "--answer-bytes-max", "1000"], "answer_bytes_max = 1000"),
    ];
    for (file, args, flag_line) in printed {
        let first = leantier(&[&args[..], &["--print-config"]].concat());
        assert_eq!(code(&first), 0, "{args:?}: {}", text(&first.stderr));
        let toml = text(&first.stdout);
        assert!(toml.lines().any(|l| l == flag_line), "{args:?} printed:\n{toml}");
        let path = dir.path().join(file);
        std::fs::write(&path, &toml).unwrap();
        let again = leantier(
            &[&args[..2], &["--config", path.to_str().unwrap(), "--print-config"]].concat(),
        );
        assert_eq!(text(&again.stdout), toml, "{args:?}: read back: {}", text(&again.stderr));
    }
}

#[test]
fn replicated_roles_refuse_a_missing_cluster_and_a_shard_out_of_range_with_code_2() {
    let dir = tempfile::tempdir().unwrap();
    write_credentials(dir.path());
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, "credentials = \"clients.txt\"\n").unwrap();
    let config = config.to_str().unwrap();
    let serve = |extra: &[&str]| {
        let mut args = vec!["exchange", "serve", "--config", config];
        args.extend(extra);
        leantier(&args)
    };
    for role in ["engine", "gateway"] {
        let output = serve(&["--role", role]);
        assert_eq!(code(&output), 2, "--role {role} without --nats");
        assert!(text(&output.stderr).contains("need --nats"), "{}", text(&output.stderr));
    }
    let output = serve(&[
        "--role",
        "engine",
        "--nats",
        "nats://127.0.0.1:1",
        "--shards",
        "2",
        "--shard",
        "2",
    ]);
    assert_eq!(code(&output), 2);
    assert!(text(&output.stderr).contains("--shard 2 of 2 shards"), "{}", text(&output.stderr));
    let output = serve(&["--role", "engine", "--nats", "nats://127.0.0.1:1", "--prefix", "a.b"]);
    assert_eq!(code(&output), 2);
    assert!(text(&output.stderr).contains("prefix"), "{}", text(&output.stderr));
}

/// `exchange edge --outlet N` was `exchange gateway --gateway N` before issue 44: the old
/// spellings still run for one release, each with a warning; the new ones warn of nothing.
/// (A bad `--prefix` stops each run at once, after the flags parsed, before any NATS I/O.)
#[test]
fn the_delivery_edges_old_spellings_still_run_and_warn() {
    let rest = ["--nats", "nats://127.0.0.1:1", "--prefix", "a.b", "--listen", "127.0.0.1:0"];
    let run = |spelling: &[&str]| leantier(&[&["exchange"][..], spelling, &rest[..]].concat());
    let new = run(&["edge", "--outlet", "3"]);
    let stderr = text(&new.stderr);
    assert_eq!(code(&new), 2, "{stderr}");
    assert!(stderr.contains("prefix") && !stderr.contains("next release"), "{stderr}");
    let old = run(&["gateway", "--gateway", "3"]);
    let stderr = text(&old.stderr);
    assert_eq!(code(&old), 2, "{stderr}");
    assert!(stderr.contains("'exchange gateway' is now 'exchange edge'"), "{stderr}");
    assert!(stderr.contains("--gateway is now --outlet"), "{stderr}");
    let both = run(&["edge", "--outlet", "3", "--gateway", "3"]);
    assert_eq!(code(&both), 2, "one spelling at a time: {}", text(&both.stderr));
    let neither = run(&["edge"]);
    assert!(text(&neither.stderr).contains("--outlet"), "{}", text(&neither.stderr));
}

/// A node that accepts connections and never answers; its address.
fn silent_node() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // Accepts and holds each connection open without a byte back.
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().collect();
        drop(held);
    });
    addr
}

/// `leantier ARGS` against a silent node gives up after its request timeout (300ms) with a
/// message naming it, and exits 1 (issue 41: `mq client` waited until killed, `mq load` 40 s).
fn gives_up_on_a_silent_node(args: &[&str]) {
    let started = std::time::Instant::now();
    // Right after `mq CMD`: after an operation (`list`) a flag would be the operation's.
    let timeout = ["--request-timeout", "300ms"];
    let output = leantier(&[&args[..2], &timeout, &args[2..]].concat());
    let stderr = text(&output.stderr);
    assert_eq!(code(&output), 1, "{stderr}");
    assert!(stderr.contains("request timeout (300ms) fired"), "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn mq_client_gives_up_on_a_silent_node_naming_the_request_timeout() {
    let addr = silent_node();
    gives_up_on_a_silent_node(&["mq", "client", "--node", &addr, "--secret", "s", "list"]);
}

#[test]
fn mq_load_gives_up_on_a_silent_node_naming_the_request_timeout() {
    let (addr, out) = (silent_node(), tempfile::tempdir().unwrap());
    let out = out.path().to_str().unwrap();
    gives_up_on_a_silent_node(&["mq", "load", "--node", &addr, "--out", out]);
}

/// The size `cdr run --help` promises for a paced run's report folder.
const CDR_REPORT_BYTES_MAX: u64 = 64 * 1024;

/// `plan optimize` then `cdr run` on its config: the report folder holds the comparison only
/// (the pipeline's 100 bytes per ticket go to a temporary --data-dir, removed), and the run is
/// compared with the rate the plan was made for.
#[test]
fn cdr_run_keeps_its_report_small_and_compares_with_the_planned_rate() {
    let dir = tempfile::tempdir().unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdr-model.toml");
    let plan = dir.path().join("plan");
    let optimize = leantier(&[
        "plan",
        "optimize",
        "--model",
        model.to_str().unwrap(),
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert_eq!(code(&optimize), 0, "{}", text(&optimize.stderr));
    let config = plan.join("config.toml");
    let out = dir.path().join("report");
    let run = leantier(&[
        "cdr",
        "run",
        "--config",
        config.to_str().unwrap(),
        "--duration",
        "300ms",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code(&run), 0, "{}", text(&run.stderr));
    let files: Vec<_> = std::fs::read_dir(&out).unwrap().map(|entry| entry.unwrap()).collect();
    let bytes: u64 = files.iter().map(|entry| entry.metadata().unwrap().len()).sum();
    assert!(bytes < CDR_REPORT_BYTES_MAX, "{bytes} bytes in {}", out.display());
    assert_eq!(files.len(), 3, "comparison.json, .csv and .md only: {files:?}");
    let planned = std::fs::read_to_string(&config).unwrap();
    let planned: toml::Value = toml::from_str(&planned).unwrap();
    let comparison = std::fs::read_to_string(out.join("comparison.json")).unwrap();
    let comparison: serde_json::Value = serde_json::from_str(&comparison).unwrap();
    assert_eq!(
        comparison["offered_rate_per_s"].as_f64(),
        planned["arrival_rate_per_s"].as_float(),
        "{comparison}"
    );
}

/// `mq load --duration 2s` is refused before connecting, naming the warm-up and cool-down
/// (2 s + 1 s by default) that do not fit and the flags that set them.
#[test]
fn a_short_mq_load_names_the_warm_up_it_counted() {
    let output = leantier(&["mq", "load", "--node", "127.0.0.1:1", "--duration", "2s"]);
    assert_eq!(code(&output), 2, "{}", text(&output.stderr));
    let error = text(&output.stderr);
    assert!(error.contains("warm-up 2s") && error.contains("--warmup"), "{error}");
}

/// `--rate -5` is a value the command refuses in words, not an unknown flag `-5`.
#[test]
fn a_negative_rate_is_refused_as_a_rate() {
    let output = leantier(&["exchange", "run", "--rate", "-5", "--duration", "100ms"]);
    assert_eq!(code(&output), 2, "{}", text(&output.stderr));
    let error = text(&output.stderr);
    assert!(error.contains("every rate must be > 0, got -5"), "{error}");
}

/// A cause its parent already prints is not printed again ("Connection refused (os error
/// 111): Connection refused (os error 111)").
#[test]
fn a_refused_connection_says_so_once() {
    let output = leantier(&["mq", "client", "--node", "127.0.0.1:1", "--secret", "s", "list"]);
    assert_eq!(code(&output), 1, "{}", text(&output.stderr));
    let error = text(&output.stderr);
    assert_eq!(error.matches("refused").count(), 1, "{error}");
}

/// `mq serve --print-config` shows where the node listens and stores, and its `--config`
/// takes those keys back (docs/OPERATIONS.md: a file's keys are the flags' names); a key it
/// does not know is still refused.
#[test]
fn mq_serve_config_carries_listen_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.toml");
    std::fs::write(&file, "listen = \"127.0.0.1:7999\"\nstore = \"sqlite:elsewhere\"\n").unwrap();
    let config = file.to_str().unwrap();
    let printed = leantier(&["mq", "serve", "--config", config, "--print-config"]);
    assert_eq!(code(&printed), 0, "{}", text(&printed.stderr));
    let toml = text(&printed.stdout);
    for line in ["listen = \"127.0.0.1:7999\"", "store = \"sqlite:elsewhere\"", "batch_max = "] {
        assert!(toml.lines().any(|l| l.starts_with(line)), "{line}:\n{toml}");
    }
    let flag =
        leantier(&["mq", "serve", "--config", config, "--listen", "0.0.0.0:1", "--print-config"]);
    assert!(text(&flag.stdout).contains("listen = \"0.0.0.0:1\""), "the flag wins");
    std::fs::write(&file, "listen = \"127.0.0.1:7999\"\nbogus = 1\n").unwrap();
    let refused = leantier(&["mq", "serve", "--config", config, "--print-config"]);
    assert_eq!(code(&refused), 2);
    assert!(text(&refused.stderr).contains("unknown field `bogus`"), "{}", text(&refused.stderr));
}

/// `mq serve --io-threads` sizes the node's runtime: the config shows it, zero is refused with
/// its reason (exit 2) before the runtime starts.
#[test]
fn mq_serve_io_threads_are_a_flag_and_a_key() {
    let printed = leantier(&["mq", "serve", "--io-threads", "3", "--print-config"]);
    assert_eq!(code(&printed), 0, "{}", text(&printed.stderr));
    assert!(
        text(&printed.stdout).lines().any(|l| l == "io_threads = 3"),
        "{}",
        text(&printed.stdout)
    );
    let defaults = leantier(&["mq", "serve", "--print-config"]);
    assert!(text(&defaults.stdout).lines().any(|l| l == "io_threads = 1"), "the default");
    let refused = leantier(&["mq", "serve", "--io-threads", "0", "--print-config"]);
    assert_eq!(code(&refused), 2, "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("io_threads must be > 0"), "{}", text(&refused.stderr));
}

/// `mq bench` writes its report folder, like every command with figures, and keeps its JSON
/// off the terminal unless asked (`--json`).
#[test]
fn mq_bench_writes_its_report_and_prints_json_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("store").display());
    let out = dir.path().join("report");
    let bench = |json: bool| {
        let out = out.to_str().unwrap();
        let mut args = vec!["mq", "bench", "--store", &store, "--duration", "100ms"];
        args.extend(["--clients", "1", "--only", "node", "--out", out, "--repeats", "2"]);
        if json {
            args.push("--json");
        }
        leantier(&args)
    };
    let tables = bench(false);
    assert_eq!(code(&tables), 0, "{}", text(&tables.stderr));
    assert!(!text(&tables.stdout).contains("{\""), "no JSON: {}", text(&tables.stdout));
    for file in ["bench.json", "bench.csv", "budget.csv", "bench.md"] {
        assert!(out.join(file).exists(), "{file}");
    }
    assert!(text(&tables.stdout).contains("medians of 2 runs"), "{}", text(&tables.stdout));
    let json = bench(true);
    let runs: serde_json::Value = serde_json::from_slice(&json.stdout).expect("one JSON line");
    let runs = runs.as_array().expect("one array of rows per repeat");
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs.iter().all(|rows| rows.as_array().is_some_and(|r| !r.is_empty())), "{runs:?}");
    let node_cpu = &runs[0][0]["node_us"];
    assert!(node_cpu.as_f64().is_some_and(|us| us >= 0.0), "a budget per row: {}", runs[0][0]);
}

/// `leantier sim`: a seed replays to the same trace hash; a fault list or seed file that
/// cannot be parsed exits 2 naming what is wrong.
#[test]
fn sim_replays_a_seed_and_refuses_bad_faults_and_seed_files_with_code_2() {
    let short = ["--fault-window", "2s", "--settle", "3s", "--log", "warn"];
    let replay = || leantier(&[&["sim", "--seed", "7"][..], &short].concat());
    let (first, again) = (replay(), replay());
    assert_eq!(code(&first), 0, "{}", text(&first.stderr));
    let hash = |output: &Output| {
        let stdout = text(&output.stdout);
        stdout.split(", ").next().unwrap_or("").to_string()
    };
    assert!(hash(&first).contains("trace hash"), "{}", text(&first.stdout));
    assert_eq!(hash(&first), hash(&again), "the same seed replays the same trace");

    let bad_faults = leantier(&["sim", "--seeds", "1", "--faults", "crash,meteor"]);
    assert_eq!(code(&bad_faults), 2);
    assert!(text(&bad_faults.stderr).contains("unknown fault \"meteor\""));
    let bad_share = leantier(&["sim", "--seeds", "1", "--fix-percent", "101"]);
    assert_eq!(code(&bad_share), 2);
    assert!(text(&bad_share.stderr).contains("FIX share"), "{}", text(&bad_share.stderr));

    let dir = tempfile::tempdir().unwrap();
    let seeds = dir.path().join("seeds.txt");
    std::fs::write(&seeds, "# CI seeds\n1\nbanana\n").unwrap();
    let bad_file = leantier(&["sim", "--seed-file", seeds.to_str().unwrap()]);
    assert_eq!(code(&bad_file), 2);
    assert!(text(&bad_file.stderr).contains("line 3: \"banana\""), "{}", text(&bad_file.stderr));
    let missing = leantier(&["sim", "--seed-file", "/nonexistent/seeds.txt"]);
    assert_eq!(code(&missing), 2, "{}", text(&missing.stderr));
}

/// Writes, in `dir`, the bad inputs of `every_library_refuses_bad_input_with_code_2`.
fn write_bad_inputs(dir: &Path) {
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdr-model.toml");
    let model = std::fs::read_to_string(model).unwrap();
    write("bad-model.toml", &model.replace("300000.0", "0.0"));
    let plan_dir = dir.join("plan");
    let model_file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cdr-model.toml");
    let plan = leantier(&[
        "plan",
        "optimize",
        "--model",
        model_file.to_str().unwrap(),
        "--out",
        plan_dir.to_str().unwrap(),
    ]);
    assert_eq!(code(&plan), 0, "{}", text(&plan.stderr));
    let planned = std::fs::read_to_string(plan_dir.join("config.toml")).unwrap();
    write("no-feeder.toml", &planned.replace("\"feeder\"", "\"sink\""));
    write("unknown-key.toml", "bogus_key = 1\n");
    write("bursty.toml", "[load]\narrival = \"bursty\"\nburst_on_us = 0\n");
    write("journal.toml", "record_bytes = [0]\n");
    write("garbage.txt", "garbage\n");
    write("bad-credentials.toml", "credentials = \"garbage.txt\"\n");
    write_credentials(dir);
    write("serve.toml", "credentials = \"clients.txt\"\n");
}

/// Each library's bad-input errors reach the exit code 2 through `cli::outcome`, whatever
/// wraps them: one command per library (and per kind of refusal), its message pinning which
/// library refused. (`sim`, the ring benchmark and the exchange tier have theirs above.)
#[test]
fn every_library_refuses_bad_input_with_code_2() {
    let dir = tempfile::tempdir().unwrap();
    write_bad_inputs(dir.path());
    let nats = "--nats=nats://127.0.0.1:1";
    let (listen, fix_listen) = ("--listen=127.0.0.1:0", "--fix-listen=127.0.0.1:0");
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "stats",
            &["exchange", "run", "--config", "bursty.toml", "--rate", "1000", "--out", "run"],
            "on_ns must be > 0",
        ),
        ("exchange", &["exchange", "run", "--rate", "0", "--duration", "100ms"], "every rate"),
        ("ops config", &["journal", "bench", "--config", "unknown-key.toml"], "bogus_key"),
        ("planner", &["plan", "optimize", "--model", "bad-model.toml"], "must be > 0"),
        ("cdr", &["cdr", "run", "--config", "no-feeder.toml"], "named feeder"),
        ("journal", &["journal", "bench", "--config", "journal.toml"], "journal config"),
        ("mq", &["mq", "serve", "--db-workers", "0", "--store", "sqlite:mq.db", listen], "db_"),
        ("web", &["web", "serve", "--workers", "0", listen], "workers"),
        ("delivery", &["exchange", "publish", "--prefix", "a b", nats], "prefix"),
        ("delivery's files", &["exchange", "publish", "--nats-creds", "no.creds", nats], "file"),
        (
            "replication",
            &[
                "exchange",
                "serve",
                "--config",
                "serve.toml",
                "--role",
                "engine",
                nats,
                "--prefix=a b",
            ],
            "bad replication settings",
        ),
        (
            "gateway credentials",
            &["exchange", "serve", "--config", "bad-credentials.toml", listen, fix_listen],
            "line 1",
        ),
        (
            "gateway metrics",
            &[
                "exchange",
                "serve",
                "--config",
                "serve.toml",
                "--metrics-listen=0.0.0.0:0",
                listen,
                fix_listen,
            ],
            "not a loopback address",
        ),
        (
            "ops endpoint",
            &["mq", "serve", "--store", "sqlite:mq2.db", "--metrics-listen=0.0.0.0:0", listen],
            "not a loopback address",
        ),
    ];
    for (library, args, says) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_leantier"))
            .args(*args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(code(&output), 2, "{library}: {args:?}: {stderr}");
        assert!(stderr.contains(says), "{library}: {args:?} should say {says:?}: {stderr}");
    }
}
