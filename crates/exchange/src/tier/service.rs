//! The tier as a service: started from tier settings, fed by whoever holds its inputs (a load
//! generator, the network gateway, an admin endpoint), answering through its subscribers, and
//! running until every input is dropped. [`super::run`] is one such composition (the load
//! generator and the tier); `exchange serve` is another (gateway sessions and the tier).

use std::sync::Arc;

use journal::DurableSeq;
use pipeline::placement::PlacementPlan;
use pipeline::ring::Disconnected;
use pipeline::stage::{Input, PipelineReport, RunningPipeline};

use super::graph::{self, Entry, Feeds, RunningTier};
use super::{
    Durability, ExternalEvent, OrderSource, RunOptions, ShardJournalReport, SubscriberFactory,
    TierConfig, TierInput, TierLayout, Totals, plan_layout, recover,
};
use crate::error::Result;
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
    pub(super) totals: Totals,
    pub(super) report: PipelineReport,
}

impl Tier {
    /// Validates `config`, plans the layout for `options.rate_per_s` with the orders fed from
    /// outside (never a generator inline), recovers the journals and master data from
    /// `options.journal` (or starts fresh) and starts every stage, the R-Senders delivering
    /// to `subscribers`.
    ///
    /// ```
    /// use exchange::durability::JournalMode;
    /// use exchange::flow::reference_master_data;
    /// use exchange::msg::{InboundOrder, request_kind};
    /// use exchange::tier::{RunOptions, Tier, TierConfig, in_process_subscribers};
    /// let config = TierConfig { journal: JournalMode::OFF, ..TierConfig::parked() };
    /// let options = RunOptions::planned_for(1_000.0);
    /// let (tier, mut inputs) = Tier::start(&config, &options, in_process_subscribers(8, 0))?;
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
    /// assert!(Tier::start(&bad, &options, in_process_subscribers(8, 0)).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn start(
        config: &TierConfig,
        options: &RunOptions,
        subscribers: SubscriberFactory,
    ) -> Result<(Tier, TierInputs)> {
        config.validate()?;
        let fed_from_outside = TierConfig { generator_inline: Some(false), ..config.clone() };
        let (planned, layout) = plan_layout(&fed_from_outside, options.rate_per_s)?;
        let entry = Entry::Input;
        let (tier, feeds) = Tier::start_planned(&planned, &layout, options, subscribers, entry)?;
        let Feeds { gateway, events, master } = feeds;
        let orders = gateway.expect("orders are fed from outside when no generator is inline");
        Ok((tier, TierInputs { orders, control: TierControl { events, master } }))
    }

    /// [`Tier::start`] with the orders coming from `source`, which the tier runs: inline on
    /// the chain's first thread, before the pre-process, when the layout plans the entry
    /// inline (few CPUs: no wake-up between the source and the chain), else on a thread of
    /// its own. The tier's input ends when the source returns `Flow::Stop`.
    pub fn start_with_source(
        config: &TierConfig,
        options: &RunOptions,
        subscribers: SubscriberFactory,
        source: OrderSource,
    ) -> Result<(Tier, TierControl)> {
        config.validate()?;
        let (planned, layout) = plan_layout(config, options.rate_per_s)?;
        let entry = Entry::Source(source);
        let (tier, feeds) = Tier::start_planned(&planned, &layout, options, subscribers, entry)?;
        Ok((tier, TierControl { events: feeds.events, master: feeds.master }))
    }

    /// Starts the tier with `layout` already planned (and `config` carrying its worker
    /// counts), the orders entering from `inline` when given.
    pub(super) fn start_planned(
        config: &TierConfig,
        layout: &TierLayout,
        options: &RunOptions,
        subscribers: SubscriberFactory,
        entry: Entry,
    ) -> Result<(Tier, Feeds)> {
        let master = config.starting_master_data();
        let (starts, durability) = recover(config, options, &master)?;
        let RunningTier { pipeline, feeds, reports } =
            graph::start(config, layout, options, starts, (subscribers, entry))?;
        if config.placement {
            durability.pin_helpers_to(&pipeline.plan().floating_cpus);
        }
        Ok((Tier { pipeline, reports, durability, layout: layout.clone() }, feeds))
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
        let totals = Totals::collect(reports)?;
        Ok(TierStopped {
            stages: report.stages.clone(),
            journal,
            delivered: totals.latency.delivered,
            rejects: totals.rejects,
            totals,
            report,
        })
    }
}
