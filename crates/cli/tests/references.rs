//! The operator's references, generated from the code (issue 45): docs/CONFIG.md lists every
//! key of `exchange serve --config` (with its `[tier]` table), `mq serve --config` and
//! `web serve --config`; docs/METRICS.md every metric family each server's `/metrics` serves.
//! The keys are the ones the servers themselves accept (the list a mistyped key's error
//! names), the defaults what `--print-config` prints, the types and meanings the fields' Rust
//! types and doc comments; the metrics are scraped from freshly started servers. Each test
//! regenerates its file and fails when the committed one differs;
//! `LEANTIER_UPDATE_REFERENCES=1 cargo test -p leantier --test references` rewrites them.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Compares `generated` with the committed `relative` file, or rewrites it when asked.
fn check_or_update(relative: &str, generated: &str) {
    let path = repo().join(relative);
    if std::env::var_os("LEANTIER_UPDATE_REFERENCES").is_some() {
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let differs = committed
            .lines()
            .zip(generated.lines())
            .find(|(a, b)| a != b)
            .map_or("(one is a prefix of the other)".to_string(), |(a, b)| {
                format!("committed: {a}\ngenerated: {b}")
            });
        panic!(
            "{relative} is stale: the code changed. Regenerate it with \
             `LEANTIER_UPDATE_REFERENCES=1 cargo test -p leantier --test references` and \
             review the difference. First difference:\n{differs}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Source: a struct's fields with their types and doc comments.

#[derive(Clone, Debug)]
struct Field {
    name: String,
    ty: String,
    doc: String,
    /// Other names serde accepts for it (`#[serde(alias = "…")]`).
    aliases: Vec<String>,
}

/// The serde-visible fields of `struct name` in `path` (`#[serde(skip)]` ones left out).
fn fields(path: &str, name: &str) -> Vec<Field> {
    let text = std::fs::read_to_string(repo().join(path)).unwrap();
    let start = text
        .lines()
        .position(|l| {
            let l = l.trim_start();
            l.starts_with(&format!("pub struct {name} {{"))
                || l.starts_with(&format!("struct {name} {{"))
        })
        .unwrap_or_else(|| panic!("no struct {name} in {path}"));
    let mut out = Vec::new();
    let (mut doc, mut skip, mut aliases) = (Vec::new(), false, Vec::new());
    let mut in_attribute = false;
    for line in text.lines().skip(start + 1) {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if in_attribute || line.starts_with("#[") {
            // An attribute, maybe over several lines (clap's `#[arg(…)]`).
            in_attribute = !line.ends_with(']');
            skip |= line.contains("serde(skip)");
            let serde_alias = line.starts_with("#[serde(") && line.contains("alias = \"");
            if let Some(alias) = serde_alias.then(|| line.split("alias = \"").nth(1)).flatten() {
                aliases.push(alias.split('"').next().unwrap_or("").to_string());
            }
        } else if let Some(d) = line.strip_prefix("///") {
            doc.push(d.trim().to_string());
        } else if let Some((field, ty)) = line.trim_start_matches("pub ").split_once(':') {
            let identifier = field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !skip && identifier && !field.is_empty() {
                let ty = ty.trim().trim_end_matches(',').to_string();
                let (name, doc) = (field.trim().into(), clean_doc(&doc.join(" ")));
                out.push(Field { name, ty, doc, aliases: std::mem::take(&mut aliases) });
            }
            doc.clear();
            aliases.clear();
            skip = false;
        }
    }
    out
}

/// Rustdoc links and code spans as plain text for a table cell.
fn clean_doc(doc: &str) -> String {
    doc.replace("[`", "`").replace("`]", "`").replace('|', "\\|")
}

/// The struct named `ty` (inside `Option<…>`) among `sources`, if it is one.
fn nested_struct<'a>(ty: &str, sources: &[(&'a str, &'a str)]) -> Option<(&'a str, &'a str)> {
    let inner = ty.trim_start_matches("Option<").trim_end_matches('>');
    sources.iter().copied().find(|(_, name)| *name == inner)
}

fn toml_type(ty: &str) -> &'static str {
    let inner = ty.trim_start_matches("Option<").trim_end_matches('>');
    match inner {
        "usize" | "u16" | "u32" | "u64" | "i64" => "integer",
        "f64" => "float",
        "bool" => "boolean",
        "String" => "string",
        "PathBuf" => "path",
        "SocketAddr" => "address",
        "toml::Table" => "table",
        _ => "string (one of the values named)",
    }
}

fn unit(key: &str) -> &'static str {
    let last = key.rsplit('.').next().unwrap_or(key);
    if last.ends_with("_ms") || last.contains("_ms_") {
        "ms"
    } else if last.ends_with("_ns") {
        "ns"
    } else if last.contains("bytes") {
        "bytes"
    } else if last.ends_with("_per_s") {
        "per second"
    } else {
        "—"
    }
}

