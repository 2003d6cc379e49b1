//! NATS subject names and the connection timeout both sides share.

use std::time::Duration;

use crate::wire::Stream;

/// Default first token of every subject.
pub const PREFIX_DEFAULT: &str = "leantier";
/// Most bytes of a subject prefix (NATS subjects are short tokens).
pub const PREFIX_BYTES_MAX: usize = 64;
/// How long a connection attempt may take before it fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The data subject of one outlet's stream: `{prefix}.data.{outlet}.{stream}`.
pub fn data_subject(prefix: &str, outlet: u32, stream: Stream) -> String {
    format!("{prefix}.data.{outlet}.{}", stream.name())
}

/// What an outlet's delivery edge subscribes to: every stream of the outlet's subjects.
pub fn outlet_wildcard(prefix: &str, outlet: u32) -> String {
    format!("{prefix}.data.{outlet}.*")
}

/// Where an edge asks for retained records of a stream: `{prefix}.retain.{outlet}.{stream}`.
pub fn retain_subject(prefix: &str, outlet: u32, stream: Stream) -> String {
    format!("{prefix}.retain.{outlet}.{}", stream.name())
}

/// Parses the outlet and stream out of a retain subject (`None`: not one of ours).
pub fn parse_retain_subject(prefix: &str, subject: &str) -> Option<(u32, Stream)> {
    let rest = subject.strip_prefix(prefix)?.strip_prefix(".retain.")?;
    let (outlet, stream) = rest.split_once('.')?;
    let stream = Stream::ALL.into_iter().find(|s| s.name() == stream)?;
    Some((outlet.parse().ok()?, stream))
}

/// Checks a prefix: 1..=PREFIX_BYTES_MAX bytes of `[A-Za-z0-9_-]` (one token, no wildcards).
pub fn validate_prefix(prefix: &str) -> Result<(), String> {
    let token = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if prefix.is_empty() || prefix.len() > PREFIX_BYTES_MAX || !prefix.chars().all(token) {
        return Err(format!(
            "subject prefix {prefix:?} must be 1..={PREFIX_BYTES_MAX} characters of A-Z a-z 0-9 _ -"
        ));
    }
    Ok(())
}
