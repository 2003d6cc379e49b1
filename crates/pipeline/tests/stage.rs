//! Stage runtime: ordering under keyed fan-out, no loss or duplication across a multi-stage
//! graph (both connector kinds), panics become errors naming the stage, shutdown drains.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use pipeline::placement::Topology;
use pipeline::stage::{
    Emitter, Flow, PipelineBuilder, PipelineError, PipelineReport, Route, StageResults, StageSpec,
    StageWorker,
};
use pipeline::{ConnectorKind, WaitStrategy};

/// A test message: `key` selects the ordering domain, `seq` counts within it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tick {
    id: u64,
    key: u64,
    seq: u64,
    worker: u64,
}

/// Generous bound for "stops in bounded time" on a loaded 2-core machine.
const FINISH_WITHIN: Duration = Duration::from_secs(20);

/// A source worker emitting `count` ticks, ids `first_id..first_id + count`, over `keys` keys,
/// a few per call.
fn counting_source(first_id: u64, count: u64, keys: u64) -> impl FnMut(&mut Emitter<Tick>) -> Flow {
    let mut next = 0;
    move |out| {
        for _ in 0..7 {
            if next == count {
                return Flow::Stop;
            }
            let id = first_id + next;
            out.emit(Tick { id, key: id % keys, seq: id / keys, worker: 0 });
            next += 1;
        }
        Flow::Continue
    }
}

/// Runs `wait` on a helper thread so a hang fails the test instead of blocking it forever.
fn wait_bounded(
    wait: impl FnOnce() -> Result<PipelineReport, PipelineError> + Send + 'static,
) -> Result<PipelineReport, PipelineError> {
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || done.send(wait()).unwrap());
    result.recv_timeout(FINISH_WITHIN).expect("pipeline did not finish in time (hang)")
}

fn stage<'a>(report: &'a PipelineReport, name: &str) -> &'a pipeline::metrics::StageMetrics {
    report.stages.iter().find(|s| s.stage == name).unwrap()
}

#[test]
fn keyed_fan_out_keeps_each_keys_order_and_worker() {
    const COUNT: u64 = 20_000;
    const KEYS: u64 = 13;
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let source = graph.source("gen", StageSpec::ancillary(1), |_| counting_source(0, COUNT, KEYS));
    let work = graph.stage("work", StageSpec::ancillary(3).with_ring(64, 16), |worker| {
        move |tick: &Tick, out: &mut Emitter<Tick>| {
            out.emit(Tick { worker: worker as u64, ..*tick })
        }
    });
    let received = Arc::new(AtomicU64::new(0));
    let received_in_sink = received.clone();
    let sink = graph.sink("check", StageSpec::ancillary(1), move |_| {
        let received = received_in_sink.clone();
        let mut last_seq: HashMap<u64, u64> = HashMap::new();
        let mut worker_of_key: HashMap<u64, u64> = HashMap::new();
        move |tick: &Tick| {
            if let Some(&last) = last_seq.get(&tick.key) {
                assert!(
                    tick.seq == last + 1,
                    "key {} out of order: {} after {last}",
                    tick.key,
                    tick.seq
                );
            }
            last_seq.insert(tick.key, tick.seq);
            let worker = *worker_of_key.entry(tick.key).or_insert(tick.worker);
            assert_eq!(worker, tick.worker, "key {} handled by two workers", tick.key);
            received.fetch_add(1, Ordering::Relaxed);
        }
    });
    graph.connect(source, work, Route::by_key(|tick: &Tick| tick.key));
    graph.connect(work, sink, Route::RoundRobin);
    let running = graph.start().unwrap();
    let report = wait_bounded(move || running.wait()).unwrap();
    assert_eq!(received.load(Ordering::Relaxed), COUNT);
    assert_eq!(stage(&report, "work").messages_in, COUNT);
    assert_eq!(stage(&report, "check").messages_in, COUNT);
}

/// Counts, per id, how often a sink saw it.
fn id_counter(total: u64) -> Arc<Mutex<Vec<u8>>> {
    Arc::new(Mutex::new(vec![0; total as usize]))
}

fn counting_sink(
    seen: &Arc<Mutex<Vec<u8>>>,
) -> impl FnMut(usize) -> Box<dyn FnMut(&Tick) + Send> + use<> {
    let seen = seen.clone();
    move |_| {
        let seen = seen.clone();
        Box::new(move |tick: &Tick| seen.lock().unwrap()[tick.id as usize] += 1)
    }
}

