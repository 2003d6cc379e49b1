//! The disk's own cost, measured the way a journal pays it: the baseline that journal and tier
//! experiments compare their durable latency with, on the same disk in the same run.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use stats::LatencyHistogram;

/// Bytes per raw append: one page, the smallest write a group commit makes.
pub const RAW_APPEND_BYTES: usize = 4096;

/// Appends [`RAW_APPEND_BYTES`] to a scratch file under `root` and `fdatasync`s it, `samples`
/// times; the latency of each append + sync. The file is removed afterwards.
pub fn raw_fdatasync(root: &Path, samples: u64) -> std::io::Result<LatencyHistogram> {
    let path = root.join("raw-fdatasync.bin");
    let in_context = |action: &str| {
        let path = path.display().to_string();
        let action = action.to_string();
        move |error: std::io::Error| {
            std::io::Error::new(error.kind(), format!("{action} {path}: {error}"))
        }
    };
    let file = std::fs::File::create(&path).map_err(in_context("creating"))?;
    let block = [0x5Au8; RAW_APPEND_BYTES];
    let mut latency = LatencyHistogram::new();
    for i in 0..samples {
        let started = Instant::now();
        file.write_all_at(&block, i * RAW_APPEND_BYTES as u64).map_err(in_context("writing"))?;
        file.sync_data().map_err(in_context("syncing"))?;
        latency.record_duration(started.elapsed());
    }
    std::fs::remove_file(&path).map_err(in_context("removing"))?;
    Ok(latency)
}
