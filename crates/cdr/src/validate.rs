//! `leantier cdr validate`: measured versus predicted maximum throughput, robust to a shared
//! host whose available CPU drifts.
//!
//! A prediction is only as good as the measurement it rests on, and on a shared host the cores
//! this process can get change from one minute to the next. So every prediction is made from a
//! measurement taken *immediately before* the run it predicts: each round measures the nodes
//! (`plan measure`'s workload, shortened) and then runs the pipeline flat out, for every
//! configuration in turn (interleaved, so a slow minute hits every configuration alike), and
//! the verdict per configuration is the median over rounds of measured / predicted. The
//! cores available are probed again right after each run, and the prediction uses the mean of
//! the probes before and after it, so a drift during the run is split rather than ignored.
//!
//! The predicted maximum is the same as `cdr run --find-max` (`crate::predict`): the lower of the
//! first node to saturate (c·μ/v) and the host's cores over the CPU time per ticket, with
//! what the threads' sharing of the cores costs measured right before each run
//! (`crate::sharing`: a usable core share and the CPU per hop under the configuration's own
//! thread counts). Each round also reports the split of its ratio, measured / predicted =
//! (cores used / usable cores) × (c_model / c_run), exact when the cores' bound is the
//! prediction, so a user sees whether idle cores or dearer tickets moved it. `Budget::Threads`
//! predicts as published instead: every thread on a core of its own, the first node to
//! saturate alone, no sharing probe.

use std::path::{Path, PathBuf};
use std::time::Duration;

use planner::measure::available_cores;
use planner::model::{NetworkSpec, NodeConfig, PipelineConfig};
use planner::network::Network;
use planner::options::Budget;
use serde::Serialize;
use stats::median;

use crate::error::{Result, io_failed};
use crate::feed::DbTarget;
use crate::measure::CdrWorkload;
use crate::predict::{Offered, compare_with_budget, cpu_s_per_ticket, threads_in_model_order};
use crate::run::{Arrivals, NodeThreads, RunSettings, RunSummary, run_pipeline};
use crate::sharing::Sharing;

/// One configuration to validate: thread counts and workload settings (`KEY=VALUE`, as for
/// `plan measure cdr --set`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Configuration {
    pub name: String,
    pub threads: NodeThreads,
    pub settings: Vec<(String, String)>,
}

fn configuration(name: &str, threads: [usize; 4], settings: &[(&str, &str)]) -> Configuration {
    let [decoder, converter, serializer, feeder] = threads;
    Configuration {
        name: name.into(),
        threads: NodeThreads { decoder, converter, serializer, feeder },
        settings: settings.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect(),
    }
}

/// Every known configuration: the feeder as the bottleneck well below the cores' bound (one
/// and 16 rows per SQLite transaction, two thread layouts), two CPU-bound shapes (on a 2-core
/// host the feeder's bound and the cores' bound are within a few percent of each other
/// there), and an fsync-bound serializer. SQLite fixes the feeder at one thread in every one
/// of them. The first [`DEFAULT_CONFIGURATIONS`] run by default; the fsync-bound one is
/// opt-in because a shared virtual disk's fsync rate swings by 10× within seconds
/// (docs/benchmarks/planner.md).
pub fn all_configurations() -> Vec<Configuration> {
    vec![
        configuration("feeder-bound", [1, 1, 1, 1], &[("feed_batch_rows", "1")]),
        configuration("cpu-bound", [1, 1, 1, 1], &[]),
        configuration("cpu-bound-2-converters", [1, 2, 1, 1], &[]),
        configuration(
            "feeder-bound-16-rows-2-decoders",
            [2, 1, 1, 1],
            &[("feed_batch_rows", "16")],
        ),
        configuration("fsync-bound-serializer", [1, 1, 1, 1], &[("fsync_every_records", "8")]),
    ]
}

/// How many of [`all_configurations`] run when none is named.
pub const DEFAULT_CONFIGURATIONS: usize = 4;

