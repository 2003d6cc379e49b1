//! The layout's invariants (ARCHITECTURE.md, "Invariants"), checked from the manifests and the
//! lock file so that they stay true:
//! - `cli` (package `leantier`) is the only crate that knows about command-line flags: no
//!   other crate depends on clap;
//! - `pipeline`, `stats` and `ops` depend on no other leantier crate;
//! - leantier crates depend on each other only along the map's edges, and ARCHITECTURE.md's
//!   crate map is the list of those edges, generated here (`LEANTIER_UPDATE_ARCHITECTURE=1
//!   cargo test -p leantier --test architecture` rewrites it);
//! - `planner` (queueing math) builds without an async runtime or the ring peers;
//! - the runtime (`pipeline`), the journal and the matching core build with their own few
//!   dependencies: nothing of the lab (load drivers, reports, config files, progress bars, async runtime);
//! - only `delivery` and `replication` (and the lab's `experiments`: its test cluster) depend
//!   on async-nats, only `experiments` (its ring benchmark) on rtrb and disruptor;
//! - libraries return their own typed errors: only `cli` and the lab's `experiments` depend on
//!   `anyhow`;
//! - the tier is the only place that wires stages: the gateway feeds it and has no rings,
//!   stage graph or layout chooser of its own;
//! - the servers' crates build with the slim statistics crate (`stats`: histograms, open-loop
//!   schedules) and without plotting, progress bars or the experiments crate, and
//!   the tier is started one way (no slot or channel beside the source's start).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[path = "common/workspace.rs"]
mod workspace;
use workspace::{rust_files, workspace_root};

/// The dependency edges between leantier crates that the map allows (normal dependencies;
/// every crate may also use `ops`, `pipeline` and `stats`, except those three themselves).
const ALLOWED_EDGES: &[(&str, &str)] = &[
    ("cdr", "planner"),
    ("delivery", "exchange"),
    ("exchange", "journal"),
    ("exchange", "matching"),
    ("exchange", "planner"),
    ("experiments", "cdr"),
    ("experiments", "delivery"),
    ("experiments", "exchange"),
    ("experiments", "gateway"),
    ("experiments", "journal"),
    ("experiments", "mq"),
    ("experiments", "planner"),
    ("experiments", "web"),
    ("gateway", "delivery"),
    ("gateway", "exchange"),
    ("gateway", "journal"),
    ("gateway", "replication"),
    ("replication", "delivery"),
    ("replication", "exchange"),
    ("replication", "matching"),
    ("sim", "delivery"),
    ("sim", "exchange"),
    ("sim", "gateway"),
    ("sim", "journal"),
    ("sim", "replication"),
];
/// Crates nobody but the binary depends on with these (the base of the map).
const BASE_CRATES: &[&str] = &["ops", "pipeline", "stats"];
/// Crates `planner` must not pull in, directly or through another dependency.
const PLANNER_FORBIDDEN: &[&str] = &["tokio", "disruptor", "rtrb", "crossbeam", "clap"];