// ---------------------------------------------------------------------------------------
// The binary: accepted keys and defaults.

fn leantier(args: &[&str], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_leantier")).args(args).current_dir(dir).output().unwrap()
}

/// The keys a config file accepts, as the refusal of a mistyped key names them.
fn accepted_keys(args: &[&str], file: &str, dir: &Path) -> Vec<String> {
    std::fs::write(dir.join("probe.toml"), file).unwrap();
    let out = leantier(args, dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let list = stderr
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("{args:?} named no accepted keys: {stderr}"));
    let list = list.lines().next().unwrap_or("");
    list.split(", ").map(|k| k.trim().trim_matches('`').to_string()).collect()
}

/// `--print-config`'s TOML.
fn printed(args: &[&str], dir: &Path) -> toml::Table {
    let out = leantier(args, dir);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).parse().unwrap()
}

fn lookup<'a>(table: &'a toml::Table, dotted: &str) -> Option<&'a toml::Value> {
    let mut parts = dotted.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

/// One server's config keys for the reference.
struct ConfigSection {
    heading: &'static str,
    intro: &'static str,
    /// Where the keys' fields are declared, first match wins: the config struct, then the
    /// structs its keys feed (their field names, or the same without `_ms`).
    sources: &'static [(&'static str, &'static str)],
    /// Meanings for keys no doc comment in `sources` gives.
    meanings: &'static [(&'static str, &'static str)],
    /// Keys whose default is the number of usable CPUs (not this machine's number).
    per_cpu: &'static [&'static str],
    /// Structs a key's value is a table of (its keys listed as `key.sub`).
    nested: &'static [(&'static str, &'static str)],
}

const SERVE_MEANINGS: &[(&str, &str)] = &[
    ("listen", "Address of the native order-entry listener (`--listen`)."),
    ("fix_listen", "Address of the FIX 4.4 acceptor (`--fix-listen`); unset: no FIX listener."),
    (
        "metrics_listen",
        "Address of `/metrics`, `/health`, `/ready` and the admin endpoints (`--metrics-listen`); unset: none.",
    ),
    (
        "credentials",
        "The credentials file (`client_id name argon2-hash` per line), relative to the config file.",
    ),
    ("instruments", "Instruments of the reference universe when no `instruments_file` is given."),
    ("clients", "Clients of the reference universe when no `clients_file` is given."),
    (
        "instruments_file",
        "The instruments file (symbols, tick sizes), relative to the config file; goes with `clients_file`.",
    ),
    (
        "clients_file",
        "The clients file, relative to the config file; goes with `instruments_file`.",
    ),
    ("layout", "The tier's thread layout (`auto` or `thread-per-stage`); over `[tier].layout`."),
    ("tier", "The tier's own keys (the next table)."),
    ("universe.instruments", "Instruments of the reference universe."),
    ("universe.clients", "Clients of the reference universe."),
];

const TIER_TIMES: &[(&str, &str)] = &[
    ("preprocess_ns", "Pre-process stage service time."),
    ("core_ns", "Matching core stage service time."),
    ("rprocess_ns", "R-Processor stage service time."),
    ("sender_ns", "R-Sender stage service time."),
];

