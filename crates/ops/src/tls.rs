//! TLS configurations (rustls, ring provider) from PEM files, alike for every server and client
//! of the workspace: `mq serve`, `exchange serve`'s native and FIX listeners, and their
//! clients. A server has a certificate chain (leaf first) and its private key, and may demand
//! client certificates that chain to a CA of its own (mutual TLS); a client trusts only the CA
//! certificates it is given (no system roots: these are private services with their own CA)
//! and may present a certificate of its own.
//!
//! Every refusal is an [`OpsError::Tls`] that names the file and the reason (a certificate
//! that does not parse, a key that does not match its certificate), so that a server refuses
//! to start on it, before it listens.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::OpsError;

/// The PEM files of a server's TLS: its certificate chain and key, and the CA its clients'
/// certificates must chain to (`None`: clients present none).
#[derive(Clone, Copy, Debug)]
pub struct ServerFiles<'a> {
    /// PEM certificate chain, leaf first.
    pub cert: &'a Path,
    /// PEM private key of the leaf (PKCS#8, PKCS#1 or SEC1).
    pub key: &'a Path,
    /// PEM CA certificates; with them, every client must present a certificate chaining to one.
    pub client_ca: Option<&'a Path>,
}

/// The PEM files of a client's TLS: the CA certificates it trusts, and its own certificate
/// chain and key for a server that demands one.
#[derive(Clone, Copy, Debug)]
pub struct ClientFiles<'a> {
    /// PEM CA certificates the server's certificate must chain to.
    pub ca: &'a Path,
    /// PEM certificate chain and private key to present (mutual TLS).
    pub identity: Option<(&'a Path, &'a Path)>,
}

