//! `exchange serve` with TLS from its config, end to end: bad TLS input refused at start with
//! the file and the reason (exit 2), and `exchange client` and `exchange load` trading over
//! mutual TLS with the `--tls-*` flags `mq client` has for the same concepts.

#[path = "../../gateway/tests/common/certs.rs"]
mod certs;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use certs::Certs;

fn leantier(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_leantier"));
    command.args(args);
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A serve config in `certs`' folder (native client 1 with secret `pw`), plus `extra` lines.
fn write_config(certs: &Certs, extra: &str) -> std::path::PathBuf {
    let mut hasher = leantier(&["exchange", "hash-secret"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    hasher.stdin.take().unwrap().write_all(b"pw\n").unwrap();
    let hash = text(&hasher.wait_with_output().unwrap().stdout);
    let dir = certs.dir();
    std::fs::write(dir.join("clients.txt"), format!("1 native alice {}", hash.trim())).unwrap();
    let config = dir.join("serve.toml");
    let store = dir.join("store");
    let text = format!("credentials = \"clients.txt\"\nstore_dir = {store:?}\n{extra}");
    std::fs::write(&config, text).unwrap();
    config
}

fn serve_output(config: &Path) -> Output {
    leantier(&["exchange", "serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .output()
        .unwrap()
}

#[test]
fn bad_tls_input_is_refused_at_start_naming_the_file_and_the_reason() {
    let certs = Certs::new("leantier test CA");
    let other = Certs::new("another CA");
    let not_a_cert = certs.dir().join("notes.txt");
    std::fs::write(&not_a_cert, "not a certificate\n").unwrap();
    let cases = [
        (
            format!("tls_cert = {:?}\ntls_key = {:?}\n", certs.server_cert, other.server_key),
            format!("{}: does not form a usable pair", other.server_key.display()),
        ),
        (
            format!("tls_cert = {not_a_cert:?}\ntls_key = {:?}\n", certs.server_key),
            format!("{}: holds no PEM certificate", not_a_cert.display()),
        ),
        (
            format!(
                "tls_cert = {:?}\ntls_key = {:?}\ntls_client_ca = {not_a_cert:?}\n",
                certs.server_cert, certs.server_key
            ),
            format!("{}: holds no PEM certificate", not_a_cert.display()),
        ),
        (
            format!("tls_cert = {:?}\n", certs.server_cert),
            "tls_cert and tls_key go together".into(),
        ),
        ("tls_certificate = \"server.pem\"\n".into(), "unknown field `tls_certificate`".into()),
    ];
    for (lines, expected) in cases {
        let output = serve_output(&write_config(&certs, &lines));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{lines}: {stderr}");
        assert!(stderr.contains(&expected), "{lines}: expected {expected:?} in {stderr}");
        assert!(stderr.contains("serve.toml"), "the config is named: {stderr}");
    }
    let unknown = serve_output(&write_config(&certs, "tls_certificate = \"server.pem\"\n"));
    assert!(text(&unknown.stderr).contains("line 3"), "{}", text(&unknown.stderr));
}

/// A server with mutual TLS from `certs`, and its native address.
fn start_server(certs: &Certs) -> (Child, String) {
    let lines = "tls_cert = \"server.pem\"\ntls_key = \"server.key\"\ntls_client_ca = \"ca.pem\"\n";
    let config = write_config(certs, lines);
    let mut server = leantier(&["exchange", "serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first.strip_prefix("native listening on ").expect(&first).to_string();
    let tls_line = lines.next().unwrap().unwrap();
    assert_eq!(tls_line, "native and FIX listeners serve TLS; clients must present a certificate");
    (server, addr)
}

#[test]
fn exchange_client_and_load_trade_over_mutual_tls() {
    let certs = Certs::new("leantier test CA");
    let (mut server, addr) = start_server(&certs);
    let ca = certs.ca.to_str().unwrap();
    let identity = ["--tls-cert", certs.client_cert.to_str().unwrap()];
    let key = ["--tls-key", certs.client_key.to_str().unwrap()];
    let client = |tls: &[&str]| {
        let mut child = leantier(&["exchange", "client", "--connect", &addr, "--client", "1"])
            .args(["--secret", "pw"])
            .args(tls)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"buy 1 1 10 101000\n").unwrap();
        child.wait_with_output().unwrap()
    };
    let traded = client(&[&["--tls-ca", ca][..], &identity, &key].concat());
    let anonymous = client(&["--tls-ca", ca]);
    let out = tempfile::tempdir().unwrap();
    let load = leantier(&["exchange", "load", "--connect", &addr, "--secret", "pw"])
        .args(["--instruments", "reference", "--rate", "200", "--duration", "1s", "--tls-ca", ca])
        .args(identity)
        .args(key)
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(traded.status.code(), Some(0), "{}", text(&traded.stderr));
    assert!(text(&traded.stdout).contains("accepted"), "{}", text(&traded.stdout));
    assert_eq!(anonymous.status.code(), Some(1), "no client certificate, no session");
    assert!(text(&anonymous.stderr).contains("CertificateRequired"), "{}", text(&anonymous.stderr));
    assert_eq!(load.status.code(), Some(0), "{}", text(&load.stderr));
    let table = std::fs::read_to_string(out.path().join("latency.csv")).unwrap();
    assert!(table.lines().count() >= 2, "a row per rate: {table}");
}
