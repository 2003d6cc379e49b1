//! What `exchange serve --metrics-listen` serves, in the Prometheus text format: the sessions'
//! counters (orders in, reports out, rejects by reason, throttled, busy, cut off, logons,
//! garbled), summed over all clients unless `metrics_per_client` asks for a series per client
//! id (the page then names every client and grows with the credentials file), per
//! stage (requests into the tier and reports out of it, the reply rings' depth, the store's
//! commits), latency histograms with buckets measured inside the server (the matching core's
//! service time per request, and the time from a request's arrival to its report being queued
//! for the client's socket: the whole tier, journal and store sync included), and the
//! `process_*` metrics (`ops::process`).
//!
//! Everything is recorded on the thread that owns it (counters live in the hub, on the I/O
//! thread; the tier only stamps times into the messages it already carries; the histograms
//! are `ops::BucketHistogram`s, relaxed atomic additions), so a scrape takes no lock and the
//! hot path pays a clock read and a few atomic increments per message.

use std::fmt::Write as _;
use std::sync::Arc;

use exchange::msg::CoreOutput;
use stats::LatencyHistogram;

/// Reason codes counted per client (tier codes and the gateway's, see
/// [`crate::native::gateway_reason`]).
pub const REASON_CODES: usize = 256;

/// Per-client counters (the metrics listener prints them).
pub struct Counters {
    pub orders_in: u64,
    pub reports_out: u64,
    pub rejects: [u64; REASON_CODES],
    pub throttled: u64,
    pub busy: u64,
    pub cut_off: u64,
    pub logons: u64,
    /// FIX messages ignored as garbled (bad BodyLength, CheckSum or BeginString).
    pub garbled: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            orders_in: 0,
            reports_out: 0,
            rejects: [0; REASON_CODES],
            throttled: 0,
            busy: 0,
            cut_off: 0,
            logons: 0,
            garbled: 0,
        }
    }
}

/// The stages' counters and the latency histograms.
pub struct StageMetrics {
    /// Requests handed to the tier.
    pub engine_in: u64,
    /// Reports taken off the tier's reply rings.
    pub engine_out: u64,
    /// Reports waiting on the reply rings at the last routing batch.
    pub egress_depth: usize,
    /// Arrival of a request at the gateway → its report queued for the client.
    pub order_to_report: ops::BucketHistogram,
    /// The matching core's service time: request taken off its ring → report ready.
    pub engine_service: ops::BucketHistogram,
    /// The tier's thread layout (set once at start).
    pub layout: Option<LayoutInfo>,
    /// A gateway without a tier: appends given up unacknowledged that the input log holds.
    pub appends_landed_late: u64,
    /// Orders of appends given up unacknowledged that the input log does not hold (answered
    /// with a `NotLogged` reject).
    pub orders_not_logged: u64,
    /// Orders of appends given up unacknowledged that the input log can no longer tell about
    /// (no answer).
    pub orders_unresolved: u64,
    /// Arrival of a request at the gateway → the tier's answer to it (accepted, rejected,
    /// replaced, cancelled) reaching the router that hands it to the session: the in-tier
    /// response, the published lean tier's scope (no store or journal fsync in it). Taken
    /// by the demo ([`crate::server::Running::take_in_tier_latency`]).
    pub in_tier: LatencyHistogram,
    /// The histograms above and the process metrics, encoded by `prometheus-client`.
    registry: Arc<ops::Registry>,
}

impl Default for StageMetrics {
    fn default() -> StageMetrics {
        let order_to_report = ops::BucketHistogram::default();
        // The core's service time is ~200 ns: buckets from 100 ns, not 10 µs (issue 45).
        let engine_service = ops::BucketHistogram::service_times();
        let mut registry = ops::Registry::default();
        registry.register(
            "gateway_order_to_report_seconds",
            "request arrival at the gateway to its report queued for the client",
            ops::BucketHistogram::clone(&order_to_report),
        );
        registry.register(
            "gateway_engine_service_seconds",
            "matching core service time per request (journal hand-off, matching)",
            ops::BucketHistogram::clone(&engine_service),
        );
        registry.register_collector(Box::new(ops::process::ProcessCollector));
        StageMetrics {
            engine_in: 0,
            engine_out: 0,
            egress_depth: 0,
            order_to_report,
            engine_service,
            layout: None,
            appends_landed_late: 0,
            orders_not_logged: 0,
            orders_unresolved: 0,
            in_tier: LatencyHistogram::default(),
            registry: Arc::new(registry),
        }
    }
}

/// The tier's thread layout as the metrics show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutInfo {
    /// The thread groups, e.g. `preprocess+core+rprocess+sender:spin events+masterdata:park`.
    pub groups: String,
    /// CPUs the layout was planned on (affinity mask, capped by the cgroup quota).
    pub usable_cpus: usize,
}