/// The config keys of one section as table rows: key, type, default, unit, meaning.
fn config_rows(
    section: &ConfigSection,
    keys: &[String],
    defaults: &toml::Table,
) -> Vec<[String; 5]> {
    let all: Vec<Field> = section.sources.iter().flat_map(|(p, s)| fields(p, s)).collect();
    // The type from the first field of that name; the meaning from its own doc comment,
    // else the section's list, else the first struct the key feeds that documents it.
    let find = |key: &str| {
        let named = |f: &&Field| f.name == key || Some(f.name.as_str()) == key.strip_suffix("_ms");
        let first = all.iter().find(named).cloned()?;
        let listed = section.meanings.iter().find(|(k, _)| *k == key).map(|(_, m)| m.to_string());
        let fed = all.iter().filter(named).find(|f| !f.doc.is_empty()).map(|f| f.doc.clone());
        let doc = Some(first.doc.clone()).filter(|d| !d.is_empty()).or(listed).or(fed);
        Some(Field { doc: doc.unwrap_or_default(), ..first })
    };
    let own = fields(section.sources[0].0, section.sources[0].1);
    let mut rows = Vec::new();
    for key in keys {
        if own.iter().any(|f| f.aliases.contains(key)) {
            continue; // listed under its field's name
        }
        let aliases = own.iter().find(|f| f.name == *key).map_or(String::new(), |f| {
            f.aliases.iter().map(|a| format!(" (alias `{a}`)")).collect()
        });
        let field = find(key);
        let ty = field.as_ref().map_or("string", |f| toml_type(&f.ty));
        if let Some((path, name)) =
            field.as_ref().and_then(|f| nested_struct(&f.ty, section.nested))
        {
            for sub in fields(path, name) {
                let dotted = format!("{key}.{}", sub.name);
                let meaning = meaning(section, &dotted, &sub.name, &sub.doc);
                let default =
                    lookup(defaults, &dotted).map_or("unset".into(), |v| format!("`{v}`"));
                rows.push([
                    format!("`{dotted}`"),
                    toml_type(&sub.ty).into(),
                    default,
                    unit(&dotted).into(),
                    meaning,
                ]);
            }
            continue;
        }
        let doc = field.map(|f| f.doc).unwrap_or_default();
        let default = lookup(defaults, key).map_or("unset".into(), |v| match v {
            toml::Value::Table(_) => "table".into(),
            _ if section.per_cpu.contains(&key.as_str()) => "the usable CPUs".into(),
            v => format!("`{v}`"),
        });
        let meaning = meaning(section, key, key, &doc);
        rows.push([format!("`{key}`{aliases}"), ty.into(), default, unit(key).into(), meaning]);
    }
    rows
}

fn meaning(section: &ConfigSection, dotted: &str, name: &str, doc: &str) -> String {
    let given = section.meanings.iter().chain(TIER_TIMES).find(|(k, _)| *k == dotted || *k == name);
    let text =
        if doc.is_empty() { given.map_or("", |(_, m)| m).to_string() } else { doc.to_string() };
    assert!(
        !text.is_empty(),
        "{}: key {dotted} has no meaning: give its field a doc comment",
        section.heading
    );
    text
}

fn table(rows: &[[String; 5]]) -> String {
    let mut text =
        String::from("| key | type | default | unit | meaning |\n|---|---|---|---|---|\n");
    for row in rows {
        text += &format!("| {} |\n", row.join(" | "));
    }
    text
}

const TIER_NESTED: &[(&str, &str)] = &[
    ("crates/exchange/src/flow.rs", "UniverseConfig"),
    ("crates/exchange/src/tier/layout.rs", "ServiceTimes"),
];

const SERVE_SECTION: ConfigSection = ConfigSection {
    heading: "`exchange serve --config`",
    intro: "The order-entry server (native and FIX listeners over the tier). Paths \
                are relative to the config file.",
    sources: &[
        ("crates/cli/src/commands/exchange_serve.rs", "ServeConfig"),
        ("crates/gateway/src/settings.rs", "Settings"),
    ],
    meanings: SERVE_MEANINGS,
    per_cpu: &[],
    nested: &[],
};

