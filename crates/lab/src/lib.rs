//! Statistics, load driving and reports shared by every leantier experiment.
//!
//! No other crate writes its own percentile, confidence-interval, load loop or report code:
//! they call this one, so every figure leantier prints is computed one way.
//!
//! * [`stats`]: HDR latency histograms in nanoseconds (percentiles up to the maximum,
//!   cumulative % within latency buckets, CDF points), the mean with a Student-t confidence
//!   interval, speedup, the Karp–Flatt serial fraction, Amdahl's and Gustafson's laws, the
//!   2^k·r factorial analysis and a universal-scalability-law fit.
//! * [`load`]: open-loop load with latency measured from each request's *intended* send
//!   time, so a stall in the system under test is charged to every request that was due
//!   during it (no coordinated omission); constant, Poisson, bursty and batch arrivals from a
//!   seeded schedule; sync and tokio drivers; a closed-loop driver for capacity at a given
//!   concurrency; and a step search for the highest rate that meets a latency limit.
//! * [`report`]: aligned terminal tables, a report folder of JSON, CSV, Markdown and
//!   hand-written SVG plots (latency CDFs, bars, x-y lines), and progress bars that hide
//!   themselves when stderr is not a terminal.
//! * [`ringbench`]: `leantier bench ring`, the ring against its peers in the same run.
//! * [`config`] and [`outcome`]: TOML configuration with flag overrides, and the mapping of
//!   errors to exit codes (bad input 2, missed target 3).
//!
//! Measurement code follows one rule: recording is cheap and thread-local (a histogram
//! increment), and everything else (merging, percentiles, formatting) happens after the run.

pub mod config;
pub mod load;
pub mod outcome;
pub mod report;
pub mod ringbench;
pub mod stats;
