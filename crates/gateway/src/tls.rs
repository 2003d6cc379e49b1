//! TLS on the native and FIX listeners (`tls_cert`, `tls_key`, `tls_client_ca` in the serve
//! config): rustls through `tokio-rustls`, the configuration loaded by `ops::tls` (shared with
//! `mq serve`). The handshake runs in the connection's own task, after admission (so the
//! pre-login bounds also bound handshakes) and within the logon timeout. A plain listener never
//! meets this module: the sessions are generic over their stream, and the plain ones run on
//! the bare `TcpStream` (no wrapper, no extra copy).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The TLS both listeners serve, when configured.
#[derive(Clone)]
pub struct ListenerTls {
    acceptor: tokio_rustls::TlsAcceptor,
    /// Whether clients must present a certificate (a client CA was given).
    client_certificates: bool,
}

impl ListenerTls {
    /// From the PEM files named in the serve config; a certificate that does not load, a key
    /// that does not match it, an unusable CA: an `ops::OpsError::Tls` naming the file.
    pub fn from_files(files: ops::tls::ServerFiles<'_>) -> Result<ListenerTls, ops::OpsError> {
        let config = ops::tls::server_config_from_files(files)?;
        Ok(ListenerTls::new(config, files.client_ca.is_some()))
    }

    /// From a configuration built elsewhere (tests).
    pub fn new(config: Arc<rustls::ServerConfig>, client_certificates: bool) -> ListenerTls {
        ListenerTls { acceptor: config.into(), client_certificates }
    }

    /// Whether clients must present a certificate.
    pub fn client_certificates(&self) -> bool {
        self.client_certificates
    }

    /// The server side of the handshake, within `timeout`; `Err` says why it failed.
    pub(crate) async fn accept(
        &self,
        stream: TcpStream,
        timeout: Duration,
    ) -> Result<TlsStream<TcpStream>, String> {
        match tokio::time::timeout(timeout, self.acceptor.accept(stream)).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_) => Err(format!("no handshake within {timeout:?}")),
        }
    }
}

impl std::fmt::Debug for ListenerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerTls")
            .field("client_certificates", &self.client_certificates)
            .finish_non_exhaustive()
    }
}
