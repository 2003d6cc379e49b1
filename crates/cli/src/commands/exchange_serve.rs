//! `leantier exchange serve`, `exchange client` and `exchange hash-secret`: the tier as a
//! network server (native protocol and FIX 4.4), a scripted native client, and the tool that
//! hashes secrets for the credentials file.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use exchange::durability::JournalMode;
use exchange::flow::{UniverseConfig, reference_instruments};
use exchange::instruments::{InstrumentTable, InstrumentsFile};
use exchange::tier::{LayoutChoice, TierConfig};
use experiments::order_entry_load::Traded;
use experiments::order_entry_runs::{self, LoadRuns, MaxRateLimits};
use gateway::ListenerTls;
use gateway::Settings;
use gateway::client::{
    ClientError, ClientTls, NativeClient, Timeout, describe, describe_answer, parse_script_line_in,
};
use gateway::native::{ClientMsg, ServerMsg};
use gateway::{ServeOptions, start};

use crate::commands::exchange_roles::Role;
use crate::commands::values::{self, one_of};
use crate::outcome::BadInput;

/// Where `exchange client` and `exchange load` read the sessions' secret when `--secret` is not
/// given (flags show in the process list; the environment does not).
const SECRET_ENV: &str = "LEANTIER_EXCHANGE_SECRET";
/// The old name of [`SECRET_ENV`], still read when that is unset; deprecated, to be removed
/// after one release.
const SECRET_ENV_DEPRECATED: &str = "LEANTIER_SECRET";

/// The sessions' secret: `--secret` or `$LEANTIER_EXCHANGE_SECRET` (clap reads both), else the
/// deprecated `$LEANTIER_SECRET`, with a warning.
fn exchange_secret(flag_or_env: Option<&str>) -> Result<String, BadInput> {
    if let Some(secret) = flag_or_env {
        return Ok(secret.to_string());
    }
    match std::env::var(SECRET_ENV_DEPRECATED) {
        Ok(secret) => {
            tracing::warn!("${SECRET_ENV_DEPRECATED} is deprecated: set ${SECRET_ENV} instead");
            Ok(secret)
        }
        Err(_) => Err(BadInput(format!("a secret is needed: --secret or ${SECRET_ENV}"))),
    }
}

/// Runs the tier as a server: orders over the native protocol and FIX 4.4. Serves until
/// SIGTERM or SIGINT, then refuses new orders (reason 103, shutting down), answers those it
/// took, syncs its store and journals, and exits 0.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address of the native protocol listener (docs/PROTOCOL.md); default: the config's
    /// `listen`, else 127.0.0.1:9400.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address of the FIX 4.4 acceptor; default: the config's `fix_listen`, else none.
    #[arg(long)]
    pub fix_listen: Option<SocketAddr>,
    /// Print the effective configuration (the config with the flags over it and every default
    /// filled in; tokens left out) as the TOML --config reads, and exit.
    #[arg(long)]
    pub print_config: bool,
    /// TOML settings: `listen`, `fix_listen`, `metrics_listen` (the flags override them),
    /// `credentials` (file of `client_id protocol comp_id argon2-hash` lines,
    /// relative to this file), `store_dir` (the durable store of FIX and native sessions;
    /// `fix_store_dir` is its old name), `store_sync` (fdatasync each batch before sending it;
    /// default true), `store_bytes_max` (compact the store past this; default 256 MiB),
    /// `fix_resend_window` (sent messages per FIX session kept by compaction; default 16384),
    /// `fix_comp_id`, `throttle_msgs_per_s`,
    /// `cancel_on_disconnect_ms` (0: off), `outbox_bytes_max`, `heartbeat_ms`,
    /// `instruments_file` and `clients_file` (the market: docs/OPERATIONS.md; without them the
    /// reference universe of `instruments` instruments and `clients` clients), `layout` (see
    /// `--layout`), `admin_token` (the bearer token the metrics
    /// listener's admin endpoints require; without it they are off), `metrics_token` (the
    /// bearer token `/metrics` requires; without it the page is open and the listener must be
    /// on loopback), `metrics_per_client` (a series per client id; default false: sums only),
    /// `busy_poll` (see `--busy-poll`),
    /// `tls_cert` and `tls_key` (PEM certificate chain and key: the native and FIX listeners
    /// serve TLS; default plain TCP), `tls_client_ca` (PEM CA: clients must present a
    /// certificate chaining to it), and a `[tier]` table with any setting of the tier (`exchange run --config`: workers,
    /// shards, senders, rings, wait, placement, snapshots).
    #[arg(long)]
    pub config: PathBuf,
    /// Address of a Prometheus text-format metrics listener (a bare port: 127.0.0.1:PORT):
    /// session counters summed over clients (per client with `metrics_per_client`), per-stage
    /// counters and ring depths, and latency summaries (engine service time, order→report
    /// inside the server); also /health, /ready and the admin endpoints. An address other
    /// than loopback is refused unless the config sets `metrics_token` (docs/SECURITY.md).
    #[arg(long, value_parser = super::admin::metrics_address)]
    pub metrics_listen: Option<SocketAddr>,
    /// The tier's journal, in `<store_dir>/tier` (one per core shard, and the master data's):
    /// `group` journals every sequenced input with group commit off the critical path, and
    /// each execution report is sent only once its input and its store record are on disk
    /// (the two fsyncs overlap); a restart rebuilds the books from it. `sync` and `relaxed`
    /// are the journal's other policies (see `exchange run`); `off`: books are lost on restart.
    /// Default: the `[tier]` table's `journal`, else `group`.
    #[arg(long, value_parser = one_of(&JournalMode::ALL, JournalMode::name))]
    pub journal: Option<JournalMode>,
    /// A snapshot every this many inputs (0 = none; default: the `[tier]` table's
    /// `snapshot_every_records`, else 100000). Role `all`: of each core shard beside its
    /// journal (a restart replays only the journal after it); role `engine`: of the shard's
    /// engine in the JetStream object store, written by the leader, and the input log is
    /// trimmed below it (docs/REPLICATION.md).
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// The tier's thread layout (overrides `layout` in the config, which overrides the
    /// `[tier]` table's; default auto): `auto`
    /// plans which stages share a thread, which spin and which park, from the usable CPUs and
    /// service times calibrated at start-up (`exchange run`'s planner); `thread-per-stage`
    /// runs one thread per stage worker. The thread groups and usable CPUs are printed at
    /// start-up and served as `gateway_layout_info` on the metrics listener.
    #[arg(long, value_parser = one_of(&LayoutChoice::ALL, LayoutChoice::name))]
    pub layout: Option<LayoutChoice>,
    /// The order rate the `auto` layout is planned for, orders/s.
    #[arg(long, default_value_t = 60_000.0)]
    pub planned_rate: f64,
    /// The I/O loop polls its sockets without ever sleeping: no wake-up between a client's
    /// bytes and the loop, one CPU kept busy (overrides the config's `busy_poll`; default
    /// off). Refused (exit 2) unless the layout leaves that CPU free: one CPU per spinning
    /// thread, the loop's among them, and one for everything else.
    #[arg(long)]
    pub busy_poll: bool,
    /// Also publish every response (execution reports, trades, top of book) over NATS to
    /// delivery edges (`exchange edge --nats URL`): per-outlet subjects with sequence numbers
    /// and retained windows for gap recovery (docs/DELIVERY.md).
    #[arg(long)]
    pub nats: Option<String>,
    /// Login and TLS for --nats.
    #[command(flatten)]
    pub nats_auth: super::delivery::NatsAuthArgs,
    /// The role and the replicated input log (`--role engine`).
    #[command(flatten)]
    pub replication: super::exchange_roles::ReplicationArgs,
}