impl StageMetrics {
    /// Records a report's latencies from the stamps it carries.
    pub fn on_report(&mut self, output: &CoreOutput, now_ns: u64) {
        self.engine_out += 1;
        let stamps = &output.stamps;
        if stamps.intended_ns != 0 {
            let in_tier_ns = now_ns.saturating_sub(stamps.intended_ns);
            self.order_to_report.record_ns(in_tier_ns);
            if output.answers_request() {
                self.in_tier.record_ns(in_tier_ns);
            }
        }
        if stamps.core_in_ns != 0 && stamps.ready_ns >= stamps.core_in_ns {
            self.engine_service.record_ns(stamps.ready_ns - stamps.core_in_ns);
        }
    }
}

/// Reads one counter of a client.
type CounterOf = fn(&Counters) -> u64;

/// The session counters the page shows, by name, help and how to read each.
const SESSION_COUNTERS: [(&str, &str, CounterOf); 7] = [
    ("gateway_orders_in_total", "order messages received", |c| c.orders_in),
    ("gateway_reports_out_total", "execution reports routed", |c| c.reports_out),
    ("gateway_throttled_total", "orders rejected by the session throttle", |c| c.throttled),
    ("gateway_busy_total", "orders rejected because the ingress ring was full", |c| c.busy),
    ("gateway_cut_off_total", "sessions cut off (slow consumer, throttle breach)", |c| c.cut_off),
    ("gateway_logons_total", "successful logons", |c| c.logons),
    ("gateway_garbled_total", "FIX messages ignored as garbled", |c| c.garbled),
];

/// One client's counters (or the sum over all clients, `client: None`), copied.
struct ClientCounts {
    client: Option<u32>,
    values: [u64; SESSION_COUNTERS.len()],
    rejects: [u64; REASON_CODES],
}

impl ClientCounts {
    fn zero(client: Option<u32>) -> ClientCounts {
        ClientCounts { client, values: [0; SESSION_COUNTERS.len()], rejects: [0; REASON_CODES] }
    }

    fn add(&mut self, counters: &Counters) {
        for (value, (_, _, read)) in self.values.iter_mut().zip(SESSION_COUNTERS) {
            *value += read(counters);
        }
        for (total, count) in self.rejects.iter_mut().zip(&counters.rejects) {
            *total += count;
        }
    }
}

/// What the page shows, copied off the hub on the I/O thread (a copy of the counters, no
/// formatting) and rendered on the admin endpoint's thread (`crate::admin`).
pub struct Snapshot {
    clients: Vec<ClientCounts>,
    stage: [(&'static str, &'static str, u64); 9],
    egress_depth: usize,
    store_failed: bool,
    store_damaged_bytes: u64,
    store_writes_refused: u64,
    layout: Option<LayoutInfo>,
    /// The histograms (atomics, read when rendered) and the process metrics.
    registry: Arc<ops::Registry>,
}

/// What the store counted, copied into a [`Snapshot`] by the hub that owns the store.
pub struct StoreCounts {
    /// Batches written (one write, one `fdatasync` each).
    pub commits: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Reports dropped after a restart because they were routed before it.
    pub already_routed: u64,
    /// Whether a write or sync failed (output is held from then on).
    pub failed: bool,
    /// Bytes of damaged records recovery skipped before the synced end at start.
    pub damaged_bytes: u64,
    /// Batch writes refused for a full disk (each tried again at the next commit).
    pub writes_refused: u64,
}

impl Snapshot {
    /// Copies what the page shows: each client's counters (`clients`: id and counters), per
    /// client when `per_client` ([`crate::Settings::metrics_per_client`]), else one sum over
    /// every client; the stages' counters, the reports no client was found for and the
    /// store's counts. The hub builds it (`Hub::metrics_snapshot`) on the I/O thread.
    pub fn new<'a>(
        clients: impl Iterator<Item = (u32, &'a Counters)>,
        per_client: bool,
        stage: &StageMetrics,
        unroutable: u64,
        store: StoreCounts,
    ) -> Snapshot {
        let clients = if per_client {
            let copy = |(client, counters): (u32, &Counters)| {
                let mut counts = ClientCounts::zero(Some(client));
                counts.add(counters);
                counts
            };
            clients.map(copy).collect()
        } else {
            let mut total = ClientCounts::zero(None);
            clients.for_each(|(_, counters)| total.add(counters));
            vec![total]
        };
        Snapshot {
            clients,
            stage: stage_counters(stage, unroutable, &store),
            egress_depth: stage.egress_depth,
            store_failed: store.failed,
            store_damaged_bytes: store.damaged_bytes,
            store_writes_refused: store.writes_refused,
            layout: stage.layout.clone(),
            registry: Arc::clone(&stage.registry),
        }
    }
}

