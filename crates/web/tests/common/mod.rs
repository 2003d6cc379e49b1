//! Helpers shared by the integration tests that feed requests to the connection code in memory.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use web::conn::{self, ConnectionBounds};

/// Sends `raw` on an in-memory connection served by [`conn::serve_io`] and returns everything
/// the server wrote before it closed; an error when it did not close within `patience` (a
/// hang) or the connection task failed.
pub async fn exchange_in_memory(
    router: axum::Router,
    bounds: ConnectionBounds,
    raw: Vec<u8>,
    patience: Duration,
) -> Result<Vec<u8>, String> {
    let (client, server) = tokio::io::duplex(1 << 16);
    let serving = tokio::spawn(conn::serve_io(server, router, bounds, None));
    let (mut reader, mut writer) = tokio::io::split(client);
    let writing = tokio::spawn(async move {
        // The server may answer (and close) before it read everything: the write may fail.
        let _ = writer.write_all(&raw).await;
        writer
    });
    let mut answer = Vec::new();
    tokio::time::timeout(patience, reader.read_to_end(&mut answer))
        .await
        .map_err(|_| format!("no close within {patience:?} (a hang)"))?
        .map_err(|error| format!("reading the answer: {error}"))?;
    serving.await.map_err(|error| format!("the connection task failed: {error}"))?;
    drop(writing.await);
    Ok(answer)
}
