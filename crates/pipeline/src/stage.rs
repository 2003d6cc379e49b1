//! The stage runtime: a graph of stages, each a handler run by k worker threads, connected by
//! single-writer rings.
//!
//! # Graph
//! [`PipelineBuilder`] declares sources ([`PipelineBuilder::source`]), inputs fed by threads
//! outside the pipeline ([`PipelineBuilder::input`]), stages ([`PipelineBuilder::stage`]) and
//! sinks ([`PipelineBuilder::sink`]), each with a [`StageSpec`] (workers, optional
//! `max_workers`, [`Role`], wait strategy, inbound ring size), and connects them with
//! [`PipelineBuilder::connect`]. A connection from stage A (u workers) to stage B (d workers)
//! is a full mesh of u·d SPSC rings, so every ring keeps exactly one writer:
//! - *fan-out* (1→N): an upstream worker picks the downstream worker per message by
//!   [`Route::RoundRobin`] or [`Route::by_key`] (a key always lands on the same worker, so one
//!   key's messages stay in order as long as they all come from one upstream worker and the
//!   stage is not resized meanwhile);
//! - *fan-in* (N→1): a downstream worker polls its inbound rings in turn and sleeps on one
//!   [`Parker`] that every one of those rings notifies;
//! - a stage connected to several downstream stages sends each message to all of them.
//!
//! ```
//! use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};
//!
//! #[derive(Clone, Copy, Default)]
//! struct Order { account: u64, qty: u64 }
//!
//! let mut graph = PipelineBuilder::new().pin_threads(false);
//! let intake = graph.source("intake", StageSpec::ancillary(1), |_| {
//!     let mut next = 0;
//!     move |out: &mut Emitter<Order>| {
//!         next += 1;
//!         out.emit(Order { account: next % 4, qty: next });
//!         if next == 1_000 { Flow::Stop } else { Flow::Continue }
//!     }
//! });
//! let validate = graph.stage("validate", StageSpec::critical(2), |_| {
//!     |order: &Order, out: &mut Emitter<Order>| if order.qty > 0 { out.emit(*order) }
//! });
//! let journal = graph.sink("journal", StageSpec::ancillary(1), |_| |_: &Order| {});
//! graph.connect(intake, validate, Route::by_key(|order: &Order| order.account));
//! graph.connect(validate, journal, Route::RoundRobin);
//! let report = graph.start()?.wait()?; // runs until the intake stops, then drains
//! assert_eq!(report.stages[2].messages_in, 1_000);
//! # Ok::<(), pipeline::stage::PipelineError>(())
//! ```
//!
//! # Fusion
//! [`PipelineBuilder::fuse`] runs a stage on the threads of the stage before it, run to
//! completion over each batch, with no ring (and no thread wake-up) between them; rings remain
//! only where threads meet. Fused stages keep their other inbound rings (fan-in), outbound
//! rings (fan-out) and their own metrics (measured per batch; see `stage/fused.rs`). Where cores are
//! scarce a layout fuses consecutive stages; where they are plenty it spreads them out.
//! A stage declared [`StageSpec::floating`] takes no CPU of its own in the placement plan (for
//! mostly idle stages that park), so it does not make a small host count as oversubscribed; it
//! runs on the CPUs no exclusive placement holds ([`PlacementPlan::floating_cpus`]).
//!
//! # Hot path
//! A worker reads a batch from each inbound ring (one release per batch), calls the handler per
//! message, and collects emitted messages in pre-allocated per-ring buffers that are published
//! with one `push_batch` per ring when the input batch is done (or a buffer fills). Per message
//! that is two slot copies, a handler call, one vDSO clock read and a few histogram increments:
//! no allocation, no lock, no system call.
//!
//! # Timestamps
//! Rings carry an [`Envelope`]: the message plus the time it entered the pipeline (ingress) and
//! the time its ring buffer was published (sent). Workers record per-hop latency (start of
//! handling − sent) and, in stages with no downstream, end-to-end latency (end of handling −
//! ingress), without the message type knowing about time.
//!
//! # Start, shutdown, failure
//! [`PipelineBuilder::start`] plans placement for every worker ([`crate::placement`]), builds
//! every ring, then spawns the threads. [`RunningPipeline::shutdown`] asks sources to stop; each
//! worker exits once all its inbound rings are disconnected *and drained*, dropping its outbound
//! rings, so the stop cascades downstream without losing a message. A panic in a handler is
//! caught at the worker boundary: the pipeline records an error naming the stage, raises an
//! abort flag and wakes every worker's parker; workers stop, their dropped rings wake anyone
//! blocked on a full ring, and [`RunningPipeline::wait`] returns
//! [`PipelineError::StagePanicked`]. A handler that blocks forever inside user code (not in a
//! ring) cannot be interrupted; everything else stops without a hang.
//!
//! # Resizing
//! A processing stage or sink declared with [`StageSpec::with_max_workers`] spawns that many
//! workers and rings up front; [`RunningPipeline::resize`] changes how many of them upstream
//! routing picks from (the active prefix), without stopping anything. Deactivated workers
//! drain what they hold and then idle (parked, for a wait strategy that parks), so a resize
//! never loses or duplicates a message; the argument is in [`crate::active`].

mod emit;
mod fused;
mod results;
mod worker;

use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use serde::Serialize;

use emit::Outlet;
pub use emit::{
    EMIT_BATCH_SLOTS_MAX, Emitter, Envelope, FUSED_BATCH_SLOTS_MAX, Input, Message, Route,
};
use fused::FusedStage;
pub use results::{StageResults, StageWorker};
pub use worker::DEPTH_SAMPLE_EVERY_ROUNDS;
use worker::{LaunchContext, Shared, launch_workers, run_source};

use crate::active::ActiveWorkers;
use crate::connector::{ConnectorKind, Receiver, connector_with};
use crate::metrics::{StageMetrics, StageMetricsHub, WorkerMetrics};
use crate::placement::{PlacementPlan, Role, ThreadPlacement, ThreadRequest, Topology};
use crate::ring::{RingConfig, RingError};
use crate::wait::{Parker, WaitStrategy};