/// Sends scripted orders over the native protocol and prints every report.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// Address of `exchange serve --listen`.
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub connect: SocketAddr,
    /// The client id to log in as.
    #[arg(long)]
    pub client: u32,
    /// The client's secret (default: $LEANTIER_EXCHANGE_SECRET, else the deprecated
    /// $LEANTIER_SECRET).
    #[arg(long, env = SECRET_ENV, hide_env_values = true)]
    pub secret: Option<String>,
    /// Script, one order per line: `buy|sell TOKEN INSTRUMENT QTY PRICE|market [day|ioc|fok]`
    /// (default day; a market order ioc, never day), `cancel TOKEN INSTRUMENT`,
    /// `replace TOKEN INSTRUMENT QTY PRICE`; `-` reads stdin. With --instruments, INSTRUMENT
    /// may be a symbol and PRICE a decimal (`buy 1 ACME 100 101.25`). Each report is printed
    /// as one line, a reject with the request it answers.
    #[arg(long, default_value = "-")]
    pub script: PathBuf,
    /// First sequenced message to replay at login (1: all; 0: only new ones).
    #[arg(long, default_value_t = 0)]
    pub next_seq: u64,
    /// How long to keep printing reports after the script's last line, e.g. 500ms.
    #[arg(
        long,
        alias = "linger-ms",
        value_name = "DURATION",
        value_parser = values::millis,
        default_value = "500ms"
    )]
    pub linger: Duration,
    /// The server's instruments file (`instruments_file`): symbols and decimal prices in the
    /// script and the printed reports; without it, ids and whole price units.
    #[arg(long)]
    pub instruments: Option<PathBuf>,
    #[command(flatten)]
    pub timeouts: super::timeouts::TimeoutFlags,
    #[command(flatten)]
    pub tls: ClientTlsFlags,
}

/// TLS to `exchange serve` (its `tls_cert`): the flags `mq client` has for the same concepts.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientTlsFlags {
    /// Connect with TLS, trusting the CA certificates in this PEM file.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// Name to check the server's certificate against (default: the address's IP).
    #[arg(long, requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    /// Present this PEM certificate chain to a server that demands one (`tls_client_ca`);
    /// needs --tls-key.
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ClientTlsFlags {
    /// The TLS to connect to `connect` with; `None` without --tls-ca (plain TCP). A file that
    /// does not load is refused naming it (exit 2).
    pub fn client_tls(&self, connect: SocketAddr) -> anyhow::Result<Option<ClientTls>> {
        let Some(ca) = &self.tls_ca else { return Ok(None) };
        let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
        let files = ops::tls::ClientFiles { ca, identity };
        let name = self.tls_server_name.clone().unwrap_or_else(|| connect.ip().to_string());
        Ok(Some(ClientTls::from_files(files, &name)?))
    }
}

/// Prints the argon2 hash of a secret read from stdin (for the credentials file).
#[derive(clap::Args, Debug, Clone)]
pub struct HashSecretArgs {}

