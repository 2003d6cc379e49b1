//! Call-data tickets: the binary accounting record, its generator and its decoder.
//!
//! Layout (64 bytes, little-endian), as a switch would write it:
//!
//! | offset | size | field                                   |
//! |--------|------|-----------------------------------------|
//! | 0      | 2    | magic `0xCD 0x52`                       |
//! | 2      | 1    | version (1)                             |
//! | 3      | 1    | call kind (0 voice, 1 sms, 2 data)      |
//! | 4      | 8    | sequence number                         |
//! | 12     | 8    | caller number (at most 15 digits)       |
//! | 20     | 8    | callee number (at most 15 digits)       |
//! | 28     | 8    | start time, ms since the Unix epoch     |
//! | 36     | 4    | duration, s (at most one day)           |
//! | 40     | 8    | data volume, bytes                      |
//! | 48     | 4    | cell id                                 |
//! | 52     | 8    | charge, micro-units                     |
//! | 60     | 4    | CRC-32C of bytes 0..60                  |

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Size of one ticket on the wire.
pub const TICKET_BYTES: usize = 64;
const MAGIC: [u8; 2] = [0xCD, 0x52];
const VERSION: u8 = 1;
/// Largest valid E.164 number: 15 digits.
pub const NUMBER_MAX: u64 = 999_999_999_999_999;
/// Longest valid call: one day.
pub const DURATION_S_MAX: u32 = 86_400;
const CHECKSUM_OFFSET: usize = 60;
/// Every n-th generated ticket is malformed by default, so the reject path always runs.
pub const MALFORMED_EVERY_DEFAULT: u64 = 1000;

/// One raw ticket as received: fixed-size bytes (a `Copy` ring message).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RawTicket {
    pub bytes: [u8; TICKET_BYTES],
}

impl Default for RawTicket {
    fn default() -> Self {
        Self { bytes: [0; TICKET_BYTES] }
    }
}

/// What kind of call a ticket accounts for.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum CallKind {
    #[default]
    Voice,
    Sms,
    Data,
}

impl CallKind {
    /// The name used in files and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Voice => "voice",
            Self::Sms => "sms",
            Self::Data => "data",
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::Voice => 0,
            Self::Sms => 1,
            Self::Data => 2,
        }
    }
}

/// A decoded, validated ticket.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Ticket {
    pub sequence: u64,
    pub kind: CallKind,
    pub caller: u64,
    pub callee: u64,
    pub start_ms: u64,
    pub duration_s: u32,
    pub volume_bytes: u64,
    pub cell_id: u32,
    pub charge_micros: u64,
}

/// Why a ticket was rejected (the reason code written to the reject file).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RejectReason {
    BadMagic,
    BadVersion,
    BadChecksum,
    BadCallKind,
    BadNumber,
    BadDuration,
}

impl RejectReason {
    /// A stable reason code.
    pub fn code(self) -> &'static str {
        match self {
            Self::BadMagic => "bad_magic",
            Self::BadVersion => "bad_version",
            Self::BadChecksum => "bad_checksum",
            Self::BadCallKind => "bad_call_kind",
            Self::BadNumber => "bad_number",
            Self::BadDuration => "bad_duration",
        }
    }
}

fn u32_at(bytes: &[u8; TICKET_BYTES], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8; TICKET_BYTES], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"))
}

/// The ticket's sequence number, readable even from a malformed ticket.
pub fn sequence_of(raw: &RawTicket) -> u64 {
    u64_at(&raw.bytes, 4)
}

/// Parses and validates one ticket. Checks run cheapest first; the checksum guards every field.
pub fn decode(raw: &RawTicket) -> Result<Ticket, RejectReason> {
    let bytes = &raw.bytes;
    if bytes[0..2] != MAGIC {
        return Err(RejectReason::BadMagic);
    }
    if bytes[2] != VERSION {
        return Err(RejectReason::BadVersion);
    }
    if crc32c::crc32c(&bytes[..CHECKSUM_OFFSET]) != u32_at(bytes, CHECKSUM_OFFSET) {
        return Err(RejectReason::BadChecksum);
    }
    let kind = match bytes[3] {
        0 => CallKind::Voice,
        1 => CallKind::Sms,
        2 => CallKind::Data,
        _ => return Err(RejectReason::BadCallKind),
    };
    let (caller, callee) = (u64_at(bytes, 12), u64_at(bytes, 20));
    if caller > NUMBER_MAX || callee > NUMBER_MAX {
        return Err(RejectReason::BadNumber);
    }
    let duration_s = u32_at(bytes, 36);
    if duration_s > DURATION_S_MAX {
        return Err(RejectReason::BadDuration);
    }
    Ok(Ticket {
        sequence: u64_at(bytes, 4),
        kind,
        caller,
        callee,
        start_ms: u64_at(bytes, 28),
        duration_s,
        volume_bytes: u64_at(bytes, 40),
        cell_id: u32_at(bytes, 48),
        charge_micros: u64_at(bytes, 52),
    })
}