const TIER_SECTION: ConfigSection = ConfigSection {
    heading: "`[tier]` (in `exchange serve --config`)",
    intro: "The business tier behind the server: stages, rings, journal, layout. \
                Every key has a default; `auto` layout plans most of them itself.",
    sources: &[("crates/exchange/src/tier.rs", "TierConfig")],
    meanings: SERVE_MEANINGS,
    per_cpu: &[],
    nested: TIER_NESTED,
};

const MQ_SECTION: ConfigSection = ConfigSection {
    heading: "`mq serve --config`",
    intro: "The message queue node. The same keys (but `listen` and `store`) serve \
                `mq bench` and `mq experiment`.",
    sources: &[
        ("crates/mq/src/config.rs", "NodeConfig"),
        ("crates/cli/src/commands/mq.rs", "ServeArgs"),
    ],
    meanings: &[],
    per_cpu: &[],
    nested: &[],
};

const WEB_SECTION: ConfigSection = ConfigSection {
    heading: "`web serve --config`",
    intro: "The matrix web service.",
    sources: &[
        ("crates/web/src/serve.rs", "ServeConfig"),
        ("crates/cli/src/commands/web.rs", "ServeArgs"),
    ],
    meanings: &[],
    per_cpu: &["workers", "io_threads"],
    nested: &[],
};

fn config_reference() -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("credentials.txt"), "").unwrap();
    std::fs::write(dir.path().join("serve.toml"), "credentials = \"credentials.txt\"\n").unwrap();
    let serve_args = ["exchange", "serve", "--config", "probe.toml", "--print-config"];
    let serve_defaults =
        printed(&["exchange", "serve", "--config", "serve.toml", "--print-config"], dir.path());
    let serve_keys =
        accepted_keys(&serve_args, "credentials = \"x\"\nzzz_no_such_key = 1\n", dir.path());
    let tier_keys = accepted_keys(
        &serve_args,
        "credentials = \"x\"\n[tier]\nzzz_no_such_key = 1\n",
        dir.path(),
    );
    let mq_defaults = printed(&["mq", "serve", "--print-config"], dir.path());
    let mut mq_keys: Vec<String> = ["listen", "store"].map(String::from).to_vec();
    mq_keys.extend(accepted_keys(
        &["mq", "serve", "--config", "probe.toml"],
        "zzz_no_such_key = 1\n",
        dir.path(),
    ));
    let web_defaults = printed(&["web", "serve", "--print-config"], dir.path());
    let web_keys = accepted_keys(
        &["web", "serve", "--config", "probe.toml"],
        "zzz_no_such_key = 1\n",
        dir.path(),
    );
    let tier_defaults =
        serve_defaults.get("tier").and_then(|t| t.as_table()).cloned().unwrap_or_default();

    let mut text = String::from(
        "# Configuration reference\n\n\
         Every key each server's `--config` file accepts, generated from the code by \
         `crates/cli/tests/references.rs`: the keys are the ones the server accepts (a key not \
         listed is refused at start with exit 2), the defaults what `--print-config` prints with \
         nothing set (*unset*: off or derived, as the meaning says), the meanings the fields' doc \
         comments. The test fails when this file is stale; \
         `LEANTIER_UPDATE_REFERENCES=1 cargo test -p leantier --test references` regenerates \
         it. A flag of the same name (dashes for underscores) overrides a key; \
         docs/OPERATIONS.md says how to run each server.\n",
    );
    let sections = [
        (&SERVE_SECTION, &serve_keys, &serve_defaults),
        (&TIER_SECTION, &tier_keys, &tier_defaults),
        (&MQ_SECTION, &mq_keys, &mq_defaults),
        (&WEB_SECTION, &web_keys, &web_defaults),
    ];
    for (section, keys, defaults) in &sections {
        let rows = config_rows(section, keys, defaults);
        text += &format!("\n## {}\n\n{}\n\n{}", section.heading, section.intro, table(&rows));
    }
    text
}

