//! Client responses handed from the R-Senders to one thread outside the tier (the network
//! gateway's I/O thread), which routes each to the session that owns it.
//!
//! Each R-Sender's subscriber slot writes into a queue of its own (`pipeline::spill`: a
//! single-writer ring, and an overflow when it is full), created on the slot's first client
//! response, so only slots that carry replies cost memory. An R-Sender never waits for the
//! reader: on a host with few CPUs the reader (the gateway's I/O thread) runs the R-Senders
//! itself, fused after its own order source, and elsewhere it may be waiting to hand the tier
//! more orders. What the overflow can hold is bounded by the orders the reader admitted.
//!
//! Wake-up: after each response the subscriber calls the receiver's `wake` (for the gateway a
//! `tokio::sync::Notify`, which costs an atomic when the reader is already awake).
//! Registration of a new ring goes through a mutex once per ring; steady state takes no lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pipeline::spill::{self, SpillReceiver, SpillSender};

use super::{Subscriber, SubscriberFactory};
use crate::msg::{Audience, CoreOutput, Response};

/// Slots of each subscriber slot's reply ring.
pub const REPLY_RING_SLOTS: usize = 4096;

/// Called after a reply is published, to wake the reading thread.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// Rings created by subscribers and not yet taken by the receiver.
#[derive(Default)]
struct Registry {
    new: Mutex<Vec<SpillReceiver<CoreOutput>>>,
    /// Rings ever registered.
    created: AtomicUsize,
}

/// The reading side: every subscriber slot's ring, read in turn.
pub struct ReplyReceiver {
    registry: Arc<Registry>,
    rings: Vec<SpillReceiver<CoreOutput>>,
}

impl ReplyReceiver {
    /// Hands `f` up to `max` replies from each ring, each ring's in the order its R-Sender
    /// delivered them (one client's replies always come through one ring); returns how many.
    pub fn read(&mut self, max: usize, mut f: impl FnMut(&CoreOutput)) -> usize {
        // Acquire: pairs with the Release in `register`, so the ring pushed before the count
        // was raised is in the list when the lock is taken.
        if self.registry.created.load(Ordering::Acquire) > self.rings.len() {
            let mut new = self.registry.new.lock().unwrap_or_else(PoisonError::into_inner);
            self.rings.append(&mut new);
        }
        self.rings.iter_mut().map(|ring| ring.read(max, &mut f)).sum()
    }

    /// Replies published and not yet read.
    pub fn pending(&self) -> usize {
        self.rings.iter().map(SpillReceiver::ring_len).sum()
    }
}

/// One R-Sender's subscriber slot: client responses to its ring, every response to `also`.
struct ReplySubscriber {
    ring: Option<SpillSender<CoreOutput>>,
    registry: Arc<Registry>,
    wake: Wake,
    also: Option<Box<dyn Subscriber>>,
}

impl ReplySubscriber {
    fn register(registry: &Registry) -> SpillSender<CoreOutput> {
        let (producer, consumer) = spill::queue(REPLY_RING_SLOTS).expect("a valid reply ring");
        registry.new.lock().unwrap_or_else(PoisonError::into_inner).push(consumer);
        // Release: see `ReplyReceiver::read`.
        registry.created.fetch_add(1, Ordering::Release);
        producer
    }
}

impl Subscriber for ReplySubscriber {
    fn deliver(&mut self, response: &Response) {
        if let Some(also) = &mut self.also {
            also.deliver(response);
        }
        if response.audience != Audience::Client {
            return;
        }
        let registry = &self.registry;
        let ring = self.ring.get_or_insert_with(|| ReplySubscriber::register(registry));
        ring.send(response.output);
        (self.wake)();
    }
}

/// Subscribers (`outlets` slots per R-Sender, as the tier's `outlets` setting) that hand
/// every client response to the returned receiver (calling `wake` after
/// each) and pass every response, market data included, to `also`'s subscribers when given
/// (the NATS publishers of `exchange serve --nats`).
///
/// ```
/// use std::sync::Arc;
/// use exchange::msg::{Audience, CoreOutput, Response};
/// use exchange::tier::reply_subscribers;
/// let (factory, mut receiver) = reply_subscribers(1, None, Arc::new(|| {}));
/// let mut slots = factory(0);
/// let output = CoreOutput { client: 7, ..CoreOutput::default() };
/// slots[0].deliver(&Response { audience: Audience::Client, outlet: 0, answers_request: true, output });
/// slots[0].deliver(&Response { audience: Audience::MarketData, ..Response::default() });
/// let mut clients = Vec::new();
/// assert_eq!(receiver.read(16, |reply| clients.push(reply.client)), 1, "market data is not a reply");
/// assert_eq!(clients, [7]);
/// ```
pub fn reply_subscribers(
    outlets: u32,
    also: Option<SubscriberFactory>,
    wake: Wake,
) -> (SubscriberFactory, ReplyReceiver) {
    let registry = Arc::new(Registry::default());
    let receiver = ReplyReceiver { registry: registry.clone(), rings: Vec::new() };
    let factory = move |sender: usize| {
        let mut also = also.as_ref().map(|factory| factory(sender).into_iter());
        (0..outlets)
            .map(|_| {
                Box::new(ReplySubscriber {
                    ring: None,
                    registry: registry.clone(),
                    wake: wake.clone(),
                    also: also.as_mut().and_then(Iterator::next),
                }) as Box<dyn Subscriber>
            })
            .collect()
    };
    (Arc::new(factory), receiver)
}
