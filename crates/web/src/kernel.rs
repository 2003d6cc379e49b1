//! The integer matrix-multiplication kernel.
//!
//! Three paths, chosen once per request from the operands' largest magnitudes:
//! - **narrow**: when `max|a| · max|b| · k ≤ i32::MAX` (the study's cells are below 1000, so
//!   `1000 · 1000 · 50` qualifies) every partial sum fits `i32`, so the loops accumulate in `i32`
//!   lanes (twice as many per vector as `i64`, and with a native vector multiply, which `i64`
//!   lacks before AVX-512) and widen to `i64` once per block. On x86-64 the same loop nest is also
//!   compiled for AVX2 and chosen at run time when the CPU has it.
//! - **fast**: when `max|a| · max|b| · k ≤ i64::MAX` no partial sum can overflow, so plain
//!   wrapping `i64` arithmetic is exact. The loops run in i-k-j order (the innermost loop walks a
//!   row of B and a row of the output contiguously, which the compiler vectorises), blocked over
//!   k and j so that the B tile in use stays in L2 for large operands.
//! - **checked**: otherwise each cell accumulates exactly in `i128` with checked adds and must fit
//!   `i64` at the end; anything else is [`Overflow`], never a wrapped (wrong) answer.
//!
//! Rows of the output are independent, so [`multiply_rows`] computes any row range: the pool
//! models split one request's output into row chunks with it.

use std::ops::Range;

/// Columns of B (and of the output) per block: 256 `i64` = 2 KiB of an output row.
const BLOCK_COLS: usize = 256;
/// Rows of B per block: a 64 × 256 tile of B is 128 KiB, within L2 on current x86/ARM cores.
const BLOCK_DEPTH: usize = 64;

/// A dense row-major matrix of `i64`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `rows * cols` cells, row-major.
    pub cells: Vec<i64>,
    /// The largest `|cell|`, kept by whoever fills `cells`; it picks the kernel path.
    pub magnitude_max: u64,
}

impl Matrix {
    /// Builds a matrix from row-major cells, computing the largest magnitude.
    pub fn from_cells(rows: usize, cols: usize, cells: Vec<i64>) -> Matrix {
        assert_eq!(cells.len(), rows * cols, "cells must hold rows * cols values");
        let magnitude_max = cells.iter().map(|c| c.unsigned_abs()).max().unwrap_or(0);
        Matrix { rows, cols, cells, magnitude_max }
    }

    /// Row `i` as a slice.
    pub fn row(&self, i: usize) -> &[i64] {
        &self.cells[i * self.cols..(i + 1) * self.cols]
    }
}

/// A result cell does not fit in `i64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("integer overflow: a result cell does not fit in a signed 64-bit integer")]
pub struct Overflow;

/// Which loop nest a multiplication uses; decided once per request by [`Path::for_operands`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Wrapping `i32` accumulation, proven exact by the magnitude bound.
    Narrow,
    /// Wrapping `i64` arithmetic, proven exact by the magnitude bound.
    Fast,
    /// Exact `i128` accumulation with checked adds.
    Checked,
}

impl Path {
    /// `Narrow` when every partial sum is bounded by `max|a| · max|b| · k ≤ i32::MAX`, else
    /// `Fast` when that bound is `≤ i64::MAX`, else `Checked`.
    pub fn for_operands(a: &Matrix, b: &Matrix) -> Path {
        let bound = u128::from(a.magnitude_max)
            .checked_mul(u128::from(b.magnitude_max))
            .and_then(|product| product.checked_mul(a.cols as u128));
        match bound {
            Some(bound) if bound <= i32::MAX as u128 => Path::Narrow,
            Some(bound) if bound <= i64::MAX as u128 => Path::Fast,
            _ => Path::Checked,
        }
    }
}

/// `a · b` on the calling thread.
pub fn multiply(a: &Matrix, b: &Matrix) -> Result<Matrix, Overflow> {
    let mut cells = vec![0; a.rows * b.cols];
    multiply_rows(a, b, Path::for_operands(a, b), 0..a.rows, &mut cells)?;
    Ok(Matrix::from_cells(a.rows, b.cols, cells))
}

/// Computes output rows `rows` of `a · b` into `out` (`rows.len() * b.cols` cells, zeroed).
pub fn multiply_rows(
    a: &Matrix,
    b: &Matrix,
    path: Path,
    rows: Range<usize>,
    out: &mut [i64],
) -> Result<(), Overflow> {
    assert_eq!(a.cols, b.rows, "inner dimensions must agree (validated by the caller)");
    assert!(rows.end <= a.rows);
    assert_eq!(out.len(), rows.len() * b.cols);
    match path {
        Path::Narrow => {
            multiply_rows_narrow(a, b, rows, out);
            Ok(())
        }
        Path::Fast => {
            multiply_rows_fast(a, b, rows, out);
            Ok(())
        }
        Path::Checked => multiply_rows_checked(a, b, rows, out),
    }
}

