//! The rules that turn repeated measurements into a verdict a skeptic accepts: a claim is
//! decided only from at least [`MIN_REPEATS`] repeats of each side, and only when the
//! repeats' ranges fall wholly on one side of the rule's boundary; ranges that straddle it
//! give "inconclusive", never a verdict read off two medians. Published figures taken on
//! another machine or store are context, never a verdict on absolute values.

use std::fmt::Write as _;

/// Fewer repeats than this decide nothing (one run on a shared machine is noise).
pub const MIN_REPEATS: usize = 3;

/// A claim's verdict.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Reproduced,
    NotReproduced,
    /// The repeats' ranges overlap the rule's boundary, or too few repeats ran: why.
    Inconclusive(String),
    /// What the claim needs cannot run here: why.
    NotMeasurable(String),
    /// A published absolute figure of another scope, shown beside ours: why no verdict.
    Context(String),
}

/// One quantity over its repeats.
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub repeats: usize,
}

impl Spread {
    /// The spread of `values` (NaN left out); `None` when nothing is left.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let values: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        let min = values.iter().copied().reduce(f64::min)?;
        let max = values.iter().copied().reduce(f64::max)?;
        let repeats = values.len();
        Some(Spread { min, median: stats::median(values), max, repeats })
    }

    /// `median (min–max, n runs)` with `unit` after the median.
    pub fn text(&self, unit: &str) -> String {
        let mut text = format!("{}{unit}", number(self.median));
        if self.repeats > 1 {
            let _ =
                write!(text, " ({}–{}, {} runs)", number(self.min), number(self.max), self.repeats);
        } else {
            text += " (1 run)";
        }
        text
    }
}

/// Three significant digits, no exponent for everyday magnitudes.
pub fn number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude == 0.0 || (0.01..1e7).contains(&magnitude) {
        let decimals = if magnitude >= 100.0 {
            0
        } else if magnitude >= 10.0 {
            1
        } else {
            2
        };
        format!("{value:.decimals$}")
    } else {
        format!("{value:.2e}")
    }
}

/// `Inconclusive` unless every spread has [`MIN_REPEATS`] repeats.
fn enough_repeats(spreads: &[&Spread]) -> Result<(), Verdict> {
    match spreads.iter().map(|s| s.repeats).min() {
        Some(fewest) if fewest < MIN_REPEATS => Err(Verdict::Inconclusive(format!(
            "{fewest} repeat(s) of a side; a verdict needs at least {MIN_REPEATS}"
        ))),
        _ => Ok(()),
    }
}

fn spreads(a: &[f64], b: &[f64]) -> Result<(Spread, Spread), Verdict> {
    let missing = || Verdict::NotMeasurable("a side of the comparison did not run".into());
    let (a, b) = (Spread::of(a).ok_or_else(missing)?, Spread::of(b).ok_or_else(missing)?);
    enough_repeats(&[&a, &b])?;
    Ok((a, b))
}

/// The claim `a < factor × b`: reproduced when a's highest repeat is below factor × b's
/// lowest, not reproduced when a's lowest is at or above factor × b's highest, otherwise
/// inconclusive (the ranges overlap).
pub fn below(a: &[f64], b: &[f64], factor: f64) -> Verdict {
    let (a, b) = match spreads(a, b) {
        Ok(spreads) => spreads,
        Err(verdict) => return verdict,
    };
    let (low, high) = (factor * b.min, factor * b.max);
    if a.max < low {
        Verdict::Reproduced
    } else if a.min >= high {
        Verdict::NotReproduced
    } else {
        Verdict::Inconclusive(format!(
            "the ranges overlap: {}–{} against {}–{}",
            number(a.min),
            number(a.max),
            number(low),
            number(high)
        ))
    }
}

/// The claim `a ≥ factor × b`: the mirror of [`below`] (reproduced when a's lowest repeat is
/// at or above factor × b's highest).
pub fn at_least(a: &[f64], b: &[f64], factor: f64) -> Verdict {
    match below(a, b, factor) {
        Verdict::Reproduced => Verdict::NotReproduced,
        Verdict::NotReproduced => Verdict::Reproduced,
        other => other,
    }
}

/// The claim `low ≤ value ≤ high` for a quantity measured in repeats: reproduced when every
/// repeat is inside, not reproduced when every repeat is outside, otherwise inconclusive.
pub fn inside(values: &[f64], low: f64, high: f64) -> Verdict {
    let Some(spread) = Spread::of(values) else {
        return Verdict::NotMeasurable("nothing was measured".into());
    };
    if let Err(verdict) = enough_repeats(&[&spread]) {
        return verdict;
    }
    let outside = |v: &f64| *v < low || *v > high;
    let values: Vec<&f64> = values.iter().filter(|v| !v.is_nan()).collect();
    if values.iter().all(|v| !outside(v)) {
        Verdict::Reproduced
    } else if values.iter().all(|v| outside(v)) {
        Verdict::NotReproduced
    } else {
        Verdict::Inconclusive(format!(
            "the range {}–{} straddles the bounds {}–{}",
            number(spread.min),
            number(spread.max),
            number(low),
            number(high)
        ))
    }
}

