//! The node-wide bound on the memory of replies owed to clients (committed or being encoded,
//! not yet written to the socket), [`crate::server::NodeConfig::reply_memory_bytes_max`].
//!
//! Each connection owes at most `PIPELINE_DEPTH_MAX` replies, but a message reply can be as
//! large as the content limit allows, so without a node-wide bound the owed bytes would only be
//! bounded by `connections_max × PIPELINE_DEPTH_MAX × reply size`.
//!
//! Why the charge is taken before the database sees the request: a `pop` deletes its message
//! in the committed transaction, so a reply that found no memory after the commit could only be
//! dropped, losing the message. Instead the reading half reserves the LARGEST reply the request
//! can get ([`ReplyBounds`]) when it admits the request, and answers `Busy` (nothing executed,
//! nothing dequeued) when the budget cannot cover it. Once the reply is encoded the charge is
//! settled to its actual size, and it is released when the reply is written (or when the
//! connection ends).
//!
//! The bound is shared fairly ([`crate::share`]): each connection has
//! [`crate::server::NodeConfig::reply_memory_reserved_bytes`] of it set aside, which no other
//! connection can take, so its small requests (a send's reply) are always admitted however many
//! connections pipeline large replies without reading them; of the shared rest one connection
//! may hold at most `max(largest reply, shared rest / open connections)`. (Before, one
//! connection could hold a quarter of the bound, so four such clients refused everyone's
//! requests, sends included, until the write timeout cut them off, and again when they came
//! back.)
//!
//! What is not charged: the replies the reading half makes itself (refusals, registrations,
//! disconnects, a `SendBatch` refused whole: at most 64 short refusals), which are small and
//! never carry a message, and the connection's write buffer.
//! A reply larger than its reservation (a message stored under a larger content limit, by
//! another node sharing the database or an earlier configuration, or an unusually long error
//! detail) is charged in full even past the bound: its bytes exist already and dropping them
//! would lose a dequeued message. With one content limit for every node and ordinary error
//! details the bound is never passed.

use crate::protocol::{
    LIST_QUEUES_MAX, Message, NAME_BYTES_MAX, ReplyBody, ReplyFrame, Request, ServerTiming,
    encode_reply,
};
use crate::share::{Charge, ConnectionShare};

/// Reserved for a request whose reply has a fixed size (every reply but a message or a queue
/// list) or is an error with an ordinary detail; the largest fixed-size reply (`Stats`) takes
/// under half of it.
pub(crate) const REPLY_SMALL_BYTES_MAX: usize = 512;

/// The largest encoded reply (length prefix included) each kind of request can get.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReplyBounds {
    message: usize,
    queues: usize,
}

impl ReplyBounds {
    /// Measured by encoding the worst case once, so the bound follows the wire format.
    pub(crate) fn new(content_bytes_max: usize) -> ReplyBounds {
        let message = Message {
            id: u64::MAX,
            queue: "q".repeat(NAME_BYTES_MAX),
            sender: u64::MAX,
            receiver: Some(u64::MAX),
            arrived_us: u64::MAX,
            deliveries: u32::MAX,
            content: vec![0; content_bytes_max],
        };
        let queues = vec!["q".repeat(NAME_BYTES_MAX); LIST_QUEUES_MAX];
        ReplyBounds {
            message: encoded_len(ReplyBody::Message(message)),
            queues: encoded_len(ReplyBody::Queues(queues)),
        }
    }

    pub(crate) fn largest(&self) -> usize {
        self.message.max(self.queues).max(REPLY_SMALL_BYTES_MAX)
    }

    /// A `SendBatch` frame's reply: what its sends would reserve as lone sends (the batch's
    /// reply shares one header among them, so it is never larger).
    pub(crate) fn for_sends(&self, sends: usize) -> usize {
        sends.saturating_mul(REPLY_SMALL_BYTES_MAX)
    }

    pub(crate) fn for_request(&self, request: &Request) -> usize {
        match request {
            Request::Read { .. } => self.message,
            Request::ListQueues => self.queues,
            _ => REPLY_SMALL_BYTES_MAX,
        }
    }
}

