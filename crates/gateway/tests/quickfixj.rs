//! Conformance with a FIX engine nobody here wrote: QuickFIX/J 2.3.2 (bench/fix-quickfixj)
//! logs on, trades (new, replace, crossing orders, cancel), drops the connection mid-stream and
//! reconnects, then the server is stopped and started again over the same store and a second
//! QuickFIX/J session trades on with the persisted sequence numbers. QuickFIX/J validates every
//! message it receives against its FIX 4.4 dictionary.
//!
//! Over mutual TLS, QuickFIX/J's SSL initiator (SocketUseSSL) trades, drops the connection and
//! reconnects the same way, checking the acceptor's certificate against the test CA and the
//! host name.
//!
//! Needs Java 17 and the Maven build of bench/fix-quickfixj: `scripts/fix-conformance` installs
//! and builds them, then runs these tests with `--ignored`.

#[path = "common/certs.rs"]
mod certs;
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gateway::Settings;
use gateway::credentials::{self, Credential, Protocol};
use gateway::{Running, ServeOptions};

const PASSWORD: &str = "qfj-conformance";
/// A QuickFIX/J phase ends well within this on a loaded 2-core machine.
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);

fn credentials(hash: &str) -> Vec<Credential> {
    vec![Credential {
        client: 21,
        protocol: Protocol::Fix,
        comp_id: "QFJ".into(),
        hash: hash.into(),
    }]
}

fn start(store: &Path, hash: &str) -> Running {
    common::start_fix_server(store, credentials(hash), 32)
}

fn quickfixj_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/fix-quickfixj")
}

/// Runs QuickFIX/J's phase `phase` against the server; `tls`: the CA and client certificate
/// and key PEM files it connects with.
fn run_phase(server: &Running, qfj_store: &Path, phase: &str, tls: Option<&certs::Certs>) {
    let dir = quickfixj_dir();
    let classpath =
        format!("{}:{}/*", dir.join("target/classes").display(), dir.join("target/lib").display());
    let port = server.fix_listen.unwrap().port().to_string();
    let properties: Vec<String> = tls.map_or_else(Vec::new, |certs| {
        let property =
            |name: &str, path: &Path| format!("-Dleantier.tls.{name}={}", path.display());
        vec![
            property("ca", &certs.ca),
            property("cert", &certs.client_cert),
            property("key", &certs.client_key),
        ]
    });
    let mut child = Command::new("java")
        .args(&properties)
        .args(["-cp", &classpath, "leantier.Conformance", "127.0.0.1", &port])
        .arg(qfj_store)
        .args([PASSWORD, phase])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("java runs (scripts/fix-conformance installs it)");
    let deadline = std::time::Instant::now() + PHASE_TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(&format!("CONFORMANCE PHASE {phase} OK")),
        "QuickFIX/J phase {phase} failed ({:?}):\n{stdout}\n{stderr}",
        output.status
    );
}

fn assert_built() {
    assert!(
        quickfixj_dir().join("target/classes/leantier/Conformance.class").exists(),
        "build bench/fix-quickfixj first (mvn package)"
    );
}

#[test]
#[ignore = "needs Java 17 and bench/fix-quickfixj built: run by scripts/fix-conformance"]
fn quickfixj_trades_reconnects_and_resumes_after_a_restart() {
    assert_built();
    let hash = credentials::hash_secret(PASSWORD.as_bytes()).unwrap();
    let store = tempfile::tempdir().unwrap();
    let (ours, theirs) = (store.path().join("leantier"), store.path().join("quickfixj"));
    let server = start(&ours, &hash);
    run_phase(&server, &theirs, "1", None);
    server.stop();
    let server = start(&ours, &hash);
    run_phase(&server, &theirs, "2", None);
}

#[test]
#[ignore = "needs Java 17 and bench/fix-quickfixj built: run by scripts/fix-conformance"]
fn quickfixj_ssl_initiator_trades_and_reconnects_over_mutual_tls() {
    assert_built();
    let certs = certs::Certs::new("leantier test CA");
    let hash = credentials::hash_secret(PASSWORD.as_bytes()).unwrap();
    let store = tempfile::tempdir().unwrap();
    let options = common::serve_options(&store.path().join("leantier"), credentials(&hash), 32);
    let settings = Settings { tls: Some(certs.listener_tls(true)), ..options.settings.clone() };
    let fix_listen = Some("127.0.0.1:0".parse().unwrap());
    let options = ServeOptions { settings, fix_listen, metrics_listen: None, ..options };
    let server = gateway::start(options).unwrap();
    run_phase(&server, &store.path().join("quickfixj"), "1", Some(&certs));
}
