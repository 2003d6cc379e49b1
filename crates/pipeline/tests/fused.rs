//! Fused stages: per-key order on the fused thread and beyond it, fan-in into a fused stage,
//! a draining shutdown, panics naming the fused stage, per-stage metrics, one thread per
//! fused chain in the placement plan, and the rules `fuse` enforces.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use pipeline::WaitStrategy;
use pipeline::placement::{Topology, current_affinity};
use pipeline::stage::{
    Emitter, Flow, PipelineBuilder, PipelineError, PipelineReport, Route, StageSpec, StageWorker,
};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tick {
    id: u64,
    key: u64,
    seq: u64,
    /// The thread that handled it in the head stage (checked again in the fused one).
    thread: u64,
}

const FINISH_WITHIN: Duration = Duration::from_secs(20);

fn wait_bounded(
    wait: impl FnOnce() -> Result<PipelineReport, PipelineError> + Send + 'static,
) -> Result<PipelineReport, PipelineError> {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || done.send(wait()).unwrap());
    result.recv_timeout(FINISH_WITHIN).expect("pipeline did not finish in time (hang)")
}

fn thread_id() -> u64 {
    // A distinct number per live thread: the address of a thread-local.
    thread_local!(static MARK: u8 = const { 0 });
    MARK.with(|mark| std::ptr::from_ref(mark) as u64)
}

/// Ticks `first..first + count` over `keys` keys, a few per call; `seq` counts per key.
fn source(first: u64, count: u64, keys: u64) -> impl FnMut(&mut Emitter<Tick>) -> Flow {
    let mut next = 0;
    move |out| {
        for _ in 0..5 {
            if next == count {
                return Flow::Stop;
            }
            let id = first + next;
            out.emit(Tick { id, key: id % keys, seq: id / keys, thread: 0 });
            next += 1;
        }
        Flow::Continue
    }
}

/// Checks per-key order of ticks with `id < ordered_below` (one source's ticks) and counts.
struct OrderCheck {
    ordered_below: u64,
    last_seq: HashMap<u64, u64>,
    seen: u64,
    /// In the fused stage: the tick must still be on the head stage's thread.
    same_thread: bool,
}

impl OrderCheck {
    fn new(ordered_below: u64, same_thread: bool) -> OrderCheck {
        OrderCheck { ordered_below, last_seq: HashMap::new(), seen: 0, same_thread }
    }
}

impl StageWorker<Tick, Tick> for OrderCheck {
    type Finished = u64;

    fn handle(&mut self, tick: &Tick, out: &mut Emitter<Tick>) {
        self.seen += 1;
        if tick.id < self.ordered_below {
            if let Some(&last) = self.last_seq.get(&tick.key) {
                assert_eq!(tick.seq, last + 1, "key {} out of order", tick.key);
            }
            self.last_seq.insert(tick.key, tick.seq);
            if self.same_thread {
                assert_eq!(tick.thread, thread_id(), "fused stage ran on another thread");
            }
        }
        out.emit(*tick);
    }

    fn finish(self) -> u64 {
        self.seen
    }
}

