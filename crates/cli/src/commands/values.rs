//! Flag values shared across commands. Library enums: the libraries know nothing of clap, so
//! each such enum lists its values (`ALL`) and names them (`name`), and [`one_of`] turns that
//! into a clap value parser that accepts exactly those names and lists them in `--help`.
//! Durations: every duration flag takes a value with its unit (`3s`, `500ms`, `1m30s`), read by
//! [`seconds`], [`millis`], [`micros`] or [`nanos`].

use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};

/// A value parser for an enum given by all its values and their names.
pub fn one_of<T>(all: &'static [T], name: fn(T) -> &'static str) -> impl TypedValueParser<Value = T>
where
    T: Copy + Clone + Send + Sync + 'static,
{
    let names: Vec<&'static str> = all.iter().map(|&value| name(value)).collect();
    PossibleValuesParser::new(names).map(move |chosen: String| {
        *all.iter()
            .find(|&&value| name(value) == chosen)
            .expect("PossibleValuesParser admits only the listed names")
    })
}

/// A duration flag's value: humantime's syntax (`3s`, `500ms`, `1m30s`, `250us`). A bare
/// number is read in the unit of the flag's old spelling (`--seconds 5`, `--linger-ms 500`),
/// which stays as a hidden alias for one release so that scripts keep working.
fn duration_or_bare(text: &str, bare_unit: Duration) -> Result<Duration, String> {
    if let Ok(number) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(bare_unit.as_secs_f64() * number)
            .map_err(|_| format!("{text}: a duration must be finite and >= 0"));
    }
    humantime::parse_duration(text).map_err(|error| {
        format!("{error}; expected a duration with its unit, e.g. 3s, 500ms, 1m30s")
    })
}

/// A duration; a bare number (old `...-s`/`--seconds` spellings) is seconds.
pub fn seconds(text: &str) -> Result<Duration, String> {
    duration_or_bare(text, Duration::from_secs(1))
}

/// A duration; a bare number (old `...-ms` spellings) is milliseconds.
pub fn millis(text: &str) -> Result<Duration, String> {
    duration_or_bare(text, Duration::from_millis(1))
}

/// A duration; a bare number (old `...-us` spellings) is microseconds.
pub fn micros(text: &str) -> Result<Duration, String> {
    duration_or_bare(text, Duration::from_micros(1))
}

/// A duration; a bare number (old `...-ns` spellings) is nanoseconds.
pub fn nanos(text: &str) -> Result<Duration, String> {
    duration_or_bare(text, Duration::from_nanos(1))
}

/// Whole milliseconds of a duration flag, for settings kept in milliseconds.
pub fn whole_millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Whole microseconds of a duration flag, for settings kept in microseconds.
pub fn whole_micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Whole nanoseconds of a duration flag, for settings kept in nanoseconds.
pub fn whole_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn durations_take_units_and_bare_numbers_keep_the_old_unit() {
        assert_eq!(seconds("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(seconds("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(seconds("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(millis("250"), Ok(Duration::from_millis(250)));
        assert_eq!(micros("100"), Ok(Duration::from_micros(100)));
        assert_eq!(nanos("2000"), Ok(Duration::from_micros(2)));
        for bad in ["", "5 parsecs", "-1", "NaN", "inf"] {
            assert!(seconds(bad).is_err(), "{bad:?}");
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Colour {
        Red,
        DarkBlue,
    }

    fn colour_name(colour: Colour) -> &'static str {
        match colour {
            Colour::Red => "red",
            Colour::DarkBlue => "dark-blue",
        }
    }

    #[derive(Parser)]
    struct Flags {
        #[arg(long, value_parser = one_of(&[Colour::Red, Colour::DarkBlue], colour_name))]
        colour: Colour,
    }

    #[test]
    fn accepts_the_names_and_refuses_others_listing_them() {
        let flags = Flags::try_parse_from(["x", "--colour", "dark-blue"]).unwrap();
        assert_eq!(flags.colour, Colour::DarkBlue);
        let error = Flags::try_parse_from(["x", "--colour", "green"]).err().unwrap().to_string();
        assert!(error.contains("green") && error.contains("dark-blue"), "{error}");
    }
}