/// How a stage runs and how its inbound rings are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageSpec {
    /// Worker threads (k) receiving messages at start, at least 1.
    pub workers: usize,
    /// Makes a processing stage or sink resizable: this many workers are spawned and
    /// [`RunningPipeline::resize`] sets how many of them receive messages (`None`: `workers`,
    /// not resizable). See [`crate::active`].
    pub max_workers: Option<usize>,
    /// Critical stages get dedicated cores in the placement plan; ancillary ones share.
    pub role: Role,
    /// The requested wait strategy (downgraded when the plan is oversubscribed).
    pub wait: WaitStrategy,
    /// Slots of each inbound ring (a power of two).
    pub capacity_slots: usize,
    /// Most messages read (and published) per batch on inbound rings.
    pub batch_slots_max: usize,
    /// The inbound rings' implementation (lock-free or the blocking baseline).
    pub connector: ConnectorKind,
    /// The workers need no CPU of their own: they are neither placed nor pinned nor counted
    /// when the plan checks for oversubscription (for mostly idle stages that park).
    pub floating: bool,
}

impl StageSpec {
    /// A critical-path stage: dedicated cores, busy-spinning when the plan allows it.
    pub fn critical(workers: usize) -> StageSpec {
        StageSpec {
            workers,
            role: Role::Critical,
            wait: WaitStrategy::BusySpin,
            ..StageSpec::default()
        }
    }

    /// An ancillary stage with the default (adaptive) wait strategy.
    pub fn ancillary(workers: usize) -> StageSpec {
        StageSpec { workers, ..StageSpec::default() }
    }

    /// The same spec waiting by `wait` (see [`crate::wait`] for the trade-offs).
    pub fn with_wait(self, wait: WaitStrategy) -> StageSpec {
        StageSpec { wait, ..self }
    }

    /// The same spec with inbound rings of `capacity_slots` slots, read and published in
    /// batches of at most `batch_slots_max` (checked at [`PipelineBuilder::start`]).
    pub fn with_ring(self, capacity_slots: usize, batch_slots_max: usize) -> StageSpec {
        StageSpec { capacity_slots, batch_slots_max, ..self }
    }

    /// The same spec with inbound connectors of `connector` kind (the blocking baseline for
    /// comparisons).
    pub fn with_connector(self, connector: ConnectorKind) -> StageSpec {
        StageSpec { connector, ..self }
    }

    /// Runs the workers on no CPU of their own (see [`StageSpec::floating`]).
    pub fn floating(self) -> StageSpec {
        StageSpec { floating: true, ..self }
    }

    /// Spawns `max_workers` workers, of which `workers` receive messages until resized.
    pub fn with_max_workers(self, max_workers: usize) -> StageSpec {
        StageSpec { max_workers: Some(max_workers), ..self }
    }

    /// Worker threads spawned (and rings built per upstream worker).
    pub fn spawned_workers(&self) -> usize {
        self.max_workers.unwrap_or(self.workers)
    }
}

impl Default for StageSpec {
    fn default() -> Self {
        let ring = RingConfig::default();
        StageSpec {
            workers: 1,
            max_workers: None,
            role: Role::Ancillary,
            wait: WaitStrategy::default(),
            capacity_slots: ring.capacity_slots,
            batch_slots_max: ring.batch_slots_max,
            connector: ConnectorKind::LockFree,
            floating: false,
        }
    }
}

/// Whether a source wants to be called again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Call this source worker's handler again.
    Continue,
    /// This source worker is done: its rings are flushed and closed.
    Stop,
}