#[test]
fn fused_stages_keep_key_order_take_fan_in_and_drain_on_one_thread_per_worker() {
    const COUNT: u64 = 30_000;
    const SIDE_COUNT: u64 = 5_000;
    const KEYS: u64 = 11;
    let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(16));
    let feed = graph.source("gen", StageSpec::ancillary(1), |_| source(0, COUNT, KEYS));
    let side = graph.source("side", StageSpec::ancillary(1), |_| source(COUNT, SIDE_COUNT, KEYS));
    let head = graph.stage("head", StageSpec::ancillary(2).with_ring(64, 16), |_| {
        |tick: &Tick, out: &mut Emitter<Tick>| out.emit(Tick { thread: thread_id(), ..*tick })
    });
    let (fused, fused_seen) = graph
        .stage_with_results("fused", StageSpec::ancillary(2), |_| OrderCheck::new(COUNT, true));
    let (after, after_seen) = graph
        .stage_with_results("after", StageSpec::ancillary(1), |_| OrderCheck::new(COUNT, false));
    let delivered = Arc::new(AtomicU64::new(0));
    let counted = delivered.clone();
    let sink = graph.sink("sink", StageSpec::ancillary(1), move |_| {
        let counted = counted.clone();
        move |_: &Tick| {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    graph.connect(feed, head, Route::by_key(|t: &Tick| t.key));
    graph.fuse(head, fused);
    // Fan-in into the fused stage from a ring, polled by the head's threads.
    graph.connect(side, fused, Route::by_key(|t: &Tick| t.key));
    graph.connect(fused, after, Route::RoundRobin);
    graph.fuse(after, sink);
    let running = graph.start().unwrap();
    // Threads: gen, side, head x2 (running `fused`), after (running `sink`).
    assert_eq!(running.plan().threads.len(), 5, "{:?}", running.plan().threads);
    let report = wait_bounded(move || running.wait()).unwrap();
    let total = COUNT + SIDE_COUNT;
    assert_eq!(fused_seen.take().unwrap().iter().sum::<u64>(), total);
    assert_eq!(after_seen.take().unwrap(), vec![total]);
    assert_eq!(delivered.load(Ordering::Relaxed), total, "drained: every tick reached the sink");
    let named = |name: &str| report.stages.iter().find(|s| s.stage == name).unwrap();
    assert_eq!(named("head").messages_in, COUNT);
    assert_eq!(named("fused").messages_in, total);
    assert_eq!(named("fused").messages_out, total);
    assert_eq!(named("sink").messages_in, total);
}

#[test]
fn fused_stages_report_service_time_hop_latency_and_end_to_end() {
    const COUNT: u64 = 4_000;
    let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(16));
    let feed = graph.source("gen", StageSpec::ancillary(1), |_| source(0, COUNT, 3));
    let work = graph.stage("work", StageSpec::ancillary(1), |_| {
        |tick: &Tick, out: &mut Emitter<Tick>| {
            // Measurable work: about a microsecond per message.
            let start = std::time::Instant::now();
            while start.elapsed() < Duration::from_micros(1) {
                std::hint::spin_loop();
            }
            out.emit(*tick);
        }
    });
    let sink = graph.sink("sink", StageSpec::ancillary(1), |_| |_: &Tick| {});
    graph.connect(feed, work, Route::RoundRobin);
    graph.fuse(work, sink);
    let running = graph.start().unwrap();
    let report = wait_bounded(move || running.wait()).unwrap();
    let named = |name: &str| report.stages.iter().find(|s| s.stage == name).unwrap();
    let (work, sink) = (named("work"), named("sink"));
    assert_eq!(work.messages_in, COUNT);
    assert_eq!(work.service_ns.count, COUNT);
    assert!(work.service_ns.p50 >= 1_000, "{:?}", work.service_ns);
    // The fused stage: one sample per message (the batch mean), hand-off latency from the
    // upstream's start of handling, and end-to-end latency (it is the last stage).
    assert_eq!(sink.messages_in, COUNT);
    assert_eq!(sink.service_ns.count, COUNT);
    assert_eq!(sink.hop_latency_ns.count, COUNT);
    assert!(sink.hop_latency_ns.p50 >= 1_000, "includes the upstream's work: {sink:?}");
    assert_eq!(sink.end_to_end_ns.count, COUNT);
    assert_eq!(work.end_to_end_ns.count, 0, "not the last stage any more");
    assert!(
        sink.busy_ns > 0 && sink.busy_ns < work.busy_ns,
        "{} vs {}",
        sink.busy_ns,
        work.busy_ns
    );
}

#[test]
fn a_panic_in_a_fused_stage_names_that_stage() {
    for wait in [WaitStrategy::Park, WaitStrategy::default()] {
        let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(16));
        let feed = graph
            .source("gen", StageSpec::ancillary(1).with_wait(wait), |_| source(0, u64::MAX, 5));
        let head = graph.stage("head", StageSpec::ancillary(1).with_wait(wait), |_| {
            |tick: &Tick, out: &mut Emitter<Tick>| out.emit(*tick)
        });
        let middle = graph.stage("middle", StageSpec::ancillary(1), |_| {
            |tick: &Tick, out: &mut Emitter<Tick>| {
                assert_ne!(tick.id, 700, "bad tick");
                out.emit(*tick)
            }
        });
        let last = graph.sink("last", StageSpec::ancillary(1), |_| |_: &Tick| {});
        graph.connect(feed, head, Route::RoundRobin);
        graph.fuse(head, middle);
        graph.fuse(middle, last);
        let running = graph.start().unwrap();
        match wait_bounded(move || running.wait()) {
            Err(PipelineError::StagePanicked { stage, worker, message }) => {
                assert_eq!((stage.as_str(), worker), ("middle", 0), "{message}");
                assert!(message.contains("bad tick"), "{message}");
            }
            other => panic!("expected the fused stage's panic, got {other:?}", other = other.err()),
        }
    }
}

