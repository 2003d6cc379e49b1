//! The tier as a service: started from its own start options ([`TierStart`]), fed by whoever
//! holds its inputs or by the [`OrderSource`] it runs (a load generator, the network gateway,
//! a replicated log), answering through its subscribers, and running until every input is
//! dropped. [`super::run`] is one such composition (the load generator and the tier);
//! `exchange serve` is another (gateway sessions and the tier).

use std::sync::{Arc, mpsc};

use journal::DurableSeq;
use pipeline::placement::PlacementPlan;
use pipeline::ring::Disconnected;
use pipeline::stage::{Input, RunningPipeline};
use stats::LatencyHistogram;

use super::graph::{self, Entry, Feeds, RunningTier};
use super::source::{OrderSource, SourceStart};
use super::{
    Durability, ExternalEvent, MasterReport, ReleasedSeqs, ShardJournalReport, ShardResult,
    SubscriberFactory, TierConfig, TierInput, TierLayout, Totals, plan_layout, recover,
};
use crate::durability::JournalOptions;
use crate::error::{ExchangeError, Result};
use crate::master::MasterUpdate;
use crate::msg::{InboundOrder, REASON_COUNT};

/// A running tier: its stages, its journals and snapshot followers, and what each stage's
/// workers hand back when the tier stops.
pub struct Tier {
    pipeline: RunningPipeline,
    reports: graph::StageReports,
    durability: Durability,
    layout: TierLayout,
}

/// What feeds a running tier. The tier runs until all of it is dropped.
pub struct TierInputs {
    /// Orders into the pre-process, routed by instrument.
    pub orders: Input<InboundOrder>,
    /// External events and master-data updates.
    pub control: TierControl,
}

/// The tier's control inputs: external events (to the core as journaled control input and to
/// the master-data process) and master-data updates (journaled write-ahead).
pub struct TierControl {
    events: Input<ExternalEvent>,
    master: Input<TierInput>,
}

impl TierControl {
    /// Sends an external event (halt, resume, band change) and publishes it at once.
    pub fn event(&mut self, event: ExternalEvent) -> Result<(), Disconnected> {
        self.events.send(event)?;
        self.events.flush()
    }

    /// Sends a master-data update and publishes it at once.
    pub fn master_update(&mut self, update: MasterUpdate) -> Result<(), Disconnected> {
        self.master.send(TierInput { master: update, ..TierInput::default() })?;
        self.master.flush()
    }
}

/// What a stopped tier reports.
pub struct TierStopped {
    /// Each stage's throughput and utilization over the tier's life.
    pub stages: Vec<pipeline::metrics::StageMetrics>,
    /// Per shard: what recovery found and what the journal writer did.
    pub journal: Vec<ShardJournalReport>,
    /// Responses the R-Senders delivered.
    pub delivered: u64,
    /// Rejects by reason.
    pub rejects: [u64; REASON_COUNT],
    /// Intended send time → first response delivered at the subscriber, every request.
    pub end_to_end: LatencyHistogram,
    /// Intended send time → response content final (core output emitted, or pre-process
    /// reject built), every request: the critical path, not waiting for any fsync.
    pub critical_path: LatencyHistogram,
    /// Per split of [`super::STAGE_SPLITS`]: one in [`super::STAGE_SPLIT_SAMPLE_EVERY`] of
    /// the requests that passed the pre-process.
    pub stage_latency: Vec<LatencyHistogram>,
    /// What each core shard reports.
    pub shards: Vec<ShardResult>,
    /// The master data's journal (`None` when journaling is off).
    pub master: Option<MasterReport>,
}

