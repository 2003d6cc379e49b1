//! `exchange serve --role engine|gateway`: the tier split across processes on NATS JetStream
//! (docs/REPLICATION.md). An engine follows its shard's input log, runs the tier on it, and
//! publishes reports and market data over NATS while it holds the shard's lease (the others of
//! its group apply every input too and take over when the lease lapses). A gateway runs the
//! sessions, appends their orders to the shard streams and answers them with the engines'
//! reports.

use std::io::Write;
use std::net::SocketAddr;

use delivery::nats::NatsConnect;
use exchange::tier::TierConfig;
use gateway::BoundAddresses;
use gateway::RemoteOptions;
use gateway::Settings;
use gateway::credentials::Credential;
use replication::engine::{Engine, EngineOptions};
use replication::layout::LogSettings;
use replication::lease::LeaseSettings;

use super::exchange_serve::ServeArgs;
use crate::outcome::BadInput;

/// What an `exchange serve` process runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Sessions and the tier in one process, on the local journal.
    #[default]
    All,
    /// The tier of one shard on its JetStream input log (`--nats`), publishing while it
    /// holds the shard's lease.
    Engine,
    /// The sessions without a tier: orders to the shard streams, reports from the engines.
    Gateway,
}

/// The replicated layout's settings (`--role engine`).
#[derive(clap::Args, Debug, Clone)]
pub struct ReplicationArgs {
    /// What this process runs: `all`, sessions and the tier on the local journal; `engine`,
    /// the tier of `--shard` on its JetStream input log at `--nats` (a cluster's URLs
    /// comma-separated), publishing reports over NATS while it holds the shard's lease;
    /// `gateway`, the sessions, appending orders to the shard streams and answering with the
    /// engines' reports (docs/REPLICATION.md).
    #[arg(long, value_enum, default_value_t)]
    pub role: Role,
    /// The shard this engine books (instruments with `instrument % shards == shard`).
    #[arg(long, default_value_t = 0)]
    pub shard: u32,
    /// Shard streams of the input log.
    #[arg(long, default_value_t = 1)]
    pub shards: u32,
    /// Copies JetStream keeps of each stream and of the lease: 3 on a three-node cluster
    /// (one node may fail), 1 on one server.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// First token of every subject (and, upper-cased, of the stream names): exchanges that
    /// share a NATS cluster each take their own.
    #[arg(long, default_value = replication::layout::PREFIX_DEFAULT)]
    pub prefix: String,
    /// How long JetStream remembers an append's message id: a gateway's retry inside it never
    /// books a second order. Set on the shard streams when they are created (an existing
    /// stream keeps its own).
    #[arg(long, value_parser = super::values::seconds, default_value = "2m")]
    pub dedup_window: std::time::Duration,
    /// Reports an engine keeps in memory per subject for gateways' gap recovery; older ones
    /// are recomputed from the shard's snapshot and input log when a gateway asks for them.
    #[arg(long, default_value_t = delivery::publish::RETAIN_RECORDS_DEFAULT)]
    pub retain_records: usize,
}

impl Default for ReplicationArgs {
    /// What the flags default to.
    fn default() -> Self {
        ReplicationArgs {
            role: Role::All,
            shard: 0,
            shards: 1,
            replicas: 1,
            prefix: replication::layout::PREFIX_DEFAULT.into(),
            dedup_window: replication::layout::DEDUP_WINDOW_DEFAULT,
            retain_records: delivery::publish::RETAIN_RECORDS_DEFAULT,
        }
    }
}

/// The NATS connection and the input log's layout the flags name.
pub(super) fn log_from(args: &ServeArgs) -> anyhow::Result<(NatsConnect, LogSettings)> {
    let settings = &args.replication;
    let Some(url) = &args.nats else {
        return Err(BadInput(
            "--role engine and gateway need --nats (the JetStream servers)".into(),
        )
        .into());
    };
    let nats = args.nats_auth.connect(url)?;
    let log = LogSettings {
        prefix: settings.prefix.clone(),
        shards: settings.shards,
        dedup_window: settings.dedup_window,
        ..LogSettings::new(settings.replicas)
    };
    log.validate().map_err(|e| BadInput(e.to_string()))?;
    Ok((nats, log))
}

