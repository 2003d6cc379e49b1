//! The statistics only experiments report (the servers' histograms and the median are the
//! `stats` crate's): the small set of formulas from performance analysis that the
//! experiments need: the mean with a Student-t confidence interval ([`mean_ci`]), speedup and
//! the Karp–Flatt serial fraction ([`speedup`], [`karp_flatt`]), Amdahl's and Gustafson's
//! predictions ([`amdahl`], [`gustafson`]), the 2^k·r factorial analysis of Jain's "The Art of
//! Computer Systems Performance Analysis", chapter 18 ([`factorial_2kr`]), and a least-squares
//! fit of Gunther's universal scalability law ([`usl_fit`]). Invalid input (too few samples,
//! a processor count below 1, ragged replications) is an [`StatsError`], never a panic.
//!
//! ```
//! use experiments::statistics::mean_ci;
//!
//! let runs_per_s = [41_200.0, 40_900.0, 41_500.0, 41_100.0];
//! let ci = mean_ci(&runs_per_s, 0.95).unwrap();
//! assert!(ci.low < ci.mean && ci.mean < ci.high);
//! ```

use serde::{Deserialize, Serialize};

/// Invalid input to a statistics function.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    /// Fewer samples than the statistic needs.
    #[error("need at least {needed} samples, got {got}")]
    TooFewSamples { needed: usize, got: usize },
    /// A parameter outside its domain (named, with the reason).
    #[error("invalid {name}: {reason}")]
    InvalidParameter { name: &'static str, reason: String },
}

fn invalid(name: &'static str, reason: impl Into<String>) -> StatsError {
    StatsError::InvalidParameter { name, reason: reason.into() }
}

// ---------------------------------------------------------------------------------------------
// Mean and confidence interval.

/// A sample mean with its two-sided Student-t confidence interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MeanCi {
    pub count: usize,
    pub mean: f64,
    /// Sample standard deviation (n − 1 denominator).
    pub std_dev: f64,
    /// Confidence level in (0, 1), e.g. 0.95.
    pub confidence: f64,
    /// Half the interval's width: t(1 − α/2; n − 1) · s / √n.
    pub half_width: f64,
    pub low: f64,
    pub high: f64,
}

/// A distribution-free confidence interval for the median of `values`: the order statistics
/// `x(k)` and `x(n+1-k)` with the largest `k` whose binomial tail P(Bin(n, ½) < k) stays within
/// (1 − `confidence`) / 2 on each side. `None` when `values` are too few for that confidence
/// (6 for 0.95) or `confidence` is not in (0, 1).
pub fn median_ci(mut values: Vec<f64>, confidence: f64) -> Option<(f64, f64)> {
    if !(confidence > 0.0 && confidence < 1.0) {
        return None;
    }
    let n = values.len();
    let tail_max = (1.0 - confidence) / 2.0;
    // P(Bin(n, 1/2) <= j), accumulated term by term: C(n, j) / 2^n.
    let (mut term, mut below_k, mut k) = (0.5f64.powi(n as i32), 0.0, 0);
    while k < n / 2 && below_k + term <= tail_max {
        below_k += term;
        term = term * (n - k) as f64 / (k + 1) as f64;
        k += 1;
    }
    if k == 0 {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some((values[k - 1], values[n - k]))
}

/// Mean of `samples` with a two-sided confidence interval at `confidence` (e.g. 0.95), using
/// the Student t distribution with n − 1 degrees of freedom. Needs at least 2 samples.
pub fn mean_ci(samples: &[f64], confidence: f64) -> Result<MeanCi, StatsError> {
    check_confidence(confidence)?;
    if samples.len() < 2 {
        return Err(StatsError::TooFewSamples { needed: 2, got: samples.len() });
    }
    if let Some(bad) = samples.iter().find(|sample| !sample.is_finite()) {
        return Err(invalid("samples", format!("{bad} is not a finite number")));
    }
    let count = samples.len();
    let n = count as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let variance = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let std_dev = variance.sqrt();
    let t = student_t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1.0)?;
    let half_width = t * std_dev / n.sqrt();
    Ok(MeanCi {
        count,
        mean,
        std_dev,
        confidence,
        half_width,
        low: mean - half_width,
        high: mean + half_width,
    })
}

