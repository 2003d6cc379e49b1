//! `web serve` as a library: the server's settings (a TOML file's fields, overridable field by
//! field), the process-wide allocator tuning a server process needs, and starting the server
//! in one process or as one pinned process per core.

use std::ffi::OsString;
use std::io::Write;
use std::net::SocketAddr;

use serde::Deserialize;

use crate::admission::WorkBounds;
use crate::api::{ANSWER_BYTES_MAX_DEFAULT, CELLS_MAX_DEFAULT, DIM_MAX_DEFAULT, SizeLimits};
use crate::conn::ConnectionBounds;
use crate::error::{Result, WebError, io_failed};
use crate::exec::{self, Calibration, ExecConfig, Model, QUEUE_DEPTH_MAX_DEFAULT};
use crate::fleet::Fleet;
use crate::prefork::{ChildSpec, Prefork};
use crate::server::{BODY_BYTES_MAX_DEFAULT, Executors, ServeBounds, ServerConfig, serve_blocking};

/// Where the `adaptive` model runs when served alone (`serve --model adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdaptiveLayout {
    /// One process: a reactor thread per core; a body from the calibrated split size is split
    /// over the cores while they idle; otherwise medium bodies run inline, small and large ones on
    /// a pinned pool that spreads them over the cores (the layout the benchmarks measure).
    #[default]
    Shared,
    /// One pinned process per core, dealt connections in turn by the parent, each running its
    /// bodies inline up to the bound (unless they split) and the others on a worker on its core.
    PerCore,
}

impl AdaptiveLayout {
    /// Both layouts.
    pub const ALL: [AdaptiveLayout; 2] = [AdaptiveLayout::Shared, AdaptiveLayout::PerCore];

    /// The name used in flags and config files.
    pub fn name(self) -> &'static str {
        match self {
            AdaptiveLayout::Shared => "shared",
            AdaptiveLayout::PerCore => "per-core",
        }
    }
}

/// Server settings; every field can come from a TOML file and be overridden by flags.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub model: String,
    pub workers: usize,
    pub queue_depth_max: usize,
    pub body_bytes_max: usize,
    pub dim_max: usize,
    pub cells_max: usize,
    pub answer_bytes_max: usize,
    pub io_threads: usize,
    pub adaptive_layout: AdaptiveLayout,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub connections_max: usize,
    pub connections_per_address_max: usize,
    pub work_bytes_max: usize,
    pub large_work_bytes_max: usize,
    pub connection_work_bytes_max: usize,
    pub admission_wait_ms: u64,
    /// `/metrics`, `/health` and `/ready` on a listener of their own too, off the service
    /// threads; with one process per core, the whole server's (see [`crate::fleet`]). An
    /// address other than loopback needs `metrics_token`.
    pub metrics_listen: Option<SocketAddr>,
    /// The bearer token `GET /metrics` requires; without one the page is open (bind loopback,
    /// or set one: the page shows the server's activity). Never printed (`--print-config`).
    #[serde(skip_serializing)]
    pub metrics_token: Option<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        let cpus = exec::allowed_cpus().map_or(1, |cpus| cpus.len());
        let (connection, work) = (ConnectionBounds::default(), WorkBounds::default());
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            model: "adaptive".into(),
            workers: cpus,
            queue_depth_max: QUEUE_DEPTH_MAX_DEFAULT,
            body_bytes_max: BODY_BYTES_MAX_DEFAULT,
            dim_max: DIM_MAX_DEFAULT,
            cells_max: CELLS_MAX_DEFAULT,
            answer_bytes_max: ANSWER_BYTES_MAX_DEFAULT,
            io_threads: cpus,
            adaptive_layout: AdaptiveLayout::default(),
            header_timeout_ms: millis(connection.header_timeout),
            body_timeout_ms: millis(connection.body_timeout),
            idle_timeout_ms: millis(connection.idle_timeout),
            connections_max: connection.connections_max,
            connections_per_address_max: connection.connections_per_address_max,
            work_bytes_max: work.work_bytes_max,
            large_work_bytes_max: work.large_work_bytes_max,
            connection_work_bytes_max: work.connection_work_bytes_max,
            admission_wait_ms: millis(work.wait_timeout),
            metrics_listen: None,
            metrics_token: None,
        }
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl ServeConfig {
    /// The validated server configuration.
    pub fn server_config(&self) -> Result<ServerConfig> {
        let model: Model = self.model.parse()?;
        let positive = [
            ("workers", self.workers),
            ("queue_depth_max", self.queue_depth_max),
            ("body_bytes_max", self.body_bytes_max),
            ("dim_max", self.dim_max),
            ("cells_max", self.cells_max),
            ("answer_bytes_max", self.answer_bytes_max),
            ("io_threads", self.io_threads),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(WebError::BadInput(format!("{name} must be > 0")));
        }
        let bounds = self.bounds();
        bounds.connection.check().map_err(WebError::BadInput)?;
        let request_work_max = self.body_bytes_max.max(self.limits().answer_work_bytes_max());
        bounds.work.check(request_work_max).map_err(WebError::BadInput)?;
        if let Some(listen) = self.metrics_listen {
            ops::endpoint::check_exposure(listen, self.metrics_token.is_some())
                .map_err(WebError::BadInput)?;
        }
        Ok(ServerConfig {
            default_model: model,
            exec: ExecConfig {
                limits: self.limits(),
                workers: self.workers,
                queue_depth_max: self.queue_depth_max,
            },
            body_bytes_max: self.body_bytes_max,
            io_threads: self.io_threads,
            bounds,
        })
    }

    fn limits(&self) -> SizeLimits {
        SizeLimits {
            dim_max: self.dim_max,
            cells_max: self.cells_max,
            answer_bytes_max: self.answer_bytes_max,
        }
    }

    fn bounds(&self) -> ServeBounds {
        use std::time::Duration;
        ServeBounds {
            connection: ConnectionBounds {
                header_timeout: Duration::from_millis(self.header_timeout_ms),
                body_timeout: Duration::from_millis(self.body_timeout_ms),
                idle_timeout: Duration::from_millis(self.idle_timeout_ms),
                connections_max: self.connections_max,
                connections_per_address_max: self.connections_per_address_max,
            },
            work: WorkBounds {
                work_bytes_max: self.work_bytes_max,
                large_work_bytes_max: self.large_work_bytes_max,
                connection_work_bytes_max: self.connection_work_bytes_max,
                wait_timeout: Duration::from_millis(self.admission_wait_ms),
            },
        }
    }

    fn child_template(&self, model: Model) -> ChildSpec {
        ChildSpec {
            model,
            cpu: 0,
            pool_threads: self.workers,
            // Nothing split: prefork children ignore it, adaptive ones get the parent's
            // measurement (start_per_core).
            calibration: Calibration { parallel_body_bytes_min: usize::MAX },
            host_counter_fd: -1,
            dealt_channel_fd: None,
            addr: self.listen,
            dim_max: self.dim_max,
            cells_max: self.cells_max,
            answer_bytes_max: self.answer_bytes_max,
            queue_depth_max: self.queue_depth_max,
            body_bytes_max: self.body_bytes_max,
            bounds: self.bounds(),
            metrics_token: self.metrics_token.clone(),
        }
    }
}

