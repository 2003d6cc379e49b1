//! R-Sender → NATS → delivery edge against plain `async-nats` on the same server in the same run.
//!
//! leantier's path: one R-Sender's subscriber (ring push) → its publisher thread (sequence,
//! retained window, one NATS message per drained batch) → `nats-server` → a delivery edge (gap
//! check, fan-out). The peers move the same records with a bare client and a bare
//! subscription and no sequencing or recovery: `plain-batched` packs them into messages of the
//! size leantier's publisher produced in that repeat (same messages, same bytes), and
//! `plain-per-record` sends one message per record (the common way to use NATS). Throughput is
//! records over the time from the first send to the last receipt; latency from each record's
//! send to its receipt (absolute monotonic time). Repeats alternate the three, and medians
//! are reported.
//!
//! Each contender's budget comes with it: this process's CPU time and context switches per
//! record during its repeats (`getrusage`; `nats-server`, shared by all three, is not in it).
//! The contenders' threads have names of their own, so `perf record -g` over a run splits the
//! time per thread: leantier's `bench-sender`, `nats-pub-0`, `nats-publisher-io` and
//! `bench-edge`; the plain pairs' calling thread and `bench-plain`.

use std::time::{Duration, Instant};

use exchange::msg::{Audience, CoreOutput, Response};
use exchange::tier::WaitChoice;
use futures_util::StreamExt;
use pipeline::metrics::now_ns;
use stats::{LatencyHistogram, LatencySummary, median};

use delivery::clock::monotonic_ns;
use delivery::edge::{EdgeOptions, start as start_edge};
use delivery::nats::{NatsConnect, client_options};
use delivery::publish::{NatsPublisher, PublishOptions};
use delivery::wire::{BATCH_HEADER_BYTES, RECORD_BYTES, Record};
use delivery::{DeliveryError, Result, io_failed, nats_failed};

/// The target: leantier's throughput at least this fraction of the plain batched pair's.
pub const TARGET_THROUGHPUT_RATIO: f64 = 0.8;
/// Threads of leantier's path: the sender, its publisher, two publisher-runtime threads, two
/// edge-runtime threads.
const BENCH_THREADS: usize = 6;
/// Messages of room beyond the record count in the plain subscriber's queue.
const SUBSCRIPTION_SLACK_MESSAGES: usize = 1024;
/// How long one repeat may take before it fails.
pub const REPEAT_TIMEOUT: Duration = Duration::from_secs(60);

/// One contender's medians.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Contender {
    pub name: &'static str,
    /// Median over repeats of records per second.
    pub throughput_per_s: f64,
    pub throughputs_per_s: Vec<f64>,
    /// Median over repeats of this process's CPU time (user + system, all threads) per record.
    pub cpu_ns_per_record: f64,
    /// Median over repeats of this process's context switches (voluntary and not) per record.
    pub context_switches_per_record: f64,
    /// Send -> receipt, all repeats merged.
    pub latency: LatencySummary,
}

/// The benchmark's result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchReport {
    pub records: u64,
    pub repeats: usize,
    pub wait: WaitChoice,
    pub leantier: Contender,
    pub plain_batched: Contender,
    pub plain_per_record: Contender,
    /// Records per NATS message leantier's publisher produced (mean over repeats).
    pub records_per_message: f64,
    /// leantier throughput / plain batched throughput (medians).
    pub ratio_batched: f64,
    pub ratio_per_record: f64,
}

struct Sample {
    throughput_per_s: f64,
    latency: LatencyHistogram,
    usage: Usage,
}

/// What this process spent over an interval, per record.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    cpu_ns_per_record: f64,
    context_switches_per_record: f64,
}

/// This process's CPU time (user + system, ns) and context switches so far.
fn process_usage() -> (u64, u64) {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is valid, writable memory for one `rusage` for the call's duration;
    // RUSAGE_SELF is always a valid target, and the call only writes `usage`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    assert_eq!(rc, 0, "getrusage(RUSAGE_SELF) cannot fail with valid arguments");
    // SAFETY: zero-initialised and filled by the successful call above.
    let usage = unsafe { usage.assume_init() };
    let ns = |time: libc::timeval| time.tv_sec as u64 * 1_000_000_000 + time.tv_usec as u64 * 1000;
    let switches = usage.ru_nvcsw as u64 + usage.ru_nivcsw as u64;
    (ns(usage.ru_utime) + ns(usage.ru_stime), switches)
}

