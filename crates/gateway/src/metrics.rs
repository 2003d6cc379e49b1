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

use exchange::msg::CoreOutput;
use lab::stats::LatencyHistogram;

use crate::hub::{Counters, Hub, REASON_CODES};

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
    /// Arrival of a request at the gateway → the tier's answer to it (accepted, rejected,
    /// replaced, cancelled) reaching the router that hands it to the session: the in-tier
    /// response, the published lean tier's scope (no store or journal fsync in it). Taken
    /// by the demo ([`crate::server::Running::take_in_tier_latency`]).
    pub in_tier: LatencyHistogram,
    /// The histograms above and the process metrics, encoded by `prometheus-client`.
    registry: ops::Registry,
}

impl Default for StageMetrics {
    fn default() -> StageMetrics {
        let (order_to_report, engine_service) = Default::default();
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
            in_tier: LatencyHistogram::default(),
            registry,
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

/// The metrics in the Prometheus text format.
pub fn prometheus_text(hub: &Hub) -> String {
    let mut text = String::new();
    per_session(&mut text, hub);
    per_stage(&mut text, hub);
    if let Some(layout) = &hub.stage.layout {
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

/// The session counters: summed over every client, or per client id with
/// [`crate::hub::Settings::metrics_per_client`].
fn per_session(text: &mut String, hub: &Hub) {
    let metrics: [(&str, &str, CounterOf); 7] = [
        ("gateway_orders_in_total", "order messages received", |c| c.orders_in),
        ("gateway_reports_out_total", "execution reports routed", |c| c.reports_out),
        ("gateway_throttled_total", "orders rejected by the session throttle", |c| c.throttled),
        ("gateway_busy_total", "orders rejected because the ingress ring was full", |c| c.busy),
        ("gateway_cut_off_total", "sessions cut off (slow consumer, throttle breach)", |c| {
            c.cut_off
        }),
        ("gateway_logons_total", "successful logons", |c| c.logons),
        ("gateway_garbled_total", "FIX messages ignored as garbled", |c| c.garbled),
    ];
    let per_client = hub.settings.metrics_per_client;
    for (name, help, value) in metrics {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter");
        if per_client {
            for client in &hub.clients {
                let (id, count) = (client.credential.client, value(&client.counters));
                let _ = writeln!(text, "{name}{{client=\"{id}\"}} {count}");
            }
        } else {
            let total: u64 = hub.clients.iter().map(|client| value(&client.counters)).sum();
            let _ = writeln!(text, "{name} {total}");
        }
    }
    let _ = writeln!(
        text,
        "# HELP gateway_rejects_total rejects by reason code\n# TYPE gateway_rejects_total counter"
    );
    if per_client {
        rejects_per_client(text, hub);
    } else {
        let mut totals = [0u64; REASON_CODES];
        for client in &hub.clients {
            for (total, count) in totals.iter_mut().zip(&client.counters.rejects) {
                *total += count;
            }
        }
        for (reason, count) in totals.iter().enumerate().filter(|(_, c)| **c > 0) {
            let _ = writeln!(text, "gateway_rejects_total{{reason=\"{reason}\"}} {count}");
        }
    }
}

fn rejects_per_client(text: &mut String, hub: &Hub) {
    for client in &hub.clients {
        let id = client.credential.client;
        for (reason, &count) in client.counters.rejects.iter().enumerate().filter(|(_, c)| **c > 0)
        {
            let _ = writeln!(
                text,
                "gateway_rejects_total{{client=\"{id}\",reason=\"{reason}\"}} {count}"
            );
        }
    }
}

fn per_stage(text: &mut String, hub: &Hub) {
    let stage = &hub.stage;
    let log = hub.log.borrow();
    let counters: [(&str, &str, u64); 5] = [
        ("gateway_engine_in_total", "requests handed to the tier", stage.engine_in),
        ("gateway_engine_out_total", "reports taken off the tier's reply rings", stage.engine_out),
        (
            "gateway_unroutable_total",
            "reports for a client id not in the credentials",
            hub.unroutable,
        ),
        (
            "gateway_store_commits_total",
            "store batches written (one write, one fdatasync each)",
            log.commits,
        ),
        ("gateway_store_bytes_total", "bytes written to the store", log.bytes_written),
    ];
    for (name, help, value) in counters {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
    }
    let _ = writeln!(
        text,
        "# HELP gateway_ring_depth messages waiting on a ring\n# TYPE gateway_ring_depth gauge\n\
         gateway_ring_depth{{ring=\"replies\"}} {}",
        stage.egress_depth
    );
    let _ = writeln!(
        text,
        "# HELP gateway_store_failed 1 once a store write or sync failed (output is held)\n\
         # TYPE gateway_store_failed gauge\ngateway_store_failed {}",
        u8::from(log.has_failed())
    );
    text.push_str(&ops::endpoint::render(&stage.registry));
}
