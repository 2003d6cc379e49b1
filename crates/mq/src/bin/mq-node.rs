//! A standalone mq node: `leantier mq serve` without the rest of leantier. The reliability
//! tests run nodes with it as child processes so they can SIGKILL them.
//!
//! Flags: `--listen ADDR` (default 127.0.0.1:7440), `--store sqlite:DIR|postgres://...`,
//! `--config FILE` (NodeConfig fields, TOML), `--db-workers N`, `--frame-memory-bytes-max N` and
//! `--reply-memory-bytes-max N` (override the file). Logs go to stderr via `tracing`, filtered by `RUST_LOG` (default info).

use std::path::PathBuf;

use mq::{server, store};
use ops::child_flags::ChildFlags;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The node's limits: `--config`'s, with the flags over them.
fn node_config(flags: &ChildFlags) -> Result<server::NodeConfig, Error> {
    let config_path: Option<PathBuf> = flags.optional("config")?;
    let mut config: server::NodeConfig = ops::config::load_toml(config_path.as_deref())?;
    ops::config::override_with(&mut config.db_workers, &flags.optional("db-workers")?);
    let frame_memory = flags.optional("frame-memory-bytes-max")?;
    ops::config::override_with(&mut config.frame_memory_bytes_max, &frame_memory);
    let reply_memory = flags.optional("reply-memory-bytes-max")?;
    ops::config::override_with(&mut config.reply_memory_bytes_max, &reply_memory);
    config.validate()?;
    Ok(config)
}

async fn serve(flags: &ChildFlags, config: server::NodeConfig) -> Result<(), Error> {
    let listen: String = flags.get_or("listen", "127.0.0.1:7440".to_string())?;
    let store_url: String = flags.required("store")?;
    // One node process per SQLite store, as `mq serve` (the tests wait for a killed node's
    // exit before they start the next on its store).
    let _owner = store::claim(&store_url)?;
    let store = store::AnyStore::open(&store_url, config.db_workers).await?;
    let node = server::start(&listen, store, config).await?;
    eprintln!("mq node listening on {} (store {store_url})", node.addr);
    tokio::signal::ctrl_c().await?;
    node.shutdown().await;
    Ok(())
}

fn main() -> Result<(), Error> {
    let flags = ChildFlags::from_env(&[
        "listen",
        "store",
        "config",
        "db-workers",
        "frame-memory-bytes-max",
        "reply-memory-bytes-max",
    ])?;
    // The node's connection, batch and store events; `RUST_LOG` filters them (default info),
    // plain text when stderr is not a terminal (the tests read it through a pipe).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = node_config(&flags)?;
    let runtime = server::node_runtime(&config).build()?;
    runtime.block_on(serve(&flags, config))
}
