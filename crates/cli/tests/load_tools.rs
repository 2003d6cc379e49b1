//! The load tools and the exchange client as a user meets them, on the built binary: `web load`
//! measures the service time in open loop and exits 1 when nothing was answered;
//! `exchange load`'s defaults trade with the shipped configs and a run whose every order was
//! rejected exits 1 naming why; `exchange client` names the timeout that passed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

fn leantier_in(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leantier"));
    command.args(args).current_dir(dir).stdin(Stdio::null());
    command.output().expect("leantier runs")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A listener that accepts connections and keeps them open without a word; `on_accept` runs
/// on each connection first (e.g. to answer a login, then fall silent).
fn silent_server(on_accept: fn(&mut TcpStream)) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut stream in listener.incoming().map_while(Result::ok) {
            on_accept(&mut stream);
            held.push(stream);
        }
    });
    address
}

#[test]
fn web_load_open_loop_reports_the_service_time_and_the_generator_lag() {
    let dir = tempfile::tempdir().unwrap();
    // The in-process server answers a low-complexity request in well under a millisecond;
    // at 10/s requests arrive 100 ms apart (a latency taken at the next send would be ~100 ms;
    // half of it leaves room for a loaded CI host).
    let args = ["web", "load", "--rate", "10", "--complexity", "low", "--duration", "1s"];
    let output = leantier_in(dir.path(), &[&args[..], &["--warmup", "100ms", "--json"]].concat());
    let out = text(&output.stdout);
    assert_eq!(code(&output), 0, "{out}{}", text(&output.stderr));
    let json = &out[out.find("\n{").expect("the JSON result")..];
    let result: serde_json::Value = serde_json::from_str(json).unwrap();
    let p50_ns = result["latency"]["p50_ns"].as_u64().unwrap();
    assert!(p50_ns < 50_000_000, "p50 {p50_ns} ns: near the 100 ms gap, not the service time");
    assert!(result["send_lag"]["max_ns"].is_u64(), "{json}");
    assert!(out.contains("the generator's own lag"), "{out}");
}

#[test]
fn web_load_exits_1_saying_why_when_nothing_was_answered() {
    let dir = tempfile::tempdir().unwrap();
    let short = ["--duration", "200ms", "--warmup", "0s", "--request-timeout", "300ms"];
    // Nothing listens on port 1.
    let refused = leantier_in(
        dir.path(),
        &[&["web", "load", "--url", "http://127.0.0.1:1/matrix"][..], &short].concat(),
    );
    let err = text(&refused.stderr);
    assert_eq!(code(&refused), 1, "{err}");
    assert!(err.contains("every request to http://127.0.0.1:1/matrix failed"), "{err}");
    assert!(err.to_lowercase().contains("refused"), "the first failure's cause: {err}");
    // A server that accepts and never answers.
    let url = format!("http://{}/matrix", silent_server(|_| {}));
    let silent = leantier_in(dir.path(), &[&["web", "load", "--url", &url][..], &short].concat());
    let err = text(&silent.stderr);
    assert_eq!(code(&silent), 1, "{err}");
    assert!(err.contains(&format!("no request to {url} was answered")), "{err}");
}

/// `exchange serve --config configs/serve.toml` on a copy of the shipped configs (its store
/// in the copy), on free ports; returns the server, and the native and FIX addresses once it
/// serves.
fn shipped_exchange(dir: &Path) -> (Child, SocketAddr, SocketAddr) {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    std::fs::create_dir(dir.join("configs")).unwrap();
    for file in ["serve.toml", "instruments.toml", "clients.toml", "credentials.txt"] {
        std::fs::copy(shipped.join(file), dir.join("configs").join(file)).unwrap();
    }
    let mut server = Command::new(env!("CARGO_BIN_EXE_leantier"))
        .args(["exchange", "serve", "--config", "configs/serve.toml"])
        .args(["--listen", "127.0.0.1:0", "--fix-listen", "127.0.0.1:0"])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(server.stdout.take().unwrap()).lines().map_while(Result::ok);
    let (mut native, mut fix) = (None, None);
    // The layout line comes once the tier serves.
    for line in lines.take_while(|line| !line.starts_with("tier layout")) {
        let after = |prefix: &str| line.strip_prefix(prefix).map(|a| a.trim().parse().unwrap());
        native = native.or(after("native listening on "));
        fix = fix.or(after("FIX 4.4 listening on "));
    }
    (server, native.expect("the native listen line"), fix.expect("the FIX listen line"))
}

