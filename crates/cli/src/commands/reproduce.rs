//! `leantier reproduce`'s flags; the runner (the five papers' experiments beside the
//! published figures, a verdict per claim, `index.html`) is `experiments::reproduce`.

use std::path::PathBuf;

use super::web::prefork_child_args;

/// Arguments of `leantier reproduce`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The quick scale (all five papers in minutes): fewer repeats, shorter runs.
    #[arg(long)]
    pub quick: bool,
    /// Only these papers (comma-separated ids: 000 lean tier, 001 delivery, 002 middleware,
    /// 003 planner, 004 web service).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Folder for index.html and the data files.
    #[arg(long, default_value = "leantier-report/reproduce")]
    pub out: PathBuf,
    /// Another copy of the published figures (TOML) instead of the embedded one.
    #[arg(long)]
    pub published: Option<PathBuf>,
    /// The message queue's store: `sqlite:DIR` or a `postgres://` URL [default: SQLite in a
    /// temporary folder].
    #[arg(long, env = "LEANTIER_PG_URL")]
    pub mq_store: Option<String>,
    /// Python interpreter with Flask for the web service's Python baselines [default:
    /// `python3` when it imports flask; otherwise the baselines are reported not measurable].
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// `leantier reproduce`.
pub fn run(args: &Args) -> anyhow::Result<()> {
    experiments::reproduce::run(&experiments::reproduce::Settings {
        quick: args.quick,
        only: args.only.clone(),
        out: args.out.clone(),
        published: args.published.clone(),
        mq_store: args.mq_store.clone(),
        python: args.python.clone(),
        child_args: prefork_child_args(),
    })
}
