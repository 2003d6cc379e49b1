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
//!   concurrency; and a search for the highest rate that meets a latency limit (bracketed
//!   from both sides of a start rate, then bisected).
//! * [`report`]: aligned terminal tables and a report folder of JSON, CSV, Markdown, `.hgrm`
//!   and SVG files; [`data`]: typed tables written as CSV and JSON, and `.hgrm` files;
//!   [`html`]: a self-contained HTML page. The plots and progress bars are the `experiments`
//!   crate's (`plot`, `progress`): the servers use this crate's histograms and compile neither
//!   a plotting library nor a terminal progress bar.
//! * [`disk`]: the raw append + `fdatasync` baseline that durable latencies compare with.
//! * [`config`]: TOML configuration with flag overrides; [`error::BadInput`] for invalid input.
//!
//! `lab` depends on no other leantier crate: every crate may use it, and it knows nothing of
//! rings, tiers or command lines.
//!
//! Measurement code follows one rule: recording is cheap and thread-local (a histogram
//! increment), and everything else (merging, percentiles, formatting) happens after the run.

pub mod child_flags;
pub mod config;
pub mod data;
pub mod disk;
pub mod error;
pub mod html;
pub mod load;
pub mod report;
pub mod stats;
