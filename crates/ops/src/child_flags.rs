//! `--name value` flags for the helper processes that tests and soak scripts spawn (the crash
//! children, the standalone mq node). The product's command line belongs to `leantier` (clap,
//! in the `cli` crate); these children take a few numbers and paths and need no more.

use std::str::FromStr;

use crate::error::OpsError;

/// Flags given as `--name value` pairs, each name one of those the child knows.
#[derive(Debug)]
pub struct ChildFlags {
    pairs: Vec<(String, String)>,
}

impl ChildFlags {
    /// This process's arguments (after the program name).
    pub fn from_env(known: &[&str]) -> Result<ChildFlags, OpsError> {
        ChildFlags::parse(std::env::args().skip(1), known)
    }

    /// Pairs up `--name value` arguments, refusing a name not in `known`, a name given twice
    /// and a name without a value.
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        known: &[&str],
    ) -> Result<ChildFlags, OpsError> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let name =
                flag.strip_prefix("--").filter(|name| known.contains(name)).ok_or_else(|| {
                    OpsError::BadInput(format!("unknown argument {flag:?}; known: {known:?}"))
                })?;
            if pairs.iter().any(|(seen, _)| seen == name) {
                return Err(OpsError::BadInput(format!("--{name} given twice")));
            }
            let value =
                args.next().ok_or_else(|| OpsError::BadInput(format!("--{name} needs a value")))?;
            pairs.push((name.to_string(), value));
        }
        Ok(ChildFlags { pairs })
    }

    /// The value of `--name`, if given.
    pub fn optional<T: FromStr>(&self, name: &str) -> Result<Option<T>, OpsError> {
        let Some((_, text)) = self.pairs.iter().find(|(seen, _)| seen == name) else {
            return Ok(None);
        };
        let value = text
            .parse()
            .map_err(|_| OpsError::BadInput(format!("--{name} {text:?} is invalid")))?;
        Ok(Some(value))
    }

    /// The value of `--name`, or `default` when it is not given.
    pub fn get_or<T: FromStr>(&self, name: &str, default: T) -> Result<T, OpsError> {
        Ok(self.optional(name)?.unwrap_or(default))
    }

    /// The value of `--name`, which must be given.
    pub fn required<T: FromStr>(&self, name: &str) -> Result<T, OpsError> {
        self.optional(name)?.ok_or_else(|| OpsError::BadInput(format!("--{name} is required")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn pairs_are_read_with_defaults_and_types() {
        let flags = ChildFlags::parse(args("--dir /tmp/x --seed 7"), &["dir", "seed", "rate"]);
        let flags = flags.unwrap();
        assert_eq!(flags.required::<String>("dir").unwrap(), "/tmp/x");
        assert_eq!(flags.get_or("seed", 1u64).unwrap(), 7);
        assert_eq!(flags.get_or("rate", 2.5f64).unwrap(), 2.5);
        assert!(flags.required::<u64>("rate").is_err());
        assert!(flags.get_or::<u64>("dir", 0).is_err(), "a path is not a number");
    }

    #[test]
    fn unknown_repeated_and_valueless_flags_are_refused() {
        assert!(ChildFlags::parse(args("--bogus 1"), &["dir"]).is_err());
        assert!(ChildFlags::parse(args("dir 1"), &["dir"]).is_err());
        assert!(ChildFlags::parse(args("--dir 1 --dir 2"), &["dir"]).is_err());
        assert!(ChildFlags::parse(args("--dir"), &["dir"]).is_err());
    }
}
