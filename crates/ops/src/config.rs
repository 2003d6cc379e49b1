//! TOML configuration files with overrides from flags.
//!
//! Convention for every command: `--config FILE` names a TOML file whose fields all have
//! defaults (`#[serde(default)]`), and each flag that is given overrides the matching field.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::error::OpsError;

/// Reads a TOML config file; `None` gives the type's defaults. Errors name the file and the
/// offending key, and are [`OpsError::BadInput`] so the binary exits with the usage code.
pub fn load_toml<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, OpsError> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| OpsError::BadInput(format!("cannot read config {}: {e}", path.display())))?;
    toml::from_str(&text)
        .map_err(|e| OpsError::BadInput(format!("invalid config {}: {e}", path.display())))
}

/// Replaces `field` with the flag's value when the flag was given.
pub fn override_with<T: Clone>(field: &mut T, flag: &Option<T>) {
    if let Some(value) = flag {
        *field = value.clone();
    }
}

/// Parses `text` as a config file would spell the choice (its serde names and aliases): one
/// parser for a choice in TOML and on the command line. The error names `what`.
///
/// ```
/// #[derive(Debug, PartialEq, serde::Deserialize)]
/// #[serde(rename_all = "kebab-case")]
/// enum Speed { Slow, Fast }
/// assert_eq!(ops::config::parse_choice::<Speed>("speed", "fast"), Ok(Speed::Fast));
/// assert!(ops::config::parse_choice::<Speed>("speed", "warp").unwrap_err().starts_with("speed: "));
/// ```
pub fn parse_choice<T: DeserializeOwned>(what: &str, text: &str) -> Result<T, String> {
    use serde::de::IntoDeserializer;
    let parsed: Result<T, serde::de::value::Error> = T::deserialize(text.into_deserializer());
    parsed.map_err(|e| format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Sample {
        rate_per_s: u64,
        name: String,
    }

    #[test]
    fn file_values_then_flags_override() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "rate_per_s = 20000\nname = \"a\"\n").unwrap();
        let mut config: Sample = load_toml(Some(&path)).unwrap();
        assert_eq!(config.rate_per_s, 20_000);
        override_with(&mut config.rate_per_s, &Some(60_000));
        override_with(&mut config.name, &None);
        assert_eq!(config, Sample { rate_per_s: 60_000, name: "a".into() });
    }

    #[test]
    fn unknown_key_is_bad_input_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "rate = 1\n").unwrap();
        let error = load_toml::<Sample>(Some(&path)).unwrap_err();
        assert!(matches!(error, OpsError::BadInput(_)), "{error}");
        assert!(error.to_string().contains("bad.toml"), "{error}");
    }
}
