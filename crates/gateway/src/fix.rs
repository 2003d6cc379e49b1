//! FIX 4.4 tag=value codec: framing with BodyLength and CheckSum validation, an
//! allocation-free field index over the received bytes, and a message builder that reuses its
//! buffers.

use std::io::Write;

/// `8=FIX.4.4<SOH>`: every message starts with it.
pub const BEGIN_STRING: &[u8] = b"8=FIX.4.4\x01";
/// Field separator.
pub const SOH: u8 = 0x01;
/// Largest BodyLength accepted; a longer message is garbled (no order needs more).
pub const BODY_BYTES_MAX: usize = 4096;
/// Fields one message may carry.
pub const FIELDS_MAX: usize = 64;
/// Digits of BodyLength at most (`BODY_BYTES_MAX` has four).
const BODY_LENGTH_DIGITS_MAX: usize = 4;
/// `10=ccc<SOH>`.
const TRAILER_BYTES: usize = 7;

/// Tags this acceptor reads or writes.
pub mod tag {
    pub const ACCOUNT: u32 = 1;
    pub const AVG_PX: u32 = 6;
    pub const BEGIN_SEQ_NO: u32 = 7;
    pub const BEGIN_STRING: u32 = 8;
    pub const BODY_LENGTH: u32 = 9;
    pub const CHECKSUM: u32 = 10;
    pub const CL_ORD_ID: u32 = 11;
    pub const CUM_QTY: u32 = 14;
    pub const END_SEQ_NO: u32 = 16;
    pub const EXEC_ID: u32 = 17;
    pub const LAST_PX: u32 = 31;
    pub const LAST_QTY: u32 = 32;
    pub const MSG_SEQ_NUM: u32 = 34;
    pub const MSG_TYPE: u32 = 35;
    pub const NEW_SEQ_NO: u32 = 36;
    pub const ORDER_ID: u32 = 37;
    pub const ORDER_QTY: u32 = 38;
    pub const ORD_STATUS: u32 = 39;
    pub const ORD_TYPE: u32 = 40;
    pub const ORIG_CL_ORD_ID: u32 = 41;
    pub const POSS_DUP_FLAG: u32 = 43;
    pub const PRICE: u32 = 44;
    pub const REF_SEQ_NUM: u32 = 45;
    pub const SENDER_COMP_ID: u32 = 49;
    pub const SENDING_TIME: u32 = 52;
    pub const SIDE: u32 = 54;
    pub const SYMBOL: u32 = 55;
    pub const TARGET_COMP_ID: u32 = 56;
    pub const TEXT: u32 = 58;
    pub const TIME_IN_FORCE: u32 = 59;
    pub const TRANSACT_TIME: u32 = 60;
    pub const ENCRYPT_METHOD: u32 = 98;
    pub const CXL_REJ_REASON: u32 = 102;
    pub const ORD_REJ_REASON: u32 = 103;
    pub const HEART_BT_INT: u32 = 108;
    pub const TEST_REQ_ID: u32 = 112;
    pub const ORIG_SENDING_TIME: u32 = 122;
    pub const GAP_FILL_FLAG: u32 = 123;
    pub const RESET_SEQ_NUM_FLAG: u32 = 141;
    pub const EXEC_TYPE: u32 = 150;
    pub const LEAVES_QTY: u32 = 151;
    pub const REF_TAG_ID: u32 = 371;
    pub const REF_MSG_TYPE: u32 = 372;
    pub const SESSION_REJECT_REASON: u32 = 373;
    pub const BUSINESS_REJECT_REASON: u32 = 380;
    pub const CXL_REJ_RESPONSE_TO: u32 = 434;
    pub const PASSWORD: u32 = 554;
}

