//! The `prefork` model: N processes, each pinned to one CPU, sharing one port with SO_REUSEPORT.
//!
//! The parent reserves the port with a bound but *not listening* SO_REUSEPORT socket (so a port
//! of 0 resolves to one ephemeral port and no connection is ever queued on the parent), then
//! re-executes its own binary once per worker, with the arguments its caller names for a child
//! (the `leantier` command line: `web prefork-child`), telling each child its
//! role through the [`CHILD_ENV`] variable (a JSON [`ChildSpec`]). A child pins the whole process
//! to its CPU before it starts any thread, binds and listens on the shared port, prints
//! [`READY_LINE`] on stdout, and serves with the `single` executor. The kernel spreads incoming
//! connections over the listening children. Children die with the parent (`PR_SET_PDEATHSIG`).
//!
//! Each child answers `/metrics`, `/health` and `/ready` for itself on the shared port and on a
//! loopback port of its own, named in its ready line, from which the parent shows them all as
//! one server ([`crate::fleet`]).
//!
//! The `adaptive` model in its per-core layout (`--adaptive-layout per-core`) uses the same
//! layout, so under load it is exactly as parallel as `prefork` (one process per core, no
//! hand-off between cores), with three differences:
//! the parent itself listens and deals the connections to the children in turn ([`crate::deal`]:
//! an even share for each, where SO_REUSEPORT's hash leaves a few connections unevenly spread);
//! a body up to [`exec::INLINE_BODY_BYTES_MAX`] that will not split runs inline on the child's
//! reactor thread (no hand-off to the worker on the same core); and a body at least as large as
//! the calibrated split size is spread over a pool spanning every core when no other request is
//! admitted (waiting or computing) anywhere on the host. "Admitted on the host" is one
//! [`HostCounter`]: an `AtomicUsize` in a memfd the parent creates and every child maps (the fd
//! is inherited across exec, its number passed in the [`ChildSpec`]).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::api::SizeLimits;
use crate::deal::{self, Dealer, DealtListener};
use crate::error::{Result, WebError, io_failed};
use crate::exec::{self, Calibration, ExecConfig, Executor, Model};
use crate::server::{Executors, ServeBounds, serve_on};

/// The environment variable that turns a re-executed process into a prefork child.
pub const CHILD_ENV: &str = "LEANTIER_WEB_PREFORK_CHILD";
/// What a child prints on stdout once it listens, followed by a space and the address of its
/// own admin listener.
pub const READY_LINE: &str = "leantier-web-prefork-ready";
/// The address a child's own admin listener binds: loopback, a port the kernel picks.
const CHILD_ADMIN_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
/// Pending-connection backlog of each child's listening socket.
const LISTEN_BACKLOG: i32 = 1024;
/// Size of the shared counter's memfd: one page, so the mapping is page-aligned.
const HOST_COUNTER_BYTES: usize = 4096;

/// Everything a child needs, passed as JSON in [`CHILD_ENV`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ChildSpec {
    /// `prefork` (a `single` executor) or `adaptive` (inline or split, see the module docs).
    pub model: Model,
    pub cpu: usize,
    /// Threads of the adaptive child's splitting pool (one per process of the layout).
    pub pool_threads: usize,
    /// The adaptive threshold measured by the parent: the split size.
    pub calibration: Calibration,
    /// The [`HostCounter`] memfd inherited from the parent (set by [`Prefork::start`]).
    pub host_counter_fd: RawFd,
    /// The child's end of its [`deal`] channel (set by [`Prefork::start`] for `adaptive`);
    /// `None`: listen on the shared port with SO_REUSEPORT.
    pub dealt_channel_fd: Option<RawFd>,
    pub addr: SocketAddr,
    pub dim_max: usize,
    pub cells_max: usize,
    pub answer_bytes_max: usize,
    pub queue_depth_max: usize,
    pub body_bytes_max: usize,
    /// Connection and work bounds, per child process.
    pub bounds: ServeBounds,
    /// The bearer token the child's `/metrics` requires (on both its listeners), if any.
    pub metrics_token: Option<String>,
}

/// The child role of this process, if its parent set one.
pub fn child_spec_from_env() -> Result<Option<ChildSpec>> {
    let Ok(text) = std::env::var(CHILD_ENV) else {
        return Ok(None);
    };
    let spec = serde_json::from_str(&text).map_err(WebError::ChildSpec)?;
    Ok(Some(spec))
}