fn check_confidence(confidence: f64) -> Result<(), StatsError> {
    if confidence > 0.0 && confidence < 1.0 {
        Ok(())
    } else {
        Err(invalid("confidence", format!("{confidence} is not in (0, 1)")))
    }
}

/// The `probability` quantile of Student's t distribution with `degrees_of_freedom` (> 0):
/// the t such that P(T ≤ t) = probability. Accurate to about 1e-12 (bisection on the CDF,
/// which is computed from the regularized incomplete beta function).
pub fn student_t_quantile(probability: f64, degrees_of_freedom: f64) -> Result<f64, StatsError> {
    if !(probability > 0.0 && probability < 1.0) {
        return Err(invalid("probability", format!("{probability} is not in (0, 1)")));
    }
    if !(degrees_of_freedom > 0.0 && degrees_of_freedom.is_finite()) {
        return Err(invalid("degrees_of_freedom", format!("{degrees_of_freedom} is not > 0")));
    }
    if probability < 0.5 {
        return Ok(-student_t_quantile(1.0 - probability, degrees_of_freedom)?);
    }
    // The CDF is increasing in t; grow the bracket, then bisect to full f64 precision.
    let mut high = 1.0;
    while student_t_cdf(high, degrees_of_freedom) < probability {
        high *= 2.0;
    }
    let mut low = 0.0;
    for _ in 0..200 {
        let middle = 0.5 * (low + high);
        if middle <= low || middle >= high {
            break;
        }
        if student_t_cdf(middle, degrees_of_freedom) < probability {
            low = middle;
        } else {
            high = middle;
        }
    }
    Ok(0.5 * (low + high))
}

/// P(T ≤ t) for Student's t distribution with `nu` degrees of freedom.
pub fn student_t_cdf(t: f64, nu: f64) -> f64 {
    let tail = 0.5 * regularized_incomplete_beta(nu / (nu + t * t), nu / 2.0, 0.5);
    if t >= 0.0 { 1.0 - tail } else { tail }
}

/// I_x(a, b) by the continued fraction of Numerical Recipes (modified Lentz).
fn regularized_incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    // The continued fraction converges fast for x < (a + 1) / (a + b + 2); use symmetry else.
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_continued_fraction(x, a, b) / a
    } else {
        1.0 - front * beta_continued_fraction(1.0 - x, b, a) / b
    }
}

fn beta_continued_fraction(x: f64, a: f64, b: f64) -> f64 {
    const ITERATIONS_MAX: usize = 300;
    const EPSILON: f64 = 1e-15;
    const TINY: f64 = 1e-300;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    let mut result = d;
    for m in 1..=ITERATIONS_MAX {
        let m = m as f64;
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        result *= d * c;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        let step = d * c;
        result *= step;
        if (step - 1.0).abs() < EPSILON {
            break;
        }
    }
    result
}