/// Why bytes are not a FIX message. Framing errors make the message garbled: FIX says to
/// ignore it (no sequence number is consumed) and carry on with the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("message does not start with 8=FIX.4.4")]
    BadBeginString,
    #[error("BodyLength is not a number of at most {BODY_LENGTH_DIGITS_MAX} digits")]
    BadBodyLengthField,
    #[error("BodyLength {0} is over {BODY_BYTES_MAX}")]
    BodyTooLong(usize),
    #[error("BodyLength does not end where the CheckSum field starts")]
    BodyLengthMismatch,
    #[error("CheckSum {got} does not match the computed {want}")]
    BadChecksum { got: u32, want: u32 },
}

/// Why a framed message's fields are unusable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("a field has no '=' or a tag that is not a positive number")]
    BadTag,
    #[error("tag {0} has an empty value")]
    EmptyValue(u32),
    #[error("more than {FIELDS_MAX} fields")]
    TooManyFields,
    #[error("MsgType (35) is not the third field")]
    MsgTypeNotThird,
    #[error("message of {0} bytes is over {BODY_BYTES_MAX} plus its header")]
    TooLong(usize),
}

/// Checks the frame at the front of `buffer`: `Ok(None)` when more bytes are needed,
/// `Ok(Some(len))` for a complete message with a valid BodyLength and CheckSum.
pub fn split_frame(buffer: &[u8]) -> Result<Option<usize>, FrameError> {
    let begin = BEGIN_STRING.len();
    let known = buffer.len().min(begin + 2);
    let expected_prefix: &[u8] = b"8=FIX.4.4\x019=";
    if buffer[..known] != expected_prefix[..known] {
        return Err(FrameError::BadBeginString);
    }
    let digits_at = begin + 2;
    let window = &buffer[digits_at.min(buffer.len())..];
    let Some(digits) = window.iter().position(|&b| b == SOH) else {
        return if window.len() > BODY_LENGTH_DIGITS_MAX {
            Err(FrameError::BadBodyLengthField)
        } else {
            Ok(None)
        };
    };
    let body_length = parse_u64(&window[..digits]).ok_or(FrameError::BadBodyLengthField)? as usize;
    if digits > BODY_LENGTH_DIGITS_MAX {
        return Err(FrameError::BadBodyLengthField);
    }
    if body_length > BODY_BYTES_MAX {
        return Err(FrameError::BodyTooLong(body_length));
    }
    let body_start = digits_at + digits + 1;
    let body_end = body_start + body_length;
    let total = body_end + TRAILER_BYTES;
    if buffer.len() < total {
        return Ok(None);
    }
    let trailer = &buffer[body_end..total];
    let ends_field = body_length > 0 && buffer[body_end - 1] == SOH;
    if !ends_field || &trailer[..3] != b"10=" || trailer[6] != SOH {
        return Err(FrameError::BodyLengthMismatch);
    }
    let got = parse_u64(&trailer[3..6]).ok_or(FrameError::BodyLengthMismatch)? as u32;
    let want = checksum(&buffer[..body_end]);
    if got != want {
        return Err(FrameError::BadChecksum { got, want });
    }
    Ok(Some(total))
}

/// Where the next message may start after a garbled one at the front of `buffer`: the next
/// `8=FIX.4.4<SOH>`, or the tail that could still become one.
pub fn resync(buffer: &[u8]) -> usize {
    let from = 1.min(buffer.len());
    let found = buffer[from..].windows(BEGIN_STRING.len()).position(|w| w == BEGIN_STRING);
    match found {
        Some(at) => from + at,
        None => buffer.len().saturating_sub(BEGIN_STRING.len() - 1).max(from),
    }
}

/// Sum of the bytes modulo 256, as FIX's CheckSum defines it.
pub fn checksum(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0u32, |sum, &b| sum.wrapping_add(u32::from(b))) % 256
}

/// Parses an unsigned decimal (1 to 19 digits, nothing else).
pub fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits
        .iter()
        .try_fold(0u64, |value, &b| b.is_ascii_digit().then(|| value * 10 + u64::from(b - b'0')))
}