/// Runs one engine until SIGTERM or SIGINT, then gives its lease up (a standby takes over at
/// once), drains the tier and the publisher and exits 0.
pub fn serve_engine(
    args: &ServeArgs,
    tier: TierConfig,
    metrics: (Option<SocketAddr>, Option<String>),
) -> anyhow::Result<()> {
    let settings = &args.replication;
    let (nats, log) = log_from(args)?;
    if settings.shard >= settings.shards {
        return Err(
            BadInput(format!("--shard {} of {} shards", settings.shard, settings.shards)).into()
        );
    }
    let publish = delivery::publish::PublishOptions {
        nats: nats.clone(),
        prefix: delivery::subjects::PREFIX_DEFAULT.into(),
        outlets: tier.outlets,
        retain_records: settings.retain_records,
        wait: pipeline::WaitStrategy::Park,
        heartbeat: delivery::publish::HEARTBEAT_INTERVAL_DEFAULT,
    };
    let mut stop = StopSignals::listen()?;
    let engine = Engine::start(EngineOptions {
        nats,
        lease: LeaseSettings::new(&log.prefix, settings.replicas),
        shard: settings.shard,
        holder: holder_name(),
        tier,
        publish,
        planned_rate_per_s: args.planned_rate,
        log: log.clone(),
    })?;
    // Not `println!`: a supervisor that read this line may have closed the pipe.
    let _ = writeln!(
        std::io::stdout(),
        "engine for shard {} following {}",
        settings.shard,
        log.stream(settings.shard)
    );
    let (readiness, mut registry) = (ops::Readiness::default(), ops::Registry::default());
    engine.register_metrics(&mut registry);
    let _admin = super::admin::serve_admin(metrics, registry, &readiness)?;
    let follow = super::admin::follow_readiness(&readiness, "the input log", || engine.is_ready());
    let signal = stop.wait_following(follow);
    readiness.set(false);
    tracing::info!(signal, "stop requested: releasing the lease and draining");
    let stopped = engine.stop()?;
    super::admin::print_stopped(signal);
    tracing::info!(
        signal,
        applied_seq = stopped.applied_seq,
        published = stopped.published.published,
        withheld = stopped.published.withheld,
        "engine stopped"
    );
    Ok(())
}

/// Runs the sessions without a tier until SIGTERM or SIGINT, then refuses new orders, answers
/// those taken (as the engines report them), lets every append finish and exits 0.
pub fn serve_gateway(
    args: &ServeArgs,
    (settings, credentials): (Settings, Vec<Credential>),
    addresses: BoundAddresses,
    tier_outlets: u32,
) -> anyhow::Result<()> {
    let (nats, log) = log_from(args)?;
    let mut stop = StopSignals::listen()?;
    let running = gateway::start_remote(RemoteOptions {
        addresses,
        settings,
        credentials,
        nats,
        log,
        tier_outlets,
        gateway_id: std::process::id(),
    })?;
    let (listen, fix_listen, metrics_listen) = running.addresses;
    println!("native listening on {listen}");
    if let Some(fix) = fix_listen {
        println!("FIX 4.4 listening on {fix}");
    }
    if let Some(metrics) = metrics_listen {
        println!("metrics on http://{metrics}/metrics");
    }
    let signal = stop.wait_following(std::future::pending());
    tracing::info!(signal, "stop requested: draining");
    let tally = running.stop();
    super::admin::print_stopped(signal);
    tracing::info!(signal, appended = tally.appended, failed = tally.failed, "gateway stopped");
    Ok(())
}

/// SIGTERM and SIGINT (every `exchange serve` role), listened for from before the server serves (a supervisor may stop it
/// as soon as it has read the first line).
pub(super) struct StopSignals {
    runtime: tokio::runtime::Runtime,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub(super) fn listen() -> anyhow::Result<StopSignals> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let terminate = runtime.block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        })?;
        Ok(StopSignals { runtime, terminate })
    }

    /// Runs `follow` (a readiness follower, running until stopped) until either signal comes;
    /// the signal's name.
    pub(super) fn wait_following(
        &mut self,
        follow: impl std::future::Future<Output = ()>,
    ) -> &'static str {
        let terminate = &mut self.terminate;
        self.runtime.block_on(async {
            tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = tokio::signal::ctrl_c() => "SIGINT",
                () = follow => unreachable!("followers run until stopped"),
            }
        })
    }
}

/// `host-pid-nonce`: how the lease and the progress notes name this process. The random
/// nonce makes it unique per process start: containers repeat host names and pids, and two
/// engines under one name would share a progress note (one's note hiding the other's lag).
fn holder_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    use std::hash::{BuildHasher, Hasher};
    // std's per-process random hash keys, mixed with the wall clock: no generator needed.
    let mut nonce = std::collections::hash_map::RandomState::new().build_hasher();
    nonce.write_u128(std::time::UNIX_EPOCH.elapsed().unwrap_or_default().as_nanos());
    format!("{}-{}-{:08x}", host.trim(), std::process::id(), nonce.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        replication: ReplicationArgs,
    }

    #[test]
    fn the_flags_default_to_the_libraries_defaults() {
        let parsed = Flags::parse_from(["leantier"]).replication;
        let default = ReplicationArgs::default();
        assert_eq!(parsed.dedup_window, default.dedup_window, "2m is DEDUP_WINDOW_DEFAULT");
        assert_eq!((parsed.shards, parsed.replicas), (default.shards, default.replicas));
        assert_eq!((parsed.prefix, parsed.role), (default.prefix, default.role));
        let short = Flags::parse_from(["leantier", "--dedup-window", "30s"]).replication;
        assert_eq!(short.dedup_window, std::time::Duration::from_secs(30));
    }
}