fn multi_stage_graph_delivers_everything_exactly_once(kind: ConnectorKind) {
    const PER_SOURCE: u64 = 10_000;
    const TOTAL: u64 = 2 * PER_SOURCE;
    let ring = |spec: StageSpec| spec.with_ring(64, 16).with_connector(kind);
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let source = graph.source("gen", ring(StageSpec::ancillary(2)), |worker| {
        counting_source(worker as u64 * PER_SOURCE, PER_SOURCE, 5)
    });
    // Fan-in 2→2 round-robin, then a broadcast to two sinks: one keyed 2→3, one fan-in 2→1.
    let double = graph.stage("double", ring(StageSpec::ancillary(2)), |_| {
        |tick: &Tick, out: &mut Emitter<Tick>| out.emit(*tick)
    });
    let (keyed_seen, merged_seen) = (id_counter(TOTAL), id_counter(TOTAL));
    let keyed = graph.sink("keyed", ring(StageSpec::ancillary(3)), counting_sink(&keyed_seen));
    let merged = graph.sink("merged", ring(StageSpec::ancillary(1)), counting_sink(&merged_seen));
    graph.connect(source, double, Route::RoundRobin);
    graph.connect(double, keyed, Route::by_key(|tick: &Tick| tick.key));
    graph.connect(double, merged, Route::RoundRobin);
    let running = graph.start().unwrap();
    let report = wait_bounded(move || running.wait()).unwrap();

    for (name, seen) in [("keyed", &keyed_seen), ("merged", &merged_seen)] {
        let seen = seen.lock().unwrap();
        let wrong: Vec<(usize, u8)> =
            seen.iter().copied().enumerate().filter(|&(_, times)| times != 1).take(5).collect();
        assert!(wrong.is_empty(), "{kind:?} sink {name}: (id, times seen) {wrong:?}");
    }
    assert_eq!(stage(&report, "gen").messages_out, TOTAL);
    assert_eq!(stage(&report, "double").messages_in, TOTAL);
    assert_eq!(stage(&report, "double").messages_out, TOTAL, "one emit reaches both sinks");
    assert_eq!(stage(&report, "keyed").messages_in, TOTAL);
    assert_eq!(stage(&report, "merged").messages_in, TOTAL);
}

#[test]
fn multi_stage_graph_delivers_everything_exactly_once_lock_free() {
    multi_stage_graph_delivers_everything_exactly_once(ConnectorKind::LockFree);
}

#[test]
fn multi_stage_graph_delivers_everything_exactly_once_blocking() {
    multi_stage_graph_delivers_everything_exactly_once(ConnectorKind::Blocking);
}

/// An endless source → `middle` → `last`; `panic_in` names the stage whose handler panics.
fn run_with_panic_in(panic_in: &str, wait: WaitStrategy) -> PipelineError {
    let spec = StageSpec::critical(1).with_wait(wait).with_ring(16, 4);
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let source = graph.source("gen", spec, |_| {
        let mut id = 0;
        move |out: &mut Emitter<Tick>| {
            id += 1;
            out.emit(Tick { id, ..Tick::default() });
            Flow::Continue
        }
    });
    let middle_panics = panic_in == "middle";
    let middle = graph.stage("middle", spec, move |_| {
        move |tick: &Tick, out: &mut Emitter<Tick>| {
            assert!(!(middle_panics && tick.id == 500), "bad tick {}", tick.id);
            out.emit(*tick);
        }
    });
    let last_panics = panic_in == "last";
    let last = graph.sink("last", spec, move |_| {
        move |tick: &Tick| assert!(!(last_panics && tick.id == 500), "bad tick {}", tick.id)
    });
    graph.connect(source, middle, Route::RoundRobin);
    graph.connect(middle, last, Route::RoundRobin);
    let running = graph.start().unwrap();
    wait_bounded(move || running.wait()).unwrap_err()
}

#[test]
fn a_panicking_handler_stops_the_pipeline_with_an_error_naming_the_stage() {
    for (stage, wait) in [
        ("middle", WaitStrategy::default()),
        ("last", WaitStrategy::Park),
        ("middle", WaitStrategy::SpinYield { spins: 100 }),
    ] {
        match run_with_panic_in(stage, wait) {
            PipelineError::StagePanicked { stage: failed, worker, message } => {
                assert_eq!((failed.as_str(), worker), (stage, 0));
                assert!(message.contains("bad tick 500"), "{message}");
            }
            other => panic!("expected a panic error for {stage}, got {other}"),
        }
    }
}