#[test]
fn exchange_load_trades_with_the_shipped_configs_by_default_and_fails_when_all_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, native, fix) = shipped_exchange(dir.path());
    let load = |connect: SocketAddr, extra: &[&str]| {
        let connect = connect.to_string();
        let args = ["exchange", "load", "--connect", &connect, "--duration", "300ms"];
        leantier_in(dir.path(), &[&args[..], extra].concat())
    };
    // The shipped credentials: client 1 native (demo-secret-1), BROKER1 FIX (demo-secret-2).
    let native_run = load(native, &["--secret", "demo-secret-1"]);
    let fix_run = load(fix, &["--protocol", "fix", "--secret", "demo-secret-2"]);
    // Prices of the reference universe are outside the shipped instruments' bands.
    let args = ["--secret", "demo-secret-1", "--instruments", "reference", "--rate", "500"];
    let refused = load(native, &args);
    let _ = server.kill();
    let _ = server.wait();
    for (protocol, run) in [("native", &native_run), ("fix", &fix_run)] {
        let out = text(&run.stdout);
        assert_eq!(code(run), 0, "{protocol}: {out}{}", text(&run.stderr));
        let steps: Vec<&str> = out.lines().filter(|line| line.contains(" sent ")).collect();
        assert_eq!(steps.len(), 2, "{protocol}: one line per default rate: {out}");
        for step in steps {
            assert!(step.contains("rejected 0 ") && !step.contains("answered 0 "), "{step}");
        }
    }
    let err = text(&refused.stderr);
    assert_eq!(code(&refused), 1, "{}{err}", text(&refused.stdout));
    assert!(err.contains("every order was rejected") && err.contains("PriceOutsideBand"), "{err}");
}

#[test]
fn exchange_client_names_the_timeout_that_passed() {
    let dir = tempfile::tempdir().unwrap();
    let client = |address: SocketAddr, timeout: &str| {
        let connect = address.to_string();
        let args = ["exchange", "client", "--connect", &connect, "--client", "1"];
        let rest = ["--secret", "pw", timeout, "300ms", "--linger", "1s"];
        leantier_in(dir.path(), &[&args[..], &rest].concat())
    };
    // Accepts and never answers: the login's request timeout passes.
    let silent = client(silent_server(|_| {}), "--request-timeout");
    let err = text(&silent.stderr);
    assert_eq!(code(&silent), 1, "{err}");
    assert!(err.contains("request timeout (300ms) passed: no answer to the login"), "{err}");
    assert!(!err.contains("closed the connection"), "{err}");
    // Answers the login, then falls silent (no heartbeats): the idle timeout passes.
    let answers_login = silent_server(|stream| {
        let mut login = [0u8; 64];
        let _ = stream.read(&mut login);
        let mut frame = Vec::new();
        let accepted = gateway::native::ServerMsg::LoginAccepted { client: 1, next_seq: 1 };
        gateway::native::encode_server(&accepted, &mut frame);
        stream.write_all(&frame).unwrap();
    });
    let idle = client(answers_login, "--idle-timeout");
    let (out, err) = (text(&idle.stdout), text(&idle.stderr));
    assert!(out.contains("logged in as client 1"), "{out}");
    assert_eq!(code(&idle), 1, "{err}");
    assert!(err.contains("idle timeout (300ms) passed"), "{err}");
    // An order the server never answers: the request timeout passes after the script.
    std::fs::write(dir.path().join("script"), "buy 7 1 10 100\n").unwrap();
    let connect = answers_login.to_string();
    let args = ["exchange", "client", "--connect", &connect, "--client", "1", "--secret", "pw"];
    let rest = ["--script", "script", "--request-timeout", "300ms", "--linger", "10ms"];
    let unanswered = leantier_in(dir.path(), &[&args[..], &rest].concat());
    let err = text(&unanswered.stderr);
    assert_eq!(code(&unanswered), 1, "{err}");
    assert!(err.contains("request timeout (300ms) passed: no answer to order(s) [7]"), "{err}");
}
