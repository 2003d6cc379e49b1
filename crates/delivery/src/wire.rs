//! The bytes on both hops: the NATS batch payload an R-Sender's publisher sends per subject,
//! the retained-window request and reply, and the consumer framing of the delivery edge's TCP
//! side ([docs/DELIVERY.md](../../../docs/DELIVERY.md) is the reference). Every decoder is
//! bounds-checked and returns a [`WireError`] with a reason code: hostile bytes never panic.

use exchange::msg::{Audience, CANONICAL_OUTPUT_BYTES, Response};

/// Bytes of one [`Record`] on the wire.
pub const RECORD_BYTES: usize = 8 + 8 + 1 + 1 + 4 + 4 + CANONICAL_OUTPUT_BYTES;
/// Most records in one NATS batch message (bounds a payload to ~22 KiB, far below NATS's
/// default 1 MiB `max_payload`).
pub const BATCH_RECORDS_MAX: usize = 256;
/// Batch header: version, stream, outlet, publisher instance, leadership epoch, first
/// sequence, record count.
pub const BATCH_HEADER_BYTES: usize = 1 + 1 + 4 + 8 + 8 + 8 + 2;
/// Version byte of every NATS batch message (data, heartbeat, retain reply). Version 2 added
/// the publisher instance, version 3 the leadership epoch; an older batch is refused.
pub const BATCH_VERSION: u8 = 3;
/// Version byte of the retain request and of the consumer's hello.
pub const WIRE_VERSION: u8 = 1;
/// Largest consumer frame either side accepts (length prefix excluded).
pub const FRAME_BYTES_MAX: usize = 1 + 1 + 8 + 8 + RECORD_BYTES;
/// Bytes of the consumer frames' length prefix.
pub const FRAME_PREFIX_BYTES: usize = 4;
/// Bytes of a data frame before its record: length prefix, type, stream, sequence, receipt.
pub const DATA_FRAME_HEAD_BYTES: usize = FRAME_PREFIX_BYTES + 1 + 1 + 8 + 8;
/// Bytes of a whole data frame, length prefix included.
pub const DATA_FRAME_BYTES: usize = DATA_FRAME_HEAD_BYTES + RECORD_BYTES;
/// Magic of the consumer's hello: "LTDL".
pub const HELLO_MAGIC: [u8; 4] = *b"LTDL";

/// Why bytes were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated: {0}")]
    Truncated(&'static str),
    #[error("unknown version {0}")]
    Version(u8),
    #[error("unknown stream code {0}")]
    Stream(u8),
    #[error("unknown frame type {0}")]
    FrameType(u8),
    #[error("frame of {0} bytes is over FRAME_BYTES_MAX or empty")]
    FrameLength(usize),
    #[error("batch of {0} records is over BATCH_RECORDS_MAX or disagrees with its length")]
    BatchCount(usize),
    #[error("bad hello magic")]
    Magic,
    #[error("batch sequences {0}.. start at 0 or run past u64::MAX")]
    Sequence(u64),
}

impl WireError {
    /// A stable reason code for logs and the consumer's goodbye frame.
    pub fn code(&self) -> u8 {
        match self {
            WireError::Truncated(_) => 1,
            WireError::Version(_) => 2,
            WireError::Stream(_) => 3,
            WireError::FrameType(_) => 4,
            WireError::FrameLength(_) => 5,
            WireError::BatchCount(_) => 6,
            WireError::Magic => 7,
            WireError::Sequence(_) => 8,
        }
    }
}

/// The streams of one outlet, each its own NATS subject with its own sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Stream {
    /// Execution reports of the outlet's clients.
    Reports = 0,
    /// Market data of the outlet's topics.
    MarketData = 1,
}

impl Stream {
    pub const ALL: [Stream; 2] = [Stream::Reports, Stream::MarketData];

    pub fn name(self) -> &'static str {
        match self {
            Stream::Reports => "reports",
            Stream::MarketData => "md",
        }
    }

    pub fn from_code(code: u8) -> Result<Stream, WireError> {
        Stream::ALL.get(code as usize).copied().ok_or(WireError::Stream(code))
    }

    pub fn of(response: &Response) -> Stream {
        match response.audience {
            Audience::Client => Stream::Reports,
            Audience::MarketData => Stream::MarketData,
        }
    }
}

/// One response as it travels: the absolute monotonic times (same host: `CLOCK_MONOTONIC`,
/// see [`crate::clock`]) and the response's routing fields and canonical output bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record(pub [u8; RECORD_BYTES]);

impl Default for Record {
    fn default() -> Self {
        Record([0; RECORD_BYTES])
    }
}

