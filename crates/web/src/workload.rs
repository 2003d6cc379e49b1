//! Request shapes of the study's complexity levels and the request bodies sent by the load lab.
//!
//! Every level multiplies A (`rows × 50`) by B (`50 × 20`): the study names only the row counts,
//! so the inner and output widths are fixed here to keep the result small (the work grows with
//! the rows, as in the study, and the response stays a `rows × 20` table).

use std::fmt::Write as _;

/// Inner dimension: A's columns and B's rows.
pub const INNER_DIM: usize = 50;
/// B's columns, i.e. the result's columns.
pub const OUTPUT_COLS: usize = 20;
/// Cells are drawn from `0..CELL_VALUE_BOUND` (no overflow for any supported shape).
const CELL_VALUE_BOUND: u64 = 1000;

/// The dimensions of one request: A is `rows_a × inner`, B is `inner × cols_b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    pub rows_a: usize,
    pub inner: usize,
    pub cols_b: usize,
}

impl Shape {
    /// The study's shape with `rows` rows: A `rows × 50` · B `50 × 20`.
    pub fn study(rows: usize) -> Shape {
        Shape { rows_a: rows, inner: INNER_DIM, cols_b: OUTPUT_COLS }
    }

    /// Multiply-adds of one request.
    pub fn multiply_adds(&self) -> usize {
        self.rows_a * self.inner * self.cols_b
    }

    /// A request body in the published format with deterministic cells derived from `seed`.
    pub fn request_body(&self, request_id: u64, seed: u64) -> Vec<u8> {
        let mut cells = Cells { state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1 };
        let mut text = String::with_capacity(64 + (self.rows_a + self.cols_b) * self.inner * 4);
        write!(text, "{{\"requestId\":{request_id},").expect("writing to a String");
        write_matrix(&mut text, "matrixOne", self.rows_a, self.inner, &mut cells);
        text.push(',');
        write_matrix(&mut text, "matrixTwo", self.inner, self.cols_b, &mut cells);
        text.push('}');
        text.into_bytes()
    }
}

fn write_matrix(text: &mut String, name: &str, rows: usize, cols: usize, cells: &mut Cells) {
    write!(text, "\"{name}\":{{\"columnCount\":{cols},\"rows\":[").expect("writing to a String");
    for r in 0..rows {
        text.push_str(if r == 0 { "{\"value\":\"" } else { ",{\"value\":\"" });
        for c in 0..cols {
            if c > 0 {
                text.push(',');
            }
            write!(text, "{}", cells.next()).expect("writing to a String");
        }
        text.push_str("\"}");
    }
    text.push_str("]}");
}

/// xorshift64: cheap deterministic cell values; statistical quality is irrelevant here.
struct Cells {
    state: u64,
}

impl Cells {
    fn next(&mut self) -> u64 {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state % CELL_VALUE_BOUND
    }
}

/// The study's complexity levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Complexity {
    /// 30 rows: A 30×50 · B 50×20.
    Low,
    /// 600 rows: A 600×50 · B 50×20.
    Medium600,
    /// 1000 rows: A 1000×50 · B 50×20.
    Medium1000,
    /// 2000 rows: A 2000×50 · B 50×20.
    High,
}

impl Complexity {
    pub const ALL: [Complexity; 4] =
        [Complexity::Low, Complexity::Medium600, Complexity::Medium1000, Complexity::High];

    pub fn rows(self) -> usize {
        match self {
            Complexity::Low => 30,
            Complexity::Medium600 => 600,
            Complexity::Medium1000 => 1000,
            Complexity::High => 2000,
        }
    }

    pub fn shape(self) -> Shape {
        Shape::study(self.rows())
    }

    pub fn name(self) -> &'static str {
        match self {
            Complexity::Low => "low",
            Complexity::Medium600 => "medium-600",
            Complexity::Medium1000 => "medium-1000",
            Complexity::High => "high",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SizeLimits, parse_request};

    #[test]
    fn bodies_parse_to_the_declared_shape() {
        for complexity in Complexity::ALL {
            let shape = complexity.shape();
            let body = shape.request_body(7, 1);
            let request = parse_request(&body, &SizeLimits::default()).unwrap();
            assert_eq!((request.a.rows, request.a.cols), (shape.rows_a, shape.inner));
            assert_eq!((request.b.rows, request.b.cols), (shape.inner, shape.cols_b));
            assert!(request.a.magnitude_max < CELL_VALUE_BOUND);
        }
    }
}
