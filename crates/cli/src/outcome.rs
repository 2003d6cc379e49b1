//! How a command's result maps to the process exit code.
//!
//! The libraries return their own typed errors, which commands turn into `anyhow` with `?`;
//! this module is the one place that decides which of them mean "bad input" (exit 2). A run that completed but
//! missed a target it was asked to `--check` returns [`TargetMissed`] (exit 3).

use std::process::ExitCode;

/// Exit code of a run that completed and met every checked target.
pub const EXIT_OK: u8 = 0;
/// Exit code of a run that failed at run time (I/O, a stage panic, a lost connection).
pub const EXIT_RUNTIME_ERROR: u8 = 1;
/// Exit code of bad usage: invalid flags, an unreadable or invalid config file (clap uses 2 too).
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code of a run that completed but missed a target it was asked to check (`--check`).
pub const EXIT_TARGET_MISSED: u8 = 3;

/// A flag or combination of flags is invalid (checks the command line makes itself).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// A run finished, but one or more targets it checked were missed.
#[derive(Debug, thiserror::Error)]
#[error("{} target(s) missed: {}", .0.len(), .0.join("; "))]
pub struct TargetMissed(pub Vec<String>);

/// Whether one error in a chain is the caller's fault, by the type each library reports it with.
/// A store another process owns is too: the start is refused, nothing ran (issue 41).
fn is_bad_input_cause(error: &(dyn std::error::Error + 'static)) -> bool {
    error.is::<BadInput>()
        || matches!(
            error.downcast_ref(),
            Some(
                ops::OpsError::Held { .. }
                    | ops::OpsError::Tls { .. }
                    | ops::OpsError::BadInput(_)
                    | ops::OpsError::Exposed(_)
            )
        )
        || error.is::<stats::BadInput>()
        || error.is::<experiments::ringbench::RingBenchError>()
        || error.is::<experiments::statistics::StatsError>()
        || is_gateway_bad_input(error)
        // A NATS credentials, key or CA file that cannot be read; `DeliveryError::Connect` is
        // transparent, so the chain shows the connect error through it, not beside it.
        || matches!(
            error.downcast_ref(),
            Some(delivery::nats::NatsConnectError::ReadFile { .. })
        )
        || matches!(
            error.downcast_ref(),
            Some(delivery::DeliveryError::Connect(
                delivery::nats::NatsConnectError::ReadFile { .. }
            ))
        )
        || matches!(error.downcast_ref(), Some(planner::PlanError::BadInput(_)))
        || matches!(error.downcast_ref(), Some(cdr::CdrError::BadInput(_)))
        || matches!(error.downcast_ref(), Some(delivery::DeliveryError::BadInput(_)))
        || matches!(error.downcast_ref(), Some(exchange::ExchangeError::BadInput(_)))
        || matches!(error.downcast_ref(), Some(mq::MqError::BadInput(_)))
        || matches!(error.downcast_ref(), Some(web::WebError::BadInput(_)))
        || matches!(error.downcast_ref(), Some(journal::JournalError::BadConfig(_)))
        // The simulator's errors are its inputs': a fault list, a seed file it cannot read.
        || matches!(
            error.downcast_ref(),
            Some(sim::SimError::BadInput(_) | sim::SimError::Io { .. })
        )
        || matches!(
            error.downcast_ref(),
            Some(
                replication::ReplicationError::BadSettings(_)
                    | replication::ReplicationError::Fingerprint(_)
            )
        )
}

/// The order-entry gateway's refusals of what it was given: an exposed metrics listener, a
/// busy-poll the CPUs cannot hold, a session store whose recovery refuses (damage it may not
/// cut: the start is refused naming the file, the offset and why; nothing ran, issue 42), a
/// credentials file that does not parse.
fn is_gateway_bad_input(error: &(dyn std::error::Error + 'static)) -> bool {
    use gateway::StoreError::{Corrupt, CorruptDurable};
    use gateway::credentials::CredentialsError::{BadLine, TooMany};
    matches!(
        error.downcast_ref(),
        Some(gateway::ServeError::MetricsExposed { .. } | gateway::ServeError::BusyPollCpus { .. })
    ) || matches!(error.downcast_ref(), Some(Corrupt { .. } | CorruptDurable { .. }))
        // The server's error holds the store's transparently (the chain skips the store's).
        || matches!(
            error.downcast_ref(),
            Some(gateway::ServeError::Store(Corrupt { .. } | CorruptDurable { .. }))
        )
        || matches!(error.downcast_ref(), Some(BadLine { .. } | TooMany(_)))
}

/// Whether an error, or anything in its chain, is the caller's fault (exit code 2).
pub fn is_bad_input(error: &anyhow::Error) -> bool {
    error.chain().any(is_bad_input_cause)
}

/// The exit code for a command's result.
pub fn exit_code(result: &anyhow::Result<()>) -> u8 {
    let Err(error) = result else {
        return EXIT_OK;
    };
    if error.chain().any(|cause| cause.is::<TargetMissed>()) {
        EXIT_TARGET_MISSED
    } else if is_bad_input(error) {
        EXIT_BAD_INPUT
    } else {
        EXIT_RUNTIME_ERROR
    }
}

/// Maps a command's result to the process exit code, printing the error chain to stderr.
pub fn exit_code_for(result: anyhow::Result<()>) -> ExitCode {
    if let Err(error) = &result {
        eprintln!("error: {}", chain_text(error));
    }
    ExitCode::from(exit_code(&result))
}

/// The error and its causes joined by ": ", each cause left out when its parent's text
/// already ends with it: a library error that shows its source (`{0}` of an io::Error) would
/// otherwise print "Connection refused (os error 111): Connection refused (os error 111)".
pub fn chain_text(error: &anyhow::Error) -> String {
    let mut text = String::new();
    let mut parent = String::new();
    for cause in error.chain() {
        let line = cause.to_string();
        if !parent.ends_with(&line) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&line);
        }
        parent = line;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn marker_errors_map_to_their_codes_even_with_context() {
        let bad: anyhow::Result<()> = Err(BadInput("rate must be > 0".into())).context("loading");
        assert_eq!(exit_code(&bad), EXIT_BAD_INPUT);
        let missed: anyhow::Result<()> = Err(TargetMissed(vec!["p99".into()]).into());
        assert_eq!(exit_code(&missed), EXIT_TARGET_MISSED);
        let io: anyhow::Result<()> = Err(anyhow::anyhow!("disk full"));
        assert_eq!(exit_code(&io), EXIT_RUNTIME_ERROR);
        assert_eq!(exit_code(&Ok(())), EXIT_OK);
    }

    fn held_store() -> ops::OpsError {
        let holder = ops::lock::Holder { pid: Some(7), ..Default::default() };
        ops::OpsError::Held { path: "data/LOCK".into(), holder }
    }

    /// A typed error whose text is its source's (`#[error("{0}")]` over an `io::Error`) and
    /// a context naming what was being done: the cause is printed once.
    #[test]
    fn a_cause_its_parent_already_shows_is_printed_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("connection: {0}")]
        struct Wrapped(#[source] std::io::Error);
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let refused_text = refused.to_string();
        let error = anyhow::Error::from(Wrapped(refused)).context("connecting to 127.0.0.1:1");
        assert_eq!(
            chain_text(&error),
            format!("connecting to 127.0.0.1:1: connection: {refused_text}")
        );
        assert_eq!(format!("{error:#}").matches(&refused_text).count(), 2, "anyhow's own");
        let distinct = anyhow::anyhow!("disk full").context("writing the report");
        assert_eq!(chain_text(&distinct), "writing the report: disk full");
    }

    #[test]
    fn every_library_bad_input_is_exit_2() {
        let errors: Vec<anyhow::Error> = vec![
            stats::BadInput("stats".into()).into(),
            planner::PlanError::BadInput("planner".into()).into(),
            cdr::CdrError::BadInput("cdr".into()).into(),
            exchange::ExchangeError::BadInput("exchange".into()).into(),
            mq::MqError::BadInput("mq".into()).into(),
            web::WebError::BadInput("web".into()).into(),
            journal::JournalError::BadConfig("journal".into()).into(),
            experiments::ringbench::RingBenchError::BadInput("ring".into()).into(),
            replication::ReplicationError::BadSettings("replication".into()).into(),
            replication::ReplicationError::Fingerprint("group".into()).into(),
            ops::OpsError::BadInput("config".into()).into(),
            ops::OpsError::Exposed("/metrics on 0.0.0.0 without a token".into()).into(),
            experiments::statistics::StatsError::TooFewSamples { needed: 2, got: 1 }.into(),
            gateway::ServeError::MetricsExposed { addr: "0.0.0.0:9000".parse().unwrap() }.into(),
            gateway::credentials::CredentialsError::TooMany(1 << 20).into(),
            gateway::StoreError::CorruptDurable {
                path: "store/gateway.store".into(),
                offset: 13,
                watermark: 40,
                why: "a record before the synced end does not decode",
            }
            .into(),
            gateway::ServeError::Store(gateway::StoreError::Corrupt {
                path: "store/gateway.store".into(),
                offset: 0,
                tail_bytes: 9 << 20,
            })
            .into(),
            sim::SimError::BadInput("faults".into()).into(),
            held_store().into(),
            exchange::ExchangeError::Owned { dir: "tier".into(), source: held_store() }.into(),
            mq::MqError::Owned { dir: "data".into(), source: held_store() }.into(),
        ];
        for error in errors {
            let shown = format!("{error:#}");
            let wrapped: anyhow::Result<()> = Err(error.context("while running"));
            assert_eq!(exit_code(&wrapped), EXIT_BAD_INPUT, "{shown}");
        }
    }
}
