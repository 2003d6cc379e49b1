//! Optional TLS (rustls, ring provider) for the node's listener and the client. Certificates and
//! keys are PEM; the client trusts the CA certificates it is given (no system roots: nodes are
//! private infrastructure with their own CA). The loading is `ops::tls`'s, shared with
//! `exchange serve`; each refusal names the file and the reason.

use std::path::Path;
use std::sync::Arc;

use crate::error::{Result, tls_failed};
use ops::tls::{ClientFiles, ServerFiles};

/// What a refusal of PEM bytes (no file) calls them.
const CERT_PEM: &str = "the certificate chain PEM";
const KEY_PEM: &str = "the private key PEM";
const CA_PEM: &str = "the CA PEM";

/// A server configuration from a PEM certificate chain (leaf first) and its PEM private key.
pub fn server_config(cert_chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>> {
    let files = ServerFiles { cert: Path::new(CERT_PEM), key: Path::new(KEY_PEM), client_ca: None };
    ops::tls::server_config(files, cert_chain_pem, key_pem, None)
        .map_err(tls_failed("loading the TLS certificate and key"))
}

/// [`server_config`] from files.
pub fn server_config_from_files(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    ops::tls::server_config_from_files(ServerFiles { cert, key, client_ca: None })
        .map_err(tls_failed("loading the TLS certificate and key"))
}

/// A client configuration trusting the CA certificates in `ca_pem`.
pub fn client_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>> {
    let files = ClientFiles { ca: Path::new(CA_PEM), identity: None };
    ops::tls::client_config(files, ca_pem, None).map_err(tls_failed("loading the TLS CA"))
}