/// Encodes a ticket with a correct checksum.
pub fn encode(ticket: &Ticket) -> RawTicket {
    let mut bytes = [0_u8; TICKET_BYTES];
    bytes[0..2].copy_from_slice(&MAGIC);
    bytes[2] = VERSION;
    bytes[3] = ticket.kind.code();
    bytes[4..12].copy_from_slice(&ticket.sequence.to_le_bytes());
    bytes[12..20].copy_from_slice(&ticket.caller.to_le_bytes());
    bytes[20..28].copy_from_slice(&ticket.callee.to_le_bytes());
    bytes[28..36].copy_from_slice(&ticket.start_ms.to_le_bytes());
    bytes[36..40].copy_from_slice(&ticket.duration_s.to_le_bytes());
    bytes[40..48].copy_from_slice(&ticket.volume_bytes.to_le_bytes());
    bytes[48..52].copy_from_slice(&ticket.cell_id.to_le_bytes());
    bytes[52..60].copy_from_slice(&ticket.charge_micros.to_le_bytes());
    let checksum = crc32c::crc32c(&bytes[..CHECKSUM_OFFSET]);
    bytes[60..64].copy_from_slice(&checksum.to_le_bytes());
    RawTicket { bytes }
}

/// Generates plausible tickets, seeded and deterministic; every `malformed_every`-th ticket
/// (0 = never) is corrupted in one of the ways the decoder must reject.
pub struct TicketGenerator {
    rng: SmallRng,
    next_sequence: u64,
    malformed_every: u64,
}

/// 2026-01-01T00:00:00Z in ms: generated calls start after it.
const EPOCH_2026_MS: u64 = 1_767_225_600_000;

impl TicketGenerator {
    pub fn new(seed: u64, malformed_every: u64) -> Self {
        Self { rng: SmallRng::seed_from_u64(seed), next_sequence: 0, malformed_every }
    }

    /// The next ticket (valid unless it is a scheduled malformed one).
    pub fn next_ticket(&mut self) -> RawTicket {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let kind = match self.rng.random_range(0..10) {
            0..6 => CallKind::Voice,
            6..8 => CallKind::Sms,
            _ => CallKind::Data,
        };
        let ticket = Ticket {
            sequence,
            kind,
            caller: self.rng.random_range(33_100_000_000..33_799_999_999),
            callee: self.rng.random_range(33_100_000_000..33_799_999_999),
            start_ms: EPOCH_2026_MS + sequence * 7,
            duration_s: if kind == CallKind::Voice { self.rng.random_range(1..3600) } else { 0 },
            volume_bytes: if kind == CallKind::Data {
                self.rng.random_range(1..1 << 30)
            } else {
                0
            },
            cell_id: self.rng.random_range(1..60_000),
            charge_micros: self.rng.random_range(0..5_000_000),
        };
        let mut raw = encode(&ticket);
        if self.malformed_every > 0 && sequence % self.malformed_every == self.malformed_every - 1 {
            self.corrupt(&mut raw, sequence);
        }
        raw
    }

    /// Breaks one thing, cycling through the reject reasons.
    fn corrupt(&mut self, raw: &mut RawTicket, sequence: u64) {
        let bytes = &mut raw.bytes;
        let reseal = |bytes: &mut [u8; TICKET_BYTES]| {
            let checksum = crc32c::crc32c(&bytes[..CHECKSUM_OFFSET]);
            bytes[60..64].copy_from_slice(&checksum.to_le_bytes());
        };
        match (sequence / self.malformed_every) % 5 {
            0 => bytes[0] = 0,
            1 => bytes[45] ^= 0x40, // a flipped bit: the checksum catches it
            2 => {
                bytes[3] = 9;
                reseal(bytes);
            }
            3 => {
                bytes[12..20].copy_from_slice(&(NUMBER_MAX + 1).to_le_bytes());
                reseal(bytes);
            }
            _ => {
                bytes[36..40].copy_from_slice(&(DURATION_S_MAX + 1).to_le_bytes());
                reseal(bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn generated_tickets_round_trip_and_malformed_ones_are_rejected() {
        let mut generator = TicketGenerator::new(7, 10);
        let mut reasons = Vec::new();
        for sequence in 0..100 {
            let raw = generator.next_ticket();
            assert_eq!(sequence_of(&raw), sequence);
            match decode(&raw) {
                Ok(ticket) => {
                    assert_ne!(sequence % 10, 9);
                    assert_eq!(encode(&ticket), raw);
                }
                Err(reason) => {
                    assert_eq!(sequence % 10, 9, "sequence {sequence}: {reason:?}");
                    reasons.push(reason);
                }
            }
        }
        use RejectReason::*;
        let expected = [BadMagic, BadChecksum, BadCallKind, BadNumber, BadDuration];
        assert_eq!(reasons, [expected, expected].concat());
    }

    proptest! {
        #[test]
        fn decoder_never_panics_and_accepts_only_sealed_valid_records(bytes in prop::array::uniform32(any::<u8>()), tail in prop::array::uniform32(any::<u8>())) {
            let mut raw = RawTicket::default();
            raw.bytes[..32].copy_from_slice(&bytes);
            raw.bytes[32..].copy_from_slice(&tail);
            if let Ok(ticket) = decode(&raw) {
                prop_assert_eq!(encode(&ticket), raw);
            }
        }

        #[test]
        fn any_single_bit_flip_is_rejected(seed in any::<u64>(), bit in 0usize..TICKET_BYTES * 8) {
            let mut raw = TicketGenerator::new(seed, 0).next_ticket();
            raw.bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode(&raw).is_err());
        }
    }
}
