//! Reading frames off a connection with bounded memory. A frame's buffer grows with the bytes
//! that actually arrive (doubling from [`FRAME_CHUNK_BYTES`], never to the declared length up
//! front), so a peer that sends only a length prefix costs one chunk, not the megabyte it
//! declares. Every byte of buffer capacity is charged to a node-wide [`MemoryBudget`]; a frame
//! that would take the node past it is refused.
//!
//! [`FrameBuffer::next_frame`] is cancel-safe: everything received is kept in the buffer, so a
//! caller may wrap it in a timeout and call it again.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::protocol::{DecodeError, FRAME_BYTES_MAX, LENGTH_PREFIX_BYTES, Reason, check_frame_len};
use crate::share::Charge;
pub use crate::share::MemoryBudget;

/// First allocation of a frame buffer; it doubles from here up to the frame's length.
pub const FRAME_CHUNK_BYTES: usize = 4 * 1024;
/// Capacity a buffer keeps between frames; a larger one (after a large frame) is given back, so
/// an idle connection holds at most this much.
pub const FRAME_BUFFER_KEEP_BYTES: usize = 64 * 1024;

/// Why no frame came.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    #[error("connection closed")]
    Closed,
    /// The peer closed the connection inside a frame.
    #[error("connection closed inside a frame ({received} bytes of it received)")]
    ClosedInFrame { received: usize },
    /// The length prefix exceeds the protocol's limit; the stream cannot be resynchronised.
    #[error(transparent)]
    TooLarge(DecodeError),
    /// Growing the buffer would take the node past its frame memory budget.
    #[error("node frame memory budget exhausted")]
    NodeMemory,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// One connection's frame buffer: the current frame's bytes, length prefix included.
pub struct FrameBuffer<'a> {
    buf: Vec<u8>,
    /// Capacity charged to `budget`, released on drop.
    charged: usize,
    budget: &'a dyn Charge,
    /// Longest payload accepted now (the protocol's limit unless lowered).
    len_max: usize,
}