/// Largest allocation served from the heap rather than by its own `mmap` (glibc's maximum).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: libc::c_int = 32 << 20;
/// Free memory at the top of a heap kept for reuse instead of returned to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD_BYTES: libc::c_int = 128 << 20;

/// Process-wide: tunes glibc's allocator to keep freed request memory for the next request.
/// Call it once, first thing, in any process that serves or drives matrix requests (the
/// command line does so for every `web` command, the per-core children included).
///
/// A medium request allocates a few hundred KiB (its body, the operands, the product, the
/// answer) and frees it all when answered. With glibc's defaults those blocks were mapped and
/// unmapped, or trimmed off the heap, on every request, and the page faults that refilled them
/// took about 5% of a server core in the profile; these bounds keep the memory for the next
/// request instead (a process keeps its peak working set).
pub fn keep_freed_request_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (option, bytes) in [
        (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
    ] {
        // SAFETY: mallopt only adjusts allocator parameters; it is called before this process
        // serves or drives any request, and a refused value (return 0) leaves the default.
        if unsafe { libc::mallopt(option, bytes) } == 0 {
            tracing::warn!(option, bytes, "mallopt refused an allocator setting");
        }
    }
}

/// Serves until SIGTERM or SIGINT, then drains (see [`serve_in_process`]; per core, each
/// child drains: `Prefork::serve_until_stopped`), or, per core, until a child exits. Per
/// core, each child answers the admin paths for itself on the service port, and
/// `--metrics-listen` shows them all as one server ([`crate::fleet`]). `child_args`: the
/// arguments that make this program run [`crate::prefork::run_child`] (see [`start_per_core`]).
pub fn serve(config: &ServeConfig, child_args: &[OsString]) -> Result<()> {
    let server_config = config.server_config()?;
    let model = server_config.default_model;
    let per_core_adaptive =
        model == Model::Adaptive && config.adaptive_layout == AdaptiveLayout::PerCore;
    if model == Model::Prefork || per_core_adaptive {
        let children = start_per_core(config, model, child_args)?;
        let fleet = Fleet::new(children.admin_addrs().to_vec(), config.metrics_token.clone());
        let endpoint = ops::Endpoint::of(fleet).with_metrics_token(config.metrics_token.clone());
        let _admin = serve_admin(config, endpoint)?;
        println!(
            "serving {} ×{} processes on http://{}/matrix",
            model.name(),
            config.workers,
            children.local_addr()
        );
        return children.serve_until_stopped();
    }
    serve_in_process(config, &server_config)
}

