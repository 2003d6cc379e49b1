//! Soak of the mq decoders (not CI: `scripts/soak-decoders`, or
//! `LEANTIER_SOAK_INPUTS=N cargo test -p mq --release --test decoder_soak -- --ignored`).
//!
//! Feeds the request and reply decoders, and the frame reader, generated inputs: random bytes,
//! valid frames, valid frames mutated (bit flips, overwritten bytes, cut or extended, length
//! fields blown up, spliced), and streams of frames cut into random pieces. Oracles:
//! - no input panics or hangs;
//! - a payload that decodes re-encodes to exactly its bytes (the format is canonical), so the
//!   decoder accepts nothing it would not produce itself;
//! - a refused payload has a decoding reason code (Malformed, UnsupportedVersion, UnknownOp);
//! - the frame reader returns exactly the frames of a valid stream however it is cut, and
//!   gives back every byte of its memory budget.
//!
//! The generator is a seeded splitmix64 (the seed is printed), so a failure replays with
//! `LEANTIER_SOAK_SEED`.

use std::pin::Pin;
use std::task::{Context, Poll};

use mq::frame::{FrameBuffer, FrameError, MemoryBudget};
use mq::protocol::{
    ErrorReply, LENGTH_PREFIX_BYTES, Message, NodeStats, ReadMode, ReadTarget, Reason, ReplyBody,
    ReplyFrame, Request, RequestFrame, Secret, ServerTiming, decode_reply, decode_request,
    encode_reply, encode_request,
};

/// Inputs per run unless LEANTIER_SOAK_INPUTS says otherwise.
const INPUTS_DEFAULT: u64 = 1_000_000;
/// One input in this many is a whole framed stream through the frame reader (slower).
const STREAM_EVERY: u64 = 16;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, max: u64) -> Vec<u8> {
        (0..self.below(max + 1)).map(|_| self.next() as u8).collect()
    }
    fn name(&mut self) -> String {
        const CHARS: &[char] = &['a', 'z', '0', '_', '-', 'é', '∑'];
        (0..self.below(12)).map(|_| CHARS[self.below(CHARS.len() as u64) as usize]).collect()
    }
    fn opt_u64(&mut self) -> Option<u64> {
        if self.below(2) == 0 { None } else { Some(self.next()) }
    }
}

fn request(rng: &mut Rng) -> Request {
    match rng.below(11) {
        0 => Request::Register { name: rng.name(), secret: Secret(rng.bytes(40)) },
        1 => Request::CreateQueue { name: rng.name() },
        2 => Request::DeleteQueue { name: rng.name(), purge: rng.below(2) == 0 },
        3 => Request::Send { queue: rng.name(), receiver: rng.opt_u64(), content: rng.bytes(300) },
        4..=6 => {
            let target = if rng.below(2) == 0 {
                ReadTarget::Queue(rng.name())
            } else {
                let queue = if rng.below(2) == 0 { None } else { Some(rng.name()) };
                ReadTarget::ForMe { queue, sender: rng.opt_u64() }
            };
            let mode = match rng.below(3) {
                0 => ReadMode::Pop,
                1 => ReadMode::Peek,
                _ => ReadMode::Lease { lease_ms: rng.next() as u32 },
            };
            Request::Read { target, mode }
        }
        7 => Request::Ack { message_id: rng.next() },
        8 => Request::ListQueues,
        9 => Request::Stats { queue: rng.name() },
        _ => Request::Disconnect,
    }
}

fn reply(rng: &mut Rng) -> ReplyFrame {
    let result = match rng.below(10) {
        0 => Err(ErrorReply::new(Reason::from_u16(1 + rng.below(20) as u16).unwrap(), rng.name())),
        1 => Ok(ReplyBody::Registered { client_id: rng.next() }),
        2 => Ok(ReplyBody::QueueCreated { queue_id: rng.next() }),
        3 => Ok(ReplyBody::Sent { message_id: rng.next(), arrived_us: rng.next() }),
        4 | 5 => Ok(ReplyBody::Message(Message {
            id: rng.next(),
            queue: rng.name(),
            sender: rng.next(),
            receiver: rng.opt_u64(),
            arrived_us: rng.next(),
            deliveries: rng.next() as u32,
            content: rng.bytes(200),
        })),
        6 => Ok(ReplyBody::Queues((0..rng.below(5)).map(|_| rng.name()).collect())),
        7 => Ok(ReplyBody::Stats(NodeStats {
            sends_committed: rng.next(),
            queue_depth: rng.next(),
            connections_cut_off: rng.next(),
            ..NodeStats::default()
        })),
        8 => Ok(ReplyBody::Acked),
        _ => Ok(ReplyBody::Disconnected),
    };
    let timing = ServerTiming { queue_wait_ns: rng.next(), db_ns: rng.next(), middleware_ns: 0 };
    ReplyFrame { request_id: rng.next(), timing, result }
}