/// Parses a FIX integer-valued decimal: digits with an optional sign and an optional
/// fractional part of zeros only ("100", "-5", "100.00"); leantier prices and quantities are
/// integers in their unit, so "100.5" is refused.
pub fn parse_whole(value: &[u8]) -> Option<i64> {
    let (negative, rest) = match value.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, value),
    };
    let (whole, fraction) = match rest.iter().position(|&b| b == b'.') {
        Some(dot) => (&rest[..dot], &rest[dot + 1..]),
        None => (rest, &[][..]),
    };
    if !fraction.iter().all(|&b| b == b'0') {
        return None;
    }
    let magnitude = i64::try_from(parse_u64(whole)?).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// A received message: its bytes and an index of its fields (offsets into the bytes).
pub struct Message<'a> {
    bytes: &'a [u8],
    fields: [(u32, u16, u16); FIELDS_MAX],
    count: usize,
}

impl<'a> Message<'a> {
    /// Indexes the fields of a message that [`split_frame`] accepted.
    pub fn parse(bytes: &'a [u8]) -> Result<Message<'a>, ParseError> {
        // Field offsets are u16; a framed message is far below that.
        if bytes.len() > BODY_BYTES_MAX + 64 {
            return Err(ParseError::TooLong(bytes.len()));
        }
        let mut message = Message { bytes, fields: [(0, 0, 0); FIELDS_MAX], count: 0 };
        let mut at = 0;
        while at < bytes.len() {
            let end = at + bytes[at..].iter().position(|&b| b == SOH).ok_or(ParseError::BadTag)?;
            let field = &bytes[at..end];
            let equals = field.iter().position(|&b| b == b'=').ok_or(ParseError::BadTag)?;
            let tag = parse_u64(&field[..equals])
                .filter(|&t| t > 0 && t <= u64::from(u32::MAX))
                .ok_or(ParseError::BadTag)? as u32;
            if equals + 1 == field.len() {
                return Err(ParseError::EmptyValue(tag));
            }
            if message.count == FIELDS_MAX {
                return Err(ParseError::TooManyFields);
            }
            let value = ((at + equals + 1) as u16, end as u16);
            message.fields[message.count] = (tag, value.0, value.1);
            message.count += 1;
            at = end + 1;
        }
        if message.count < 3 || message.fields[2].0 != tag::MSG_TYPE {
            return Err(ParseError::MsgTypeNotThird);
        }
        Ok(message)
    }

    /// The first value of `tag`.
    pub fn get(&self, tag: u32) -> Option<&'a [u8]> {
        let bytes = self.bytes;
        self.fields[..self.count]
            .iter()
            .find(|field| field.0 == tag)
            .map(|&(_, start, end)| &bytes[start as usize..end as usize])
    }

    /// MsgType (always present: [`Message::parse`] checks it).
    pub fn msg_type(&self) -> &'a [u8] {
        let (_, start, end) = self.fields[2];
        &self.bytes[start as usize..end as usize]
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Every field, in order.
    pub fn fields(&self) -> impl Iterator<Item = (u32, &'a [u8])> + '_ {
        self.fields[..self.count]
            .iter()
            .map(|&(tag, start, end)| (tag, &self.bytes[start as usize..end as usize]))
    }
}

/// Builds outgoing messages into reused buffers.
#[derive(Default)]
pub struct Builder {
    body: Vec<u8>,
    out: Vec<u8>,
}

impl Builder {
    /// Starts a message: MsgType then the standard header fields after it.
    pub fn begin(&mut self, msg_type: &[u8], sender: &[u8], target: &[u8], seq: u64) -> &mut Self {
        self.body.clear();
        self.field(tag::MSG_TYPE, msg_type)
            .field(tag::SENDER_COMP_ID, sender)
            .field(tag::TARGET_COMP_ID, target)
            .int(tag::MSG_SEQ_NUM, seq as i64)
    }

