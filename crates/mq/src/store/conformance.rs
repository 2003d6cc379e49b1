//! One behavioural scenario every store must pass, run against real SQLite and real PostgreSQL.

use super::{Batch, OpResult, Store, StoreOp};
use crate::protocol::{ReadMode, ReadTarget, Reason, ReplyBody, Request};

/// Names unique to this test run, so runs against a shared PostgreSQL do not collide.
pub(crate) fn unique(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{tag}-{}-{nanos}", std::process::id())
}

async fn exec<S: Store>(
    store: &S,
    client_id: Option<u64>,
    now_us: u64,
    request: Request,
) -> OpResult {
    let mut batch = Batch::default();
    batch.ops.push(StoreOp { client_id, now_us, request });
    store.execute_batch(&mut batch).await.expect("batch commits");
    assert_eq!(batch.results.len(), 1);
    batch.results.pop().unwrap()
}

fn reason(result: OpResult) -> Reason {
    result.expect_err("a refusal").reason
}

/// Claims `name` with a hash unique to it (the store does not interpret hashes).
async fn register<S: Store>(store: &S, name: &str) -> u64 {
    let hash = format!("hash-of-{name}");
    let record = store.claim_client(name, &hash).await.expect("claim commits");
    assert_eq!(record.secret_hash, hash, "a new name takes the hash given");
    record.id
}

fn message(result: OpResult) -> crate::protocol::Message {
    match result.expect("a message") {
        ReplyBody::Message(m) => m,
        other => panic!("{other:?}"),
    }
}

fn send(queue: &str, receiver: Option<u64>, content: &str) -> Request {
    Request::Send { queue: queue.into(), receiver, content: content.as_bytes().to_vec() }
}

fn read(target: ReadTarget, mode: ReadMode) -> Request {
    Request::Read { target, mode }
}

/// Queues, addressing, authorization, peek/pop, delete-with-purge, leases and batches.
pub(crate) async fn scenario<S: Store>(store: &S) {
    let (alice, bob) = registration(store).await;
    let q = unique("q");
    queues_and_addressing(store, (alice, bob), &q).await;
    ownership_and_leases(store, (alice, bob), &q).await;
    batch_stats_and_purge(store, (alice, bob), &q).await;
}

/// The scenario's clock: every request is stamped from here.
const T: u64 = 1_000_000;

/// Two clients registered; a name keeps its first secret's hash; registration is not a batch
/// operation.
async fn registration<S: Store>(store: &S) -> (u64, u64) {
    let alice = register(store, &unique("alice")).await;
    let bob_name = unique("bob");
    let bob = register(store, &bob_name).await;
    let found = store.find_client(&bob_name).await.unwrap();
    assert_eq!(found.map(|r| r.id), Some(bob), "a registered name is found");
    assert_eq!(store.find_client(&unique("nobody")).await.unwrap(), None);
    let again = store.claim_client(&bob_name, "another hash").await.unwrap();
    assert_eq!(
        (again.id, again.secret_hash.as_str()),
        (bob, format!("hash-of-{bob_name}").as_str()),
        "a registered name keeps its first secret's hash"
    );
    let in_batch = Request::Register {
        name: bob_name.clone(),
        secret: crate::protocol::Secret(b"s".to_vec()),
    };
    assert_eq!(reason(exec(store, None, 1, in_batch).await), Reason::UnknownOp);
    (alice, bob)
}

/// Queue creation, refused sends, and who sees which message (addressed or not, by sender).
async fn queues_and_addressing<S: Store>(store: &S, (alice, bob): (u64, u64), q: &str) {
    let (t, me, q) = (T, Some, q.to_owned());
    assert!(matches!(
        exec(store, me(alice), t, Request::CreateQueue { name: q.clone() }).await,
        Ok(ReplyBody::QueueCreated { .. })
    ));
    assert_eq!(
        reason(exec(store, me(alice), t, Request::CreateQueue { name: q.clone() }).await),
        Reason::QueueExists
    );
    assert_eq!(
        reason(exec(store, me(alice), t, send("no-such-queue", None, "x")).await),
        Reason::UnknownQueue
    );
    assert_eq!(
        reason(exec(store, me(alice), t, send(&q, Some(u64::MAX >> 1), "x")).await),
        Reason::UnknownReceiver
    );

    exec(store, me(alice), t, send(&q, Some(bob), "for bob")).await.unwrap();
    exec(store, me(alice), t, send(&q, None, "for anyone")).await.unwrap();

    // Alice cannot see Bob's message: the queue's oldest readable by her is the public one.
    let peeked = message(
        exec(store, me(alice), t, read(ReadTarget::Queue(q.clone()), ReadMode::Peek)).await,
    );
    assert_eq!(peeked.content, b"for anyone");
    assert_eq!(
        reason(
            exec(
                store,
                me(alice),
                t,
                read(ReadTarget::ForMe { queue: None, sender: None }, ReadMode::Pop)
            )
            .await
        ),
        Reason::NoMessage
    );
    // Bob sees both, oldest first; "for me" only gives the addressed one, filtered by sender.
    let for_bob = ReadTarget::ForMe { queue: Some(q.clone()), sender: Some(alice) };
    assert_eq!(
        message(exec(store, me(bob), t, read(for_bob.clone(), ReadMode::Peek)).await).content,
        b"for bob"
    );
    let by_other_sender = ReadTarget::ForMe { queue: None, sender: Some(bob) };
    assert_eq!(
        reason(exec(store, me(bob), t, read(by_other_sender, ReadMode::Peek)).await),
        Reason::NoMessage
    );
    match exec(store, me(bob), t, Request::ListQueues).await.unwrap() {
        ReplyBody::Queues(names) => assert!(names.contains(&q), "{names:?}"),
        other => panic!("{other:?}"),
    }
    let popped = message(exec(store, me(bob), t, read(for_bob.clone(), ReadMode::Pop)).await);
    assert_eq!(
        (popped.content.as_slice(), popped.sender, popped.receiver),
        (&b"for bob"[..], alice, Some(bob))
    );
    assert_eq!(
        reason(exec(store, me(bob), t, read(for_bob, ReadMode::Pop)).await),
        Reason::NoMessage
    );
}

