//! What an operator needs from every leantier server, in one place so that `exchange serve`,
//! `exchange edge`, `mq serve` and `web serve` answer alike (docs/OPERATIONS.md):
//!
//! - [`endpoint`]: the HTTP admin endpoint. `GET /metrics` (Prometheus text, version 0.0.4),
//!   `GET /health` (the process answers), `GET /ready` (the server recovered and reached what
//!   it depends on, and is not stopping), 404 elsewhere. It runs on a thread of its own, so a
//!   scrape renders off every server's critical threads; servers whose own protocol is HTTP
//!   answer the same three paths on their port through [`endpoint::Endpoint::answer`].
//! - [`process`]: the `process_*` metrics read from `/proc/self` at scrape time (resident
//!   memory, CPU seconds, open descriptors, threads, start time).
//! - [`histogram`]: a latency histogram with fixed buckets that the hot path records into
//!   with two relaxed atomic additions (no lock), encoded as a Prometheus histogram.
//! - [`merge`]: the pages of several processes joined into one, each sample labelled with
//!   its process, for a supervisor that shows the processes it runs on one listener.
//! - [`read`]: counters and gauges read at scrape time from a server's own atomics, so a
//!   server keeps the counters it has and the registry only looks at them.
//! - [`lock`]: one owner per store: the advisory lock a server or run takes on the data
//!   directory it writes, naming its holder to a second process, which is refused.
//! - [`stop`]: the stop signals (SIGTERM, SIGINT) and [`stop::DRAIN_TIMEOUT`], the bound every
//!   server's drain keeps.
//! - [`config`]: TOML configuration files whose fields flags override, and flag values read
//!   as a config's enums; [`child_flags`]: the `--name value` flags of the helper processes
//!   tests start (crash children, `mq-node`), so those read their flags one way.
//! - [`tls`]: TLS configurations from PEM files (certificate, key, the CA of clients or of the
//!   server), every refusal naming its file and reason.
//!
//! Metrics go through `prometheus-client` (its registry and text encoder); this crate depends
//! on no leantier crate, so every server crate may use it.

pub mod child_flags;
pub mod config;
pub mod endpoint;
mod error;
pub mod histogram;
pub mod lock;
pub mod merge;
pub mod process;
pub mod read;
pub mod stop;
pub mod timeout;
pub mod tls;

pub use endpoint::{Endpoint, Readiness};
pub use error::{OpsError, error_chain};
pub use histogram::BucketHistogram;
pub use lock::StoreLock;
pub use prometheus_client::registry::Registry;
pub use timeout::Timeout;