/// Measures [`process_usage`] from its creation to [`UsageSpan::per_record`].
struct UsageSpan((u64, u64));

impl UsageSpan {
    fn start() -> UsageSpan {
        UsageSpan(process_usage())
    }

    fn per_record(&self, records: u64) -> Usage {
        let ((cpu_before, switches_before), (cpu, switches)) = (self.0, process_usage());
        Usage {
            cpu_ns_per_record: cpu.saturating_sub(cpu_before) as f64 / records as f64,
            context_switches_per_record: switches.saturating_sub(switches_before) as f64
                / records as f64,
        }
    }
}

/// Runs `repeats` rounds of `records` records each on the server `nats`; `wait` is how the
/// sender and its publisher thread wait on their ring (`auto`: the tier's rule).
pub fn run(
    nats: &NatsConnect,
    records: u64,
    repeats: usize,
    wait: WaitChoice,
) -> Result<BenchReport> {
    if records == 0 || repeats == 0 {
        return Err(DeliveryError::BadInput("records and repeats must be > 0".into()));
    }
    let io = bench_runtime("bench-plain")?;
    let edge_io = bench_runtime("bench-edge")?;
    let mut samples: [Vec<Sample>; 3] = Default::default();
    let mut per_message = Vec::new();
    for repeat in 0..repeats {
        let prefix = format!("bench{repeat}");
        let (sample, batch) = leantier_once(&edge_io, nats, &prefix, records, wait)?;
        samples[0].push(sample);
        per_message.push(batch);
        let batch_records = batch.round().max(1.0) as u64;
        samples[1].push(io.block_on(plain_once(nats, &prefix, records, batch_records))?);
        samples[2].push(io.block_on(plain_once(nats, &prefix, records, 1))?);
    }
    let [ours, batched, single] = samples;
    let leantier = contender("leantier", ours);
    let plain_batched = contender("plain-batched", batched);
    let plain_per_record = contender("plain-per-record", single);
    Ok(BenchReport {
        records,
        repeats,
        wait,
        ratio_batched: leantier.throughput_per_s / plain_batched.throughput_per_s,
        ratio_per_record: leantier.throughput_per_s / plain_per_record.throughput_per_s,
        records_per_message: per_message.iter().sum::<f64>() / per_message.len() as f64,
        leantier,
        plain_batched,
        plain_per_record,
    })
}

/// A two-worker runtime whose threads are called `name` (for `perf report --sort comm`).
fn bench_runtime(name: &str) -> Result<tokio::runtime::Runtime> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build();
    runtime.map_err(io_failed("starting the bench's runtime"))
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn contender(name: &'static str, samples: Vec<Sample>) -> Contender {
    let mut latency = LatencyHistogram::new();
    for sample in &samples {
        latency.merge(&sample.latency);
    }
    let throughputs_per_s: Vec<f64> = samples.iter().map(|s| s.throughput_per_s).collect();
    let cpu = samples.iter().map(|s| s.usage.cpu_ns_per_record).collect();
    let switches = samples.iter().map(|s| s.usage.context_switches_per_record).collect();
    Contender {
        name,
        throughput_per_s: median(throughputs_per_s.clone()),
        throughputs_per_s,
        cpu_ns_per_record: median(cpu),
        context_switches_per_record: median(switches),
        latency: latency.summary(),
    }
}

