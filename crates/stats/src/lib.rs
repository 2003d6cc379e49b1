//! What the servers measure with: latency histograms and the arrival schedules they are
//! driven by, and nothing else.
//!
//! * [`histogram`]: HDR latency histograms in nanoseconds (percentiles up to the maximum, the
//!   standard summary, cumulative % within latency buckets, CDF points) and the median of a few
//!   values. The servers record into them on their hot paths (one array increment) and report
//!   them in their metrics; every figure leantier prints about latency comes from them.
//! * [`open_loop`]: seeded arrival processes (constant, Poisson, bursty, batch), the intended
//!   send times they give, and the sync open-loop driver with its [`Pacer`] (the tier's
//!   start-up calibration burst and the cdr pipeline's arrivals).
//! * [`BadInput`]: invalid input to either (exit 2 in the command line).
//!
//! The crate is deliberately slim: no report formats, plots, progress bars, async runtime or
//! load drivers (those are the `experiments` crate's), so a server that records a histogram
//! compiles only `hdrhistogram`, `rand` and `serde` for it. It depends on no leantier crate.
//!
//! Recording is cheap and thread-local (a histogram increment); merging, percentiles and
//! formatting happen after the run.

pub mod error;
pub mod histogram;
pub mod open_loop;
mod pacer;

pub use error::BadInput;
pub use histogram::{
    CumulativeBucket, LatencyHistogram, LatencySummary, PercentileValue, STANDARD_PERCENTILES,
    median,
};
pub use pacer::Pacer;
