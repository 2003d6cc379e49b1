//! A REST service that multiplies integer matrices under selectable execution models, and the
//! load lab that shows which model wins at which request size and load.
//!
//! **The service.** `POST /matrix` takes the published JSON (`requestId`, `matrixOne`,
//! `matrixTwo`, each `{"columnCount": n, "rows": [{"value": "1,2,3"}, ...]}`) and answers
//! `{"requestId": "<id>", "rows": [[...], ...]}` or `{"requestId": ..., "errorCode": "0NN",
//! "errorMessage": ...}`. [`api`] parses and validates in an order that refuses every bad
//! request before the work it would cause (size limits before any matrix-sized allocation); the
//! codes and their HTTP statuses are listed there and in `docs/WEB_API.md`. [`kernel`]
//! multiplies with exact integer arithmetic: a magnitude bound proves most requests cannot
//! overflow and takes a vectorised blocked i-k-j loop (in `i32` lanes when the bound allows, as
//! for the study's cells); the rest accumulate in `i128` and an overflowing result is refused
//! with code 008, never wrapped. Cells are scanned from the body in one pass (8 bytes at a time
//! for short numbers) and the answer is written with a two-digits-per-step formatter into one
//! pre-sized buffer: parsing and rendering, not multiplying, dominate a request's CPU time.
//!
//! **Execution models.** The tokio reactor ([`server`]) only moves bytes; the CPU work of a request
//! (parse, validate, multiply, render) runs where the model says ([`exec`]): one worker (`single`),
//! a rayon pool splitting each request's rows (`pool`), one pinned worker per core taking whole
//! requests (`pinned`), N pinned processes sharing the port with SO_REUSEPORT ([`prefork`]), or per
//! request by size (`adaptive`). `adaptive` splits a request over a pinned pool spanning all cores
//! only while they idle and only from the split size measured at start-up on the host
//! (`exec::Calibration`). Otherwise it runs a medium body (above 32 KiB, up to 256 KiB) inline on
//! the reactor thread that read it (no thread switch, same core), and hands the others to the pool:
//! small requests are many, and the pool spreads them over the cores; a large one keeps the reactor
//! free to read while it computes. The decision per request compares its body size with these sizes
//! and the requests in flight with the workers. That is the shared layout, one process;
//! `--adaptive-layout per-core` runs one pinned process per core instead, its parent dealing the
//! connections in turn ([`deal`]), each process running bodies up to 256 KiB that will not split
//! inline on its reactor and the others on a worker on its core. Every model has a named admission
//! bound and answers 503 with code 009 past it. Whatever the model, connections are served by one
//! accept loop per process ([`conn`]: connection limits in all and per address, the longest-idle
//! connection closed to admit a new one, idle, write progress, header and body timeouts) and
//! requests are admitted by their work ([`admission`]): their body's bytes before they are read,
//! then their product and answer before they are multiplied, held until the answer is written,
//! so large requests wait in their own lane while small ones are answered, and answers that are
//! never read stay within the bound. All in-process models (`adaptive` included) are
//! served side by side on `/matrix/<model>` so one run compares them under identical conditions.
//!
//! **Load lab.** The load driver (`experiments::web_load`, outside this library) drives one cell or the whole {model} × {users} × {complexity}
//! matrix ([`workload`] defines the study's levels: A rows×50 · B 50×20 with 30, 600, 1000 and
//! 2000 rows) using the lab's load drivers (closed-loop users; open loop with latency from the
//! intended send time), HDR histograms, tables, report folder and SVG plots.
//! The Python baselines (`bench/web-python`) are started by `scripts/bench-web` and measured in
//! the same run.

pub mod admission;
pub mod api;
pub mod client;
pub mod conn;
pub(crate) mod deal;
mod error;
pub mod exec;
pub mod fleet;
pub mod kernel;
pub mod prefork;
pub mod serve;
pub mod server;
pub mod workload;

pub use error::{HttpCause, Result, WebError};