/// Runs this process as one prefork child until the parent kills it, or stops it with SIGTERM
/// or SIGINT.
pub fn run_child(spec: &ChildSpec) -> Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    if rc != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "child will not die with its parent");
    }
    let executors = start_pinned(spec)?;
    let (mut registry, readiness) = (ops::Registry::default(), ops::Readiness::default());
    executors.register_metrics(&mut registry);
    let endpoint = ops::Endpoint::new(registry, readiness.clone())
        .with_metrics_token(spec.metrics_token.clone());
    // After pinning: its thread renders a scrape on the child's core, off the reactor thread.
    let admin = endpoint.clone().serve(CHILD_ADMIN_LISTEN)?;
    let router = executors.router(spec.model, spec.body_bytes_max, &spec.bounds.work);
    let router = crate::server::with_admin(router, endpoint);
    let bounds = spec.bounds.connection;
    // Ready is announced from inside the runtime, once its listener exists: the process then
    // holds every descriptor it serves with (the runtime's own sockets included).
    let (admin_addr, ready_flag) = (admin.addr, readiness.clone());
    let ready = move || {
        ready_flag.set(true);
        println!("{READY_LINE} {admin_addr}");
    };
    match spec.dealt_channel_fd {
        Some(fd) => {
            // SAFETY: the parent made `fd` inheritable for this child only, and nothing else in
            // this process owns it.
            let channel = unsafe { OwnedFd::from_raw_fd(fd) };
            let listener = move || DealtListener::new(channel).inspect(|_| ready());
            serve_on(listener, router, 1, bounds, stop_signal(readiness))
                .map_err(io_failed("serving dealt connections"))?;
        }
        None => {
            let listening = || {
                let socket = reuseport_socket(spec.addr)?;
                socket.listen(LISTEN_BACKLOG)?;
                socket.set_nonblocking(true)?;
                Ok(socket)
            };
            let socket = listening().map_err(io_failed(format!("listening on {}", spec.addr)))?;
            let listener =
                move || tokio::net::TcpListener::from_std(socket.into()).inspect(|_| ready());
            serve_on(listener, router, 1, bounds, stop_signal(readiness))
                .map_err(io_failed(format!("serving on {}", spec.addr)))?;
        }
    }
    // Only now: the parent reads this listener for as long as the child serves.
    drop(admin);
    Ok(())
}

/// The child's executors, with the process pinned to the child's CPU: every thread started
/// after this returns inherits the pin.
fn start_pinned(spec: &ChildSpec) -> Result<Executors> {
    let exec = ExecConfig {
        limits: SizeLimits {
            dim_max: spec.dim_max,
            cells_max: spec.cells_max,
            answer_bytes_max: spec.answer_bytes_max,
        },
        workers: spec.pool_threads,
        queue_depth_max: spec.queue_depth_max,
    };
    let pin = || {
        let pinned = pipeline::placement::pin_current_thread(&[spec.cpu]);
        pinned.map_err(|e| WebError::Failed(format!("pinning the child to CPU {}: {e}", spec.cpu)))
    };
    Ok(match spec.model {
        Model::Adaptive => {
            let host_in_flight = HostCounter::map(spec.host_counter_fd)
                .map_err(io_failed("mapping the shared counter"))?;
            // Before pinning: the splitting pool's threads pin themselves over all allowed CPUs.
            let executor = Executor::start_child(&exec, spec.calibration, spec.cpu, host_in_flight)
                .map_err(io_failed("starting the child's executor"))?;
            // The reactor threads, started later, inherit this thread's mask.
            pin()?;
            Executors::of(executor)
        }
        Model::Prefork => {
            // Before any other thread exists, so every thread of the process inherits the mask.
            pin()?;
            Executors::start(&[Model::Prefork], &ExecConfig { workers: 1, ..exec })
                .map_err(io_failed("starting the child's executor"))?
        }
        other => {
            let why = format!("{} is not a per-core process model", other.name());
            return Err(WebError::Failed(why));
        }
    })
}

/// A child's end of serving: SIGTERM or SIGINT (the parent passes its stop on), after which
/// it turns not ready and drains its connections like a one-process server.
async fn stop_signal(readiness: ops::Readiness) {
    match ops::stop::stop_signal() {
        Ok(stop) => {
            stop.await;
            readiness.set(false);
        }
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGTERM; serving until killed");
            std::future::pending().await
        }
    }
}

fn reuseport_socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// A counter in memory shared by the parent and its children: requests admitted on the host.
pub struct HostCounter {
    memfd: OwnedFd,
}