/// The TOML file of `exchange serve --config` (and what `--print-config` prints).
#[derive(serde::Deserialize, serde::Serialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct ServeConfig {
    listen: Option<SocketAddr>,
    fix_listen: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    credentials: PathBuf,
    #[serde(alias = "fix_store_dir")]
    store_dir: Option<PathBuf>,
    store_sync: Option<bool>,
    store_bytes_max: Option<u64>,
    fix_resend_window: Option<usize>,
    fix_comp_id: Option<String>,
    throttle_msgs_per_s: Option<u32>,
    cancel_on_disconnect_ms: Option<u64>,
    outbox_bytes_max: Option<usize>,
    heartbeat_ms: Option<u64>,
    instruments: Option<u32>,
    clients: Option<u32>,
    instruments_file: Option<PathBuf>,
    clients_file: Option<PathBuf>,
    layout: Option<String>,
    #[serde(skip_serializing)]
    admin_token: Option<String>,
    #[serde(skip_serializing)]
    metrics_token: Option<String>,
    metrics_per_client: Option<bool>,
    /// The I/O loop polls its sockets without sleeping, keeping one CPU busy; refused unless
    /// the layout leaves it that CPU (`--busy-poll` sets it; default false).
    busy_poll: Option<bool>,
    /// PEM certificate chain of the native and FIX listeners: with `tls_key` they serve TLS
    /// (default plain TCP; docs/SECURITY.md "TLS on order entry").
    tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    tls_key: Option<PathBuf>,
    /// PEM CA: clients must present a certificate chaining to it (mutual TLS).
    tls_client_ca: Option<PathBuf>,
    #[serde(default)]
    tier: Option<toml::Table>,
}

/// The layout: `--layout`, else the config's `layout`, else `None` (the `[tier]` table's, or
/// auto). The layouts of the engine the gateway had before it ran on the tier are named as
/// such.
fn layout_from(args: &ServeArgs, config: &ServeConfig) -> Result<Option<LayoutChoice>, BadInput> {
    if let Some(layout) = args.layout {
        return Ok(Some(layout));
    }
    let Some(name) = &config.layout else { return Ok(None) };
    let found = LayoutChoice::ALL.into_iter().find(|layout| layout.name() == name);
    found.map(Some).ok_or_else(|| {
        let names: Vec<&str> = LayoutChoice::ALL.iter().map(|l| l.name()).collect();
        let old = matches!(name.as_str(), "inline" | "engine-thread");
        let hint =
            if old { " (the gateway now runs the tier; its layouts are the tier's)" } else { "" };
        BadInput(format!(
            "{}: layout = {name:?}: one of {}{hint}",
            args.config.display(),
            names.join(", ")
        ))
    })
}

/// The tier behind the server: the config's `[tier]` table over the tier's defaults, then the
/// universe, journal and layout the serve settings and flags name.
fn tier_from(
    args: &ServeArgs,
    config: &ServeConfig,
    layout: Option<LayoutChoice>,
) -> Result<TierConfig, BadInput> {
    let table = config.tier.clone().unwrap_or_default();
    let tier: TierConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e| BadInput(format!("{}: [tier]: {e}", args.config.display())))?;
    let universe = UniverseConfig {
        instruments: config.instruments.unwrap_or(tier.universe.instruments).max(1),
        clients: config.clients.unwrap_or(tier.universe.clients).max(1),
    };
    let journal = args.journal.unwrap_or(tier.journal);
    let layout = layout.unwrap_or(tier.layout);
    let snapshot_every_records = args.snapshot_every.unwrap_or(tier.snapshot_every_records);
    let tier = TierConfig { universe, journal, layout, snapshot_every_records, ..tier };
    tier.validate().map_err(|e| BadInput(format!("{}: [tier]: {e}", args.config.display())))?;
    Ok(tier)
}

/// With `instruments_file` and `clients_file`, the tier starts from their master data and the
/// sessions convert symbols and decimals with their table; without, the reference universe.
fn with_market_files(
    mut tier: TierConfig,
    mut settings: Settings,
    config: &ServeConfig,
    base: &Path,
) -> Result<(TierConfig, Settings), BadInput> {
    let (instruments, clients) = match (&config.instruments_file, &config.clients_file) {
        (None, None) => return Ok((tier, settings)),
        (Some(instruments), Some(clients)) => (base.join(instruments), base.join(clients)),
        _ => return Err(BadInput("instruments_file and clients_file go together".into())),
    };
    let bad = |e: exchange::ExchangeError| BadInput(e.to_string());
    let instruments = exchange::instruments::read_toml(&instruments).map_err(bad)?;
    let clients = exchange::instruments::read_toml(&clients).map_err(bad)?;
    let (master, table) = exchange::instruments::load(&instruments, &clients).map_err(bad)?;
    tier.master_data = Some(master);
    settings.instruments = std::sync::Arc::new(table);
    Ok((tier, settings))
}

fn settings_from(config: &ServeConfig, base: &Path) -> Settings {
    let defaults = Settings::default();
    Settings {
        throttle_msgs_per_s: config.throttle_msgs_per_s.unwrap_or(defaults.throttle_msgs_per_s),
        cancel_on_disconnect: match config.cancel_on_disconnect_ms {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => defaults.cancel_on_disconnect,
        },
        outbox_bytes_max: config.outbox_bytes_max.unwrap_or(defaults.outbox_bytes_max),
        heartbeat: config.heartbeat_ms.map_or(defaults.heartbeat, Duration::from_millis),
        store_dir: base.join(config.store_dir.clone().unwrap_or(defaults.store_dir.clone())),
        store_sync: config.store_sync.unwrap_or(defaults.store_sync),
        store_bytes_max: config.store_bytes_max.unwrap_or(defaults.store_bytes_max),
        fix_resend_window: config.fix_resend_window.unwrap_or(defaults.fix_resend_window),
        fix_comp_id: config.fix_comp_id.clone().unwrap_or(defaults.fix_comp_id.clone()),
        admin_token: config.admin_token.clone(),
        metrics_token: config.metrics_token.clone(),
        metrics_per_client: config.metrics_per_client.unwrap_or(defaults.metrics_per_client),
        busy_poll: config.busy_poll.unwrap_or(defaults.busy_poll),
        ..defaults
    }
}

