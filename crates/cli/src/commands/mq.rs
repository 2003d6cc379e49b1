//! `leantier mq ...`: serve a node, talk to one, load it, benchmark it.

use std::path::PathBuf;
use std::time::Duration;

use super::timeouts::TimeoutFlags;
use super::values::{self, one_of};
use crate::outcome::{BadInput, TargetMissed};
use anyhow::Context;
use clap::{Args as ClapArgs, Parser, Subcommand};
use ops::config::{load_toml, override_with};

use experiments::{mq_bench as bench, mq_experiment as experiment, mq_load as load};
use mq::client::Client;
use mq::protocol::{ReadMode, ReadTarget};
use mq::{server, store};

/// Message-queuing middleware: nodes, clients, load generator, benchmarks.
#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a middleware node until SIGTERM or SIGINT, then drain it (docs/OPERATIONS.md).
    Serve(ServeArgs),
    /// Talk to a node: one operation from the command line, or a script (`--script FILE`, `-`
    /// for stdin: one operation per line, as the subcommands below).
    Client(ClientArgs),
    /// Closed-loop load test against running nodes, with analysis and sanity checks.
    Load(LoadArgs),
    /// Same-run throughput of leantier mq vs plain one-row-per-transaction SQL.
    Bench(BenchArgs),
    /// A standard experiment (clients sweep, scale-up vs scale-out, message size, 2^2·r
    /// factorial) with in-process nodes over one store.
    Experiment(ExperimentArgs),
}

/// Node limits; each flag overrides the matching field of `--config`.
#[derive(ClapArgs, Debug, Clone)]
pub struct NodeFlags {
    /// TOML file with NodeConfig fields: every flag below by its name with underscores
    /// (handler_slots, connections_per_address_max, ...; a duration in milliseconds under its
    /// name with _ms: idle_timeout_ms), and lease_ms_max.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Requests served concurrently (handler pool size).
    #[arg(long)]
    pub handler_slots: Option<usize>,
    /// Requests that may wait for a handler slot before the node answers Busy.
    #[arg(long)]
    pub wait_queue_max: Option<usize>,
    /// Database workers (= database connections in use at once).
    #[arg(long)]
    pub db_workers: Option<usize>,
    /// Most requests committed per transaction; 1 turns group commit off.
    #[arg(long)]
    pub batch_max: Option<usize>,
    /// Largest message content in bytes.
    #[arg(long)]
    pub content_bytes_max: Option<usize>,
    /// Connections served at once; more are answered ConnectionLimit and closed (default 1024).
    #[arg(long)]
    pub connections_max: Option<usize>,
    /// Close a connection that sends no complete request for this long while no reply is owed
    /// to it, e.g. 60s (the default).
    #[arg(long, alias = "idle-timeout-ms", value_name = "DURATION", value_parser = values::millis)]
    pub idle_timeout: Option<Duration>,
    /// Close a connection that does not take a reply for this long, e.g. 10s (the default).
    #[arg(long, alias = "write-timeout-ms", value_name = "DURATION", value_parser = values::millis)]
    pub write_timeout: Option<Duration>,
    /// Bytes all connections' partly received frames may hold together (default 64 MiB).
    #[arg(long)]
    pub frame_memory_bytes_max: Option<usize>,
    /// Bytes all replies owed to clients (committed, not yet written) may hold together; a
    /// request whose largest possible reply does not fit is answered Busy before the database
    /// sees it, so nothing dequeued is dropped (default 64 MiB).
    #[arg(long)]
    pub reply_memory_bytes_max: Option<usize>,
    /// Connections one source address (an IPv4 address, an IPv6 /64) may hold at once
    /// (default: half of --connections-max).
    #[arg(long)]
    pub connections_per_address_max: Option<usize>,
    /// Bytes of --frame-memory-bytes-max set aside for each connection, which no other can
    /// take (default two frame chunks).
    #[arg(long)]
    pub frame_memory_reserved_bytes: Option<usize>,
    /// Bytes of --reply-memory-bytes-max set aside for each connection, which no other can
    /// take (default 16 KiB).
    #[arg(long)]
    pub reply_memory_reserved_bytes: Option<usize>,
    /// Threads running the node's connections and database workers (default 1: a request's
    /// hand-offs then wake no other thread; docs/benchmarks/mq.md).
    #[arg(long)]
    pub io_threads: Option<usize>,
    /// Poll the sockets instead of sleeping when idle: a lone request is read without waking
    /// the node's thread, one CPU kept busy (needs --io-threads 1, the default, and 2 usable
    /// CPUs; overrides the config's busy_poll; default false).
    #[arg(long)]
    pub busy_poll: bool,
    /// Threads hashing registration secrets (Argon2id, 19 MiB each once used; default 2).
    #[arg(long)]
    pub hashing_threads: Option<usize>,
    /// Registrations that may wait for a hashing thread; more are answered Busy (default 64).
    #[arg(long)]
    pub hashing_queue_max: Option<usize>,
    /// The window of the per-address registration bounds, e.g. 60s (the default).
    #[arg(
        long,
        alias = "registration-window-ms",
        value_name = "DURATION",
        value_parser = values::millis
    )]
    pub registration_window: Option<Duration>,
    /// Registrations one source address may attempt per window; more are Busy, unhashed
    /// (default 2048).
    #[arg(long)]
    pub registration_attempts_per_address_max: Option<usize>,
    /// Accounts (new names) one source address may create per window (default 1024).
    #[arg(long)]
    pub accounts_per_address_max: Option<usize>,
    /// PostgreSQL's message table, made so at start: logged (durable) or unlogged (no
    /// write-ahead log, like pgmq's unlogged queues: a PostgreSQL crash empties it;
    /// docs/MQ_PROTOCOL.md). Unset: as the database has it. SQLite refuses unlogged.
    #[arg(long, value_parser = one_of(&store::MessageTable::ALL, store::MessageTable::name))]
    pub message_table: Option<store::MessageTable>,
}