#[test]
fn shutdown_drains_in_flight_messages_and_reports_metrics() {
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let source = graph.source("gen", StageSpec::ancillary(1).with_ring(256, 32), |_| {
        let mut id = 0;
        move |out: &mut Emitter<Tick>| {
            id += 1;
            out.emit(Tick { id, ..Tick::default() });
            Flow::Continue
        }
    });
    // A slow stage keeps its inbound ring full, so shutdown finds messages in flight.
    let slow = graph.stage("slow", StageSpec::ancillary(1).with_ring(256, 32), |_| {
        |tick: &Tick, out: &mut Emitter<Tick>| {
            std::hint::black_box((0..200).sum::<u64>());
            out.emit(*tick);
        }
    });
    let last_id = Arc::new(AtomicU64::new(0));
    let last_id_in_sink = last_id.clone();
    let sink = graph.sink("sink", StageSpec::ancillary(1), move |_| {
        let last_id = last_id_in_sink.clone();
        move |tick: &Tick| last_id.store(tick.id, Ordering::Relaxed)
    });
    graph.connect(source, slow, Route::RoundRobin);
    graph.connect(slow, sink, Route::RoundRobin);
    let running = graph.start().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let live = running.metrics();
    assert_eq!(live.len(), 3);
    let report = wait_bounded(move || running.shutdown()).unwrap();

    let emitted = stage(&report, "gen").messages_out;
    assert!(emitted > 0);
    assert_eq!(stage(&report, "slow").messages_in, emitted, "nothing dropped at shutdown");
    assert_eq!(stage(&report, "sink").messages_in, emitted);
    assert_eq!(last_id.load(Ordering::Relaxed), emitted, "the last message emitted arrived last");

    let sink_metrics = stage(&report, "sink");
    assert_eq!(sink_metrics.end_to_end_ns.count, emitted, "sinks record end-to-end latency");
    assert_eq!(sink_metrics.hop_latency_ns.count, emitted);
    assert!(sink_metrics.end_to_end_ns.max >= sink_metrics.hop_latency_ns.min);
    let slow_metrics = stage(&report, "slow");
    assert_eq!(slow_metrics.end_to_end_ns.count, 0, "only stages without downstream record it");
    assert_eq!(slow_metrics.service_ns.count, emitted);
    assert!(slow_metrics.utilization > 0.0 && slow_metrics.utilization <= 1.0);
    assert!(slow_metrics.queue_depth_slots.count > 0);
    let json = serde_json::to_string(&report).unwrap();
    assert!(json.contains("\"hop_latency_ns\"") && json.contains("\"oversubscribed\""), "{json}");
}

#[test]
fn oversubscribed_busy_spin_stages_are_downgraded_and_still_finish() {
    let mut graph = PipelineBuilder::new().topology(Topology::uniform(1));
    let spin = StageSpec::critical(2).with_wait(WaitStrategy::BusySpin).with_ring(16, 4);
    let source = graph.source("gen", spin, |worker| counting_source(worker as u64 * 1000, 1000, 3));
    let count = Arc::new(AtomicU64::new(0));
    let count_in_sink = count.clone();
    let sink = graph.sink("sink", spin, move |_| {
        let count = count_in_sink.clone();
        move |_: &Tick| {
            count.fetch_add(1, Ordering::Relaxed);
        }
    });
    graph.connect(source, sink, Route::by_key(|tick: &Tick| tick.key));
    let running = graph.start().unwrap();
    assert!(running.plan().oversubscribed);
    let report = wait_bounded(move || running.wait()).unwrap();
    assert_eq!(count.load(Ordering::Relaxed), 2000);
    assert!(report.placement.notes.iter().any(|n| n.contains("oversubscribed")));
}