/// Only the owner deletes or purges; leases hide a message, expire, and admit one acker.
async fn ownership_and_leases<S: Store>(store: &S, (alice, bob): (u64, u64), q: &str) {
    let (t, me, q) = (T, Some, q.to_owned());
    // Only the owner deletes or purges; the refusal comes before the emptiness check.
    for purge in [false, true] {
        assert_eq!(
            reason(exec(store, me(bob), t, Request::DeleteQueue { name: q.clone(), purge }).await),
            Reason::NotOwner
        );
    }

    // Deleting a non-empty queue needs purge.
    assert_eq!(
        reason(
            exec(store, me(alice), t, Request::DeleteQueue { name: q.clone(), purge: false }).await
        ),
        Reason::QueueNotEmpty
    );

    // Lease: hidden during the lease, back after it, ack only by the holder while it lasts.
    let lease = ReadMode::Lease { lease_ms: 1000 };
    let leased = message(exec(store, me(bob), t, read(ReadTarget::Queue(q.clone()), lease)).await);
    assert_eq!(leased.deliveries, 1);
    assert_eq!(
        reason(
            exec(store, me(alice), t + 1, read(ReadTarget::Queue(q.clone()), ReadMode::Pop)).await
        ),
        Reason::NoMessage
    );
    let after_lease = t + 1_000_001;
    let again = message(
        exec(store, me(alice), after_lease, read(ReadTarget::Queue(q.clone()), lease)).await,
    );
    assert_eq!((again.id, again.deliveries), (leased.id, 2));
    assert_eq!(
        reason(exec(store, me(bob), after_lease, Request::Ack { message_id: leased.id }).await),
        Reason::NotLeaseHolder
    );
    exec(store, me(alice), after_lease, Request::Ack { message_id: leased.id }).await.unwrap();
    assert_eq!(
        reason(exec(store, me(alice), after_lease, Request::Ack { message_id: leased.id }).await),
        Reason::NotLeaseHolder
    );
}

