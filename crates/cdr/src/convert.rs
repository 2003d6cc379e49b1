//! The Converter: one decoded ticket into the file format (a CSV line) and the database row.
//!
//! The line is formatted into a fixed buffer inside the record (no allocation): tickets travel
//! through rings as `Copy` values.

use std::io::Write;

use crate::ticket::{CallKind, Ticket};

/// Room for the longest CSV line (all fields at their maximum width).
pub const LINE_BYTES_MAX: usize = 160;

/// A row of the `cdr` table.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DbRow {
    pub sequence: i64,
    pub kind: CallKind,
    pub caller: i64,
    pub callee: i64,
    pub start_ms: i64,
    pub duration_s: i32,
    pub volume_bytes: i64,
    pub cell_id: i32,
    pub charge_micros: i64,
}

/// A converted ticket: both output formats.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Converted {
    line: [u8; LINE_BYTES_MAX],
    line_len: u8,
    pub row: DbRow,
}

impl Default for Converted {
    fn default() -> Self {
        Self { line: [0; LINE_BYTES_MAX], line_len: 0, row: DbRow::default() }
    }
}

impl Converted {
    /// The CSV line, newline included.
    pub fn line(&self) -> &[u8] {
        &self.line[..usize::from(self.line_len)]
    }
}

/// Converts a ticket: an ISO-8601 start time, a decimal charge, and the database row.
pub fn convert(ticket: &Ticket) -> Converted {
    let mut converted = Converted {
        row: DbRow {
            sequence: ticket.sequence as i64,
            kind: ticket.kind,
            caller: ticket.caller as i64,
            callee: ticket.callee as i64,
            start_ms: ticket.start_ms as i64,
            duration_s: ticket.duration_s as i32,
            volume_bytes: ticket.volume_bytes as i64,
            cell_id: ticket.cell_id as i32,
            charge_micros: ticket.charge_micros as i64,
        },
        ..Converted::default()
    };
    let (year, month, day) = civil_from_days((ticket.start_ms / 86_400_000) as i64);
    let ms_of_day = ticket.start_ms % 86_400_000;
    let mut cursor = std::io::Cursor::new(&mut converted.line[..]);
    let written = writeln!(
        cursor,
        "{},{},{},{},{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z,{},{},{},{}.{:06}",
        ticket.sequence,
        ticket.kind.as_str(),
        ticket.caller,
        ticket.callee,
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000,
        ticket.duration_s,
        ticket.volume_bytes,
        ticket.cell_id,
        ticket.charge_micros / 1_000_000,
        ticket.charge_micros % 1_000_000,
    );
    // Every field is bounded (u64 at most 20 digits), so the line always fits.
    assert!(written.is_ok(), "a CSV line exceeded {LINE_BYTES_MAX} bytes");
    converted.line_len = cursor.position() as u8;
    converted
}

/// Days since 1970-01-01 → (year, month, day), Howard Hinnant's `civil_from_days`.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_iso_time_and_decimal_charge() {
        let ticket = Ticket {
            sequence: 42,
            kind: CallKind::Data,
            caller: 33_123_456_789,
            callee: 33_987_654_321,
            start_ms: 1_767_225_600_000 + 3_723_004, // 2026-01-01T01:02:03.004Z
            duration_s: 0,
            volume_bytes: 1500,
            cell_id: 77,
            charge_micros: 2_000_250,
        };
        let converted = convert(&ticket);
        assert_eq!(
            std::str::from_utf8(converted.line()).unwrap(),
            "42,data,33123456789,33987654321,2026-01-01T01:02:03.004Z,0,1500,77,2.000250\n"
        );
        assert_eq!(converted.row.charge_micros, 2_000_250);
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn widest_ticket_fits() {
        let ticket = Ticket {
            sequence: u64::MAX,
            kind: CallKind::Voice,
            caller: u64::MAX,
            callee: u64::MAX,
            start_ms: 253_402_300_799_999, // 9999-12-31T23:59:59.999Z
            duration_s: u32::MAX,
            volume_bytes: u64::MAX,
            cell_id: u32::MAX,
            charge_micros: u64::MAX,
        };
        assert!(convert(&ticket).line().len() < LINE_BYTES_MAX);
    }
}