/// Where `mq serve` listens and stores unless a flag or its file says otherwise.
const LISTEN_DEFAULT: &str = "127.0.0.1:7440";
const STORE_DEFAULT: &str = "sqlite:target/mq-data";

/// A `--config` file: the node's limits and, for `mq serve`, where it listens and stores
/// (docs/OPERATIONS.md: a file's keys are the flags' names); `--print-config` writes one.
#[derive(Debug, Default, serde::Serialize)]
pub struct NodeFile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Every other key.
    #[serde(flatten)]
    pub node: server::NodeConfig,
}

impl NodeFile {
    /// Reads a `--config` file; `None` gives the defaults. `listen` and `store` are taken out
    /// first so that `NodeConfig` still refuses every key it does not know (serde's `flatten`
    /// would let them all through).
    fn read(path: Option<&std::path::Path>) -> anyhow::Result<NodeFile> {
        let mut table: toml::Table = load_toml(path)?;
        let mut take = |key: &str| match table.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(value)) => Ok(Some(value)),
            Some(other) => Err(BadInput(format!("config key {key} must be a string, got {other}"))),
        };
        let (listen, store) = (take("listen")?, take("store")?);
        let node = toml::Value::Table(table).try_into().map_err(|error| {
            let file = path.map_or_else(String::new, |path| path.display().to_string());
            BadInput(format!("invalid config {file}: {error}"))
        })?;
        Ok(NodeFile { listen, store, node })
    }
}

impl NodeFlags {
    /// The node's limits for `mq bench` and `mq experiment`, which take their store as a flag
    /// and listen on no address of their own.
    fn resolve(&self) -> anyhow::Result<server::NodeConfig> {
        let file = self.resolve_file()?;
        if file.listen.is_some() || file.store.is_some() {
            let why = "listen and store are mq serve's keys; this command takes --store";
            return Err(BadInput(why.into()).into());
        }
        Ok(file.node)
    }