/// Offsets inside a record.
const AT_INTENDED: usize = 0;
const AT_PUBLISHED: usize = 8;
const AT_AUDIENCE: usize = 16;
const AT_ANSWERS: usize = 17;
const AT_OUTLET: usize = 18;
const AT_SHARD: usize = 22;
const AT_OUTPUT: usize = 26;
/// Offset of the client id inside the canonical output bytes (seq, 3 codes, instrument).
const OUTPUT_AT_CLIENT: usize = 8 + 3 + 4;

impl Record {
    /// Encodes `response`, intended at `intended_abs_ns` and published at `published_abs_ns`.
    pub fn encode(response: &Response, intended_abs_ns: u64, published_abs_ns: u64) -> Record {
        let mut record = Record([0; RECORD_BYTES]);
        Record::encode_into(response, intended_abs_ns, published_abs_ns, &mut record.0);
        record
    }

    /// [`Record::encode`] straight into `bytes` (a batch buffer's slot): every byte written
    /// once, no intermediate copy.
    pub fn encode_into(
        response: &Response,
        intended_abs_ns: u64,
        published_abs_ns: u64,
        bytes: &mut [u8; RECORD_BYTES],
    ) {
        bytes[AT_INTENDED..AT_PUBLISHED].copy_from_slice(&intended_abs_ns.to_le_bytes());
        bytes[AT_PUBLISHED..AT_AUDIENCE].copy_from_slice(&published_abs_ns.to_le_bytes());
        bytes[AT_AUDIENCE] = Stream::of(response) as u8;
        bytes[AT_ANSWERS] = u8::from(response.answers_request);
        bytes[AT_OUTLET..AT_SHARD].copy_from_slice(&response.outlet.to_le_bytes());
        bytes[AT_SHARD..AT_OUTPUT].copy_from_slice(&response.output.shard.to_le_bytes());
        let output: &mut [u8; CANONICAL_OUTPUT_BYTES] =
            (&mut bytes[AT_OUTPUT..]).try_into().expect("the output fills a record's tail");
        response.output.write_canonical(output);
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.0[at..at + 8].try_into().expect("8 bytes inside a record"))
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.0[at..at + 4].try_into().expect("4 bytes inside a record"))
    }

    pub fn intended_abs_ns(&self) -> u64 {
        self.u64_at(AT_INTENDED)
    }

    pub fn published_abs_ns(&self) -> u64 {
        self.u64_at(AT_PUBLISHED)
    }

    pub fn answers_request(&self) -> bool {
        self.0[AT_ANSWERS] != 0
    }

    pub fn stream_code(&self) -> u8 {
        self.0[AT_AUDIENCE]
    }

    pub fn outlet(&self) -> u32 {
        self.u32_at(AT_OUTLET)
    }

    pub fn shard(&self) -> u32 {
        self.u32_at(AT_SHARD)
    }

    /// The core's sequence of the input that caused this response (0: a pre-process reject).
    pub fn output_seq(&self) -> u64 {
        self.u64_at(AT_OUTPUT)
    }

    pub fn client(&self) -> u32 {
        self.u32_at(AT_OUTPUT + OUTPUT_AT_CLIENT)
    }

    /// The canonical output bytes (`exchange::msg::CoreOutput::canonical_bytes`).
    /// Everything but the two clocks: what two publishers of one group must agree on for
    /// the same sequence (routing, audience and the canonical output).
    pub fn content(&self) -> &[u8] {
        &self.0[AT_AUDIENCE..]
    }

    pub fn output_bytes(&self) -> &[u8] {
        &self.0[AT_OUTPUT..]
    }
}

/// The header of one NATS batch message; `count == 0` is a heartbeat announcing `first_seq`
/// as the next sequence of the subject (so an edge sees a lost tail).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub stream: Stream,
    pub outlet: u32,
    /// The publisher's instance id, drawn at random when it starts: an edge serves one
    /// instance, so a restarted publisher (sequences from 1 again) or a stranger guessing
    /// sequences is told apart from the publisher it serves.
    pub instance: u64,
    /// The leadership that published it (a replicated engine group's lease epoch, which only
    /// grows; 0 for a publisher of its own): an edge drops a batch older than the newest
    /// epoch it has seen, so a deposed leader is never heard after its successor.
    pub epoch: u64,
    pub first_seq: u64,
    pub count: usize,
}

impl BatchHeader {
    /// Appends the header to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.encode());
    }

    /// The header's bytes (a publisher writes them in front of records already encoded).
    pub fn encode(&self) -> [u8; BATCH_HEADER_BYTES] {
        // Our own encoder's invariant (callers cut batches at the bound), not input.
        assert!(self.count <= BATCH_RECORDS_MAX, "a batch over BATCH_RECORDS_MAX");
        let mut bytes = [0u8; BATCH_HEADER_BYTES];
        bytes[0] = BATCH_VERSION;
        bytes[1] = self.stream as u8;
        bytes[2..6].copy_from_slice(&self.outlet.to_le_bytes());
        bytes[6..14].copy_from_slice(&self.instance.to_le_bytes());
        bytes[14..22].copy_from_slice(&self.epoch.to_le_bytes());
        bytes[22..30].copy_from_slice(&self.first_seq.to_le_bytes());
        bytes[30..32].copy_from_slice(&(self.count as u16).to_le_bytes());
        bytes
    }
}