fn encoded_len(body: ReplyBody) -> usize {
    let frame =
        ReplyFrame { request_id: u64::MAX, timing: ServerTiming::default(), result: Ok(body) };
    let mut out = Vec::new();
    encode_reply(&frame, &mut out);
    out.len()
}

/// Bytes held for one owed reply in its connection's account of the node budget; released on
/// drop.
pub(crate) struct ReplyCharge<'a> {
    connection: &'a ConnectionShare<'a>,
    bytes: usize,
}

impl<'a> ReplyCharge<'a> {
    /// `bytes` charged to `connection`'s account, or `None` when its share (or the node's
    /// budget) has no room for them.
    pub(crate) fn try_new(connection: &'a ConnectionShare<'a>, bytes: usize) -> Option<Self> {
        // `then`, not `then_some`: a charge built eagerly would be dropped, releasing what was
        // never charged.
        connection.try_charge(bytes).then(|| ReplyCharge { connection, bytes })
    }

    /// Brings the charge to the size of the encoded reply: the excess of the reservation is
    /// given back; a deficit is charged even past the budget (see the module docs).
    pub(crate) fn settle(&mut self, encoded_bytes: usize) {
        if encoded_bytes <= self.bytes {
            self.connection.release(self.bytes - encoded_bytes);
        } else {
            self.connection.charge_over(encoded_bytes - self.bytes);
        }
        self.bytes = encoded_bytes;
    }
}

impl Drop for ReplyCharge<'_> {
    fn drop(&mut self) {
        self.connection.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::NodeStats;
    use crate::protocol::{ErrorReply, Reason};
    use crate::share::SharedBudget;

    #[test]
    fn every_fixed_size_reply_fits_the_small_reservation() {
        let stats = NodeStats { handler_slots: u32::MAX, ..NodeStats::default() };
        let error =
            ErrorReply::new(Reason::UnknownQueue, format!("no queue {:?}", "q".repeat(128)));
        let bodies = [ReplyBody::Stats(stats), ReplyBody::Sent { message_id: 1, arrived_us: 2 }];
        for body in bodies {
            assert!(encoded_len(body) <= REPLY_SMALL_BYTES_MAX / 2);
        }
        let frame =
            ReplyFrame { request_id: 1, timing: ServerTiming::default(), result: Err(error) };
        let mut out = Vec::new();
        encode_reply(&frame, &mut out);
        assert!(out.len() <= REPLY_SMALL_BYTES_MAX);
    }

    #[test]
    fn a_message_reply_never_exceeds_its_bound() {
        let bounds = ReplyBounds::new(1000);
        let message = Message {
            id: 1,
            queue: "q".repeat(NAME_BYTES_MAX),
            sender: 2,
            receiver: None,
            arrived_us: 3,
            deliveries: 0,
            content: vec![7; 1000],
        };
        let read = Request::Read {
            target: crate::protocol::ReadTarget::Queue("q".into()),
            mode: crate::protocol::ReadMode::Pop,
        };
        let bound = bounds.for_request(&read);
        assert!(encoded_len(ReplyBody::Message(message)) <= bound);
        assert!(bound < 1000 + REPLY_SMALL_BYTES_MAX, "the bound is not padded: {bound}");
    }

    #[test]
    fn a_charge_settles_to_the_encoded_size_and_is_released_on_drop() {
        let budget = SharedBudget::new(1000, 1, 0, 1000);
        let open = std::sync::atomic::AtomicU64::new(1);
        let connection = budget.connection(&open);
        assert!(connection.try_charge(800));
        let mut charge = ReplyCharge { connection: &connection, bytes: 800 };
        assert!(!connection.try_charge(300), "the reservation holds the budget");
        charge.settle(100);
        assert_eq!(budget.used(), 100);
        assert!(connection.try_charge(300));
        charge.settle(1000);
        assert_eq!((budget.used(), budget.peak()), (1300, 1300), "a deficit is charged in full");
        drop(charge);
        assert_eq!(budget.used(), 300);
    }
}
