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
    let t = 1_000_000;
    let alice = register(store, &unique("alice")).await;
    let bob_name = unique("bob");
    let bob = register(store, &bob_name).await;
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
    let q = unique("q");
    let me = |id| Some(id);

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
        reason(exec(store, me(alice), t, read(ReadTarget::Queue(q), ReadMode::Peek)).await),
        Reason::UnknownQueue
    );
}