/// Several requests in one transaction, answered in order; the queue's depth; a purge.
async fn batch_stats_and_purge<S: Store>(store: &S, (alice, bob): (u64, u64), q: &str) {
    let (t, me, q) = (T, Some, q.to_owned());
    // A batch: several sends and a pop in one transaction, results in order.
    let mut batch = Batch::default();
    for i in 0..5 {
        batch.ops.push(StoreOp {
            client_id: me(alice),
            now_us: t + i,
            request: send(&q, None, &format!("m{i}")),
        });
    }
    batch.ops.push(StoreOp {
        client_id: me(bob),
        now_us: t + 9,
        request: read(ReadTarget::Queue(q.clone()), ReadMode::Pop),
    });
    batch.ops.push(StoreOp {
        client_id: me(bob),
        now_us: t + 9,
        request: send("no-such-queue", None, "x"),
    });
    store.execute_batch(&mut batch).await.unwrap();
    assert_eq!(batch.results.len(), 7);
    assert_eq!(
        message(batch.results[5].clone()).content,
        b"m0",
        "pop sees the batch's own earlier sends, oldest first"
    );
    assert_eq!(reason(batch.results[6].clone()), Reason::UnknownQueue);
    let ids: Vec<u64> = batch.results[..5]
        .iter()
        .map(|sent| match sent {
            Ok(ReplyBody::Sent { message_id, .. }) => *message_id,
            other => panic!("a send to {q}: {other:?}"),
        })
        .collect();
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "ids in send order: {ids:?}");
    // A run of sends to one unknown queue: each refused.
    let mut unknown = Batch::default();
    for i in 0..3 {
        let request = send("no-such-queue", None, "x");
        unknown.ops.push(StoreOp { client_id: me(bob), now_us: t + i, request });
    }
    store.execute_batch(&mut unknown).await.unwrap();
    let refused: Vec<Reason> = unknown.results.iter().map(|r| reason(r.clone())).collect();
    assert_eq!(refused, [Reason::UnknownQueue; 3]);
    match exec(store, me(alice), t, Request::Stats { queue: q.clone() }).await.unwrap() {
        ReplyBody::Stats(s) => assert_eq!(s.queue_depth, 4),
        other => panic!("{other:?}"),
    }

    match exec(store, me(alice), t, Request::DeleteQueue { name: q.clone(), purge: true })
        .await
        .unwrap()
    {
        ReplyBody::QueueDeleted { purged_messages } => assert_eq!(purged_messages, 4),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        reason(exec(store, me(alice), t, read(ReadTarget::Queue(q.clone()), ReadMode::Peek)).await),
        Reason::UnknownQueue
    );
    // A lone pop (PostgreSQL's one-row statement) meets the same refusal.
    assert_eq!(
        reason(exec(store, me(alice), t, read(ReadTarget::Queue(q), ReadMode::Pop)).await),
        Reason::UnknownQueue
    );
}

/// A batch mixing every operation kind answers each request as running its requests one at a
/// time, in batch order, does (on PostgreSQL the batch runs as set-based steps: see the `plan`
/// module). Within the batch one client pops, peeks and pops the same queue while others read
/// other queues, so grouping a client's reads must keep its own order.
pub(crate) async fn mixed_batch<S: Store>(store: &S) {
    let batched = mixed_run(store, true).await;
    let one_at_a_time = mixed_run(store, false).await;
    assert_eq!(batched.len(), 25);
    for (i, (b, o)) in batched.iter().zip(&one_at_a_time).enumerate() {
        assert_eq!(b, o, "request {i}: batched vs one at a time");
    }
    let refusals = batched.iter().filter(|r| r.starts_with("refused")).count();
    assert_eq!(refusals, 10, "{batched:#?}");
    let answer = |i: usize| batched[i].rsplit(": ").next().unwrap_or_default();
    let read = [answer(4), answer(6), answer(8), answer(9), answer(10), answer(16), answer(24)];
    assert_eq!(read, ["q0", "q1", "q2", "q2", "q-for-bob", "q3", "q4"], "{batched:#?}");
}

/// Fresh clients and queues, a few stored messages and a lease, then the mixed requests; the
/// answers in a form that does not depend on ids or names (see [`Normalizer`]).
async fn mixed_run<S: Store>(store: &S, batched: bool) -> Vec<String> {
    let t = 1_000_000;
    let [alice, bob, carol] = [
        register(store, &unique("alice")).await,
        register(store, &unique("bob")).await,
        register(store, &unique("carol")).await,
    ];
    let (q, r) = (unique("q"), unique("r"));
    let mut setup = Vec::new();
    for name in [&q, &r] {
        exec(store, Some(alice), t, Request::CreateQueue { name: name.clone() }).await.unwrap();
    }
    for (queue, receiver, content) in
        [(&q, None, "q0"), (&q, None, "q1"), (&q, None, "q2"), (&q, None, "q3")].into_iter().chain(
            [(&q, Some(bob), "q-for-bob"), (&r, Some(carol), "r-for-carol"), (&r, None, "r0")],
        )
    {
        setup.push(exec(store, Some(alice), t, send(queue, receiver, content)).await);
    }
    let lease = ReadMode::Lease { lease_ms: 1000 };
    let leased =
        message(exec(store, Some(carol), t, read(ReadTarget::Queue(r.clone()), lease)).await);
    let ops = mixed_requests([alice, bob, carol], &q, &r, leased.id);
    let mut results = Vec::new();
    if batched {
        let mut batch = Batch {
            ops: ops
                .into_iter()
                .map(|(c, request)| StoreOp { client_id: Some(c), now_us: t, request })
                .collect(),
            results: Vec::new(),
        };
        store.execute_batch(&mut batch).await.expect("batch commits");
        results = batch.results;
    } else {
        for (client, request) in ops {
            results.push(exec(store, Some(client), t, request).await);
        }
    }
    for name in [&q, &r] {
        exec(store, Some(alice), t, Request::DeleteQueue { name: name.clone(), purge: true })
            .await
            .unwrap();
    }
    let normalizer = Normalizer::new([alice, bob, carol], [&q, &r], setup.iter().chain(&results));
    results.iter().map(|result| normalizer.show(result)).collect()
}

