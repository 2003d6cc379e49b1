//! Resizing a running stage: routing follows the active prefix on grow and shrink, and no
//! message is lost or duplicated while the count changes under load.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pipeline::stage::{Emitter, Flow, PipelineBuilder, Route, StageSpec};

/// A message and the worker of the resized stage that handled it.
#[derive(Clone, Copy, Debug, Default)]
struct Tagged {
    id: u64,
    worker: usize,
}

/// Generous bound for a phase to drain on a loaded 2-core machine.
const PHASE_WITHIN: Duration = Duration::from_secs(20);

const MAX_WORKERS: usize = 4;

/// gate → source (emits ids `0..opened` as the gate opens) → "resized" (tags its worker index)
/// → sink (records every (id, worker)).
struct Harness {
    running: pipeline::stage::RunningPipeline,
    resized: pipeline::stage::StageHandle<Tagged, Tagged>,
    /// The source emits ids below this, then waits for more.
    gate: Arc<AtomicU64>,
    seen: Arc<Mutex<Vec<Tagged>>>,
    sunk: Arc<AtomicUsize>,
}

fn harness(initial_workers: usize) -> Harness {
    let gate = Arc::new(AtomicU64::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sunk = Arc::new(AtomicUsize::new(0));
    let mut graph = PipelineBuilder::new().pin_threads(false);
    let source_gate = gate.clone();
    let source = graph.source("gen", StageSpec::ancillary(1), move |_| {
        let gate = source_gate.clone();
        let mut next = 0;
        move |out: &mut Emitter<Tagged>| {
            // SeqCst (Acquire would do): the test thread resizes before it opens the gate, so
            // a source that sees the new gate also sees the new active count, which makes
            // each phase's routing deterministic.
            let open = gate.load(Ordering::SeqCst);
            if open == u64::MAX {
                return Flow::Stop;
            }
            if next == open {
                std::thread::sleep(Duration::from_micros(200));
            }
            while next < open {
                out.emit(Tagged { id: next, worker: usize::MAX });
                next += 1;
            }
            Flow::Continue
        }
    });
    let spec = StageSpec::ancillary(initial_workers).with_max_workers(MAX_WORKERS);
    let resized = graph.stage("resized", spec.with_ring(64, 16), |worker| {
        move |tagged: &Tagged, out: &mut Emitter<Tagged>| out.emit(Tagged { worker, ..*tagged })
    });
    let (sink_seen, sink_count) = (seen.clone(), sunk.clone());
    let sink = graph.sink("sink", StageSpec::ancillary(1), move |_| {
        let (seen, count) = (sink_seen.clone(), sink_count.clone());
        move |tagged: &Tagged| {
            seen.lock().unwrap().push(*tagged);
            count.fetch_add(1, Ordering::SeqCst);
        }
    });
    graph.connect(source, resized, Route::RoundRobin);
    graph.connect(resized, sink, Route::RoundRobin);
    Harness { running: graph.start().unwrap(), resized, gate, seen, sunk }
}

impl Harness {
    /// Lets the source emit up to `total` ids and waits until the sink has them all.
    fn run_phase(&self, total: u64) {
        self.gate.store(total, Ordering::SeqCst);
        let start = Instant::now();
        while self.sunk.load(Ordering::SeqCst) < total as usize {
            assert!(start.elapsed() < PHASE_WITHIN, "phase up to {total} did not drain");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn finish(self) -> Vec<Tagged> {
        self.gate.store(u64::MAX, Ordering::SeqCst);
        self.running.wait().unwrap();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

fn workers_used(seen: &[Tagged], ids: std::ops::Range<u64>) -> Vec<usize> {
    let mut used: Vec<usize> =
        seen.iter().filter(|t| ids.contains(&t.id)).map(|t| t.worker).collect();
    used.sort_unstable();
    used.dedup();
    used
}

fn assert_each_id_once(seen: &[Tagged], total: u64) {
    let mut ids: Vec<u64> = seen.iter().map(|t| t.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..total).collect::<Vec<_>>(), "every id exactly once");
}

#[test]
fn routing_follows_the_active_prefix_when_growing_and_shrinking() {
    const PHASE: u64 = 2_000;
    let harness = harness(1);
    assert_eq!(harness.running.active_workers(harness.resized).unwrap(), (1, MAX_WORKERS));
    harness.run_phase(PHASE);
    harness.running.resize(harness.resized, 4).unwrap();
    harness.run_phase(2 * PHASE);
    harness.running.resize(harness.resized, 2).unwrap();
    harness.run_phase(3 * PHASE);
    let seen = harness.finish();
    assert_each_id_once(&seen, 3 * PHASE);
    assert_eq!(workers_used(&seen, 0..PHASE), [0]);
    assert_eq!(workers_used(&seen, PHASE..2 * PHASE), [0, 1, 2, 3], "grown to 4");
    assert_eq!(workers_used(&seen, 2 * PHASE..3 * PHASE), [0, 1], "shrunk to 2");
}

#[test]
fn resizing_under_load_loses_and_duplicates_nothing() {
    const TOTAL: u64 = 200_000;
    let harness = harness(2);
    harness.gate.store(TOTAL, Ordering::SeqCst);
    let mut resizes = 0;
    while harness.sunk.load(Ordering::SeqCst) < TOTAL as usize {
        // Cycle through every size, shrinking and growing, while messages are in flight.
        harness.running.resize(harness.resized, 1 + resizes % MAX_WORKERS).unwrap();
        resizes += 1;
        std::thread::sleep(Duration::from_micros(300));
        assert!(resizes < 200_000, "the run did not drain");
    }
    let seen = harness.finish();
    assert_each_id_once(&seen, TOTAL);
    assert!(resizes >= 2, "at least one grow and one shrink happened in flight ({resizes})");
}

#[test]
fn only_declared_stages_resize_and_only_within_their_maximum() {
    let harness = harness(1);
    let error = harness.running.resize(harness.resized, MAX_WORKERS + 1).unwrap_err();
    assert!(
        error.to_string().contains("resized") && error.to_string().contains("1..=4"),
        "{error}"
    );
    let error = harness.running.resize(harness.resized, 0).unwrap_err();
    assert!(error.to_string().contains("0 active workers"), "{error}");
    harness.finish();

    let mut graph = PipelineBuilder::new().pin_threads(false);
    let source =
        graph.source("gen", StageSpec::ancillary(1), |_| |_: &mut Emitter<u64>| Flow::Stop);
    let fixed = graph.sink("fixed", StageSpec::ancillary(2), |_| |_: &u64| {});
    graph.connect(source, fixed, Route::RoundRobin);
    let running = graph.start().unwrap();
    let error = running.resize(fixed, 1).unwrap_err();
    assert!(error.to_string().contains("fixed") && error.to_string().contains("not declared"));
    running.wait().unwrap();

    let mut graph = PipelineBuilder::new().pin_threads(false);
    let spec = StageSpec::ancillary(3).with_max_workers(2);
    let source =
        graph.source("gen", StageSpec::ancillary(1), |_| |_: &mut Emitter<u64>| Flow::Stop);
    let sink = graph.sink("small", spec, |_| |_: &u64| {});
    graph.connect(source, sink, Route::RoundRobin);
    let error = graph.start().err().expect("max below initial is refused").to_string();
    assert!(error.contains("small") && error.contains("below the initial"), "{error}");
}