/// TLS on the native and FIX listeners from `tls_cert`, `tls_key` and `tls_client_ca` (paths
/// relative to the config file); `None` without them (plain TCP). A file that does not load, a
/// key that does not match its certificate: refused, naming the config and the file (exit 2).
fn listener_tls(config: &ServeConfig, path: &Path) -> anyhow::Result<Option<ListenerTls>> {
    let base = path.parent().unwrap_or(Path::new("."));
    let (cert, key) = match (&config.tls_cert, &config.tls_key) {
        (None, None) if config.tls_client_ca.is_none() => return Ok(None),
        (Some(cert), Some(key)) => (base.join(cert), base.join(key)),
        _ => {
            let why = "tls_cert and tls_key go together (and tls_client_ca needs them)";
            return Err(BadInput(format!("{}: {why}", path.display())).into());
        }
    };
    let client_ca = config.tls_client_ca.as_ref().map(|ca| base.join(ca));
    let files = ops::tls::ServerFiles { cert: &cert, key: &key, client_ca: client_ca.as_deref() };
    let tls = ListenerTls::from_files(files)
        .with_context(|| format!("{}: TLS of the native and FIX listeners", path.display()))?;
    Ok(Some(tls))
}

/// The native listener when neither the flag nor the config names one.
const LISTEN_DEFAULT: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9400);

/// The listen addresses: each flag over the config's key.
fn listeners(
    args: &ServeArgs,
    config: &ServeConfig,
) -> (SocketAddr, Option<SocketAddr>, Option<SocketAddr>) {
    (
        args.listen.or(config.listen).unwrap_or(LISTEN_DEFAULT),
        args.fix_listen.or(config.fix_listen),
        args.metrics_listen.or(config.metrics_listen),
    )
}

/// The configuration the server runs with, as `--config` reads it: every key with its value
/// (defaults filled in), the tier's whole table, tokens left out.
fn effective(
    config: &ServeConfig,
    (listen, fix_listen, metrics_listen): (SocketAddr, Option<SocketAddr>, Option<SocketAddr>),
    settings: &Settings,
    tier: &TierConfig,
) -> anyhow::Result<ServeConfig> {
    let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let tier_table = toml::Table::try_from(tier)?;
    Ok(ServeConfig {
        listen: Some(listen),
        fix_listen,
        metrics_listen,
        credentials: config.credentials.clone(),
        store_dir: Some(config.store_dir.clone().unwrap_or_else(|| Settings::default().store_dir)),
        store_sync: Some(settings.store_sync),
        store_bytes_max: Some(settings.store_bytes_max),
        fix_resend_window: Some(settings.fix_resend_window),
        fix_comp_id: Some(settings.fix_comp_id.clone()),
        throttle_msgs_per_s: Some(settings.throttle_msgs_per_s),
        cancel_on_disconnect_ms: Some(settings.cancel_on_disconnect.map_or(0, millis)),
        outbox_bytes_max: Some(settings.outbox_bytes_max),
        heartbeat_ms: Some(millis(settings.heartbeat)),
        instruments: Some(tier.universe.instruments),
        clients: Some(tier.universe.clients),
        instruments_file: config.instruments_file.clone(),
        clients_file: config.clients_file.clone(),
        metrics_per_client: Some(settings.metrics_per_client),
        busy_poll: Some(settings.busy_poll),
        tls_cert: config.tls_cert.clone(),
        tls_key: config.tls_key.clone(),
        tls_client_ca: config.tls_client_ca.clone(),
        tier: Some(tier_table),
        ..ServeConfig::default()
    })
}

/// `leantier exchange serve`: serves until SIGTERM or SIGINT, then drains and exits 0.
fn read_text(path: &Path) -> Result<String, BadInput> {
    std::fs::read_to_string(path).map_err(|e| BadInput(format!("{}: {e}", path.display())))
}

/// The tier the serve config and flags of `args` describe: what `replication check` replays
/// the engines' log with.
pub(super) fn tier_of(args: &ServeArgs) -> anyhow::Result<TierConfig> {
    Ok(loaded(args)?.2)
}

/// The serve config `args` name, with the sessions' settings and the tier it describes (its
/// `[tier]` table, market files and flags).
fn loaded(args: &ServeArgs) -> anyhow::Result<(ServeConfig, Settings, TierConfig)> {
    let config: ServeConfig = toml::from_str(&read_text(&args.config)?)
        .map_err(|e| BadInput(format!("{}: {e}", args.config.display())))?;
    let base = args.config.parent().unwrap_or(Path::new("."));
    let mut settings = settings_from(&config, base);
    settings.busy_poll |= args.busy_poll;
    let layout = layout_from(args, &config)?;
    let (tier, settings) =
        with_market_files(tier_from(args, &config, layout)?, settings, &config, base)?;
    Ok((config, settings, tier))
}

pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let (config, mut settings, tier) = loaded(args)?;
    settings.tls = listener_tls(&config, &args.config)?;
    let base = args.config.parent().unwrap_or(Path::new("."));
    let credentials = gateway::credentials::parse(&read_text(&base.join(&config.credentials))?)
        .map_err(|e| BadInput(e.to_string()))?;
    let store_dir = settings.store_dir.clone();
    check_session_settings(&settings)?;
    let (listen, fix_listen, metrics_listen) = listeners(args, &config);
    if args.print_config {
        let listeners = (listen, fix_listen, metrics_listen);
        print!("{}", toml::to_string(&effective(&config, listeners, &settings, &tier)?)?);
        return Ok(());
    }
    if !(args.planned_rate.is_finite() && args.planned_rate > 0.0) {
        return Err(BadInput("--planned-rate must be a number > 0".into()).into());
    }
    match args.replication.role {
        Role::Engine => {
            let metrics = (metrics_listen, settings.metrics_token.clone());
            return super::exchange_roles::serve_engine(args, tier, metrics);
        }
        Role::Gateway => {
            let addresses = (listen, fix_listen, metrics_listen);
            let sessions = (settings, credentials);
            return super::exchange_roles::serve_gateway(args, sessions, addresses, tier.outlets);
        }
        Role::All => {}
    }
    let publisher = nats_publisher(args, tier.outlets)?;
    // Listening for SIGTERM and SIGINT from before the server serves: a supervisor may stop
    // it as soon as it has read the listen line.
    let mut stop = super::exchange_roles::StopSignals::listen()?;
    let running_tls = settings.tls.clone();
    let running = start(ServeOptions {
        listen,
        fix_listen,
        metrics_listen,
        settings,
        credentials,
        tier,
        planned_rate_per_s: args.planned_rate,
        journal_dir: store_dir.join("tier"),
        also: publisher.as_ref().map(|p| p.subscribers()),
    })?;
    print_serving(&running, running_tls.as_ref());
    let signal = stop.wait_following(std::future::pending());
    tracing::info!(signal, "stop requested: draining");
    let stopping = std::time::Instant::now();
    // Refuses new orders, answers those taken, syncs the store, stops the tier (its journals
    // sync and stop), within gateway's DRAIN_TIMEOUT.
    running.stop();
    super::admin::print_stopped(signal);
    let published = publisher.map(|publisher| publisher.drain()).transpose()?;
    tracing::info!(
        signal,
        elapsed_ms = stopping.elapsed().as_millis() as u64,
        published = published.map(|report| report.published),
        "exchange server stopped"
    );
    Ok(())
}

/// The session settings that must be positive (a zero would stop every session).
fn check_session_settings(settings: &gateway::Settings) -> anyhow::Result<()> {
    if settings.throttle_msgs_per_s == 0
        || settings.heartbeat.is_zero()
        || settings.outbox_bytes_max == 0
        || settings.store_bytes_max == 0
    {
        return Err(BadInput(
            "throttle_msgs_per_s, heartbeat_ms, outbox_bytes_max and store_bytes_max must be > 0"
                .into(),
        )
        .into());
    }
    Ok(())
}

/// With `--nats`, the publisher of the tier's responses to delivery edges.
fn nats_publisher(
    args: &ServeArgs,
    outlets: u32,
) -> anyhow::Result<Option<delivery::publish::NatsPublisher>> {
    let Some(url) = &args.nats else { return Ok(None) };
    let options = delivery::publish::PublishOptions {
        nats: args.nats_auth.connect(url)?,
        prefix: delivery::subjects::PREFIX_DEFAULT.into(),
        outlets,
        retain_records: delivery::publish::RETAIN_RECORDS_DEFAULT,
        wait: pipeline::WaitStrategy::Park,
        heartbeat: delivery::publish::HEARTBEAT_INTERVAL_DEFAULT,
    };
    Ok(Some(delivery::publish::NatsPublisher::connect(options)?))
}

/// The lines that say where the server serves: its listeners, TLS, metrics and tier layout.
fn print_serving(running: &gateway::Running, tls: Option<&gateway::ListenerTls>) {
    println!("native listening on {}", running.listen);
    if let Some(fix) = running.fix_listen {
        println!("FIX 4.4 listening on {fix}");
    }
    // A line of its own: scripts read the address as the rest of a listen line.
    match tls {
        Some(tls) if tls.client_certificates() => {
            println!("native and FIX listeners serve TLS; clients must present a certificate");
        }
        Some(_) => println!("native and FIX listeners serve TLS"),
        None => {}
    }
    if let Some(metrics) = running.metrics_listen {
        println!("metrics on http://{metrics}/metrics");
    }
    let layout = &running.layout;
    let groups: Vec<String> = layout.groups.iter().map(|g| g.label()).collect();
    // Not `println!`: a supervisor that read only the listen line may have closed the pipe,
    // and the server must go on serving.
    let _ = writeln!(
        std::io::stdout(),
        "tier layout ({} usable CPUs): {}",
        layout.usable_cpus,
        groups.join(" | ")
    );
}

/// `leantier exchange client`: exits 1 naming the timeout that passed when the server does
/// not answer (connect, request, idle).
pub fn client(args: &ClientArgs) -> anyhow::Result<()> {
    let script: Box<dyn BufRead> = if args.script == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(&args.script)
            .map_err(|e| BadInput(format!("{}: {e}", args.script.display())))?;
        Box::new(std::io::BufReader::new(file))
    };
    let table = match &args.instruments {
        Some(path) => {
            let file = exchange::instruments::read_toml(path)?;
            let no_clients = exchange::instruments::ClientsFile { clients: Vec::new() };
            Some(exchange::instruments::load(&file, &no_clients)?.1)
        }
        None => None,
    };
    let table = table.as_ref();
    let secret = exchange_secret(args.secret.as_deref())?;
    let [connect_timeout, request_timeout, idle_timeout] = args.timeouts.bounds()?;
    let tls = args.tls.client_tls(args.connect)?;
    let mut session = NativeClient::connect_with(args.connect, connect_timeout, tls.as_ref())?;
    let login = session.login(args.client, &secret, args.next_seq, request_timeout)?;
    println!("{}", describe(&login, table));
    if !matches!(login, ServerMsg::LoginAccepted { .. }) {
        anyhow::bail!("login refused");
    }
    session.set_idle_timeout(idle_timeout);
    let mut run = ScriptRun { session, table, sent: HashMap::new(), unanswered: HashMap::new() };
    for (at, line) in script.lines().enumerate() {
        let line = line?;
        let msg = parse_script_line_in(&line, args.client, table)
            .map_err(|e| BadInput(format!("script line {}: {e}", at + 1)))?;
        if let Some(msg) = msg {
            run.send(msg)?;
        }
        run.print_available(Duration::ZERO)?;
    }
    run.print_available(args.linger)?;
    run.await_answers(request_timeout)?;
    run.session.send(&ClientMsg::Logout)?;
    Ok(())
}

