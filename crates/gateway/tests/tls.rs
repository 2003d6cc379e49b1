//! TLS on the native and FIX listeners against real TLS clients: the gateway's own client
//! (rustls), `exchange load`'s sessions over both protocols, and openssl's `s_client` (a TLS
//! stack nobody here wrote; scripts/test installs openssl when missing). Mutual TLS admits only
//! clients with a certificate of the configured CA; plain TCP on a TLS port and a client that
//! does not trust the server's CA get no session.

#[path = "common/certs.rs"]
mod certs;
mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use certs::Certs;
use gateway::ListenerTls;
use gateway::Settings;
use gateway::client::{ClientTls, NativeClient};
use gateway::credentials::{self, Credential, Protocol};
use gateway::native::{ClientMsg, OrderRequest, ServerMsg, event_kind};
use gateway::{Running, ServeOptions};

/// Generous on a loaded 2-core machine; a passing run never waits this long.
const WAIT: Duration = Duration::from_secs(10);
const SECRET: &str = "s3cret";
const PRICE: i64 = 101_000;

/// Native clients 1..=3 and FIX client 11 (comp id F11), a FIX listener beside the native
/// one, both serving `tls`.
fn start(tls: ListenerTls, heartbeat: Duration) -> (Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut credentials = common::native_credentials(SECRET);
    let hash = credentials::hash_secret(SECRET.as_bytes()).unwrap();
    credentials.push(Credential {
        client: 11,
        protocol: Protocol::Fix,
        comp_id: "F11".into(),
        hash,
    });
    let options = common::serve_options(dir.path(), credentials, 16);
    let settings = Settings { tls: Some(tls), heartbeat, ..options.settings.clone() };
    let fix_listen = Some("127.0.0.1:0".parse().unwrap());
    (gateway::start(ServeOptions { settings, fix_listen, ..options }).unwrap(), dir)
}

/// Logs client 1 in over `tls`; the error's text if the connection or the login failed.
fn log_in(addr: SocketAddr, tls: Option<&ClientTls>) -> Result<NativeClient, String> {
    let mut session = NativeClient::connect_with(addr, WAIT, tls).map_err(|e| e.to_string())?;
    match session.login(1, SECRET, 0, WAIT) {
        Ok(ServerMsg::LoginAccepted { client: 1, .. }) => Ok(session),
        Ok(other) => Err(format!("answered {other:?}")),
        Err(error) => Err(error.to_string()),
    }
}

fn buy(token: u32) -> ClientMsg {
    let order = OrderRequest {
        client: 1,
        token,
        instrument: 1,
        side: 0,
        order_type: 0,
        time_in_force: 0,
        price: PRICE,
        qty: 1,
    };
    ClientMsg::NewOrder(order)
}

#[test]
fn native_sessions_trade_over_tls_and_plain_or_untrusting_clients_get_none() {
    let certs = Certs::new("leantier test CA");
    let (server, _dir) = start(certs.listener_tls(false), Settings::default().heartbeat);
    let mut session = log_in(server.listen, Some(&certs.client_tls(None))).unwrap();
    session.send(&buy(7)).unwrap();
    match session.recv(WAIT).unwrap() {
        Some(ServerMsg::Sequenced { event, .. }) => {
            assert_eq!((event.kind, event.token), (event_kind::ACCEPTED, 7), "{event:?}");
        }
        other => panic!("expected the order's acceptance, got {other:?}"),
    }
    drop(session);
    // Plain TCP on the TLS port: the login frame is no TLS handshake; the server answers with
    // an alert (no frame of the protocol) or closes.
    let plain = log_in(server.listen, None).err().expect("no session over plain TCP");
    assert!(plain.contains("bad frame") || plain.contains("closed"), "{plain}");
    // A client that trusts another CA refuses the server's certificate.
    let stranger = Certs::new("another CA");
    let untrusting = log_in(server.listen, Some(&stranger.client_tls(None))).err().unwrap();
    assert!(untrusting.contains("UnknownIssuer"), "{untrusting}");
}

#[test]
fn mutual_tls_admits_only_clients_with_a_certificate_of_its_ca() {
    let certs = Certs::new("leantier test CA");
    let (server, _dir) = start(certs.listener_tls(true), Settings::default().heartbeat);
    // TLS 1.3: the client's handshake ends before the server checks its certificate, so the
    // refusal (an alert) may come at the login.
    let anonymous = log_in(server.listen, Some(&certs.client_tls(None))).err().unwrap();
    assert!(anonymous.contains("CertificateRequired"), "{anonymous}");
    let stranger = Certs::new("another CA");
    let foreign = log_in(server.listen, Some(&certs.client_tls(Some(&stranger)))).err().unwrap();
    assert!(foreign.contains("UnknownCA") || foreign.contains("alert"), "{foreign}");
    log_in(server.listen, Some(&certs.client_tls(Some(&certs)))).unwrap();
}