/// Takes little-endian fields off the front of a byte slice; running short is a
/// [`WireError::Truncated`], never a panic.
struct Fields<'a>(&'a [u8], &'static str);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (field, rest) = self.0.split_first_chunk::<N>().ok_or(WireError::Truncated(self.1))?;
        self.0 = rest;
        Ok(*field)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        self.take().map(u64::from_le_bytes)
    }
}

/// Decodes a batch message: its header and its records (a slice of whole records). The
/// records' sequences `first_seq..first_seq + count` are checked to fit in 1..=u64::MAX, so
/// [`batch_records`] cannot overflow.
pub fn decode_batch(bytes: &[u8]) -> Result<(BatchHeader, &[u8]), WireError> {
    let mut fields = Fields(bytes, "batch header");
    let version = fields.u8()?;
    if version != BATCH_VERSION {
        return Err(WireError::Version(version));
    }
    let stream = Stream::from_code(fields.u8()?)?;
    let outlet = fields.u32()?;
    let instance = fields.u64()?;
    let epoch = fields.u64()?;
    let first_seq = fields.u64()?;
    let count = fields.u16()? as usize;
    let records = fields.0;
    if count > BATCH_RECORDS_MAX || records.len() != count * RECORD_BYTES {
        return Err(WireError::BatchCount(count));
    }
    if first_seq == 0 || first_seq.checked_add(count as u64).is_none() {
        return Err(WireError::Sequence(first_seq));
    }
    Ok((BatchHeader { stream, outlet, instance, epoch, first_seq, count }, records))
}

/// The part of a decoded batch's `records` numbered `from..=last`: its first sequence and its
/// whole records, contiguous (empty when the batch holds none of them).
pub fn batch_range<'a>(
    header: &BatchHeader,
    records: &'a [u8],
    from: u64,
    last: u64,
) -> (u64, &'a [u8]) {
    let end = header.first_seq + (records.len() / RECORD_BYTES) as u64; // checked by decode
    let (first, stop) = (from.max(header.first_seq), last.saturating_add(1).min(end));
    if first >= stop {
        return (first, &[]);
    }
    let at = |seq: u64| (seq - header.first_seq) as usize * RECORD_BYTES;
    (first, &records[at(first)..at(stop)])
}

/// The records of a decoded batch, each with its sequence.
pub fn batch_records<'a>(
    header: &BatchHeader,
    records: &'a [u8],
) -> impl Iterator<Item = (u64, Record)> + 'a {
    let first_seq = header.first_seq;
    records.chunks_exact(RECORD_BYTES).enumerate().map(move |(index, chunk)| {
        (first_seq + index as u64, Record(chunk.try_into().expect("chunks_exact of RECORD_BYTES")))
    })
}

/// A retained-window request: the records `from_seq..=to_seq` of one subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetainRequest {
    pub from_seq: u64,
    pub to_seq: u64,
}

impl RetainRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17);
        out.push(WIRE_VERSION);
        out.extend_from_slice(&self.from_seq.to_le_bytes());
        out.extend_from_slice(&self.to_seq.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<RetainRequest, WireError> {
        let mut fields = Fields(bytes, "retain request");
        let version = fields.u8()?;
        if version != WIRE_VERSION {
            return Err(WireError::Version(version));
        }
        Ok(RetainRequest { from_seq: fields.u64()?, to_seq: fields.u64()? })
    }
}

/// A frame between the delivery edge and an end consumer (4-byte little-endian length, then the
/// type byte and the body; see docs/DELIVERY.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Consumer -> edge, first frame of a connection.
    Hello { version: u8 },
    /// Edge -> consumer: one response of `stream`, at `seq`, received at `received_abs_ns`.
    Data { stream: Stream, seq: u64, received_abs_ns: u64, record: Record },
    /// Edge -> consumer: `first_seq..=last_seq` of `stream` are lost for good (beyond the
    /// retained window, or the recovery timed out): resynchronise from a snapshot.
    Resync { stream: Stream, first_seq: u64, last_seq: u64 },
    /// Edge -> consumer: the connection ends, with a reason code.
    Goodbye { reason: u8 },
}

const TYPE_HELLO: u8 = 0x10;
const TYPE_DATA: u8 = 1;
const TYPE_RESYNC: u8 = 2;
const TYPE_GOODBYE: u8 = 3;