/// `exchange client`'s session while it runs its script: what it sent (to describe the
/// answers) and which requests still wait for their first answer.
struct ScriptRun<'a> {
    session: NativeClient,
    table: Option<&'a InstrumentTable>,
    /// The last request per token.
    sent: HashMap<u32, ClientMsg>,
    /// Requests without an answer yet, by token, with when they were sent.
    unanswered: HashMap<u32, Instant>,
}

impl ScriptRun<'_> {
    fn send(&mut self, msg: ClientMsg) -> anyhow::Result<()> {
        self.session.send(&msg)?;
        if let ClientMsg::NewOrder(order) | ClientMsg::Cancel(order) | ClientMsg::Replace(order) =
            msg
        {
            self.sent.insert(order.token, msg);
            self.unanswered.insert(order.token, Instant::now());
        }
        Ok(())
    }

    /// Prints what arrives within `linger` (at least one read).
    fn print_available(&mut self, linger: Duration) -> anyhow::Result<()> {
        let wait = linger.max(Duration::from_millis(1));
        while let Some(msg) = self.session.recv(wait)? {
            self.print(&msg);
        }
        Ok(())
    }

    fn print(&mut self, msg: &ServerMsg) {
        let token = match msg {
            ServerMsg::Sequenced { event, .. } => Some(event.token),
            _ => None,
        };
        if let Some(token) = token {
            self.unanswered.remove(&token);
        }
        let sent = token.and_then(|token| self.sent.get(&token));
        println!("{}", describe_answer(msg, self.table, sent));
    }

    /// Waits until every request is answered, each for at most `timeout` from its sending.
    fn await_answers(&mut self, timeout: Duration) -> anyhow::Result<()> {
        while let Some(&oldest) = self.unanswered.values().min() {
            let left = (oldest + timeout).saturating_duration_since(Instant::now());
            if left.is_zero() {
                let mut tokens: Vec<u32> = self.unanswered.keys().copied().collect();
                tokens.sort_unstable();
                let waited_for = format!("no answer to order(s) {tokens:?}");
                let timed_out =
                    ClientError::TimedOut { timeout: Timeout::Request, after: timeout, waited_for };
                return Err(timed_out.into());
            }
            if let Some(msg) = self.session.recv(left)? {
                self.print(&msg);
            }
        }
        Ok(())
    }
}

/// `leantier exchange hash-secret`.
pub fn hash_secret(_args: &HashSecretArgs) -> anyhow::Result<()> {
    let mut secret = String::new();
    std::io::stdin().read_line(&mut secret)?;
    let secret = secret.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        return Err(
            BadInput("hash-secret reads the secret from stdin; got an empty line".into()).into()
        );
    }
    println!("{}", gateway::credentials::hash_secret(secret.as_bytes())?);
    Ok(())
}

/// Drives `exchange serve` open loop over the native protocol and reports the latency from
/// each order's intended send time to its first report.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Address of `exchange serve --listen` (native) or `--fix-listen` (fix); repeat it to
    /// drive several servers in turn (with `--find-max`: one step each, alternating).
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub connect: Vec<SocketAddr>,
    /// A name per `--connect`, for the tables (default: the address).
    #[arg(long)]
    pub name: Vec<String>,
    /// Protocol to drive: native or fix (FIX 4.4).
    #[arg(long, default_value = "native")]
    pub protocol: String,
    /// Arrival rates (Poisson), orders/s, comma-separated; one run each. With `--find-max`,
    /// the first is where the search starts. The defaults stay within the shipped config's
    /// throttle (`throttle_msgs_per_s = 10000`, per session).
    #[arg(
        long,
        allow_negative_numbers = true,
        alias = "rates",
        value_delimiter = ',',
        default_value = "1000,5000"
    )]
    pub rate: Vec<f64>,
    /// Time per rate (per search step), e.g. 5s.
    #[arg(
        long,
        alias = "seconds",
        value_name = "DURATION",
        value_parser = values::seconds,
        default_value = "5s"
    )]
    pub duration: Duration,
    /// Search each server's highest rate whose p99 stays within `--p99-limit` with every
    /// order accepted: brackets from the first `--rate` (doubling up to `--max-rate`, halving
    /// down to a sixteenth of it), then bisects to within 10 %.
    #[arg(long)]
    pub find_max: bool,
    /// The search's latency limit on p99, e.g. 1ms.
    #[arg(
        long,
        alias = "p99-limit-us",
        value_name = "DURATION",
        value_parser = values::micros,
        default_value = "1ms"
    )]
    pub p99_limit: Duration,
    /// The search's highest rate, orders/s.
    #[arg(long, default_value_t = 1_000_000.0)]
    pub max_rate: f64,
    /// Sessions; session i logs in as client `first_client + i`.
    #[arg(long, default_value_t = 1)]
    pub sessions: u32,
    /// Client id of the first session.
    #[arg(long, default_value_t = 1)]
    pub first_client: u32,
    /// The sessions' secret (all alike; FIX: the Logon's Password; default:
    /// $LEANTIER_EXCHANGE_SECRET, else the deprecated $LEANTIER_SECRET).
    #[arg(long, env = SECRET_ENV, hide_env_values = true)]
    pub secret: Option<String>,
    /// FIX: a session's SenderCompID is this prefix followed by its number, `--first-client`
    /// for the first (the shipped credentials name BROKER1 and BROKER2).
    #[arg(long, default_value = "BROKER")]
    pub fix_comp_id_prefix: String,
    /// FIX: the acceptor's CompID (TargetCompID).
    #[arg(long, default_value = "LEANTIER")]
    pub fix_target_comp_id: String,
    /// The server's instruments file (its `instruments_file`): the symbols, reference prices
    /// and lots the orders carry; `reference` for a server without one (the reference
    /// universe: symbols are the ids, prices whole units).
    #[arg(long, value_name = "FILE|reference", default_value = "configs/instruments.toml")]
    pub instruments: PathBuf,
    /// Instruments to trade, symbols or ids, comma-separated (default: the first one in
    /// `--instruments`): each pair of orders (a buy, then a sell, a lot each at the
    /// instrument's reference price) goes to the next one in turn.
    #[arg(long, value_delimiter = ',')]
    pub instrument: Vec<String>,
    /// Report folder (a Markdown table and CSV).
    #[arg(long, default_value = "leantier-report/exchange-load")]
    pub out: PathBuf,
    /// TLS for every --connect (a server with `tls_cert`).
    #[command(flatten)]
    pub tls: ClientTlsFlags,
}

