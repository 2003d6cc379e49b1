//! Client credentials: one line per client, secrets stored as argon2 hashes (PHC strings).
//!
//! ```text
//! # client_id protocol comp_id argon2-hash
//! 7 native alice $argon2id$v=19$m=19456,t=2,p=1$...
//! 8 fix BROKER8 $argon2id$v=19$m=19456,t=2,p=1$...
//! ```
//! A FIX client logs on with SenderCompID = `comp_id` and Password (554) = its secret; a native
//! client with its client id and secret.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, PoisonError};

use argon2::password_hash::{Output, PasswordHash, PasswordHasher, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};

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
        if client == exchange::events::OPERATOR_CLIENT {
            // A session with it could send operator events (halts) as orders.
            return Err(bad("client_id 4294967295 is reserved for operator events"));
        }
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

/// Threads that verify secrets: each holds its argon2 working memory (19 MiB with the default
/// parameters) for the server's life, so logins cost no allocation and memory stays bounded
/// however many arrive.
pub(crate) const VERIFY_THREADS: usize = 2;
/// Logins waiting for a verifying thread; past it a login is refused as busy at once.
pub(crate) const VERIFY_QUEUE_MAX: usize = 64;

/// The outcome of [`Verifier::verify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Match,
    /// A wrong secret, or an unknown client (verified against a stand-in hash, so that both
    /// take the same time).
    NoMatch,
    /// [`VERIFY_QUEUE_MAX`] logins are already waiting.
    Busy,
}

/// One secret to check, and where its verdict goes.
struct Job {
    hash: Option<String>,
    secret: Vec<u8>,
    verdict: tokio::sync::oneshot::Sender<bool>,
}

/// A fixed pool of verifying threads behind a bounded queue, shared by every session: login
/// floods cost at most [`VERIFY_THREADS`] CPUs and their memory, never more threads or
/// memory, and unknown client ids take as long as known ones.
pub(crate) struct Verifier {
    jobs: SyncSender<Job>,
}

impl Verifier {
    /// Starts the verifying threads (each first hashes a random secret of its own: the
    /// stand-in that unknown clients are checked against).
    pub fn start() -> Result<Verifier, CredentialsError> {
        let (jobs, queue) = std::sync::mpsc::sync_channel::<Job>(VERIFY_QUEUE_MAX);
        let queue = Arc::new(Mutex::new(queue));
        for worker in 0..VERIFY_THREADS {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("gateway-verify-{worker}"))
                .spawn(move || verify_loop(&queue))
                .map_err(|e| CredentialsError::Hash(e.to_string()))?;
        }
        Ok(Verifier { jobs })
    }

    /// Checks `secret` against `hash` (`None`: an unknown client, checked against a stand-in
    /// so that it takes as long) on a verifying thread; [`Verdict::Busy`] at once when the
    /// queue is full.
    pub fn verify(
        &self,
        hash: Option<String>,
        secret: &[u8],
    ) -> impl std::future::Future<Output = Verdict> + 'static {
        let known = hash.is_some();
        let (verdict, answer) = tokio::sync::oneshot::channel();
        let job = Job { hash, secret: secret.to_vec(), verdict };
        let queued = match self.jobs.try_send(job) {
            Ok(()) => Some(answer),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => None,
        };
        async move {
            let Some(answer) = queued else { return Verdict::Busy };
            match answer.await {
                Ok(true) if known => Verdict::Match,
                _ => Verdict::NoMatch,
            }
        }
    }
}

/// A verifying thread: takes jobs until the [`Verifier`] is dropped, reusing its memory.
fn verify_loop(queue: &Mutex<Receiver<Job>>) {
    // Measured: a good client's p99 under 8 connections logging in with wrong secrets, 8.7 ms
    // with the verifying threads at nice 0, 0.37 ms at 10 (2 vCPUs; `soak_hostile`).
    if let Err(error) = ops::process::set_this_threads_nice(ops::process::HASHING_NICE) {
        tracing::warn!(%error, "gateway: a verifying thread keeps its priority");
    }
    let Ok(stand_in) = hash_secret(&rand::random::<[u8; 16]>()) else {
        tracing::error!("gateway: no stand-in hash; this verifying thread stops");
        return;
    };
    let mut memory: Vec<Block> = Vec::new();
    loop {
        let job = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(Job { hash, secret, verdict }) = job else { return };
        let hash = hash.as_deref().unwrap_or(&stand_in);
        let _ = verdict.send(verify_with(hash, &secret, &mut memory));
    }
}

