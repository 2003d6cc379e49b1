//! Client authentication. A client registers a name with a secret; the node stores only the
//! secret's salted Argon2id hash (PHC string: algorithm, parameters, salt and hash), and a later
//! registration under the name must present the same secret.
//!
//! Hashing is deliberately slow (Argon2id with the argon2 crate's defaults: 19 MiB, 2 passes),
//! so it is bounded as a class, before the client is known:
//! - it runs on a fixed pool of [`crate::server::NodeConfig::hashing_threads`] threads, each
//!   reusing one 19 MiB block of Argon2 memory for every hash (allocated at its first hash and
//!   kept), so a flood costs that pool's memory and no more (on tokio's blocking pool each
//!   registration could run on a new thread whose allocator arena kept its 19 MiB: 167 MB after
//!   26 registrations, about 1 GB under a flood);
//! - registrations wait for a thread in one FIFO queue of at most
//!   [`crate::server::NodeConfig::hashing_queue_max`]; past it the answer is `Busy` (detail:
//!   hashing queue full);
//! - one registration per connection is in progress at a time (the connection reads its next
//!   frame only once the registration is answered), and a source address may attempt
//!   [`crate::server::NodeConfig::registration_attempts_per_address_max`] registrations and
//!   create [`crate::server::NodeConfig::accounts_per_address_max`] accounts per
//!   [`crate::server::NodeConfig::registration_window_ms`] (the `address` module); past them
//!   `Busy`, without hashing;
//! - a known name costs one verification and an unknown one one hash (the stored hash is looked
//!   up first), so the time taken does not tell whether a name is registered.
//!
//! Hashing runs outside every database transaction: a registration holds neither a handler
//! slot nor a database worker.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use argon2::password_hash::{Output, ParamsString, PasswordHash, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use tokio::sync::oneshot;

use crate::address::{RegistrationLimits, RegistrationWindows};
use crate::protocol::{ErrorReply, Reason, SECRET_BYTES_MAX, Secret};
use crate::store::{Store, check_name};
use crate::util::{LOG_INTERVAL, RateLimitedLog};

/// Bytes of random salt per hash (the PHC recommendation is ≥ 16).
const SALT_BYTES: usize = 16;

/// What a hashing thread is asked: hash with a new salt, or verify against a stored hash.
enum Job {
    Hash,
    Verify(String),
}

struct HashRequest {
    secret: Arc<Secret>,
    job: Job,
    answer: oneshot::Sender<Result<String, ErrorReply>>,
}

/// The node's registration bounds (module docs).
pub(crate) struct Registrar {
    queue: SyncSender<HashRequest>,
    windows: RegistrationWindows,
    /// Argon2 computations run (hashes and verifications).
    hashes: Arc<AtomicU64>,
    /// Registrations refused for a bound, logged once per `LOG_INTERVAL` with the count.
    refusals: Mutex<RateLimitedLog>,
}

impl Registrar {
    /// Starts `threads` hashing threads behind a queue of `queue_max`.
    pub(crate) fn new(
        threads: usize,
        queue_max: usize,
        limits: RegistrationLimits,
    ) -> std::io::Result<Registrar> {
        let (queue, requests) = sync_channel(queue_max);
        let requests = Arc::new(Mutex::new(requests));
        let hashes = Arc::new(AtomicU64::new(0));
        for index in 0..threads {
            let (requests, hashes) = (Arc::clone(&requests), Arc::clone(&hashes));
            std::thread::Builder::new()
                .name(format!("mq-hashing-{index}"))
                .spawn(move || hashing_thread(&requests, &hashes))?;
        }
        let windows = RegistrationWindows::new(limits);
        let refusals = Mutex::new(RateLimitedLog::new(LOG_INTERVAL));
        Ok(Registrar { queue, windows, hashes, refusals })
    }

    /// Argon2 computations run so far.
    fn hashes(&self) -> u64 {
        // Relaxed: a statistic.
        self.hashes.load(Ordering::Relaxed)
    }

    /// A `Busy` refusal for a registration bound, logged at most once per `LOG_INTERVAL`.
    fn refuse(&self, detail: String) -> ErrorReply {
        let due = self.refusals.lock().unwrap_or_else(PoisonError::into_inner).note(Instant::now());
        if let Some(refused) = due {
            let hashes = self.hashes();
            tracing::warn!(refused, hashes, %detail, "registrations refused for a bound");
        }
        ErrorReply::new(Reason::Busy, detail)
    }

