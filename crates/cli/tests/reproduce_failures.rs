//! Issue 45: the full `reproduce` run failed for paper 004 because a per-core web server
//! started its children with its parent's own arguments, so under `reproduce` each child ran
//! `reproduce` again instead of serving, and the command still exited 0. The full paper-004
//! run takes minutes, so these tests check its two halves cheaply on the built binary: a
//! parent that is not `leantier web` (this test) starts `leantier web prefork-child` children
//! that serve (main.rs's unit test checks every parent starts its children so), and a paper
//! whose run fails makes `reproduce` exit 1 with the page written and showing why.

use std::ffi::OsString;
use std::process::{Command, Output};

use bytes::Bytes;
use web::client::JsonClient;
use web::exec::{Calibration, Model};
use web::prefork::{ChildSpec, Prefork};
use web::server::ServeBounds;

/// The subcommand path every parent starts its per-core children with
/// (`commands::web::PREFORK_CHILD_COMMAND` in the binary).
const PREFORK_CHILD: [&str; 2] = ["web", "prefork-child"];

/// The smallest matrix request, and its product.
const REQUEST: &str = r#"{"requestId": 7,
    "matrixOne": {"columnCount": 2, "rows": [{"value": "1,2"}]},
    "matrixTwo": {"columnCount": 1, "rows": [{"value": "3"}, {"value": "4"}]}}"#;
const ANSWER: &[u8] = br#"{"requestId":"7","rows":[[11]]}"#;

fn leantier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leantier")).args(args).output().expect("leantier runs")
}

fn prefork_template() -> ChildSpec {
    ChildSpec {
        model: Model::Prefork,
        cpu: 0,
        pool_threads: 2,
        calibration: Calibration { parallel_body_bytes_min: usize::MAX },
        host_counter_fd: -1,
        dealt_channel_fd: None,
        addr: "127.0.0.1:0".parse().unwrap(),
        dim_max: 100,
        cells_max: 10_000,
        answer_bytes_max: web::api::ANSWER_BYTES_MAX_DEFAULT,
        queue_depth_max: 16,
        body_bytes_max: 1 << 16,
        bounds: ServeBounds::default(),
        metrics_token: None,
    }
}

/// `Prefork::start` returns only once every child printed its ready line (before the fix, a
/// child running another command printed that command's output instead and the start failed);
/// then each of a few fresh connections is answered with the right product.
#[test]
fn prefork_children_serve_for_a_parent_that_is_not_leantier_web() {
    let template = prefork_template();
    let exe = env!("CARGO_BIN_EXE_leantier").into();
    let args: Vec<OsString> = PREFORK_CHILD.map(OsString::from).to_vec();
    let children = Prefork::start(template.addr, 2, template, exe, &args)
        .expect("two `leantier web prefork-child` children start and say they serve");
    let url = format!("http://{}/matrix/prefork", children.local_addr());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        for _ in 0..6 {
            // A fresh client per request: new connections, spread by the kernel over both.
            let (status, body) =
                JsonClient::default().post(&url, Bytes::from(REQUEST)).await.unwrap();
            assert_eq!((status, body), (200, Bytes::from_static(ANSWER)));
        }
    });
}

/// The hidden subcommand is for a parent only: by hand, without its role in the
/// environment, it refuses with exit 2 and says who starts it.
#[test]
fn prefork_child_by_hand_is_bad_input() {
    let out = leantier(&PREFORK_CHILD);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(web::prefork::CHILD_ENV), "{stderr}");
}

/// Paper 002 over a store that cannot be created fails at once; the command exits 1 and
/// says which paper failed, and the page it still writes shows the failure.
#[test]
fn a_failed_paper_fails_reproduce_with_the_page_written() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("report");
    let out = leantier(&[
        "reproduce",
        "--quick",
        "--only",
        "002",
        "--mq-store",
        "sqlite:/proc/leantier-no-such-dir",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the run of paper 002 failed"), "{stderr}");
    let page = std::fs::read_to_string(out_dir.join("index.html")).expect("the page is written");
    assert!(page.contains("The run failed: creating data dir"), "the page shows why");
}