/// One round through leantier's publisher and delivery edge; also returns records per message.
fn leantier_once(
    io: &tokio::runtime::Runtime,
    nats: &NatsConnect,
    prefix: &str,
    records: u64,
    wait: WaitChoice,
) -> Result<(Sample, f64)> {
    let mut options = EdgeOptions::new("", 0, std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    options.nats = nats.clone();
    options.prefix = prefix.to_string();
    let edge = io.block_on(start_edge(options))?;
    let publisher = NatsPublisher::connect(PublishOptions {
        nats: nats.clone(),
        prefix: prefix.to_string(),
        outlets: 1,
        retain_records: delivery::publish::RETAIN_RECORDS_DEFAULT,
        // `auto` as in the tier: spin only when the sender, the publisher and the client's
        // and edge's threads each have a CPU; on a smaller host a spinner steals the CPU
        // its peer needs.
        wait: wait.strategy(BENCH_THREADS, cpus()),
        heartbeat: delivery::publish::HEARTBEAT_INTERVAL_DEFAULT,
    })?;
    let mut subscribers = (publisher.subscribers())(0);
    let usage = UsageSpan::start();
    let started = Instant::now();
    let sender = std::thread::Builder::new().name("bench-sender".into()).spawn(move || {
        for order_id in 0..records {
            let output = CoreOutput { order_id, ..CoreOutput::default() };
            let mut response =
                Response { audience: Audience::Client, outlet: 0, answers_request: true, output };
            response.output.stamps.intended_ns = now_ns();
            subscribers[0].deliver(&response);
        }
    });
    let sender = sender.map_err(io_failed("spawning the bench's sender"))?;
    sender.join().map_err(|_| DeliveryError::Failed("the bench's sender panicked".into()))?;
    let report = publisher.drain()?;
    let deadline = started + REPEAT_TIMEOUT;
    while edge.report().next_seqs[0] <= records {
        if Instant::now() >= deadline {
            return Err(DeliveryError::Failed("the edge did not receive every record".into()));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let usage = usage.per_record(records);
    let (_, latency) = io.block_on(edge.shutdown())?;
    let latency = latency.answers;
    let per_message = report.published as f64 / report.batches.max(1) as f64;
    Ok((Sample { throughput_per_s: records as f64 / elapsed, latency, usage }, per_message))
}

/// One round of a bare publisher and subscriber, `batch` records per message.
async fn plain_once(nats: &NatsConnect, prefix: &str, records: u64, batch: u64) -> Result<Sample> {
    let url = nats.url.as_str();
    let subject = format!("{prefix}.plain.{batch}");
    // Room for every record client-side: the peer must not lose messages to its own queue.
    let capacity = records as usize + SUBSCRIPTION_SLACK_MESSAGES;
    let subscriber_client = client_options(nats).await?.subscription_capacity(capacity);
    let subscriber_client =
        subscriber_client.connect(url).await.map_err(nats_failed("connecting the subscriber"))?;
    let subscription = subscriber_client.subscribe(subject.clone()).await;
    let mut subscription = subscription.map_err(nats_failed("subscribing"))?;
    subscriber_client.flush().await.map_err(nats_failed("flushing the subscription"))?;
    let publisher = client_options(nats).await?.connect(url).await;
    let publisher = publisher.map_err(nats_failed("connecting the publisher"))?;
    let receiving = tokio::spawn(async move {
        let mut latency = LatencyHistogram::new();
        let mut received = 0u64;
        while received < records {
            let Some(message) = subscription.next().await else { break };
            let now = monotonic_ns();
            for chunk in message.payload[BATCH_HEADER_BYTES..].chunks_exact(RECORD_BYTES) {
                let record = Record(chunk.try_into().expect("whole records"));
                latency.record_ns(now.saturating_sub(record.intended_abs_ns()));
                received += 1;
            }
        }
        (received, latency)
    });
    let usage = UsageSpan::start();
    let started = Instant::now();
    let mut sent = 0;
    while sent < records {
        let count = batch.min(records - sent);
        let mut payload = Vec::with_capacity(BATCH_HEADER_BYTES + count as usize * RECORD_BYTES);
        payload.resize(BATCH_HEADER_BYTES, 0);
        for _ in 0..count {
            let now = monotonic_ns();
            let response = Response::default();
            payload.extend_from_slice(&Record::encode(&response, now, now).0);
        }
        let published = publisher.publish(subject.clone(), payload.into()).await;
        published.map_err(nats_failed("publishing"))?;
        sent += count;
    }
    publisher.flush().await.map_err(nats_failed("flushing the publisher"))?;
    let stalled = || format!("the plain subscriber ({batch} per message) stalled");
    let (received, latency) = tokio::time::timeout(REPEAT_TIMEOUT, receiving)
        .await
        .map_err(|_| DeliveryError::Failed(stalled()))??;
    if received != records {
        let why = format!("the plain subscriber got {received} of {records}");
        return Err(DeliveryError::Failed(why));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let usage = usage.per_record(records);
    Ok(Sample { throughput_per_s: records as f64 / elapsed, latency, usage })
}