    /// The `--config` file with the flags over its node limits.
    fn resolve_file(&self) -> anyhow::Result<NodeFile> {
        let mut file = NodeFile::read(self.config.as_deref())?;
        let c = &mut file.node;
        override_with(&mut c.handler_slots, &self.handler_slots);
        override_with(&mut c.wait_queue_max, &self.wait_queue_max);
        override_with(&mut c.db_workers, &self.db_workers);
        override_with(&mut c.batch_max, &self.batch_max);
        override_with(&mut c.content_bytes_max, &self.content_bytes_max);
        override_with(&mut c.connections_max, &self.connections_max);
        override_with(&mut c.idle_timeout_ms, &self.idle_timeout.map(values::whole_millis));
        override_with(&mut c.write_timeout_ms, &self.write_timeout.map(values::whole_millis));
        override_with(&mut c.frame_memory_bytes_max, &self.frame_memory_bytes_max);
        override_with(&mut c.reply_memory_bytes_max, &self.reply_memory_bytes_max);
        override_with(&mut c.connections_per_address_max, &self.connections_per_address_max);
        override_with(&mut c.frame_memory_reserved_bytes, &self.frame_memory_reserved_bytes);
        override_with(&mut c.reply_memory_reserved_bytes, &self.reply_memory_reserved_bytes);
        override_with(&mut c.io_threads, &self.io_threads);
        c.busy_poll |= self.busy_poll;
        override_with(&mut c.hashing_threads, &self.hashing_threads);
        override_with(&mut c.hashing_queue_max, &self.hashing_queue_max);
        let window = self.registration_window.map(values::whole_millis);
        override_with(&mut c.registration_window_ms, &window);
        let attempts = &self.registration_attempts_per_address_max;
        override_with(&mut c.registration_attempts_per_address_max, attempts);
        override_with(&mut c.accounts_per_address_max, &self.accounts_per_address_max);
        override_with(&mut c.message_table, &self.message_table.map(Some));
        c.validate()?;
        Ok(file)
    }
}

#[derive(ClapArgs, Debug)]
pub struct ServeArgs {
    /// Address to listen on (`listen` in --config) [default: 127.0.0.1:7440].
    #[arg(long)]
    pub listen: Option<String>,
    /// `sqlite:DIR` (embedded) or a `postgres://` URL (`store` in --config)
    /// [default: sqlite:target/mq-data].
    #[arg(long)]
    pub store: Option<String>,
    /// Serve TLS with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    #[command(flatten)]
    pub metrics: super::admin::MetricsFlags,
    #[command(flatten)]
    pub node: NodeFlags,
    /// Print the effective node configuration (--config with the flags over it) as the TOML
    /// --config reads, and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(ClapArgs, Debug)]
pub struct ClientArgs {
    /// Node address.
    #[arg(long, default_value = "127.0.0.1:7440")]
    pub node: String,
    /// Client name to register as (the node gives it an id).
    #[arg(long, default_value = "cli")]
    pub name: String,
    /// The name's secret: the first registration of a name sets it, later ones must match.
    #[arg(long, env = "LEANTIER_MQ_SECRET", hide_env_values = true)]
    pub secret: String,
    /// Connect with TLS, trusting the CA certificates in this PEM file.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Name to check the node's certificate against (default: the host part of --node).
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// Run the operations in FILE (`-` = stdin), one per line; `#` starts a comment.
    #[arg(long)]
    pub script: Option<PathBuf>,
    #[command(flatten)]
    pub timeouts: TimeoutFlags,
    #[command(subcommand)]
    pub op: Option<ClientOp>,
}

/// The client library's bounds from the shared flags.
fn timeouts_of(flags: &TimeoutFlags) -> anyhow::Result<mq::client::Timeouts> {
    let [connect, request, idle] = flags.bounds()?;
    Ok(mq::client::Timeouts { connect, request, idle })
}

/// One client operation (also the syntax of a script line).
#[derive(Subcommand, Debug, Clone)]
pub enum ClientOp {
    /// Create a queue.
    CreateQueue { name: String },
    /// Delete a queue (refused while it holds messages unless --purge).
    DeleteQueue {
        name: String,
        /// Delete its messages too.
        #[arg(long)]
        purge: bool,
    },
    /// Send a message.
    Send {
        queue: String,
        /// Receiver's client id (default: anyone).
        #[arg(long)]
        to: Option<u64>,
        /// Content (joined with spaces).
        #[arg(required = true)]
        content: Vec<String>,
    },
    /// Remove and print the oldest message of a queue readable by me.
    Pop { queue: String },
    /// Print the oldest message of a queue readable by me.
    Peek { queue: String },
    /// Remove and print the oldest message addressed to me.
    PopMine(MineFilter),
    /// Print the oldest message addressed to me.
    PeekMine(MineFilter),
    /// Lease the oldest message of a queue (it reappears unless acked within the lease).
    Lease {
        queue: String,
        /// Lease length, e.g. 30s (at most the protocol's 49 days).
        #[arg(
            long = "lease",
            alias = "lease-ms",
            value_name = "DURATION",
            value_parser = lease_millis,
            default_value = "30s"
        )]
        lease_ms: u32,
    },
    /// Acknowledge (delete) a leased message.
    Ack { message_id: u64 },
    /// List the queues holding messages for me.
    List,
}