/// One configuration's measurement and run, back to back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoundResult {
    pub configuration: String,
    pub round: usize,
    /// What limits the prediction: a node's name or `cpu`.
    pub predicted_bottleneck: String,
    pub predicted_per_s: f64,
    pub measured_per_s: f64,
    /// Cores found available just before and just after the run (the prediction uses their
    /// mean).
    pub cores_before: f64,
    pub cores_after: f64,
    /// Cores the run used (process CPU time / wall time).
    pub cores_used: f64,
    /// The sharing probe's usable core share (1 with the threads budget: no probe).
    pub usable_core_share: f64,
    /// The runtime's CPU per hop the prediction charged (the sharing probe's, or the
    /// one-worker calibration's with the threads budget).
    pub hop_cpu_s: f64,
    /// Cores used over the usable cores the prediction assumed (mean probed cores × usable
    /// share): the first factor of the ratio's split.
    pub cores_used_share: f64,
    /// The model's CPU per generated ticket over the run's (process CPU / tickets generated):
    /// the second factor.
    pub cpu_model_over_run: f64,
}

impl RoundResult {
    pub fn ratio(&self) -> f64 {
        self.measured_per_s / self.predicted_per_s
    }
}

/// Validation knobs.
#[derive(Debug, Clone)]
pub struct ValidateSettings {
    pub rounds: usize,
    /// Each node's measuring time.
    pub measure_duration: Duration,
    /// Each flat-out run's generator time.
    pub run_duration: Duration,
    pub scratch_dir: PathBuf,
    pub seed: u64,
    /// What bounds a flat-out prediction (`crate::predict::compare_with_budget`).
    pub budget: Budget,
}

/// Runs every configuration `rounds` times, interleaved; `on_round` sees each result.
pub fn validate(
    configurations: &[Configuration],
    settings: &ValidateSettings,
    mut on_round: impl FnMut(&RoundResult),
) -> Result<Vec<RoundResult>> {
    let mut results = Vec::new();
    for round in 0..settings.rounds {
        for configuration in configurations {
            let result = measure_then_run(configuration, round, settings)?;
            on_round(&result);
            results.push(result);
        }
    }
    Ok(results)
}

fn measure_then_run(
    configuration: &Configuration,
    round: usize,
    settings: &ValidateSettings,
) -> Result<RoundResult> {
    let workload = CdrWorkload::default().with_settings(&configuration.settings)?;
    let dir = settings.scratch_dir.join(format!("{}-{round}", configuration.name));
    let (measure_dir, run_dir) = (dir.join("measure"), dir.join("run"));
    std::fs::create_dir_all(&measure_dir)
        .map_err(io_failed(format!("creating {}", measure_dir.display())))?;
    let measured = workload.measure_with_hop(settings.measure_duration, &measure_dir)?;
    let cores_before = measured.model.host.cores;
    let sharing = match settings.budget {
        Budget::Cpu => Sharing::probe(
            &measured.model,
            measured.hop_cpu_s,
            configuration.threads,
            settings.measure_duration,
            cores_before,
        )?,
        Budget::Threads => Sharing { usable_core_share: 1.0, hop_cpu_s: measured.hop_cpu_s },
    };
    let run = RunSettings {
        threads: configuration.threads,
        arrivals: Arrivals::FlatOut(settings.run_duration),
        online: None,
        out_dir: run_dir.clone(),
        database: DbTarget::Sqlite(run_dir.join("cdr.sqlite")),
        fsync_every_records: workload.fsync_every_records,
        feed_batch_rows: workload.feed_batch_rows,
        malformed_every: workload.malformed_every,
        seed: settings.seed + round as u64,
    };
    let summary = run_pipeline(&run);
    let cores_after = available_cores(settings.measure_duration);
    std::fs::remove_dir_all(&dir).map_err(io_failed(format!("removing {}", dir.display())))?;
    let summary = summary?;
    let mut model = measured.model;
    model.host.cores = (cores_before + cores_after) / 2.0;
    sharing.apply(&mut model, measured.hop_cpu_s);
    let config = pipeline_config(model, configuration.threads)?;
    let duration_s = settings.run_duration.as_secs_f64();
    let comparison =
        compare_with_budget(&config, &summary, duration_s, Offered::FlatOut, settings.budget)?;
    let (cores_used_share, cpu_model_over_run) = ratio_split(&config, &summary)?;
    Ok(RoundResult {
        configuration: configuration.name.clone(),
        round,
        predicted_bottleneck: predicted_bottleneck(&config, settings.budget)?,
        predicted_per_s: comparison.predicted_throughput_per_s,
        measured_per_s: comparison.measured_throughput_per_s,
        cores_before,
        cores_after,
        cores_used: summary.cpu_s / summary.wall_s,
        usable_core_share: sharing.usable_core_share,
        hop_cpu_s: sharing.hop_cpu_s,
        cores_used_share,
        cpu_model_over_run,
    })
}