#[test]
fn invalid_graphs_are_rejected_with_the_stage_named() {
    let start_error = |build: &dyn Fn(&mut PipelineBuilder)| {
        let mut graph = PipelineBuilder::new().pin_threads(false);
        build(&mut graph);
        match graph.start() {
            Ok(_) => panic!("graph should be rejected"),
            Err(error) => error.to_string(),
        }
    };
    let passthrough = |_| |tick: &Tick, out: &mut Emitter<Tick>| out.emit(*tick);
    let error = start_error(&|graph| {
        graph.stage::<Tick, Tick, _>("orphan", StageSpec::ancillary(1), passthrough);
    });
    assert!(error.contains("orphan") && error.contains("no inbound connection"), "{error}");

    let error = start_error(&|graph| {
        let source = graph.source("gen", StageSpec::ancillary(1), |_| counting_source(0, 1, 1));
        let zero = graph.stage("zero", StageSpec::ancillary(0), passthrough);
        graph.connect(source, zero, Route::RoundRobin);
    });
    assert!(error.contains("zero") && error.contains("at least one worker"), "{error}");

    let error = start_error(&|graph| {
        let source = graph.source("gen", StageSpec::ancillary(1), |_| counting_source(0, 1, 1));
        let odd = graph.stage("odd", StageSpec::ancillary(1).with_ring(100, 10), passthrough);
        graph.connect(source, odd, Route::RoundRobin);
    });
    assert!(error.contains("odd") && error.contains("power of two"), "{error}");

    let error = start_error(&|graph| {
        let first = graph.source("gen", StageSpec::ancillary(1), |_| counting_source(0, 1, 1));
        let second = graph.stage("gen", StageSpec::ancillary(1), passthrough);
        graph.connect(first, second, Route::RoundRobin);
    });
    assert!(error.contains("used by another stage"), "{error}");

    let error = start_error(&|graph| {
        let source = graph.source("gen", StageSpec::ancillary(1), |_| counting_source(0, 1, 1));
        let ping = graph.stage("ping", StageSpec::ancillary(1), passthrough);
        let pong = graph.stage("pong", StageSpec::ancillary(1), passthrough);
        graph.connect(source, ping, Route::RoundRobin);
        graph.connect(ping, pong, Route::RoundRobin);
        graph.connect(pong, ping, Route::RoundRobin);
    });
    assert!(error.contains("ping") && error.contains("cycle"), "{error}");
}

#[test]
fn pinned_workers_run_on_their_planned_cpus() {
    let topology = Topology::detect().unwrap();
    let mut graph = PipelineBuilder::new().topology(topology.clone());
    let source = graph.source("gen", StageSpec::ancillary(1), |_| counting_source(0, 100, 1));
    let affinity = Arc::new(Mutex::new(Vec::new()));
    let affinity_in_sink = affinity.clone();
    let sink = graph.sink("sink", StageSpec::ancillary(1), move |_| {
        let affinity = affinity_in_sink.clone();
        move |_: &Tick| *affinity.lock().unwrap() = pipeline::placement::current_affinity().unwrap()
    });
    graph.connect(source, sink, Route::RoundRobin);
    let report = wait_bounded(move || graph.start().unwrap().wait()).unwrap();
    let planned = &report.placement.threads[1];
    assert_eq!(planned.label, "sink/0");
    if report.pin_failures.is_empty() {
        assert_eq!(*affinity.lock().unwrap(), planned.cpus);
    } else {
        assert!(report.pin_failures[0].contains("not pinned"), "{:?}", report.pin_failures);
    }
}

#[test]
fn external_inputs_feed_the_graph_and_closing_them_finishes_it() {
    const PER_INPUT: u64 = 5_000;
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let input = graph.input::<Tick>("intake", 2);
    let seen = id_counter(2 * PER_INPUT);
    let sink = graph.sink("sink", StageSpec::ancillary(2).with_ring(64, 16), counting_sink(&seen));
    graph.connect(input, sink, Route::by_key(|tick: &Tick| tick.key));
    let mut running = graph.start().unwrap();
    let inputs = running.take_inputs(input).expect("input handles");
    assert!(running.take_inputs(input).is_none(), "handles are taken once");
    let feeders: Vec<_> = inputs
        .into_iter()
        .enumerate()
        .map(|(index, mut input)| {
            std::thread::spawn(move || {
                for i in 0..PER_INPUT {
                    let id = index as u64 * PER_INPUT + i;
                    input.send(Tick { id, key: id % 7, ..Tick::default() }).unwrap();
                    if i % 10 == 0 {
                        input.flush().unwrap();
                    }
                }
            })
        })
        .collect();
    feeders.into_iter().for_each(|feeder| feeder.join().unwrap());
    let report = wait_bounded(move || running.wait()).unwrap();
    assert!(seen.lock().unwrap().iter().all(|&times| times == 1));
    assert_eq!(stage(&report, "sink").messages_in, 2 * PER_INPUT);
    assert_eq!(report.stages.len(), 1, "inputs have no worker threads and no metrics");
}