/// The per-stage counters the page shows, by name and help.
fn stage_counters(
    stage: &StageMetrics,
    unroutable: u64,
    store: &StoreCounts,
) -> [(&'static str, &'static str, u64); 9] {
    [
        ("gateway_engine_in_total", "requests handed to the tier", stage.engine_in),
        ("gateway_engine_out_total", "reports taken off the tier's reply rings", stage.engine_out),
        ("gateway_unroutable_total", "reports for a client id not in the credentials", unroutable),
        (
            "gateway_store_commits_total",
            "store batches written (one write, one fdatasync each)",
            store.commits,
        ),
        ("gateway_store_bytes_total", "bytes written to the store", store.bytes_written),
        (
            "gateway_reports_already_routed_total",
            "reports dropped after a restart: routed before it (a gateway without a tier)",
            store.already_routed,
        ),
        (
            "gateway_appends_landed_late_total",
            "appends given up unacknowledged that the input log holds (the engines answer)",
            stage.appends_landed_late,
        ),
        (
            "gateway_orders_not_logged_total",
            "orders of appends given up unacknowledged that the input log does not hold \
             (answered with a NotLogged reject)",
            stage.orders_not_logged,
        ),
        (
            "gateway_orders_unresolved_total",
            "orders of appends given up unacknowledged the input log cannot tell about",
            stage.orders_unresolved,
        ),
    ]
}

/// The page of `snapshot` in the Prometheus text format.
pub(crate) fn render(snapshot: &Snapshot) -> String {
    let mut text = String::new();
    per_session(&mut text, snapshot);
    per_stage(&mut text, snapshot);
    if let Some(layout) = &snapshot.layout {
        layout_info(&mut text, layout);
    }
    text
}

/// The tier's layout as an info metric (value 1, the thread groups in a label) and the
/// usable CPUs it was planned on.
fn layout_info(text: &mut String, layout: &LayoutInfo) {
    let _ = writeln!(
        text,
        "# HELP gateway_layout_info the tier's thread groups (stages:wait)\n\
         # TYPE gateway_layout_info gauge\n\
         gateway_layout_info{{groups=\"{}\"}} 1\n\
         # HELP gateway_usable_cpus CPUs the layout was planned on (affinity, capped by quota)\n\
         # TYPE gateway_usable_cpus gauge\ngateway_usable_cpus {}",
        layout.groups, layout.usable_cpus
    );
}

/// The session counters: one series per client, or one sum (no client label).
fn per_session(text: &mut String, snapshot: &Snapshot) {
    for (index, (name, help, _)) in SESSION_COUNTERS.iter().enumerate() {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter");
        for counts in &snapshot.clients {
            let count = counts.values[index];
            match counts.client {
                Some(id) => writeln!(text, "{name}{{client=\"{id}\"}} {count}"),
                None => writeln!(text, "{name} {count}"),
            }
            .unwrap_or_default();
        }
    }
    let _ = writeln!(
        text,
        "# HELP gateway_rejects_total rejects by reason code\n# TYPE gateway_rejects_total counter"
    );
    for counts in &snapshot.clients {
        for (reason, &count) in counts.rejects.iter().enumerate().filter(|(_, c)| **c > 0) {
            match counts.client {
                Some(id) => writeln!(
                    text,
                    "gateway_rejects_total{{client=\"{id}\",reason=\"{reason}\"}} {count}"
                ),
                None => writeln!(text, "gateway_rejects_total{{reason=\"{reason}\"}} {count}"),
            }
            .unwrap_or_default();
        }
    }
}

fn per_stage(text: &mut String, snapshot: &Snapshot) {
    for (name, help, value) in snapshot.stage {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let _ = writeln!(
        text,
        "# HELP gateway_ring_depth messages waiting on a ring\n# TYPE gateway_ring_depth gauge\n\
         gateway_ring_depth{{ring=\"replies\"}} {}",
        snapshot.egress_depth
    );
    let _ = writeln!(
        text,
        "# HELP gateway_store_failed 1 once a store write or sync failed (output is held)\n\
         # TYPE gateway_store_failed gauge\ngateway_store_failed {}",
        u8::from(snapshot.store_failed)
    );
    let _ = writeln!(
        text,
        "# HELP gateway_store_damaged_bytes bytes of damaged records before the synced end that \
         recovery skipped at start (the records after them kept; the log names each range)\n\
         # TYPE gateway_store_damaged_bytes gauge\ngateway_store_damaged_bytes {}",
        snapshot.store_damaged_bytes
    );
    let _ = writeln!(
        text,
        "# HELP gateway_store_writes_refused_total store batch writes refused for a full disk \
         (held, and tried again at the next commit)\n\
         # TYPE gateway_store_writes_refused_total counter\ngateway_store_writes_refused_total {}",
        snapshot.store_writes_refused
    );
    text.push_str(&ops::endpoint::render(&snapshot.registry));
}
