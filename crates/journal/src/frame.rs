//! Record framing: `[payload_bytes: u32][crc32c: u32][seq: u64][payload]`, little-endian.
//!
//! The CRC32C covers the length, the sequence number and the payload, so a flipped bit
//! anywhere in a frame (header included) is detected. A header of all zeros marks the end of
//! the data in a pre-allocated segment: a real frame always has `payload_bytes > 0`.

/// Bytes of the frame header in front of every payload.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Largest payload a frame may carry; bounds what a corrupt length field can make us read.
pub const PAYLOAD_BYTES_MAX: usize = 64 * 1024;

/// Total bytes on disk of a frame carrying `payload_bytes`.
pub const fn frame_bytes(payload_bytes: usize) -> usize {
    FRAME_HEADER_BYTES + payload_bytes
}

fn frame_crc(payload_bytes: u32, seq: u64, payload: &[u8]) -> u32 {
    let mut covered = [0u8; 12];
    covered[..4].copy_from_slice(&payload_bytes.to_le_bytes());
    covered[4..].copy_from_slice(&seq.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&covered), payload)
}

/// Writes the header for `seq` in front of the payload already placed at
/// `frame[FRAME_HEADER_BYTES..]`. Writing the payload first lets a record encode itself in
/// place, with no intermediate copy.
pub fn seal(frame: &mut [u8], seq: u64) {
    assert!(frame.len() > FRAME_HEADER_BYTES, "a frame carries a non-empty payload");
    let payload_len = frame.len() - FRAME_HEADER_BYTES;
    assert!(payload_len <= PAYLOAD_BYTES_MAX, "payload of {payload_len} bytes is too large");
    let payload_bytes = payload_len as u32;
    let crc = frame_crc(payload_bytes, seq, &frame[FRAME_HEADER_BYTES..]);
    frame[..4].copy_from_slice(&payload_bytes.to_le_bytes());
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
    frame[8..16].copy_from_slice(&seq.to_le_bytes());
}

/// What lies at an offset of a segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A frame whose CRC matches.
    Valid {
        /// The record's sequence number.
        seq: u64,
        /// Its payload.
        payload: &'a [u8],
        /// Bytes the whole frame takes, header and padding included.
        frame_bytes: usize,
    },
    /// A header of zeros, or too few bytes left for a header: no more data here.
    End,
    /// Anything else: a torn write or corruption (the caller decides which).
    Invalid,
}

/// Decodes the frame starting at `bytes[0]`.
pub fn decode(bytes: &[u8]) -> Decoded<'_> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return if bytes.iter().all(|&b| b == 0) { Decoded::End } else { Decoded::Invalid };
    }
    let header = &bytes[..FRAME_HEADER_BYTES];
    if header.iter().all(|&b| b == 0) {
        return Decoded::End;
    }
    let payload_bytes = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
    let seq = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
    let payload_len = payload_bytes as usize;
    if payload_len == 0 || payload_len > PAYLOAD_BYTES_MAX {
        return Decoded::Invalid;
    }
    let Some(payload) = bytes.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + payload_len) else {
        return Decoded::Invalid;
    };
    if frame_crc(payload_bytes, seq, payload) != crc {
        return Decoded::Invalid;
    }
    Decoded::Valid { seq, payload, frame_bytes: frame_bytes(payload_len) }
}

/// Offset (relative to `bytes`) of the first valid frame with a sequence number above
/// `after_seq`, if any. Used after a bad frame to tell a torn tail (nothing valid follows)
/// from corruption in the middle (acknowledged records follow). Zero runs are skipped fast:
/// a frame's length field is non-zero, so a frame cannot start more than 3 bytes before the
/// first non-zero byte.
pub fn find_valid_after(bytes: &[u8], after_seq: u64) -> Option<usize> {
    let mut offset = 0;
    while offset + FRAME_HEADER_BYTES <= bytes.len() {
        let nonzero = bytes[offset..].iter().position(|&b| b != 0)?;
        if nonzero > 3 {
            offset += nonzero - 3;
            continue;
        }
        if let Decoded::Valid { seq, .. } = decode(&bytes[offset..])
            && seq > after_seq
        {
            return Some(offset);
        }
        offset += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(seq: u64, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![0u8; frame_bytes(payload.len())];
        frame[FRAME_HEADER_BYTES..].copy_from_slice(payload);
        seal(&mut frame, seq);
        frame
    }

    #[test]
    fn round_trip_and_every_single_bit_flip_is_detected() {
        let frame = sealed(42, b"hello journal");
        assert_eq!(
            decode(&frame),
            Decoded::Valid { seq: 42, payload: b"hello journal", frame_bytes: frame.len() }
        );
        for bit in 0..frame.len() * 8 {
            let mut flipped = frame.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                !matches!(decode(&flipped), Decoded::Valid { seq: 42, .. }),
                "flip of bit {bit} went unnoticed"
            );
        }
    }

    #[test]
    fn zeros_end_the_data_and_a_short_frame_is_invalid() {
        assert_eq!(decode(&[0u8; 64]), Decoded::End);
        assert_eq!(decode(&[0u8; 3]), Decoded::End);
        let frame = sealed(7, &[9u8; 32]);
        assert_eq!(decode(&frame[..frame.len() - 1]), Decoded::Invalid);
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics_and_sealed_frames_round_trip(
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
            payload in proptest::collection::vec(proptest::num::u8::ANY, 1..512),
            seq in 1u64..u64::MAX,
        ) {
            if let Decoded::Valid { payload: decoded, frame_bytes: used, .. } = decode(&junk) {
                proptest::prop_assert!(used <= junk.len() && decoded.len() + FRAME_HEADER_BYTES == used);
            }
            let _ = find_valid_after(&junk, 0);
            let mut frame = sealed(seq, &payload);
            let frame_len = frame.len();
            proptest::prop_assert_eq!(decode(&frame), Decoded::Valid { seq, payload: &payload, frame_bytes: frame_len });
            frame.extend_from_slice(&junk);
            proptest::prop_assert_eq!(find_valid_after(&frame, seq - 1), Some(0));
        }
    }

    #[test]
    fn resync_finds_the_next_valid_frame_past_junk_and_zeros() {
        let mut bytes = vec![0u8; 100];
        bytes[5] = 0xAB; // junk, not a frame
        bytes.extend_from_slice(&[0u8; 1000]);
        let at = bytes.len();
        bytes.extend_from_slice(&sealed(11, &[1u8; 8]));
        assert_eq!(find_valid_after(&bytes, 10), Some(at));
        assert_eq!(find_valid_after(&bytes, 11), None, "only higher sequences count");
        assert_eq!(find_valid_after(&bytes[..at], 10), None);
    }
}