/// ln Γ(x) for x > 0 (Lanczos approximation, g = 7, 9 terms; relative error < 1e-15).
fn ln_gamma(x: f64) -> f64 {
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1 − x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = COEFFICIENTS[0];
    for (i, coefficient) in COEFFICIENTS.iter().enumerate().skip(1) {
        sum += coefficient / (x + i as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

// ---------------------------------------------------------------------------------------------
// Speedup and scaling laws.

/// Speedup of a run taking `parallel_time` over the baseline taking `baseline_time` (any unit;
/// for throughputs pass them inverted, or divide the throughputs directly).
pub fn speedup(baseline_time: f64, parallel_time: f64) -> Result<f64, StatsError> {
    for (name, value) in [("baseline_time", baseline_time), ("parallel_time", parallel_time)] {
        if !(value > 0.0 && value.is_finite()) {
            return Err(invalid(name, format!("{value} is not a positive number")));
        }
    }
    Ok(baseline_time / parallel_time)
}

/// The Karp–Flatt experimentally determined serial fraction e = (1/ψ − 1/p) / (1 − 1/p) for
/// a measured speedup ψ on p > 1 processors. A serial fraction that grows with p points to
/// parallel overhead rather than inherently serial work.
pub fn karp_flatt(speedup: f64, processors: f64) -> Result<f64, StatsError> {
    if !(speedup > 0.0 && speedup.is_finite()) {
        return Err(invalid("speedup", format!("{speedup} is not a positive number")));
    }
    if !(processors > 1.0 && processors.is_finite()) {
        return Err(invalid("processors", format!("{processors} must be > 1")));
    }
    Ok((1.0 / speedup - 1.0 / processors) / (1.0 - 1.0 / processors))
}

fn check_fraction_and_processors(serial_fraction: f64, processors: f64) -> Result<(), StatsError> {
    if !(0.0..=1.0).contains(&serial_fraction) {
        return Err(invalid("serial_fraction", format!("{serial_fraction} is not in [0, 1]")));
    }
    if !(processors >= 1.0 && processors.is_finite()) {
        return Err(invalid("processors", format!("{processors} must be >= 1")));
    }
    Ok(())
}

/// Amdahl's law: the speedup of a fixed workload with serial fraction f on p processors,
/// 1 / (f + (1 − f) / p).
pub fn amdahl(serial_fraction: f64, processors: f64) -> Result<f64, StatsError> {
    check_fraction_and_processors(serial_fraction, processors)?;
    Ok(1.0 / (serial_fraction + (1.0 - serial_fraction) / processors))
}

/// Gustafson's law: the scaled speedup when the workload grows with p, where f is the serial
/// fraction of the parallel run's time: p − f·(p − 1).
pub fn gustafson(serial_fraction: f64, processors: f64) -> Result<f64, StatsError> {
    check_fraction_and_processors(serial_fraction, processors)?;
    Ok(processors - serial_fraction * (processors - 1.0))
}

// ---------------------------------------------------------------------------------------------
// Universal scalability law.

/// Gunther's universal scalability law X(N) = λN / (1 + σ(N − 1) + κN(N − 1)).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct UslFit {
    /// Throughput of one unit of concurrency (λ).
    pub lambda: f64,
    /// Contention (serialization) coefficient σ.
    pub sigma: f64,
    /// Coherency (crosstalk) coefficient κ.
    pub kappa: f64,
}

impl UslFit {
    /// Throughput the model predicts at concurrency `n`.
    pub fn throughput(&self, n: f64) -> f64 {
        self.lambda * n / (1.0 + self.sigma * (n - 1.0) + self.kappa * n * (n - 1.0))
    }

    /// Concurrency of peak throughput, √((1 − σ) / κ); `None` when κ ≤ 0 (no retrograde
    /// region: throughput keeps rising towards λ/σ).
    pub fn peak_concurrency(&self) -> Option<f64> {
        (self.kappa > 0.0).then(|| ((1.0 - self.sigma).max(0.0) / self.kappa).sqrt())
    }
}

/// Fits the USL to (concurrency N, throughput X) points by least squares. λ is taken from
/// the N = 1 point (which must be present: the model is anchored on it), then σ and κ by
/// linear least squares without intercept on N/(X/λ) − 1 = σ(N − 1) + κN(N − 1). Needs at
/// least two points with N > 1.
pub fn usl_fit(points: &[(f64, f64)]) -> Result<UslFit, StatsError> {
    for &(n, x) in points {
        if !(n >= 1.0 && x > 0.0 && n.is_finite() && x.is_finite()) {
            return Err(invalid("points", format!("({n}, {x}) needs N >= 1 and X > 0")));
        }
    }
    let Some(&(_, lambda)) = points.iter().find(|(n, _)| *n == 1.0) else {
        return Err(invalid("points", "no point at concurrency 1 to anchor λ"));
    };
    let (mut s11, mut s12, mut s22, mut s1y, mut s2y) = (0.0, 0.0, 0.0, 0.0, 0.0);
    let mut used = 0;
    for &(n, x) in points.iter().filter(|(n, _)| *n > 1.0) {
        let (x1, x2) = (n - 1.0, n * (n - 1.0));
        let y = n * lambda / x - 1.0;
        s11 += x1 * x1;
        s12 += x1 * x2;
        s22 += x2 * x2;
        s1y += x1 * y;
        s2y += x2 * y;
        used += 1;
    }
    if used < 2 {
        return Err(StatsError::TooFewSamples { needed: 2, got: used });
    }
    let determinant = s11 * s22 - s12 * s12;
    if determinant.abs() < f64::EPSILON * s11 * s22 {
        return Err(invalid("points", "need at least two distinct concurrencies above 1"));
    }
    Ok(UslFit {
        lambda,
        sigma: (s1y * s22 - s2y * s12) / determinant,
        kappa: (s2y * s11 - s1y * s12) / determinant,
    })
}

// ---------------------------------------------------------------------------------------------
// 2^k·r factorial designs (Jain, chapter 18).

/// One effect (a factor or an interaction) of a 2^k·r design.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FactorialEffect {
    /// Factor names joined by `×`, e.g. `handlers×connections`.
    pub name: String,
    /// Indices of the factors this effect combines (one for a main effect).
    pub factors: Vec<usize>,
    /// The effect q: half the change of the response from the low to the high level.
    pub value: f64,
    /// Sum of squares 2^k · r · q².
    pub sum_squares: f64,
    /// Share of the total variation (SST) this effect explains, in %.
    pub variation_percent: f64,
    /// Confidence interval of q; `None` without replications (r = 1).
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
}

impl FactorialEffect {
    /// True when the confidence interval excludes zero (`None` without replications).
    pub fn is_significant(&self) -> Option<bool> {
        Some(self.ci_low? > 0.0 || self.ci_high? < 0.0)
    }
}

/// Result of [`factorial_2kr`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FactorialAnalysis {
    pub factors: usize,
    pub replications: usize,
    /// Confidence level of the effects' intervals.
    pub confidence: f64,
    /// The grand mean q0.
    pub mean: f64,
    /// Effects in sign-table order: A, B, AB, C, AC, BC, ABC, ...
    pub effects: Vec<FactorialEffect>,
    /// Total variation SST = Σ (y − ȳ)².
    pub sst: f64,
    /// Error sum of squares SSE = Σ (y − ȳ_run)².
    pub sse: f64,
    /// SSE as a % of SST.
    pub error_percent: f64,
    /// Standard deviation of the effects s_q = s_e / √(2^k·r); `None` when r = 1.
    pub effect_std_dev: Option<f64>,
}

