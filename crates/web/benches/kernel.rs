//! The multiplication kernel against the textbook i-j-k loop, on the study's shapes, and the
//! whole request (parse + multiply + render) per complexity level.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use web::api::SizeLimits;
use web::exec::{Compute, process};
use web::kernel::{Matrix, multiply};
use web::workload::Complexity;

/// The textbook loop nest, the baseline the blocked kernel is compared with.
fn naive(a: &Matrix, b: &Matrix) -> Vec<i64> {
    let mut out = vec![0i64; a.rows * b.cols];
    for i in 0..a.rows {
        for j in 0..b.cols {
            let mut sum = 0i64;
            for k in 0..a.cols {
                sum =
                    sum.wrapping_add(a.cells[i * a.cols + k].wrapping_mul(b.cells[k * b.cols + j]));
            }
            out[i * b.cols + j] = sum;
        }
    }
    out
}

fn square(n: usize, seed: i64) -> Matrix {
    Matrix::from_cells(n, n, (0..n * n).map(|i| (i as i64 * 31 + seed) % 1000).collect())
}

fn kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("kernel");
    for n in [64usize, 256] {
        let (a, b) = (square(n, 1), square(n, 7));
        group.bench_function(format!("blocked/{n}x{n}"), |bench| {
            bench.iter(|| multiply(black_box(&a), black_box(&b)))
        });
        group.bench_function(format!("naive/{n}x{n}"), |bench| {
            bench.iter(|| naive(black_box(&a), black_box(&b)))
        });
    }
    group.finish();
}

fn requests(c: &mut Criterion) {
    let mut group = c.benchmark_group("request");
    for complexity in Complexity::ALL {
        let body = complexity.shape().request_body(1, 1);
        group.bench_function(complexity.name(), |bench| {
            bench.iter(|| process(black_box(&body), &SizeLimits::default(), Compute::Serial))
        });
    }
    group.finish();
}

criterion_group!(benches, kernels, requests);
criterion_main!(benches);
