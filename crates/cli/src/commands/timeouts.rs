//! The timeout flags every client command shares (`exchange client`, `mq client`, `mq load`):
//! one name and one meaning per bound.

use std::time::Duration;

use super::values;
use crate::outcome::BadInput;

/// How long a client waits (connect, each request, a silent connection): the one that fires
/// says which it was, so a server that accepts and never answers is given up on.
#[derive(clap::Args, Debug, Clone)]
pub struct TimeoutFlags {
    /// Give up connecting (TCP, and a TLS handshake where there is one) after this long.
    #[arg(long, value_name = "DURATION", value_parser = values::seconds, default_value = "5s")]
    pub connect_timeout: Duration,
    /// Give up on a request (a login, an order, an operation) whose answer has not come after
    /// this long.
    #[arg(long, value_name = "DURATION", value_parser = values::seconds, default_value = "10s")]
    pub request_timeout: Duration,
    /// Give up on a connection silent this long while answers are outstanding (a live server
    /// heartbeats or answers well within it).
    #[arg(long, value_name = "DURATION", value_parser = values::seconds, default_value = "30s")]
    pub idle_timeout: Duration,
}

impl TimeoutFlags {
    /// Connect, request and idle bounds, each above zero (zero would fail every wait).
    pub fn bounds(&self) -> Result<[Duration; 3], BadInput> {
        let bounds = [self.connect_timeout, self.request_timeout, self.idle_timeout];
        if bounds.contains(&Duration::ZERO) {
            let why = "--connect-timeout, --request-timeout and --idle-timeout must be > 0";
            return Err(BadInput(why.into()));
        }
        Ok(bounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        timeouts: TimeoutFlags,
    }

    #[test]
    fn the_defaults_are_the_client_libraries_and_zero_is_refused() {
        let [connect, request, idle] = Flags::parse_from(["client"]).timeouts.bounds().unwrap();
        let mq = mq::client::Timeouts::default();
        assert_eq!((connect, request, idle), (mq.connect, mq.request, mq.idle));
        let zero = Flags::parse_from(["client", "--request-timeout", "0s"]).timeouts.bounds();
        assert!(zero.unwrap_err().0.contains("--request-timeout"));
    }
}