impl HostCounter {
    /// A zeroed counter in a new memfd, inherited by children (no close-on-exec).
    pub fn create() -> std::io::Result<HostCounter> {
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"leantier-web-host-counter".as_ptr(), 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on an fd we own; a new memfd reads as zeros up to the new length.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), HOST_COUNTER_BYTES as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(HostCounter { memfd })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.memfd.as_raw_fd()
    }

    /// Maps the counter behind `fd` (a [`HostCounter`]'s memfd) for the rest of the process.
    pub fn map(fd: RawFd) -> std::io::Result<&'static AtomicUsize> {
        // SAFETY: asks for a new shared mapping; the kernel validates `fd` and the length and
        // answers MAP_FAILED on error; no existing memory is touched.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                HOST_COUNTER_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the mapping is page-aligned (so aligned for AtomicUsize), at least one page
        // long, zero-initialised or written only through atomics by the processes sharing it,
        // and never unmapped (it lives as long as the process), so the reference is 'static.
        Ok(unsafe { &*addr.cast::<AtomicUsize>() })
    }
}

/// How connections reach the children, seen from the parent; held for as long as they serve.
enum Intake {
    /// Children listen with SO_REUSEPORT; this bound, never listening socket keeps the port.
    ReusePort { _reservation: Socket },
    /// The parent listens and deals. Connections that arrive before a child serves wait in its
    /// channel.
    Dealt { _dealer: Dealer },
}

/// The parent of the prefork children; kills them when dropped.
pub struct Prefork {
    addr: SocketAddr,
    _intake: Intake,
    /// The children's shared counter (each child holds its own copy of the fd).
    _host_counter: HostCounter,
    children: Vec<Child>,
    /// Each child's own admin listener, by worker index.
    admin_addrs: Vec<SocketAddr>,
}

