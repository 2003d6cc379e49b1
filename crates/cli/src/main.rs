//! `leantier`: the command line. This crate is the only one that knows about flags, terminals
//! and exit codes: each module of [`commands`] parses one area's flags, calls the library
//! crates (which return typed results) and prints them; [`outcome`] maps errors to exit codes.
//! This file sets up logging and dispatches.

mod commands;
mod outcome;
mod quiet;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Build, measure, model and tune the lean multi-core business tier of transaction systems.
#[derive(Parser)]
#[command(name = "leantier", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing `EnvFilter` syntax), e.g. `warn` or `pipeline=debug`; `info` (the
    /// default, with the NATS client library at `warn`: leantier logs its connections once
    /// itself) shows each session event once (logins, logouts, cut-offs, recoveries, stops).
    #[arg(long, global = true, env = "LEANTIER_LOG", default_value = "info,async_nats=warn")]
    log: String,
    /// Log lines as `text` (for people) or `json` (one object per line, for log collectors).
    #[arg(long, global = true, env = "LEANTIER_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main demo: `exchange serve` in-process on loopback driven by open-loop native
    /// sessions at 20K/40K/60K orders/s: in-tier response (beside the published lean tier),
    /// order → ack and durable reply at the client, then the highest rate per view; writes a
    /// report folder. `--in-process`: the tier's own critical path without a network.
    Demo(commands::exchange::DemoArgs),
    /// The reference exchange tier: run a configuration, or an experiment.
    Exchange(commands::exchange::Args),
    /// Micro-benchmarks that run leantier and its peers in the same run and print the ratios.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Message-queuing middleware: serve a node, run a client, load-test, benchmark.
    Mq(commands::mq::Args),
    /// REST matrix service under selectable execution models, and its load lab.
    Web(commands::web::Args),
    /// Capacity planner: measure a pipeline, model it as a queueing network, optimize threads.
    Plan(commands::planner::Args),
    /// The call-data-ticket pipeline: run a planner config, compare measured vs predicted.
    Cdr(commands::cdr::Args),
    /// Each of the five papers' experiments at a scale this machine runs, beside the published
    /// figures, with a verdict per claim: one self-contained index.html and data files.
    Reproduce(commands::reproduce::Args),
    /// Tools for a replicated engine group: `check` compares what its leaders published with a
    /// replay of the shard's input log.
    Replication(commands::replication::Args),
    /// Deterministic simulation of the replicated tier under seeded faults: run or replay a
    /// seed, or many, with the invariants checked as it runs.
    Sim(commands::sim::Args),
    /// The safe store writer: journal benchmark (throughput, fdatasync baseline, durable-reply
    /// latency per policy) and a read-only journal checker.
    Journal(commands::journal::Args),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Ring throughput (leantier vs rtrb, crossbeam, disruptor, std mpsc, blocking) and
    /// pinned ping-pong latency, plus the wake-up and idle-CPU cost of each wait strategy.
    Ring(commands::bench_ring::Args),
    /// The open-loop load generator alone: the highest rate it keeps up with on one thread,
    /// its schedule lag and its CPU use, into a null sink and into a drained ring.
    LoadGen(commands::bench_load_gen::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's terminal tells its story: the servers' logs go to a file in its report
    // folder, only warnings and errors to the terminal too.
    let log_file = match &cli.command {
        Command::Demo(args) if !args.in_process => Some(args.out.join(DEMO_LOG_FILE)),
        _ => None,
    };
    let repeats = init_logging(&cli.log, &cli.log_format, log_file.as_deref());
    commands::web::set_child_logging(&cli.log, &cli.log_format);
    let result = match cli.command {
        Command::Demo(args) => commands::demo::run(&args),
        Command::Exchange(args) => commands::exchange::run(&args),
        Command::Bench(BenchCommand::Ring(args)) => commands::bench_ring::run(&args),
        Command::Bench(BenchCommand::LoadGen(args)) => commands::bench_load_gen::run(&args),
        Command::Mq(args) => commands::mq::run(&args),
        Command::Web(args) => commands::web::run(&args),
        Command::Plan(args) => {
            commands::planner::run(&args, &[&cdr::measure::CdrWorkload::default()])
        }
        Command::Cdr(args) => commands::cdr::run(&args),
        Command::Journal(args) => commands::journal::run(&args),
        Command::Replication(args) => commands::replication::run(&args),
        Command::Sim(args) => commands::sim::run(&args),
        Command::Reproduce(args) => commands::reproduce::run(&args),
    };
    for line in repeats.report() {
        eprintln!("{line}");
    }
    outcome::exit_code_for(result)
}

