//! Standalone `mq` command (same as `leantier mq`); the reliability tests run nodes with it as
//! child processes so they can SIGKILL them.

use clap::Parser;

/// leantier message-queuing middleware.
#[derive(Parser)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    args: mq::cli::Args,
}

fn main() -> std::process::ExitCode {
    lab::outcome::exit_code_for(mq::cli::run(&Cli::parse().args))
}