/// The two factors of measured / predicted when the cores' bound is the prediction: cores
/// used / the model's cores, and the model's CPU per generated ticket / the run's.
fn ratio_split(config: &PipelineConfig, summary: &RunSummary) -> Result<(f64, f64)> {
    let network = Network::new(config.model.clone())?;
    let cores_used = summary.cpu_s / summary.wall_s;
    let cpu_run_s_per_ticket = summary.cpu_s / summary.generated.max(1) as f64;
    Ok((cores_used / network.spec().host.cores, cpu_s_per_ticket(&network) / cpu_run_s_per_ticket))
}

/// A config file's content for `model` run with `threads` (the generator runs one thread).
fn pipeline_config(model: NetworkSpec, threads: NodeThreads) -> Result<PipelineConfig> {
    let [decoder, converter, serializer, feeder] = threads.as_array();
    let count = |name: &str| match name {
        "decoder" => decoder,
        "converter" => converter,
        "serializer" => serializer,
        "feeder" => feeder,
        _ => 1,
    };
    let node = model
        .node
        .iter()
        .map(|node| NodeConfig {
            name: node.name.clone(),
            threads: count(&node.name) as u32,
            ..NodeConfig::default()
        })
        .collect();
    Ok(PipelineConfig { model, node, ..PipelineConfig::default() })
}

/// Which bound `crate::predict` takes for a flat-out run: the first node to saturate, or `cpu`
/// (never with the threads budget).
fn predicted_bottleneck(config: &PipelineConfig, budget: Budget) -> Result<String> {
    let network = Network::new(config.model.clone())?;
    let threads = threads_in_model_order(config, &network)?;
    let visits = network.visit_ratios();
    let mut slowest = (f64::INFINITY, "");
    for ((node, &threads), &visits) in network.nodes().iter().zip(&threads).zip(&visits) {
        let saturation_per_s = f64::from(threads) * node.service_rate_per_s / visits;
        if node.external_share == 0.0 && saturation_per_s < slowest.0 {
            slowest = (saturation_per_s, &node.name);
        }
    }
    let cpu_bound_per_s = match budget {
        Budget::Cpu => network.spec().host.cores / cpu_s_per_ticket(&network),
        Budget::Threads => f64::INFINITY,
    };
    Ok(if cpu_bound_per_s < slowest.0 { "cpu".into() } else { slowest.1.into() })
}

/// Per configuration: the median over rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigurationSummary {
    pub configuration: String,
    pub threads: NodeThreads,
    pub predicted_bottleneck: String,
    pub predicted_per_s_median: f64,
    pub measured_per_s_median: f64,
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// Medians of the split's factors and of the probe's usable core share.
    pub cores_used_share_median: f64,
    pub cpu_model_over_run_median: f64,
    pub usable_core_share_median: f64,
}

/// Medians per configuration, in the order given.
pub fn summarize(
    configurations: &[Configuration],
    results: &[RoundResult],
) -> Vec<ConfigurationSummary> {
    configurations
        .iter()
        .map(|configuration| {
            let rounds: Vec<&RoundResult> =
                results.iter().filter(|r| r.configuration == configuration.name).collect();
            let median_of = |value: &dyn Fn(&RoundResult) -> f64| {
                median(rounds.iter().map(|r| value(r)).collect())
            };
            let ratios: Vec<f64> = rounds.iter().map(|r| r.ratio()).collect();
            ConfigurationSummary {
                configuration: configuration.name.clone(),
                threads: configuration.threads,
                predicted_bottleneck: most_common(rounds.iter().map(|r| &r.predicted_bottleneck)),
                predicted_per_s_median: median_of(&|r| r.predicted_per_s),
                measured_per_s_median: median_of(&|r| r.measured_per_s),
                ratio_median: median(ratios.clone()),
                ratio_min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
                ratio_max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                cores_used_share_median: median_of(&|r| r.cores_used_share),
                cpu_model_over_run_median: median_of(&|r| r.cpu_model_over_run),
                usable_core_share_median: median_of(&|r| r.usable_core_share),
            }
        })
        .collect()
}

fn most_common<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&String> = names.collect();
    let count = |name: &String| names.iter().filter(|other| **other == name).count();
    names.iter().max_by_key(|name| count(name)).map_or_else(String::new, |name| (*name).clone())
}

/// The scratch folder for a validation when none is given.
pub fn default_scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("leantier-validate-{}", std::process::id()))
}