    /// Appends a field with a raw value.
    pub fn field(&mut self, tag: u32, value: &[u8]) -> &mut Self {
        let _ = write!(self.body, "{tag}=");
        self.body.extend_from_slice(value);
        self.body.push(SOH);
        self
    }

    /// Appends a decimal field: `units` of 10^-`decimals` (`101.25` for 1012500 at 4).
    pub fn decimal(&mut self, tag: u32, units: i64, decimals: u32) -> &mut Self {
        // Writing into a Vec cannot fail.
        let _ = write!(self.body, "{tag}=");
        let _ = exchange::instruments::write_scaled(&mut self.body, units, decimals);
        self.body.push(SOH);
        self
    }

    /// Appends an integer field.
    pub fn int(&mut self, tag: u32, value: i64) -> &mut Self {
        // Writing into a Vec cannot fail.
        let _ = write!(self.body, "{tag}={value}\x01");
        self
    }

    /// Closes the message (BodyLength and CheckSum) and returns its bytes.
    pub fn finish(&mut self) -> &[u8] {
        self.out.clear();
        self.out.extend_from_slice(BEGIN_STRING);
        let _ = write!(self.out, "9={}\x01", self.body.len());
        self.out.extend_from_slice(&self.body);
        let sum = checksum(&self.out);
        let _ = write!(self.out, "10={sum:03}\x01");
        &self.out
    }
}

/// Wall-clock nanoseconds since the Unix epoch (FIX timestamps are UTC wall time).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Formats a UTC time (nanoseconds since the Unix epoch) as FIX's UTCTimestamp with
/// milliseconds, `YYYYMMDD-HH:MM:SS.sss`.
pub fn utc_timestamp(unix_ns: u64) -> [u8; 21] {
    let secs = unix_ns / 1_000_000_000;
    let millis = (unix_ns / 1_000_000) % 1000;
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let second_of_day = secs % 86_400;
    let mut text = [0u8; 21];
    let mut cursor = &mut text[..];
    let _ = write!(
        cursor,
        "{year:04}{month:02}{day:02}-{:02}:{:02}:{:02}.{millis:03}",
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60
    );
    text
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// Whether a message type belongs to the session layer (Heartbeat, TestRequest,
/// ResendRequest, Reject, SequenceReset, Logout, Logon): a resend answers these with a gap
/// fill, never again.
pub fn is_session_type(msg_type: &[u8]) -> bool {
    matches!(msg_type, b"0" | b"1" | b"2" | b"3" | b"4" | b"5" | b"A")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_civil_dates() {
        assert_eq!(&utc_timestamp(0), b"19700101-00:00:00.000");
        // 2024-02-29T12:34:56.789Z
        assert_eq!(&utc_timestamp(1_709_210_096_789_000_000), b"20240229-12:34:56.789");
    }

    #[test]
    fn builder_output_frames_and_parses() {
        let mut builder = Builder::default();
        builder.begin(b"0", b"LEANTIER", b"CLIENT1", 7).field(tag::TEST_REQ_ID, b"abc");
        let bytes = builder.finish().to_vec();
        assert_eq!(split_frame(&bytes), Ok(Some(bytes.len())));
        let message = Message::parse(&bytes).unwrap();
        assert_eq!(message.msg_type(), b"0");
        assert_eq!(message.get(tag::MSG_SEQ_NUM), Some(&b"7"[..]));
        assert_eq!(message.get(tag::TEST_REQ_ID), Some(&b"abc"[..]));
    }

    #[test]
    fn whole_numbers_accept_zero_fractions_only() {
        assert_eq!(parse_whole(b"100"), Some(100));
        assert_eq!(parse_whole(b"100.00"), Some(100));
        assert_eq!(parse_whole(b"-5"), Some(-5));
        assert_eq!(parse_whole(b"100.5"), None);
        assert_eq!(parse_whole(b""), None);
        assert_eq!(parse_whole(b"1e3"), None);
    }
}