/// What starting a tier takes: its configuration, the layout (planned at start for a rate, or
/// already planned), where its journals live and how to recover them, and the subscribers its
/// R-Senders deliver to. What feeds it (a holder's inputs, an [`OrderSource`]) is not part of
/// it, and neither is any load a caller drives through it.
pub struct TierStart {
    pub config: TierConfig,
    /// The order rate the layout is planned for, orders/s (unused when `layout` is given).
    pub planned_rate_per_s: f64,
    /// A layout already planned ([`super::plan_layout`]), `config` then being the planned
    /// configuration (its worker counts); `None`: planned at start.
    pub layout: Option<TierLayout>,
    /// Where the shard journals live (a temporary directory by default) and how to recover.
    pub journal: JournalOptions,
    /// Keep every shard's sequenced input (for replay).
    pub record_inputs: bool,
    /// Publishes, per shard, the highest input sequence whose reply was delivered (the crash
    /// test's child reports it to its client); `None` in measured runs.
    pub released: Option<Arc<ReleasedSeqs>>,
    /// Builds each R-Sender's subscribers.
    pub subscribers: SubscriberFactory,
}

impl TierStart {
    /// `config`'s tier, its layout planned for `planned_rate_per_s`, the journal's defaults,
    /// nothing recorded, delivering to `subscribers`.
    pub fn new(
        config: TierConfig,
        planned_rate_per_s: f64,
        subscribers: SubscriberFactory,
    ) -> TierStart {
        TierStart {
            config,
            planned_rate_per_s,
            layout: None,
            journal: JournalOptions::default(),
            record_inputs: false,
            released: None,
            subscribers,
        }
    }

    /// Validates the configuration and plans the layout unless it is given; `entry_inline`
    /// overrides where the entry runs (`Some(false)`: fed from outside).
    fn planned(self, entry_inline: Option<bool>) -> Result<TierStart> {
        self.config.validate()?;
        if self.layout.is_some() {
            return Ok(self);
        }
        let mut config = self.config.clone();
        if entry_inline.is_some() {
            config.generator_inline = entry_inline;
        }
        let (config, layout) = plan_layout(&config, self.planned_rate_per_s)?;
        Ok(TierStart { config, layout: Some(layout), ..self })
    }
}

