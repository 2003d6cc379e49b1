use clap::Parser;
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: web::cli::Args,
}
fn main() -> anyhow::Result<()> {
    tracing_subscriber_init();
    web::cli::run(&Cli::parse().args)
}
fn tracing_subscriber_init() {}
