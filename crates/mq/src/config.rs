//! A node's configuration (`mq serve`'s TOML and flags, docs/OPERATIONS.md): every bound the
//! `server`, `connection` and `auth` modules enforce, with its default and its validation.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::address::RegistrationLimits;
use crate::frame::FRAME_CHUNK_BYTES;
use crate::reply_memory::{REPLY_SMALL_BYTES_MAX, ReplyBounds};

/// Default of [`NodeConfig::connections_max`].
pub const CONNECTIONS_MAX_DEFAULT: usize = 1024;

/// Default of [`NodeConfig::idle_timeout_ms`].
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 60_000;

/// Default of [`NodeConfig::write_timeout_ms`].
pub const WRITE_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Default of [`NodeConfig::frame_memory_bytes_max`]: 64 frames of the largest size at once.
pub const FRAME_MEMORY_BYTES_MAX_DEFAULT: usize = 64 << 20;

/// Default of [`NodeConfig::reply_memory_bytes_max`]: with the default content limit, about
/// 15,000 owed message replies, or 240 connections' full pipelines.
pub const REPLY_MEMORY_BYTES_MAX_DEFAULT: usize = 64 << 20;

/// Default of [`NodeConfig::connections_per_address_max`]: half of the default connection
/// limit, so at least two addresses are needed to fill the node, while the load generator can
/// still open 512 connections from one host.
pub const CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = 512;

/// Default of [`NodeConfig::frame_memory_reserved_bytes`]: two frame chunks, room for a frame
/// of the default largest content (4 KiB) plus its fields; 8 MiB of the default 64 MiB budget
/// at 1,024 connections.
pub const FRAME_MEMORY_RESERVED_BYTES_DEFAULT: usize = 2 * FRAME_CHUNK_BYTES;

/// Default of [`NodeConfig::reply_memory_reserved_bytes`]: 32 small replies, or three message
/// replies of the default largest content; 16 MiB of the default 64 MiB budget at 1,024
/// connections.
pub const REPLY_MEMORY_RESERVED_BYTES_DEFAULT: usize = 16 << 10;

/// Default of [`NodeConfig::hashing_threads`]: each holds 19 MiB of Argon2 memory once used and
/// one core while hashing (tens of milliseconds per registration).
pub const HASHING_THREADS_DEFAULT: usize = 2;

/// Default of [`NodeConfig::io_threads`]: the node's own work is small beside the database's
/// (about 2 µs of CPU per message at 32 × 64 in flight), and on one thread a request's
/// hand-offs (reader, database worker, the database connection's task, writer) wake no other
/// thread. Measured on 2 vCPUs against 2 threads, same binary, alternating: one request in
/// flight 36–40 µs less at p50 and 25–33 µs less node CPU per message; 32 × 64 in flight the
/// same or more (docs/benchmarks/mq.md, "The node's I/O threads").
pub const IO_THREADS_DEFAULT: usize = 1;

/// Default of [`NodeConfig::hashing_queue_max`]: about a second of hashing work for two
/// threads.
pub const HASHING_QUEUE_MAX_DEFAULT: usize = 64;

/// Default of [`NodeConfig::registration_window_ms`].
pub const REGISTRATION_WINDOW_MS_DEFAULT: u64 = 60_000;

/// Default of [`NodeConfig::registration_attempts_per_address_max`]: about 34 per second over
/// the window, below the two default hashing threads' rate, and room for the load generator,
/// which registers every connection it opens.
pub const REGISTRATION_ATTEMPTS_PER_ADDRESS_MAX_DEFAULT: usize = 2048;

/// Default of [`NodeConfig::accounts_per_address_max`]: the load generator creates one account
/// per connection and run, so a sweep up to 512 connections from one host fits in a window.
pub const ACCOUNTS_PER_ADDRESS_MAX_DEFAULT: usize = 1024;