#[test]
fn shutdown_drains_what_the_fused_chain_holds() {
    let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(16));
    let feed = graph.source("gen", StageSpec::ancillary(1), |_| {
        let mut next = 0;
        move |out: &mut Emitter<Tick>| {
            out.emit(Tick { id: next, ..Tick::default() });
            next += 1;
            Flow::Continue
        }
    });
    let head = graph.stage("head", StageSpec::ancillary(1).with_ring(16, 4), |_| {
        |tick: &Tick, out: &mut Emitter<Tick>| {
            // Each input makes three outputs: more than the fused hand-off holds per batch
            // (at most 4 inputs a batch here), in order.
            for _ in 0..3 {
                out.emit(*tick);
            }
        }
    });
    let emitted = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let (emitted_by_head, received_by_sink) = (emitted.clone(), received.clone());
    let count = graph.stage("count", StageSpec::ancillary(1), move |_| {
        let emitted = emitted_by_head.clone();
        move |tick: &Tick, out: &mut Emitter<Tick>| {
            emitted.fetch_add(1, Ordering::Relaxed);
            out.emit(*tick);
        }
    });
    let sink = graph.sink("sink", StageSpec::ancillary(1), move |_| {
        let received = received_by_sink.clone();
        move |_: &Tick| {
            received.fetch_add(1, Ordering::Relaxed);
        }
    });
    graph.connect(feed, head, Route::RoundRobin);
    graph.fuse(head, count);
    graph.connect(count, sink, Route::RoundRobin);
    let running = graph.start().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let report = wait_bounded(move || running.shutdown()).unwrap();
    let named = |name: &str| report.stages.iter().find(|s| s.stage == name).unwrap();
    let sent = named("head").messages_in;
    assert!(sent > 0);
    assert_eq!(emitted.load(Ordering::Relaxed), 3 * sent, "every output reached the fused stage");
    assert_eq!(received.load(Ordering::Relaxed), 3 * sent, "and left it before the stop");
}

