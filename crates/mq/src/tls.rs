//! Optional TLS (rustls, ring provider) for the node's listener and the client. Certificates and
//! keys are PEM; the client trusts the CA certificates it is given (no system roots: nodes are
//! private infrastructure with their own CA).

use std::path::Path;
use std::sync::Arc;

use crate::error::{MqError, Result, io_failed, tls_failed};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration from a PEM certificate chain (leaf first) and its PEM private key.
pub fn server_config(cert_chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_slice_iter(cert_chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(tls_failed("reading the certificate chain PEM"))?;
    if chain.is_empty() {
        return Err(MqError::BadInput("the certificate PEM holds no certificate".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(tls_failed("reading the private key PEM"))?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_failed("choosing the TLS protocol versions"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(tls_failed("certificate and key do not form a usable pair"))?;
    Ok(Arc::new(config))
}

/// [`server_config`] from files.
pub fn server_config_from_files(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>> {
    let read = |p: &Path| std::fs::read(p).map_err(io_failed(format!("reading {}", p.display())));
    server_config(&read(cert)?, &read(key)?)
}

/// A client configuration trusting the CA certificates in `ca_pem`.
pub fn client_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(tls_failed("reading the CA PEM"))?;
        roots.add(cert).map_err(tls_failed("adding a CA certificate"))?;
    }
    if roots.is_empty() {
        return Err(MqError::BadInput("the CA PEM holds no certificate".into()));
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(tls_failed("choosing the TLS protocol versions"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