/// A node's limits and switches; every field has a default and a `mq serve` flag.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Requests served concurrently (the handler pool).
    pub handler_slots: usize,
    /// Requests that may wait for a handler slot; past it the answer is `Busy`.
    pub wait_queue_max: usize,
    /// Database workers, each using one pooled connection at a time.
    pub db_workers: usize,
    /// Most requests committed in one transaction; 1 turns group commit off.
    pub batch_max: usize,
    /// Largest message content accepted.
    pub content_bytes_max: usize,
    /// Longest lease a client may ask for.
    pub lease_ms_max: u32,
    /// Connections served at once; a connection past it is answered `ConnectionLimit` and
    /// closed.
    pub connections_max: usize,
    /// A connection that completes no request frame for this long while no reply is owed to it
    /// is closed (also bounds a TLS handshake).
    pub idle_timeout_ms: u64,
    /// A reply the peer does not take (TCP window closed) within this closes its connection.
    pub write_timeout_ms: u64,
    /// Bytes all connections' frame buffers may hold together; a frame that would pass it is
    /// answered `Busy` and its connection closed.
    pub frame_memory_bytes_max: usize,
    /// Bytes all replies owed to clients (committed, not yet written) may hold together. A
    /// request whose largest possible reply does not fit is answered `Busy` before it reaches
    /// the database, so no message is dequeued whose reply could not be held.
    pub reply_memory_bytes_max: usize,
    /// Connections one source address (an IPv4 address, an IPv6 /64) may hold at once; past it
    /// `ConnectionLimit` and closed.
    pub connections_per_address_max: usize,
    /// Bytes of `frame_memory_bytes_max` set aside for each of `connections_max` connections,
    /// which other connections cannot take (see the `share` module).
    pub frame_memory_reserved_bytes: usize,
    /// Bytes of `reply_memory_bytes_max` set aside for each of `connections_max` connections,
    /// which other connections cannot take (see the `share` module).
    pub reply_memory_reserved_bytes: usize,
    /// Threads running the node's connections and database workers (tokio's worker threads).
    pub io_threads: usize,
    /// The one I/O thread polls its sockets instead of sleeping when it has nothing to do:
    /// a lone request and its database reply are read without waking the thread, at the cost
    /// of one CPU kept busy. Needs `io_threads` = 1 and 2 usable CPUs (docs/benchmarks/mq.md,
    /// "Busy polling").
    pub busy_poll: bool,
    /// Threads hashing registration secrets (Argon2id, 19 MiB each once used).
    pub hashing_threads: usize,
    /// Registrations that may wait for a hashing thread; past it `Busy`.
    pub hashing_queue_max: usize,
    /// The window of the per-address registration bounds, in milliseconds.
    pub registration_window_ms: u64,
    /// Registrations one source address may attempt per window; past it `Busy`, unhashed.
    pub registration_attempts_per_address_max: usize,
    /// Accounts (new names) one source address may create per window; past it a registration
    /// under a new name is `Busy` (known names still authenticate).
    pub accounts_per_address_max: usize,
    /// PostgreSQL's message table, made so when the node opens its store: `logged` (durable)
    /// or `unlogged` (no write-ahead log: a PostgreSQL crash empties the table; see
    /// docs/MQ_PROTOCOL.md, "Delivery guarantees"); unset leaves it as the database has it.
    /// SQLite stores refuse `unlogged`.
    pub message_table: Option<crate::store::MessageTable>,
}

impl Default for NodeConfig {
    fn default() -> NodeConfig {
        NodeConfig {
            // 32 connections' full pipelines ([`PIPELINE_DEPTH_MAX`] each): with 256, 32
            // pipelining clients were held to 256 requests in flight and 55–79K sends/s; with
            // 2048, 100–107K (docs/benchmarks/mq.md).
            handler_slots: 2048,
            wait_queue_max: 4096,
            db_workers: 4,
            batch_max: 1024,
            content_bytes_max: 4096,
            lease_ms_max: 3_600_000,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            idle_timeout_ms: IDLE_TIMEOUT_MS_DEFAULT,
            write_timeout_ms: WRITE_TIMEOUT_MS_DEFAULT,
            frame_memory_bytes_max: FRAME_MEMORY_BYTES_MAX_DEFAULT,
            reply_memory_bytes_max: REPLY_MEMORY_BYTES_MAX_DEFAULT,
            connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
            frame_memory_reserved_bytes: FRAME_MEMORY_RESERVED_BYTES_DEFAULT,
            reply_memory_reserved_bytes: REPLY_MEMORY_RESERVED_BYTES_DEFAULT,
            io_threads: IO_THREADS_DEFAULT,
            busy_poll: false,
            hashing_threads: HASHING_THREADS_DEFAULT,
            hashing_queue_max: HASHING_QUEUE_MAX_DEFAULT,
            registration_window_ms: REGISTRATION_WINDOW_MS_DEFAULT,
            registration_attempts_per_address_max: REGISTRATION_ATTEMPTS_PER_ADDRESS_MAX_DEFAULT,
            accounts_per_address_max: ACCOUNTS_PER_ADDRESS_MAX_DEFAULT,
            message_table: None,
        }
    }
}

