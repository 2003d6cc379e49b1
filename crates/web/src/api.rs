//! The published JSON API: request parsing and validation, error codes, response bodies.
//!
//! Validation runs in a fixed order so that every refusal happens before the work it protects:
//! JSON syntax and types (002) → required fields (003) → size limits (006, before any buffer
//! proportional to the matrix is allocated) → shapes (001) → answer size (014, predicted from the
//! shapes, before any cell is read) → cells (005, 004) → multiplication (008). The body-size
//! limit (007) is enforced by the server before this module sees a byte.
//!
//! | code | HTTP | meaning |
//! |------|------|---------|
//! | 001  | 422  | Invalid number of columns and rows for multiplication (A's columnCount ≠ B's row count) |
//! | 002  | 400  | Malformed JSON (syntax error or a field of the wrong JSON type) |
//! | 003  | 400  | A required field is missing |
//! | 004  | 400  | A cell is not a decimal integer in the signed 64-bit range |
//! | 005  | 400  | A row's number of cells differs from its matrix's columnCount |
//! | 006  | 422  | A matrix is empty or beyond the configured size limit |
//! | 007  | 413  | The request body is larger than the configured limit |
//! | 008  | 422  | A result cell overflows a signed 64-bit integer |
//! | 009  | 503  | The server is busy: the execution model's queue or the work bound is full; retry later |
//! | 010  | 503  | Too many connections: the connection was closed without reading a request |
//! | 011  | 400  | Malformed request framing (e.g. a bad chunk size); the connection is closed |
//! | 012  | 501  | A transfer coding other than `chunked` (e.g. `gzip, chunked`) |
//! | 013  | 408  | The request body did not arrive within the body timeout; the connection is closed |
//! | 014  | 422  | The answer would be larger than the configured limit (predicted from the shapes) |

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::kernel::{Matrix, Overflow};

/// Bounds on one request's matrices; each is checked before any allocation it would size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeLimits {
    /// Most rows or columns of any matrix (operands and result).
    pub dim_max: usize,
    /// Most cells of any one matrix (operands and result).
    pub cells_max: usize,
    /// Most bytes of an answer, as [`answer_bytes_max`] predicts them from the shapes.
    pub answer_bytes_max: usize,
}

/// Default largest dimension: twice the study's "high" complexity (2000 rows).
pub const DIM_MAX_DEFAULT: usize = 4096;
/// Default cell bound: 2^22 cells = 32 MiB of `i64` per matrix.
pub const CELLS_MAX_DEFAULT: usize = 1 << 22;
/// Default answer bound, in bytes of the answer's worst-case text: 8 MiB holds about 400,000
/// cells (632×632; the study's largest answer, 2000×20, is at most 846 KB), and with its product
/// (8 bytes a cell) takes 11 MiB, within one large lane. The cell bound alone let a 106 KB body
/// (4096×1 · 1×1024) ask for an 88 MB answer.
pub const ANSWER_BYTES_MAX_DEFAULT: usize = 8 << 20;

impl Default for SizeLimits {
    fn default() -> Self {
        SizeLimits {
            dim_max: DIM_MAX_DEFAULT,
            cells_max: CELLS_MAX_DEFAULT,
            answer_bytes_max: ANSWER_BYTES_MAX_DEFAULT,
        }
    }
}

impl SizeLimits {
    /// The most work bytes (answer plus product, as [`Request::work_bytes`] counts them) of an
    /// answer within `answer_bytes_max`: each cell takes at most 8 bytes of product for every
    /// [`CELL_TEXT_BYTES_MAX`] bytes of answer.
    pub fn answer_work_bytes_max(&self) -> usize {
        let cells_max = self.answer_bytes_max / CELL_TEXT_BYTES_MAX;
        self.answer_bytes_max.saturating_add(cells_max.saturating_mul(size_of::<i64>()))
    }
}

/// A documented error: its code, HTTP status and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    ShapeMismatch,
    MalformedJson,
    MissingField,
    NonNumericCell,
    RowLength,
    TooLarge,
    BodyTooLarge,
    Overflow,
    Busy,
    TooManyConnections,
    MalformedFraming,
    UnsupportedCoding,
    BodyTimeout,
    AnswerTooLarge,
}

impl ErrorCode {
    /// Every code, for documentation and tests.
    pub const ALL: [ErrorCode; 14] = [
        ErrorCode::ShapeMismatch,
        ErrorCode::MalformedJson,
        ErrorCode::MissingField,
        ErrorCode::NonNumericCell,
        ErrorCode::RowLength,
        ErrorCode::TooLarge,
        ErrorCode::BodyTooLarge,
        ErrorCode::Overflow,
        ErrorCode::Busy,
        ErrorCode::TooManyConnections,
        ErrorCode::MalformedFraming,
        ErrorCode::UnsupportedCoding,
        ErrorCode::BodyTimeout,
        ErrorCode::AnswerTooLarge,
    ];