fn multiply_rows_fast(a: &Matrix, b: &Matrix, rows: Range<usize>, out: &mut [i64]) {
    let n = b.cols;
    for col_start in (0..n).step_by(BLOCK_COLS) {
        let col_end = (col_start + BLOCK_COLS).min(n);
        for depth_start in (0..a.cols).step_by(BLOCK_DEPTH) {
            let depth_end = (depth_start + BLOCK_DEPTH).min(a.cols);
            for (out_row, i) in out.chunks_exact_mut(n).zip(rows.clone()) {
                let out_block = &mut out_row[col_start..col_end];
                let a_row = &a.row(i)[depth_start..depth_end];
                for (k, &a_ik) in (depth_start..depth_end).zip(a_row) {
                    let b_block = &b.row(k)[col_start..col_end];
                    // Wrapping is exact here: Path::Fast proved no partial sum leaves i64.
                    for (o, &b_kj) in out_block.iter_mut().zip(b_block) {
                        *o = o.wrapping_add(a_ik.wrapping_mul(b_kj));
                    }
                }
            }
        }
    }
}

fn multiply_rows_narrow(a: &Matrix, b: &Matrix, rows: Range<usize>, out: &mut [i64]) {
    // B narrowed to i32 (lossless: Path::Narrow bounds every |cell| by i32::MAX), each row
    // padded with zeros to whole vectors so the inner loop has no scalar remainder (the study's
    // 20 columns would otherwise leave 4 of every 20 lanes, or all of them, to a scalar tail).
    let stride = b.cols.next_multiple_of(NARROW_LANES);
    let mut b_narrow = vec![0i32; b.rows * stride];
    for (padded, row) in b_narrow.chunks_exact_mut(stride).zip(b.cells.chunks_exact(b.cols)) {
        for (narrow, &cell) in padded.iter_mut().zip(row) {
            *narrow = cell as i32;
        }
    }
    let b_narrow = NarrowB { cells: &b_narrow, cols: b.cols, stride };
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU was just checked to support AVX2, the only feature the function enables.
        unsafe { narrow_blocks_avx2(a, &b_narrow, rows, out) };
        return;
    }
    narrow_blocks(a, &b_narrow, rows, out);
}

/// `i32` lanes per vector step of the narrow kernel: one AVX2 register.
const NARROW_LANES: usize = 8;

/// B as `i32`, each row padded with zeros from `cols` to `stride` (a multiple of the lanes).
struct NarrowB<'a> {
    cells: &'a [i32],
    cols: usize,
    stride: usize,
}

/// [`narrow_blocks`] compiled with AVX2 (8 `i32` lanes per multiply-add).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn narrow_blocks_avx2(a: &Matrix, b: &NarrowB<'_>, rows: Range<usize>, out: &mut [i64]) {
    narrow_blocks(a, b, rows, out);
}

/// Blocked like the fast path (a `BLOCK_DEPTH × BLOCK_COLS` tile of B stays in L2), but within
/// a tile each output row is computed one vector of columns at a time, with the accumulator in a
/// register across the whole depth block (an accumulator row in memory made every step wait for
/// the previous step's store); partial sums are added into the `i64` output once per tile.
#[inline(always)]
fn narrow_blocks(a: &Matrix, b: &NarrowB<'_>, rows: Range<usize>, out: &mut [i64]) {
    for col_start in (0..b.stride).step_by(BLOCK_COLS) {
        let col_end = (col_start + BLOCK_COLS).min(b.stride);
        for depth_start in (0..a.cols).step_by(BLOCK_DEPTH) {
            let depth_end = (depth_start + BLOCK_DEPTH).min(a.cols);
            for (out_row, i) in out.chunks_exact_mut(b.cols).zip(rows.clone()) {
                let a_row = &a.row(i)[depth_start..depth_end];
                for lanes_start in (col_start..col_end).step_by(NARROW_LANES) {
                    let mut acc = [0i32; NARROW_LANES];
                    for (k, &a_ik) in (depth_start..depth_end).zip(a_row) {
                        let b_kj = b.cells[k * b.stride + lanes_start..]
                            .first_chunk::<NARROW_LANES>()
                            .expect("rows of B are padded to whole vectors");
                        for lane in 0..NARROW_LANES {
                            // Wrapping is exact: Path::Narrow proved no partial sum leaves i32.
                            acc[lane] =
                                acc[lane].wrapping_add((a_ik as i32).wrapping_mul(b_kj[lane]));
                        }
                    }
                    let cols = lanes_start..(lanes_start + NARROW_LANES).min(b.cols);
                    for (o, &partial) in out_row[cols].iter_mut().zip(&acc) {
                        // A sum over all depth blocks is a partial sum too, so it fits: exact.
                        *o = o.wrapping_add(i64::from(partial));
                    }
                }
            }
        }
    }
}

