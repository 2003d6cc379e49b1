//! The `prefork` model: N processes, each pinned to one CPU, sharing one port with SO_REUSEPORT.
//!
//! The parent reserves the port with a bound but *not listening* SO_REUSEPORT socket (so a port
//! of 0 resolves to one ephemeral port and no connection is ever queued on the parent), then
//! re-executes its own binary with the same arguments once per worker, telling each child its
//! role through the [`CHILD_ENV`] variable (a JSON [`ChildSpec`]). A child pins the whole process
//! to its CPU before it starts any thread, binds and listens on the shared port, prints
//! [`READY_LINE`] on stdout, and serves with the `single` executor. The kernel spreads incoming
//! connections over the listening children. Children die with the parent (`PR_SET_PDEATHSIG`).

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use socket2::{Domain, Protocol, Socket, Type};

use crate::api::SizeLimits;
use crate::exec::{self, ExecConfig, Model};
use crate::server::{Executors, serve_blocking};

/// The environment variable that turns a re-executed process into a prefork child.
pub const CHILD_ENV: &str = "LEANTIER_WEB_PREFORK_CHILD";
/// What a child prints on stdout once it listens.
pub const READY_LINE: &str = "leantier-web-prefork-ready";
/// Pending-connection backlog of each child's listening socket.
const LISTEN_BACKLOG: i32 = 1024;

/// Everything a child needs, passed as JSON in [`CHILD_ENV`].
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct ChildSpec {
    pub cpu: usize,
    pub addr: SocketAddr,
    pub dim_max: usize,
    pub cells_max: usize,
    pub queue_depth_max: usize,
    pub body_bytes_max: usize,
}

/// The child role of this process, if its parent set one.
pub fn child_spec_from_env() -> anyhow::Result<Option<ChildSpec>> {
    let Ok(text) = std::env::var(CHILD_ENV) else {
        return Ok(None);
    };
    let spec = serde_json::from_str(&text).with_context(|| format!("invalid {CHILD_ENV}"))?;
    Ok(Some(spec))
}

/// Runs this process as one prefork child until the parent kills it.
pub fn run_child(spec: &ChildSpec) -> anyhow::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if rc != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "child will not die with its parent");
    }
    // Before any other thread exists, so every thread of the process inherits the mask.
    pipeline::placement::pin_current_thread(&[spec.cpu]).context("pinning the prefork child")?;
    let socket = reuseport_socket(spec.addr)?;
    socket.listen(LISTEN_BACKLOG)?;
    let exec = ExecConfig {
        limits: SizeLimits { dim_max: spec.dim_max, cells_max: spec.cells_max },
        workers: 1,
        queue_depth_max: spec.queue_depth_max,
    };
    let executors = Executors::start(&[Model::Prefork], &exec)?;
    let router = executors.router(Model::Prefork, spec.body_bytes_max);
    println!("{READY_LINE}");
    serve_blocking(socket.into(), router, 1, std::future::pending())?;
    Ok(())
}

fn reuseport_socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// The parent of the prefork children; kills them when dropped.
pub struct Prefork {
    addr: SocketAddr,
    /// Keeps the port reserved between children restarts; never listens.
    _reservation: Socket,
    children: Vec<Child>,
}

impl Prefork {
    /// Reserves `addr` and starts `workers` children of `exe args...`, one per allowed CPU
    /// (round-robin), returning once every child listens.
    pub fn start(
        addr: SocketAddr,
        workers: usize,
        template: ChildSpec,
        exe: PathBuf,
        args: &[OsString],
    ) -> anyhow::Result<Prefork> {
        assert!(workers >= 1);
        let reservation = reuseport_socket(addr).with_context(|| format!("binding {addr}"))?;
        let addr = reservation
            .local_addr()?
            .as_socket()
            .context("the reserved socket has an IP address")?;
        let allowed = exec::allowed_cpus()?;
        let mut prefork = Prefork { addr, _reservation: reservation, children: Vec::new() };
        for index in 0..workers {
            let spec = ChildSpec { cpu: exec::cpu_for_worker(&allowed, index), addr, ..template };
            let child = Command::new(&exe)
                .args(args)
                .env(CHILD_ENV, serde_json::to_string(&spec)?)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting prefork child {}", exe.display()))?;
            prefork.children.push(child);
        }
        for child in &mut prefork.children {
            wait_ready(child)?;
        }
        Ok(prefork)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Process ids of the children.
    pub fn child_ids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Blocks until the first child exits (children only exit on failure), as an error.
    pub fn wait_any(mut self) -> anyhow::Result<()> {
        let status = self.children[0].wait()?;
        anyhow::bail!("prefork child exited: {status}")
    }
}

fn wait_ready(child: &mut Child) -> anyhow::Result<()> {
    let stdout = child.stdout.take().context("child stdout is piped")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    anyhow::ensure!(line.trim() == READY_LINE, "prefork child {} failed to start", child.id());
    Ok(())
}

impl Drop for Prefork {
    fn drop(&mut self) {
        for child in &mut self.children {
            // Children serve until killed; errors mean the child is already gone.
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