/// Whether `secret` matches the stored `hash`, computed in the caller's working memory
/// (grown once to the hash's parameters). Slow by design (argon2): a verifying thread's work.
fn verify_with(hash: &str, secret: &[u8], memory: &mut Vec<Block>) -> bool {
    let Ok(parsed) = PasswordHash::new(hash) else { return false };
    let (Some(salt), Some(expected)) = (parsed.salt, parsed.hash) else { return false };
    let Ok(params) = Params::try_from(&parsed) else { return false };
    let Ok(algorithm) = Algorithm::try_from(parsed.algorithm) else { return false };
    let version = parsed.version.and_then(|v| Version::try_from(v).ok()).unwrap_or_default();
    let mut salt_bytes = [0u8; 64];
    let Ok(salt) = salt.decode_b64(&mut salt_bytes) else { return false };
    if memory.len() < params.block_count() {
        memory.resize(params.block_count(), Block::default());
    }
    let mut out = [0u8; Output::MAX_LENGTH];
    let out = &mut out[..expected.len()];
    let argon2 = Argon2::new(algorithm, version, params);
    let blocks = &mut memory[..argon2.params().block_count()];
    if argon2.hash_password_into_with_memory(secret, salt, out, blocks).is_err() {
        return false;
    }
    // Constant-time comparison (`Output`'s equality).
    Output::new(out).is_ok_and(|computed| computed == expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_matches_what_verify_matches_and_refuses_past_its_queue() {
        let hash = hash_secret(b"s3cret").unwrap();
        let verifier = Verifier::start().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let check = |hash: Option<&str>, secret: &[u8]| {
            runtime.block_on(verifier.verify(hash.map(str::to_string), secret))
        };
        assert_eq!(check(Some(&hash), b"s3cret"), Verdict::Match);
        assert_eq!(check(Some(&hash), b"s3cre7"), Verdict::NoMatch);
        assert_eq!(check(None, b"s3cret"), Verdict::NoMatch, "an unknown client");
        assert_eq!(check(Some("not a hash"), b"s3cret"), Verdict::NoMatch);
        // Queue far more than fits at once: the rest are refused as busy, never queued.
        let pending: Vec<_> =
            (0..VERIFY_QUEUE_MAX * 2).map(|_| verifier.verify(Some(hash.clone()), b"x")).collect();
        let verdicts: Vec<Verdict> = pending.into_iter().map(|v| runtime.block_on(v)).collect();
        let busy = verdicts.iter().filter(|v| **v == Verdict::Busy).count();
        assert!(busy >= VERIFY_QUEUE_MAX - VERIFY_THREADS, "{busy} refused of {}", verdicts.len());
        assert!(verdicts.iter().all(|v| *v != Verdict::Match));
    }

    #[test]
    fn the_verifying_threads_yield_the_cpu_to_the_sessions() {
        let _verifier = Verifier::start().unwrap();
        let (nice, wait) = (ops::process::HASHING_NICE, std::time::Duration::from_secs(5));
        let yielded =
            ops::process::await_threads_at_nice("gateway-verify", VERIFY_THREADS, nice, wait);
        assert_eq!(yielded, Ok(()), "the verifying threads' nice values");
    }

    #[test]
    fn hashed_secrets_verify_and_wrong_ones_do_not() {
        let hash = hash_secret(b"s3cret").unwrap();
        let text = format!("# comment\n7 native alice {hash}\n8 fix BROKER8 {hash}\n");
        let credentials = parse(&text).unwrap();
        assert_eq!(credentials.len(), 2);
        assert_eq!(credentials[1].protocol, Protocol::Fix);
        let mut memory = Vec::new();
        assert!(verify_with(&credentials[0].hash, b"s3cret", &mut memory));
        assert!(!verify_with(&credentials[0].hash, b"s3cre7", &mut memory));
        let parsed = PasswordHash::new(&credentials[0].hash).unwrap();
        use argon2::password_hash::PasswordVerifier;
        assert!(Argon2::default().verify_password(b"s3cret", &parsed).is_ok(), "argon2 agrees");
    }

    #[test]
    fn bad_lines_name_their_line() {
        let error = parse("7 native alice notahash\n").unwrap_err().to_string();
        assert!(error.contains("line 1") && error.contains("argon2"), "{error}");
        let error = parse("\n7 smoke alice x\n").unwrap_err().to_string();
        assert!(error.contains("line 2") && error.contains("protocol"), "{error}");
        let hash = hash_secret(b"s3cret").unwrap();
        let error = parse(&format!("4294967295 native op {hash}\n")).unwrap_err().to_string();
        assert!(error.contains("line 1") && error.contains("operator"), "{error}");
    }
}