fn multiply_rows_checked(
    a: &Matrix,
    b: &Matrix,
    rows: Range<usize>,
    out: &mut [i64],
) -> Result<(), Overflow> {
    let n = b.cols;
    for (out_row, i) in out.chunks_exact_mut(n).zip(rows) {
        let a_row = a.row(i);
        for (j, o) in out_row.iter_mut().enumerate() {
            let mut sum: i128 = 0;
            for (k, &a_ik) in a_row.iter().enumerate() {
                // An i64 × i64 product always fits i128; only the running sum can overflow.
                let product = i128::from(a_ik) * i128::from(b.cells[k * n + j]);
                sum = sum.checked_add(product).ok_or(Overflow)?;
            }
            *o = i64::try_from(sum).map_err(|_| Overflow)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Textbook i-j-k reference, exact in i128 (no i128 overflow for the magnitudes used).
    fn reference(a: &Matrix, b: &Matrix) -> Result<Matrix, Overflow> {
        let mut cells = Vec::with_capacity(a.rows * b.cols);
        for i in 0..a.rows {
            for j in 0..b.cols {
                let sum: i128 = (0..a.cols)
                    .map(|k| {
                        i128::from(a.cells[i * a.cols + k]) * i128::from(b.cells[k * b.cols + j])
                    })
                    .sum();
                cells.push(i64::try_from(sum).map_err(|_| Overflow)?);
            }
        }
        Ok(Matrix::from_cells(a.rows, b.cols, cells))
    }

    fn matrix(rows: usize, cols: usize, magnitude: i64) -> impl Strategy<Value = Matrix> {
        proptest::collection::vec(-magnitude..=magnitude, rows * cols)
            .prop_map(move |cells| Matrix::from_cells(rows, cols, cells))
    }

    fn operands(magnitude: i64) -> impl Strategy<Value = (Matrix, Matrix)> {
        (1usize..40, 1usize..80, 1usize..300)
            .prop_flat_map(move |(m, k, n)| (matrix(m, k, magnitude), matrix(k, n, magnitude)))
    }

    #[test]
    fn published_example() {
        let a = Matrix::from_cells(2, 3, vec![1, 2, 3, 4, 5, 6]);
        let b = Matrix::from_cells(3, 2, vec![7, 8, 9, 10, 11, 12]);
        assert_eq!(multiply(&a, &b).unwrap().cells, vec![58, 64, 139, 154]);
    }

    #[test]
    fn narrow_path_is_exact_at_its_bound() {
        // 2 · 32767² = 2_147_352_578 ≤ i32::MAX: the largest sums still take the i32 path.
        let a = Matrix::from_cells(2, 2, vec![32767, 32767, -32767, 32767]);
        let b = Matrix::from_cells(2, 1, vec![32767, 32767]);
        assert_eq!(Path::for_operands(&a, &b), Path::Narrow);
        assert_eq!(multiply(&a, &b).unwrap().cells, vec![2_147_352_578, 0]);
        // One more in the inner dimension and the bound no longer proves i32 sums.
        let wide = Matrix::from_cells(1, 3, vec![32767; 3]);
        let tall = Matrix::from_cells(3, 1, vec![32767; 3]);
        assert_eq!(Path::for_operands(&wide, &tall), Path::Fast);
        assert_eq!(multiply(&wide, &tall).unwrap().cells, vec![3 * 32767 * 32767]);
    }

    #[test]
    fn overflow_is_reported_not_wrapped() {
        let a = Matrix::from_cells(1, 2, vec![i64::MAX, 1]);
        let b = Matrix::from_cells(2, 1, vec![1, 1]);
        assert_eq!(Path::for_operands(&a, &b), Path::Checked);
        assert_eq!(multiply(&a, &b), Err(Overflow));
    }

    #[test]
    fn checked_path_accepts_large_exact_results() {
        // i64::MAX · 1 + (-1) · 1 fits although the magnitude bound cannot prove it.
        let a = Matrix::from_cells(1, 2, vec![i64::MAX, -1]);
        let b = Matrix::from_cells(2, 1, vec![1, 1]);
        assert_eq!(multiply(&a, &b).unwrap().cells, vec![i64::MAX - 1]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn narrow_path_matches_reference((a, b) in operands(1_000)) {
            prop_assert_eq!(Path::for_operands(&a, &b), Path::Narrow);
            prop_assert_eq!(multiply(&a, &b), reference(&a, &b));
        }

        #[test]
        fn fast_path_matches_reference((a, b) in operands(1_000_000)) {
            prop_assume!(Path::for_operands(&a, &b) == Path::Fast);
            prop_assert_eq!(multiply(&a, &b), reference(&a, &b));
        }

        #[test]
        fn checked_path_matches_reference((a, b) in operands(1 << 32)) {
            prop_assert_eq!(multiply(&a, &b), reference(&a, &b));
        }

        #[test]
        fn any_row_split_gives_the_same_result((a, b) in operands(1000), split in 0usize..40) {
            let split = split.min(a.rows);
            let path = Path::for_operands(&a, &b);
            let mut out = vec![0; a.rows * b.cols];
            let (top, bottom) = out.split_at_mut(split * b.cols);
            multiply_rows(&a, &b, path, 0..split, top).unwrap();
            multiply_rows(&a, &b, path, split..a.rows, bottom).unwrap();
            prop_assert_eq!(out, reference(&a, &b).unwrap().cells);
        }
    }
}
