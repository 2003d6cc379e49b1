//! `leantier web ...`: serve the matrix service, drive load at it, run the model matrix.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args as ClapArgs, Subcommand};
use lab::config::{load_toml, override_with};
use lab::outcome::BadInput;
use serde::Deserialize;

use crate::admission::WorkBounds;
use crate::api::{CELLS_MAX_DEFAULT, DIM_MAX_DEFAULT, SizeLimits};
use crate::conn::ConnectionBounds;
use crate::exec::{self, Calibration, ExecConfig, Model, QUEUE_DEPTH_MAX_DEFAULT};
use crate::loadlab;
use crate::prefork::{self, ChildSpec, Prefork};
use crate::server::{BODY_BYTES_MAX_DEFAULT, Executors, ServeBounds, ServerConfig, serve_blocking};
use crate::workload::Complexity;

/// The REST matrix-multiplication service and its load lab.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve `POST /matrix` (and `/matrix/<model>` for every in-process model) until stopped.
    Serve(ServeArgs),
    /// Drive one load cell (closed-loop users or open-loop constant rate) at a server.
    Load(loadlab::LoadArgs),
    /// Run the full {model} × {users} × {complexity} matrix (and the Python baseline when
    /// given) in one run; print a table, write a report folder with SVG plots.
    Matrix(loadlab::MatrixArgs),
    /// Print one request body of a complexity level (for curl, wrk or other tools).
    Body(BodyArgs),
    /// Print the median of paired throughput ratios (ours / peer, run by run) and its 95%
    /// interval, for scripts that run a peer tool alternately with leantier.
    Ratio(loadlab::RatioArgs),
}

/// Where the `adaptive` model runs when served alone (`serve --model adaptive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
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

/// Server settings; every field can come from `--config FILE` (TOML) and be overridden by flags.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    pub model: String,
    pub workers: usize,
    pub queue_depth_max: usize,
    pub body_bytes_max: usize,
    pub dim_max: usize,
    pub cells_max: usize,
    pub io_threads: usize,
    pub adaptive_layout: AdaptiveLayout,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub connections_max: usize,
    pub work_bytes_max: usize,
    pub large_work_bytes_max: usize,
    pub admission_wait_ms: u64,
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
            io_threads: cpus,
            adaptive_layout: AdaptiveLayout::default(),
            header_timeout_ms: millis(connection.header_timeout),
            body_timeout_ms: millis(connection.body_timeout),
            idle_timeout_ms: millis(connection.idle_timeout),
            connections_max: connection.connections_max,
            work_bytes_max: work.work_bytes_max,
            large_work_bytes_max: work.large_work_bytes_max,
            admission_wait_ms: millis(work.wait_timeout),
        }
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl ServeConfig {
    /// The validated server configuration.
    pub fn server_config(&self) -> anyhow::Result<ServerConfig> {
        let model = parse_model(&self.model)?;
        let positive = [
            ("workers", self.workers),
            ("queue_depth_max", self.queue_depth_max),
            ("body_bytes_max", self.body_bytes_max),
            ("dim_max", self.dim_max),
            ("cells_max", self.cells_max),
            ("io_threads", self.io_threads),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, value)| *value == 0) {
            return Err(BadInput(format!("{name} must be > 0")).into());
        }
        let bounds = self.bounds();
        bounds.connection.check().map_err(BadInput)?;
        bounds.work.check(self.body_bytes_max).map_err(BadInput)?;
        Ok(ServerConfig {
            default_model: model,
            exec: ExecConfig {
                limits: SizeLimits { dim_max: self.dim_max, cells_max: self.cells_max },
                workers: self.workers,
                queue_depth_max: self.queue_depth_max,
            },
            body_bytes_max: self.body_bytes_max,
            io_threads: self.io_threads,
            bounds,
        })
    }

    fn bounds(&self) -> ServeBounds {
        use std::time::Duration;
        ServeBounds {
            connection: ConnectionBounds {
                header_timeout: Duration::from_millis(self.header_timeout_ms),
                body_timeout: Duration::from_millis(self.body_timeout_ms),
                idle_timeout: Duration::from_millis(self.idle_timeout_ms),
                connections_max: self.connections_max,
            },
            work: WorkBounds {
                work_bytes_max: self.work_bytes_max,
                large_work_bytes_max: self.large_work_bytes_max,
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
            queue_depth_max: self.queue_depth_max,
            body_bytes_max: self.body_bytes_max,
            bounds: self.bounds(),
        }
    }
}

fn parse_model(name: &str) -> anyhow::Result<Model> {
    <Model as clap::ValueEnum>::from_str(name, true).map_err(|_| {
        BadInput(format!("unknown model {name:?}: use single, pool, pinned, prefork or adaptive"))
            .into()
    })
}

