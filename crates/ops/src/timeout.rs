//! Which bound a client's wait ran into: the word every client's error and the command line's
//! `--…-timeout` flags use, alike in every client.

/// A client's timeouts, each named in the error it raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    /// Opening the connection (TCP, and a TLS handshake where there is one).
    Connect,
    /// The answer to one request.
    Request,
    /// Any message at all while answers are outstanding (a live server heartbeats).
    Idle,
}

impl Timeout {
    /// "connect", "request", "idle": the word the `--…-timeout` flags use.
    ///
    /// ```
    /// assert_eq!(ops::Timeout::Request.name(), "request");
    /// ```
    pub fn name(self) -> &'static str {
        match self {
            Timeout::Connect => "connect",
            Timeout::Request => "request",
            Timeout::Idle => "idle",
        }
    }
}