#[test]
fn fusions_the_runtime_cannot_run_are_rejected_with_a_reason() {
    type Graph = PipelineBuilder;
    type Build = Box<dyn Fn(&mut Graph)>;
    let pass = |_: usize| |tick: &Tick, out: &mut Emitter<Tick>| out.emit(*tick);
    let cases: [(&str, Build); 4] = [
        (
            "the same number of workers",
            Box::new(move |g: &mut Graph| {
                let feed = g.source("gen", StageSpec::ancillary(1), |_| source(0, 10, 2));
                let a = g.stage("a", StageSpec::ancillary(2), pass);
                let b = g.stage("b", StageSpec::ancillary(1), pass);
                g.connect(feed, a, Route::RoundRobin);
                g.fuse(a, b);
            }),
        ),
        (
            "declared before it",
            Box::new(move |g: &mut Graph| {
                let feed = g.source("gen", StageSpec::ancillary(1), |_| source(0, 10, 2));
                let b = g.stage("b", StageSpec::ancillary(1), pass);
                let a = g.stage("a", StageSpec::ancillary(1), pass);
                g.connect(feed, a, Route::RoundRobin);
                g.fuse(a, b);
            }),
        ),
        (
            "only one stage can be fused after",
            Box::new(move |g: &mut Graph| {
                let feed = g.source("gen", StageSpec::ancillary(1), |_| source(0, 10, 2));
                let a = g.stage("a", StageSpec::ancillary(1), pass);
                let b = g.stage("b", StageSpec::ancillary(1), pass);
                let c = g.stage("c", StageSpec::ancillary(1), pass);
                g.connect(feed, a, Route::RoundRobin);
                g.fuse(a, b);
                g.fuse(a, c);
            }),
        ),
        (
            "cannot be resizable",
            Box::new(move |g: &mut Graph| {
                let feed = g.source("gen", StageSpec::ancillary(1), |_| source(0, 10, 2));
                let a = g.stage("a", StageSpec::ancillary(1), pass);
                let b = g.stage("b", StageSpec::ancillary(1).with_max_workers(1), pass);
                g.connect(feed, a, Route::RoundRobin);
                g.fuse(a, b);
            }),
        ),
    ];
    for (expected, build) in cases {
        let mut graph = PipelineBuilder::new().pin_threads(false);
        build(&mut graph);
        match graph.start() {
            Err(PipelineError::BadStage { stage, reason }) => {
                assert!(reason.contains(expected), "{stage}: {reason}");
                assert!(stage.contains("fused after"), "{stage}");
            }
            other => panic!("{expected}: expected a rejection, got {:?}", other.err()),
        }
    }
}

#[test]
fn floating_stages_take_no_cpu_in_the_plan() {
    let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(2));
    let feed = graph.source("gen", StageSpec::critical(1), |_| source(0, 1_000, 2));
    let idle = graph.sink(
        "idle",
        StageSpec::ancillary(1).with_wait(WaitStrategy::Park).floating(),
        |_| |_: &Tick| {},
    );
    let other = graph.sink("other", StageSpec::ancillary(1).floating(), |_| |_: &Tick| {});
    graph.connect(feed, idle, Route::RoundRobin);
    graph.connect(feed, other, Route::RoundRobin);
    let running = graph.start().unwrap();
    let plan = running.plan().clone();
    let report = wait_bounded(move || running.wait()).unwrap();
    assert_eq!(plan.threads.len(), 1, "{:?}", plan.threads);
    assert!(!plan.oversubscribed, "3 threads, 2 CPUs, but only one needs a CPU of its own");
    assert_eq!(report.stages.iter().find(|s| s.stage == "idle").unwrap().messages_in, 1_000);
}

#[test]
fn a_floating_stage_runs_on_the_cpus_no_exclusive_thread_holds() {
    let mut graph = PipelineBuilder::new();
    let feed = graph.source("gen", StageSpec::critical(1), |_| source(0, 100, 2));
    let seen = Arc::new(std::sync::Mutex::new(None));
    let record = seen.clone();
    let idle = graph.sink("idle", StageSpec::ancillary(1).floating(), move |_| {
        let record = record.clone();
        move |_: &Tick| {
            record.lock().unwrap().get_or_insert_with(|| current_affinity().unwrap());
        }
    });
    graph.connect(feed, idle, Route::RoundRobin);
    let running = graph.start().unwrap();
    let plan = running.plan().clone();
    let report = wait_bounded(move || running.wait()).unwrap();
    assert!(report.pin_failures.is_empty(), "{:?}", report.pin_failures);
    let critical = &plan.threads[0];
    let floating = seen.lock().unwrap().clone().expect("the sink handled a message");
    assert_eq!(floating, plan.floating_cpus, "{plan:?}");
    let usable = Topology::detect().unwrap().usable_cpus;
    if critical.exclusive && usable.len() > 1 {
        assert!(!floating.iter().any(|cpu| critical.cpus.contains(cpu)), "{plan:?}");
    }
}