/// `leantier exchange load`: the runs are `experiments::order_entry_runs`'.
pub fn load(args: &LoadArgs) -> anyhow::Result<()> {
    let base = load_options(args)?;
    let names: Vec<String> = (0..args.connect.len())
        .map(|i| args.name.get(i).cloned().unwrap_or_else(|| args.connect[i].to_string()))
        .collect();
    let search = args
        .find_max
        .then_some(MaxRateLimits { p99_limit: args.p99_limit, max_rate_per_s: args.max_rate });
    order_entry_runs::run(&LoadRuns {
        base,
        targets: args.connect.iter().copied().zip(names).collect(),
        rates: args.rate.clone(),
        duration: args.duration,
        search,
        protocol: args.protocol.clone(),
        sessions: args.sessions,
        out: args.out.clone(),
    })
}

/// The options every run shares (the target and the plan are set per run).
fn load_options(args: &LoadArgs) -> anyhow::Result<experiments::order_entry_load::LoadOptions> {
    use experiments::order_entry_load::{LoadProtocol, LoadSession};
    let protocol = match args.protocol.as_str() {
        "native" => LoadProtocol::Native,
        "fix" => LoadProtocol::Fix { target_comp_id: args.fix_target_comp_id.clone() },
        other => return Err(BadInput(format!("--protocol {other}: native or fix")).into()),
    };
    let positive = |value: f64| value.is_finite() && value > 0.0;
    if args.sessions == 0 || !args.rate.iter().all(|&r| positive(r)) || args.duration.is_zero() {
        return Err(BadInput("--sessions, --rate and --duration must be > 0".into()).into());
    }
    let secret = exchange_secret(args.secret.as_deref())?;
    if args.connect.is_empty() || args.rate.is_empty() || args.name.len() > args.connect.len() {
        return Err(
            BadInput("at least one --connect and --rate; at most one --name each".into()).into()
        );
    }
    let sessions = (0..args.sessions)
        .map(|i| LoadSession {
            client: args.first_client + i,
            comp_id: format!("{}{}", args.fix_comp_id_prefix, args.first_client + i),
            secret: secret.clone(),
        })
        .collect();
    let instruments = traded_instruments(args)?;
    Ok(experiments::order_entry_load::LoadOptions {
        connect: args.connect[0],
        protocol,
        sessions,
        plan: order_entry_runs::poisson_plan(args.rate[0], args.duration),
        instruments,
        tls: args.tls.client_tls(args.connect[0])?,
        drain: experiments::order_entry_load::DRAIN_DEFAULT,
    })
}

/// `--instruments`' value for a server without an instruments file.
const REFERENCE_INSTRUMENTS: &str = "reference";

/// The instruments file `--instruments` names, or the reference universe's (as large as the
/// server's default, and holding every id `--instrument` names).
fn instruments_file(args: &LoadArgs) -> Result<InstrumentsFile, BadInput> {
    if args.instruments != Path::new(REFERENCE_INSTRUMENTS) {
        return exchange::instruments::read_toml(&args.instruments).map_err(|e| {
            BadInput(format!(
                "--instruments: {e} (the server's instruments_file, or `{REFERENCE_INSTRUMENTS}` \
                 for a server without one)"
            ))
        });
    }
    let ids = args.instrument.iter().filter_map(|name| name.parse::<u32>().ok());
    let universe = UniverseConfig::default();
    let instruments = ids.map(|id| id.saturating_add(1)).fold(universe.instruments, u32::max);
    Ok(reference_instruments(&UniverseConfig { instruments, ..universe }))
}