/// A TLS error naming `file` and what was wrong with it.
fn refused<E>(file: &Path, reason: &'static str) -> impl FnOnce(E) -> OpsError
where
    E: std::error::Error + Send + Sync + 'static,
{
    let what = format!("{}: {reason}", file.display());
    move |source| OpsError::Tls { what, source: Some(Box::new(source)) }
}

fn read(file: &Path) -> Result<Vec<u8>, OpsError> {
    std::fs::read(file).map_err(refused(file, "cannot read it"))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (at least one).
fn certificates(file: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, OpsError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(refused(file, "not a PEM certificate file"))?;
    if chain.is_empty() {
        let what = format!("{}: holds no PEM certificate (BEGIN CERTIFICATE)", file.display());
        return Err(OpsError::Tls { what, source: None });
    }
    Ok(chain)
}

fn private_key(file: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, OpsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(refused(file, "holds no usable PEM private key"))
}

/// A root store of the CA certificates in `pem`.
fn roots(file: &Path, pem: &[u8]) -> Result<Arc<rustls::RootCertStore>, OpsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(file, pem)? {
        roots.add(cert).map_err(refused(file, "not a usable CA certificate"))?;
    }
    Ok(Arc::new(roots))
}

/// A server configuration from PEM bytes; `files` name them in errors.
pub fn server_config(
    files: ServerFiles<'_>,
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
) -> Result<Arc<rustls::ServerConfig>, OpsError> {
    let chain = certificates(files.cert, cert_pem)?;
    let key = private_key(files.key, key_pem)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(refused(files.cert, "no TLS protocol version"))?;
    let builder = match (files.client_ca, client_ca_pem) {
        (Some(file), Some(pem)) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots(file, pem)?,
                provider(),
            )
            .build()
            .map_err(refused(file, "cannot verify clients with it"))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(chain, key).map_err(refused(
        files.key,
        "does not form a usable pair with the certificate (a key that does not match it?)",
    ))?;
    Ok(Arc::new(config))
}

/// [`server_config`] from the files.
pub fn server_config_from_files(
    files: ServerFiles<'_>,
) -> Result<Arc<rustls::ServerConfig>, OpsError> {
    let client_ca = files.client_ca.map(read).transpose()?;
    server_config(files, &read(files.cert)?, &read(files.key)?, client_ca.as_deref())
}

/// A client configuration from PEM bytes; `files` name them in errors.
pub fn client_config(
    files: ClientFiles<'_>,
    ca_pem: &[u8],
    identity_pem: Option<(&[u8], &[u8])>,
) -> Result<Arc<rustls::ClientConfig>, OpsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(refused(files.ca, "no TLS protocol version"))?
        .with_root_certificates(roots(files.ca, ca_pem)?);
    let config = match (files.identity, identity_pem) {
        (Some((cert_file, key_file)), Some((cert_pem, key_pem))) => {
            let chain = certificates(cert_file, cert_pem)?;
            let key = private_key(key_file, key_pem)?;
            builder.with_client_auth_cert(chain, key).map_err(refused(
                key_file,
                "does not form a usable pair with the certificate (a key that does not match it?)",
            ))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// [`client_config`] from the files.
pub fn client_config_from_files(
    files: ClientFiles<'_>,
) -> Result<Arc<rustls::ClientConfig>, OpsError> {
    let identity = match files.identity {
        Some((cert, key)) => Some((read(cert)?, read(key)?)),
        None => None,
    };
    let identity = identity.as_ref().map(|(cert, key)| (cert.as_slice(), key.as_slice()));
    client_config(files, &read(files.ca)?, identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(name: &str) -> (String, String) {
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
        (cert.pem(), signing_key.serialize_pem())
    }

    fn files() -> ServerFiles<'static> {
        ServerFiles { cert: Path::new("cert.pem"), key: Path::new("key.pem"), client_ca: None }
    }

    #[test]
    fn a_matching_pair_loads_and_a_key_of_another_certificate_is_named() {
        let (cert, key) = self_signed("localhost");
        assert!(server_config(files(), cert.as_bytes(), key.as_bytes(), None).is_ok());
        let (_, other_key) = self_signed("elsewhere");
        let error =
            server_config(files(), cert.as_bytes(), other_key.as_bytes(), None).unwrap_err();
        let text = crate::error_chain(&error);
        assert!(text.starts_with("key.pem: does not form a usable pair"), "{text}");
    }

    #[test]
    fn a_file_without_a_certificate_or_a_key_is_named_with_the_reason() {
        let (cert, key) = self_signed("localhost");
        let error = server_config(files(), key.as_bytes(), key.as_bytes(), None).unwrap_err();
        assert!(error.to_string().starts_with("cert.pem: holds no PEM certificate"), "{error}");
        let error = server_config(files(), cert.as_bytes(), cert.as_bytes(), None).unwrap_err();
        assert!(
            error.to_string().starts_with("key.pem: holds no usable PEM private key"),
            "{error}"
        );
        let error = server_config_from_files(ServerFiles {
            cert: Path::new("/nonexistent/cert.pem"),
            ..files()
        })
        .unwrap_err();
        assert!(error.to_string().starts_with("/nonexistent/cert.pem: cannot read it"), "{error}");
    }

    #[test]
    fn a_client_ca_and_a_client_identity_load_and_a_bad_ca_file_is_named() {
        let (ca, _) = self_signed("ca");
        let (cert, key) = self_signed("localhost");
        let files = ServerFiles { client_ca: Some(Path::new("ca.pem")), ..files() };
        assert!(server_config(files, cert.as_bytes(), key.as_bytes(), Some(ca.as_bytes())).is_ok());
        let error = server_config(files, cert.as_bytes(), key.as_bytes(), Some(key.as_bytes()))
            .unwrap_err();
        assert!(error.to_string().starts_with("ca.pem: holds no PEM certificate"), "{error}");
        let client = ClientFiles {
            ca: Path::new("ca.pem"),
            identity: Some((Path::new("c.pem"), Path::new("k.pem"))),
        };
        let identity = Some((cert.as_bytes(), key.as_bytes()));
        assert!(
            client_config(client, ca.as_bytes(), identity)
                .unwrap()
                .client_auth_cert_resolver
                .has_certs()
        );
        let error = client_config(client, key.as_bytes(), None).unwrap_err();
        assert!(error.to_string().starts_with("ca.pem: holds no PEM certificate"), "{error}");
    }
}
