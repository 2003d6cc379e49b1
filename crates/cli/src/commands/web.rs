//! `leantier web ...`: serve the matrix service, drive load at it, run the model matrix.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use clap::{Args as ClapArgs, Subcommand};
use ops::config::{load_toml, override_with};
use web::prefork;
use web::serve::{AdaptiveLayout, ServeConfig};
use web::workload::Complexity;

use super::values::{self, one_of};
use super::web_lab as loadlab;
use crate::outcome::BadInput;

/// The REST matrix-multiplication service and its load lab.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve `POST /matrix` (and `/matrix/<model>` for every in-process model), and `GET
    /// /metrics`, `/health`, `/ready` (one process per core: each child for itself; the whole
    /// server on --metrics-listen), until SIGTERM or SIGINT, then drain (docs/OPERATIONS.md).
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
    /// One process of a per-core server (prefork, per-core adaptive): started by its parent
    /// with its role in the environment, never by hand.
    #[command(hide = true)]
    PreforkChild,
}

/// The subcommand path a per-core server's children are started with, whatever command
/// started the server (`web serve`, `web load`, `web matrix`, `reproduce`).
pub const PREFORK_CHILD_COMMAND: [&str; 2] = ["web", "prefork-child"];

/// The parent's `--log` and `--log-format`, which its children log with too.
static CHILD_LOGGING: OnceLock<[String; 2]> = OnceLock::new();

/// Records this process's log settings for the per-core children it may start; `main` calls
/// it once, before any command runs.
pub fn set_child_logging(filter: &str, format: &str) {
    let _ = CHILD_LOGGING.set([filter.to_string(), format.to_string()]);
}

/// The arguments that make this program serve as one per-core child: the parent's log
/// settings, then [`PREFORK_CHILD_COMMAND`].
pub fn prefork_child_args() -> Vec<OsString> {
    let mut args = Vec::new();
    if let Some([filter, format]) = CHILD_LOGGING.get() {
        args.extend(["--log", filter, "--log-format", format].map(OsString::from));
    }
    args.extend(PREFORK_CHILD_COMMAND.map(OsString::from));
    args
}

#[derive(Debug, ClapArgs)]
pub struct ServeArgs {
    /// TOML file with any of the fields below (snake_case; a duration in milliseconds under its
    /// name with _ms: header_timeout_ms); flags override it.
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
    #[arg(long, value_parser = one_of(&AdaptiveLayout::ALL, AdaptiveLayout::name))]
    pub adaptive_layout: Option<AdaptiveLayout>,
    /// Time from a request's first byte to the end of its header; the connection is closed
    /// after that [default: 10s].
    #[arg(
        long,
        alias = "header-timeout-ms",
        value_name = "DURATION",
        value_parser = values::millis
    )]
    pub header_timeout: Option<Duration>,
    /// Time from the first read of a body to its end; 408 (code 013) after that
    /// [default: 12s].
    #[arg(long, alias = "body-timeout-ms", value_name = "DURATION", value_parser = values::millis)]
    pub body_timeout: Option<Duration>,
    /// Time a connection may wait for a request (keep-alive) before it is closed
    /// [default: 60s].
    #[arg(long, alias = "idle-timeout-ms", value_name = "DURATION", value_parser = values::millis)]
    pub idle_timeout: Option<Duration>,
    /// Connections served at once per process; one more gets 503 (code 010) [default: 512].
    #[arg(long)]
    pub connections_max: Option<usize>,
    /// Work bytes in flight per process over requests of up to 1 MiB of work (a request's work
    /// is its body, or its product and predicted answer when larger, held until the answer is
    /// written); beyond, requests wait, then get 503 (code 009) [default: 64 MiB].
    #[arg(long)]
    pub work_bytes_max: Option<usize>,
    /// Work bytes in flight per process over requests of more than 1 MiB of work (at least
    /// --body-bytes-max) [default: 16 MiB].
    #[arg(long)]
    pub large_work_bytes_max: Option<usize>,
    /// Time a request waits for room within the work bounds before 503 (code 009)
    /// [default: 5s].
    #[arg(
        long,
        alias = "admission-wait-ms",
        value_name = "DURATION",
        value_parser = values::millis
    )]
    pub admission_wait: Option<Duration>,
    /// Connections one source address may hold at once; one more gets 503 (code 010)
    /// [default: 256].
    #[arg(long)]
    pub connections_per_address_max: Option<usize>,
    /// Work bytes one connection may hold at once (its request and its answers not yet
    /// written); past it 503 (code 009) at once [default: 16 MiB].
    #[arg(long)]
    pub connection_work_bytes_max: Option<usize>,
    /// Largest answer, predicted from the shapes before anything is computed; larger ones get
    /// 422 (code 014) [default: 8 MiB].
    #[arg(long)]
    pub answer_bytes_max: Option<usize>,
    /// Serve `/metrics`, `/health` and `/ready` on this address too (a bare port:
    /// 127.0.0.1:PORT), from a thread of its own. With one process per core (prefork,
    /// per-core adaptive) this is the whole server's view: every child's series labelled
    /// `worker="N"` next to the parent's `process_*`, and `/ready` 200 only while every child
    /// is ready. An address other than loopback needs --metrics-token.
    #[arg(long, value_parser = super::admin::metrics_address)]
    pub metrics_listen: Option<SocketAddr>,
    /// The bearer token `GET /metrics` requires (`/health` and `/ready` stay open); without
    /// one `/metrics` is open to whoever reaches the port.
    #[arg(long, env = "LEANTIER_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Print the effective configuration (--config with the flags over it) as the TOML
    /// --config reads, and exit.
    #[arg(long)]
    pub print_config: bool,
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
        let millis = |flag: Option<Duration>| flag.map(values::whole_millis);
        override_with(&mut config.header_timeout_ms, &millis(self.header_timeout));
        override_with(&mut config.body_timeout_ms, &millis(self.body_timeout));
        override_with(&mut config.idle_timeout_ms, &millis(self.idle_timeout));
        override_with(&mut config.connections_max, &self.connections_max);
        override_with(&mut config.work_bytes_max, &self.work_bytes_max);
        override_with(&mut config.large_work_bytes_max, &self.large_work_bytes_max);
        override_with(&mut config.admission_wait_ms, &millis(self.admission_wait));
        override_with(&mut config.connections_per_address_max, &self.connections_per_address_max);
        override_with(&mut config.connection_work_bytes_max, &self.connection_work_bytes_max);
        override_with(&mut config.answer_bytes_max, &self.answer_bytes_max);
        config.metrics_listen = self.metrics_listen.or(config.metrics_listen);
        if self.metrics_token.is_some() {
            config.metrics_token = self.metrics_token.clone();
        }
        Ok(config)
    }
}

