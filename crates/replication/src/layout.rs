//! Where each shard's input lives: one JetStream stream per shard, named and bounded here, and
//! the rule that sends an instrument to its shard.
//!
//! * stream `{PREFIX}_ORDERS_{shard}` (the prefix upper-cased; stream names take no `.`),
//!   subject `{prefix}.orders.{shard}`;
//! * an instrument's shard is `instrument % shards` — the rule the tier itself uses to route
//!   orders to its core shards (`Route::by_key` on the instrument), so a shard stream feeds
//!   exactly the instruments one engine group books;
//! * the stream refuses appends when full ([`DiscardPolicy::New`]): dropping its oldest inputs
//!   would make replay diverge, so a full log stops order entry instead.

use std::time::Duration;

use async_nats::jetstream::{self, stream::DiscardPolicy, stream::StorageType};
use matching::msg::InstrumentId;

use crate::error::ReplicationError;

/// Default first token of the subjects (and, upper-cased, of the stream names).
pub const PREFIX_DEFAULT: &str = "leantier";
/// How long JetStream remembers a message id: a gateway's retry of an unacknowledged append
/// inside this window never creates a second order, so a gateway retries an append for this
/// long (less [`crate::append::DEDUP_MARGIN`]) before it gives up on it.
pub const DEDUP_WINDOW_DEFAULT: Duration = Duration::from_secs(120);
/// Bytes a shard's stream may hold before appends are refused (1 GiB: ~22 M orders).
pub const STREAM_BYTES_MAX_DEFAULT: i64 = 1 << 30;
/// Most shard streams.
pub const SHARDS_MAX: u32 = 256;
/// How long a starting process retries creating or opening its streams.
pub const STARTUP_WAIT: Duration = Duration::from_secs(20);
/// Pause between two such tries.
const STARTUP_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Runs `attempt` until it succeeds or [`STARTUP_WAIT`] passed; the last error names `what`.
pub(crate) async fn retry_at_startup<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> Result<T, ReplicationError> {
    let started = std::time::Instant::now();
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(error) if started.elapsed() >= STARTUP_WAIT => {
                return Err(ReplicationError::jetstream(what, error));
            }
            Err(error) => tracing::debug!("{what}: {error}; retrying"),
        }
        tokio::time::sleep(STARTUP_RETRY_PAUSE).await;
    }
}

/// How the input log is laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSettings {
    /// First token of every subject, `[A-Za-z0-9_-]`.
    pub prefix: String,
    /// Shard streams (1..=[`SHARDS_MAX`]).
    pub shards: u32,
    /// Copies of each stream: 3 in a three-node cluster (one node may fail), 1 on one server.
    pub replicas: usize,
    /// JetStream's deduplication window ([`DEDUP_WINDOW_DEFAULT`]).
    pub dedup_window: Duration,
    /// Bytes per stream before appends are refused ([`STREAM_BYTES_MAX_DEFAULT`]).
    pub stream_bytes_max: i64,
}

impl LogSettings {
    /// One shard stream with `replicas` copies and the default window and bound.
    ///
    /// ```
    /// use replication::layout::LogSettings;
    /// let settings = LogSettings::new(1);
    /// assert_eq!(settings.stream(0), "LEANTIER_ORDERS_0");
    /// assert_eq!(settings.subject(0), "leantier.orders.0");
    /// ```
    pub fn new(replicas: usize) -> LogSettings {
        LogSettings {
            prefix: PREFIX_DEFAULT.to_string(),
            shards: 1,
            replicas,
            dedup_window: DEDUP_WINDOW_DEFAULT,
            stream_bytes_max: STREAM_BYTES_MAX_DEFAULT,
        }
    }

    /// Checks the prefix, shard count, replicas and window.
    ///
    /// ```
    /// use replication::layout::LogSettings;
    /// assert!(LogSettings::new(3).validate().is_ok());
    /// assert!(LogSettings { prefix: "a.b".into(), ..LogSettings::new(1) }.validate().is_err());
    /// assert!(LogSettings { shards: 0, ..LogSettings::new(1) }.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), ReplicationError> {
        let token = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        let bad = |why: String| Err(ReplicationError::BadSettings(why));
        if self.prefix.is_empty() || self.prefix.len() > 32 || !self.prefix.chars().all(token) {
            return bad(format!("prefix {:?}: 1..=32 characters of A-Z a-z 0-9 _ -", self.prefix));
        }
        if !(1..=SHARDS_MAX).contains(&self.shards) {
            return bad(format!("shards {}: must be in 1..={SHARDS_MAX}", self.shards));
        }
        if !(1..=5).contains(&self.replicas) {
            return bad(format!("replicas {}: JetStream keeps 1..=5", self.replicas));
        }
        if self.dedup_window.is_zero() || self.stream_bytes_max <= 0 {
            return bad("the dedup window and the stream bound must be positive".into());
        }
        Ok(())
    }

    /// The shard stream that books `instrument`.
    ///
    /// ```
    /// use replication::layout::LogSettings;
    /// let settings = LogSettings { shards: 2, ..LogSettings::new(1) };
    /// assert_eq!((settings.shard_of(7), settings.shard_of(8)), (1, 0));
    /// ```
    pub fn shard_of(&self, instrument: InstrumentId) -> u32 {
        instrument % self.shards
    }

    /// The subject prefix `shard`'s engine group publishes its reports and market data under
    /// (`delivery`'s subjects, one sequence space per group): `{prefix}-shard{shard}`.
    ///
    /// ```
    /// use replication::layout::LogSettings;
    /// assert_eq!(LogSettings::new(1).publish_prefix(1), "leantier-shard1");
    /// ```
    pub fn publish_prefix(&self, shard: u32) -> String {
        format!("{}-shard{shard}", self.prefix)
    }

    /// The stream name of `shard`.
    pub fn stream(&self, shard: u32) -> String {
        format!("{}_ORDERS_{shard}", self.prefix.to_ascii_uppercase())
    }

    /// The subject gateways append `shard`'s orders to.
    pub fn subject(&self, shard: u32) -> String {
        format!("{}.orders.{shard}", self.prefix)
    }

    /// The stream's JetStream configuration.
    pub fn stream_config(&self, shard: u32) -> jetstream::stream::Config {
        jetstream::stream::Config {
            name: self.stream(shard),
            subjects: vec![self.subject(shard)],
            storage: StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: self.dedup_window,
            max_bytes: self.stream_bytes_max,
            discard: DiscardPolicy::New,
            // Inputs are never removed one by one: a hole would break replay.
            deny_delete: true,
            ..Default::default()
        }
    }

    /// Creates every shard stream that does not exist yet (an existing one is used as is),
    /// retrying for [`STARTUP_WAIT`]: a process may start with its cluster, before the cluster
    /// has elected the leader that creates streams. Returns the shortest deduplication window
    /// among the streams (how long an append may safely be retried).
    pub async fn ensure_streams(
        &self,
        js: &jetstream::Context,
    ) -> Result<Duration, ReplicationError> {
        self.validate()?;
        let mut dedup_window = self.dedup_window;
        for shard in 0..self.shards {
            let config = self.stream_config(shard);
            let what = format!("creating stream {}", config.name);
            let stream =
                retry_at_startup(&what, || js.get_or_create_stream(config.clone())).await?;
            // An existing stream keeps the window it was created with.
            dedup_window = dedup_window.min(stream.cached_info().config.duplicate_window);
        }
        Ok(dedup_window)
    }
}
