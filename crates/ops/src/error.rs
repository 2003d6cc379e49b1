//! The one error type of this crate.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::lock::Holder;

/// Why the admin endpoint could not start, or a store's lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// `/metrics` would be open to other hosts; the message says what to change.
    #[error("{0}")]
    Exposed(String),
    /// The listener or its thread could not be set up.
    #[error("{what} (admin endpoint on {listen})")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The address the endpoint was to listen on.
        listen: SocketAddr,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// Another process owns the store: the command line refuses to start (exit 2).
    #[error(
        "{} is held by another process ({holder}): one process owns a store at a time; stop \
         that process or give this one another directory",
        path.display()
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// Who holds it, as the file says.
        holder: Holder,
    },
    /// The lock file could not be created, locked or written.
    #[error("{what} the lock file {}", path.display())]
    Lock {
        /// What was being done.
        what: &'static str,
        /// The lock file.
        path: PathBuf,
        /// The error the OS returned.
        #[source]
        source: io::Error,
    },
    /// A configuration file or a child process's flags are invalid (bad input, exit 2): the
    /// message names the file or flag and the reason.
    #[error("{0}")]
    BadInput(String),
    /// A certificate, key or CA file is unusable for TLS (bad input: the server refuses to
    /// start, exit 2): the message names the file and the reason.
    #[error("{what}")]
    Tls {
        /// The file and what is wrong with it.
        what: String,
        /// rustls' error, the PEM parser's or the OS's, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// `error` and each of its causes, joined by `": "`: what a log line or an error reply shows,
/// since a typed error's own message names only what failed at its level.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_names_every_cause_in_order() {
        let source = io::Error::other("disk full");
        let error = OpsError::Io { what: "binding", listen: ([127, 0, 0, 1], 9).into(), source };
        assert_eq!(error_chain(&error), "binding (admin endpoint on 127.0.0.1:9): disk full");
    }
}