/// What the orders trade: each `--instrument` (symbol or id; default the file's first) at its
/// reference price, which is inside its band and on its tick, a lot per order.
fn traded_instruments(args: &LoadArgs) -> Result<Vec<Traded>, BadInput> {
    let file = instruments_file(args)?;
    let no_clients = exchange::instruments::ClientsFile { clients: Vec::new() };
    let bad = |e: exchange::ExchangeError| BadInput(format!("--instruments: {e}"));
    let (_, table) = exchange::instruments::load(&file, &no_clients).map_err(bad)?;
    let first = file.instruments.first().map(|spec| spec.symbol.clone());
    let names =
        if args.instrument.is_empty() { Vec::from_iter(first) } else { args.instrument.clone() };
    let traded = |name: &String| -> Result<Traded, String> {
        let by_id = name.parse().ok().filter(|&id| table.symbol_of(id).is_some());
        let id = table.id_of(name).or(by_id).ok_or("not listed")?;
        let spec = file.instruments.iter().find(|spec| table.id_of(&spec.symbol) == Some(id));
        let spec = spec.ok_or("not listed")?;
        let price = table.price_units(&spec.reference_price).map_err(|e| e.to_string())?;
        let qty = InstrumentTable::qty_units(&spec.lot_size).map_err(|e| e.to_string())?;
        let (symbol, price_decimals) = (spec.symbol.clone(), table.price_decimals());
        Ok(Traded { instrument: id, symbol, price, price_decimals, qty })
    };
    let traded = names.iter().map(|name| {
        let why =
            |e| BadInput(format!("--instrument {name}: {e} in {}", args.instruments.display()));
        traded(name).map_err(why)
    });
    let traded = traded.collect::<Result<Vec<Traded>, BadInput>>()?;
    if traded.is_empty() {
        return Err(BadInput(format!("{}: lists no instrument", args.instruments.display())));
    }
    Ok(traded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(layout: Option<LayoutChoice>, journal: Option<JournalMode>) -> ServeArgs {
        ServeArgs {
            listen: Some("127.0.0.1:0".parse().unwrap()),
            fix_listen: None,
            print_config: false,
            busy_poll: false,
            config: PathBuf::from("serve.toml"),
            metrics_listen: None,
            journal,
            snapshot_every: None,
            layout,
            planned_rate: 60_000.0,
            nats: None,
            nats_auth: Default::default(),
            replication: Default::default(),
        }
    }

    fn tier(args: &ServeArgs, text: &str) -> Result<TierConfig, BadInput> {
        let config: ServeConfig = toml::from_str(text).unwrap();
        tier_from(args, &config, layout_from(args, &config)?)
    }

    #[test]
    fn the_tier_table_then_the_serve_key_then_the_flag_decide_layout_and_journal() {
        let file =
            "credentials = \"c\"\n[tier]\nlayout = \"thread-per-stage\"\njournal = \"off\"\n";
        let from_table = tier(&args(None, None), file).unwrap();
        assert_eq!(from_table.layout, LayoutChoice::ThreadPerStage, "the [tier] table's");
        assert_eq!(from_table.journal, JournalMode::OFF, "the [tier] table's");
        let keyed = format!("layout = \"auto\"\n{file}");
        assert_eq!(tier(&args(None, None), &keyed).unwrap().layout, LayoutChoice::Auto);
        let flagged = args(Some(LayoutChoice::Auto), Some(JournalMode::default()));
        let from_flags = tier(&flagged, file).unwrap();
        assert_eq!(
            (from_flags.layout, from_flags.journal),
            (LayoutChoice::Auto, JournalMode::default())
        );
        let defaults = tier(&args(None, None), "credentials = \"c\"\n").unwrap();
        assert_eq!(
            (defaults.layout, defaults.journal),
            (LayoutChoice::Auto, JournalMode::default())
        );
    }

    #[test]
    fn old_layout_names_and_bad_tier_settings_are_named() {
        let old =
            tier(&args(None, None), "credentials = \"c\"\nlayout = \"inline\"\n").unwrap_err();
        assert!(old.0.contains("the gateway now runs the tier"), "{}", old.0);
        let bad = tier(&args(None, None), "credentials = \"c\"\n[tier]\nring_slots = 1000\n");
        assert!(bad.unwrap_err().0.contains("ring_slots"));
        let unknown = tier(&args(None, None), "credentials = \"c\"\n[tier]\nshards = 2\n");
        assert!(unknown.unwrap_err().0.contains("shards"));
    }

    #[test]
    fn the_metrics_listener_defaults_to_loopback_and_the_new_keys_reach_the_settings() {
        use crate::commands::admin::metrics_address;
        assert_eq!(metrics_address("9401"), Ok("127.0.0.1:9401".parse().unwrap()));
        assert_eq!(metrics_address("0.0.0.0:9401"), Ok("0.0.0.0:9401".parse().unwrap()));
        assert!(metrics_address("somewhere").unwrap_err().contains("HOST:PORT"));
        let keyed = "credentials = \"c\"\nmetrics_token = \"m\"\nmetrics_per_client = true\n\
                     store_bytes_max = 4096\nfix_resend_window = 10\n";
        let settings = settings_from(&toml::from_str(keyed).unwrap(), Path::new("."));
        assert_eq!(
            (settings.metrics_token.as_deref(), settings.metrics_per_client),
            (Some("m"), true)
        );
        assert_eq!((settings.store_bytes_max, settings.fix_resend_window), (4096, 10));
        let plain =
            settings_from(&toml::from_str("credentials = \"c\"\n").unwrap(), Path::new("."));
        assert_eq!((plain.metrics_token, plain.metrics_per_client), (None, false));
    }

    #[test]
    fn market_files_go_together_and_a_missing_one_is_named() {
        let run = |text: &str| {
            let config: ServeConfig = toml::from_str(text).unwrap();
            let base = Path::new("/nonexistent");
            with_market_files(TierConfig::default(), Settings::default(), &config, base)
        };
        let alone = run("credentials = \"c\"\ninstruments_file = \"i.toml\"\n").unwrap_err();
        assert!(alone.0.contains("go together"), "{}", alone.0);
        let both =
            "credentials = \"c\"\ninstruments_file = \"i.toml\"\nclients_file = \"c.toml\"\n";
        let missing = run(both).unwrap_err();
        assert!(missing.0.contains("/nonexistent/i.toml"), "{}", missing.0);
        let (tier, settings) = run("credentials = \"c\"\n").unwrap();
        assert!(tier.master_data.is_none() && settings.instruments.is_empty(), "the reference");
    }
}