#[derive(ClapArgs, Debug, Clone)]
pub struct MineFilter {
    /// Only from this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only from this sender id.
    #[arg(long)]
    pub from: Option<u64>,
}

/// A script line parsed by clap with the same syntax as the subcommands.
#[derive(Parser, Debug)]
#[command(no_binary_name = true)]
struct ScriptLine {
    #[command(subcommand)]
    op: ClientOp,
}

#[derive(ClapArgs, Debug)]
pub struct LoadArgs {
    /// TOML file with LoadConfig fields; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    // The defaults below are LoadConfig's (--config's file sits between them and the flags);
    // the test `mq_load_help_shows_the_config_defaults` keeps the texts and the values equal.
    /// Node address; repeat for several nodes [default: 127.0.0.1:7440].
    #[arg(long = "node")]
    pub nodes: Vec<String>,
    /// Closed-loop clients [default: 32].
    #[arg(long)]
    pub clients: Option<usize>,
    /// TCP connections the clients share [default: 32].
    #[arg(long)]
    pub connections: Option<usize>,
    /// Percentage of sends (the rest pop the same queue) [default: 50].
    #[arg(long)]
    pub send_percent: Option<u32>,
    /// Message content size in bytes [default: 1000].
    #[arg(long)]
    pub message_bytes: Option<usize>,
    /// Think time between a reply and the next request, e.g. 5ms [default: 0ms].
    #[arg(long, alias = "think-ms", value_name = "DURATION", value_parser = values::millis)]
    pub think: Option<Duration>,
    /// Total run time, warm-up and cool-down included: at least --warmup + --cooldown + 1s
    /// [default: 10s].
    #[arg(long, alias = "duration-s", value_name = "DURATION", value_parser = values::seconds)]
    pub duration: Option<Duration>,
    /// Untimed start, inside --duration [default: 2s].
    #[arg(long, alias = "warmup-s", value_name = "DURATION", value_parser = values::seconds)]
    pub warmup: Option<Duration>,
    /// Untimed end, inside --duration [default: 1s].
    #[arg(long, alias = "cooldown-s", value_name = "DURATION", value_parser = values::seconds)]
    pub cooldown: Option<Duration>,
    /// Report folder: JSON, CSV, Markdown and an SVG latency CDF.
    #[arg(long, alias = "report", default_value = "leantier-report/mq-load")]
    pub out: PathBuf,
    /// Exit with the target-missed code when the sanity checks fail.
    #[arg(long)]
    pub check: bool,
    #[command(flatten)]
    pub timeouts: TimeoutFlags,
    /// Print the result as one JSON line on stdout instead of the tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(ClapArgs, Debug)]
pub struct BenchArgs {
    /// `sqlite:DIR` or a `postgres://` URL (e.g. $LEANTIER_PG_URL).
    #[arg(long)]
    pub store: String,
    /// Concurrent clients (and baseline connections).
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Time per measured phase, e.g. 5s.
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "5s"
    )]
    pub duration: Duration,
    /// Message content size in bytes.
    #[arg(long, default_value_t = 1000)]
    pub content_bytes: usize,
    /// Sends per transaction in the embedded SQLite measurement.
    #[arg(long, default_value_t = 1024)]
    pub embedded_batch: usize,
    /// Requests each leantier client keeps in flight (pipelined on its connection) in the
    /// second node measurement, and messages per call of the peers' batch statements; the
    /// first measurements always run with 1 (one request per round trip).
    #[arg(long, default_value_t = 64)]
    pub window: usize,
    /// Sends per SendBatch frame in the node's third measurement (`--window` sends in flight
    /// per client, one request frame and one reply frame per this many messages); 1 skips it.
    #[arg(long, default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=mq::protocol::SEND_BATCH_MAX as i64))]
    pub send_batch: u16,
    /// Exit with the target-missed code when embedded SQLite stays under 100K sends/s.
    #[arg(long)]
    pub check: bool,
    /// pgmq's install SQL (src/install/embedded/sql/pgmq.sql of the crates.io `pgmq` crate) to
    /// measure pgmq on the same database (PostgreSQL stores only).
    #[arg(long)]
    pub pgmq_sql: Option<PathBuf>,
    /// Report folder: the rows as JSON, CSV and Markdown.
    #[arg(long, default_value = "leantier-report/mq-bench")]
    pub out: PathBuf,
    /// Print the rows as one JSON line on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Repeats of the whole comparison; with more than one, each row is reported as the median
    /// rate with its range and the median of each repeat's own ratios.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=20))]
    pub repeats: u16,
    /// Which parts to run, in the same run: peers (plain SQL, pgmq), node (N clients),
    /// one-client (plain SQL beside the node, one request at a time).
    #[arg(long, value_delimiter = ',', default_value = "peers,node,one-client",
          value_parser = one_of(&bench::BenchPart::ALL, bench::BenchPart::name))]
    pub only: Vec<bench::BenchPart>,
    #[command(flatten)]
    pub node: NodeFlags,
}

