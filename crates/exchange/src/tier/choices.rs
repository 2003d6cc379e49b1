//! The tier configuration's named choices: typed, spelled in TOML and on the command line as
//! their serde names, and checked when the configuration is read, not when it is used.

use pipeline::WaitStrategy;
use pipeline::wait::ADAPTIVE_SPINS_DEFAULT;

/// Wait strategy of the critical stages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitChoice {
    /// Spin when every thread of the tier gets its own CPU, else park: on a shared,
    /// oversubscribed host a spinning or yielding thread steals the CPU from the thread it
    /// waits for.
    #[default]
    Auto,
    /// [`WaitStrategy::BusySpin`].
    #[serde(alias = "busy-spin")]
    Spin,
    /// [`WaitStrategy::SpinYield`] with the default spin budget.
    SpinYield,
    /// [`WaitStrategy::Park`].
    Park,
    /// [`WaitStrategy::Adaptive`] with the default budgets.
    Adaptive,
}

impl WaitChoice {
    /// The strategy for a tier of `threads` threads on a host with `cpus` CPUs.
    pub fn strategy(self, threads: usize, cpus: usize) -> WaitStrategy {
        match self {
            WaitChoice::Auto if cpus > threads => WaitStrategy::BusySpin,
            WaitChoice::Auto => WaitStrategy::Park,
            WaitChoice::Spin => WaitStrategy::BusySpin,
            WaitChoice::SpinYield => WaitStrategy::SpinYield { spins: ADAPTIVE_SPINS_DEFAULT },
            WaitChoice::Park => WaitStrategy::Park,
            WaitChoice::Adaptive => WaitStrategy::default(),
        }
    }

    /// The serde name.
    pub fn name(self) -> &'static str {
        match self {
            WaitChoice::Auto => "auto",
            WaitChoice::Spin => "spin",
            WaitChoice::SpinYield => "spin-yield",
            WaitChoice::Park => "park",
            WaitChoice::Adaptive => "adaptive",
        }
    }
}

impl std::str::FromStr for WaitChoice {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ops::config::parse_choice("wait", text)
    }
}

impl std::fmt::Display for WaitChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde_and_from_str() {
        let waits = [
            WaitChoice::Auto,
            WaitChoice::Spin,
            WaitChoice::SpinYield,
            WaitChoice::Park,
            WaitChoice::Adaptive,
        ];
        for wait in waits {
            assert_eq!(serde_json::to_value(wait).unwrap(), wait.name());
            assert_eq!(wait.name().parse::<WaitChoice>(), Ok(wait));
        }
        assert_eq!("busy-spin".parse::<WaitChoice>(), Ok(WaitChoice::Spin), "today's alias");
        let error = "sleepy".parse::<WaitChoice>().unwrap_err();
        assert!(error.starts_with("wait: unknown variant `sleepy`"), "{error}");
    }

    #[test]
    fn todays_config_spellings_still_parse_and_bad_ones_are_bad_input() {
        use crate::durability::JournalMode;
        use crate::tier::TierConfig;
        let lean = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/lean-2core.toml");
        let config: TierConfig = ops::config::load_toml(Some(lean.as_ref())).unwrap();
        assert_eq!(config.wait, WaitChoice::Park);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tier.toml");
        let text = "wait = \"busy-spin\"\nconnector = \"ring\"\njournal = \"off\"\n";
        std::fs::write(&file, text).unwrap();
        let config: TierConfig = ops::config::load_toml(Some(&file)).unwrap();
        assert_eq!(config.wait, WaitChoice::Spin);
        assert_eq!(config.connector, pipeline::ConnectorKind::LockFree);
        assert_eq!(config.journal, JournalMode::OFF);
        let defaults = serde_json::to_value(TierConfig::default()).unwrap();
        let spelled = |field: &str| defaults[field].as_str().unwrap().to_owned();
        let names = ["auto", "lock-free", "group"];
        assert_eq!(["wait", "connector", "journal"].map(spelled), names);
        for bad in ["wait = \"sleepy\"", "connector = \"pigeon\"", "journal = \"maybe\""] {
            std::fs::write(&file, bad).unwrap();
            let error = ops::config::load_toml::<TierConfig>(Some(&file)).unwrap_err();
            assert!(matches!(error, ops::OpsError::BadInput(_)), "{error}");
        }
    }

    #[test]
    fn the_outlets_old_key_gateways_still_parses_for_one_release() {
        use crate::tier::TierConfig;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tier.toml");
        for (text, outlets) in [("outlets = 3\n", 3), ("gateways = 5\n", 5)] {
            std::fs::write(&file, text).unwrap();
            let config: TierConfig = ops::config::load_toml(Some(&file)).unwrap();
            assert_eq!(config.outlets, outlets, "{text}");
        }
        let written = serde_json::to_value(TierConfig::default()).unwrap();
        assert!(written.get("outlets").is_some() && written.get("gateways").is_none());
        std::fs::write(&file, "outlets = 3\ngateways = 5\n").unwrap();
        let error = ops::config::load_toml::<TierConfig>(Some(&file)).unwrap_err();
        assert!(matches!(error, ops::OpsError::BadInput(_)), "both keys: {error}");
    }

    #[test]
    fn fixed_choices_are_the_strategies_their_names_parse_to() {
        for wait in
            [WaitChoice::Spin, WaitChoice::SpinYield, WaitChoice::Park, WaitChoice::Adaptive]
        {
            assert_eq!(Ok(wait.strategy(1, 1)), wait.name().parse::<WaitStrategy>());
        }
        assert_eq!(WaitChoice::Auto.strategy(4, 8), WaitStrategy::BusySpin);
        assert_eq!(WaitChoice::Auto.strategy(8, 8), WaitStrategy::Park);
    }
}
