//! Optional TLS (rustls, ring provider) for the node's listener and the client. Certificates and
//! keys are PEM; the client trusts the CA certificates it is given (no system roots: nodes are
//! private infrastructure with their own CA).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration from a PEM certificate chain (leaf first) and its PEM private key.
pub fn server_config(
    cert_chain_pem: &[u8],
    key_pem: &[u8],
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let chain = CertificateDer::pem_slice_iter(cert_chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .context("reading the certificate chain PEM")?;
    anyhow::ensure!(!chain.is_empty(), "the certificate PEM holds no certificate");
    let key = PrivateKeyDer::from_pem_slice(key_pem).context("reading the private key PEM")?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("certificate and key do not form a usable pair")?;
    Ok(Arc::new(config))
}

/// [`server_config`] from files.
pub fn server_config_from_files(
    cert: &Path,
    key: &Path,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    server_config(&read(cert)?, &read(key)?)
}

/// A client configuration trusting the CA certificates in `ca_pem`.
pub fn client_config(ca_pem: &[u8]) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.context("reading the CA PEM")?).context("adding a CA certificate")?;
    }
    anyhow::ensure!(!roots.is_empty(), "the CA PEM holds no certificate");
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