/// docs/CONFIG.md is the code's keys, types, defaults and meanings.
#[test]
fn config_reference_is_current() {
    let generated = config_reference();
    for key in ["`universe.instruments`", "`handler_slots`", "`admission_wait_ms`", "`store_dir`"] {
        assert!(generated.contains(&format!("| {key}")), "{key} listed");
    }
    check_or_update("docs/CONFIG.md", &generated);
}

// ---------------------------------------------------------------------------------------
// Metrics: every family each server's `/metrics` serves, scraped from a fresh server.

/// A server started for its `/metrics` page; killed when dropped.
struct Server {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Server {
    fn start(args: &[&str], dir: &Path) -> Server {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_leantier"))
            .args(args)
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for pipe in [out, err] {
            let send = send.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = send.send(line);
                }
            });
        }
        Server { child, lines }
    }

    /// The page at the address the server prints after `metrics on http://`.
    fn metrics_page(&self) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut seen = Vec::new();
        let addr = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no metrics address: {seen:#?}"));
            if let Some(rest) = line.split("metrics on http://").nth(1) {
                break rest.split('/').next().unwrap().to_string();
            }
            seen.push(line);
        };
        http_get(&addr, "/metrics")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The body of `GET path` at `addr`, retried for up to 5 s while the connection fails (a
/// server just started on a loaded CI host may reset the first one).
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let attempt = || -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(addr)?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    let mut tries = 0;
    let response = loop {
        match attempt() {
            Ok(response) => break response,
            Err(error) if tries < 50 => {
                tries += 1;
                eprintln!("GET {path} at {addr}: {error}; again");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(error) => panic!("GET {path} at {addr}: {error}"),
        }
    };
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}

/// One metric family as the page declares it.
#[derive(Default)]
struct Family {
    kind: String,
    help: String,
    labels: std::collections::BTreeSet<String>,
    /// A histogram's bucket upper bounds, as printed.
    buckets: Vec<String>,
}

/// The families of a Prometheus text page, in page order.
fn families(page: &str) -> Vec<(String, Family)> {
    let mut out: Vec<(String, Family)> = Vec::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push((name.into(), Family { help: help.into(), ..Family::default() }));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some((_, family)) = out.iter_mut().find(|(n, _)| n == name) {
                family.kind = kind.into();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split(' ').next().unwrap_or("");
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let family_name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| out.iter().any(|(n, _)| n == f)))
                .unwrap_or(name);
            let Some((_, family)) = out.iter_mut().find(|(n, _)| n == family_name) else {
                continue;
            };
            for pair in labels.trim_end_matches('}').split(',').filter(|p| !p.is_empty()) {
                let (label, value) = pair.split_once('=').unwrap_or((pair, ""));
                if label == "le" {
                    family.buckets.push(value.trim_matches('"').to_string());
                } else {
                    family.labels.insert(label.to_string());
                }
            }
        }
    }
    out
}

/// Labels a fresh server's page cannot show: they appear with the first sample (a family
/// with nothing counted yet prints no series).
const LABELS_ONCE_COUNTED: &[(&str, &str)] = &[("gateway_rejects_total", "reason")];

fn metric_unit(name: &str) -> &'static str {
    let name = name.trim_end_matches("_total");
    if name.ends_with("_seconds") {
        "seconds"
    } else if name.ends_with("_bytes") {
        "bytes"
    } else if name.ends_with("_info") {
        "labels only (value 1)"
    } else {
        "count"
    }
}

/// A bucket bound in seconds as ns, µs, ms or s.
fn bound_text(bound: &str) -> String {
    let Ok(seconds) = bound.parse::<f64>() else { return bound.to_string() };
    if !seconds.is_finite() {
        return "+Inf".into();
    }
    let (value, unit) = match seconds {
        s if s < 1e-6 => (s * 1e9, "ns"),
        s if s < 1e-3 => (s * 1e6, "µs"),
        s if s < 1.0 => (s * 1e3, "ms"),
        s => (s, "s"),
    };
    format!("{} {unit}", (value * 1000.0).round() / 1000.0)
}

