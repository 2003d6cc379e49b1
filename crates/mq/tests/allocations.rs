//! Heap allocations per message on the node's send path, counted by a counting global allocator
//! on the node's own threads only (its runtime's; the test's clients run on another), over a
//! store that allocates nothing itself, so what is counted is the node: reading and decoding
//! frames, admission, the hand-off to a database worker, the reply's encoding and write.
//!
//! Measured in steady state (after a warm-up that grows every reused buffer), with lone `Send`
//! frames and with `SendBatch` frames. The bounds are today's counts (with a little room for
//! the runtime's amortised growth), so a change that adds an allocation per message fails here.
//! What is left per message, and why, is in docs/benchmarks/mq.md: a send decodes into the
//! buffers of a committed one (the `spare` module) and a worker answers through the
//! connection's one reply channel (the `replies` module), and a `SendBatch` frame's vectors
//! (its decoded sends, their store operations, their outcomes) are spares too, so neither a
//! lone send nor a batched one allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use mq::client::Client;
use mq::protocol::{ErrorReply, ReplyBody, Request, SendRef};
use mq::server::{self, NodeConfig};
use mq::store::{Batch, ClientRecord, Store};

/// Allocations made on threads that opted in ([`COUNTED`]).
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a plain
// atomic add and the thread-local read never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTED.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTED.try_with(Cell::get).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for `alloc`; `ptr` came from `System` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A store that commits every send at once and allocates nothing in steady state (its results
/// vector keeps its capacity from batch to batch).
#[derive(Clone)]
struct NullStore;

impl Store for NullStore {
    async fn execute_batch(&self, batch: &mut Batch) -> mq::Result<()> {
        batch.results.clear();
        for (i, op) in batch.ops.iter().enumerate() {
            batch.results.push(match op.request {
                Request::Send { .. } => {
                    Ok(ReplyBody::Sent { message_id: i as u64 + 1, arrived_us: op.now_us })
                }
                // Creating the queue, the only other request of this test.
                _ => Ok(ReplyBody::QueueCreated { queue_id: 1 }),
            });
        }
        Ok(())
    }

    async fn claim_client(&self, _: &str, secret_hash: &str) -> mq::Result<ClientRecord> {
        Ok(ClientRecord { id: 1, secret_hash: secret_hash.to_owned() })
    }

    async fn find_client(&self, _: &str) -> mq::Result<Option<ClientRecord>> {
        Ok(None)
    }

    fn parallel_batches_max(&self) -> usize {
        1
    }
}

/// Sends `frames` frames of `per_frame` sends (lone `Send` frames when 1), 4 frames in flight.
async fn send(client: &mut Client, frames: usize, per_frame: usize, content: &[u8]) {
    let sends = vec![SendRef { queue: "q", receiver: None, content }; per_frame];
    let in_flight = 4;
    for k in 0..frames + in_flight {
        if k < frames {
            if per_frame == 1 {
                let request =
                    Request::Send { queue: "q".into(), receiver: None, content: content.to_vec() };
                client.submit(request).await.unwrap();
            } else {
                client.submit_sends(&sends).await.unwrap();
            }
        }
        if k >= in_flight {
            let (_, result) = client.receive().await.unwrap();
            let sent = match result {
                Ok(ReplyBody::SentBatch(outcomes)) => outcomes.iter().all(Result::is_ok),
                Ok(ReplyBody::Sent { .. }) => true,
                other => panic!("{:?}", other.map_err(|e: ErrorReply| e.reason)),
            };
            assert!(sent);
        }
    }
}

/// Allocations per message on the node's threads over `frames` frames of `per_frame` sends.
async fn allocations_per_message(client: &mut Client, per_frame: usize, content: &[u8]) -> f64 {
    send(client, 200, per_frame, content).await;
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let frames = 2000;
    send(client, frames, per_frame, content).await;
    let counted = ALLOCATIONS.load(Ordering::Relaxed) - before;
    counted as f64 / (frames * per_frame) as f64
}

#[test]
fn the_node_send_path_allocates_no_more_per_message_than_measured() {
    let node_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| COUNTED.with(|counted| counted.set(true)))
        .enable_all()
        .build()
        .unwrap();
    let config = NodeConfig { db_workers: 1, ..NodeConfig::default() };
    let node = node_runtime
        .block_on(async { server::start("127.0.0.1:0", NullStore, config).await })
        .unwrap();
    let addr = node.addr.to_string();
    let clients = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (lone, batched) = clients.block_on(async {
        let mut client = Client::connect(&addr).await.unwrap();
        client.register("allocations", b"secret").await.unwrap();
        client.create_queue("q").await.unwrap();
        let content = vec![b'x'; 1000];
        let lone = allocations_per_message(&mut client, 1, &content).await;
        let batched = allocations_per_message(&mut client, 16, &content).await;
        (lone, batched)
    });
    println!(
        "node allocations per message: lone Send frames {lone:.2}, SendBatch of 16 {batched:.2}"
    );
    // A send decodes into buffers a committed send gave back and is answered through the
    // connection's reply channel (with a channel per request it was 0.67); a frame's vectors
    // are given back and taken again (without, 3 per frame of 16: 0.19).
    assert!(lone <= 0.05, "lone sends: {lone:.2} allocations per message");
    assert!(batched <= 0.05, "batched sends: {batched:.2} allocations per message");
    node_runtime.block_on(node.shutdown());
}