#[test]
fn an_input_flushed_at_a_given_time_is_timed_from_it() {
    const COUNT: u64 = 100;
    const SENT_AGO_NS: u64 = 5_000_000;
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let input = graph.input::<Tick>("intake", 1);
    let seen = id_counter(COUNT);
    let sink = graph.sink("sink", StageSpec::ancillary(1).with_ring(64, 16), counting_sink(&seen));
    graph.connect(input, sink, Route::by_key(|tick: &Tick| tick.key));
    let mut running = graph.start().unwrap();
    let mut input = running.take_inputs(input).expect("input handles").pop().unwrap();
    // `now_ns` counts from the process's first call: until SENT_AGO_NS have passed, the send
    // time below would saturate at 0 and the hop would be shorter than SENT_AGO_NS.
    while pipeline::metrics::now_ns() < SENT_AGO_NS {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    for id in 0..COUNT {
        input.send(Tick { id, ..Tick::default() }).unwrap();
        input.flush_at(pipeline::metrics::now_ns() - SENT_AGO_NS).unwrap();
    }
    drop(input);
    let report = wait_bounded(move || running.wait()).unwrap();
    let hop = &stage(&report, "sink").hop_latency_ns;
    assert_eq!(hop.count, COUNT);
    // The histogram keeps SIGNIFICANT_DIGITS: its minimum is the lowest value of the bucket
    // the true minimum fell in, up to 0.1% below it (a hop taken within ~3 µs of 5 ms reads
    // 4,997,120 ns). Without `flush_at` the hops would be microseconds.
    let resolution_ns = SENT_AGO_NS / 10u64.pow(u32::from(pipeline::metrics::SIGNIFICANT_DIGITS));
    assert!(
        hop.min >= SENT_AGO_NS - resolution_ns,
        "the hop counts from the given send time: {hop:?}"
    );
}

/// One worker's (index, messages, sum of ids).
type WorkerTotals = (usize, u64, u64);

/// Counts and sums what one worker of a `stage_with_results` sink received.
struct Totals {
    worker: usize,
    count: u64,
    sum: u64,
    panic_at: Option<u64>,
}

impl StageWorker<Tick, ()> for Totals {
    type Finished = WorkerTotals;

    fn handle(&mut self, tick: &Tick, _: &mut Emitter<()>) {
        assert_ne!(self.panic_at, Some(tick.id), "bad tick {}", tick.id);
        self.count += 1;
        self.sum += tick.id;
    }

    fn finish(self) -> WorkerTotals {
        (self.worker, self.count, self.sum)
    }
}

/// A source of ids 0..2000 round-robined to a three-worker sink that reports per-worker totals.
fn run_totals(
    panic_at: Option<u64>,
) -> (Result<PipelineReport, PipelineError>, StageResults<WorkerTotals>) {
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let source = graph.source("gen", StageSpec::ancillary(1), |_| counting_source(0, 2_000, 1));
    let (sink, results) =
        graph.stage_with_results("totals", StageSpec::ancillary(3), move |worker| Totals {
            worker,
            count: 0,
            sum: 0,
            panic_at,
        });
    graph.connect(source, sink, Route::RoundRobin);
    let running = graph.start().unwrap();
    (wait_bounded(move || running.wait()), results)
}

#[test]
fn finished_workers_hand_back_their_results_in_worker_order() {
    let (report, results) = run_totals(None);
    report.unwrap();
    let totals = results.take().expect("every worker finished");
    assert_eq!(totals.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(totals.iter().map(|t| t.1).sum::<u64>(), 2_000, "every message counted once");
    assert_eq!(totals.iter().map(|t| t.2).sum::<u64>(), (0..2_000).sum::<u64>());
    assert!(totals.iter().all(|t| t.1 > 0), "round robin reached every worker: {totals:?}");
}

#[test]
fn a_panicked_worker_reports_no_results() {
    let (report, results) = run_totals(Some(700));
    assert!(matches!(report, Err(PipelineError::StagePanicked { .. })), "{report:?}");
    assert!(results.take().is_none(), "a worker whose handler panicked never finished");
}