    /// The three-digit code sent as `errorCode`.
    pub fn code(self) -> &'static str {
        match self {
            ErrorCode::ShapeMismatch => "001",
            ErrorCode::MalformedJson => "002",
            ErrorCode::MissingField => "003",
            ErrorCode::NonNumericCell => "004",
            ErrorCode::RowLength => "005",
            ErrorCode::TooLarge => "006",
            ErrorCode::BodyTooLarge => "007",
            ErrorCode::Overflow => "008",
            ErrorCode::Busy => "009",
            ErrorCode::TooManyConnections => "010",
            ErrorCode::MalformedFraming => "011",
            ErrorCode::UnsupportedCoding => "012",
            ErrorCode::BodyTimeout => "013",
            ErrorCode::AnswerTooLarge => "014",
        }
    }

    /// The HTTP status that goes with the code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::MalformedJson
            | ErrorCode::MissingField
            | ErrorCode::NonNumericCell
            | ErrorCode::RowLength
            | ErrorCode::MalformedFraming => 400,
            ErrorCode::BodyTimeout => 408,
            ErrorCode::BodyTooLarge => 413,
            ErrorCode::ShapeMismatch
            | ErrorCode::TooLarge
            | ErrorCode::Overflow
            | ErrorCode::AnswerTooLarge => 422,
            ErrorCode::UnsupportedCoding => 501,
            ErrorCode::Busy | ErrorCode::TooManyConnections => 503,
        }
    }
}

/// A refused request: the code and a message with the specific reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
}

impl Failure {
    fn new(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure { code, message: message.into() }
    }

    /// The published message for code 001.
    pub fn shape_mismatch() -> Failure {
        Failure::new(
            ErrorCode::ShapeMismatch,
            "Invalid number of columns and rows for multiplication",
        )
    }

    pub fn body_too_large(limit_bytes: usize) -> Failure {
        Failure::new(ErrorCode::BodyTooLarge, format!("Request body exceeds {limit_bytes} bytes"))
    }

    pub fn busy() -> Failure {
        Failure::new(ErrorCode::Busy, "Server busy: the request queue is full, retry later")
    }

    /// Code 009 from the work bound: the bytes of request bodies in flight.
    pub fn work_bound_full(body_bytes: usize, waited: std::time::Duration) -> Failure {
        Failure::new(
            ErrorCode::Busy,
            format!(
                "Server busy: no room for a {body_bytes}-byte body within the work bound after {} ms, retry later",
                waited.as_millis()
            ),
        )
    }

    /// Code 009 from the work bound, for a request whose product and answer need more room than
    /// its body held.
    pub fn answer_room_full(work_bytes: usize, waited: std::time::Duration) -> Failure {
        Failure::new(
            ErrorCode::Busy,
            format!(
                "Server busy: no room for the {work_bytes} bytes of this request's product and answer within the work bound after {} ms, retry later",
                waited.as_millis()
            ),
        )
    }

    /// Code 009 from the connection's share of the work bound: its own answers, not yet read.
    pub fn connection_share_full(held_bytes: usize, share_bytes: usize) -> Failure {
        Failure::new(
            ErrorCode::Busy,
            format!(
                "Server busy: this connection already holds {held_bytes} bytes of work (requests and answers not yet read) of its {share_bytes}-byte share; read the answers, then retry"
            ),
        )
    }

    /// Code 014: the answer, predicted from the shapes, is beyond `answer_bytes_max`.
    pub fn answer_too_large(
        rows: usize,
        cols: usize,
        answer_bytes: usize,
        limit: usize,
    ) -> Failure {
        Failure::new(
            ErrorCode::AnswerTooLarge,
            format!(
                "Answer too large: a {rows}x{cols} result takes up to {answer_bytes} bytes; the limit is {limit}"
            ),
        )
    }

    pub fn too_many_connections(connections_max: usize) -> Failure {
        Failure::new(
            ErrorCode::TooManyConnections,
            format!("Too many connections: this server serves at most {connections_max} at once"),
        )
    }

    /// Code 010 from the per-address bound: this client's address holds its share of the
    /// connections, none of them idle.
    pub fn too_many_connections_from_address(per_address_max: usize) -> Failure {
        Failure::new(
            ErrorCode::TooManyConnections,
            format!(
                "Too many connections from this address: this server serves at most {per_address_max} from one address at once"
            ),
        )
    }

    pub fn malformed_framing(reason: impl std::fmt::Display) -> Failure {
        Failure::new(ErrorCode::MalformedFraming, format!("Malformed request framing: {reason}"))
    }

    pub fn unsupported_coding(coding: &str) -> Failure {
        Failure::new(
            ErrorCode::UnsupportedCoding,
            format!("Unsupported transfer coding {:?}: only chunked is accepted", truncate(coding)),
        )
    }

    pub fn body_timeout(timeout: std::time::Duration) -> Failure {
        Failure::new(
            ErrorCode::BodyTimeout,
            format!("The request body did not arrive within {} ms", timeout.as_millis()),
        )
    }
}

