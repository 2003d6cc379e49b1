//! The experiments: the lab's runs of leantier's libraries (experiments, benchmarks and load
//! drivers), in one crate named for what it is. They live here, not in the libraries they
//! measure, so a library builds with its own few dependencies and carries no code that only
//! the `leantier` command and the tests call.
//!
//! - [`cluster`]: a loopback JetStream cluster of `nats-server` children (tests, soaks,
//!   benchmarks of the replicated tier).
//! - [`delivery_bench`]: R-Sender → NATS → delivery edge against a plain `async-nats` pair on the
//!   same server in the same run.
//! - [`delivery_experiment`]: the published delivery experiment (runs 1–7), in-process and over
//!   NATS, measured at the outlets and at the delivery edges.
//! - [`demo`]: `leantier demo`, `exchange serve` in-process on loopback driven by open-loop
//!   native sessions: three latency views per rate and the max-rate searches.
//! - [`exchange_experiments`]: the tier's experiments (the demo's rates and maximum-rate
//!   search, placement, R-Senders, journal modes, layouts).
//! - [`journal_bench`]: `journal bench`, the journal writer's throughput and durable-reply
//!   latency per policy beside the raw append + `fdatasync` baseline.
//! - [`mq_load`], [`mq_bench`] and [`mq_experiment`]: the message queue's closed-loop load
//!   generator (response time split into client, queue-wait, database and middleware parts,
//!   counts and operational laws checked), the same-run comparisons against plain SQL and pgmq,
//!   and the standard experiments (clients, scale-up vs scale-out, size, 2^2·r factorial).
//! - [`order_entry_load`]: `exchange load`, the order-entry client's open-loop load over the
//!   native protocol or FIX 4.4 against `exchange serve`.
//! - [`order_entry_runs`]: `exchange load`'s runs: each rate in turn against each target, or
//!   each target's highest rate searched side by side; the table and report folder.
//! - [`ringbench`]: `pipeline`'s ring measured against rtrb, crossbeam, disruptor, std mpsc
//!   and the blocking baseline in the same run, and the open-loop generator alone
//!   ([`ringbench::loadgen`]).
//! - [`tier_load`]: the tier driven open-loop by its load generator (an ordinary order source
//!   of the tier when the layout runs the entry inline), with the scenario's external events
//!   and master-data updates: `exchange run`, the demo's and the experiments' runs.
//! - [`load`]: load driving beyond `stats::open_loop`'s schedule: the async open-loop and the
//!   closed-loop drivers, the maximum-rate search, the generator's thread priority.
//! - [`statistics`]: what only experiments compute (Student-t confidence intervals, speedup,
//!   Karp–Flatt, Amdahl/Gustafson, 2^k·r factorial analysis, USL fits); the servers'
//!   histograms and the median are the `stats` crate's.
//! - [`report`], [`data`], [`html`]: aligned terminal tables and report folders (JSON, CSV,
//!   Markdown, `.hgrm`, SVG), typed data tables with units in their column names, a
//!   self-contained HTML page; [`plot`] and [`progress`]: SVG plots and progress bars;
//!   [`disk`]: the raw append + `fdatasync` baseline of durable latencies.
//! - [`reproduce`]: `leantier reproduce`, the five papers' experiments beside their published
//!   figures (`data/published.toml`, embedded), a verdict per claim, one `index.html`.
//! - [`web_lab`]: `web load`, `web matrix` and `web ratio`: cells and interleaved matrix rounds
//!   with the Python baselines, medians, target checks, tables and the report folder.
//! - [`web_load`]: the load driver of `web load` and `web matrix` (one cell of HTTP load at a
//!   server, closed or open loop, the answers checked).
//!
//! Each function returns its library's typed error (`exchange::ExchangeError`, ...) and typed
//! results; `leantier` prints them and writes the report folders.

pub mod cluster;
pub mod data;
pub mod delivery_bench;
pub mod delivery_experiment;
pub mod demo;
pub mod disk;
pub mod exchange_experiments;
pub mod html;
pub mod journal_bench;
pub mod load;
pub mod mq_bench;
pub mod mq_budget;
pub mod mq_experiment;
pub mod mq_load;
pub mod order_entry_load;
pub mod order_entry_runs;
pub mod plot;
pub mod progress;
pub mod report;
pub mod reproduce;
pub mod ringbench;
pub mod statistics;
pub mod tier_load;
pub mod web_lab;
pub mod web_load;