impl NodeConfig {
    pub fn validate(&self) -> Result<(), crate::MqError> {
        let positive = [
            ("handler_slots", self.handler_slots),
            ("db_workers", self.db_workers),
            ("batch_max", self.batch_max),
            ("content_bytes_max", self.content_bytes_max),
            ("connections_max", self.connections_max),
            ("idle_timeout_ms", usize::try_from(self.idle_timeout_ms).unwrap_or(usize::MAX)),
            ("write_timeout_ms", usize::try_from(self.write_timeout_ms).unwrap_or(usize::MAX)),
            ("connections_per_address_max", self.connections_per_address_max),
            ("io_threads", self.io_threads),
            ("hashing_threads", self.hashing_threads),
            ("hashing_queue_max", self.hashing_queue_max),
            ("registration_window_ms", usize::try_from(self.registration_window_ms).unwrap_or(1)),
            ("registration_attempts_per_address_max", self.registration_attempts_per_address_max),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(crate::MqError::BadInput(format!("{name} must be > 0")));
            }
        }
        if self.busy_poll && self.io_threads != 1 {
            return Err(crate::MqError::BadInput(format!(
                "busy_poll needs io_threads = 1 (the thread that polls), got {}",
                self.io_threads
            )));
        }
        if self.content_bytes_max > crate::protocol::FRAME_BYTES_MAX / 2 {
            return Err(crate::MqError::BadInput(
                "content_bytes_max must be ≤ half the frame limit".into(),
            ));
        }
        self.validate_memory()
    }

    /// Each memory budget holds every connection's reserved part plus one smallest charge
    /// beyond it, and a reserved part holds a small frame or reply.
    fn validate_memory(&self) -> Result<(), crate::MqError> {
        let bad = |detail: String| Err(crate::MqError::BadInput(detail));
        let largest_reply = ReplyBounds::new(self.content_bytes_max).largest();
        let budgets = [
            (
                "frame",
                self.frame_memory_bytes_max,
                self.frame_memory_reserved_bytes,
                FRAME_CHUNK_BYTES,
            ),
            ("reply", self.reply_memory_bytes_max, self.reply_memory_reserved_bytes, largest_reply),
        ];
        for (what, max, reserved, beyond) in budgets {
            let least = self.connections_max.saturating_mul(reserved).saturating_add(beyond);
            if max < least {
                return bad(format!(
                    "{what}_memory_bytes_max must be ≥ {least} (connections_max × \
                     {what}_memory_reserved_bytes + {beyond})"
                ));
            }
        }
        if self.frame_memory_reserved_bytes < FRAME_CHUNK_BYTES {
            return bad(format!("frame_memory_reserved_bytes must be ≥ {FRAME_CHUNK_BYTES}"));
        }
        if self.reply_memory_reserved_bytes < REPLY_SMALL_BYTES_MAX {
            return bad(format!("reply_memory_reserved_bytes must be ≥ {REPLY_SMALL_BYTES_MAX}"));
        }
        Ok(())
    }

    pub(crate) fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }

    pub(crate) fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }

    pub(crate) fn registration_limits(&self) -> RegistrationLimits {
        RegistrationLimits {
            window: Duration::from_millis(self.registration_window_ms),
            attempts_max: self.registration_attempts_per_address_max,
            accounts_max: self.accounts_per_address_max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_limits_are_validated() {
        let bad = [
            NodeConfig { connections_max: 0, ..NodeConfig::default() },
            NodeConfig { idle_timeout_ms: 0, ..NodeConfig::default() },
            NodeConfig { write_timeout_ms: 0, ..NodeConfig::default() },
            NodeConfig { frame_memory_bytes_max: 100, ..NodeConfig::default() },
            NodeConfig { reply_memory_bytes_max: 4096, ..NodeConfig::default() },
            NodeConfig { connections_per_address_max: 0, ..NodeConfig::default() },
            NodeConfig { io_threads: 0, ..NodeConfig::default() },
            // Only the one I/O thread can poll.
            NodeConfig { busy_poll: true, io_threads: 2, ..NodeConfig::default() },
            NodeConfig { hashing_threads: 0, ..NodeConfig::default() },
            NodeConfig { hashing_queue_max: 0, ..NodeConfig::default() },
            NodeConfig { registration_window_ms: 0, ..NodeConfig::default() },
            NodeConfig { registration_attempts_per_address_max: 0, ..NodeConfig::default() },
            NodeConfig { frame_memory_reserved_bytes: 100, ..NodeConfig::default() },
            NodeConfig { reply_memory_reserved_bytes: 100, ..NodeConfig::default() },
            // Every connection's reserved part must fit, with room beyond it.
            NodeConfig { frame_memory_bytes_max: 8 << 20, ..NodeConfig::default() },
            NodeConfig { reply_memory_reserved_bytes: 64 << 10, ..NodeConfig::default() },
        ];
        for config in bad {
            assert!(config.validate().is_err(), "{config:?}");
        }
        NodeConfig::default().validate().unwrap();
    }
}