fn metrics_section(title: &str, intro: &str, page: &str) -> String {
    let families = families(page);
    assert!(!families.is_empty(), "{title}: no metric on its page");
    let mut text = format!(
        "\n## {title}\n\n{intro}\n\n| metric | type | unit | labels | meaning |\n|---|---|---|---|---|\n"
    );
    let mut histograms = String::new();
    for (name, family) in &families {
        let mut labels: Vec<String> = family.labels.iter().map(|l| format!("`{l}`")).collect();
        let counted = LABELS_ONCE_COUNTED.iter().filter(|(n, _)| n == name);
        labels.extend(counted.map(|(_, l)| format!("`{l}` (once counted)")));
        let labels = if labels.is_empty() { "—".to_string() } else { labels.join(", ") };
        text += &format!(
            "| `{name}` | {} | {} | {labels} | {} |\n",
            family.kind,
            metric_unit(name),
            family.help.replace('|', "\\|")
        );
        if !family.buckets.is_empty() {
            let bounds: Vec<String> = family.buckets.iter().map(|b| bound_text(b)).collect();
            histograms += &format!("- `{name}`: {}\n", bounds.join(", "));
        }
    }
    if !histograms.is_empty() {
        text += &format!("\nHistogram buckets (upper bounds):\n\n{histograms}");
    }
    text
}

fn metrics_reference() -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(dir.path().join("credentials.txt"), "").unwrap();
    std::fs::write(
        dir.path().join("serve.toml"),
        "credentials = \"credentials.txt\"\nstore_dir = \"store\"\n",
    )
    .unwrap();
    let metrics = ["--metrics-listen", "127.0.0.1:0"];
    let exchange = Server::start(
        &[
            &["exchange", "serve", "--config", "serve.toml", "--listen", "127.0.0.1:0"][..],
            &metrics,
        ]
        .concat(),
        dir.path(),
    );
    let mq_store = format!("sqlite:{}", path("mq"));
    let mq = Server::start(
        &[&["mq", "serve", "--listen", "127.0.0.1:0", "--store", &mq_store][..], &metrics].concat(),
        dir.path(),
    );
    let web = Server::start(
        &[&["web", "serve", "--listen", "127.0.0.1:0", "--workers", "1"][..], &metrics].concat(),
        dir.path(),
    );
    let mut text = String::from(
        "# Metrics reference\n\n\
         Every metric family each server's `/metrics` page serves (Prometheus text format), \
         generated from freshly started servers by `crates/cli/tests/references.rs`: name, \
         type, unit (from the name's suffix, Prometheus' convention), the labels the page \
         shows, the page's own help text, and each histogram's bucket bounds. The test fails \
         when this file is stale; `LEANTIER_UPDATE_REFERENCES=1 cargo test -p leantier --test \
         references` regenerates it. `/metrics` is served on `--metrics-listen` (docs/OPERATIONS.md, \
         \"Admin endpoints\"); `process_*` are the process' own (CPU, memory, threads, files). \
         The replicated roles, which need NATS (`exchange edge`'s `delivery_edge_*`), are listed \
         in OPERATIONS.md, \"Metrics\".\n",
    );
    text += &metrics_section(
        "`exchange serve`",
        "The order-entry server. With `metrics_per_client = true` the per-client counters also \
         carry a `client` label.",
        &exchange.metrics_page(),
    );
    text += &metrics_section("`mq serve`", "The message queue node.", &mq.metrics_page());
    text += &metrics_section(
        "`web serve`",
        "The matrix web service (with one process per core, the whole server's sums).",
        &web.metrics_page(),
    );
    text
}

/// docs/METRICS.md is every family the servers serve.
#[test]
fn metrics_reference_is_current() {
    let generated = metrics_reference();
    for family in ["gateway_order_to_report_seconds", "mq_request_seconds", "web_requests_total"] {
        assert!(generated.contains(&format!("| `{family}` |")), "{family} listed");
    }
    check_or_update("docs/METRICS.md", &generated);
}