fn read_toml(path: &Path) -> toml::Table {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.parse().unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The name code uses for a member: its `[lib] name` where the package name carries the
/// `leantier-` prefix for crates.io (`leantier-pipeline` is `pipeline`), else the package name.
fn crate_name(table: &toml::Table) -> String {
    let lib_name = table.get("lib").and_then(|lib| lib.get("name")).and_then(|n| n.as_str());
    lib_name.unwrap_or_else(|| table["package"]["name"].as_str().unwrap()).to_string()
}

/// Crate name → names of its normal (non-dev) dependencies, as its manifest's keys, for every
/// workspace member.
fn members() -> BTreeMap<String, BTreeSet<String>> {
    let mut members = BTreeMap::new();
    for entry in std::fs::read_dir(workspace_root().join("crates")).unwrap() {
        let manifest = entry.unwrap().path().join("Cargo.toml");
        if !manifest.exists() {
            continue;
        }
        let table = read_toml(&manifest);
        let name = crate_name(&table);
        // Normal dependencies, unconditional or per target (`[target.'cfg(..)'.dependencies]`).
        let targets = table.get("target").and_then(|t| t.as_table());
        let per_target = targets.into_iter().flat_map(|t| t.values());
        let tables = std::iter::once(&toml::Value::Table(table.clone()))
            .chain(per_target)
            .filter_map(|t| t.get("dependencies").and_then(|d| d.as_table()))
            .flat_map(|d| d.keys().cloned())
            .collect::<BTreeSet<String>>();
        members.insert(name, tables);
    }
    members
}

#[test]
fn only_the_binary_knows_about_command_line_flags() {
    for (name, deps) in members() {
        if name != "leantier" {
            assert!(!deps.contains("clap"), "{name} depends on clap: flags belong to crates/cli");
        }
    }
}

#[test]
fn crates_depend_on_each_other_only_along_the_map() {
    let members = members();
    let ours: BTreeSet<&String> = members.keys().collect();
    for (name, deps) in &members {
        if name == "leantier" {
            continue;
        }
        for dep in deps.iter().filter(|dep| ours.contains(dep)) {
            let base = BASE_CRATES.contains(&dep.as_str()) && !BASE_CRATES.contains(&name.as_str());
            let allowed = ALLOWED_EDGES.contains(&(name.as_str(), dep.as_str()));
            assert!(base || allowed, "{name} → {dep} is not an edge of ARCHITECTURE.md's map");
        }
    }
    for base in BASE_CRATES {
        let leantier_deps: Vec<&String> =
            members[*base].iter().filter(|dep| ours.contains(dep)).collect();
        assert!(leantier_deps.is_empty(), "{base} must be a leaf: {leantier_deps:?}");
    }
}

/// The leantier → leantier normal dependencies of every member but the binary, base crates
/// (`BASE_CRATES`) left out: the edges the map draws.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let members = members();
    let ours: BTreeSet<&String> = members.keys().collect();
    let own = |deps: &BTreeSet<String>| -> BTreeSet<String> {
        let ours_only = deps.iter().filter(|dep| ours.contains(dep));
        ours_only.filter(|dep| !BASE_CRATES.contains(&dep.as_str())).cloned().collect()
    };
    let members = members.iter().filter(|(name, _)| *name != "leantier");
    members.map(|(name, deps)| (name.clone(), own(deps))).collect()
}

/// A crate's layer: 0 for a crate that uses only base crates, else one more than its deepest
/// dependency's.
fn layer(name: &str, edges: &BTreeMap<String, BTreeSet<String>>) -> usize {
    let deps = edges.get(name).into_iter().flatten();
    deps.map(|dep| layer(dep, edges) + 1).max().unwrap_or(0)
}

/// The crate map as ARCHITECTURE.md shows it: the crates by layer, top first, each with the
/// leantier crates it depends on.
fn crate_map() -> String {
    let edges = edges();
    let mut rows: Vec<(usize, &String)> =
        edges.keys().map(|name| (layer(name, &edges), name)).collect();
    rows.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let bases = BASE_CRATES.join(", ");
    let mut map = format!("layer  crate          depends on (besides {bases})\n");
    map.push_str("    -  leantier (cli)  every crate below\n");
    for (layer, name) in rows.into_iter().filter(|(_, name)| !BASE_CRATES.contains(&name.as_str()))
    {
        let deps: Vec<&str> = edges[name].iter().map(String::as_str).collect();
        let deps = if deps.is_empty() { "-".to_string() } else { deps.join(", ") };
        map.push_str(&format!("{layer:>5}  {name:<14} {deps}\n"));
    }
    // The base crates are leaves (`crates_depend_on_each_other_only_along_the_map`).
    map.push_str(&format!("    0  {bases}  (used by every crate; depend on no leantier crate)\n"));
    map
}

const MAP_BEGIN: &str = "<!-- crate map: generated by crates/cli/tests/architecture.rs -->\n```\n";
const MAP_END: &str = "```\n<!-- end of crate map -->";