/// `exchange load` over TLS: every order answered on both protocols (the split reader and
/// writer share one TLS state; FIX logs on, trades and logs out).
#[test]
fn the_load_generator_runs_over_tls_on_both_protocols() {
    let certs = Certs::new("leantier test CA");
    let (server, _dir) = start(certs.listener_tls(true), Settings::default().heartbeat);
    let tls = Some(certs.client_tls(Some(&certs)));
    let session = |client: u32, comp_id: &str| experiments::order_entry_load::LoadSession {
        client,
        comp_id: comp_id.into(),
        secret: SECRET.into(),
    };
    let native = experiments::order_entry_load::LoadOptions {
        connect: server.listen,
        protocol: experiments::order_entry_load::LoadProtocol::Native,
        sessions: vec![session(1, ""), session(2, "")],
        plan: stats::open_loop::OpenLoopPlan {
            process: stats::open_loop::ArrivalProcess::Poisson { rate_per_s: 2_000.0 },
            seed: 1,
            duration: Duration::from_millis(200),
        },
        instruments: vec![experiments::order_entry_load::Traded::reference(1, PRICE)],
        tls,
        drain: experiments::order_entry_load::DRAIN_DEFAULT,
    };
    let fix = experiments::order_entry_load::LoadOptions {
        connect: server.fix_listen.unwrap(),
        protocol: experiments::order_entry_load::LoadProtocol::Fix {
            target_comp_id: "LEANTIER".into(),
        },
        sessions: vec![session(11, "F11")],
        ..native.clone()
    };
    for options in [native, fix] {
        let result = experiments::order_entry_load::run(&options).unwrap();
        assert!(result.sent > 100, "about 400 orders in 200 ms at 2K/s, sent {}", result.sent);
        assert_eq!(result.answered, result.sent, "{:?}: every order answered", options.protocol);
        assert_eq!(result.rejected, 0, "{:?}", result.rejects);
    }
}

/// openssl's `s_client`, with its own client certificate, logs in over mutual TLS and reads
/// the LoginAccepted; with a CA that did not sign the server's certificate it fails.
#[test]
fn openssl_s_client_logs_in_over_mutual_tls() {
    let certs = Certs::new("leantier test CA");
    // A short heartbeat: the server ends the silent session soon, and s_client with it.
    let (server, _dir) = start(certs.listener_tls(true), Duration::from_millis(100));
    let mut login = Vec::new();
    let secret = gateway::native::secret_field(SECRET).unwrap();
    gateway::native::encode_client(
        &ClientMsg::Login { client: 1, secret, next_seq: 0 },
        &mut login,
    );
    let (status, stdout, stderr) = s_client(server.listen, &certs.ca, &certs, &login);
    assert!(status.success(), "s_client failed: {stderr}");
    let (version, kind, payload, _) =
        gateway::native::split_frame(&stdout).unwrap().expect("a whole frame from the server");
    let answer = gateway::native::decode_server(version, kind, payload).unwrap();
    assert!(matches!(answer, ServerMsg::LoginAccepted { client: 1, .. }), "{answer:?}");
    let stranger = Certs::new("another CA");
    let (status, stdout, stderr) = s_client(server.listen, &stranger.ca, &certs, &login);
    assert!(!status.success(), "s_client trusted a server its CA did not sign");
    assert!(stderr.contains("certificate verify failed"), "{stderr}");
    assert!(gateway::native::split_frame(&stdout).unwrap().is_none(), "no session data");
}

/// Runs `openssl s_client` against `addr` trusting `ca`, with `identity`'s client certificate,
/// writing `input`; its exit status, what it read (`-quiet`: the session's bytes only) and
/// what it said.
fn s_client(
    addr: SocketAddr,
    ca: &std::path::Path,
    identity: &Certs,
    input: &[u8],
) -> (std::process::ExitStatus, Vec<u8>, String) {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_return_error", "-verify_ip", "127.0.0.1"])
        .args(["-connect", &addr.to_string()])
        .arg("-CAfile")
        .arg(ca)
        .arg("-cert")
        .arg(&identity.client_cert)
        .arg("-key")
        .arg(&identity.client_key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl runs (scripts/test installs it when missing)");
    child.stdin.as_mut().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    (output.status, output.stdout, String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A split TLS connection writes more than rustls buffers at once (256 KiB of heartbeats, then
/// an order) from one half and reads the order's acceptance from the other.
#[test]
fn a_split_tls_connection_writes_past_the_tls_buffer_and_reads_the_answer() {
    use std::io::Write;
    let certs = Certs::new("leantier test CA");
    let (server, _dir) = start(certs.listener_tls(false), Settings::default().heartbeat);
    let session = log_in(server.listen, Some(&certs.client_tls(None))).unwrap();
    let (mut writer, mut reader, mut received) = session.split().unwrap();
    let mut frames = Vec::new();
    while frames.len() < 256 * 1024 {
        gateway::native::encode_client(&ClientMsg::Heartbeat, &mut frames);
    }
    gateway::native::encode_client(&buy(9), &mut frames);
    writer.write_all(&frames).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    let mut chunk = [0u8; 4096];
    let accepted = loop {
        if let Some((version, kind, payload, len)) =
            gateway::native::split_frame(&received).unwrap()
        {
            let msg = gateway::native::decode_server(version, kind, payload).unwrap();
            received.drain(..len);
            if let ServerMsg::Sequenced { event, .. } = msg {
                break event;
            }
            continue;
        }
        assert!(std::time::Instant::now() < deadline, "no answer within {WAIT:?}");
        match reader.read_within(&mut chunk, Duration::from_millis(100)) {
            Ok(0) => panic!("the server closed the connection"),
            Ok(n) => received.extend_from_slice(&chunk[..n]),
            Err(error) => assert!(
                matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
                "{error}"
            ),
        }
    };
    assert_eq!((accepted.kind, accepted.token), (event_kind::ACCEPTED, 9), "{accepted:?}");
}