/// A head stage whose worker feeds a fused stage through an input handle (as the tier's
/// pre-process feeds its rejects to the R-Processor) and closes it when it finishes.
struct Feeder {
    side: Arc<std::sync::Mutex<Option<pipeline::stage::Input<Tick>>>>,
    input: Option<pipeline::stage::Input<Tick>>,
}

impl StageWorker<Tick, Tick> for Feeder {
    type Finished = ();

    fn handle(&mut self, tick: &Tick, out: &mut Emitter<Tick>) {
        let side = &self.side;
        let input = self.input.get_or_insert_with(|| side.lock().unwrap().take().unwrap());
        input.send(*tick).unwrap();
        input.flush().unwrap();
        out.emit(*tick);
    }

    fn finish(self) {}
}

#[test]
fn a_head_that_feeds_its_fused_stage_through_a_ring_finishes_first_and_the_chain_drains() {
    const COUNT: u64 = 3_000;
    let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(16));
    let feed = graph.input::<Tick>("feed", 1);
    let side = graph.input::<Tick>("side", 1);
    let slot = Arc::new(std::sync::Mutex::new(None));
    let slot_in_head = slot.clone();
    let (head, _) = graph.stage_with_results("head", StageSpec::ancillary(1), move |_| Feeder {
        side: slot_in_head.clone(),
        input: None,
    });
    let (tail, seen) =
        graph.stage_with_results("tail", StageSpec::ancillary(1), |_| OrderCheck::new(0, false));
    graph.connect(feed, head, Route::RoundRobin);
    graph.fuse(head, tail);
    graph.connect(side, tail, Route::RoundRobin);
    let mut running = graph.start().unwrap();
    // The head's handle exists before the first message does.
    *slot.lock().unwrap() = running.take_inputs(side).unwrap().pop();
    let mut feed = running.take_inputs(feed).unwrap().pop().unwrap();
    for id in 0..COUNT {
        feed.send(Tick { id, ..Tick::default() }).unwrap();
    }
    drop(feed);
    wait_bounded(move || running.wait()).unwrap();
    assert_eq!(seen.take().unwrap(), vec![2 * COUNT], "the fused and the ring copy of each");
}

#[test]
fn a_stage_fused_after_a_source_runs_on_its_thread_in_order_and_drains_its_fan_in() {
    const COUNT: u64 = 20_000;
    const SIDE_COUNT: u64 = 3_000;
    const KEYS: u64 = 4;
    let mut graph = PipelineBuilder::new().pin_threads(false).topology(Topology::uniform(16));
    let feed = graph.source("gen", StageSpec::ancillary(1), |_| {
        let mut next = 0;
        move |out: &mut Emitter<Tick>| {
            if next == COUNT {
                return Flow::Stop;
            }
            let (id, thread) = (next, thread_id());
            out.emit(Tick { id, key: id % KEYS, seq: id / KEYS, thread });
            next += 1;
            Flow::Continue
        }
    });
    let side = graph.source("side", StageSpec::ancillary(1), |_| source(COUNT, SIDE_COUNT, KEYS));
    let (checked, results) = graph
        .stage_with_results("check", StageSpec::ancillary(1), |_| OrderCheck::new(COUNT, true));
    graph.fuse(feed, checked);
    graph.connect(side, checked, Route::RoundRobin);
    let running = graph.start().unwrap();
    let report = wait_bounded(move || running.wait()).unwrap();
    let seen = results.take().expect("the fused stage finished");
    assert_eq!(seen, [COUNT + SIDE_COUNT], "the source's ticks and the fan-in ring's, drained");
    let checked = report.stages.iter().find(|s| s.stage == "check").unwrap();
    assert_eq!(checked.messages_in, COUNT + SIDE_COUNT);
}
