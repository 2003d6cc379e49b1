//! A `nats-server` child process for tests, experiments and benchmarks: started on a free
//! loopback port, restartable on the same port (to test reconnection), killed when dropped.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{DeliveryError, Result, io_failed};

/// The environment variable naming a NATS server to use (set by `scripts/nats-env`).
pub const NATS_URL_ENV: &str = "LEANTIER_NATS_URL";
/// How long a started server may take to accept connections.
pub const SERVER_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server that answered must stay up to count as the one that bound its port.
const BIND_RACE_GRACE: Duration = Duration::from_millis(100);
/// Fresh ports tried before [`NatsServer::start_on`] gives up.
const START_ATTEMPTS_MAX: u32 = 5;
/// The server binary (the Debian package `nats-server`).
pub const SERVER_BINARY: &str = "nats-server";

/// A running `nats-server` child.
pub struct NatsServer {
    child: Option<Child>,
    host: IpAddr,
    port: u16,
    /// Further `nats-server` arguments (e.g. `-c FILE` for authentication).
    args: Vec<String>,
}

impl NatsServer {
    /// Starts a server on a free loopback port.
    pub fn start() -> Result<NatsServer> {
        NatsServer::start_on(Ipv4Addr::LOCALHOST.into())
    }

    /// Starts a server on a free port of `host` (an address of this host).
    pub fn start_on(host: IpAddr) -> Result<NatsServer> {
        NatsServer::start_with(host, &[])
    }

    /// Starts a server on a free port of `host` with further arguments, e.g. `["-c", FILE]`
    /// for a configuration with authentication or TLS (its `listen`, if any, is overridden).
    pub fn start_with(host: IpAddr, args: &[&str]) -> Result<NatsServer> {
        let mut attempt = 1;
        loop {
            // Bind port 0 to learn a free port. Another process (a parallel test's server)
            // may take it before this server binds: then the loser exits at once while
            // `wait_ready` reaches the winner, so a server that is gone after the grace period
            // lost that race and is started again on a new port.
            let free_port = || TcpListener::bind((host, 0))?.local_addr();
            let port =
                free_port().map_err(io_failed(format!("finding a free port on {host}")))?.port();
            let args = args.iter().map(|arg| arg.to_string()).collect();
            let mut server = NatsServer { child: None, host, port, args };
            server.spawn()?;
            std::thread::sleep(BIND_RACE_GRACE);
            if server.running() {
                return Ok(server);
            }
            if attempt >= START_ATTEMPTS_MAX {
                return Err(DeliveryError::Failed(format!(
                    "{SERVER_BINARY} exited right after starting, {attempt} times (ports taken?)"
                )));
            }
            attempt += 1;
        }
    }

    fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    fn spawn(&mut self) -> Result<()> {
        let child = Command::new(SERVER_BINARY)
            .args(&self.args)
            .args(["-a", &self.host.to_string(), "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io_failed(format!(
                "cannot run {SERVER_BINARY}: install the Debian package nats-server, or set \
                 {NATS_URL_ENV} (eval \"$(scripts/nats-env)\")"
            )))?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let address = SocketAddr::from((self.host, self.port));
        let deadline = Instant::now() + SERVER_START_TIMEOUT;
        while Instant::now() < deadline {
            if TcpStream::connect_timeout(&address, Duration::from_millis(100)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let why = format!("{SERVER_BINARY} on port {} exited: {status}", self.port);
                return Err(DeliveryError::Failed(why));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(DeliveryError::Failed(format!(
            "{SERVER_BINARY} did not accept on port {} in {SERVER_START_TIMEOUT:?}",
            self.port
        )))
    }

    pub fn url(&self) -> String {
        format!("nats://{}", SocketAddr::from((self.host, self.port)))
    }

    /// Kills the server (SIGKILL: in-flight messages are lost, as in a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The NATS server to use: `LEANTIER_NATS_URL` when set (no child), else a child server.
pub fn server_or_env() -> Result<(String, Option<NatsServer>)> {
    match std::env::var(NATS_URL_ENV) {
        Ok(url) if !url.is_empty() => Ok((url, None)),
        _ => {
            let server = NatsServer::start()?;
            Ok((server.url(), Some(server)))
        }
    }
}