impl Frame {
    /// Appends the frame, length prefix included, to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_PREFIX_BYTES]);
        match self {
            Frame::Hello { version } => {
                out.push(TYPE_HELLO);
                out.extend_from_slice(&HELLO_MAGIC);
                out.push(*version);
            }
            Frame::Data { stream, seq, received_abs_ns, record } => {
                // The head's length prefix is the one patched in below.
                let head = data_frame_head(*stream, *seq, *received_abs_ns);
                out.extend_from_slice(&head[FRAME_PREFIX_BYTES..]);
                out.extend_from_slice(&record.0);
            }
            Frame::Resync { stream, first_seq, last_seq } => {
                out.push(TYPE_RESYNC);
                out.push(*stream as u8);
                out.extend_from_slice(&first_seq.to_le_bytes());
                out.extend_from_slice(&last_seq.to_le_bytes());
            }
            Frame::Goodbye { reason } => out.extend_from_slice(&[TYPE_GOODBYE, *reason]),
        }
        let body = (out.len() - start - FRAME_PREFIX_BYTES) as u32;
        out[start..start + FRAME_PREFIX_BYTES].copy_from_slice(&body.to_le_bytes());
    }

    /// Decodes one frame body (the bytes after the length prefix).
    pub fn decode(body: &[u8]) -> Result<Frame, WireError> {
        let (&kind, rest) = body.split_first().ok_or(WireError::Truncated("frame type"))?;
        let u64_at = |at: usize| -> Result<u64, WireError> {
            let bytes = rest.get(at..at + 8).ok_or(WireError::Truncated("frame field"))?;
            Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        };
        let exact = |len: usize| {
            if rest.len() == len { Ok(()) } else { Err(WireError::FrameLength(body.len())) }
        };
        match kind {
            TYPE_HELLO => {
                exact(5)?;
                if rest[..4] != HELLO_MAGIC {
                    return Err(WireError::Magic);
                }
                Ok(Frame::Hello { version: rest[4] })
            }
            TYPE_DATA => {
                exact(1 + 8 + 8 + RECORD_BYTES)?;
                let record = Record(rest[17..].try_into().expect("exact length checked"));
                let (seq, received_abs_ns) = (u64_at(1)?, u64_at(9)?);
                Ok(Frame::Data {
                    stream: Stream::from_code(rest[0])?,
                    seq,
                    received_abs_ns,
                    record,
                })
            }
            TYPE_RESYNC => {
                exact(1 + 8 + 8)?;
                let stream = Stream::from_code(rest[0])?;
                Ok(Frame::Resync { stream, first_seq: u64_at(1)?, last_seq: u64_at(9)? })
            }
            TYPE_GOODBYE => {
                exact(1)?;
                Ok(Frame::Goodbye { reason: rest[0] })
            }
            other => Err(WireError::FrameType(other)),
        }
    }
}

/// The bytes of a data frame before its record (an edge appends the record as received).
pub fn data_frame_head(
    stream: Stream,
    seq: u64,
    received_abs_ns: u64,
) -> [u8; DATA_FRAME_HEAD_BYTES] {
    let mut head = [0u8; DATA_FRAME_HEAD_BYTES];
    let body = (DATA_FRAME_BYTES - FRAME_PREFIX_BYTES) as u32;
    head[..FRAME_PREFIX_BYTES].copy_from_slice(&body.to_le_bytes());
    head[4] = TYPE_DATA;
    head[5] = stream as u8;
    head[6..14].copy_from_slice(&seq.to_le_bytes());
    head[14..22].copy_from_slice(&received_abs_ns.to_le_bytes());
    head
}

/// Splits a byte stream into frames: feed it what the socket gave, take whole frames out.
/// Holds at most one partial frame (`FRAME_PREFIX_BYTES + FRAME_BYTES_MAX` bytes) beyond the
/// last read.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    /// Where the next frame starts in `buffer` (consumed bytes are dropped on `extend`, once
    /// per read rather than once per frame).
    start: usize,
}

impl FrameDecoder {
    /// Appends bytes read from the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.drain(..self.start);
        self.start = 0;
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole frame, `Ok(None)` when more bytes are needed, or the reason the stream
    /// is broken (the caller closes it: after a bad length nothing later can be framed).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let pending = &self.buffer[self.start..];
        let Some(prefix) = pending.get(..FRAME_PREFIX_BYTES) else {
            return Ok(None);
        };
        let length = u32::from_le_bytes(prefix.try_into().expect("4 bytes")) as usize;
        if length == 0 || length > FRAME_BYTES_MAX {
            return Err(WireError::FrameLength(length));
        }
        let end = FRAME_PREFIX_BYTES + length;
        if pending.len() < end {
            return Ok(None);
        }
        let frame = Frame::decode(&pending[FRAME_PREFIX_BYTES..end]);
        self.start += end;
        frame.map(Some)
    }
}