/// Removes `dir` if it is empty (the runs remove their own folders).
pub fn remove_scratch_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir(dir) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ranges_per_configuration() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
        let configurations = all_configurations();
        let result = |configuration: &str, round, measured_per_s| RoundResult {
            configuration: configuration.into(),
            round,
            predicted_bottleneck: "feeder".into(),
            predicted_per_s: 100.0,
            measured_per_s,
            cores_before: 1.0,
            cores_after: 1.0,
            cores_used: 1.0,
            usable_core_share: 1.0,
            hop_cpu_s: 1e-7,
            cores_used_share: measured_per_s / 100.0,
            cpu_model_over_run: 1.0,
        };
        let results = [
            result("feeder-bound", 0, 90.0),
            result("feeder-bound", 1, 120.0),
            result("feeder-bound", 2, 100.0),
            result("cpu-bound", 0, 50.0),
        ];
        let summary = summarize(&configurations[..2], &results);
        assert_eq!(summary[0].ratio_median, 1.0);
        assert_eq!((summary[0].ratio_min, summary[0].ratio_max), (0.9, 1.2));
        assert_eq!(summary[1].measured_per_s_median, 50.0);
        assert_eq!(summary[0].predicted_bottleneck, "feeder");
        assert_eq!(summary[0].cores_used_share_median, 1.0);
    }

    #[test]
    fn a_short_validation_round_measures_and_runs_each_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let settings = ValidateSettings {
            rounds: 1,
            measure_duration: Duration::from_millis(40),
            run_duration: Duration::from_millis(150),
            scratch_dir: dir.path().to_path_buf(),
            seed: 1,
            budget: Budget::Cpu,
        };
        let configurations = &all_configurations()[..1];
        let mut seen = 0;
        let results = validate(configurations, &settings, |_| seen += 1).unwrap();
        assert_eq!((results.len(), seen), (1, 1));
        let result = &results[0];
        assert!(result.predicted_per_s > 0.0 && result.measured_per_s > 0.0, "{result:?}");
        // One row per transaction makes the feeder the slowest node; on a loaded host (and in
        // a debug build) the cores can bind first.
        let bottleneck = result.predicted_bottleneck.as_str();
        assert!(["feeder", "cpu"].contains(&bottleneck), "{result:?}");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "run folders removed");
        assert!(result.usable_core_share > 0.0 && result.usable_core_share <= 1.0, "{result:?}");
        assert!(result.cores_used_share > 0.0 && result.cpu_model_over_run > 0.0, "{result:?}");
    }

    #[test]
    fn the_split_multiplies_to_the_ratio_when_the_cores_bind() {
        let config: PipelineConfig = toml::from_str(
            r#"
            [model]
            host = { cores = 0.1 }
            node = [
                { name = "generator", service_rate_per_s = 1000.0, external_share = 1.0 },
                { name = "feeder", service_rate_per_s = 100.0 },
            ]
            route = [{ from = "generator", to = "feeder" }]
            [[node]]
            name = "generator"
            threads = 1
            [[node]]
            name = "feeder"
            threads = 1
            "#,
        )
        .unwrap();
        let stage = |name: &str, messages_in, messages_out| crate::run::StageSummary {
            name: name.into(),
            workers: 1,
            messages_in,
            messages_out,
            utilization: 1.0,
        };
        // 5 tickets in 1 s on 0.05 cores: 10 ms of CPU per ticket against the model's 11 ms,
        // half the 0.1 cores the model has.
        let summary = RunSummary {
            generated: 5,
            rejected: 0,
            serialized: 5,
            inserted: 5,
            wall_s: 1.0,
            cpu_s: 0.05,
            stages: vec![stage("generator", 0, 5), stage("feeder", 5, 0)],
            timeline: Vec::new(),
        };
        assert_eq!(predicted_bottleneck(&config, Budget::Cpu).unwrap(), "cpu");
        assert_eq!(predicted_bottleneck(&config, Budget::Threads).unwrap(), "feeder");
        let comparison =
            compare_with_budget(&config, &summary, 1.0, Offered::FlatOut, Budget::Cpu).unwrap();
        let ratio = comparison.measured_throughput_per_s / comparison.predicted_throughput_per_s;
        let (cores_used_share, cpu_model_over_run) = ratio_split(&config, &summary).unwrap();
        assert!((cores_used_share - 0.5).abs() < 1e-9, "{cores_used_share}");
        assert!((cpu_model_over_run - 1.1).abs() < 1e-9, "{cpu_model_over_run}");
        assert!((cores_used_share * cpu_model_over_run - ratio).abs() < 1e-9, "{ratio}");
    }
}