/// ARCHITECTURE.md's crate map is the manifests' edge list (rewritten with
/// `LEANTIER_UPDATE_ARCHITECTURE=1`), and every edge the map allows is one a manifest has.
#[test]
fn the_architecture_pages_crate_map_is_the_manifests_edges() {
    let edges = edges();
    for (from, to) in ALLOWED_EDGES {
        let exists = edges.get(*from).is_some_and(|deps| deps.contains(*to));
        assert!(exists, "ALLOWED_EDGES lists {from} → {to}, which no manifest has: remove it");
    }
    let path = workspace_root().join("ARCHITECTURE.md");
    let page = std::fs::read_to_string(&path).unwrap();
    let begin =
        page.find(MAP_BEGIN).expect("ARCHITECTURE.md's crate map begin marker") + MAP_BEGIN.len();
    let end = begin + page[begin..].find(MAP_END).expect("the crate map's end marker");
    let map = crate_map();
    if std::env::var_os("LEANTIER_UPDATE_ARCHITECTURE").is_some() {
        std::fs::write(&path, format!("{}{map}{}", &page[..begin], &page[end..])).unwrap();
        return;
    }
    assert_eq!(
        page[begin..end],
        map,
        "ARCHITECTURE.md's crate map differs from the manifests: run \
         `LEANTIER_UPDATE_ARCHITECTURE=1 cargo test -p leantier --test architecture`"
    );
}

/// Third-party crates that carry one capability, and the leantier crates that may use each:
/// the messaging system behind `delivery` (core NATS) and `replication` (JetStream), the ring
/// peers behind `experiments`' ring benchmark.
const SOLE_OWNERS: &[(&str, &[&str])] = &[
    // `experiments`: the loopback cluster's JetStream queries (tests and benchmarks only).
    ("async-nats", &["delivery", "replication", "experiments"]),
    ("rtrb", &["experiments"]),
    ("disruptor", &["experiments"]),
];

#[test]
fn only_the_owners_know_about_nats_and_the_ring_peers() {
    for (name, deps) in members() {
        for (dependency, owners) in SOLE_OWNERS {
            assert!(
                owners.contains(&name.as_str()) || !deps.contains(*dependency),
                "{name} depends on {dependency}: only {owners:?} may (ARCHITECTURE.md, Invariants)"
            );
        }
    }
}

/// The crates that may depend on `anyhow`: the binary, whose commands report any error, and
/// the lab's `experiments`, which only commands and tests call.
const ANYHOW_USERS: &[&str] = &["leantier", "experiments"];

#[test]
fn libraries_return_their_own_typed_errors_not_anyhow() {
    for (name, deps) in members() {
        assert!(
            ANYHOW_USERS.contains(&name.as_str()) || !deps.contains("anyhow"),
            "{name} depends on anyhow: a library returns its own typed error and leaves anyhow \
             to cli (ARCHITECTURE.md, Invariants)"
        );
    }
}

/// Package name → the package names of its normal dependencies, for every workspace member,
/// from the manifests (the lock file also lists members' dev-dependencies). A dependency is
/// named by its key unless it says `package = ...`, here or in `[workspace.dependencies]`.
fn member_packages() -> BTreeMap<String, BTreeSet<String>> {
    let root = read_toml(&workspace_root().join("Cargo.toml"));
    let workspace_deps = root["workspace"]["dependencies"].as_table().unwrap().clone();
    let package_of = |key: &str, spec: &toml::Value| -> String {
        let renamed = |table: &toml::Value| table.get("package")?.as_str().map(str::to_string);
        let inherited = workspace_deps.get(key).filter(|_| spec.get("workspace").is_some());
        renamed(spec).or_else(|| inherited.and_then(renamed)).unwrap_or_else(|| key.to_string())
    };
    let mut packages = BTreeMap::new();
    for entry in std::fs::read_dir(workspace_root().join("crates")).unwrap() {
        let manifest = entry.unwrap().path().join("Cargo.toml");
        if !manifest.exists() {
            continue;
        }
        let table = read_toml(&manifest);
        let per_target = table.get("target").and_then(|t| t.as_table()).into_iter();
        let tables = std::iter::once(&table)
            .chain(per_target.flat_map(|t| t.values()).filter_map(|t| t.as_table()));
        let deps = tables
            .filter_map(|t| t.get("dependencies").and_then(|d| d.as_table()))
            .flat_map(|d| d.iter().map(|(key, spec)| package_of(key, spec)))
            .collect();
        packages.insert(table["package"]["name"].as_str().unwrap().to_string(), deps);
    }
    packages
}

