//! Send buffers handed back after their batch commits, for the next sends the node decodes.
//!
//! Why: a decoded send owns its queue name and its content (the store's `Request` is owned, so
//! a batch can outlive the frame buffer it was read from), which cost two heap allocations per
//! message. A worker (or a connection committing inline) gives a committed batch's buffers back
//! here and the decoder fills them again, so a node in steady state decodes a send without
//! allocating (`tests/allocations.rs` counts it).
//!
//! Bounds: at most [`SPARE_SENDS_MAX`] pairs are kept, and a content buffer over
//! [`SPARE_CONTENT_BYTES_MAX`] is dropped rather than kept, so what the node holds here is at
//! most 4,096 × 16 KiB (64 MiB) when clients send such messages, and far less for typical ones.
//! Larger messages allocate as before. The queue is lock-free (a bounded array queue): taking
//! and giving back cost an atomic operation, no lock and no syscall.

use crossbeam::queue::ArrayQueue;

use crate::protocol::{BatchedSend, DecodeSpares, Request, SEND_BATCH_MAX, SendOutcome};
use crate::store::StoreOp;

/// The most emptied vectors kept of each kind ([`SpareLists`]): the `SendBatch` frames of a
/// full pipelined load (32 clients × 64 in flight in frames of 16 is 128 frames), twice over.
pub(crate) const SPARE_LISTS_MAX: usize = 256;

/// Every spare the node keeps: send buffers, and the vectors a `SendBatch` frame goes through
/// (its decoded sends, their store operations, their outcomes), so a frame in steady state
/// allocates nothing either.
pub(crate) struct Spares {
    pub(crate) sends: SpareSends,
    pub(crate) send_lists: SpareLists<BatchedSend>,
    pub(crate) op_lists: SpareLists<StoreOp>,
    pub(crate) outcome_lists: SpareLists<SendOutcome>,
}

impl Spares {
    pub(crate) fn new() -> Spares {
        Spares {
            sends: SpareSends::new(),
            send_lists: SpareLists::new(),
            op_lists: SpareLists::new(),
            outcome_lists: SpareLists::new(),
        }
    }
}

impl DecodeSpares for &Spares {
    fn send_buffers(&mut self) -> (String, Vec<u8>) {
        self.sends.take()
    }

    fn send_list(&mut self) -> Vec<BatchedSend> {
        self.send_lists.take()
    }
}

/// Emptied vectors of one kind, their capacity kept: at most [`SPARE_LISTS_MAX`], each of at
/// most [`SEND_BATCH_MAX`] elements (a frame's), so what is kept is bounded by both.
pub(crate) struct SpareLists<T> {
    lists: ArrayQueue<Vec<T>>,
}

impl<T> SpareLists<T> {
    fn new() -> SpareLists<T> {
        SpareLists { lists: ArrayQueue::new(SPARE_LISTS_MAX) }
    }

    /// A spare vector, or a new empty one (which allocates only when filled).
    pub(crate) fn take(&self) -> Vec<T> {
        self.lists.pop().unwrap_or_default()
    }

    /// Keeps `list`, emptied, unless it has no capacity, more than a frame's, or enough are
    /// kept already.
    pub(crate) fn give_back(&self, mut list: Vec<T>) {
        if list.capacity() == 0 || list.capacity() > SEND_BATCH_MAX {
            return;
        }
        list.clear();
        let _ = self.lists.push(list);
    }
}

/// The most buffer pairs kept: twice the default pipelined load (32 clients × 64 in flight),
/// so a full pipeline's sends find buffers.
pub(crate) const SPARE_SENDS_MAX: usize = 4_096;
/// The largest content buffer kept, bytes.
pub(crate) const SPARE_CONTENT_BYTES_MAX: usize = 16 * 1024;

/// A queue name and a content buffer, emptied, their capacity kept.
pub(crate) type SendBuffers = (String, Vec<u8>);

pub(crate) struct SpareSends {
    buffers: ArrayQueue<SendBuffers>,
}

impl SpareSends {
    pub(crate) fn new() -> SpareSends {
        SpareSends { buffers: ArrayQueue::new(SPARE_SENDS_MAX) }
    }

    /// A pair to decode a send into: a spare one, or two new empty ones (which allocate only
    /// when filled).
    pub(crate) fn take(&self) -> SendBuffers {
        self.buffers.pop().unwrap_or_default()
    }

    /// Empties `ops`, keeping the sends' buffers (up to the bounds) and dropping the rest.
    pub(crate) fn give_back(&self, ops: &mut Vec<StoreOp>) {
        for op in ops.drain(..) {
            if let Request::Send { mut queue, mut content, .. } = op.request
                && content.capacity() <= SPARE_CONTENT_BYTES_MAX
            {
                queue.clear();
                content.clear();
                // Full: enough are kept; these are dropped.
                let _ = self.buffers.push((queue, content));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(content_bytes: usize) -> StoreOp {
        let request =
            Request::Send { queue: "q".into(), receiver: None, content: vec![1; content_bytes] };
        StoreOp { client_id: Some(1), now_us: 0, request }
    }

    #[test]
    fn a_given_back_list_is_taken_again_empty_and_an_oversized_one_is_not_kept() {
        let lists = SpareLists::new();
        lists.give_back(vec![1u8; 10]);
        let list = lists.take();
        assert!(list.is_empty() && list.capacity() >= 10, "the list given back");
        lists.give_back(vec![1u8; SEND_BATCH_MAX + 1]);
        assert_eq!(lists.take().capacity(), 0, "more than a frame's is dropped");
    }

    #[test]
    fn a_given_back_send_is_taken_again_empty_with_its_capacity() {
        let spares = SpareSends::new();
        let mut ops = vec![send(1_000), StoreOp { request: Request::ListQueues, ..send(0) }];
        spares.give_back(&mut ops);
        assert!(ops.is_empty());
        let (queue, content) = spares.take();
        assert!(queue.is_empty() && content.is_empty());
        assert!(content.capacity() >= 1_000, "the content buffer was not the one given back");
        // Only the send's buffers were kept.
        assert_eq!(spares.take().1.capacity(), 0);
    }

    #[test]
    fn oversized_contents_and_buffers_past_the_count_are_dropped() {
        let spares = SpareSends::new();
        spares.give_back(&mut vec![send(SPARE_CONTENT_BYTES_MAX + 1)]);
        assert_eq!(spares.take().1.capacity(), 0, "an oversized buffer was kept");
        let mut many: Vec<StoreOp> = (0..SPARE_SENDS_MAX + 10).map(|_| send(8)).collect();
        spares.give_back(&mut many);
        let kept = std::iter::from_fn(|| Some(spares.take()))
            .take_while(|(_, content)| content.capacity() > 0)
            .count();
        assert_eq!(kept, SPARE_SENDS_MAX);
    }
}