/// Upper bound on the number of factors of a 2^k design (2^16 runs).
pub const FACTORIAL_FACTORS_MAX: usize = 16;

/// The sign table of a 2^k design: `table[run][column]` is ±1, where column `c` is the effect
/// of the factors whose bits are set in `c` (column 0 is the identity, all +1). Runs are in
/// standard order: factor j is at its high level in run i exactly when bit j of i is set.
pub fn sign_table(factors: usize) -> Result<Vec<Vec<i8>>, StatsError> {
    if factors == 0 || factors > FACTORIAL_FACTORS_MAX {
        return Err(invalid("factors", format!("{factors} is not in 1..={FACTORIAL_FACTORS_MAX}")));
    }
    let runs = 1_usize << factors;
    Ok((0..runs)
        .map(|run| {
            (0..runs)
                .map(|column| {
                    // The product of ±1 over the factors in `column`: −1 when an odd number of
                    // them are at their low level in this run.
                    let low_levels = (column & !run).count_ones();
                    if low_levels % 2 == 0 { 1 } else { -1 }
                })
                .collect()
        })
        .collect())
}

/// The replications per run of a 2^k·r design's `responses`: the same number (≥ 1) in every
/// run, every response finite.
fn replications_of(responses: &[Vec<f64>]) -> Result<usize, StatsError> {
    let replications = responses[0].len();
    if replications == 0 || responses.iter().any(|run| run.len() != replications) {
        return Err(invalid("responses", "every run needs the same number (≥ 1) of replications"));
    }
    if responses.iter().flatten().any(|y| !y.is_finite()) {
        return Err(invalid("responses", "every response must be a finite number"));
    }
    Ok(replications)
}

