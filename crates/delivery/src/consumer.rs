//! An end consumer of a delivery edge: connects, says hello and checks what arrives — every
//! stream's sequence must advance by exactly one per data frame, or jump past a range the
//! edge declared lost with a resync frame. Used by the tests, the benchmark and anyone
//! who wants to watch an edge.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use stats::LatencyHistogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::clock::monotonic_ns;
use crate::error::{Result, io_failed};
use crate::wire::{FRAME_BYTES_MAX, Frame, FrameDecoder, Stream, WIRE_VERSION};

/// What one consumer saw.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ConsumerTally {
    /// Data frames per stream.
    pub data: [u64; 2],
    /// Records declared lost by resync frames, per stream.
    pub resynced: [u64; 2],
    /// Next sequence expected per stream.
    pub next_seqs: [u64; 2],
    /// Frames whose sequence was not the next expected (must stay 0).
    pub out_of_order: u64,
    /// Records routed to another edge than the one connected to (must stay 0).
    pub wrong_outlet: u64,
    /// The goodbye reason, once the edge closed the connection with one.
    pub goodbye: Option<u8>,
    /// Intended send time -> read by this consumer, for records answering a request.
    #[serde(skip)]
    pub latency: LatencyHistogram,
}

impl ConsumerTally {
    fn new() -> ConsumerTally {
        ConsumerTally { next_seqs: [1; 2], ..ConsumerTally::default() }
    }

    /// Data and resynced records of both streams.
    pub fn accounted(&self) -> u64 {
        self.data.iter().chain(&self.resynced).sum()
    }

    fn on_frame(&mut self, frame: Frame, outlet: u32) {
        match frame {
            Frame::Data { stream, seq, record, .. } => {
                let next = &mut self.next_seqs[stream as usize];
                if seq != *next {
                    self.out_of_order += 1;
                }
                // Saturating: a hostile edge's sequence must not overflow the tally.
                *next = seq.saturating_add(1);
                self.data[stream as usize] += 1;
                if record.outlet() != outlet || record.stream_code() != stream as u8 {
                    self.wrong_outlet += 1;
                }
                if record.answers_request() {
                    self.latency.record_ns(monotonic_ns().saturating_sub(record.intended_abs_ns()));
                }
            }
            Frame::Resync { stream, first_seq, last_seq } => {
                let next = &mut self.next_seqs[stream as usize];
                if first_seq != *next || last_seq < first_seq {
                    self.out_of_order += 1;
                }
                *next = last_seq.saturating_add(1);
                let records = last_seq.saturating_sub(first_seq).saturating_add(1);
                self.resynced[stream as usize] =
                    self.resynced[stream as usize].saturating_add(records);
            }
            Frame::Goodbye { reason } => self.goodbye = Some(reason),
            Frame::Hello { .. } => self.out_of_order += 1,
        }
    }
}

/// A consumer's shared tally, readable while it runs.
pub type SharedTally = Arc<Mutex<ConsumerTally>>;

/// Connects to the edge at `address` (serving `edge`) and says hello; the returned
/// future reads until the edge says goodbye or closes, updating the tally per read.
pub async fn connect(
    address: SocketAddr,
    outlet: u32,
) -> Result<(SharedTally, impl Future<Output = Result<()>>)> {
    let mut stream = TcpStream::connect(address)
        .await
        .map_err(io_failed(format!("connecting to the edge at {address}")))?;
    stream.set_nodelay(true).map_err(io_failed("setting TCP_NODELAY"))?;
    let mut hello = Vec::new();
    Frame::Hello { version: WIRE_VERSION }.write(&mut hello);
    stream.write_all(&hello).await.map_err(io_failed("saying hello to the edge"))?;
    let tally = Arc::new(Mutex::new(ConsumerTally::new()));
    let shared = tally.clone();
    let reading = async move {
        let mut decoder = FrameDecoder::default();
        let mut buffer = vec![0u8; 64 * FRAME_BYTES_MAX];
        loop {
            let n = stream.read(&mut buffer).await.map_err(io_failed("reading from the edge"))?;
            if n == 0 {
                return Ok(());
            }
            decoder.extend(&buffer[..n]);
            let mut tally = shared.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some(frame) = decoder.next_frame()? {
                tally.on_frame(frame, outlet);
            }
            if tally.goodbye.is_some() {
                return Ok(());
            }
        }
    };
    Ok((tally, reading))
}

/// Both streams' next sequence, for comparing with the publisher's.
pub fn next_seqs(tally: &SharedTally) -> [u64; 2] {
    tally.lock().unwrap_or_else(PoisonError::into_inner).next_seqs
}

/// The stream names in tally order.
pub const STREAMS: [Stream; 2] = Stream::ALL;