    /// Registers (or authenticates) `name` with `secret` for a client at `source`; the client
    /// id, or the refusal.
    pub(crate) async fn register<S: Store>(
        &self,
        store: &S,
        source: IpAddr,
        name: &str,
        secret: Secret,
    ) -> Result<u64, ErrorReply> {
        check_name(name)?;
        if secret.0.is_empty() || secret.0.len() > SECRET_BYTES_MAX {
            let detail = format!("secrets are 1..={SECRET_BYTES_MAX} bytes");
            return Err(ErrorReply::new(Reason::InvalidSecret, detail));
        }
        let busy = |refusal: crate::address::SourceRefusal| self.refuse(refusal.to_string());
        self.windows.attempt(source, Instant::now()).map_err(busy)?;
        let secret = Arc::new(secret);
        if let Some(record) = store.find_client(name).await.map_err(database)? {
            return self.run(secret, Job::Verify(record.secret_hash)).await.map(|_| record.id);
        }
        let creation = self.windows.create_account(source, Instant::now()).map_err(busy)?;
        let hash = self.run(Arc::clone(&secret), Job::Hash).await?;
        let record = store.claim_client(name, &hash).await.map_err(database)?;
        if record.secret_hash == hash {
            creation.created();
            return Ok(record.id);
        }
        // Registered by someone else since the lookup: this attempt created nothing.
        drop(creation);
        self.run(secret, Job::Verify(record.secret_hash)).await.map(|_| record.id)
    }

    /// Queues `job` for a hashing thread (or refuses it, the queue being full) and waits.
    async fn run(&self, secret: Arc<Secret>, job: Job) -> Result<String, ErrorReply> {
        let (answer, answered) = oneshot::channel();
        match self.queue.try_send(HashRequest { secret, job, answer }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(self.refuse("hashing queue full; retry later".into()));
            }
            Err(TrySendError::Disconnected(_)) => return Err(hashing_stopped()),
        }
        answered.await.unwrap_or_else(|_| Err(hashing_stopped()))
    }
}

fn database(error: crate::MqError) -> ErrorReply {
    ErrorReply::new(Reason::Unavailable, format!("database: {}", ops::error_chain(&error)))
}

fn hashing_stopped() -> ErrorReply {
    ErrorReply::new(Reason::Unavailable, "hashing stopped")
}

/// One hashing thread: takes requests in queue order until the node is dropped, reusing one
/// Argon2 memory block for all of them.
fn hashing_thread(requests: &Mutex<Receiver<HashRequest>>, hashes: &AtomicU64) {
    if let Err(error) = ops::process::set_this_threads_nice(ops::process::HASHING_NICE) {
        tracing::warn!(%error, "mq: a hashing thread keeps its priority");
    }
    let mut memory: Vec<Block> = Vec::new();
    loop {
        let request = requests.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(HashRequest { secret, job, answer }) = request else {
            return;
        };
        if answer.is_closed() {
            continue; // The registration was cancelled (its connection closed) while queued.
        }
        if memory.is_empty() {
            memory = vec![Block::default(); Params::DEFAULT.block_count()];
        }
        let result = match job {
            Job::Hash => hash_secret(&secret.0, &mut memory)
                .map_err(|e| ErrorReply::new(Reason::Unavailable, format!("hashing: {e}"))),
            Job::Verify(stored) => match verify_secret(&secret.0, &stored, &mut memory) {
                true => Ok(stored),
                false => Err(ErrorReply::new(
                    Reason::BadCredentials,
                    "this name is registered with another secret",
                )),
            },
        };
        // Relaxed: a statistic.
        hashes.fetch_add(1, Ordering::Relaxed);
        // A registration cancelled meanwhile dropped its receiver; nothing waits.
        let _ = answer.send(result);
    }
}

/// A new salted Argon2id hash (default parameters) of `secret` as a PHC string, computed in
/// `memory`.
fn hash_secret(
    secret: &[u8],
    memory: &mut [Block],
) -> Result<String, argon2::password_hash::Error> {
    let salt_bytes = rand::random::<[u8; SALT_BYTES]>();
    let salt = SaltString::encode_b64(&salt_bytes)?;
    let params = Params::DEFAULT;
    let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params.clone());
    let hash = Output::init_with(Params::DEFAULT_OUTPUT_LEN, |out| {
        Ok(argon2.hash_password_into_with_memory(secret, &salt_bytes, out, &mut *memory)?)
    })?;
    let phc = PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: ParamsString::try_from(&params)?,
        salt: Some(salt.as_salt()),
        hash: Some(hash),
    };
    Ok(phc.to_string())
}

