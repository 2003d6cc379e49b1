//! Test child: one delivery edge process (`leantier exchange edge` runs the same library code).
//! Flags: `--nats URL --outlet N --listen ADDR [--prefix P] [--queue-chunks N]`. Prints
//! `listening ADDR` once it serves, and `report JSON` after SIGTERM, then exits.

use delivery::edge::{EdgeOptions, start};
use ops::child_flags::ChildFlags;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let flags = ChildFlags::from_env(&["nats", "outlet", "listen", "prefix", "queue-chunks"])?;
    let mut options = EdgeOptions::new(
        &flags.required::<String>("nats")?,
        flags.required("outlet")?,
        flags.required("listen")?,
    );
    if let Some(prefix) = flags.optional::<String>("prefix")? {
        options.prefix = prefix;
    }
    if let Some(chunks) = flags.optional("queue-chunks")? {
        options.consumer_queue_chunks = chunks;
    }
    // Events go to stderr, where a failing test shows them.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    runtime.block_on(async {
        let edge = start(options).await?;
        if let Some(listening) = edge.local_addr() {
            println!("listening {listening}");
        }
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        terminate.recv().await;
        let (report, _) = edge.shutdown().await?;
        println!("report {}", serde_json::to_string(&report)?);
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