#[derive(Debug, ClapArgs)]
pub struct ServeArgs {
    /// TOML file with any of the fields below (snake_case); flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Model behind `POST /matrix`: single, pool, pinned, prefork or adaptive [default: adaptive];
    /// prefork (and adaptive with `--adaptive-layout per-core`) run one pinned process per
    /// worker sharing the port.
    #[arg(long)]
    pub model: Option<String>,
    /// Worker threads (pool, pinned, adaptive) or processes (prefork, per-core adaptive)
    /// [default: allowed CPUs].
    #[arg(long)]
    pub workers: Option<usize>,
    /// Requests admitted per model (waiting, plus running for pool/adaptive); 503 beyond.
    #[arg(long)]
    pub queue_depth_max: Option<usize>,
    /// Largest request body in bytes; larger ones get code 007 (HTTP 413).
    #[arg(long)]
    pub body_bytes_max: Option<usize>,
    /// Largest row or column count of any matrix; larger ones get code 006 (HTTP 422).
    #[arg(long)]
    pub dim_max: Option<usize>,
    /// Largest cell count of any matrix; larger ones get code 006 (HTTP 422).
    #[arg(long)]
    pub cells_max: Option<usize>,
    /// Tokio reactor threads [default: allowed CPUs].
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// Layout of `--model adaptive`: one process (shared) or one process per core (per-core)
    /// [default: shared].
    #[arg(long, value_enum)]
    pub adaptive_layout: Option<AdaptiveLayout>,
    /// Milliseconds from a request's first byte to the end of its header; the connection is
    /// closed after that [default: 10000].
    #[arg(long)]
    pub header_timeout_ms: Option<u64>,
    /// Milliseconds from the first read of a body to its end; 408 (code 013) after that
    /// [default: 12000].
    #[arg(long)]
    pub body_timeout_ms: Option<u64>,
    /// Milliseconds a connection may wait for a request (keep-alive) before it is closed
    /// [default: 60000].
    #[arg(long)]
    pub idle_timeout_ms: Option<u64>,
    /// Connections served at once per process; one more gets 503 (code 010) [default: 512].
    #[arg(long)]
    pub connections_max: Option<usize>,
    /// Body bytes in flight per process over bodies up to 1 MiB; beyond, requests wait, then
    /// get 503 (code 009) [default: 64 MiB].
    #[arg(long)]
    pub work_bytes_max: Option<usize>,
    /// Body bytes in flight per process over bodies above 1 MiB (at least --body-bytes-max)
    /// [default: 16 MiB].
    #[arg(long)]
    pub large_work_bytes_max: Option<usize>,
    /// Milliseconds a request waits for room within the work bounds before 503 (code 009)
    /// [default: 5000].
    #[arg(long)]
    pub admission_wait_ms: Option<u64>,
}

impl ServeArgs {
    fn resolve(&self) -> anyhow::Result<ServeConfig> {
        let mut config: ServeConfig = load_toml(self.config.as_deref())?;
        override_with(&mut config.listen, &self.listen);
        override_with(&mut config.model, &self.model);
        override_with(&mut config.workers, &self.workers);
        override_with(&mut config.queue_depth_max, &self.queue_depth_max);
        override_with(&mut config.body_bytes_max, &self.body_bytes_max);
        override_with(&mut config.dim_max, &self.dim_max);
        override_with(&mut config.cells_max, &self.cells_max);
        override_with(&mut config.io_threads, &self.io_threads);
        override_with(&mut config.adaptive_layout, &self.adaptive_layout);
        override_with(&mut config.header_timeout_ms, &self.header_timeout_ms);
        override_with(&mut config.body_timeout_ms, &self.body_timeout_ms);
        override_with(&mut config.idle_timeout_ms, &self.idle_timeout_ms);
        override_with(&mut config.connections_max, &self.connections_max);
        override_with(&mut config.work_bytes_max, &self.work_bytes_max);
        override_with(&mut config.large_work_bytes_max, &self.large_work_bytes_max);
        override_with(&mut config.admission_wait_ms, &self.admission_wait_ms);
        Ok(config)
    }
}

#[derive(Debug, ClapArgs)]
pub struct BodyArgs {
    /// Complexity level of the request.
    #[arg(long, value_enum, default_value = "low")]
    pub complexity: Complexity,
}

/// Runs a `leantier web` command. A process started as a prefork child (see
/// [`prefork::CHILD_ENV`]) serves as that child whatever the command line says.
pub fn run(args: &Args) -> anyhow::Result<()> {
    keep_freed_request_memory();
    if let Some(spec) = prefork::child_spec_from_env()? {
        return prefork::run_child(&spec);
    }
    match &args.command {
        Command::Serve(serve) => run_serve(&serve.resolve()?),
        Command::Load(load) => loadlab::run_load(load),
        Command::Matrix(matrix) => loadlab::run_matrix(matrix),
        Command::Ratio(ratio) => loadlab::run_ratio(ratio),
        Command::Body(body) => {
            let body = body.complexity.shape().request_body(1, 1);
            println!("{}", String::from_utf8_lossy(&body));
            Ok(())
        }
    }
}