impl From<Overflow> for Failure {
    fn from(overflow: Overflow) -> Failure {
        Failure::new(ErrorCode::Overflow, overflow.to_string())
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestWire<'a> {
    #[serde(borrow)]
    request_id: Option<&'a RawValue>,
    #[serde(borrow)]
    matrix_one: Option<MatrixWire<'a>>,
    #[serde(borrow)]
    matrix_two: Option<MatrixWire<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MatrixWire<'a> {
    column_count: Option<u64>,
    #[serde(borrow)]
    rows: Option<Vec<RowWire<'a>>>,
}

#[derive(Deserialize)]
struct RowWire<'a> {
    #[serde(borrow)]
    value: Option<Cow<'a, str>>,
}

/// A validated request: the id as raw JSON (a number or a string) and both operands.
#[derive(Debug)]
pub struct Request<'a> {
    pub id: &'a RawValue,
    pub a: Matrix,
    pub b: Matrix,
}

impl Request<'_> {
    /// The bytes this request holds at most until its answer is written: the larger of its
    /// body (`body_bytes`, which its operands are parsed from) and its product (8 bytes a
    /// cell) plus its answer, which [`write_success`] sizes before rendering for its cells'
    /// longest text. Known before multiplying: no product cell exceeds `max|a| · max|b| · k`
    /// (the kernel's own bound), so the answer takes at most that magnitude's text a cell, and
    /// never more than [`answer_bytes_max`] (the study's cells, below 1000, take 10 bytes).
    pub fn work_bytes(&self, body_bytes: usize) -> usize {
        let magnitude_bound = u128::from(self.a.magnitude_max)
            .saturating_mul(u128::from(self.b.magnitude_max))
            .saturating_mul(self.a.cols as u128);
        // A larger bound is refused (008) or fits i64 anyway: the text is at most i64's.
        let magnitude = u64::try_from(magnitude_bound).unwrap_or(u64::MAX).min(1 << 63);
        let (rows, cols) = (self.a.rows, self.b.cols);
        let product_bytes = rows.saturating_mul(cols).saturating_mul(size_of::<i64>());
        let answer_bytes =
            answer_bytes(rows, cols, self.id.get().len(), cell_text_bytes(magnitude));
        body_bytes.max(product_bytes.saturating_add(answer_bytes))
    }
}

/// The result of parsing: the request, or a failure with whatever id could be read.
pub type Parsed<'a> = Result<Request<'a>, (Option<&'a RawValue>, Failure)>;

/// Parses and validates a request body.
pub fn parse_request<'a>(body: &'a [u8], limits: &SizeLimits) -> Parsed<'a> {
    let wire: RequestWire<'a> = serde_json::from_slice(body).map_err(|e| {
        (None, Failure::new(ErrorCode::MalformedJson, format!("Malformed JSON: {e}")))
    })?;
    // An id that is not a JSON number or string a client can read back (e.g. `1e9997`, out
    // of range for a double) is not echoed: the answer carries `null` instead.
    let id = wire.request_id.filter(|id| id_is_echoable(id.get()));
    validate(wire, limits).map_err(|failure| (id, failure))
}

/// A string, or a number that parses as a finite double (what JSON readers accept).
fn id_is_echoable(id_text: &str) -> bool {
    id_text.starts_with('"') || id_text.parse::<f64>().is_ok_and(f64::is_finite)
}

fn validate<'a>(wire: RequestWire<'a>, limits: &SizeLimits) -> Result<Request<'a>, Failure> {
    let id = wire.request_id.ok_or_else(|| missing("requestId"))?;
    if !id_is_echoable(id.get()) {
        return Err(Failure::new(
            ErrorCode::MalformedJson,
            "Malformed JSON: requestId must be a string or a number within a double's range",
        ));
    }
    let one = wire.matrix_one.ok_or_else(|| missing("matrixOne"))?;
    let two = wire.matrix_two.ok_or_else(|| missing("matrixTwo"))?;
    let (one_cols, one_rows) = fields(one, "matrixOne")?;
    let (two_cols, two_rows) = fields(two, "matrixTwo")?;
    check_size("matrixOne", one_rows.len(), one_cols, limits)?;
    check_size("matrixTwo", two_rows.len(), two_cols, limits)?;
    check_size("result", one_rows.len(), two_cols, limits)?;
    if one_cols != two_rows.len() {
        return Err(Failure::shape_mismatch());
    }
    let answer_bytes = answer_bytes_max(one_rows.len(), two_cols, id.get().len());
    if answer_bytes > limits.answer_bytes_max {
        let (rows, limit) = (one_rows.len(), limits.answer_bytes_max);
        return Err(Failure::answer_too_large(rows, two_cols, answer_bytes, limit));
    }
    let a = parse_cells("matrixOne", &one_rows, one_cols)?;
    let b = parse_cells("matrixTwo", &two_rows, two_cols)?;
    Ok(Request { id, a, b })
}

