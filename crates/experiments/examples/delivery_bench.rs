//! `leantier exchange delivery-bench` without the command line's crates: builds in a fraction
//! of the time, so two builds (before and after a change) can run turn about. Prints the
//! report as one JSON line.
//!
//! ```text
//! cargo run --release -p experiments --example delivery_bench -- NATS_URL [RECORDS [REPEATS [WAIT]]]
//! ```

use delivery::nats::NatsConnect;
use exchange::tier::WaitChoice;

const USAGE: &str = "usage: delivery_bench NATS_URL [RECORDS (200000) [REPEATS (5) [WAIT (auto)]]]
Runs R-Sender -> NATS -> delivery edge against a plain async-nats pair on the server at NATS_URL
and prints the report (experiments::delivery_bench::BenchReport) as one JSON line.";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args.iter().any(|arg| arg == "--help" || arg == "-h") {
        println!("{USAGE}");
        std::process::exit(if args.is_empty() { 2 } else { 0 });
    }
    let parsed = parse(&args);
    let (url, records, repeats, wait) = parsed.unwrap_or_else(|why| {
        eprintln!("delivery_bench: {why}\n{USAGE}");
        std::process::exit(2);
    });
    match experiments::delivery_bench::run(&NatsConnect::new(&url), records, repeats, wait) {
        Ok(report) => println!("{}", serde_json::to_string(&report).expect("a report serialises")),
        Err(error) => {
            eprintln!("delivery_bench: {error}");
            std::process::exit(1);
        }
    }
}

fn parse(args: &[String]) -> Result<(String, u64, usize, WaitChoice), String> {
    let number = |at: usize, default: u64| -> Result<u64, String> {
        args.get(at).map_or(Ok(default), |text| {
            text.parse().map_err(|_| format!("`{text}` is not a whole number"))
        })
    };
    let wait = match args.get(3) {
        Some(text) => text.parse::<WaitChoice>().map_err(|why| why.to_string())?,
        None => WaitChoice::Auto,
    };
    Ok((args[0].clone(), number(1, 200_000)?, number(2, 5)? as usize, wait))
}