impl Prefork {
    /// Binds `addr` and starts `workers` children of `exe args...`, one per allowed CPU
    /// (round-robin), returning once every child serves. `adaptive` children are dealt their
    /// connections by this process; `prefork` children listen with SO_REUSEPORT.
    pub fn start(
        addr: SocketAddr,
        workers: usize,
        template: ChildSpec,
        exe: PathBuf,
        args: &[OsString],
    ) -> Result<Prefork> {
        assert!(workers >= 1);
        // For dealt intakes, the channels' child ends: open here until every child inherited
        // its own.
        let (intake, addr, child_ends) = Intake::bind(addr, workers, template.model)?;
        let allowed = exec::allowed_cpus().map_err(io_failed("reading the allowed CPUs"))?;
        let host_counter =
            HostCounter::create().map_err(io_failed("creating the shared counter"))?;
        let host_counter_fd = host_counter.raw_fd();
        let mut prefork = Prefork {
            addr,
            _intake: intake,
            _host_counter: host_counter,
            children: Vec::new(),
            admin_addrs: Vec::new(),
        };
        for index in 0..workers {
            let cpu = exec::cpu_for_worker(&allowed, index);
            let dealt_channel_fd = child_ends.get(index).map(AsRawFd::as_raw_fd);
            let spec = ChildSpec {
                cpu,
                addr,
                pool_threads: workers,
                host_counter_fd,
                dealt_channel_fd,
                ..template.clone()
            };
            let mut command = Command::new(&exe);
            command
                .args(args)
                .env(CHILD_ENV, serde_json::to_string(&spec).map_err(WebError::ChildSpec)?)
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            if let Some(fd) = dealt_channel_fd {
                // SAFETY: the closure runs between fork and exec and only calls fcntl, which is
                // async-signal-safe; it allocates nothing and takes no lock.
                unsafe { command.pre_exec(move || deal::inherit_in_child(fd)) };
            }
            let child = command
                .spawn()
                .map_err(io_failed(format!("starting prefork child {}", exe.display())))?;
            prefork.children.push(child);
        }
        drop(child_ends);
        let admin_addrs = prefork.children.iter_mut().map(wait_ready).collect::<Result<_>>()?;
        prefork.admin_addrs = admin_addrs;
        Ok(prefork)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Each child's own admin listener (`/metrics`, `/health`, `/ready` on loopback), by
    /// worker index.
    pub fn admin_addrs(&self) -> &[SocketAddr] {
        &self.admin_addrs
    }

    /// Process ids of the children.
    pub fn child_ids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Blocks until the first child exits (children only exit on failure), as an error.
    pub fn wait_any(mut self) -> Result<()> {
        let status = self.children[0].wait().map_err(io_failed("waiting for a prefork child"))?;
        Err(WebError::Failed(format!("prefork child exited: {status}")))
    }

    /// Serves until SIGTERM or SIGINT, then passes the signal on to every child (each drains
    /// its connections) and waits for them within `ops::stop::DRAIN_TIMEOUT`, killing any
    /// left; logs one summary line. A child that exits first is an error, as in
    /// [`Prefork::wait_any`].
    pub fn serve_until_stopped(mut self) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let runtime = runtime.map_err(io_failed("starting the parent's runtime"))?;
        let stop = runtime.block_on(async { ops::stop::stop_signal() });
        let stop = stop.map_err(io_failed("listening for SIGTERM and SIGINT"))?;
        let signal = runtime.block_on(async {
            tokio::select! {
                signal = stop => Ok(signal),
                exited = self.first_exit() => Err(exited),
            }
        });
        let signal = match signal {
            Ok(signal) => signal,
            Err(status) => return Err(WebError::Failed(format!("prefork child exited: {status}"))),
        };
        tracing::info!(signal, "stop requested: draining the children");
        let started = std::time::Instant::now();
        for child in &self.children {
            let pid = libc::pid_t::try_from(child.id()).unwrap_or(libc::pid_t::MAX);
            // SAFETY: kill(2) on our own child's pid; it touches no memory of ours.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let drained = self.wait_children(started + ops::stop::DRAIN_TIMEOUT);
        let (children, elapsed_ms) = (self.children.len(), started.elapsed().as_millis() as u64);
        tracing::info!(signal, children, drained, elapsed_ms, "web server stopped");
        let _ = writeln!(std::io::stdout(), "stopped on {signal}");
        Ok(())
    }

    /// The status of the first child to exit.
    async fn first_exit(&mut self) -> std::process::ExitStatus {
        loop {
            for child in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    return status;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every child exited or `deadline`; whether all exited by themselves (the
    /// rest are killed when this drops).
    fn wait_children(&mut self, deadline: std::time::Instant) -> bool {
        loop {
            let mut running = self.children.iter_mut().map(Child::try_wait);
            if !running.any(|status| matches!(status, Ok(None))) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Intake {
    /// The intake for `workers` children of `model`, the address it resolved to, and (dealt
    /// intakes) the child end of each child's channel.
    fn bind(
        addr: SocketAddr,
        workers: usize,
        model: Model,
    ) -> Result<(Intake, SocketAddr, Vec<OwnedFd>)> {
        if model != Model::Adaptive {
            let reservation =
                reuseport_socket(addr).map_err(io_failed(format!("binding {addr}")))?;
            let bound = reservation.local_addr().map_err(io_failed("reading the bound address"))?;
            let addr = bound.as_socket().expect("a socket bound to an IP address has one");
            return Ok((Intake::ReusePort { _reservation: reservation }, addr, Vec::new()));
        }
        let listener =
            std::net::TcpListener::bind(addr).map_err(io_failed(format!("binding {addr}")))?;
        let addr = listener.local_addr().map_err(io_failed("reading the bound address"))?;
        let (parent_ends, child_ends): (Vec<OwnedFd>, Vec<OwnedFd>) = (0..workers)
            .map(|_| deal::channel())
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(io_failed("creating the dealing channels"))?
            .into_iter()
            .unzip();
        let dealer =
            Dealer::start(listener, parent_ends).map_err(io_failed("starting the dealer"))?;
        Ok((Intake::Dealt { _dealer: dealer }, addr, child_ends))
    }
}

/// The child's admin address, from its ready line.
fn wait_ready(child: &mut Child) -> Result<SocketAddr> {
    let stdout = child.stdout.take().expect("`Prefork::start` pipes the child's stdout");
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    read.map_err(io_failed(format!("reading prefork child {}'s ready line", child.id())))?;
    let admin = line.strip_prefix(READY_LINE).and_then(|rest| rest.trim().parse().ok());
    let failed =
        || WebError::Failed(format!("prefork child {} failed to start: {line:?}", child.id()));
    admin.ok_or_else(failed)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn host_counter_mappings_share_one_value() {
        let counter = HostCounter::create().unwrap();
        // Two mappings of one memfd stand for two processes: distinct addresses, one value.
        let (first, second) = (
            HostCounter::map(counter.raw_fd()).unwrap(),
            HostCounter::map(counter.raw_fd()).unwrap(),
        );
        assert!(!std::ptr::eq(first, second));
        assert_eq!(first.fetch_add(3, Ordering::Relaxed), 0);
        assert_eq!(second.fetch_sub(1, Ordering::Relaxed), 3);
        assert_eq!(first.load(Ordering::Relaxed), 2);
        assert!(HostCounter::map(-1).is_err(), "a bad fd is an error, not a crash");
    }
}
