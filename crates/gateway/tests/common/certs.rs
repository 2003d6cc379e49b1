#![allow(dead_code)]
//! A private CA, a server certificate (for 127.0.0.1 and localhost) and client certificates,
//! generated per test run and written as PEM files: what an operator makes with openssl
//! (docs/SECURITY.md), here with rcgen.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// Parameters for `names` with the first as the common name (rcgen's default name is the same
/// for every certificate, which openssl takes for a self-signed leaf).
fn params(names: &[&str]) -> CertificateParams {
    let owned: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(owned).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params
}

/// The PEM files of one CA and what it signed, in a folder of their own.
pub struct Certs {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    _dir: tempfile::TempDir,
}

/// A certificate for `names` that `issuer` signed, and its key.
fn signed(issuer: &Issuer<'_, KeyPair>, names: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let cert = params(names).signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Certs {
    /// A fresh CA named `ca_name` and its server and client certificates.
    pub fn new(ca_name: &str) -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let mut params = params(&[ca_name]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(params, ca_key);
        let (server_cert, server_key) = signed(&issuer, &["127.0.0.1", "localhost"]);
        let (client_cert, client_key) = signed(&issuer, &["client.example"]);
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Certs {
            ca: write("ca.pem", &ca.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            _dir: dir,
        }
    }

    /// The folder the files are in.
    pub fn dir(&self) -> &Path {
        self.ca.parent().unwrap()
    }

    /// The server's TLS, demanding client certificates of this CA when `mutual`.
    pub fn listener_tls(&self, mutual: bool) -> gateway::ListenerTls {
        let files = ops::tls::ServerFiles {
            cert: &self.server_cert,
            key: &self.server_key,
            client_ca: mutual.then_some(self.ca.as_path()),
        };
        gateway::ListenerTls::from_files(files).unwrap()
    }

    /// A client trusting this CA, presenting `identity`'s client certificate when given.
    pub fn client_tls(&self, identity: Option<&Certs>) -> gateway::client::ClientTls {
        let identity = identity.map(|c| (c.client_cert.as_path(), c.client_key.as_path()));
        let files = ops::tls::ClientFiles { ca: &self.ca, identity };
        gateway::client::ClientTls::from_files(files, "127.0.0.1").unwrap()
    }
}