#[derive(ClapArgs, Debug)]
pub struct ExperimentArgs {
    /// Which experiment.
    #[arg(value_parser = one_of(&experiment::Experiment::ALL, experiment::Experiment::name))]
    pub kind: experiment::Experiment,
    /// `sqlite:DIR` or a `postgres://` URL (e.g. $LEANTIER_PG_URL).
    #[arg(long)]
    pub store: String,
    /// Levels: client counts (clients), ×factors / node counts (scale), bytes (size).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub levels: Vec<usize>,
    /// Replications per configuration (factorial).
    #[arg(long, default_value_t = 3)]
    pub replications: usize,
    /// Clients (and connections) of each run, unless the experiment varies them.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Time per run, e.g. 4s (warm-up 1 s and cool-down 0.5 s included).
    #[arg(
        long,
        alias = "duration-s",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "4s"
    )]
    pub duration: Duration,
    /// Message size in bytes, unless the experiment varies it.
    #[arg(long, default_value_t = 1000)]
    pub message_bytes: usize,
    /// Report folder: tables (CSV, Markdown), the JSON results and the SVG plot, in a
    /// subfolder per experiment (`clients`, `scale`, ...).
    #[arg(long, alias = "report", default_value = "leantier-report/mq-experiment")]
    pub out: PathBuf,
    #[command(flatten)]
    pub node: NodeFlags,
}

/// Runs the `mq` subcommand.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Command::Serve(serve_args) = &args.command {
        let file = serve_file(serve_args)?;
        // The node's tasks run on this runtime: its threads are the node's I/O threads.
        let runtime = server::node_runtime(&file.node).build()?;
        return runtime.block_on(serve(serve_args, file));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        match &args.command {
            Command::Serve(_) => unreachable!("mq serve runs on the node's own runtime above"),
            Command::Client(a) => client(a).await,
            Command::Load(a) => load_cmd(a).await,
            Command::Bench(a) => bench_cmd(a).await,
            Command::Experiment(a) => experiment_cmd(a).await,
        }
    })
}

/// The node `mq serve` runs: flags over `--config`'s keys over the defaults.
fn serve_file(args: &ServeArgs) -> anyhow::Result<NodeFile> {
    let mut file = args.node.resolve_file()?;
    let pick = |flag: &Option<String>, key: Option<String>, default: &str| {
        flag.clone().or(key).unwrap_or_else(|| default.to_string())
    };
    file.listen = Some(pick(&args.listen, file.listen.take(), LISTEN_DEFAULT));
    file.store = Some(pick(&args.store, file.store.take(), STORE_DEFAULT));
    Ok(file)
}