fn missing(field: &str) -> Failure {
    Failure::new(ErrorCode::MissingField, format!("Missing field: {field}"))
}

fn fields<'a>(wire: MatrixWire<'a>, name: &str) -> Result<(usize, Vec<RowWire<'a>>), Failure> {
    let cols = wire.column_count.ok_or_else(|| missing(&format!("{name}.columnCount")))?;
    let rows = wire.rows.ok_or_else(|| missing(&format!("{name}.rows")))?;
    // A count beyond usize is beyond any limit; saturate so check_size refuses it.
    Ok((usize::try_from(cols).unwrap_or(usize::MAX), rows))
}

fn check_size(name: &str, rows: usize, cols: usize, limits: &SizeLimits) -> Result<(), Failure> {
    let cells = rows.checked_mul(cols);
    let within = rows >= 1
        && cols >= 1
        && rows <= limits.dim_max
        && cols <= limits.dim_max
        && cells.is_some_and(|c| c <= limits.cells_max);
    if within {
        return Ok(());
    }
    Err(Failure::new(
        ErrorCode::TooLarge,
        format!(
            "Matrix size out of bounds: {name} is {rows}x{cols}; each dimension must be 1..={} and cells <= {}",
            limits.dim_max, limits.cells_max
        ),
    ))
}

