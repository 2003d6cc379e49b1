//! `exchange serve --role engine`: one engine of a shard's group on NATS JetStream
//! (docs/REPLICATION.md). It follows the shard's input log, runs the tier on it, and publishes
//! reports and market data over NATS while it holds the shard's lease; the others of its group
//! apply every input too and take over when the lease lapses.

use std::io::Write;

use exchange::tier::TierConfig;
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
}

/// The replicated layout's settings (`--role engine`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ReplicationArgs {
    /// What this process runs: `all`, sessions and the tier on the local journal; `engine`,
    /// the tier of `--shard` on its JetStream input log at `--nats` (a cluster's URLs
    /// comma-separated), publishing reports over NATS while it holds the shard's lease
    /// (docs/REPLICATION.md).
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
}

/// Runs one engine until SIGTERM or SIGINT, then gives its lease up (a standby takes over at
/// once), drains the tier and the publisher and exits 0.
pub fn serve(args: &ServeArgs, tier: TierConfig) -> anyhow::Result<()> {
    let settings = &args.replication;
    let Some(url) = &args.nats else {
        return Err(BadInput("--role engine needs --nats (the JetStream servers)".into()).into());
    };
    let nats = args.nats_auth.connect(url)?;
    let log = LogSettings { shards: settings.shards, ..LogSettings::new(settings.replicas) };
    log.validate().map_err(|e| BadInput(e.to_string()))?;
    if settings.shard >= settings.shards {
        return Err(
            BadInput(format!("--shard {} of {} shards", settings.shard, settings.shards)).into()
        );
    }
    let publish = delivery::publish::PublishOptions {
        nats: nats.clone(),
        prefix: delivery::subjects::PREFIX_DEFAULT.into(),
        gateways: tier.gateways,
        retain_records: delivery::publish::RETAIN_RECORDS_DEFAULT,
        wait: pipeline::WaitStrategy::Park,
        heartbeat: delivery::publish::HEARTBEAT_INTERVAL_DEFAULT,
    };
    let signals = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut terminate = signals.block_on(async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    })?;
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
    let signal = signals.block_on(async {
        tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        }
    });
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

/// `host-pid`: how the lease names its holder in logs.
fn holder_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}
