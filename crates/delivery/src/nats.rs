//! How every leantier NATS client connects (the R-Senders' publisher, the delivery edge, the
//! experiment and the benchmark): one [`NatsConnect`] holds the server URL, the authentication
//! and the TLS settings, so every call site accepts the same options. Secrets (password,
//! token, a URL's user info) never reach a log or an error message: [`Secret`] prints as
//! `<redacted>` and URLs are shown through [`redacted_url`].

use std::fmt;
use std::path::{Path, PathBuf};

use crate::subjects::CONNECT_TIMEOUT;

/// A secret string: usable, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    fn expose(&self) -> String {
        self.0.clone()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How the client proves who it is (the server's `authorization` / `accounts` settings).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NatsAuth {
    /// No credentials (or user info in the URL).
    #[default]
    None,
    UserPassword {
        user: String,
        password: Secret,
    },
    Token(Secret),
    /// A file holding an nkey seed (`SU...`), which signs the server's nonce.
    NkeySeed(PathBuf),
    /// A `.creds` file (user JWT and nkey seed), as `nsc` writes it.
    Credentials(PathBuf),
}

/// TLS towards the server: a `tls://` URL or a CA file turns it on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// PEM roots the server's certificate must chain to (default: the system's).
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, for a server that verifies clients.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl NatsTls {
    fn enabled(&self) -> bool {
        self.ca.is_some() || self.client_cert.is_some()
    }
}

/// Everything a leantier NATS client needs to connect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatsConnect {
    pub url: String,
    pub auth: NatsAuth,
    pub tls: NatsTls,
}

impl NatsConnect {
    /// A plain connection (no credentials, no TLS) to `url`.
    pub fn new(url: impl Into<String>) -> NatsConnect {
        NatsConnect { url: url.into(), ..NatsConnect::default() }
    }
}

/// Reports name the server only, by its redacted URL.
impl serde::Serialize for NatsConnect {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&redacted_url(&self.url))
    }
}

/// Why a NATS connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NatsConnectError {
    #[error("cannot read the NATS {what} file {path}: {source}")]
    ReadFile { what: &'static str, path: PathBuf, source: std::io::Error },
    #[error("no NATS server answered at {url} within {CONNECT_TIMEOUT:?}")]
    Timeout { url: String },
    #[error(
        "NATS at {url} refused the credentials (check --nats-user/--nats-password, \
         --nats-token, --nats-nkey-seed or --nats-creds): {reason}"
    )]
    Refused { url: String, reason: String },
    #[error(
        "TLS to NATS at {url} failed (check --nats-tls-ca/--nats-tls-cert/--nats-tls-key): {reason}"
    )]
    Tls { url: String, reason: String },
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect { url: String, reason: String },
}

/// `url` with any `user:password@` removed, for logs and errors.
pub fn redacted_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let redacted = if host.len() < rest.len() { format!("<redacted>@{host}") } else { host.into() };
    if scheme.is_empty() { redacted } else { format!("{scheme}://{redacted}") }
}

fn read_file(what: &'static str, path: &Path) -> Result<String, NatsConnectError> {
    std::fs::read_to_string(path).map_err(|source| NatsConnectError::ReadFile {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The client options of `settings` (credentials and TLS; files are read here), for a caller
/// that adds its own (the benchmark's plain client); [`connect`] uses them.
pub async fn client_options(
    settings: &NatsConnect,
) -> Result<async_nats::ConnectOptions, NatsConnectError> {
    let options = async_nats::ConnectOptions::new();
    let mut options = match &settings.auth {
        NatsAuth::None => options,
        NatsAuth::UserPassword { user, password } => {
            options.user_and_password(user.clone(), password.expose())
        }
        NatsAuth::Token(token) => options.token(token.expose()),
        NatsAuth::NkeySeed(path) => options.nkey(read_file("nkey seed", path)?.trim().to_string()),
        NatsAuth::Credentials(path) => {
            let credentials = read_file("credentials", path)?;
            options.credentials(&credentials).map_err(|source| NatsConnectError::ReadFile {
                what: "credentials",
                path: path.clone(),
                source,
            })?
        }
    };
    if let Some(ca) = &settings.tls.ca {
        read_file("TLS CA", ca)?;
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &settings.tls.client_cert {
        read_file("TLS certificate", cert)?;
        read_file("TLS key", key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options.require_tls(settings.tls.enabled()))
}

/// Connects, logging each connection event once as it happens (`who` names the side). A
/// refused login or a failed TLS handshake is an error at once, not a retry loop.
pub async fn connect(
    settings: &NatsConnect,
    who: &'static str,
) -> Result<async_nats::Client, NatsConnectError> {
    let url = redacted_url(&settings.url);
    let options = client_options(settings)
        .await?
        .connection_timeout(CONNECT_TIMEOUT)
        .max_reconnects(None)
        .event_callback(move |event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("{who}: NATS connected"),
                async_nats::Event::Disconnected => tracing::warn!("{who}: NATS disconnected"),
                async_nats::Event::Closed => tracing::info!("{who}: NATS connection closed"),
                // Every failed reconnect attempt reports one; the disconnect was logged.
                async_nats::Event::ClientError(error) => tracing::debug!("{who}: NATS {error}"),
                other => tracing::warn!("{who}: NATS event: {other}"),
            }
        });
    // A cluster is named by its nodes' URLs, comma-separated (as the nats tools take them).
    let servers: Result<Vec<async_nats::ServerAddr>, _> =
        settings.url.split(',').map(|url| url.trim().parse()).collect();
    let servers = servers.map_err(|error| NatsConnectError::Connect {
        url: url.clone(),
        reason: error.to_string(),
    })?;
    let connecting = options.connect(servers);
    let connected = tokio::time::timeout(CONNECT_TIMEOUT, connecting).await;
    let error = match connected {
        Err(_) => return Err(NatsConnectError::Timeout { url }),
        Ok(Ok(client)) => return Ok(client),
        Ok(Err(error)) => error,
    };
    // The error's text names the kind only (async-nats never prints credentials).
    let reason = error.to_string();
    Err(match error.kind() {
        async_nats::ConnectErrorKind::AuthorizationViolation
        | async_nats::ConnectErrorKind::Authentication => NatsConnectError::Refused { url, reason },
        async_nats::ConnectErrorKind::Tls => NatsConnectError::Tls { url, reason },
        _ => NatsConnectError::Connect { url, reason },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_user_info_and_secrets_print_redacted() {
        assert_eq!(redacted_url("nats://alice:s3cret@h:4222"), "nats://<redacted>@h:4222");
        assert_eq!(redacted_url("tls://h:4222"), "tls://h:4222");
        assert_eq!(redacted_url("h:4222"), "h:4222");
        let auth = NatsAuth::UserPassword { user: "alice".into(), password: Secret::new("s3cret") };
        let printed = format!("{:?}", NatsConnect { auth, ..NatsConnect::new("nats://h") });
        assert!(!printed.contains("s3cret"), "{printed}");
    }
}
