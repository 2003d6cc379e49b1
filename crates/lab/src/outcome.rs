//! How a command's result maps to the process exit code.
//!
//! Every library returns `anyhow::Result`; the binary maps the error to an exit code with
//! [`exit_code_for`]. Libraries signal the two cases a script may want to branch on by wrapping
//! their error in one of the marker types below.

use std::fmt;
use std::process::ExitCode;

/// Exit code of a run that completed and met every checked target.
pub const EXIT_OK: u8 = 0;
/// Exit code of a run that failed at run time (I/O, a stage panic, a lost connection).
pub const EXIT_RUNTIME_ERROR: u8 = 1;
/// Exit code of bad usage: invalid flags, an unreadable or invalid config file (clap uses 2 too).
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code of a run that completed but missed a target it was asked to check (`--check`).
pub const EXIT_TARGET_MISSED: u8 = 3;

/// The user's input (flags, config file, model description) is invalid.
#[derive(Debug)]
pub struct BadInput(pub String);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadInput {}

/// A run finished, but one or more targets it checked were missed.
#[derive(Debug)]
pub struct TargetMissed(pub Vec<String>);

impl fmt::Display for TargetMissed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} target(s) missed: {}", self.0.len(), self.0.join("; "))
    }
}

impl std::error::Error for TargetMissed {}

/// Maps a command's result to the process exit code, printing the error chain to stderr.
pub fn exit_code_for(result: anyhow::Result<()>) -> ExitCode {
    let Err(error) = result else {
        return ExitCode::from(EXIT_OK);
    };
    eprintln!("error: {error:#}");
    let code = if error.downcast_ref::<BadInput>().is_some() {
        EXIT_BAD_INPUT
    } else if error.downcast_ref::<TargetMissed>().is_some() {
        EXIT_TARGET_MISSED
    } else {
        EXIT_RUNTIME_ERROR
    };
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_errors_map_to_their_codes_even_with_context() {
        use anyhow::Context;
        let bad: anyhow::Result<()> = Err(BadInput("rate must be > 0".into())).context("loading");
        assert_eq!(exit_code_for(bad), ExitCode::from(EXIT_BAD_INPUT));
        let missed: anyhow::Result<()> = Err(TargetMissed(vec!["p99".into()]).into());
        assert_eq!(exit_code_for(missed), ExitCode::from(EXIT_TARGET_MISSED));
        let io: anyhow::Result<()> = Err(anyhow::anyhow!("disk full"));
        assert_eq!(exit_code_for(io), ExitCode::from(EXIT_RUNTIME_ERROR));
        assert_eq!(exit_code_for(Ok(())), ExitCode::from(EXIT_OK));
    }
}
