//! Every leantier NATS client logs in the same way ([`NatsConnect`]): a delivery edge and an
//! R-Sender publisher on a `nats-server` child that requires a user and password deliver
//! records end to end; a wrong or missing password is a prompt, clear error that names the
//! credentials (never the password), not a hang. The same over TLS, and a server whose
//! certificate the client's roots do not hold is refused.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use delivery::edge::{EdgeOptions, start};
use delivery::nats::{NatsAuth, NatsConnect, Secret};
use delivery::publish::{HEARTBEAT_INTERVAL_DEFAULT, NatsPublisher, PublishOptions};
use delivery::server::NatsServer;
use delivery::subjects::CONNECT_TIMEOUT;
use exchange::msg::Response;
use pipeline::WaitStrategy;

const USER: &str = "alice";
const PASSWORD: &str = "s3cret-pw";
const RECORDS: u64 = 1000;
const DEADLINE: Duration = Duration::from_secs(20);

/// A server that requires `USER` / `PASSWORD` (its configuration file lives in `dir`).
fn password_server(dir: &tempfile::TempDir) -> NatsServer {
    let config = dir.path().join("nats.conf");
    let text = format!("authorization {{\n  user: {USER}\n  password: \"{PASSWORD}\"\n}}\n");
    std::fs::write(&config, text).unwrap();
    let config = config.to_str().unwrap();
    NatsServer::start_with(Ipv4Addr::LOCALHOST.into(), &["-c", config]).unwrap()
}

fn login(server: &NatsServer, password: &str) -> NatsConnect {
    let auth = NatsAuth::UserPassword { user: USER.into(), password: Secret::new(password) };
    NatsConnect { auth, ..NatsConnect::new(server.url()) }
}

fn edge_options(nats: &NatsConnect) -> EdgeOptions {
    let mut options = EdgeOptions::new("", 0, SocketAddr::from(([127, 0, 0, 1], 0)));
    options.nats = nats.clone();
    options
}

fn publish_options(nats: &NatsConnect) -> PublishOptions {
    PublishOptions {
        nats: nats.clone(),
        prefix: delivery::subjects::PREFIX_DEFAULT.into(),
        outlets: 1,
        retain_records: 4096,
        wait: WaitStrategy::Park,
        heartbeat: HEARTBEAT_INTERVAL_DEFAULT,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

#[test]
fn a_edge_and_a_publisher_log_in_with_a_password_and_deliver() {
    let dir = tempfile::tempdir().unwrap();
    let server = password_server(&dir);
    deliver_through(&login(&server, PASSWORD));
}

/// A server that requires TLS, with a self-signed certificate for 127.0.0.1 (its PEM files
/// in `dir`); the path of the certificate, the roots a client must trust.
fn tls_server(dir: &tempfile::TempDir) -> (NatsServer, std::path::PathBuf) {
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, signing_key.serialize_pem()).unwrap();
    let config = dir.path().join("nats.conf");
    let text = format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
        cert_file.display(),
        key_file.display()
    );
    std::fs::write(&config, text).unwrap();
    let config = config.to_str().unwrap();
    (NatsServer::start_with(Ipv4Addr::LOCALHOST.into(), &["-c", config]).unwrap(), cert_file)
}

#[test]
fn a_edge_and_a_publisher_deliver_over_tls_and_refuse_a_server_they_cannot_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (server, ca) = tls_server(&dir);
    let mut nats = NatsConnect::new(server.url());
    nats.tls.ca = Some(ca);
    deliver_through(&nats);

    // Roots that do not hold the server's certificate: a prompt, clear error.
    let other = tempfile::tempdir().unwrap();
    let stranger = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    let stranger_ca = other.path().join("stranger.pem");
    std::fs::write(&stranger_ca, stranger.cert.pem()).unwrap();
    nats.tls.ca = Some(stranger_ca);
    let started = Instant::now();
    let Err(error) = runtime().block_on(start(edge_options(&nats))) else {
        panic!("the edge trusted a server its roots do not hold")
    };
    assert!(started.elapsed() <= CONNECT_TIMEOUT + Duration::from_secs(1), "{error:#}");
    let message = format!("{error:#}");
    assert!(message.to_lowercase().contains("tls") || message.contains("certificate"), "{message}");
}

/// Publishes [`RECORDS`] records through a publisher and a delivery edge both connected with
/// `nats`; the edge receives every one, in order.
fn deliver_through(nats: &NatsConnect) {
    let io = runtime();
    let edge = io.block_on(start(edge_options(nats))).unwrap();
    let publisher = NatsPublisher::connect(publish_options(nats)).unwrap();
    // One R-Sender's subscribers (one per edge), as the tier would call the factory.
    let mut subscribers = publisher.subscribers()(0);
    for _ in 0..RECORDS {
        subscribers[0].deliver(&Response::default());
    }
    drop(subscribers);
    let published = publisher.drain().unwrap();
    assert_eq!(published.next_seqs[0], RECORDS + 1, "{published:?}");
    let deadline = Instant::now() + DEADLINE;
    while edge.report().received < RECORDS {
        assert!(Instant::now() < deadline, "edge stuck: {:?}", edge.report());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (report, _) = io.block_on(edge.shutdown()).unwrap();
    assert_eq!((report.received, report.resyncs, report.untrusted), (RECORDS, 0, 0), "{report:?}");
}

/// Fails within the connect timeout, naming the credentials and not leaking the password.
fn assert_refused(error: &delivery::DeliveryError, started: Instant, password: &str) {
    assert!(started.elapsed() < CONNECT_TIMEOUT, "took {:?}", started.elapsed());
    let delivery::DeliveryError::Connect(refusal) = error else {
        panic!("not a refused connection: {error}");
    };
    let message = refusal.to_string();
    assert!(message.contains("refused the credentials"), "{message}");
    assert!(password.is_empty() || !message.contains(password), "{message}");
}

#[test]
fn a_wrong_or_missing_password_is_a_clear_error_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let server = password_server(&dir);
    let io = runtime();
    let wrong = "not-the-password";
    for nats in [login(&server, wrong), NatsConnect::new(server.url())] {
        let password = if nats.auth == NatsAuth::None { "" } else { wrong };
        let started = Instant::now();
        match io.block_on(start(edge_options(&nats))) {
            Ok(_) => panic!("the edge logged in with {:?}", nats.auth),
            Err(error) => assert_refused(&error, started, password),
        }
        let started = Instant::now();
        match NatsPublisher::connect(publish_options(&nats)) {
            Ok(_) => panic!("the publisher logged in with {:?}", nats.auth),
            Err(error) => assert_refused(&error, started, password),
        }
    }
}