/// Every package a user's build of the workspace package `package` compiles: its normal
/// dependencies, theirs, and so on. Members contribute their manifests' normal dependencies;
/// other packages their lock entry (cargo resolves no dev-dependencies outside the workspace).
fn build_closure(package: &str) -> BTreeSet<String> {
    let members = member_packages();
    let lock = read_toml(&workspace_root().join("Cargo.lock"));
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in lock["package"].as_array().unwrap() {
        let name = entry["name"].as_str().unwrap().to_string();
        let deps = entry.get("dependencies").and_then(|d| d.as_array());
        // A lock entry names a dependency as "name" or "name version".
        let deps = deps.into_iter().flatten();
        let deps = deps.map(|d| d.as_str().unwrap().split(' ').next().unwrap().to_string());
        graph.entry(name).or_default().extend(deps);
    }
    graph.extend(members);
    let mut seen = BTreeSet::new();
    let mut stack: Vec<String> = graph[package].iter().cloned().collect();
    while let Some(name) = stack.pop() {
        if seen.insert(name.clone()) {
            stack.extend(graph.get(&name).into_iter().flatten().cloned());
        }
    }
    seen
}

#[test]
fn the_planner_builds_without_a_runtime_or_ring_peers() {
    let closure = build_closure("planner");
    for forbidden in PLANNER_FORBIDDEN {
        assert!(!closure.contains(*forbidden), "planner pulls in {forbidden}: {closure:?}");
    }
}

/// The lab's packages and what only the lab, the binary or the servers need: a library a
/// stranger embeds must not compile them.
const LAB_PACKAGES: &[&str] =
    &["experiments", "tokio", "indicatif", "rand", "toml", "clap", "anyhow", "criterion", "axum"];
/// Libraries that must build with their own few dependencies (issue 30).
const LEAN_LIBRARIES: &[&str] = &["leantier-pipeline", "leantier-journal", "leantier-matching"];

#[test]
fn the_runtime_the_journal_and_the_matching_core_build_without_the_lab() {
    let ours: BTreeSet<String> = member_packages().into_keys().collect();
    for library in LEAN_LIBRARIES {
        let closure = build_closure(library);
        for forbidden in LAB_PACKAGES {
            assert!(!closure.contains(*forbidden), "{library} pulls in {forbidden}: {closure:?}");
        }
        let allowed_ours =
            if *library == "leantier-journal" { &["leantier-pipeline"][..] } else { &[] };
        for member in closure.intersection(&ours) {
            assert!(allowed_ours.contains(&member.as_str()), "{library} pulls in {member}");
        }
    }
    // The check itself sees what it looks for: the binary builds with all of the lab.
    let binary = build_closure("leantier");
    assert!(["experiments", "tokio", "rand"].iter().all(|p| binary.contains(*p)), "{binary:?}");
}

/// The server crates (packages): what runs in production, behind `exchange serve`, `mq serve`,
/// `web serve`, the delivery and replication processes, and the cdr pipeline.
const SERVER_PACKAGES: &[&str] = &[
    "gateway",
    "leantier-exchange",
    "delivery",
    "leantier-replication",
    "mq",
    "web",
    "cdr",
    "leantier-ops",
    "leantier-journal",
    "leantier-pipeline",
    "leantier-matching",
];
/// What only the lab needs: plotting, terminal progress bars, and the experiments crate.
const LAB_ONLY_PACKAGES: &[&str] = &["plotters", "indicatif", "experiments"];
/// The slim statistics crate (package): the histograms and open-loop schedules servers record
/// and pace with, and all of the lab a server may compile.
const STATS_PACKAGE: &str = "leantier-stats";
/// Servers that record latency histograms, so their closure holds [`STATS_PACKAGE`].
const HISTOGRAM_SERVERS: &[&str] = &["gateway", "leantier-exchange", "delivery", "cdr"];