async fn serve(args: &ServeArgs, file: NodeFile) -> anyhow::Result<()> {
    if args.print_config {
        print!("{}", toml::to_string(&file)?);
        return Ok(());
    }
    let (listen, store_url) = (file.listen.unwrap_or_default(), file.store.unwrap_or_default());
    let config = file.node;
    // Held until the node stopped: a second `mq serve` on this SQLite store is refused.
    let _owner = store::claim(&store_url)?;
    let store =
        store::AnyStore::open_with(&store_url, config.db_workers, config.message_table).await?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(mq::tls::server_config_from_files(cert, key)?),
        _ => None,
    };
    // Heard from before the node serves: a supervisor may stop it once it reads the listen line.
    let stop_signal = ops::stop::stop_signal()?;
    let node = server::start_with_tls(&listen, store, config, tls).await?;
    let readiness = ops::Readiness::default();
    let mut registry = ops::Registry::default();
    node.register_metrics(&mut registry);
    let _admin = args.metrics.serve(registry, &readiness)?;
    // The store is open (its schema checked or made) and the listener bound.
    readiness.set(true);
    eprintln!("mq node listening on {} (store {store_url})", node.addr);
    let signal = tokio::select! {
        signal = stop_signal => signal,
        () = super::admin::follow_readiness(&readiness, "the database", || node.is_ready()) => {
            unreachable!("follows until stopped")
        }
    };
    readiness.set(false);
    tracing::info!(signal, "stop requested: draining");
    let report = node.stop(ops::stop::DRAIN_TIMEOUT).await;
    if !report.drained {
        let left = report.in_flight_left;
        tracing::warn!(left, bound = ?ops::stop::DRAIN_TIMEOUT, "drain cut short; unanswered requests were not acknowledged");
    }
    tracing::info!(
        signal,
        drained = report.drained,
        connections_open = report.connections_open,
        sends_committed = report.sends_committed,
        pops_committed = report.pops_committed,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "mq node stopped"
    );
    super::admin::print_stopped(signal);
    Ok(())
}

async fn client(args: &ClientArgs) -> anyhow::Result<()> {
    let ops = match (&args.script, &args.op) {
        // clap cannot declare an argument in conflict with a subcommand (its debug build
        // rejects `conflicts_with = "op"`), so the conflict is checked here.
        (Some(_), Some(_)) => {
            return Err(BadInput("give an operation or --script FILE, not both".into()).into());
        }
        (Some(path), None) => read_script(path)?,
        (None, Some(op)) => vec![op.clone()],
        (None, None) => return Err(BadInput("give an operation or --script FILE".into()).into()),
    };
    let mut client = connect(args).await.with_context(|| format!("connecting to {}", args.node))?;
    let id = client.register(&args.name, args.secret.as_bytes()).await?;
    eprintln!("registered {:?} as client {id}", args.name);
    let mut failures = 0;
    for op in ops {
        match run_op(&mut client, &op).await {
            Ok(line) => println!("{line}"),
            // The connection is unusable after a timeout: the rest would only wait too.
            Err(e @ mq::client::ClientError::TimedOut { .. }) => return Err(e.into()),
            Err(e) => {
                failures += 1;
                println!("error {e}");
            }
        }
    }
    client.disconnect().await?;
    anyhow::ensure!(failures == 0, "{failures} operation(s) refused");
    Ok(())
}

async fn connect(args: &ClientArgs) -> anyhow::Result<Client> {
    let timeouts = timeouts_of(&args.timeouts)?;
    let Some(ca) = &args.tls_ca else {
        return Ok(Client::connect_with(&args.node, timeouts).await?);
    };
    let ca = std::fs::read(ca).with_context(|| format!("reading {}", ca.display()))?;
    let host = args.node.rsplit_once(':').map_or(args.node.as_str(), |(host, _)| host);
    let name = args.tls_server_name.as_deref().unwrap_or(host.trim_matches(['[', ']']));
    let tls = mq::tls::client_config(&ca)?;
    Ok(Client::connect_tls_with(&args.node, name, tls, timeouts).await?)
}

fn read_script(path: &std::path::Path) -> anyhow::Result<Vec<ClientOp>> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| BadInput(format!("cannot read script {}: {e}", path.display())))?
    };
    let mut ops = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let parsed = ScriptLine::try_parse_from(line.split_whitespace())
            .map_err(|e| BadInput(format!("{}:{}: {}", path.display(), number + 1, e.render())))?;
        ops.push(parsed.op);
    }
    Ok(ops)
}