/// Every metric deploy/'s alert rules use is one a server serves (docs/METRICS.md, or
/// OPERATIONS.md for the servers that need NATS): a renamed metric must not leave an alert
/// that silently never fires.
#[test]
fn alert_rules_use_only_metrics_that_exist() {
    let documented = ["docs/METRICS.md", "docs/OPERATIONS.md"]
        .map(|doc| std::fs::read_to_string(repo().join(doc)).unwrap())
        .join("\n");
    let rules =
        std::fs::read_to_string(repo().join("deploy/prometheus/leantier-alerts.yml")).unwrap();
    let prefixes = ["gateway_", "mq_", "web_", "delivery_edge_", "process_"];
    let mut checked = 0;
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if !prefixes.iter().any(|p| word.starts_with(p)) {
            continue;
        }
        let metric = word.strip_suffix("_bucket").unwrap_or(word);
        assert!(
            documented.contains(&format!("`{metric}`")),
            "deploy/prometheus/leantier-alerts.yml uses {metric}, which no server serves"
        );
        checked += 1;
    }
    assert!(checked >= 10, "the rules name metrics ({checked} found)");
}

// ---------------------------------------------------------------------------------------
// Logs: every event the code logs, with its level, target and fields.

/// One `tracing` event in the source.
struct LogEvent {
    level: String,
    target: String,
    message: String,
    fields: Vec<String>,
}

/// The library (or binary) name a crate's events carry as their target's first part.
fn crate_name(crate_dir: &Path) -> String {
    let manifest: toml::Table =
        std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap().parse().unwrap();
    let lib = manifest.get("lib").and_then(|l| l.get("name")).and_then(|n| n.as_str());
    let package = manifest["package"]["name"].as_str().unwrap().replace('-', "_");
    lib.map_or(package, String::from)
}

/// `src/a/b.rs` → `a::b` (`mod.rs`, `lib.rs`, `main.rs` name their folder or the crate).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> =
        relative.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text between the `(` at `open` and its matching `)`, skipping string literals.
