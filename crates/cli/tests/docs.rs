//! The documents stay true to the code (issue 45, "one truth"): every `leantier …` command
//! quoted in README.md, ARCHITECTURE.md, docs/*.md and the crates' READMEs names a subcommand
//! path the binary has (its `--help` exits 0), every `cargo … -p NAME` names a package of this
//! workspace, and every section those documents or a `configs/*.toml` comment cite
//! (`OPERATIONS.md, "Configure"`, `OPERATIONS.md#monitor`) is a heading of that document.
//! A renamed command, package or heading fails here, not in a reader's terminal.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Files of `dir` whose names end with `suffix`, sorted.
fn files_in(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    files
}

/// The documents a user reads commands from, each with its text, by its path in the
/// repository.
fn documents() -> Vec<(String, String)> {
    let root = workspace();
    let mut paths = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    paths.extend(files_in(&root.join("docs"), ".md"));
    for krate in files_in(&root.join("crates"), "") {
        let readme = krate.join("README.md");
        if readme.exists() {
            paths.push(readme);
        }
    }
    let name = |path: &Path| path.strip_prefix(&root).unwrap().display().to_string();
    paths.iter().map(|path| (name(path), std::fs::read_to_string(path).unwrap())).collect()
}

/// The code a Markdown text quotes: each line of a fenced block, and each inline span (which
/// may wrap onto the next line), with its whitespace collapsed to single spaces.
fn code_spans(markdown: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut prose = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            prose.push('\n');
        } else if fenced {
            spans.push(line.to_string());
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    // Between backticks; a blank line ends a paragraph and so any span left open.
    for paragraph in prose.split("\n\n") {
        spans.extend(paragraph.split('`').skip(1).step_by(2).map(str::to_string));
    }
    spans.iter().map(|span| span.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
}

/// The subcommand path of each `leantier` invocation in a code span: the words after
/// `leantier` up to the first flag, placeholder or separator (`leantier exchange serve
/// --config F` → `exchange serve`). A positional value (`plan measure cdr`) may join the path;
/// `--help` still answers for it. `leantier` starts a command only first in the span, after
/// a shell separator or after an environment assignment (`LEANTIER_LOG=warn leantier …`), not
/// in a sentence of a diagram ("none depends on any leantier crate").
fn leantier_paths(span: &str) -> Vec<String> {
    let words: Vec<&str> = span.split(' ').collect();
    let is_word = |w: &&&str| {
        w.starts_with(|c: char| c.is_ascii_lowercase())
            && w.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let starts_command = |at: usize| {
        at == 0
            || ["|", "&&", ";", "$("].contains(&words[at - 1])
            || words[at - 1]
                .split_once('=')
                .is_some_and(|(name, _)| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
    };
    words
        .iter()
        .enumerate()
        .filter(|&(at, word)| *word == "leantier" && starts_command(at))
        .map(|(at, _)| words[at + 1..].iter().take_while(is_word).copied().collect::<Vec<_>>())
        .filter(|path| !path.is_empty())
        .map(|path| path.join(" "))
        .collect()
}

/// The packages a `cargo` command in a code span names with `-p` or `--package`.
fn cargo_packages(span: &str) -> Vec<String> {
    let words: Vec<&str> = span.split(' ').collect();
    if !words.contains(&"cargo") {
        return Vec::new();
    }
    let names = words.windows(2).filter(|w| w[0] == "-p" || w[0] == "--package");
    names.map(|w| w[1].to_string()).collect()
}

/// Every package of the workspace, by its `[package] name`.
fn workspace_packages() -> BTreeSet<String> {
    let manifests =
        files_in(&workspace().join("crates"), "").into_iter().map(|c| c.join("Cargo.toml"));
    manifests
        .filter(|manifest| manifest.exists())
        .map(|manifest| {
            let text = std::fs::read_to_string(&manifest).unwrap();
            let table: toml::Table = toml::from_str(&text).unwrap();
            table["package"]["name"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Each distinct item `find` finds in the documents' code, with the first place it is quoted.
fn quoted(find: fn(&str) -> Vec<String>) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for (doc, text) in documents() {
        for item in code_spans(&text).iter().flat_map(|span| find(span)) {
            found.entry(item).or_insert_with(|| doc.clone());
        }
    }
    found
}

#[test]
fn the_extractors_find_wrapped_piped_and_fenced_commands() {
    let text = "Run `leantier exchange\nserve --config F`, then `printf x | leantier exchange \
                hash-secret`.\n\n```sh\nLEANTIER_LOG=warn leantier web serve --model \
                prefork\ncargo run -p leantier-matching --example replay\nA -> B: none \
                depends on any leantier crate\n```\n`leantier-report/x`";
    let spans = code_spans(text);
    let paths: Vec<String> = spans.iter().flat_map(|s| leantier_paths(s)).collect();
    assert_eq!(paths, ["web serve", "exchange serve", "exchange hash-secret"]);
    let packages: Vec<String> = spans.iter().flat_map(|s| cargo_packages(s)).collect();
    assert_eq!(packages, ["leantier-matching"]);
}

#[test]
fn every_leantier_command_quoted_in_the_docs_parses() {
    let paths = quoted(leantier_paths);
    // The docs quote dozens of commands; a handful means the extraction broke, not the docs.
    assert!(paths.len() >= 20, "only {} command paths found: {paths:?}", paths.len());
    let wrong: Vec<String> = paths
        .iter()
        .filter_map(|(path, doc)| {
            let help = Command::new(env!("CARGO_BIN_EXE_leantier"))
                .args(path.split(' '))
                .arg("--help")
                .output()
                .expect("leantier runs");
            let stderr = String::from_utf8_lossy(&help.stderr);
            let first = stderr.lines().next().unwrap_or_default();
            (!help.status.success()).then(|| format!("{doc}: `leantier {path}`: {first}"))
        })
        .collect();
    assert!(wrong.is_empty(), "commands the binary does not have:\n{}", wrong.join("\n"));
}

#[test]
fn every_cargo_package_named_in_the_docs_exists() {
    let packages = workspace_packages();
    let named = quoted(cargo_packages);
    assert!(named.len() >= 3, "only {} packages named: {named:?}", named.len());
    let wrong: Vec<String> = named
        .iter()
        .filter(|(name, _)| !packages.contains(*name))
        .map(|(name, doc)| format!("{doc}: `-p {name}` (packages: {packages:?})"))
        .collect();
    assert!(wrong.is_empty(), "packages that do not exist:\n{}", wrong.join("\n"));
}

/// The headings of a Markdown document, outside fenced blocks (where `#` starts a shell
/// comment): their text, and their GitHub anchors.
fn headings(markdown: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        fenced ^= line.trim_start().starts_with("```");
        if fenced || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#').trim();
        let anchor: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        found.insert(text.to_string());
        found.insert(format!("#{anchor}"));
    }
    found
}

/// The sections a text cites: `PATH.md, "Heading"` or `PATH.md#anchor`, as (the document's
/// path as written, heading text or `#anchor`).
fn cited_sections(text: &str) -> Vec<(String, String)> {
    let in_path = |c: char| c.is_alphanumeric() || "_-./".contains(c);
    let mut cited = Vec::new();
    for (at, _) in text.match_indices(".md") {
        let path_start = text[..at].rfind(|c: char| !in_path(c)).map_or(0, |s| s + 1);
        let document = format!("{}.md", &text[path_start..at]);
        let rest = &text[at + 3..];
        if let Some(anchor) = rest.strip_prefix('#') {
            let end = anchor.find(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_'));
            cited.push((document, format!("#{}", &anchor[..end.unwrap_or(anchor.len())])));
        } else if let Some(quoted) = rest.strip_prefix(", \"") {
            let heading = quoted.split('"').next().unwrap_or_default();
            cited.push((document, heading.to_string()));
        }
    }
    cited
}

/// The texts that cite sections, by name, each with the folder its relative paths start from:
/// every document, and each config file's comments read as one text (a citation may wrap onto
/// the comment's next line); whitespace collapsed, as a reader reads it.
fn citing_texts() -> Vec<(String, PathBuf, String)> {
    let root = workspace();
    let mut texts: Vec<(String, PathBuf, String)> = documents()
        .into_iter()
        .map(|(name, text)| (name.clone(), root.join(&name).parent().unwrap().into(), text))
        .collect();
    for config in files_in(&root.join("configs"), ".toml") {
        let text = std::fs::read_to_string(&config).unwrap();
        let comments: Vec<&str> =
            text.lines().filter_map(|line| line.trim_start().strip_prefix('#')).collect();
        let name = config.strip_prefix(&root).unwrap().display().to_string();
        texts.push((name, config.parent().unwrap().into(), comments.join(" ")));
    }
    let collapse = |text: String| text.split_whitespace().collect::<Vec<_>>().join(" ");
    texts.into_iter().map(|(name, dir, text)| (name, dir, collapse(text))).collect()
}

/// A cited document, read from where the citing text is, the repository's root or docs/.
fn read_cited(dir: &Path, document: &str) -> Option<String> {
    let root = workspace();
    let places = [dir.join(document), root.join(document), root.join("docs").join(document)];
    places.iter().find_map(|path| std::fs::read_to_string(path).ok())
}

#[test]
fn cited_sections_are_headings_that_exist() {
    let mut wrong = Vec::new();
    let mut from_configs = 0;
    for (name, dir, text) in citing_texts() {
        for (document, section) in cited_sections(&text) {
            from_configs += usize::from(name.starts_with("configs/"));
            let found =
                read_cited(&dir, &document).is_some_and(|doc| headings(&doc).contains(&section));
            if !found {
                wrong.push(format!("{name}: {document}, {section:?}"));
            }
        }
    }
    // configs/ cites OPERATIONS.md's sections; none found means the parsing broke.
    assert!(from_configs >= 2, "only {from_configs} citations found in configs/");
    assert!(wrong.is_empty(), "cited sections that do not exist:\n{}", wrong.join("\n"));
}