async fn run_op(client: &mut Client, op: &ClientOp) -> Result<String, mq::client::ClientError> {
    let show = |m: mq::protocol::Message| {
        format!(
            "message {} queue={} from={} to={} arrived_us={} deliveries={} content={}",
            m.id,
            m.queue,
            m.sender,
            m.receiver.map_or("anyone".into(), |r| r.to_string()),
            m.arrived_us,
            m.deliveries,
            String::from_utf8_lossy(&m.content)
        )
    };
    let mine = |f: &MineFilter| ReadTarget::ForMe { queue: f.queue.clone(), sender: f.from };
    Ok(match op {
        ClientOp::CreateQueue { name } => {
            format!("queue {} created", client.create_queue(name).await?)
        }
        ClientOp::DeleteQueue { name, purge } => {
            format!("queue deleted, {} messages purged", client.delete_queue(name, *purge).await?)
        }
        ClientOp::Send { queue, to, content } => {
            format!("sent {}", client.send(queue, *to, content.join(" ").as_bytes()).await?)
        }
        ClientOp::Pop { queue } => {
            show(client.read(ReadTarget::Queue(queue.clone()), ReadMode::Pop).await?)
        }
        ClientOp::Peek { queue } => {
            show(client.read(ReadTarget::Queue(queue.clone()), ReadMode::Peek).await?)
        }
        ClientOp::PopMine(f) => show(client.read(mine(f), ReadMode::Pop).await?),
        ClientOp::PeekMine(f) => show(client.read(mine(f), ReadMode::Peek).await?),
        ClientOp::Lease { queue, lease_ms } => show(
            client
                .read(ReadTarget::Queue(queue.clone()), ReadMode::Lease { lease_ms: *lease_ms })
                .await?,
        ),
        ClientOp::Ack { message_id } => {
            client.ack(*message_id).await?;
            format!("acked {message_id}")
        }
        ClientOp::List => format!("queues: {}", client.list_queues().await?.join(" ")),
    })
}

/// A lease in the protocol's whole milliseconds (a u32: up to about 49 days).
fn lease_millis(text: &str) -> Result<u32, String> {
    let lease = values::millis(text)?;
    u32::try_from(lease.as_millis())
        .map_err(|_| format!("{text} is longer than the protocol's 49 days of lease"))
}

async fn load_cmd(args: &LoadArgs) -> anyhow::Result<()> {
    let mut c: load::LoadConfig = load_toml(args.config.as_deref())?;
    if !args.nodes.is_empty() {
        c.nodes = args.nodes.clone();
    }
    override_with(&mut c.clients, &args.clients);
    override_with(&mut c.connections, &args.connections);
    override_with(&mut c.send_percent, &args.send_percent);
    override_with(&mut c.message_bytes, &args.message_bytes);
    let seconds = |flag: Option<Duration>| flag.map(|duration| duration.as_secs_f64());
    override_with(&mut c.think_ms, &args.think.map(values::whole_millis));
    override_with(&mut c.duration_s, &seconds(args.duration));
    override_with(&mut c.warmup_s, &seconds(args.warmup));
    override_with(&mut c.cooldown_s, &seconds(args.cooldown));
    c.timeouts = timeouts_of(&args.timeouts)?;
    let result = load::run(&c).await?;
    let tables = load::tables(&result);
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        tables.iter().for_each(|t| println!("{t}"));
    }
    write_report(&args.out, &result, &tables)?;
    if args.check && !result.sanity_ok {
        return Err(TargetMissed(vec!["sanity checks (counts or reply ids) failed".into()]).into());
    }
    Ok(())
}

fn write_report(
    dir: &std::path::Path,
    result: &load::LoadResult,
    tables: &[experiments::report::Table],
) -> anyhow::Result<()> {
    let report = experiments::report::ReportDir::create(dir)?;
    report.write_json("result.json", result)?;
    report.write_csv("summary.csv", &tables[0])?;
    report.write_csv("latency.csv", &tables[1])?;
    let mut md = experiments::report::Markdown::new();
    md.heading(1, "mq load");
    for t in tables {
        md.table(t);
    }
    report.write_markdown("report.md", md.as_str())?;
    Ok(())
}