/// Every kind of request, by three clients; comments give the one-at-a-time answer.
fn mixed_requests(clients: [u64; 3], q: &str, r: &str, leased: u64) -> Vec<(u64, Request)> {
    let [alice, bob, carol] = clients;
    let queue = |name: &str| ReadTarget::Queue(name.to_owned());
    vec![
        (alice, send(q, None, "q4")),
        (alice, send(q, Some(bob), "q-for-bob-2")),
        (alice, send("no-such-queue", None, "x")), // UnknownQueue
        (alice, send(q, Some(u64::MAX >> 1), "x")), // UnknownReceiver
        (bob, read(queue(q), ReadMode::Pop)),      // q0
        (carol, read(queue(r), ReadMode::Peek)),   // r0 (r-for-carol is leased)
        (bob, read(queue(q), ReadMode::Pop)),      // q1
        (carol, read(queue(r), ReadMode::Peek)),   // r0 again
        (bob, read(queue(q), ReadMode::Peek)),     // q2
        (bob, read(queue(q), ReadMode::Pop)),      // q2
        (bob, read(ReadTarget::ForMe { queue: None, sender: Some(alice) }, ReadMode::Pop)), // q-for-bob
        (
            bob,
            read(ReadTarget::ForMe { queue: Some(q.into()), sender: Some(carol) }, ReadMode::Peek),
        ), // NoMessage
        (alice, read(queue("no-such-queue"), ReadMode::Pop)), // UnknownQueue
        (carol, Request::Ack { message_id: leased }),         // Acked
        (bob, Request::Ack { message_id: leased }),           // NotLeaseHolder
        (carol, Request::Ack { message_id: u64::MAX >> 1 }),  // NotLeaseHolder
        (alice, read(queue(q), ReadMode::Lease { lease_ms: 1000 })), // q3, 1 delivery
        (alice, Request::ListQueues),                         // q and r
        (alice, Request::Stats { queue: q.into() }),          // 3: q3 (leased), q4, q-for-bob-2
        (alice, Request::CreateQueue { name: q.into() }),     // QueueExists
        (alice, Request::CreateQueue { name: String::new() }), // InvalidName
        (bob, Request::DeleteQueue { name: q.into(), purge: false }), // NotOwner
        (alice, Request::DeleteQueue { name: r.into(), purge: false }), // QueueNotEmpty
        (alice, send(q, None, "q5")),
        (bob, read(queue(q), ReadMode::Pop)), // q4
    ]
}

/// Shows a result without what differs between two runs: message ids become their rank among
/// the run's ids, client ids and the run's queue names become names.
struct Normalizer {
    clients: [u64; 3],
    queues: [String; 2],
    message_ids: Vec<u64>,
}

impl Normalizer {
    fn new<'a>(
        clients: [u64; 3],
        queues: [&String; 2],
        results: impl Iterator<Item = &'a OpResult>,
    ) -> Normalizer {
        let mut message_ids: Vec<u64> = results
            .filter_map(|result| match result {
                Ok(ReplyBody::Sent { message_id, .. }) => Some(*message_id),
                Ok(ReplyBody::Message(m)) => Some(m.id),
                _ => None,
            })
            .collect();
        message_ids.sort_unstable();
        message_ids.dedup();
        Normalizer { clients, queues: [queues[0].clone(), queues[1].clone()], message_ids }
    }

    fn message(&self, id: u64) -> usize {
        self.message_ids.binary_search(&id).expect("every id was collected")
    }

    fn client(&self, id: Option<u64>) -> &'static str {
        let names = ["alice", "bob", "carol"];
        id.and_then(|id| self.clients.iter().position(|c| *c == id)).map_or("anyone", |i| names[i])
    }

    fn queue(&self, name: &str) -> Option<&'static str> {
        self.queues.iter().position(|q| q == name).map(|i| ["Q", "R"][i])
    }

    fn show(&self, result: &OpResult) -> String {
        match result {
            Err(e) => format!("refused {:?}", e.reason),
            Ok(ReplyBody::Sent { message_id, .. }) => {
                format!("sent #{}", self.message(*message_id))
            }
            Ok(ReplyBody::Message(m)) => format!(
                "#{} in {:?} from {} to {}, {} deliveries: {}",
                self.message(m.id),
                self.queue(&m.queue),
                self.client(Some(m.sender)),
                self.client(m.receiver),
                m.deliveries,
                String::from_utf8_lossy(&m.content)
            ),
            Ok(ReplyBody::QueueCreated { .. }) => "created".into(),
            Ok(ReplyBody::Queues(names)) => {
                format!("{:?}", names.iter().filter_map(|n| self.queue(n)).collect::<Vec<_>>())
            }
            Ok(ReplyBody::Stats(s)) => format!("depth {}", s.queue_depth),
            Ok(other) => format!("{other:?}"),
        }
    }
}
