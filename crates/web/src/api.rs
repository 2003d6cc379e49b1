//! The published JSON API: request parsing and validation, error codes, response bodies.
//!
//! Validation runs in a fixed order so that every refusal happens before the work it protects:
//! JSON syntax and types (002) → required fields (003) → size limits (006, before any buffer
//! proportional to the matrix is allocated) → shapes (001) → cells (005, 004) → multiplication
//! (008). The body-size limit (007) is enforced by the server before this module sees a byte.
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
//! | 009  | 503  | The server is busy: the execution model's queue is full; retry later |

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
}

/// Default largest dimension: twice the study's "high" complexity (2000 rows).
pub const DIM_MAX_DEFAULT: usize = 4096;
/// Default cell bound: 2^22 cells = 32 MiB of `i64` per matrix.
pub const CELLS_MAX_DEFAULT: usize = 1 << 22;

impl Default for SizeLimits {
    fn default() -> Self {
        SizeLimits { dim_max: DIM_MAX_DEFAULT, cells_max: CELLS_MAX_DEFAULT }
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
}

impl ErrorCode {
    /// Every code, for documentation and tests.
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::ShapeMismatch,
        ErrorCode::MalformedJson,
        ErrorCode::MissingField,
        ErrorCode::NonNumericCell,
        ErrorCode::RowLength,
        ErrorCode::TooLarge,
        ErrorCode::BodyTooLarge,
        ErrorCode::Overflow,
        ErrorCode::Busy,
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
        }
    }

    /// The HTTP status that goes with the code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::MalformedJson
            | ErrorCode::MissingField
            | ErrorCode::NonNumericCell
            | ErrorCode::RowLength => 400,
            ErrorCode::BodyTooLarge => 413,
            ErrorCode::ShapeMismatch | ErrorCode::TooLarge | ErrorCode::Overflow => 422,
            ErrorCode::Busy => 503,
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

/// The result of parsing: the request, or a failure with whatever id could be read.
pub type Parsed<'a> = Result<Request<'a>, (Option<&'a RawValue>, Failure)>;

/// Parses and validates a request body.
pub fn parse_request<'a>(body: &'a [u8], limits: &SizeLimits) -> Parsed<'a> {
    let wire: RequestWire<'a> = serde_json::from_slice(body).map_err(|e| {
        (None, Failure::new(ErrorCode::MalformedJson, format!("Malformed JSON: {e}")))
    })?;
    let id = wire.request_id;
    validate(wire, limits).map_err(|failure| (id, failure))
}

fn validate<'a>(wire: RequestWire<'a>, limits: &SizeLimits) -> Result<Request<'a>, Failure> {
    let id = wire.request_id.ok_or_else(|| missing("requestId"))?;
    let id_text = id.get();
    if !(id_text.starts_with('"')
        || id_text.starts_with('-')
        || id_text.starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err(Failure::new(
            ErrorCode::MalformedJson,
            "Malformed JSON: requestId must be a number or a string",
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
    let mut cells = Vec::with_capacity(rows.len() * cols);
    let mut magnitude_max = 0u64;
    for (r, row) in rows.iter().enumerate() {
        let text =
            row.value.as_deref().ok_or_else(|| missing(&format!("{name}.rows[{r}].value")))?;
        let mut count = 0usize;
        for cell in text.split(',') {
            count += 1;
            if count > cols {
                break;
            }
            let value = parse_cell(cell).ok_or_else(|| {
                Failure::new(
                    ErrorCode::NonNumericCell,
                    format!("Non-numeric cell in {name} row {r}: {:?}", truncate(cell)),
                )
            })?;
            magnitude_max = magnitude_max.max(value.unsigned_abs());
            cells.push(value);
        }
        if count != cols {
            let found = if count > cols { format!("more than {cols}") } else { count.to_string() };
            return Err(Failure::new(
                ErrorCode::RowLength,
                format!(
                    "Row length mismatch in {name} row {r}: {found} cells, columnCount is {cols}"
                ),
            ));
        }
    }
    Ok(Matrix { rows: rows.len(), cols, cells, magnitude_max })
}

fn parse_cell(cell: &str) -> Option<i64> {
    let trimmed = cell.trim_matches(|c: char| c == ' ' || c == '\t');
    // `str::parse` accepts a leading '+'; the API documents plain decimal integers only.
    if trimmed.starts_with('+') {
        return None;
    }
    trimmed.parse().ok()
}

/// Keeps error messages short whatever the client sent.
fn truncate(cell: &str) -> &str {
    const SHOWN_CHARS_MAX: usize = 32;
    match cell.char_indices().nth(SHOWN_CHARS_MAX) {
        Some((end, _)) => &cell[..end],
        None => cell,
    }
}

/// Writes `{"requestId":"<id>","rows":[[..],..]}`; a numeric id is quoted, as published.
pub fn write_success(id: &RawValue, product: &Matrix, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(32 + product.cells.len() * 8);
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
    for (r, row) in product.cells.chunks_exact(product.cols).enumerate() {
        if r > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for (c, &value) in row.iter().enumerate() {
            if c > 0 {
                out.push(b',');
            }
            write_i64(value, out);
        }
        out.push(b']');
    }
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

fn write_i64(value: i64, out: &mut Vec<u8>) {
    // 20 digits hold u64::MAX; the sign is written separately.
    let mut digits = [0u8; 20];
    let mut magnitude = value.unsigned_abs();
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if value < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"{"requestId": 2238, "matrixOne": {"columnCount": 3, "rows": [{"value": "1,2,3"},
        {"value": "4,5,6"}]}, "matrixTwo": {"columnCount": 2, "rows": [{"value": "7,8"},
        {"value": "9,10"}, {"value": "11,12"}]}}"#;

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
    fn integers_render_like_the_standard_formatter() {
        for value in [0, 7, -7, 10, 1234567890, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            write_i64(value, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), value.to_string());
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
            let bad_cell = junk.as_deref().is_some_and(|j| parse_cell(j).is_none());
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