/// The demo's server log, in its report folder.
pub const DEMO_LOG_FILE: &str = experiments::demo::LOG_FILE;

/// Logs to stderr, filtered by `filter`, as text (repeated lines folded, [`quiet`]) or as JSON
/// lines (`format`); with `file`, every line goes to that file instead and only warnings and
/// errors to stderr too (a file that cannot be created: all to stderr, with a warning).
/// Returns the folded lines' counts.
fn init_logging(filter: &str, format: &str, file: Option<&std::path::Path>) -> quiet::Repeats {
    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer, Registry};
    type Boxed = Box<dyn Layer<Registry> + Send + Sync>;
    let repeats = quiet::Repeats::default();
    let json = format == "json";
    let opened = file.map(|path| {
        std::fs::create_dir_all(path.parent().unwrap_or(std::path::Path::new(".")))
            .and_then(|()| std::fs::File::create(path))
            .map_err(|error| format!("cannot write the log file {}: {error}", path.display()))
    });
    let mut layers: Vec<Boxed> = Vec::new();
    if let Some(Ok(file)) = &opened {
        let writer = std::sync::Arc::new(file.try_clone().expect("a log file handle"));
        let to_file = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(false);
        let to_file: Boxed = if json { to_file.json().boxed() } else { to_file.boxed() };
        layers.push(to_file.with_filter(EnvFilter::new(filter)).boxed());
    }
    // Colour codes only for a person at a terminal; logs piped to a file stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let terminal = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let terminal: Boxed = if json {
        terminal.json().boxed()
    } else {
        let folding = repeats.clone();
        terminal.with_ansi(ansi).map_event_format(move |text| folding.fold(text)).boxed()
    };
    let terminal = terminal.with_filter(EnvFilter::new(filter));
    let level = if matches!(opened, Some(Ok(_))) { LevelFilter::WARN } else { LevelFilter::TRACE };
    layers.push(terminal.with_filter(level).boxed());
    tracing_subscriber::registry().with(layers).init();
    if let Some(Err(why)) = opened {
        tracing::warn!("{why}; logging to the terminal");
    }
    repeats
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap's own consistency checks over the whole command tree (conflicts, defaults, names).
    #[test]
    fn the_command_tree_is_consistent() {
        super::Cli::command().debug_assert();
    }

    /// A per-core server's children are started with `prefork_child_args()` whatever command
    /// their parent runs (issue 45: under `reproduce` they re-ran `reproduce`); those
    /// arguments must parse as `web prefork-child`, with the parent's log settings.
    #[test]
    fn prefork_children_are_started_as_web_prefork_child() {
        use crate::commands::web;
        use clap::Parser;
        web::set_child_logging("warn,web=debug", "json");
        let args = web::prefork_child_args();
        let cli = super::Cli::try_parse_from(std::iter::once("leantier".into()).chain(args))
            .expect("the child's arguments parse");
        let child = matches!(&cli.command, super::Command::Web(w)
            if matches!(w.command, web::Command::PreforkChild));
        assert!(child, "the child runs `web prefork-child`");
        assert_eq!((cli.log.as_str(), cli.log_format.as_str()), ("warn,web=debug", "json"));
    }

    /// Spellings replaced by one name per concept (issues 28 and 44); each may live on only as a
    /// hidden alias of its replacement, for one release: (old, the one name now).
    const RETIRED: &[(&str, &str)] = &[
        ("seconds", "duration"),
        ("duration-s", "duration"),
        ("measure-s", "measure"),
        ("run-s", "run"),
        ("step-seconds", "step"),
        ("linger-seconds", "linger"),
        ("linger-ms", "linger"),
        ("throughput-ms", "throughput-duration"),
        ("rates", "rate"),
        ("rate-per-s", "rate"),
        ("arrival-rate", "rate"),
        ("out-dir", "out"),
        ("report-dir", "out"),
        ("report", "out"),
        ("max", "find-max"),
        ("no-pin", "placement"),
        ("gateway", "outlet"),
    ];

    /// Durations take their unit in the value (`3s`, `500ms`), never in the flag's name.
    const UNIT_SUFFIXES: &[&str] = &["-s", "-ms", "-us", "-ns", "-seconds", "-secs", "-millis"];

    /// Every visible long flag and visible alias of `command` and its subcommands, with the
    /// command path it belongs to.
    fn visible_flags(command: &clap::Command, path: &str, found: &mut Vec<(String, String)>) {
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
            let aliases = arg.get_visible_aliases().unwrap_or_default();
            for long in arg.get_long().into_iter().chain(aliases) {
                found.push((path.to_string(), long.to_string()));
            }
        }
        for sub in command.get_subcommands() {
            let sub_path = format!("{path} {}", sub.get_name()).trim().to_string();
            visible_flags(sub, &sub_path, found);
        }
    }

    /// What is wrong with one visible long flag, if anything.
    fn misspelling(long: &str) -> Option<String> {
        if let Some((_, now)) = RETIRED.iter().find(|(old, _)| *old == long) {
            return Some(format!(
                "--{long} is retired: use --{now} (old spellings: hidden aliases)"
            ));
        }
        let unit = UNIT_SUFFIXES.iter().find(|suffix| long.ends_with(*suffix))?;
        Some(format!("--{long} carries a unit ({unit}): name the concept, take a duration value"))
    }

    /// Every misspelt flag in the tree, as `path: reason`.
    fn misspellings(command: &clap::Command) -> Vec<String> {
        let mut flags = Vec::new();
        visible_flags(command, "", &mut flags);
        flags
            .iter()
            .filter_map(|(path, long)| misspelling(long).map(|why| format!("{path}: {why}")))
            .collect()
    }

    /// Every `--out` defaults to `leantier-report/<command path joined by ->`: one root, one
    /// folder per command, so no two commands overwrite each other's report.
    fn out_defaults(command: &clap::Command, path: &[&str], wrong: &mut Vec<String>) {
        let out = command.get_arguments().find(|arg| arg.get_long() == Some("out"));
        if let Some(out) = out {
            let expected = format!("leantier-report/{}", path.join("-"));
            let defaults: Vec<_> = out.get_default_values().iter().map(|v| v.to_owned()).collect();
            if defaults != [expected.as_str()] {
                wrong.push(format!(
                    "{}: --out defaults to {defaults:?}, not {expected}",
                    path.join(" ")
                ));
            }
        }
        for sub in command.get_subcommands() {
            let sub_path: Vec<&str> = path.iter().copied().chain([sub.get_name()]).collect();
            out_defaults(sub, &sub_path, wrong);
        }
    }

    /// Every option with a default shows it in `--help` (`[default: …]`): a default that is
    /// hidden surprises whoever reads only the help (`mq load` showed none of its own).
    fn hidden_defaults(command: &clap::Command, path: &str, found: &mut Vec<String>) {
        for arg in command.get_arguments().filter(|arg| !arg.is_hide_set()) {
            if !arg.get_default_values().is_empty() && arg.is_hide_default_value_set() {
                found.push(format!("{path}: --{} hides its default", arg.get_id()));
            }
        }
        for sub in command.get_subcommands() {
            hidden_defaults(sub, format!("{path} {}", sub.get_name()).trim(), found);
        }
    }

    #[test]
    fn every_default_shows_in_help() {
        let mut found = Vec::new();
        hidden_defaults(&super::Cli::command(), "", &mut found);
        assert!(found.is_empty(), "{}", found.join("\n"));
        let mut hiding = clap::Command::new("x")
            .arg(clap::Arg::new("a").long("a").default_value("1").hide_default_value(true));
        hidden_defaults(&hiding, "x", &mut found);
        assert_eq!(found, ["x: --a hides its default"]);
        let help = hiding.render_help().to_string();
        assert!(!help.contains("[default: 1]"), "what the walk looks for is what help hides");
    }

    /// `--rate -5` reaches the command's own check ("must be > 0") instead of clap reading
    /// `-5` as an unknown flag.
    #[test]
    fn every_rate_takes_a_negative_number_to_refuse_it_clearly() {
        fn walk(command: &clap::Command, path: &str, wrong: &mut Vec<String>) {
            let rate = command.get_arguments().find(|arg| arg.get_long() == Some("rate"));
            if rate.is_some_and(|rate| !rate.is_allow_negative_numbers_set()) {
                wrong.push(path.to_string());
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), wrong);
            }
        }
        let mut wrong = Vec::new();
        walk(&super::Cli::command(), "", &mut wrong);
        assert!(wrong.is_empty(), "--rate reads -5 as a flag in: {wrong:?}");
    }

    /// Help is for users: no internal references ("issue 4 §6", "#16") in any command's help.
    #[test]
    fn help_carries_no_internal_references() {
        fn walk(command: &mut clap::Command, path: &str, wrong: &mut Vec<String>) {
            let help = command.render_long_help().to_string();
            let words: Vec<&str> = help.split_whitespace().collect();
            for pair in words.windows(2) {
                let numbered =
                    |word: &str| word.trim_start_matches('#').starts_with(char::is_numeric);
                let issue = pair[0].trim_start_matches('(').eq_ignore_ascii_case("issue");
                if (issue && numbered(pair[1])) || (pair[1].starts_with('#') && numbered(pair[1])) {
                    wrong.push(format!("{path}: {} {}", pair[0], pair[1]));
                }
            }
            for sub in command.get_subcommands_mut() {
                let sub_path = format!("{path} {}", sub.get_name());
                walk(sub, &sub_path, wrong);
            }
        }
        let mut wrong = Vec::new();
        walk(&mut super::Cli::command(), "leantier", &mut wrong);
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// The commands (paths) that have `--now`, split by whether they accept `--old` too.
    fn takers(command: &clap::Command, path: &str, old: &str, now: &str) -> (usize, usize) {
        let arg = command.get_arguments().find(|arg| arg.get_long() == Some(now));
        let here = arg.map_or((0, 0), |arg| {
            let aliases = arg.get_all_aliases().unwrap_or_default();
            if aliases.contains(&old) { (1, 0) } else { (0, 1) }
        });
        command.get_subcommands().fold(here, |(takes, refuses), sub| {
            let (t, r) = takers(sub, &format!("{path} {}", sub.get_name()), old, now);
            (takes + t, refuses + r)
        })
    }

    /// What README.md says of the retired spellings holds: each it names is still accepted
    /// somewhere, and where some commands with the new name refuse the old one, the README
    /// says the old ones work only on the commands that took them.
    fn readme_overpromises(readme: &str, tree: &clap::Command) -> Vec<String> {
        let qualified = readme.contains("only by the commands that took them");
        RETIRED
            .iter()
            .filter(|(old, _)| {
                readme.contains(&format!("`--{old}`")) || readme.contains(&format!("`--{old} "))
            })
            .filter_map(|(old, now)| match takers(tree, "", old, now) {
                (0, _) => Some(format!("README names --{old}, which no command accepts")),
                (_, refusing) if refusing > 0 && !qualified => Some(format!(
                    "README says --{old} still works; {refusing} commands with --{now} refuse it"
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_readme_promises_only_retired_spellings_that_work() {
        let readme = include_str!("../../../README.md");
        let tree = super::Cli::command();
        let wrong = readme_overpromises(readme, &tree);
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        let old_readme = "The spellings before these (`--seconds 3`, `--report`) still work.";
        let wrong = readme_overpromises(old_readme, &tree);
        assert_eq!(wrong.len(), 2, "{wrong:#?}");
        assert!(wrong[1].starts_with("README says --report still works"), "{wrong:#?}");
    }

    #[test]
    fn one_spelling_per_concept_across_the_tree() {
        let found = misspellings(&super::Cli::command());
        assert!(found.is_empty(), "one name per concept (issue 28):\n{}", found.join("\n"));
    }

    #[test]
    fn a_new_flag_in_an_old_spelling_fails_the_walk() {
        let command = clap::Command::new("leantier").subcommand(
            clap::Command::new("x")
                .arg(clap::Arg::new("a").long("duration-s"))
                .arg(clap::Arg::new("b").long("timeout-ms"))
                .arg(clap::Arg::new("c").long("count").visible_alias("rates"))
                .arg(clap::Arg::new("d").long("rate").alias("rate-per-s"))
                .arg(clap::Arg::new("e").long("report").hide(true)),
        );
        let found = misspellings(&command);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].starts_with("x: --duration-s is retired"), "{found:#?}");
        assert!(found[1].contains("--timeout-ms carries a unit"), "{found:#?}");
        assert!(found[2].contains("--rates is retired: use --rate"), "{found:#?}");
    }

    /// Scripts written for the old spellings keep working for one release.
    #[test]
    fn old_spellings_still_parse_as_hidden_aliases() {
        use super::commands::exchange::ExchangeCommand;
        use clap::Parser;
        use std::time::Duration;
        let old: &[&[&str]] = &[
            &["exchange", "run", "--rates", "5000", "--seconds", "0.3", "--p99-limit-us", "50"],
            &["exchange", "client", "--client", "1", "--linger-ms", "300"],
            &["exchange", "publish", "--nats", "n", "--seconds", "5", "--linger-seconds", "1"],
            &["exchange", "layout-bench", "--step-seconds", "0.5"],
            &["exchange", "senders", "--publish-work-ns", "2000"],
            &["bench", "ring", "--no-pin"],
            &["bench", "load-gen", "--rates", "1000", "--seconds", "1"],
            &["cdr", "run", "--config", "c", "--max", "--duration-s", "2", "--out-dir", "x"],
            &["cdr", "validate", "--measure-s", "0.3", "--run-s", "1", "--report", "r"],
            &["plan", "node", "--arrival-rate", "1", "--service-rate", "2", "--capacity", "3"],
            &["plan", "measure", "cdr", "--duration-s", "1"],
            &["journal", "bench", "--throughput-ms", "100", "--latency-ms", "100", "--report", "r"],
            &["mq", "load", "--think-ms", "1", "--duration-s", "1", "--warmup-s", "0"],
            &["mq", "serve", "--idle-timeout-ms", "100", "--registration-window-ms", "100"],
            &["web", "load", "--rate-per-s", "10", "--report-dir", "r", "--interval-ms", "50"],
            &["web", "serve", "--header-timeout-ms", "100", "--admission-wait-ms", "100"],
            &["exchange", "gateway", "--nats", "n", "--gateway", "1"],
        ];
        for args in old {
            let parsed = super::Cli::try_parse_from(["leantier"].iter().chain(args.iter()));
            parsed.unwrap_or_else(|error| panic!("{args:?}: {error}"));
        }
        let run = super::Cli::try_parse_from(["leantier"].iter().chain(old[0])).unwrap();
        let super::Command::Exchange(exchange) = run.command else { panic!("exchange") };
        let ExchangeCommand::Run(run) = exchange.command else { panic!("exchange run") };
        assert_eq!((run.rate, run.duration), (vec![5000.0], Duration::from_millis(300)));
        assert_eq!(run.p99_limit, Duration::from_micros(50), "a bare number keeps the old unit");
    }

    #[test]
    fn every_report_goes_under_one_root_in_its_own_folder() {
        let mut wrong = Vec::new();
        out_defaults(&super::Cli::command(), &[], &mut wrong);
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// One scheme for environment variables: `LEANTIER_` then the area, e.g.
    /// `LEANTIER_EXCHANGE_SECRET`, `LEANTIER_MQ_SECRET`, `LEANTIER_NATS_URL`.
    #[test]
    fn environment_variables_share_one_prefix() {
        fn walk(command: &clap::Command, wrong: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let env = arg.get_env().map(|env| env.to_string_lossy().into_owned());
                if let Some(env) =
                    env.filter(|env| !env.starts_with("LEANTIER_") || env == "LEANTIER_SECRET")
                {
                    wrong.push(format!("{}: --{} reads ${env}", command.get_name(), arg.get_id()));
                }
            }
            command.get_subcommands().for_each(|sub| walk(sub, wrong));
        }
        let mut wrong = Vec::new();
        walk(&super::Cli::command(), &mut wrong);
        assert!(wrong.is_empty(), "{wrong:#?}");
    }
}