#[derive(Debug, ClapArgs)]
pub struct BodyArgs {
    /// Complexity level of the request.
    #[arg(long, value_parser = one_of(&Complexity::ALL, Complexity::name), default_value = "low")]
    pub complexity: Complexity,
}

/// Runs a `leantier web` command.
pub fn run(args: &Args) -> anyhow::Result<()> {
    // Process-wide, and first: every web command serves or drives matrix requests.
    web::serve::keep_freed_request_memory();
    match &args.command {
        Command::PreforkChild => {
            let Some(spec) = prefork::child_spec_from_env()? else {
                return Err(BadInput(format!(
                    "`leantier web prefork-child` is started by a per-core server (`web serve \
                     --model prefork`), with its role in {}",
                    prefork::CHILD_ENV
                ))
                .into());
            };
            Ok(prefork::run_child(&spec)?)
        }
        Command::Serve(serve) if serve.print_config => {
            print!("{}", toml::to_string(&serve.resolve()?)?);
            Ok(())
        }
        Command::Serve(serve) => Ok(web::serve::serve(&serve.resolve()?, &prefork_child_args())?),
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
        let error = bogus.server_config().unwrap_err();
        assert!(matches!(error, web::WebError::BadInput(_)), "{error}");
        let zero = ServeConfig { workers: 0, ..ServeConfig::default() };
        assert!(zero.server_config().unwrap_err().to_string().contains("workers"));
        let no_idle = ServeConfig { idle_timeout_ms: 0, ..ServeConfig::default() };
        assert!(crate::outcome::is_bad_input(&no_idle.server_config().unwrap_err().into()));
        let narrow_lane = ServeConfig { large_work_bytes_max: 1 << 20, ..ServeConfig::default() };
        let error = narrow_lane.server_config().unwrap_err().to_string();
        assert!(error.contains("large_work_bytes_max"), "{error}");
        let open = ServeConfig {
            metrics_listen: Some(([0, 0, 0, 0], 9464).into()),
            ..ServeConfig::default()
        };
        assert!(crate::outcome::is_bad_input(&open.server_config().unwrap_err().into()));
        let guarded = ServeConfig { metrics_token: Some("t".into()), ..open };
        assert!(guarded.server_config().is_ok());
    }
}