impl<'a> FrameBuffer<'a> {
    pub fn new(budget: &'a dyn Charge) -> FrameBuffer<'a> {
        FrameBuffer { buf: Vec::new(), charged: 0, budget, len_max: FRAME_BYTES_MAX }
    }

    /// Lowers (or restores) the longest payload accepted from the next length prefix on; a
    /// longer one is [`FrameError::TooLarge`] before any of it is buffered.
    pub fn set_len_max(&mut self, len_max: usize) {
        self.len_max = len_max.min(FRAME_BYTES_MAX);
    }

    /// Reads until a whole frame is buffered; its payload is then [`FrameBuffer::payload`]
    /// until [`FrameBuffer::consume`].
    pub async fn next_frame(
        &mut self,
        read: &mut (impl AsyncRead + Unpin),
    ) -> Result<(), FrameError> {
        loop {
            let (wanted, complete) = self.wanted()?;
            if complete {
                return Ok(());
            }
            self.grow(wanted)?;
            let missing = (wanted - self.buf.len()) as u64;
            // read_buf is cancel-safe: bytes enter `buf` only when a read completes.
            if (&mut *read).take(missing).read_buf(&mut self.buf).await? == 0 {
                return Err(match self.buf.len() {
                    0 => FrameError::Closed,
                    received => FrameError::ClosedInFrame { received },
                });
            }
        }
    }

    /// Bytes of the frame once its prefix is known (the prefix alone until then), and whether
    /// they are all here.
    fn wanted(&self) -> Result<(usize, bool), FrameError> {
        let Some(prefix) = self.buf.first_chunk::<LENGTH_PREFIX_BYTES>() else {
            return Ok((LENGTH_PREFIX_BYTES, false));
        };
        let len = check_frame_len(*prefix).map_err(FrameError::TooLarge)?;
        if len > self.len_max {
            return Err(FrameError::TooLarge(DecodeError {
                reason: Reason::TooLarge,
                request_id: None,
                detail: "frame longer than this connection may send now (before registering, \
                         only Register and Disconnect are accepted)",
            }));
        }
        let total = LENGTH_PREFIX_BYTES + len;
        Ok((total, self.buf.len() == total))
    }

    /// Makes room for at least one more byte: capacity doubles (from FRAME_CHUNK_BYTES), never
    /// past `wanted`, and the growth is charged to the node budget first.
    fn grow(&mut self, wanted: usize) -> Result<(), FrameError> {
        if self.buf.capacity() > self.buf.len() {
            return Ok(());
        }
        let target =
            (self.buf.capacity() * 2).max(FRAME_CHUNK_BYTES).min(wanted.max(FRAME_CHUNK_BYTES));
        self.buf.reserve_exact(target - self.buf.len());
        self.recharge()
    }

    /// Brings the charge in line with the buffer's capacity.
    fn recharge(&mut self) -> Result<(), FrameError> {
        let capacity = self.buf.capacity();
        if capacity > self.charged {
            if !self.budget.try_charge(capacity - self.charged) {
                // Give the allocation back at once: the connection is refused, not kept.
                self.buf = Vec::new();
                self.budget.release(self.charged);
                self.charged = 0;
                return Err(FrameError::NodeMemory);
            }
        } else {
            self.budget.release(self.charged - capacity);
        }
        self.charged = capacity;
        Ok(())
    }

    /// The current frame's payload (after [`FrameBuffer::next_frame`] returned `Ok`).
    pub fn payload(&self) -> &[u8] {
        &self.buf[LENGTH_PREFIX_BYTES.min(self.buf.len())..]
    }

    /// Forgets the current frame; a buffer grown past FRAME_BUFFER_KEEP_BYTES is given back.
    pub fn consume(&mut self) {
        self.buf.clear();
        if self.buf.capacity() > FRAME_BUFFER_KEEP_BYTES {
            self.buf = Vec::new();
            // Releasing never fails.
            let _ = self.recharge();
        }
    }

    /// Capacity held now (tests and the budget's bookkeeping).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

impl Drop for FrameBuffer<'_> {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// Delivers `data` in pieces of the given sizes (cycled), like a network would.
    struct Chunked {
        data: Vec<u8>,
        at: usize,
        sizes: Vec<usize>,
        turn: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let size = self.sizes[self.turn % self.sizes.len()].max(1);
            self.turn += 1;
            let end = (self.at + size).min(self.data.len()).min(self.at + buf.remaining());
            let at = self.at;
            buf.put_slice(&self.data[at..end]);
            self.at = end;
            Poll::Ready(Ok(()))
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    fn framed(payloads: &[Vec<u8>]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            out.extend_from_slice(&(p.len() as u32).to_be_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    proptest! {
        #[test]
        fn frames_split_anywhere_come_out_whole(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..20_000), 0..6),
            sizes in proptest::collection::vec(1usize..5000, 1..8),
        ) {
            let budget = MemoryBudget::new(usize::MAX);
            let mut read = Chunked { data: framed(&payloads), at: 0, sizes, turn: 0 };
            let got = block_on(async {
                let mut frames = FrameBuffer::new(&budget);
                let mut got = Vec::new();
                loop {
                    match frames.next_frame(&mut read).await {
                        Ok(()) => got.push(frames.payload().to_vec()),
                        Err(FrameError::Closed) => break,
                        Err(e) => panic!("{e}"),
                    }
                    frames.consume();
                    assert!(frames.capacity() <= FRAME_BUFFER_KEEP_BYTES);
                }
                got
            });
            prop_assert_eq!(got, payloads);
            prop_assert_eq!(budget.used(), 0, "every charge released");
        }
    }

    #[test]
    fn a_bare_prefix_costs_one_chunk_not_the_declared_length() {
        let budget = MemoryBudget::new(usize::MAX);
        let mut data = (FRAME_BYTES_MAX as u32).to_be_bytes().to_vec();
        data.extend_from_slice(&[7; 100]);
        let mut read = Chunked { data, at: 0, sizes: vec![1000], turn: 0 };
        let mut frames = FrameBuffer::new(&budget);
        let error = block_on(frames.next_frame(&mut read)).unwrap_err();
        assert!(matches!(error, FrameError::ClosedInFrame { received: 104 }), "{error}");
        assert_eq!(frames.capacity(), FRAME_CHUNK_BYTES);
        assert_eq!(budget.used(), FRAME_CHUNK_BYTES);
        drop(frames);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn the_node_budget_refuses_growth_past_it_and_keeps_its_count() {
        let budget = MemoryBudget::new(3 * FRAME_CHUNK_BYTES);
        let big = framed(&[vec![1; 5 * FRAME_CHUNK_BYTES]]);
        let mut a = FrameBuffer::new(&budget);
        let mut read =
            Chunked { data: big.clone(), at: 0, sizes: vec![FRAME_CHUNK_BYTES], turn: 0 };
        let error = block_on(a.next_frame(&mut read)).unwrap_err();
        assert!(matches!(error, FrameError::NodeMemory), "{error}");
        assert_eq!((a.capacity(), budget.used()), (0, 0), "a refused buffer is given back");
        // Small frames still fit beside a connection holding a chunk.
        let mut b = FrameBuffer::new(&budget);
        let mut read = Chunked { data: framed(&[vec![2; 10]]), at: 0, sizes: vec![3], turn: 0 };
        block_on(b.next_frame(&mut read)).unwrap();
        assert_eq!(b.payload(), &[2; 10]);
        assert_eq!(budget.used(), FRAME_CHUNK_BYTES);
    }

    #[test]
    fn an_oversized_prefix_is_refused_before_any_payload_buffer() {
        let budget = MemoryBudget::new(usize::MAX);
        let data = ((FRAME_BYTES_MAX + 1) as u32).to_be_bytes().to_vec();
        let mut read = Chunked { data, at: 0, sizes: vec![4], turn: 0 };
        let mut frames = FrameBuffer::new(&budget);
        assert!(matches!(block_on(frames.next_frame(&mut read)), Err(FrameError::TooLarge(_))));
        assert!(frames.capacity() <= FRAME_CHUNK_BYTES);
    }
}