fn macro_arguments(text: &str, open: usize) -> Option<&str> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (offset, c) in text[open..].char_indices() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') | (false, _, '"') => in_string = !in_string,
            (false, _, '(' | '[' | '{') => depth += 1,
            (false, _, ')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[open + 1..open + offset]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Top-level comma-separated arguments (commas inside strings or brackets kept).
fn split_arguments(arguments: &str) -> Vec<String> {
    let (mut parts, mut current) = (Vec::new(), String::new());
    let (mut depth, mut in_string, mut escaped) = (0i32, false, false);
    for c in arguments.chars() {
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, _, '"') => in_string = !in_string,
            (false, _, '(' | '[' | '{') => depth += 1,
            (false, _, ')' | ']' | '}') => depth -= 1,
            (false, _, ',') if depth == 0 => {
                parts.push(std::mem::take(&mut current).trim().to_string());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current.trim().to_string());
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

/// An event's fields and message from its macro arguments: fields come before the format
/// string (`name = value`, `?name`, `%name`, `name`), format arguments after it.
fn event_parts(arguments: &str) -> (Vec<String>, String) {
    let mut fields = Vec::new();
    for argument in split_arguments(arguments) {
        if argument.starts_with('"') {
            let message = argument.trim_matches('"').split_whitespace().collect::<Vec<_>>();
            return (fields, message.join(" "));
        }
        if argument.starts_with("target:") || argument.starts_with("parent:") {
            continue;
        }
        let name = argument.split('=').next().unwrap_or("").trim();
        let name = name.trim_start_matches(['?', '%']).trim();
        fields.push(name.rsplit('.').next().unwrap_or(name).to_string());
    }
    (fields, String::new())
}

fn log_events() -> Vec<LogEvent> {
    let mut events = Vec::new();
    let mut crates: Vec<PathBuf> = std::fs::read_dir(repo().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    crates.sort();
    for crate_dir in crates {
        let name = crate_name(&crate_dir);
        let mut files = Vec::new();
        rust_files(&crate_dir.join("src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            // The unit tests' events are not the server's.
            let text = text.split("\n#[cfg(test)]\nmod tests").next().unwrap_or("");
            let relative = file.strip_prefix(crate_dir.join("src")).unwrap();
            let target =
                std::iter::once(name.clone()).chain(module_path(relative)).collect::<Vec<_>>();
            events.extend(events_in(text, &target.join("::")));
        }
    }
    events
}

fn events_in(text: &str, target: &str) -> Vec<LogEvent> {
    let mut events = Vec::new();
    for level in ["trace", "debug", "info", "warn", "error"] {
        let call = format!("{level}!(");
        for (at, _) in text.match_indices(&call) {
            let before = text[..at].chars().next_back().unwrap_or(' ');
            if before.is_ascii_alphanumeric() || before == '_' || before == '.' {
                continue; // `eprintln!`, `some_error!`
            }
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            if text[line_start..at].trim_start().starts_with("//") {
                continue;
            }
            let Some(arguments) = macro_arguments(text, at + call.len() - 1) else { continue };
            let (fields, message) = event_parts(arguments);
            events.push(LogEvent {
                level: level.to_uppercase(),
                target: target.to_string(),
                message,
                fields,
            });
        }
    }
    events
}

fn logs_reference() -> String {
    let mut events = log_events();
    events.sort_by(|a, b| (&a.target, &a.message).cmp(&(&b.target, &b.message)));
    let mut text = String::from(
        "# Log reference\n\n\
         Every event leantier logs, generated from the code by `crates/cli/tests/references.rs` \
         (the test fails when this file is stale; `LEANTIER_UPDATE_REFERENCES=1 cargo test -p \
         leantier --test references` regenerates it). With `--log-format json` (or \
         `LEANTIER_LOG_FORMAT=json`) each event is one JSON object per line on stderr:\n\n\
         ```json\n\
         {\"timestamp\":\"2026-11-28T10:43:08.200402Z\",\"level\":\"INFO\",\"fields\":{\"message\":\"mq node listening\",\"addr\":\"127.0.0.1:44317\"},\"target\":\"mq::server\"}\n\
         ```\n\n\
         - `timestamp`: UTC, RFC 3339 with microseconds; `level`: `ERROR`, `WARN`, `INFO`, \
         `DEBUG` or `TRACE`; `target`: the module that logged it (filter with `--log`, e.g. \
         `--log warn,mq=info`);\n\
         - `fields.message`: the text below, with `{name}` filled in;\n\
         - the other `fields`: the names below, each the event's own structured value \
         (addresses, ids, counts, reasons; a `Debug` rendering for `?name`).\n\n\
         `info` (the default) logs each session event once (logins, logouts, cut-offs, \
         recoveries, stops); `warn` and `error` are what needs an operator. \
         `leantier demo` writes its servers' events to `servers.log` in its report folder.\n\n\
         | level | target | message | fields |\n|---|---|---|---|\n",
    );
    for event in &events {
        let fields: Vec<String> = event.fields.iter().map(|f| format!("`{f}`")).collect();
        let message =
            if event.message.is_empty() { "—".into() } else { format!("`{}`", event.message) };
        text += &format!(
            "| {} | `{}` | {} | {} |\n",
            event.level,
            event.target,
            message.replace('|', "\\|"),
            if fields.is_empty() { "—".into() } else { fields.join(", ") }
        );
    }
    text
}

/// docs/LOGS.md is every event the code logs.
#[test]
fn logs_reference_is_current() {
    let generated = logs_reference();
    assert!(
        generated.contains("| INFO | `mq::server` | `mq node listening` | `addr` |"),
        "{generated}"
    );
    assert!(generated.lines().filter(|l| l.starts_with("| WARN")).count() > 10);
    check_or_update("docs/LOGS.md", &generated);
}