/// One process: the matrix routes plus `/metrics`, `/health` and `/ready` on the service
/// port (and on `--metrics-listen`, when given). On SIGTERM or SIGINT it turns not ready,
/// stops accepting, lets each open connection finish the request it is in (within
/// `ops::stop::DRAIN_TIMEOUT`), logs one summary line and returns.
fn serve_in_process(config: &ServeConfig, server_config: &ServerConfig) -> Result<()> {
    let executors = Executors::start(&Model::IN_PROCESS, &server_config.exec)
        .map_err(io_failed("starting the executors"))?;
    if let Some(calibration) = executors.calibration() {
        println!("{calibration}");
    }
    let router = executors.router(
        server_config.default_model,
        server_config.body_bytes_max,
        &server_config.bounds.work,
    );
    let (mut registry, readiness) = (ops::Registry::default(), ops::Readiness::default());
    executors.register_metrics(&mut registry);
    let endpoint = ops::Endpoint::new(registry, readiness.clone())
        .with_metrics_token(config.metrics_token.clone());
    let router = crate::server::with_admin(router, endpoint.clone());
    let _admin = serve_admin(config, endpoint)?;
    let listen = config.listen;
    let listener =
        std::net::TcpListener::bind(listen).map_err(io_failed(format!("binding {listen}")))?;
    let bound = listener.local_addr().map_err(io_failed("reading the bound address"))?;
    let announce = format!("serving {} on http://{bound}/matrix", config.model);
    let signal = std::sync::Arc::new(std::sync::OnceLock::new());
    let heard = std::sync::Arc::clone(&signal);
    let bounds = server_config.bounds.connection;
    let report = serve_blocking(listener, router, server_config.io_threads, bounds, async move {
        // Announced once the stop signals are heard: a supervisor may stop the server as soon
        // as it reads this line.
        let Ok(stop_signal) = ops::stop::stop_signal() else {
            tracing::error!("cannot listen for SIGTERM; serving until killed");
            return std::future::pending().await;
        };
        println!("{announce}");
        readiness.set(true);
        let _ = heard.set(stop_signal.await);
        readiness.set(false);
        tracing::info!(signal = heard.get().copied(), "stop requested: draining");
    })
    .map_err(io_failed(format!("serving on {bound}")))?;
    let signal = signal.get().copied().unwrap_or("none");
    if !report.drained {
        tracing::warn!(bound = ?ops::stop::DRAIN_TIMEOUT, "drain cut short; open requests were cut");
    }
    tracing::info!(
        signal,
        drained = report.drained,
        connections_open = report.connections_open,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "web server stopped"
    );
    // Not `println!`: the supervisor may have closed the pipe, and the stop goes on.
    let _ = writeln!(std::io::stdout(), "stopped on {signal}");
    Ok(())
}

/// Serves `endpoint` on `--metrics-listen`, when given, from a thread of its own until the
/// handle drops, and says where.
fn serve_admin(
    config: &ServeConfig,
    endpoint: ops::Endpoint,
) -> Result<Option<ops::endpoint::Listening>> {
    let Some(listen) = config.metrics_listen else { return Ok(None) };
    let listening = endpoint.serve(listen)?;
    println!("metrics on http://{}/metrics", listening.addr);
    Ok(Some(listening))
}

/// Starts one pinned process per worker (`prefork` or `adaptive`) by re-executing this binary
/// with `child_args`, the arguments that make it run [`crate::prefork::run_child`] (it finds
/// its role in [`crate::prefork::CHILD_ENV`]); for `adaptive`, calibrates the split size first,
/// here, so the children do not disturb each other's measurements.
///
/// The arguments are the caller's, not this process's own: a program that starts the children
/// from another command (`leantier reproduce` runs the web matrix) would otherwise start
/// children that run that command again instead of serving.
pub fn start_per_core(
    config: &ServeConfig,
    model: Model,
    child_args: &[OsString],
) -> Result<Prefork> {
    let mut template = config.child_template(model);
    if model == Model::Adaptive {
        let calibration = exec::calibrate(config.workers, &config.limits())
            .map_err(io_failed("calibrating the adaptive split"))?;
        println!("{calibration}");
        template.calibration = calibration;
    }
    let exe = std::env::current_exe().map_err(io_failed("finding this program's path"))?;
    Prefork::start(config.listen, config.workers, template, exe, child_args)
}