/// A claim that must hold in every part (every rate, every user count): not measurable if a
/// part is; reproduced if every part is; not reproduced if a part is not; else inconclusive.
pub fn all_of(parts: Vec<Verdict>) -> Verdict {
    if parts.is_empty() {
        return Verdict::NotMeasurable("nothing was measured".into());
    }
    if let Some(missing) = parts.iter().find(|v| matches!(v, Verdict::NotMeasurable(_))) {
        return missing.clone();
    }
    if parts.iter().all(|v| *v == Verdict::Reproduced) {
        return Verdict::Reproduced;
    }
    if parts.contains(&Verdict::NotReproduced) {
        return Verdict::NotReproduced;
    }
    parts
        .into_iter()
        .find(|v| matches!(v, Verdict::Inconclusive(_)))
        .unwrap_or_else(|| Verdict::Inconclusive("a part gave no verdict".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inconclusive(verdict: &Verdict) -> bool {
        matches!(verdict, Verdict::Inconclusive(_))
    }

    #[test]
    fn below_needs_separate_ranges_on_either_side() {
        assert_eq!(below(&[10.0, 11.0, 12.0], &[13.0, 14.0, 15.0], 1.0), Verdict::Reproduced);
        assert_eq!(below(&[13.0, 14.0, 15.0], &[10.0, 11.0, 12.0], 1.0), Verdict::NotReproduced);
        // 150 vs 155 µs medians with ranges overlapping many times over: no verdict.
        let overlap = below(&[120.0, 150.0, 190.0], &[110.0, 155.0, 200.0], 1.0);
        assert!(inconclusive(&overlap), "{overlap:?}");
        // The factor moves the boundary: 5 < 0.6 × 10 holds, 7 does not.
        assert_eq!(below(&[5.0, 5.5, 5.9], &[10.0, 10.0, 10.0], 0.6), Verdict::Reproduced);
        assert_eq!(below(&[6.0, 7.0, 8.0], &[10.0, 10.0, 10.0], 0.6), Verdict::NotReproduced);
        assert!(inconclusive(&below(&[5.0, 6.5, 7.0], &[10.0, 10.0, 10.0], 0.6)));
    }

    #[test]
    fn at_least_mirrors_below() {
        assert_eq!(
            at_least(&[96.0, 97.0, 99.0], &[100.0, 100.0, 101.0], 0.95),
            Verdict::Reproduced
        );
        assert_eq!(
            at_least(&[80.0, 85.0, 90.0], &[100.0, 100.0, 101.0], 0.95),
            Verdict::NotReproduced
        );
        assert!(inconclusive(&at_least(&[90.0, 97.0, 99.0], &[100.0, 100.0, 101.0], 0.95)));
    }

    #[test]
    fn fewer_than_three_repeats_decide_nothing() {
        let two = below(&[1.0, 1.0], &[9.0, 9.0, 9.0], 1.0);
        assert!(matches!(&two, Verdict::Inconclusive(why) if why.contains("2 repeat")), "{two:?}");
        assert!(inconclusive(&inside(&[1.0, 1.0], 0.0, 2.0)));
        // NaN (a run that produced no number) does not count as a repeat.
        assert!(inconclusive(&below(&[1.0, 1.0, f64::NAN], &[9.0, 9.0, 9.0], 1.0)));
        assert!(matches!(below(&[], &[1.0, 1.0, 1.0], 1.0), Verdict::NotMeasurable(_)));
    }

    #[test]
    fn inside_decides_only_when_every_repeat_agrees() {
        assert_eq!(inside(&[0.9, 1.0, 1.1], 0.8, 1.2), Verdict::Reproduced);
        assert_eq!(inside(&[0.5, 0.6, 1.3], 0.8, 1.2), Verdict::NotReproduced);
        assert!(inconclusive(&inside(&[0.7, 1.0, 1.1], 0.8, 1.2)));
        // One-sided: above 1.05 in every repeat (the publishers' speedup).
        assert_eq!(inside(&[1.1, 1.2, 1.3], 1.05, f64::INFINITY), Verdict::Reproduced);
        assert_eq!(inside(&[0.9, 1.0, 1.01], 1.05, f64::INFINITY), Verdict::NotReproduced);
        assert!(inconclusive(&inside(&[0.9, 1.2, 1.3], 1.05, f64::INFINITY)));
    }

    #[test]
    fn all_of_needs_every_part() {
        let overlap = || Verdict::Inconclusive("overlap".into());
        assert_eq!(all_of(vec![Verdict::Reproduced, Verdict::Reproduced]), Verdict::Reproduced);
        assert_eq!(
            all_of(vec![Verdict::Reproduced, Verdict::NotReproduced]),
            Verdict::NotReproduced
        );
        assert_eq!(all_of(vec![Verdict::Reproduced, overlap()]), overlap());
        assert!(matches!(all_of(vec![]), Verdict::NotMeasurable(_)));
        let missing = Verdict::NotMeasurable("no run".into());
        assert_eq!(all_of(vec![Verdict::Reproduced, missing.clone()]), missing);
    }

    #[test]
    fn spread_text_names_median_range_and_runs() {
        let spread = Spread::of(&[150.0, 120.0, 190.0]).unwrap();
        assert_eq!(spread.text(" µs"), "150 µs (120–190, 3 runs)");
        assert_eq!(number(2.46e-5), "2.46e-5");
        assert_eq!(number(0.95), "0.95");
    }
}
