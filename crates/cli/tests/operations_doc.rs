//! docs/OPERATIONS.md's "A first exchange" runs as written: its `bash` block (configure,
//! start, trade, stop, back up, restore, trade again) is run by bash with `leantier` on the
//! PATH, in a folder of its own, and must exit 0 (its own `grep -q` lines are its checks).

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

/// The first ```bash block after `## A first exchange`.
fn documented_sequence() -> String {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/OPERATIONS.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let section = text.split_once("## A first exchange").expect("the section").1;
    let block = section.split_once("```bash\n").expect("a bash block").1;
    block.split_once("```").expect("the block's end").0.to_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn the_documented_first_exchange_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    // A server the sequence started in the background is stopped with it, however it ends.
    let cleanup = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT";
    let script = format!("{cleanup}\nset -euo pipefail\n{}", documented_sequence());
    std::fs::write(dir.path().join("sequence.sh"), script).unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_leantier"));
    let path = format!("{}:{}", binary.parent().unwrap().display(), std::env::var("PATH").unwrap());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = Command::new("timeout")
        .args(["120", "bash", "sequence.sh"])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("LEANTIER_REPO", repo)
        .env("PORT", free_port().to_string())
        .env("METRICS_PORT", free_port().to_string())
        .output()
        .unwrap();
    let logs: String = ["serve.log", "restored.log"]
        .iter()
        .map(|log| std::fs::read_to_string(dir.path().join(log)).unwrap_or_default())
        .collect();
    assert!(
        output.status.success(),
        "the sequence failed ({:?}):\n{}\n{}\nserver logs:\n{logs}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