fn parse_cells(name: &str, rows: &[RowWire<'_>], cols: usize) -> Result<Matrix, Failure> {
    // check_size bounded rows * cols, so this allocation is bounded too.
    let mut cells = Vec::with_capacity(rows.len() * cols);
    let mut magnitude_max = 0u64;
    for (r, row) in rows.iter().enumerate() {
        let text =
            row.value.as_deref().ok_or_else(|| missing(&format!("{name}.rows[{r}].value")))?;
        let before = cells.len();
        match scan_row(text.as_bytes(), cols, &mut cells, &mut magnitude_max) {
            RowScan::Complete => {}
            RowScan::BadCell { at } => {
                let cell = text[at..].split(',').next().unwrap_or_default();
                return Err(Failure::new(
                    ErrorCode::NonNumericCell,
                    format!("Non-numeric cell in {name} row {r}: {:?}", truncate(cell)),
                ));
            }
            RowScan::WrongLength { more } => {
                let found = if more {
                    format!("more than {cols}")
                } else {
                    (cells.len() - before).to_string()
                };
                return Err(Failure::new(
                    ErrorCode::RowLength,
                    format!(
                        "Row length mismatch in {name} row {r}: {found} cells, columnCount is {cols}"
                    ),
                ));
            }
        }
    }
    Ok(Matrix { rows: rows.len(), cols, cells, magnitude_max })
}

/// How scanning one row's `"v1,v2,..."` text ended.
#[derive(Debug, PartialEq, Eq)]
enum RowScan {
    /// Exactly `cols` cells were appended.
    Complete,
    /// The cell starting at byte `at` is not a decimal `i64`.
    BadCell { at: usize },
    /// Fewer cells than `cols` (all appended), or `more` than `cols`.
    WrongLength { more: bool },
}

/// Parses the comma-separated cells of one row straight from the bytes into `cells` in one pass
/// (no split, no per-cell `str::parse`; that pair was the largest cost of a medium request).
/// Like `str::split`, an empty text is one (empty, so bad) cell.
fn scan_row(bytes: &[u8], cols: usize, cells: &mut Vec<i64>, magnitude_max: &mut u64) -> RowScan {
    let mut at = 0usize;
    let mut count = 0usize;
    loop {
        count += 1;
        if count > cols {
            return RowScan::WrongLength { more: true };
        }
        let Some((value, end)) = scan_cell(bytes, at) else {
            return RowScan::BadCell { at };
        };
        *magnitude_max = (*magnitude_max).max(value.unsigned_abs());
        cells.push(value);
        match bytes.get(end) {
            None if count == cols => return RowScan::Complete,
            None => return RowScan::WrongLength { more: false },
            Some(b',') => at = end + 1,
            Some(_) => return RowScan::BadCell { at },
        }
    }
}

/// Any 19 decimal digits fit `u64` (10^19 - 1 < 2^64), so shorter cells need no overflow checks.
const U64_SAFE_DIGITS: usize = 19;

/// One cell from `bytes[at..]`: its value and the index just past it (a `,` or the end). A cell
/// is optional blanks (space, tab), an optional `-`, decimal digits, optional blanks, and must fit
/// `i64` (`-9223372036854775808` included); a `+` sign is refused, as documented.
fn scan_cell(bytes: &[u8], mut at: usize) -> Option<(i64, usize)> {
    let blank = |b: u8| b == b' ' || b == b'\t';
    while bytes.get(at).copied().is_some_and(blank) {
        at += 1;
    }
    let negative = bytes.get(at) == Some(&b'-');
    at += usize::from(negative);
    let word = bytes.get(at..at + 8).and_then(|chunk| chunk.first_chunk::<8>());
    let (magnitude, digits) = match word.and_then(short_digits_swar) {
        Some(short) => short,
        None => digits_scalar(&bytes[at.min(bytes.len())..])?,
    };
    if digits == 0 {
        return None;
    }
    at += digits;
    while bytes.get(at).copied().is_some_and(blank) {
        at += 1;
    }
    let value = if negative {
        // i64::MIN's magnitude is one past i64::MAX.
        0i64.checked_sub_unsigned(magnitude)?
    } else {
        i64::try_from(magnitude).ok()?
    };
    Some((value, at))
}

/// The leading decimal digits of `word` (first byte first) and their count, when fewer than 8:
/// eight bytes are classified and converted at once (SWAR), which is the common case of a cell
/// followed by more of its row. `None` when all 8 bytes are digits (the scalar path takes over).
fn short_digits_swar(word: &[u8; 8]) -> Option<(u64, usize)> {
    // Digits become 0..=9 per byte; anything else becomes 10..=255.
    let values = u64::from_le_bytes(*word) ^ 0x3030_3030_3030_3030;
    // A byte's top bit is set when its value is 10 or more (0x76 = 0x80 - 10), or already set.
    // A carry out of a byte only comes from a flagged byte, so it cannot hide the first one.
    let flagged = (values.wrapping_add(0x7676_7676_7676_7676) | values) & 0x8080_8080_8080_8080;
    if flagged == 0 {
        return None;
    }
    let count = (flagged.trailing_zeros() / 8) as usize;
    if count == 0 {
        return Some((0, 0));
    }
    // The digits moved to the top bytes; the bytes below read as leading zeros.
    let mut digits = values << (8 * (8 - count));
    digits = (digits & 0x0F0F_0F0F_0F0F_0F0F).wrapping_mul(10 << 8 | 1) >> 8;
    digits = (digits & 0x00FF_00FF_00FF_00FF).wrapping_mul(100 << 16 | 1) >> 16;
    digits = (digits & 0x0000_FFFF_0000_FFFF).wrapping_mul(10_000 << 32 | 1) >> 32;
    Some((digits, count))
}

/// The leading decimal digits of `bytes` and their count, one byte at a time; `None` when they
/// exceed `u64`.
fn digits_scalar(bytes: &[u8]) -> Option<(u64, usize)> {
    let count = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    let text = &bytes[..count];
    let digit = |byte: &u8| u64::from(byte - b'0');
    let magnitude = if count <= U64_SAFE_DIGITS {
        text.iter().fold(0u64, |sum, byte| sum * 10 + digit(byte))
    } else {
        // Checked: a magnitude beyond u64 is refused here, never wrapped.
        text.iter().try_fold(0u64, |sum, byte| sum.checked_mul(10)?.checked_add(digit(byte)))?
    };
    Some((magnitude, count))
}

/// Keeps error messages short whatever the client sent.
fn truncate(cell: &str) -> &str {
    const SHOWN_CHARS_MAX: usize = 32;
    match cell.char_indices().nth(SHOWN_CHARS_MAX) {
        Some((end, _)) => &cell[..end],
        None => cell,
    }
}

/// The most bytes of a cell in an answer: the longest `i64` and its comma.
const CELL_TEXT_BYTES_MAX: usize = I64_TEXT_BYTES_MAX + 1;

/// The most bytes of a cell whose magnitude is at most `magnitude`: its digits, a sign and
/// a comma (at most [`CELL_TEXT_BYTES_MAX`]).
fn cell_text_bytes(magnitude: u64) -> usize {
    magnitude.checked_ilog10().map_or(1, |log| log as usize + 1) + 2
}
/// An answer's bytes around its rows and id: `{"requestId":"` `","rows":[` `]}`, rounded up.
const ANSWER_FRAME_BYTES: usize = 32;

/// The most bytes of the rows of a `rows`×`cols` answer whose cells take at most `cell_bytes`
/// each (with their comma), with `[`, `]` and `,` around each row.
fn rows_text_bytes(rows: usize, cols: usize, cell_bytes: usize) -> usize {
    let cells = rows.saturating_mul(cols);
    cells.saturating_mul(cell_bytes).saturating_add(rows.saturating_mul(3))
}

/// The most bytes of the answer to a `rows`×`cols` product whose cells take at most
/// `cell_bytes` each, for an id whose JSON text is `id_bytes` long. [`write_success`] reserves
/// exactly this (with the product's largest cell) before rendering: it is also the memory the
/// answer takes.
fn answer_bytes(rows: usize, cols: usize, id_bytes: usize, cell_bytes: usize) -> usize {
    let frame_bytes = ANSWER_FRAME_BYTES.saturating_add(id_bytes);
    rows_text_bytes(rows, cols, cell_bytes).saturating_add(frame_bytes)
}

/// The most bytes of the answer to a `rows`×`cols` product, whatever its cells, for an id whose
/// JSON text is `id_bytes` long: known from the shapes alone, before any cell is read.
pub fn answer_bytes_max(rows: usize, cols: usize, id_bytes: usize) -> usize {
    answer_bytes(rows, cols, id_bytes, CELL_TEXT_BYTES_MAX)
}

/// Writes `{"requestId":"<id>","rows":[[..],..]}`; a numeric id is quoted, as published.
pub fn write_success(id: &RawValue, product: &Matrix, out: &mut Vec<u8>) {
    out.clear();
    let cell_bytes = cell_text_bytes(product.magnitude_max);
    out.reserve(answer_bytes(product.rows, product.cols, id.get().len(), cell_bytes));
    out.extend_from_slice(b"{\"requestId\":");
    let id_text = id.get().as_bytes();
    if id_text.first() == Some(&b'"') {
        out.extend_from_slice(id_text);
    } else {
        out.push(b'"');
        out.extend_from_slice(id_text);
        out.push(b'"');
    }
    out.extend_from_slice(b",\"rows\":[");
    // The rows are written into a slice sized for the longest possible text and cut to length
    // after: one resize instead of a capacity check (and a small copy) per byte or number.
    let start = out.len();
    out.resize(start + rows_text_bytes(product.rows, product.cols, cell_bytes), 0);
    let mut at = start;
    for (r, row) in product.cells.chunks_exact(product.cols).enumerate() {
        if r > 0 {
            out[at] = b',';
            at += 1;
        }
        out[at] = b'[';
        at += 1;
        for (c, &value) in row.iter().enumerate() {
            if c > 0 {
                out[at] = b',';
                at += 1;
            }
            at = write_i64_at(value, out, at);
        }
        out[at] = b']';
        at += 1;
    }
    out.truncate(at);
    out.extend_from_slice(b"]}");
}

/// Writes `{"requestId":<id as sent, or null>,"errorCode":"0NN","errorMessage":"..."}`.
pub fn write_failure(id: Option<&RawValue>, failure: &Failure, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(b"{\"requestId\":");
    out.extend_from_slice(id.map_or("null", RawValue::get).as_bytes());
    out.extend_from_slice(b",\"errorCode\":\"");
    out.extend_from_slice(failure.code.code().as_bytes());
    out.extend_from_slice(b"\",\"errorMessage\":");
    // Serialising a &str into a Vec cannot fail.
    serde_json::to_writer(&mut *out, &failure.message).expect("string serialisation");
    out.push(b'}');
}

/// The longest decimal `i64`: `-9223372036854775808`.
const I64_TEXT_BYTES_MAX: usize = 20;

/// "00" "01" ... "99": two digits per division instead of one.
const DIGIT_PAIRS: [u8; 200] = {
    let mut pairs = [0u8; 200];
    let mut value = 0;
    while value < 100 {
        pairs[value * 2] = b'0' + (value / 10) as u8;
        pairs[value * 2 + 1] = b'0' + (value % 10) as u8;
        value += 1;
    }
    pairs
};

/// Writes `value` in decimal at `out[at..]` (room for [`I64_TEXT_BYTES_MAX`] bytes) and returns
/// the index just past it.
fn write_i64_at(value: i64, out: &mut [u8], mut at: usize) -> usize {
    if value < 0 {
        out[at] = b'-';
        at += 1;
    }
    let mut magnitude = value.unsigned_abs();
    let end = at + magnitude.checked_ilog10().map_or(1, |log| log as usize + 1);
    let mut cursor = end;
    while magnitude >= 100 {
        let pair = (magnitude % 100) as usize * 2;
        magnitude /= 100;
        cursor -= 2;
        out[cursor..cursor + 2].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    }
    if magnitude >= 10 {
        let pair = magnitude as usize * 2;
        out[cursor - 2..cursor].copy_from_slice(&DIGIT_PAIRS[pair..pair + 2]);
    } else {
        out[cursor - 1] = b'0' + magnitude as u8;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"{"requestId": 2238, "matrixOne": {"columnCount": 3, "rows": [{"value": "1,2,3"},
        {"value": "4,5,6"}]}, "matrixTwo": {"columnCount": 2, "rows": [{"value": "7,8"},
        {"value": "9,10"}, {"value": "11,12"}]}}"#;

    /// The standard library's reading of a cell: blanks trimmed, no `+`, `str::parse`.
    fn reference_cell(cell: &str) -> Option<i64> {
        let trimmed = cell.trim_matches(|c: char| c == ' ' || c == '\t');
        if trimmed.starts_with('+') {
            return None;
        }
        trimmed.parse().ok()
    }

    fn failure_of(body: &str) -> Failure {
        parse_request(body.as_bytes(), &SizeLimits::default()).unwrap_err().1
    }

    #[test]
    fn published_example_parses() {
        let request = parse_request(EXAMPLE.as_bytes(), &SizeLimits::default()).unwrap();
        assert_eq!(request.id.get(), "2238");
        assert_eq!(request.a.cells, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!((request.b.rows, request.b.cols), (3, 2));
        let product = crate::kernel::multiply(&request.a, &request.b).unwrap();
        let mut out = Vec::new();
        write_success(request.id, &product, &mut out);
        assert_eq!(out, br#"{"requestId":"2238","rows":[[58,64],[139,154]]}"#);
    }

    #[test]
    fn each_validation_code_is_reachable() {
        let cases = [
            (
                EXAMPLE
                    .replace("\"columnCount\": 3", "\"columnCount\": 2")
                    .replace("1,2,3", "1,2")
                    .replace("4,5,6", "4,5"),
                ErrorCode::ShapeMismatch,
            ),
            ("{\"requestId\": 1,".to_string(), ErrorCode::MalformedJson),
            (EXAMPLE.replace("\"requestId\": 2238,", ""), ErrorCode::MissingField),
            (EXAMPLE.replace("\"9,10\"", "\"9,x\""), ErrorCode::NonNumericCell),
            (EXAMPLE.replace("\"9,10\"", "\"9,10,11\""), ErrorCode::RowLength),
            (EXAMPLE.replace("\"columnCount\": 2", "\"columnCount\": 99999"), ErrorCode::TooLarge),
        ];
        for (body, code) in cases {
            assert_eq!(failure_of(&body).code, code, "{body}");
        }
    }

    /// The answer bound refuses from the shapes alone (a bad cell is never reached) and the
    /// prediction covers what rendering allocates, for the longest cells too.
    #[test]
    fn an_answer_past_its_bound_is_refused_before_its_cells_are_read() {
        let predicted = answer_bytes_max(2, 2, "2238".len());
        let tight = SizeLimits { answer_bytes_max: predicted - 1, ..SizeLimits::default() };
        let bad_cell = EXAMPLE.replace("\"9,10\"", "\"9,x\"");
        let (id, failure) = parse_request(bad_cell.as_bytes(), &tight).unwrap_err();
        assert_eq!(
            (id.map(RawValue::get), failure.code),
            (Some("2238"), ErrorCode::AnswerTooLarge)
        );
        assert!(failure.message.contains(&predicted.to_string()), "{}", failure.message);
        let exact = SizeLimits { answer_bytes_max: predicted, ..tight };
        assert!(parse_request(EXAMPLE.as_bytes(), &exact).is_ok());
        let id = RawValue::from_string("\"q\"".into()).unwrap();
        let widest = Matrix::from_cells(3, 2, vec![i64::MIN; 6]);
        let mut out = Vec::new();
        write_success(&id, &widest, &mut out);
        assert!(out.capacity() <= answer_bytes_max(3, 2, 3), "{} bytes", out.capacity());
        assert!(out.len() <= answer_bytes_max(3, 2, 3));
    }

    /// Before multiplying, a request's work covers what its product and rendered answer take,
    /// from the operands' magnitudes: short cells reserve short text, and the bound holds at
    /// every magnitude up to i64's.
    #[test]
    fn the_work_of_a_request_covers_its_product_and_answer() {
        for cell in ["0", "7", "-99", "3037000499", "-3037000499", "9223372036854775807"] {
            let body = EXAMPLE.replace("\"9,10\"", &format!("\"9,{cell}\""));
            let request = parse_request(body.as_bytes(), &SizeLimits::default()).unwrap();
            let work = request.work_bytes(0);
            let Ok(product) = crate::kernel::multiply(&request.a, &request.b) else {
                continue; // 008: nothing is rendered
            };
            let mut out = Vec::new();
            write_success(request.id, &product, &mut out);
            let product_bytes = product.cells.capacity() * size_of::<i64>();
            assert!(out.capacity() + product_bytes <= work, "{cell}: {} > {work}", out.capacity());
            assert!(work <= answer_bytes_max(2, 2, 4) + product_bytes, "{cell}");
        }
        let study = crate::workload::Shape::study(2000).request_body(1, 1);
        let request = parse_request(&study, &SizeLimits::default()).unwrap();
        assert!(request.work_bytes(study.len()) < 1 << 20, "the study's largest stays small");
    }

    #[test]
    fn failure_echoes_id_and_escapes_message() {
        let body = EXAMPLE.replace("2238", "\"q\\\"1\"").replace("\"9,10\"", "\"9,\\\"\"");
        let (id, failure) = parse_request(body.as_bytes(), &SizeLimits::default()).unwrap_err();
        let mut out = Vec::new();
        write_failure(id, &failure, &mut out);
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(json["requestId"], "q\"1");
        assert_eq!(json["errorCode"], "004");
    }

    #[test]
    fn an_id_out_of_a_doubles_range_is_rejected_and_not_echoed() {
        for id in ["1e9997", "-1e400", "true", "[1]"] {
            let body = EXAMPLE.replace("2238", id);
            let (echoed, failure) =
                parse_request(body.as_bytes(), &SizeLimits::default()).unwrap_err();
            assert_eq!(failure.code, ErrorCode::MalformedJson, "{id}");
            assert!(echoed.is_none(), "{id} was echoed");
            let mut out = Vec::new();
            write_failure(echoed, &failure, &mut out);
            let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
            assert!(json["requestId"].is_null(), "{id}: {json}");
        }
        // A large but finite number is still an id, echoed as sent.
        let body = EXAMPLE.replace("2238", "1e300").replace("\"9,10\"", "\"9,x\"");
        let (echoed, _) = parse_request(body.as_bytes(), &SizeLimits::default()).unwrap_err();
        assert_eq!(echoed.map(RawValue::get), Some("1e300"));
    }

    #[test]
    fn integers_render_like_the_standard_formatter() {
        let render = |value: i64| {
            let mut out = [0u8; I64_TEXT_BYTES_MAX];
            let end = write_i64_at(value, &mut out, 0);
            String::from_utf8(out[..end].to_vec()).unwrap()
        };
        let edges = [0, 7, -7, 9, 10, 99, 100, -100, 1234567890, i64::MIN, i64::MAX];
        let powers = (0..19).flat_map(|e| [10i64.pow(e) - 1, 10i64.pow(e), -(10i64.pow(e))]);
        for value in edges.into_iter().chain(powers) {
            assert_eq!(render(value), value.to_string());
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..10_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let value = state as i64 >> (state % 64);
            assert_eq!(render(value), value.to_string());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes never panic and always yield a code that validation can produce.
        #[test]
        fn arbitrary_bytes_are_refused_or_accepted_without_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Err((_, failure)) = parse_request(&body, &SizeLimits::default()) {
                prop_assert!(failure.code.http_status() >= 400);
            }
        }

        /// The one-pass scanner reads a cell exactly as `str::parse` does (blanks, signs, digits,
        /// the i64 bounds and beyond).
        #[test]
        fn cell_scan_matches_std_parse(
            cell in prop_oneof![
                "[ \t+0-9a,-]{0,24}",
                "[0-9]{1,9}",
                "[ \u{0}/:\u{80}-\u{ff}0-9]{1,9}",
                any::<i64>().prop_map(|v| v.to_string()),
                any::<i64>().prop_map(|v| format!(" {v}0\t")),
            ],
        ) {
            let expected = reference_cell(&cell);
            let scanned = scan_cell(cell.as_bytes(), 0)
                .filter(|&(_, end)| end == cell.len())
                .map(|(value, _)| value);
            prop_assert_eq!(scanned, expected, "{:?}", cell);
            // Followed by more of its row, a cell is read 8 bytes at a time: the same answer.
            let in_row = format!("{cell},12345678");
            let scanned = scan_cell(in_row.as_bytes(), 0)
                .filter(|&(_, end)| end == cell.len())
                .map(|(value, _)| value);
            prop_assert_eq!(scanned, expected, "{:?}", in_row);
        }

        /// Random shapes and cell texts: a request is accepted exactly when it is well-formed.
        #[test]
        fn random_shapes_are_classified(
            m in 1usize..5, k in 1usize..5, k2 in 1usize..5, n in 1usize..5,
            declared in 1usize..5, junk in proptest::option::of("[a-z+ .]{1,3}"),
        ) {
            let row = |len: usize| (0..len).map(|v| v.to_string()).collect::<Vec<_>>().join(",");
            let rows = |count: usize, len: usize| (0..count).map(|_| format!("{{\"value\":\"{}\"}}", row(len))).collect::<Vec<_>>().join(",");
            let mut one = rows(m, k);
            if let Some(junk) = &junk {
                one = one.replacen("0", junk, 1);
            }
            let body = format!(
                "{{\"requestId\":5,\"matrixOne\":{{\"columnCount\":{declared},\"rows\":[{one}]}},\"matrixTwo\":{{\"columnCount\":{n},\"rows\":[{}]}}}}",
                rows(k2, n)
            );
            let result = parse_request(body.as_bytes(), &SizeLimits::default());
            let bad_cell = junk.as_deref().is_some_and(|j| reference_cell(j).is_none());
            match result {
                Ok(request) => {
                    prop_assert!(declared == k && k == k2 && !bad_cell);
                    prop_assert_eq!((request.a.rows, request.a.cols, request.b.cols), (m, k, n));
                }
                Err((id, failure)) => {
                    prop_assert_eq!(id.map(RawValue::get), Some("5"));
                    let allowed: &[ErrorCode] = match (declared != k2, declared != k, bad_cell) {
                        (true, _, _) => &[ErrorCode::ShapeMismatch],
                        // A wrong row length or a bad cell: whichever the scan meets first.
                        (false, true, true) => &[ErrorCode::RowLength, ErrorCode::NonNumericCell],
                        (false, true, false) => &[ErrorCode::RowLength],
                        (false, false, true) => &[ErrorCode::NonNumericCell],
                        (false, false, false) => &[],
                    };
                    prop_assert!(allowed.contains(&failure.code), "{:?} not in {:?}", failure, allowed);
                }
            }
        }
    }
}