/// Why a pipeline could not be built or did not finish cleanly.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A handler panicked; the pipeline stopped the other workers.
    #[error("stage `{stage}` worker {worker} panicked: {message}")]
    StagePanicked {
        /// The stage whose handler panicked.
        stage: String,
        /// The worker index within the stage.
        worker: usize,
        /// The panic's message.
        message: String,
    },
    /// The graph or a resize request is not valid (found before any thread starts).
    #[error("stage `{stage}`: {reason}")]
    BadStage {
        /// The stage at fault.
        stage: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An inbound ring's configuration was refused.
    #[error("inbound ring of stage `{stage}`: {source}")]
    Ring {
        /// The stage the ring feeds.
        stage: String,
        /// Why the ring was refused.
        source: RingError,
    },
    /// The OS refused a thread.
    #[error("cannot start a thread for stage `{stage}`: {source}")]
    Spawn {
        /// The stage whose worker could not start.
        stage: String,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// A typed reference to a declared stage, used to connect it.
pub struct StageHandle<In, Out> {
    index: usize,
    types: PhantomData<fn(In) -> Out>,
}

impl<In, Out> Clone for StageHandle<In, Out> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<In, Out> Copy for StageHandle<In, Out> {}

/// The typed rings of a stage, per worker; filled by connections before launch.
struct StagePorts<In, Out> {
    inputs: Vec<Vec<Receiver<Envelope<In>>>>,
    outlets: Vec<Vec<Outlet<Out>>>,
    /// Per worker: the worker of the stage fused after this one, set just before launch.
    next: Vec<Option<Box<dyn FusedStage<Out>>>>,
}

/// What launching a slot produced: worker threads, the [`Input`] handles of an input slot, or
/// the workers of a fused stage (a `Vec<Box<dyn FusedStage<In>>>`) for its upstream's threads.
enum Launched {
    Threads(Vec<JoinHandle<()>>),
    Inputs(Box<dyn Any + Send>),
    Fused(Box<dyn Any + Send>),
}

type Launcher =
    Box<dyn FnOnce(Box<dyn Any + Send>, LaunchContext) -> Result<Launched, PipelineError> + Send>;
type Edge = Box<dyn FnOnce(&mut [Slot], &[WaitStrategy]) -> Result<(), PipelineError> + Send>;
/// Hands a fused stage's launched workers to its upstream slot's ports.
type Attach = Box<dyn FnOnce(&mut Slot, Box<dyn Any + Send>) + Send>;

/// A declared stage, type-erased so stages of different message types share one list.
struct Slot {
    name: Arc<str>,
    spec: StageSpec,
    kind: SlotKind,
    consumer_parkers: Vec<Arc<Parker>>,
    producer_parkers: Vec<Arc<Parker>>,
    /// How many workers upstream routing picks from (all of them unless resizable).
    active: Arc<ActiveWorkers>,
    ports: Box<dyn Any + Send>,
    launcher: Launcher,
    /// Fused after another stage: the upstream slot's index and how to hand it the workers.
    fused_into: Option<(usize, Attach)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotKind {
    /// Worker threads call a handler that produces messages.
    Source,
    /// Worker threads consume (and possibly produce) messages.
    Stage,
    /// Threads outside the pipeline produce messages through [`Input`] handles.
    Input,
}

fn ports_mut<In: 'static, Out: 'static>(slot: &mut Slot) -> &mut StagePorts<In, Out> {
    slot.ports.downcast_mut().expect("a StageHandle<In, Out> always names a slot with those types")
}

/// Declares a pipeline graph; [`PipelineBuilder::start`] runs it.
pub struct PipelineBuilder {
    slots: Vec<Slot>,
    edges: Vec<Edge>,
    /// (upstream, downstream) slot indices of every connection, fusions included.
    links: Vec<(usize, usize)>,
    /// (upstream, downstream) slot indices of every fusion.
    fusions: Vec<(usize, usize)>,
    topology: Option<Topology>,
    pin_threads: bool,
}

impl Default for PipelineBuilder {
    fn default() -> Self {
        PipelineBuilder::new()
    }
}

impl PipelineBuilder {
    /// An empty graph that pins workers per the placement plan of the detected topology.
    ///
    /// ```
    /// use pipeline::stage::{PipelineBuilder, PipelineError};
    ///
    /// // An empty graph starts and finishes at once: nothing to run.
    /// let report = PipelineBuilder::new().pin_threads(false).start()?.wait()?;
    /// assert!(report.stages.is_empty());
    /// # Ok::<(), PipelineError>(())
    /// ```
    pub fn new() -> PipelineBuilder {
        PipelineBuilder {
            slots: Vec::new(),
            edges: Vec::new(),
            links: Vec::new(),
            fusions: Vec::new(),
            topology: None,
            pin_threads: true,
        }
    }

    /// Whether to pin workers (the plan and its wait-strategy downgrades apply either way).
    /// Unpinned suits tests and shared hosts; pinned is what a dedicated host is for.
    ///
    /// ```
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let once = graph.source("once", StageSpec::ancillary(1), |_| {
    ///     |out: &mut Emitter<u8>| { out.emit(1); Flow::Stop }
    /// });
    /// let sink = graph.sink("sink", StageSpec::ancillary(1), |_| |_: &u8| {});
    /// graph.connect(once, sink, Route::RoundRobin);
    /// let report = graph.start()?.wait()?;
    /// assert!(report.pin_failures.is_empty(), "nothing was pinned, so nothing failed");
    /// # Ok::<(), pipeline::stage::PipelineError>(())
    /// ```
    pub fn pin_threads(mut self, pin: bool) -> PipelineBuilder {
        self.pin_threads = pin;
        self
    }

    /// Plans against `topology` instead of the detected one: to reproduce another host's
    /// plan, or to keep a test independent of the machine it runs on.
    ///
    /// ```
    /// use pipeline::placement::Topology;
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(2));
    /// let once = graph.source("once", StageSpec::ancillary(1), |_| {
    ///     |out: &mut Emitter<u8>| { out.emit(1); Flow::Stop }
    /// });
    /// let sink = graph.sink("sink", StageSpec::ancillary(1), |_| |_: &u8| {});
    /// graph.connect(once, sink, Route::RoundRobin);
    /// let running = graph.start()?;
    /// assert_eq!(running.plan().threads.len(), 2);
    /// running.wait()?;
    /// # Ok::<(), pipeline::stage::PipelineError>(())
    /// ```
    pub fn topology(mut self, topology: Topology) -> PipelineBuilder {
        self.topology = Some(topology);
        self
    }

    /// A source: each worker calls its handler in a loop until it returns [`Flow::Stop`] or
    /// the pipeline shuts down. `make_handler(worker)` builds each worker's handler. A handler
    /// with nothing to emit should wait inside the call (it owns its thread) rather than return
    /// at once, or the loop spins; [`RunningPipeline::stop`] is seen between calls. A stage
    /// fused after a source ([`PipelineBuilder::fuse`]) runs on the source's threads over what
    /// each call emitted, run to completion, before the next call.
    ///
    /// ```
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// // Two source workers, each emitting its own ten numbers.
    /// let numbers = graph.source("numbers", StageSpec::ancillary(2), |worker| {
    ///     let mut next = 0;
    ///     move |out: &mut Emitter<u64>| {
    ///         out.emit(worker as u64 * 100 + next);
    ///         next += 1;
    ///         if next == 10 { Flow::Stop } else { Flow::Continue }
    ///     }
    /// });
    /// let sink = graph.sink("sink", StageSpec::ancillary(1), |_| |_: &u64| {});
    /// graph.connect(numbers, sink, Route::RoundRobin);
    /// let report = graph.start()?.wait()?;
    /// assert_eq!(report.stages[1].messages_in, 20);
    /// # Ok::<(), pipeline::stage::PipelineError>(())
    /// ```
    pub fn source<Out: Message, H>(
        &mut self,
        name: &str,
        spec: StageSpec,
        mut make_handler: impl FnMut(usize) -> H + Send + 'static,
    ) -> StageHandle<(), Out>
    where
        H: FnMut(&mut Emitter<Out>) -> Flow + Send + 'static,
    {
        let launcher: Launcher = Box::new(move |ports, context| {
            let ports = *ports.downcast::<StagePorts<(), Out>>().expect("source ports");
            let fused_next = ports.outlets.into_iter().zip(ports.next);
            let workers = fused_next.enumerate().map(|(worker, (outlets, next))| {
                let handler = make_handler(worker);
                let emitter = Emitter::new(outlets).with_next(next);
                (worker, move |shared: &Shared, metrics: &mut WorkerMetrics| {
                    run_source(shared, metrics, emitter, handler)
                })
            });
            launch_workers(&context, workers).map(Launched::Threads)
        });
        self.declare::<(), Out>(name, spec, SlotKind::Source, launcher)
    }

    /// A processing stage: each worker calls `handler(&message, &mut emitter)` per message,
    /// emitting zero or more messages downstream. A stage nothing feeds is refused at start,
    /// since it would never receive a message.
    ///
    /// ```
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, PipelineError, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let numbers = graph.source("numbers", StageSpec::ancillary(1), |_| {
    ///     let mut next = 0u64;
    ///     move |out: &mut Emitter<u64>| {
    ///         next += 1;
    ///         out.emit(next);
    ///         if next == 10 { Flow::Stop } else { Flow::Continue }
    ///     }
    /// });
    /// // Keeps the even numbers: messages out may be fewer than messages in.
    /// let evens = graph.stage("evens", StageSpec::ancillary(2), |_| {
    ///     |n: &u64, out: &mut Emitter<u64>| if n % 2 == 0 { out.emit(*n) }
    /// });
    /// let sink = graph.sink("sink", StageSpec::ancillary(1), |_| |_: &u64| {});
    /// graph.connect(numbers, evens, Route::RoundRobin);
    /// graph.connect(evens, sink, Route::RoundRobin);
    /// let report = graph.start()?.wait()?;
    /// assert_eq!((report.stages[1].messages_in, report.stages[1].messages_out), (10, 5));
    ///
    /// let mut orphan = PipelineBuilder::new().pin_threads(false);
    /// orphan.stage("orphan", StageSpec::ancillary(1), |_| |_: &u64, _: &mut Emitter<u64>| {});
    /// let Err(PipelineError::BadStage { stage, .. }) = orphan.start() else { panic!() };
    /// assert_eq!(stage, "orphan");
    /// # Ok::<(), PipelineError>(())
    /// ```
    pub fn stage<In: Message, Out: Message, H>(
        &mut self,
        name: &str,
        spec: StageSpec,
        mut make_handler: impl FnMut(usize) -> H + Send + 'static,
    ) -> StageHandle<In, Out>
    where
        H: FnMut(&In, &mut Emitter<Out>) + Send + 'static,
    {
        // A plain handler is a worker with nothing to report.
        let stage = move |worker| results::HandlerWorker(make_handler(worker));
        self.stage_with_results(name, spec, stage).0
    }

    /// An input: `handles` [`Input`]s through which threads outside the pipeline (a network
    /// reader, a test driver) feed it; take them with [`RunningPipeline::take_inputs`]. Each
    /// handle is the single writer of its own rings, like a source worker. Dropping every
    /// handle ends the input, so the pipeline drains and finishes.
    ///
    /// ```
    /// use pipeline::stage::{PipelineBuilder, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let orders = graph.input::<u32>("orders", 1);
    /// let sink = graph.sink("sink", StageSpec::ancillary(1), |_| |_: &u32| {});
    /// graph.connect(orders, sink, Route::RoundRobin);
    /// let mut running = graph.start()?;
    /// let mut inputs = running.take_inputs(orders).expect("declared as an input");
    /// assert!(running.take_inputs(orders).is_none(), "handles are taken once");
    /// inputs[0].send(42).expect("the sink is running");
    /// drop(inputs);
    /// let report = running.wait()?;
    /// let sink = report.stages.iter().find(|stage| stage.stage == "sink").unwrap();
    /// assert_eq!(sink.messages_in, 1);
    /// # Ok::<(), pipeline::stage::PipelineError>(())
    /// ```
    pub fn input<Out: Message>(&mut self, name: &str, handles: usize) -> StageHandle<(), Out> {
        let launcher: Launcher = Box::new(move |ports, _context| {
            let ports = *ports.downcast::<StagePorts<(), Out>>().expect("input ports");
            let inputs: Vec<Input<Out>> = ports
                .outlets
                .into_iter()
                .map(|outlets| Input { emitter: Emitter::new(outlets) })
                .collect();
            Ok(Launched::Inputs(Box::new(inputs)))
        });
        let spec = StageSpec::ancillary(handles);
        self.declare::<(), Out>(name, spec, SlotKind::Input, launcher)
    }

    /// A sink: a stage that only consumes (`handler(&message)`); it records end-to-end latency.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};
    ///
    /// let total = Arc::new(AtomicU64::new(0));
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let numbers = graph.source("numbers", StageSpec::ancillary(1), |_| {
    ///     let mut next = 0u64;
    ///     move |out: &mut Emitter<u64>| {
    ///         next += 1;
    ///         out.emit(next);
    ///         if next == 4 { Flow::Stop } else { Flow::Continue }
    ///     }
    /// });
    /// let sum = total.clone();
    /// let sink = graph.sink("sum", StageSpec::ancillary(1), move |_| {
    ///     let sum = sum.clone();
    ///     move |n: &u64| { sum.fetch_add(*n, Ordering::Relaxed); }
    /// });
    /// graph.connect(numbers, sink, Route::RoundRobin);
    /// let report = graph.start()?.wait()?;
    /// assert_eq!(total.load(Ordering::Relaxed), 1 + 2 + 3 + 4);
    /// assert_eq!(report.stages[1].end_to_end_ns.count, 4);
    /// # Ok::<(), pipeline::stage::PipelineError>(())
    /// ```
    pub fn sink<In: Message, H>(
        &mut self,
        name: &str,
        spec: StageSpec,
        mut make_handler: impl FnMut(usize) -> H + Send + 'static,
    ) -> StageHandle<In, ()>
    where
        H: FnMut(&In) + Send + 'static,
    {
        self.stage(name, spec, move |worker| {
            let mut handler = make_handler(worker);
            move |message: &In, _: &mut Emitter<()>| handler(message)
        })
    }

    fn declare<In: Message, Out: Message>(
        &mut self,
        name: &str,
        spec: StageSpec,
        kind: SlotKind,
        launcher: Launcher,
    ) -> StageHandle<In, Out> {
        let workers = spec.spawned_workers();
        let max = workers.max(1);
        let ports: StagePorts<In, Out> = StagePorts {
            inputs: (0..workers).map(|_| Vec::new()).collect(),
            outlets: (0..workers).map(|_| Vec::new()).collect(),
            next: (0..workers).map(|_| None).collect(),
        };
        self.slots.push(Slot {
            name: name.into(),
            spec,
            kind,
            consumer_parkers: (0..workers).map(|_| Parker::new()).collect(),
            producer_parkers: (0..workers).map(|_| Parker::new()).collect(),
            // Out-of-range counts are clamped here and refused by `validate` at start.
            active: Arc::new(ActiveWorkers::new(spec.workers.clamp(1, max), max)),
            ports: Box::new(ports),
            launcher,
            fused_into: None,
        });
        StageHandle { index: self.slots.len() - 1, types: PhantomData }
    }

    /// Connects every worker of `from` to every worker of `to` (one SPSC ring each), routing
    /// each message of `from` to one worker of `to` by `route`. A connection that closes a
    /// cycle is refused at start: bounded rings in a cycle can deadlock.
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, PipelineError, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let numbers = graph.source("numbers", StageSpec::ancillary(1), |_| {
    ///     let mut next = 0u64;
    ///     move |out: &mut Emitter<u64>| {
    ///         next += 1;
    ///         out.emit(next);
    ///         if next == 100 { Flow::Stop } else { Flow::Continue }
    ///     }
    /// });
    /// // By key: odd numbers all land on one worker, even ones on the other.
    /// let seen = Arc::new(Mutex::new(vec![Vec::new(), Vec::new()]));
    /// let record = seen.clone();
    /// let parity = graph.sink("parity", StageSpec::ancillary(2), move |worker| {
    ///     let record = record.clone();
    ///     move |n: &u64| record.lock().unwrap()[worker].push(*n % 2)
    /// });
    /// graph.connect(numbers, parity, Route::by_key(|n: &u64| *n % 2));
    /// graph.start()?.wait()?;
    /// for remainders in seen.lock().unwrap().iter() {
    ///     assert_eq!(remainders.len(), 50);
    ///     assert!(remainders.windows(2).all(|pair| pair[0] == pair[1]), "one key per worker");
    /// }
    ///
    /// let mut looped = PipelineBuilder::new().pin_threads(false);
    /// let forward = |_| |n: &u8, out: &mut Emitter<u8>| out.emit(*n);
    /// let a = looped.stage("a", StageSpec::ancillary(1), forward);
    /// let b = looped.stage("b", StageSpec::ancillary(1), forward);
    /// looped.connect(a, b, Route::RoundRobin);
    /// looped.connect(b, a, Route::RoundRobin);
    /// assert!(matches!(looped.start(), Err(PipelineError::BadStage { .. })));
    /// # Ok::<(), PipelineError>(())
    /// ```
    pub fn connect<A: 'static, T: Message, B: 'static>(
        &mut self,
        from: StageHandle<A, T>,
        to: StageHandle<T, B>,
        route: Route<T>,
    ) {
        let (upstream, downstream) = (from.index, to.index);
        self.links.push((upstream, downstream));
        self.edges.push(Box::new(move |slots, waits| {
            // The ring's strategy serves the producer on a full ring and decides whether each
            // side notifies the other: keep the producer's own if it may park, else take the
            // consumer's, so a consumer that may sleep is always notified.
            let wait = if waits[upstream].may_park() { waits[upstream] } else { waits[downstream] };
            let spec = slots[downstream].spec;
            let config = RingConfig {
                capacity_slots: spec.capacity_slots,
                batch_slots_max: spec.batch_slots_max,
                wait,
            };
            let pending_slots_max = spec.batch_slots_max.min(EMIT_BATCH_SLOTS_MAX);
            let downstream_workers = spec.spawned_workers();
            let mut receivers: Vec<Vec<Receiver<Envelope<T>>>> =
                (0..downstream_workers).map(|_| Vec::new()).collect();
            let mut outlets = Vec::with_capacity(slots[upstream].spec.spawned_workers());
            for producer_parker in &slots[upstream].producer_parkers {
                let mut rings = Vec::with_capacity(downstream_workers);
                for (worker, consumer_parker) in
                    slots[downstream].consumer_parkers.iter().enumerate()
                {
                    let (sender, receiver) = connector_with(
                        spec.connector,
                        &config,
                        producer_parker.clone(),
                        consumer_parker.clone(),
                    )
                    .map_err(|source| PipelineError::Ring {
                        stage: slots[downstream].name.to_string(),
                        source,
                    })?;
                    rings.push(sender);
                    receivers[worker].push(receiver);
                }
                let active = slots[downstream].active.clone();
                outlets.push(Outlet::new(route.clone(), rings, active, pending_slots_max));
            }
            for (worker, outlet) in outlets.into_iter().enumerate() {
                ports_mut::<A, T>(&mut slots[upstream]).outlets[worker].push(outlet);
            }
            for (worker, inputs) in receivers.into_iter().enumerate() {
                ports_mut::<T, B>(&mut slots[downstream]).inputs[worker].extend(inputs);
            }
            Ok(())
        }));
    }

    /// Runs `to` on the threads of `from` with no ring between them: worker i of `to` runs
    /// on worker i of `from`, over what `from` emitted from each batch, to completion (see
    /// `stage/fused.rs`). Every message `from` emits reaches `to`'s worker on the same thread, so the
    /// order of each key is kept. Both must be processing stages with the same worker count,
    /// neither resizable, with `to` declared after `from`, fused after no other stage, and
    /// `from` fused into no other stage; `to` may have other inbound and outbound connections
    /// and a stage fused after it. `to`'s wait strategy, role and placement are `from`'s.
    /// A fusion that breaks these rules is refused at start.
    ///
    /// ```
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, PipelineError, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let numbers = graph.source("numbers", StageSpec::ancillary(1), |_| {
    ///     let mut next = 0u64;
    ///     move |out: &mut Emitter<u64>| {
    ///         next += 1;
    ///         out.emit(next);
    ///         if next == 10 { Flow::Stop } else { Flow::Continue }
    ///     }
    /// });
    /// let double = graph.stage("double", StageSpec::ancillary(1), |_| {
    ///     |n: &u64, out: &mut Emitter<u64>| out.emit(2 * n)
    /// });
    /// let sink = graph.sink("sink", StageSpec::ancillary(1), |_| |n: &u64| assert_eq!(n % 2, 0));
    /// graph.fuse(numbers, double); // `double` runs on the source's thread, no ring between
    /// graph.connect(double, sink, Route::RoundRobin);
    /// let report = graph.start()?.wait()?;
    /// assert_eq!(report.stages[2].messages_in, 10);
    ///
    /// // Refused: the stages have different worker counts.
    /// let mut uneven = PipelineBuilder::new().pin_threads(false);
    /// let stop = |_| |_: &mut Emitter<u8>| Flow::Stop;
    /// let two = uneven.source("two", StageSpec::ancillary(2), stop);
    /// let one = uneven.sink("one", StageSpec::ancillary(1), |_| |_: &u8| {});
    /// uneven.fuse(two, one);
    /// assert!(matches!(uneven.start(), Err(PipelineError::BadStage { .. })));
    /// # Ok::<(), PipelineError>(())
    /// ```
    pub fn fuse<A: 'static, T: Message, B: 'static>(
        &mut self,
        from: StageHandle<A, T>,
        to: StageHandle<T, B>,
    ) {
        let (upstream, downstream) = (from.index, to.index);
        self.links.push((upstream, downstream));
        self.fusions.push((upstream, downstream));
        let attach: Attach = Box::new(|slot, members| {
            let members = *members
                .downcast::<Vec<Box<dyn FusedStage<T>>>>()
                .expect("a fused StageHandle<T, B> launches FusedStage<T> workers");
            let ports = ports_mut::<A, T>(slot);
            for (next, member) in ports.next.iter_mut().zip(members) {
                *next = Some(member);
            }
        });
        self.slots[downstream].fused_into = Some((upstream, attach));
    }

    /// Per slot, the slot whose threads run it: itself, or the head of its fused chain.
    fn thread_heads(&self) -> Vec<usize> {
        let mut heads: Vec<usize> = (0..self.slots.len()).collect();
        // Validated: a fused stage comes after its upstream, so one pass in order resolves
        // chains.
        for index in 0..self.slots.len() {
            if let Some((upstream, _)) = &self.slots[index].fused_into {
                heads[index] = heads[*upstream];
            }
        }
        heads
    }

    /// Checks the graph, plans placement, builds every ring and starts every worker. Every
    /// mistake in the graph or a ring size is reported here, before any thread runs.
    ///
    /// ```
    /// use pipeline::RingError;
    /// use pipeline::stage::{Emitter, Flow, PipelineBuilder, PipelineError, Route, StageSpec};
    ///
    /// let mut graph = PipelineBuilder::new().pin_threads(false);
    /// let once = graph.source("once", StageSpec::ancillary(1), |_| {
    ///     |out: &mut Emitter<u8>| { out.emit(1); Flow::Stop }
    /// });
    /// let odd_ring = StageSpec::ancillary(1).with_ring(3, 1);
    /// let sink = graph.sink("sink", odd_ring, |_| |_: &u8| {});
    /// graph.connect(once, sink, Route::RoundRobin);
    /// let Err(PipelineError::Ring { stage, source }) = graph.start() else { panic!() };
    /// assert_eq!((stage.as_str(), source), ("sink", RingError::CapacityNotPowerOfTwo { got: 3 }));
    /// ```
    pub fn start(mut self) -> Result<RunningPipeline, PipelineError> {
        self.validate()?;
        let topology = self.topology.take().unwrap_or_else(detect_topology);
        let heads = self.thread_heads();
        self.share_fused_parkers(&heads);
        let plan = self.plan_placement(&topology, &heads);
        let waits = self.stage_waits(&plan, &heads);
        let mut slots = self.slots;
        for edge in self.edges {
            edge(&mut slots, &waits)?;
        }
        let mut running = RunningPipeline::not_started(&slots, plan);
        let mut starts = running.register_stages(&slots, &heads);
        // Launched last to first, so each fused stage's workers exist when the stage it is
        // fused after (declared before it) builds its emitters.
        let pin_threads = self.pin_threads;
        while let (Some(mut slot), Some((hub, placements))) = (slots.pop(), starts.pop()) {
            let index = slots.len();
            let fused_into = slot.fused_into.take();
            let context = LaunchContext {
                stage: slot.name,
                shared: running.shared.clone(),
                hub,
                placements,
                wait: waits[index],
                consumer_parkers: slot.consumer_parkers,
                read_batch_max: slot.spec.batch_slots_max,
                pin_threads,
                fused: fused_into.is_some(),
            };
            // On error `running` is dropped, which aborts and joins what already started.
            match (slot.launcher)(slot.ports, context)? {
                Launched::Threads(threads) => running.threads.extend(threads),
                Launched::Inputs(inputs) => running.inputs[index] = Some(inputs),
                Launched::Fused(members) => {
                    let (upstream, attach) = fused_into.expect("only fused stages launch so");
                    attach(&mut slots[upstream], members);
                }
            }
        }
        Ok(running)
    }

    /// One thread request per worker of each slot that places threads ([`places_threads`]);
    /// a thread running a fused chain is critical if any stage of the chain is.
    /// A fused stage's rings wake the thread that runs it: its head's.
    fn share_fused_parkers(&mut self, heads: &[usize]) {
        for (index, &head) in heads.iter().enumerate() {
            if head != index {
                self.slots[index].consumer_parkers = self.slots[head].consumer_parkers.clone();
            }
        }
    }

    /// Each stage's wait strategy under `plan`; a fused stage waits as its head does.
    fn stage_waits(&self, plan: &PlacementPlan, heads: &[usize]) -> Vec<WaitStrategy> {
        let mut waits: Vec<WaitStrategy> = Vec::with_capacity(self.slots.len());
        for (index, &head) in heads.iter().enumerate() {
            let own = head == index;
            waits.push(if own { effective_wait(plan, &self.slots[index]) } else { waits[head] });
        }
        waits
    }

    fn plan_placement(&self, topology: &Topology, heads: &[usize]) -> PlacementPlan {
        let mut roles: Vec<Role> = self.slots.iter().map(|slot| slot.spec.role).collect();
        for (index, &head) in heads.iter().enumerate() {
            if roles[index] == Role::Critical {
                roles[head] = Role::Critical;
            }
        }
        let requests: Vec<ThreadRequest> = self
            .slots
            .iter()
            .enumerate()
            .filter(|&(index, slot)| places_threads(slot, heads[index] == index))
            .flat_map(|(index, slot)| {
                let role = roles[index];
                (0..slot.spec.spawned_workers()).map(move |worker| ThreadRequest {
                    label: format!("{}/{worker}", slot.name),
                    role,
                })
            })
            .collect();
        let plan = PlacementPlan::new(topology, &requests);
        for note in &plan.notes {
            tracing::warn!("placement: {note}");
        }
        plan
    }

    fn validate(&self) -> Result<(), PipelineError> {
        for (index, slot) in self.slots.iter().enumerate() {
            let bad = |reason: &str| {
                Err(PipelineError::BadStage {
                    stage: slot.name.to_string(),
                    reason: reason.to_owned(),
                })
            };
            if slot.spec.workers == 0 {
                return bad("needs at least one worker");
            }
            if let Some(max_workers) = slot.spec.max_workers {
                if slot.kind != SlotKind::Stage {
                    return bad("only a processing stage or sink can be resizable");
                }
                if max_workers < slot.spec.workers {
                    return bad("max_workers is below the initial workers");
                }
            }
            if self.slots[..index].iter().any(|other| other.name == slot.name) {
                return bad("the name is used by another stage");
            }
            let inbound = self.links.iter().filter(|&&(_, to)| to == index).count();
            if slot.kind != SlotKind::Stage && inbound > 0 {
                return bad("a source or input cannot be the target of a connection");
            }
            if slot.kind == SlotKind::Stage && inbound == 0 {
                return bad("has no inbound connection, so it would never receive a message");
            }
        }
        for (position, &(upstream, downstream)) in self.fusions.iter().enumerate() {
            let (from, to) = (&self.slots[upstream], &self.slots[downstream]);
            let reason = self.fusion_problem(position, upstream, downstream);
            if let Some(reason) = reason {
                let stage = format!("{} (fused after `{}`)", to.name, from.name);
                return Err(PipelineError::BadStage { stage, reason: reason.to_owned() });
            }
        }
        match self.first_stage_on_a_cycle() {
            Some(index) => Err(PipelineError::BadStage {
                stage: self.slots[index].name.to_string(),
                reason: "is on (or fed by) a cycle of connections: bounded rings in a cycle can \
                         deadlock and a cycle never drains at shutdown"
                    .to_owned(),
            }),
            None => Ok(()),
        }
    }

    /// Why the fusion at `position` (`upstream` → `downstream`) cannot run, if it cannot.
    fn fusion_problem(
        &self,
        position: usize,
        upstream: usize,
        downstream: usize,
    ) -> Option<&'static str> {
        let (from, to) = (&self.slots[upstream], &self.slots[downstream]);
        let earlier = &self.fusions[..position];
        if !matches!(from.kind, SlotKind::Stage | SlotKind::Source) || to.kind != SlotKind::Stage {
            Some("only processing stages can be fused, after a processing stage or a source")
        } else if downstream <= upstream {
            Some("a stage can only be fused after one declared before it")
        } else if from.spec.spawned_workers() != to.spec.spawned_workers() {
            Some("fused stages need the same number of workers")
        } else if from.spec.max_workers.is_some() || to.spec.max_workers.is_some() {
            Some("fused stages cannot be resizable")
        } else if earlier.iter().any(|&(_, d)| d == downstream) {
            Some("a stage can be fused after only one stage")
        } else if earlier.iter().any(|&(u, _)| u == upstream) {
            Some("only one stage can be fused after a stage")
        } else {
            None
        }
    }

    /// Kahn's algorithm: peel off slots with no unpeeled upstream; what remains is on a cycle
    /// or downstream of one.
    fn first_stage_on_a_cycle(&self) -> Option<usize> {
        let mut inbound = vec![0usize; self.slots.len()];
        for &(_, to) in &self.links {
            inbound[to] += 1;
        }
        let mut ready: Vec<usize> = (0..self.slots.len()).filter(|&i| inbound[i] == 0).collect();
        let mut peeled = vec![false; self.slots.len()];
        while let Some(index) = ready.pop() {
            peeled[index] = true;
            for &(_, to) in self.links.iter().filter(|&&(from, _)| from == index) {
                inbound[to] -= 1;
                if inbound[to] == 0 {
                    ready.push(to);
                }
            }
        }
        peeled.iter().position(|&done| !done)
    }
}

/// Whether the plan places (and may pin) threads for `slot`: not for inputs (they run on the
/// caller's threads), fused stages (they run on their head's) or floating stages.
fn places_threads(slot: &Slot, runs_own_threads: bool) -> bool {
    slot.kind != SlotKind::Input && runs_own_threads && !slot.spec.floating
}

/// Per slot, where each worker thread it spawns runs: the plan's placements, in slot order,
/// for slots that place threads; for a floating stage, wherever the OS puts it among the CPUs
/// no exclusive placement holds ([`PlacementPlan::floating_cpus`]), so that it never preempts
/// a spinning critical thread when it wakes up; none for inputs and fused stages.
fn slot_placements(
    slots: &[Slot],
    heads: &[usize],
    plan: &PlacementPlan,
) -> Vec<Vec<ThreadPlacement>> {
    let mut planned = plan.threads.iter().cloned();
    let floating = |stage: &str, worker: usize| ThreadPlacement {
        label: format!("{stage}/{worker}"),
        role: Role::Ancillary,
        cpus: plan.floating_cpus.clone(),
        exclusive: false,
        whole_core: false,
    };
    let mut per_slot = Vec::with_capacity(slots.len());
    for (index, slot) in slots.iter().enumerate() {
        let workers = slot.spec.spawned_workers();
        let head = heads[index] == index;
        per_slot.push(if places_threads(slot, head) {
            planned.by_ref().take(workers).collect()
        } else if slot.kind != SlotKind::Input && head && slot.spec.floating {
            (0..workers).map(|worker| floating(&slot.name, worker)).collect()
        } else {
            Vec::new()
        });
    }
    per_slot
}

fn detect_topology() -> Topology {
    Topology::detect().unwrap_or_else(|error| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        tracing::warn!("placement: {error}; planning for {cpus} CPUs without SMT or socket data");
        Topology::uniform(cpus)
    })
}

fn effective_wait(plan: &PlacementPlan, slot: &Slot) -> WaitStrategy {
    let wait = plan.effective_wait(slot.spec.wait);
    if wait != slot.spec.wait {
        tracing::warn!(
            "stage `{}`: {:?} downgraded to {:?}: threads outnumber usable CPUs",
            slot.name,
            slot.spec.wait,
            wait
        );
    }
    wait
}

/// A started pipeline. Dropping it without [`RunningPipeline::wait`] aborts and joins it.
pub struct RunningPipeline {
    threads: Vec<JoinHandle<()>>,
    hubs: Vec<Arc<StageMetricsHub>>,
    /// Per slot: the not yet taken [`Input`] handles of an input slot.
    inputs: Vec<Option<Box<dyn Any + Send>>>,
    /// Per slot: its name and, if it was declared with `max_workers`, its active count.
    resizable: Vec<(Arc<str>, Option<Arc<ActiveWorkers>>)>,
    shared: Arc<Shared>,
    plan: PlacementPlan,
    joined: bool,
}

/// What a finished pipeline reports.
#[derive(Debug, Serialize)]
pub struct PipelineReport {
    /// Per stage, in declaration order: counts, utilisation and latency distributions.
    pub stages: Vec<StageMetrics>,
    /// The placement plan the pipeline ran under.
    pub placement: PlacementPlan,
    /// Workers that could not be pinned, with the reason (they ran unpinned).
    pub pin_failures: Vec<String>,
}

impl RunningPipeline {
    /// A pipeline with its shared flags and no thread yet. Abort wakes the consumer parkers:
    /// an idle worker re-checks the flag and exits. A producer parked on a full ring needs no
    /// wake-up of its own: the consumer it waits for exits too, and dropping its receiver
    /// wakes the producer (the ring's disconnect path).
    fn not_started(slots: &[Slot], plan: PlacementPlan) -> RunningPipeline {
        let parkers = slots.iter().flat_map(|s| s.consumer_parkers.iter().cloned()).collect();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            failure: Mutex::new(None),
            pin_failures: Mutex::new(Vec::new()),
            parkers,
        });
        RunningPipeline {
            threads: Vec::new(),
            hubs: Vec::new(),
            inputs: slots.iter().map(|_| None).collect(),
            resizable: Vec::new(),
            shared,
            plan,
            joined: false,
        }
    }

    /// Registers every stage's metrics hub and resizable count, in declaration order, and
    /// returns each stage's hub with the threads' placements it launches with.
    fn register_stages(
        &mut self,
        slots: &[Slot],
        heads: &[usize],
    ) -> Vec<(Arc<StageMetricsHub>, Vec<ThreadPlacement>)> {
        let mut placements = slot_placements(slots, heads, &self.plan).into_iter();
        let mut starts = Vec::with_capacity(slots.len());
        for slot in slots {
            let hub = StageMetricsHub::new(&slot.name, slot.spec.spawned_workers());
            let resizable = slot.spec.max_workers.is_some().then(|| slot.active.clone());
            self.resizable.push((slot.name.clone(), resizable));
            if slot.kind != SlotKind::Input {
                self.hubs.push(hub.clone());
            }
            starts.push((hub, placements.next().expect("one placement list per slot")));
        }
        starts
    }

    /// The placement plan in force.
    pub fn plan(&self) -> &PlacementPlan {
        &self.plan
    }

    /// The [`Input`] handles of the input declared as `input`; `None` if already taken or if
    /// `input` names a source rather than an input.
    pub fn take_inputs<T: Message>(&mut self, input: StageHandle<(), T>) -> Option<Vec<Input<T>>> {
        let handles = self.inputs.get_mut(input.index)?.take()?;
        Some(*handles.downcast::<Vec<Input<T>>>().expect("a StageHandle<(), T> names Input<T>s"))
    }

    /// Routes new messages of `stage`'s upstream to its first `workers` workers only; the
    /// others finish what they already received, then idle (see [`crate::active`] for why no
    /// message is lost). The stage must have been declared with [`StageSpec::max_workers`].
    pub fn resize<In, Out>(
        &self,
        stage: StageHandle<In, Out>,
        workers: usize,
    ) -> Result<(), PipelineError> {
        let active = self.active_of(stage)?;
        active.set(workers).map_err(|error| self.bad_stage(stage.index, error.to_string()))
    }

    /// Workers of `stage` currently receiving messages, and the most it can have.
    pub fn active_workers<In, Out>(
        &self,
        stage: StageHandle<In, Out>,
    ) -> Result<(usize, usize), PipelineError> {
        let active = self.active_of(stage)?;
        Ok((active.get(), active.max()))
    }

    fn active_of<In, Out>(
        &self,
        stage: StageHandle<In, Out>,
    ) -> Result<&ActiveWorkers, PipelineError> {
        let resizable = self.resizable[stage.index].1.as_deref();
        resizable.ok_or_else(|| {
            self.bad_stage(stage.index, "was not declared resizable (max_workers)".into())
        })
    }

    fn bad_stage(&self, index: usize, reason: String) -> PipelineError {
        PipelineError::BadStage { stage: self.resizable[index].0.to_string(), reason }
    }

    /// A live snapshot of every stage (lags by up to `metrics::PUBLISH_INTERVAL_NS`).
    pub fn metrics(&self) -> Vec<StageMetrics> {
        self.hubs.iter().map(|hub| hub.snapshot()).collect()
    }

    /// Asks every source to stop; the messages already emitted still drain to the sinks.
    pub fn stop(&self) {
        // Relaxed: a request flag; see `run_source`.
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for every worker to finish (sources stopped, everything drained) and reports.
    pub fn wait(mut self) -> Result<PipelineReport, PipelineError> {
        self.join_all();
        if let Some(error) =
            self.shared.failure.lock().unwrap_or_else(PoisonError::into_inner).take()
        {
            return Err(error);
        }
        let pin_failures = std::mem::take(
            &mut *self.shared.pin_failures.lock().unwrap_or_else(PoisonError::into_inner),
        );
        Ok(PipelineReport { stages: self.metrics(), placement: self.plan.clone(), pin_failures })
    }

    /// [`RunningPipeline::stop`], then [`RunningPipeline::wait`]: a clean, draining shutdown.
    pub fn shutdown(self) -> Result<PipelineReport, PipelineError> {
        self.stop();
        self.wait()
    }

    fn join_all(&mut self) {
        for thread in self.threads.drain(..) {
            // Worker bodies catch their panics; a join error can only come from the pin or
            // metrics code around them, and the failure slot already explains the outcome.
            drop(thread.join());
        }
        self.joined = true;
    }
}

impl Drop for RunningPipeline {
    fn drop(&mut self) {
        if !self.joined {
            self.shared.abort();
            self.join_all();
        }
    }
}