#[test]
fn the_servers_build_with_the_statistics_crate_not_plots_progress_bars_or_the_experiments() {
    let packages = member_packages();
    for server in SERVER_PACKAGES {
        assert!(
            !packages[*server].contains("experiments"),
            "{server} depends on experiments: lab code stays out of the servers; a server's \
             statistics come from {STATS_PACKAGE} (ARCHITECTURE.md, Invariants)"
        );
        let closure = build_closure(server);
        let found: Vec<&&str> =
            LAB_ONLY_PACKAGES.iter().filter(|p| closure.contains(**p)).collect();
        assert!(found.is_empty(), "{server} pulls in {found:?}: that is lab code (issue 44)");
    }
    for server in HISTOGRAM_SERVERS {
        let closure = build_closure(server);
        assert!(closure.contains(STATS_PACKAGE), "{server} records histograms without stats");
    }
    // The statistics crate itself is slim: no lab-only package, async runtime or config files.
    let stats = build_closure(STATS_PACKAGE);
    let heavy: Vec<&&str> = LAB_ONLY_PACKAGES
        .iter()
        .chain(&["tokio", "toml", "anyhow"])
        .filter(|p| stats.contains(**p))
        .collect();
    assert!(heavy.is_empty(), "{STATS_PACKAGE} pulls in {heavy:?}: it must stay slim");
    // The replicated tier's test cluster (`experiments::cluster`, with its temporary folders)
    // is a dev-dependency of replication's tests, not part of the library.
    let replication = &packages["leantier-replication"];
    let helpers: Vec<&str> =
        ["tempfile", "experiments"].into_iter().filter(|p| replication.contains(*p)).collect();
    assert!(helpers.is_empty(), "replication depends on test helpers {helpers:?}");
    // The check itself sees what it looks for: the binary builds with all of the lab.
    let binary = build_closure("leantier");
    assert!(LAB_ONLY_PACKAGES.iter().all(|p| binary.contains(*p)), "{binary:?}");
    assert!(binary.contains(STATS_PACKAGE), "{binary:?}");
}

/// What wiring stages looks like in code: the ring, the connector, the stage graph, the
/// placement planner, and a module of layout choices. The gateway feeds the tier; the tier
/// (`exchange::tier`) is the one place that wires stages (ARCHITECTURE.md, Invariants).
const STAGE_WIRING: &[&str] = &[
    "pipeline::ring",
    "pipeline::connector",
    "PipelineBuilder",
    "pipeline::placement",
    "spsc(",
    "mod layout",
];

/// The places in `dir`'s sources that use one of `patterns`, as `file:line: pattern`.
fn uses_of(dir: &Path, patterns: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(dir) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (at, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for pattern in patterns.iter().filter(|p| code.contains(*p)) {
                found.push(format!("{}:{}: {pattern}", file.display(), at + 1));
            }
        }
    }
    found
}

#[test]
fn the_tier_is_the_only_place_that_wires_stages() {
    let gateway = workspace_root().join("crates/gateway/src");
    let wiring = uses_of(&gateway, STAGE_WIRING);
    assert!(
        wiring.is_empty(),
        "the gateway wires stages; it must feed the tier:\n{}",
        wiring.join("\n")
    );
    // The check itself finds what it looks for.
    let tier = workspace_root().join("crates/exchange/src/tier");
    assert!(!uses_of(&tier, &["PipelineBuilder"]).is_empty(), "the tier wires its stages");
}

/// What a side channel around the tier's start looks like: a slot the order source polls for
/// what the starter leaves there, a channel the starter waits on beside the tier's own start.
const START_SIDE_CHANNELS: &[&str] = &["Mutex<Option", "sync_channel", "HandoffSlot", "SideFeeds"];

/// The tier hands its order source what it needs (control input, durable sequences, layout)
/// when the source starts, and `Tier::start_with_source` returns once it has: the server that
/// starts the tier, and the tier itself, have no slot or channel beside that one way in.
#[test]
fn the_tier_is_started_one_way() {
    let root = workspace_root();
    let server = root.join("crates/gateway/src/server.rs");
    let text = std::fs::read_to_string(&server).unwrap();
    let code: Vec<&str> = text.lines().map(|line| line.split("//").next().unwrap_or("")).collect();
    let found: Vec<&&str> =
        START_SIDE_CHANNELS.iter().filter(|p| code.iter().any(|l| l.contains(**p))).collect();
    assert!(
        found.is_empty(),
        "gateway/src/server.rs starts the tier beside its one way in: {found:?}"
    );
    let tier = uses_of(&root.join("crates/exchange/src/tier"), &["SideFeeds", "Mutex<Option"]);
    assert!(
        tier.is_empty(),
        "the tier hands its source its inputs beside SourceStart:\n{}",
        tier.join("\n")
    );
    // The check itself finds what it looks for.
    let source = root.join("crates/exchange/src/tier");
    assert!(!uses_of(&source, &["SourceStart"]).is_empty(), "the tier hands over a SourceStart");
}