/// An effect's standard deviation and the Student-t quantile of its interval, from the error
/// sum of squares; `(None, None)` without replications (no error to estimate).
fn effect_spread(
    sse: f64,
    runs: usize,
    replications: usize,
    confidence: f64,
) -> Result<(Option<f64>, Option<f64>), StatsError> {
    if replications < 2 {
        return Ok((None, None));
    }
    let (runs, r) = (runs as f64, replications as f64);
    let error_variance = sse / (runs * (r - 1.0));
    let t = student_t_quantile(1.0 - (1.0 - confidence) / 2.0, runs * (r - 1.0))?;
    Ok((Some((error_variance / (runs * r)).sqrt()), Some(t)))
}

/// Analyses a 2^k·r factorial experiment. `factor_names` names the k factors; `responses[i]`
/// holds the r replicated responses of run i in standard order (see [`sign_table`]): with
/// factors [A, B] the runs are (A−,B−), (A+,B−), (A−,B+), (A+,B+). Returns the effects, the %
/// of variation each explains, and (when r ≥ 2) Student-t confidence intervals at
/// `confidence` with 2^k·(r − 1) degrees of freedom.
pub fn factorial_2kr(
    factor_names: &[&str],
    responses: &[Vec<f64>],
    confidence: f64,
) -> Result<FactorialAnalysis, StatsError> {
    check_confidence(confidence)?;
    let factors = factor_names.len();
    let signs = sign_table(factors)?;
    let runs = signs.len();
    if responses.len() != runs {
        return Err(invalid(
            "responses",
            format!("{factors} factors need {runs} runs, got {}", responses.len()),
        ));
    }
    let replications = replications_of(responses)?;
    let r = replications as f64;
    let run_means: Vec<f64> = responses.iter().map(|run| run.iter().sum::<f64>() / r).collect();
    let column_effect = |column: usize| {
        signs.iter().zip(&run_means).map(|(row, mean)| f64::from(row[column]) * mean).sum::<f64>()
            / runs as f64
    };
    let mean = column_effect(0);
    let sst: f64 = responses.iter().flatten().map(|y| (y - mean).powi(2)).sum();
    let sse: f64 = responses
        .iter()
        .zip(&run_means)
        .map(|(run, run_mean)| run.iter().map(|y| (y - run_mean).powi(2)).sum::<f64>())
        .sum();
    let (effect_std_dev, t) = effect_spread(sse, runs, replications, confidence)?;
    let share = |sum_squares: f64| if sst > 0.0 { 100.0 * sum_squares / sst } else { 0.0 };
    let effects = (1..runs)
        .map(|column| {
            let value = column_effect(column);
            let sum_squares = runs as f64 * r * value * value;
            let in_effect: Vec<usize> = (0..factors).filter(|j| column & (1 << j) != 0).collect();
            let half_width = t.zip(effect_std_dev).map(|(t, s)| t * s);
            FactorialEffect {
                name: in_effect.iter().map(|&j| factor_names[j]).collect::<Vec<_>>().join("×"),
                factors: in_effect,
                value,
                sum_squares,
                variation_percent: share(sum_squares),
                ci_low: half_width.map(|h| value - h),
                ci_high: half_width.map(|h| value + h),
            }
        })
        .collect();
    Ok(FactorialAnalysis {
        factors,
        replications,
        confidence,
        mean,
        effects,
        sst,
        sse,
        error_percent: share(sse),
        effect_std_dev,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_ci_takes_the_binomial_order_statistics() {
        // n = 9 at 95%: P(Bin(9, ½) <= 1) = 10/512 <= 0.025 < 46/512, so x(2)..x(8).
        let values: Vec<f64> = [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0].to_vec();
        assert_eq!(median_ci(values, 0.95), Some((2.0, 8.0)));
        // n = 6 is the fewest for 95% (1/64 per tail); 5 is too few (1/32 > 0.025).
        let six: Vec<f64> = (1..=6).map(f64::from).collect();
        assert_eq!(median_ci(six.clone(), 0.95), Some((1.0, 6.0)));
        assert_eq!(median_ci(six[..5].to_vec(), 0.95), None);
        // A lower confidence narrows the interval; a confidence outside (0, 1) is refused.
        let many: Vec<f64> = (1..=100).map(f64::from).collect();
        let (low_95, high_95) = median_ci(many.clone(), 0.95).unwrap();
        let (low_50, high_50) = median_ci(many.clone(), 0.5).unwrap();
        assert!(low_95 < low_50 && high_50 < high_95);
        assert_eq!((low_95, high_95), (40.0, 61.0));
        assert_eq!(median_ci(many, 1.0), None);
    }

    fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
        (actual - expected).abs() <= tolerance
    }

    #[test]
    fn student_t_quantiles_match_tables() {
        // Reference values from standard t tables (e.g. NIST/SEMATECH, 6+ digits).
        for (p, nu, expected) in [
            (0.975, 1.0, 12.706_204_736),
            (0.975, 2.0, 4.302_652_730),
            (0.95, 8.0, 1.859_548_038),
            (0.975, 8.0, 2.306_004_135),
            (0.95, 10.0, 1.812_461_123),
            (0.995, 30.0, 2.749_995_654),
            (0.975, 1_000.0, 1.962_339_081),
        ] {
            let t = student_t_quantile(p, nu).unwrap();
            assert!(close(t, expected, 1e-8), "t({p}, {nu}) = {t}, expected {expected}");
        }
        assert!(close(student_t_quantile(0.025, 8.0).unwrap(), -2.306_004_135, 1e-8));
        assert!(student_t_quantile(1.0, 3.0).is_err());
        assert!(student_t_quantile(0.9, 0.0).is_err());
    }

    #[test]
    fn mean_ci_of_known_sample() {
        // Mean 5, s = √(10/4)... samples 3,4,5,6,7: s² = 2.5, half width = 2.776445·√2.5/√5.
        let ci = mean_ci(&[3.0, 4.0, 5.0, 6.0, 7.0], 0.95).unwrap();
        assert_eq!(ci.mean, 5.0);
        assert!(close(ci.std_dev, 2.5_f64.sqrt(), 1e-12));
        assert!(close(ci.half_width, 2.776_445_105 * (0.5_f64).sqrt(), 1e-8));
        assert!(close(ci.low, 5.0 - ci.half_width, 1e-12));
        assert_eq!(
            mean_ci(&[1.0], 0.95).unwrap_err(),
            StatsError::TooFewSamples { needed: 2, got: 1 }
        );
        assert!(mean_ci(&[1.0, 2.0], 1.5).is_err());
        assert!(mean_ci(&[1.0, f64::NAN], 0.9).is_err());
    }

    #[test]
    fn speedup_karp_flatt_amdahl_gustafson() {
        assert_eq!(speedup(100.0, 25.0).unwrap(), 4.0);
        assert!(speedup(0.0, 1.0).is_err());
        // Perfect speedup means serial fraction 0; no speedup means 1.
        assert!(close(karp_flatt(4.0, 4.0).unwrap(), 0.0, 1e-15));
        assert!(close(karp_flatt(1.0, 4.0).unwrap(), 1.0, 1e-15));
        // Amdahl with f = 0.1 on 4 processors: 1 / (0.1 + 0.9/4) = 3.0769...
        let predicted = amdahl(0.1, 4.0).unwrap();
        assert!(close(predicted, 1.0 / 0.325, 1e-12));
        // Karp–Flatt recovers the serial fraction from an Amdahl-shaped speedup.
        assert!(close(karp_flatt(predicted, 4.0).unwrap(), 0.1, 1e-12));
        assert!(close(gustafson(0.1, 4.0).unwrap(), 3.7, 1e-12));
        assert!(karp_flatt(2.0, 1.0).is_err());
        assert!(amdahl(1.5, 2.0).is_err());
        assert!(gustafson(0.5, 0.5).is_err());
    }

    #[test]
    fn usl_fit_recovers_exact_parameters() {
        let truth = UslFit { lambda: 1_000.0, sigma: 0.05, kappa: 0.001 };
        let points: Vec<(f64, f64)> =
            [1.0, 2.0, 4.0, 8.0, 16.0, 32.0].iter().map(|&n| (n, truth.throughput(n))).collect();
        let fit = usl_fit(&points).unwrap();
        assert!(close(fit.lambda, 1_000.0, 1e-9));
        assert!(close(fit.sigma, 0.05, 1e-9), "{fit:?}");
        assert!(close(fit.kappa, 0.001, 1e-12), "{fit:?}");
        assert!(close(fit.peak_concurrency().unwrap(), (0.95_f64 / 0.001).sqrt(), 1e-6));
        assert!(usl_fit(&points[1..]).is_err(), "no N = 1 anchor");
        assert!(usl_fit(&points[..2]).is_err(), "one point above N = 1");
    }

    #[test]
    fn sign_table_of_two_factors() {
        let table = sign_table(2).unwrap();
        // Columns I, A, B, AB; runs (−,−), (+,−), (−,+), (+,+).
        assert_eq!(
            table,
            vec![vec![1, -1, -1, 1], vec![1, 1, -1, -1], vec![1, -1, 1, -1], vec![1, 1, 1, 1]]
        );
        assert!(sign_table(0).is_err());
    }

    #[test]
    fn factorial_jain_memory_cache_example() {
        // Jain, "The Art of Computer Systems Performance Analysis", 2^2·3 memory-cache
        // example. By hand: run means 15, 48, 24, 77; q0 = 164/4 = 41, qA = 86/4 = 21.5,
        // qB = 38/4 = 9.5, qAB = 20/4 = 5. SSA = 12·21.5² = 5547, SSB = 12·9.5² = 1083,
        // SSAB = 12·5² = 300, SSE = 18 + 18 + 42 + 24 = 102, SST = 7032, so A explains
        // 78.88%, B 15.40%, AB 4.27%, error 1.45%. s_e² = 102/8, s_q = √(12.75/12) = 1.0308;
        // the 90% interval of qA is 21.5 ± t(0.95; 8)·s_q = 21.5 ± 1.917 = (19.58, 23.42).
        let responses = vec![
            vec![15.0, 18.0, 12.0],
            vec![45.0, 48.0, 51.0],
            vec![25.0, 28.0, 19.0],
            vec![75.0, 75.0, 81.0],
        ];
        let analysis = factorial_2kr(&["A", "B"], &responses, 0.90).unwrap();
        assert!(close(analysis.mean, 41.0, 1e-12));
        let names: Vec<&str> = analysis.effects.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["A", "B", "A×B"]);
        let values: Vec<f64> = analysis.effects.iter().map(|e| e.value).collect();
        assert_eq!(values, [21.5, 9.5, 5.0]);
        let sums: Vec<f64> = analysis.effects.iter().map(|e| e.sum_squares).collect();
        assert_eq!(sums, [5_547.0, 1_083.0, 300.0]);
        assert!(close(analysis.sse, 102.0, 1e-9));
        assert!(close(analysis.sst, 7_032.0, 1e-9));
        for (effect, percent) in analysis.effects.iter().zip([78.88, 15.40, 4.27]) {
            assert!(close(effect.variation_percent, percent, 0.005), "{effect:?}");
        }
        assert!(close(analysis.error_percent, 1.45, 0.005));
        assert!(close(analysis.effect_std_dev.unwrap(), (12.75_f64 / 12.0).sqrt(), 1e-12));
        let a = &analysis.effects[0];
        assert!(close(a.ci_low.unwrap(), 19.58, 0.005), "{a:?}");
        assert!(close(a.ci_high.unwrap(), 23.42, 0.005), "{a:?}");
        assert!(analysis.effects.iter().all(|e| e.is_significant() == Some(true)));
    }

    #[test]
    fn factorial_without_replication_and_bad_shapes() {
        let analysis = factorial_2kr(&["x"], &[vec![10.0], vec![14.0]], 0.95).unwrap();
        assert_eq!(analysis.mean, 12.0);
        assert_eq!(analysis.effects[0].value, 2.0);
        assert_eq!(analysis.effects[0].variation_percent, 100.0);
        assert_eq!(analysis.effects[0].is_significant(), None);
        assert!(factorial_2kr(&["a", "b"], &[vec![1.0], vec![2.0]], 0.9).is_err());
        assert!(factorial_2kr(&["a"], &[vec![1.0, 2.0], vec![2.0]], 0.9).is_err());
    }
}
