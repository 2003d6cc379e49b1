//! Client credentials: one line per client, secrets stored as argon2 hashes (PHC strings).
//!
//! ```text
//! # client_id protocol comp_id argon2-hash
//! 7 native alice $argon2id$v=19$m=19456,t=2,p=1$...
//! 8 fix BROKER8 $argon2id$v=19$m=19456,t=2,p=1$...
//! ```
//! A FIX client logs on with SenderCompID = `comp_id` and Password (554) = its secret; a native
//! client with its client id and secret.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

/// Clients one credentials file may list.
pub const CLIENTS_MAX: usize = 1024;
/// Longest comp id (FIX SenderCompID) accepted.
pub const COMP_ID_BYTES_MAX: usize = 32;

/// Which protocol a client speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Native,
    Fix,
}

/// One client's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    pub client: u32,
    pub protocol: Protocol,
    pub comp_id: String,
    /// argon2 PHC string.
    pub hash: String,
}

/// A credentials file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("credentials line {line}: {reason}")]
    BadLine { line: usize, reason: String },
    #[error("credentials list {0} clients, more than {CLIENTS_MAX}")]
    TooMany(usize),
    #[error("hashing a secret: {0}")]
    Hash(String),
}

/// Parses a credentials file's text.
pub fn parse(text: &str) -> Result<Vec<Credential>, CredentialsError> {
    let mut credentials: Vec<Credential> = Vec::new();
    for (at, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |reason: &str| CredentialsError::BadLine { line: at + 1, reason: reason.into() };
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [client, protocol, comp_id, hash] = fields[..] else {
            return Err(bad("want: client_id protocol comp_id argon2-hash"));
        };
        let client = client.parse().map_err(|_| bad("client_id is not a u32"))?;
        let protocol = match protocol {
            "native" => Protocol::Native,
            "fix" => Protocol::Fix,
            _ => return Err(bad("protocol must be native or fix")),
        };
        if comp_id.len() > COMP_ID_BYTES_MAX {
            return Err(bad("comp_id is longer than 32 bytes"));
        }
        PasswordHash::new(hash).map_err(|_| bad("not an argon2 PHC hash"))?;
        if credentials.iter().any(|c| c.client == client || c.comp_id == comp_id) {
            return Err(bad("client_id or comp_id listed twice"));
        }
        let (comp_id, hash) = (comp_id.to_string(), hash.to_string());
        credentials.push(Credential { client, protocol, comp_id, hash });
    }
    if credentials.len() > CLIENTS_MAX {
        return Err(CredentialsError::TooMany(credentials.len()));
    }
    Ok(credentials)
}

/// Hashes a secret for a credentials file (argon2id, random salt).
pub fn hash_secret(secret: &[u8]) -> Result<String, CredentialsError> {
    let salt_bytes: [u8; 16] = rand::random();
    let salt =
        SaltString::encode_b64(&salt_bytes).map_err(|e| CredentialsError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(secret, &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| CredentialsError::Hash(e.to_string()))
}

/// Whether `secret` matches a stored hash. Slow by design (argon2): call off the I/O thread.
pub fn verify(hash: &str, secret: &[u8]) -> bool {
    PasswordHash::new(hash)
        .is_ok_and(|parsed| Argon2::default().verify_password(secret, &parsed).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_secrets_verify_and_wrong_ones_do_not() {
        let hash = hash_secret(b"s3cret").unwrap();
        let text = format!("# comment\n7 native alice {hash}\n8 fix BROKER8 {hash}\n");
        let credentials = parse(&text).unwrap();
        assert_eq!(credentials.len(), 2);
        assert_eq!(credentials[1].protocol, Protocol::Fix);
        assert!(verify(&credentials[0].hash, b"s3cret"));
        assert!(!verify(&credentials[0].hash, b"s3cre7"));
    }

    #[test]
    fn bad_lines_name_their_line() {
        let error = parse("7 native alice notahash\n").unwrap_err().to_string();
        assert!(error.contains("line 1") && error.contains("argon2"), "{error}");
        let error = parse("\n7 smoke alice x\n").unwrap_err().to_string();
        assert!(error.contains("line 2") && error.contains("protocol"), "{error}");
    }
}