/// Whether `secret` matches the PHC string `stored` (algorithm, parameters and salt are read
/// from it), computed in `memory`. A stored string that does not parse, or that needs more
/// memory than a hashing thread holds (hashes are made with the default parameters), matches
/// nothing.
fn verify_secret(secret: &[u8], stored: &str, memory: &mut [Block]) -> bool {
    let Ok(parsed) = PasswordHash::new(stored) else {
        return false;
    };
    let (Ok(algorithm), Ok(params), Some(expected), Some(salt)) = (
        Algorithm::try_from(parsed.algorithm),
        Params::try_from(&parsed),
        parsed.hash,
        parsed.salt,
    ) else {
        return false;
    };
    let version = parsed.version.map_or(Ok(Version::default()), Version::try_from);
    let mut salt_bytes = [0; 64];
    let (Ok(version), Ok(salt)) = (version, salt.decode_b64(&mut salt_bytes)) else {
        return false;
    };
    if params.block_count() > memory.len() {
        return false;
    }
    let argon2 = Argon2::new(algorithm, version, params);
    let computed = Output::init_with(expected.len(), |out| {
        Ok(argon2.hash_password_into_with_memory(secret, salt, out, &mut *memory)?)
    });
    // Output's equality is constant-time.
    computed.is_ok_and(|computed| computed == expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Vec<Block> {
        vec![Block::default(); Params::DEFAULT.block_count()]
    }

    #[test]
    fn the_hashing_threads_yield_the_cpu_to_the_sessions() {
        let window = std::time::Duration::from_secs(60);
        let limits = RegistrationLimits { window, attempts_max: 1, accounts_max: 1 };
        let _registrar = Registrar::new(2, 4, limits).unwrap();
        let (nice, wait) = (ops::process::HASHING_NICE, std::time::Duration::from_secs(5));
        let yielded = ops::process::await_threads_at_nice("mq-hashing", 2, nice, wait);
        assert_eq!(yielded, Ok(()), "the hashing threads' nice values");
    }

    #[test]
    fn hashes_are_salted_and_verify_only_their_secret() {
        let mut memory = memory();
        let started = std::time::Instant::now();
        let a = hash_secret(b"correct horse", &mut memory).unwrap();
        println!("one Argon2id hash: {:?}", started.elapsed());
        let b = hash_secret(b"correct horse", &mut memory).unwrap();
        assert_ne!(a, b, "two hashes of one secret differ by their salt");
        assert!(a.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{a}");
        assert!(!a.contains("correct horse"));
        assert!(verify_secret(b"correct horse", &a, &mut memory));
        assert!(verify_secret(b"correct horse", &b, &mut memory));
        assert!(!verify_secret(b"correct horsf", &a, &mut memory));
        assert!(!verify_secret(b"correct horse", "not a PHC string", &mut memory));
    }

    #[test]
    fn hashes_interoperate_with_the_argon2_crate() {
        use argon2::password_hash::{PasswordHasher, PasswordVerifier};
        let mut memory = memory();
        let ours = hash_secret(b"s3cret", &mut memory).unwrap();
        let parsed = PasswordHash::new(&ours).unwrap();
        assert!(Argon2::default().verify_password(b"s3cret", &parsed).is_ok());
        let salt = SaltString::encode_b64(b"sixteen bytes!!!").unwrap();
        let theirs = Argon2::default().hash_password(b"s3cret", &salt).unwrap().to_string();
        assert!(verify_secret(b"s3cret", &theirs, &mut memory));
        assert!(!verify_secret(b"s3cre7", &theirs, &mut memory));
    }

    fn limits(accounts_max: usize) -> RegistrationLimits {
        let window = std::time::Duration::from_secs(60);
        RegistrationLimits { window, attempts_max: 100, accounts_max }
    }

    /// A known name costs one Argon2 computation, like an unknown one (before, two: a fresh
    /// hash, then the verification), so timing does not tell whether a name is registered.
    #[tokio::test]
    async fn known_and_unknown_names_cost_one_hash_each_and_accounts_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("sqlite:{}", dir.path().display());
        let store = crate::store::AnyStore::open(&spec, 1).await.unwrap();
        let registrar = Registrar::new(1, 4, limits(1)).unwrap();
        let source: IpAddr = "10.0.0.1".parse().unwrap();
        let secret = |s: &[u8]| Secret(s.to_vec());
        let id = registrar.register(&store, source, "alice", secret(b"a")).await.unwrap();
        assert_eq!(registrar.hashes(), 1, "an unknown name: one hash");
        let again = registrar.register(&store, source, "alice", secret(b"a")).await.unwrap();
        assert_eq!((again, registrar.hashes()), (id, 2), "a known name: one verification");
        let wrong = registrar.register(&store, source, "alice", secret(b"b")).await.unwrap_err();
        assert_eq!((wrong.reason, registrar.hashes()), (Reason::BadCredentials, 3));
        let capped = registrar.register(&store, source, "bob", secret(b"b")).await.unwrap_err();
        assert_eq!(capped.reason, Reason::Busy, "{capped:?}");
        assert!(capped.detail.contains("accounts"), "{capped:?}");
        assert_eq!(registrar.hashes(), 3, "refused before hashing");
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        registrar.register(&store, other, "bob", secret(b"b")).await.unwrap();
    }
}