/// Damages a payload one of several ways.
fn mutate(rng: &mut Rng, payload: &mut Vec<u8>, donor: &[u8]) {
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(payload.len() as u64) as usize;
        match rng.below(6) {
            0 if !payload.is_empty() => payload[at] ^= 1 << rng.below(8),
            1 if !payload.is_empty() => payload[at] = rng.next() as u8,
            2 => payload.truncate(at),
            3 => payload.extend(rng.bytes(8)),
            // Blow up what may be a length field: two or four 0xFF bytes.
            4 if payload.len() >= at + 4 => {
                payload[at..at + 2 + 2 * rng.below(2) as usize].fill(0xFF)
            }
            _ => {
                let from = rng.below(donor.len() as u64) as usize;
                payload.truncate(at);
                payload.extend_from_slice(&donor[from..]);
            }
        }
    }
}

fn check_request_payload(payload: &[u8], out: &mut Vec<u8>) {
    match decode_request(payload) {
        Ok(frame) => {
            out.clear();
            encode_request(&frame, out);
            assert_eq!(&out[LENGTH_PREFIX_BYTES..], payload, "request decode is not canonical");
        }
        Err(e) => assert!(
            matches!(e.reason, Reason::Malformed | Reason::UnsupportedVersion | Reason::UnknownOp),
            "{e}"
        ),
    }
}

fn check_reply_payload(payload: &[u8], out: &mut Vec<u8>) {
    match decode_reply(payload) {
        Ok(frame) => {
            out.clear();
            encode_reply(&frame, out);
            assert_eq!(&out[LENGTH_PREFIX_BYTES..], payload, "reply decode is not canonical");
        }
        Err(e) => {
            assert!(matches!(e.reason, Reason::Malformed | Reason::UnsupportedVersion), "{e}")
        }
    }
}

/// Delivers a byte stream in pieces of random sizes.
struct Pieces<'a> {
    data: &'a [u8],
    rng: Rng,
}

impl tokio::io::AsyncRead for Pieces<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = (1 + self.rng.below(3000) as usize).min(self.data.len()).min(buf.remaining());
        let (head, rest) = self.data.split_at(n);
        buf.put_slice(head);
        self.data = rest;
        Poll::Ready(Ok(()))
    }
}

/// A stream of valid request frames, possibly with garbage appended, through the frame reader.
fn check_stream(rng: &mut Rng, runtime: &tokio::runtime::Runtime) {
    let mut stream = Vec::new();
    let frames = rng.below(6) as usize;
    for request_id in 0..frames as u64 {
        encode_request(&RequestFrame { request_id, request: request(rng) }, &mut stream);
    }
    let garbage = rng.below(4) == 0;
    if garbage {
        stream.extend(rng.bytes(16));
    }
    let budget = MemoryBudget::new(1 << 22);
    let mut read = Pieces { data: &stream, rng: Rng(rng.next()) };
    let got = runtime.block_on(async {
        let mut buffer = FrameBuffer::new(&budget);
        let mut got = 0;
        loop {
            match buffer.next_frame(&mut read).await {
                Ok(()) => {
                    if got < frames {
                        assert_eq!(
                            decode_request(buffer.payload()).unwrap().request_id,
                            got as u64
                        );
                    }
                    got += 1;
                }
                Err(FrameError::Closed) => return got,
                Err(FrameError::ClosedInFrame { .. } | FrameError::TooLarge(_)) if garbage => {
                    return got;
                }
                Err(e) => panic!("frame reader on a valid stream: {e}"),
            }
            buffer.consume();
        }
    });
    assert!(got >= frames, "{got} of {frames} frames came out");
    assert_eq!(budget.used(), 0, "the frame reader gave back its memory");
}

#[test]
#[ignore = "soak: run by scripts/soak-decoders"]
fn mq_decoders_survive_generated_inputs() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let inputs = env("LEANTIER_SOAK_INPUTS").unwrap_or(INPUTS_DEFAULT);
    let seed = env("LEANTIER_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64
    });
    println!("mq decoder soak: {inputs} inputs, LEANTIER_SOAK_SEED={seed}");
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut rng = Rng(seed);
    let (mut frame, mut donor, mut out) = (Vec::new(), Vec::new(), Vec::new());
    let started = std::time::Instant::now();
    let mut decoded = [0u64; 2];
    for i in 0..inputs {
        if i % STREAM_EVERY == 0 {
            check_stream(&mut rng, &runtime);
            continue;
        }
        frame.clear();
        let is_request = rng.below(2) == 0;
        if is_request {
            encode_request(
                &RequestFrame { request_id: rng.next(), request: request(&mut rng) },
                &mut frame,
            );
        } else {
            encode_reply(&reply(&mut rng), &mut frame);
        }
        let mut payload = frame.split_off(LENGTH_PREFIX_BYTES);
        match rng.below(8) {
            0 => payload = rng.bytes(64),
            1 => {}
            _ => mutate(&mut rng, &mut payload, &donor),
        }
        check_request_payload(&payload, &mut out);
        check_reply_payload(&payload, &mut out);
        decoded[usize::from(is_request)] += u64::from(if is_request {
            decode_request(&payload).is_ok()
        } else {
            decode_reply(&payload).is_ok()
        });
        donor = payload;
    }
    println!(
        "mq decoder soak: {inputs} inputs in {:.1} s; {} requests and {} replies decoded \
         (the rest refused with a reason)",
        started.elapsed().as_secs_f64(),
        decoded[1],
        decoded[0]
    );
}