/// Largest allocation served from the heap rather than by its own `mmap` (glibc's maximum).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_BYTES: libc::c_int = 32 << 20;
/// Free memory at the top of a heap kept for reuse instead of returned to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD_BYTES: libc::c_int = 128 << 20;

/// A medium request allocates a few hundred KiB (its body, the operands, the product, the
/// answer) and frees it all when answered. With glibc's defaults those blocks were mapped and
/// unmapped, or trimmed off the heap, on every request, and the page faults that refilled them
/// took about 5% of a server core in the profile; these bounds keep the memory for the next
/// request instead (a process keeps its peak working set).
fn keep_freed_request_memory() {
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

fn run_serve(config: &ServeConfig) -> anyhow::Result<()> {
    let server_config = config.server_config()?;
    let model = server_config.default_model;
    let per_core_adaptive =
        model == Model::Adaptive && config.adaptive_layout == AdaptiveLayout::PerCore;
    if model == Model::Prefork || per_core_adaptive {
        let children = start_per_core(config, model)?;
        println!(
            "serving {} ×{} processes on http://{}/matrix",
            model.name(),
            config.workers,
            children.local_addr()
        );
        return children.wait_any();
    }
    let executors = Executors::start(&Model::IN_PROCESS, &server_config.exec)?;
    if let Some(calibration) = executors.calibration() {
        println!("{calibration}");
    }
    let router = executors.router(
        server_config.default_model,
        server_config.body_bytes_max,
        &server_config.bounds.work,
    );
    let listener = std::net::TcpListener::bind(config.listen)?;
    println!("serving {} on http://{}/matrix", config.model, listener.local_addr()?);
    let bounds = server_config.bounds.connection;
    serve_blocking(listener, router, server_config.io_threads, bounds, async {
        // Ctrl-C (or a failure to install the handler) ends the server gracefully.
        let _ = tokio::signal::ctrl_c().await;
    })?;
    Ok(())
}

/// Starts one pinned process per worker (`prefork` or `adaptive`) by re-executing this binary
/// with this process's arguments; for `adaptive`, calibrates the split size first,
/// here, so the children do not disturb each other's measurements.
pub fn start_per_core(config: &ServeConfig, model: Model) -> anyhow::Result<Prefork> {
    let mut template = config.child_template(model);
    if model == Model::Adaptive {
        let limits = SizeLimits { dim_max: config.dim_max, cells_max: config.cells_max };
        let calibration = exec::calibrate(config.workers, &limits)?;
        println!("{calibration}");
        template.calibration = calibration;
    }
    let exe = std::env::current_exe()?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    Prefork::start(config.listen, config.workers, template, exe, &args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[test]
    fn defaults_parse_and_cover_the_study() {
        Cli::command().debug_assert();
        let Command::Matrix(matrix) = Cli::try_parse_from(["web", "matrix"]).unwrap().command
        else {
            panic!("matrix parses as Matrix");
        };
        assert_eq!(matrix.complexity, Complexity::ALL.to_vec());
        assert_eq!(matrix.users, vec![10, 30, 60]);
        assert_eq!(matrix.models.len(), 5);
        let Command::Load(load) = Cli::try_parse_from(["web", "load"]).unwrap().command else {
            panic!("load parses as Load");
        };
        assert_eq!(load.complexity, Complexity::Medium600);
    }

    #[test]
    fn adaptive_layout_parses_and_refuses_unknown_names() {
        let Command::Serve(serve) =
            Cli::try_parse_from(["web", "serve", "--adaptive-layout", "per-core"]).unwrap().command
        else {
            panic!("serve parses as Serve");
        };
        assert_eq!(serve.resolve().unwrap().adaptive_layout, AdaptiveLayout::PerCore);
        let unknown = Cli::try_parse_from(["web", "serve", "--adaptive-layout", "bogus"]);
        assert!(unknown.is_err_and(|error| error.to_string().contains("bogus")));
    }

    #[test]
    fn invalid_settings_are_bad_input() {
        let bogus = ServeConfig { model: "bogus".into(), ..ServeConfig::default() };
        assert!(bogus.server_config().unwrap_err().downcast_ref::<BadInput>().is_some());
        let zero = ServeConfig { workers: 0, ..ServeConfig::default() };
        assert!(zero.server_config().unwrap_err().to_string().contains("workers"));
        let no_idle = ServeConfig { idle_timeout_ms: 0, ..ServeConfig::default() };
        assert!(no_idle.server_config().unwrap_err().downcast_ref::<BadInput>().is_some());
        let narrow_lane = ServeConfig { large_work_bytes_max: 1 << 20, ..ServeConfig::default() };
        let error = narrow_lane.server_config().unwrap_err().to_string();
        assert!(error.contains("large_work_bytes_max"), "{error}");
    }
}
