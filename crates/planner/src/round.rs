//! Numbers rounded to what they mean before they reach a file or a person.
//!
//! The models compute in full `f64` precision, but a blocking probability of 1.7e-300 means
//! "never" and a utilization of 0.79999999999997 means 0.8; TOML writes an `f64` without an
//! exponent, so the first became a 300-digit decimal in `config.toml`. Everything the planner
//! writes out (a pipeline config, a plan's JSON) goes through these functions.

/// Significant digits kept for rates, times, utilizations and job counts: finer than any
/// measurement the models are fed (service rates measured to a few per cent).
pub const SIGNIFICANT_DIGITS: i32 = 6;

/// Below this a probability is written as 0: fewer than one job in a billion, which no run of
/// the pipelines measures.
pub const PROBABILITY_FLOOR: f64 = 1e-9;

/// Below this a measure is written as 0: a picosecond, a job per 30 000 years.
pub const MEASURE_FLOOR: f64 = 1e-12;

/// `value` rounded to `digits` significant digits (at least 1; infinities and NaN unchanged).
pub fn significant(value: f64, digits: i32) -> f64 {
    if !value.is_finite() {
        return value;
    }
    // Through the decimal text, so the result is the f64 nearest that decimal and prints as
    // it (scaling by a power of ten would leave 1.1318699999999997e-185).
    let decimals = (digits.max(1) - 1) as usize;
    format!("{value:.decimals$e}").parse().unwrap_or(value)
}

/// A measure (rate, time, utilization, count) at [`SIGNIFICANT_DIGITS`], 0 below
/// [`MEASURE_FLOOR`].
pub fn measure(value: f64) -> f64 {
    if value.abs() < MEASURE_FLOOR { 0.0 } else { significant(value, SIGNIFICANT_DIGITS) }
}

/// A probability: 0 below [`PROBABILITY_FLOOR`], else three significant digits.
pub fn probability(value: f64) -> f64 {
    if value.abs() < PROBABILITY_FLOOR { 0.0 } else { significant(value, 3) }
}

/// `serde` writer of a measure (`#[serde(serialize_with = "round::serialize_measure")]`).
pub fn serialize_measure<S: serde::Serializer>(value: &f64, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_f64(measure(*value))
}

/// `serde` writer of a probability.
pub fn serialize_probability<S: serde::Serializer>(value: &f64, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_f64(probability(*value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measures_keep_six_digits_and_probabilities_flush_to_zero() {
        assert_eq!(measure(0.799_999_999_999_97), 0.8);
        assert_eq!(measure(2_383_790.123_4), 2_383_790.0);
        assert_eq!(measure(0.000_123_456_789), 0.000_123_457);
        assert_eq!(measure(-1.234_567_89), -1.234_57);
        assert_eq!((measure(0.0), measure(f64::INFINITY)), (0.0, f64::INFINITY));
        assert_eq!(measure(1.131_87e-185), 0.0);
        assert_eq!(significant(1.131_87e-5, 3).to_string(), "0.0000113");
        assert_eq!(probability(1.7e-300), 0.0);
        assert_eq!(probability(0.012_345_6), 0.012_3);
        assert_eq!(probability(1.0), 1.0);
    }

    #[test]
    fn a_tiny_probability_is_a_short_toml_number() {
        #[derive(serde::Serialize)]
        struct Row {
            #[serde(serialize_with = "serialize_probability")]
            p: f64,
        }
        let text = toml::to_string(&Row { p: 1.7e-300 }).unwrap();
        assert_eq!(text.trim(), "p = 0.0");
    }
}
