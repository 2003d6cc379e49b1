//! Client authentication. A client registers a name with a secret; the node stores only the
//! secret's salted Argon2id hash (PHC string: algorithm, parameters, salt and hash), and a later
//! registration under the name must present the same secret.
//!
//! Hashing is deliberately slow (Argon2id with the argon2 crate's defaults: 19 MiB, 2 passes),
//! so it runs on tokio's blocking pool, at most [`HASHES_CONCURRENT_MAX`] at once (bounding the
//! memory and CPU a registration flood can take), and outside every database transaction: a
//! registration holds neither a handler slot nor a database worker, and at most
//! [`REGISTRATIONS_IN_PROGRESS_MAX`] are in progress; past it the answer is `Busy`.

use std::sync::atomic::{AtomicUsize, Ordering};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use tokio::sync::Semaphore;

use crate::protocol::{ErrorReply, Reason, SECRET_BYTES_MAX, Secret};
use crate::store::{Store, check_name};

/// Argon2 computations running at once (each takes 19 MiB and one core for tens of ms).
pub const HASHES_CONCURRENT_MAX: usize = 2;
/// Registrations in progress at once, node-wide; past it `Busy`.
pub const REGISTRATIONS_IN_PROGRESS_MAX: usize = 64;
/// Bytes of random salt per hash (the PHC recommendation is ≥ 16).
const SALT_BYTES: usize = 16;

/// The node's registration bounds.
pub(crate) struct Registrar {
    hashing: Semaphore,
    in_progress: AtomicUsize,
}

impl Default for Registrar {
    fn default() -> Registrar {
        Registrar {
            hashing: Semaphore::new(HASHES_CONCURRENT_MAX),
            in_progress: AtomicUsize::new(0),
        }
    }
}

/// Decrements the in-progress count however the registration ends (cancellation included).
struct InProgress<'a>(&'a AtomicUsize);

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        // Relaxed: the counter only bounds how many registrations run; it orders no memory.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Registrar {
    /// Registers (or authenticates) `name` with `secret`; the client id, or the refusal.
    pub(crate) async fn register<S: Store>(
        &self,
        store: &S,
        name: &str,
        secret: Secret,
    ) -> Result<u64, ErrorReply> {
        check_name(name)?;
        if secret.0.is_empty() || secret.0.len() > SECRET_BYTES_MAX {
            let detail = format!("secrets are 1..={SECRET_BYTES_MAX} bytes");
            return Err(ErrorReply::new(Reason::InvalidSecret, detail));
        }
        // Relaxed: see InProgress.
        let _in_progress = InProgress(&self.in_progress);
        if self.in_progress.fetch_add(1, Ordering::Relaxed) >= REGISTRATIONS_IN_PROGRESS_MAX {
            return Err(ErrorReply::new(Reason::Busy, "too many registrations in progress"));
        }
        let secret = std::sync::Arc::new(secret);
        let hash = self.run_hashing(secret.clone(), None).await?;
        let record = store
            .claim_client(name, &hash)
            .await
            .map_err(|e| ErrorReply::new(Reason::Unavailable, format!("database: {e:#}")))?;
        if record.secret_hash == hash {
            return Ok(record.id);
        }
        self.run_hashing(secret, Some(record.secret_hash)).await.map(|_| record.id)
    }

    /// Hashes `secret` with a new salt (`stored` = None), or verifies it against `stored`.
    async fn run_hashing(
        &self,
        secret: std::sync::Arc<Secret>,
        stored: Option<String>,
    ) -> Result<String, ErrorReply> {
        let unavailable = |detail: String| ErrorReply::new(Reason::Unavailable, detail);
        let _slot =
            self.hashing.acquire().await.map_err(|_| unavailable("hashing stopped".into()))?;
        let job = move || match stored {
            None => hash_secret(&secret.0).map_err(|e| unavailable(format!("hashing: {e}"))),
            Some(stored) => match verify_secret(&secret.0, &stored) {
                true => Ok(stored),
                false => Err(ErrorReply::new(
                    Reason::BadCredentials,
                    "this name is registered with another secret",
                )),
            },
        };
        tokio::task::spawn_blocking(job)
            .await
            .map_err(|e| unavailable(format!("hashing task: {e}")))?
    }
}

/// A new salted Argon2id hash of `secret`, as a PHC string.
fn hash_secret(secret: &[u8]) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::encode_b64(&rand::random::<[u8; SALT_BYTES]>())?;
    Ok(argon2::Argon2::default().hash_password(secret, &salt)?.to_string())
}

/// Whether `secret` matches the PHC string `stored` (parameters and salt are read from it). A
/// stored string that does not parse matches nothing.
fn verify_secret(secret: &[u8], stored: &str) -> bool {
    PasswordHash::new(stored)
        .is_ok_and(|parsed| argon2::Argon2::default().verify_password(secret, &parsed).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_salted_and_verify_only_their_secret() {
        let started = std::time::Instant::now();
        let a = hash_secret(b"correct horse").unwrap();
        println!("one Argon2id hash: {:?}", started.elapsed());
        let b = hash_secret(b"correct horse").unwrap();
        assert_ne!(a, b, "two hashes of one secret differ by their salt");
        assert!(a.starts_with("$argon2id$"), "{a}");
        assert!(!a.contains("correct horse"));
        assert!(verify_secret(b"correct horse", &a) && verify_secret(b"correct horse", &b));
        assert!(!verify_secret(b"correct horsf", &a));
        assert!(!verify_secret(b"correct horse", "not a PHC string"));
    }
}