async fn bench_cmd(args: &BenchArgs) -> anyhow::Result<()> {
    let config = bench::BenchConfig {
        store: args.store.clone(),
        clients: args.clients,
        seconds: args.duration.as_secs_f64(),
        content_bytes: args.content_bytes,
        embedded_batch: args.embedded_batch,
        window: args.window,
        send_batch: usize::from(args.send_batch),
        node: args.node.resolve()?,
        pgmq_sql: args.pgmq_sql.clone(),
        parts: args.only.clone(),
    };
    let _owner = store::claim(&args.store)?;
    let load_before = bench::load_average();
    let (mut runs, mut embedded_rates) = (Vec::new(), Vec::new());
    for repeat in 1..=args.repeats {
        let (rows, embedded) = bench::run(&config).await?;
        if !args.json {
            println!("repeat {repeat} of {}\n{}", args.repeats, bench::table(&rows));
        }
        runs.push(rows);
        embedded_rates.extend(embedded);
    }
    let summary = bench::summary_table(&runs);
    let budget = bench::budget_table(&bench::median_budgets(&runs));
    let load_line = match (load_before, bench::load_average()) {
        (Some(before), Some(after)) => {
            format!("host load average (1/5/15 min): {before} before, {after} after")
        }
        _ => String::new(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&runs)?);
    } else {
        println!("{summary}\n{budget}\n{load_line}");
    }
    let report = experiments::report::ReportDir::create(&args.out)?;
    report.write_json("bench.json", &runs)?;
    report.write_csv("bench.csv", &summary)?;
    report.write_csv("budget.csv", &budget)?;
    let mut md = experiments::report::Markdown::new();
    md.heading(1, "mq bench").table(&summary).table(&budget).paragraph(&load_line);
    report.write_markdown("bench.md", md.as_str())?;
    embedded_rates.sort_by(f64::total_cmp);
    if let (true, Some(&rate)) = (args.check, embedded_rates.get(embedded_rates.len() / 2))
        && rate < bench::SQLITE_SENDS_PER_S_TARGET
    {
        let missed = format!("embedded SQLite {rate:.0} sends/s (median) < 100000");
        return Err(TargetMissed(vec![missed]).into());
    }
    Ok(())
}

async fn experiment_cmd(args: &ExperimentArgs) -> anyhow::Result<()> {
    if args.levels.is_empty() || args.levels.contains(&0) || args.replications == 0 {
        return Err(BadInput("levels must be ≥ 1 and replications ≥ 1".into()).into());
    }
    let load = load::LoadConfig {
        clients: args.clients,
        connections: args.clients,
        message_bytes: args.message_bytes,
        duration_s: args.duration.as_secs_f64(),
        warmup_s: 1.0,
        cooldown_s: 0.5,
        ..load::LoadConfig::default()
    };
    // Refused before the first run, not after the store is set up.
    load.validate()?;
    let config = experiment::ExperimentConfig {
        store: args.store.clone(),
        node: args.node.resolve()?,
        load,
        levels: args.levels.clone(),
        replications: args.replications,
    };
    let _owner = store::claim(&args.store)?;
    let (points, tables, plot) = experiment::run(args.kind, &config).await?;
    for t in &tables {
        println!("{t}");
    }
    let report = experiments::report::ReportDir::create(args.out.join(args.kind.name()))?;
    report.write_json("points.json", &points)?;
    let mut md = experiments::report::Markdown::new();
    md.heading(1, &format!("mq experiment {:?}", args.kind));
    for (i, t) in tables.iter().enumerate() {
        report.write_csv(&format!("table{i}.csv"), t)?;
        md.table(t);
    }
    if let Some(plot) = plot {
        report.write_svg("plot.svg", &plot.to_svg())?;
        md.image("plot", "plot.svg");
    }
    report.write_markdown("report.md", md.as_str())?;
    if points.iter().any(|p| !p.result.sanity_ok) {
        return Err(TargetMissed(vec!["a run failed its sanity checks".into()]).into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mq load`'s flags are `Option`s (a `--config` file sits between the defaults and the
    /// flags), so clap cannot show their defaults: each help text states it, and this keeps
    /// the texts equal to `LoadConfig::default()`.
    #[test]
    fn mq_load_help_shows_the_config_defaults() {
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            load: LoadArgs,
        }
        let help = <Cli as clap::CommandFactory>::command().render_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let d = load::LoadConfig::default();
        let shown = [
            format!("several nodes [default: {}]", d.nodes.join(",")),
            format!("Closed-loop clients [default: {}]", d.clients),
            format!("clients share [default: {}]", d.connections),
            format!("same queue) [default: {}]", d.send_percent),
            format!("in bytes [default: {}]", d.message_bytes),
            format!("e.g. 5ms [default: {}ms]", d.think_ms),
            format!("+ 1s [default: {}s]", d.duration_s),
            format!("Untimed start, inside --duration [default: {}s]", d.warmup_s),
            format!("Untimed end, inside --duration [default: {}s]", d.cooldown_s),
        ];
        for text in shown {
            assert!(help.contains(&text), "help lacks {text:?}:\n{help}");
        }
        assert_eq!(load::MEASURED_S_MIN, 1.0, "the --duration help says + 1s");
    }
}