impl Tier {
    /// Validates the configuration, plans the layout (unless given) with the orders fed from
    /// outside (never a source inline), recovers the journals and master data from
    /// `start.journal` (or starts fresh) and starts every stage, the R-Senders delivering to
    /// `start.subscribers`.
    ///
    /// ```
    /// use exchange::durability::JournalMode;
    /// use exchange::flow::reference_master_data;
    /// use exchange::msg::{InboundOrder, request_kind};
    /// use exchange::tier::{Tier, TierConfig, TierStart, in_process_subscribers};
    /// let config = TierConfig { journal: JournalMode::OFF, ..TierConfig::parked() };
    /// let start = TierStart::new(config.clone(), 1_000.0, in_process_subscribers(8, 0));
    /// let (tier, mut inputs) = Tier::start(start)?;
    /// let master = reference_master_data(&config.universe);
    /// let band = master.instrument(1).unwrap();
    /// let order = InboundOrder {
    ///     kind: request_kind::NEW, instrument: 1, client: 1, order_id: 1,
    ///     price: (band.band_low + band.band_high) / 2, qty: 1, ..InboundOrder::default()
    /// };
    /// inputs.orders.send(order)?;
    /// drop(inputs); // the tier drains and its stages end
    /// let stopped = tier.stop()?;
    /// assert_eq!(stopped.delivered, 2, "its accept, and the top of book it changed");
    /// assert_eq!(stopped.rejects.iter().sum::<u64>(), 0);
    ///
    /// let bad = TierConfig { ring_slots: 1000, ..config };
    /// assert!(Tier::start(TierStart::new(bad, 1_000.0, in_process_subscribers(8, 0))).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(start: TierStart) -> Result<(Tier, TierInputs)> {
        let mut start = start.planned(Some(false))?;
        if let Some(layout) = &mut start.layout {
            layout.generator_inline = false; // the holder's thread feeds the entry
        }
        let (tier, feeds) = Tier::start_planned(start, Entry::Input)?;
        let Feeds { intake, events, master } = feeds;
        let orders = intake.expect("orders are fed from outside when no source runs");
        Ok((tier, TierInputs { orders, control: TierControl { events, master } }))
    }

    /// [`Tier::start`] with the orders coming from `source`, which the tier runs: inline on
    /// the chain's first thread, before the pre-process, when the layout plans the entry
    /// inline (few CPUs: no wake-up between the source and the chain), else on a thread of
    /// its own. The source gets the tier's control input, durable sequences and layout when it
    /// first runs; this returns once it has started, or with its start's error
    /// ([`ExchangeError::SourceFailed`]). The tier's input ends when the source returns
    /// `Flow::Stop`.
    pub fn start_with_source(start: TierStart, source: OrderSource) -> Result<Tier> {
        let start = start.planned(None)?;
        let (handing, handed) = mpsc::channel();
        let (started, source_started) = mpsc::sync_channel(1);
        let entry = Entry::Source(source.name(), Box::new(source.into_stage(handed, started)));
        let (tier, feeds) = Tier::start_planned(start, entry)?;
        let handover = SourceStart {
            control: TierControl { events: feeds.events, master: feeds.master },
            durables: tier.durables(),
            layout: tier.layout.clone(),
        };
        // The source's thread is waiting for it (or gone, when the pipeline aborted).
        let _ = handing.send(handover);
        match source_started.recv() {
            Ok(Ok(())) => Ok(tier),
            Ok(Err(error)) => {
                // The source stopped unstarted: the stages drain and end.
                if let Err(stopping) = tier.stop() {
                    tracing::warn!(error = %stopping, "stopping the tier after its source failed");
                }
                Err(ExchangeError::SourceFailed(error))
            }
            Err(_) => Err(tier.stop().err().unwrap_or_else(|| {
                ExchangeError::Failed("the order source ended before it started".into())
            })),
        }
    }

    /// Starts the tier with its layout planned (and `start.config` carrying its worker
    /// counts), the orders entering at `entry`.
    fn start_planned(start: TierStart, entry: Entry) -> Result<(Tier, Feeds)> {
        let layout = start.layout.clone().expect("planned before it starts");
        let master = start.config.starting_master_data();
        let (starts, durability) = recover(&start.config, &start.journal, &master)?;
        let RunningTier { pipeline, feeds, reports } =
            graph::start(&start, &layout, starts, entry)?;
        if start.config.placement {
            durability.pin_helpers_to(&pipeline.plan().floating_cpus);
        }
        Ok((Tier { pipeline, reports, durability, layout }, feeds))
    }

    /// Per core shard, the journal's durable sequence (`None` with the journal off): what a
    /// caller that took over the reply hold ([`TierConfig::hold_replies`]) waits for.
    pub fn durables(&self) -> Vec<Option<Arc<DurableSeq>>> {
        self.durability.journals.durables.clone()
    }

    /// The thread layout the tier runs.
    pub fn layout(&self) -> &TierLayout {
        &self.layout
    }

    /// Where the tier's threads were planned (pinned only with [`TierConfig::placement`]).
    pub fn placement(&self) -> &PlacementPlan {
        self.pipeline.plan()
    }

    /// Waits until every input is dropped and the stages drained, then stops the journal
    /// writers and snapshot followers and collects what the stages report. An error is what
    /// stopped a stage, or a journal that failed.
    pub fn stop(self) -> Result<TierStopped> {
        let Tier { pipeline, reports, durability, .. } = self;
        let report = pipeline.wait()?;
        let journal = durability.finish()?;
        let Totals { latency, rejects, shards, master } = Totals::collect(reports)?;
        Ok(TierStopped {
            stages: report.stages,
            journal,
            delivered: latency.delivered,
            rejects,
            end_to_end: latency.end_to_end,
            critical_path: latency.critical_path,
            stage_latency: latency.stage_latency,
            shards,
            master,
        })
    }
}
