//! The code's shape (ARCHITECTURE.md, "Invariants"; TigerBeetle's rule of functions one can
//! see whole): no function outside tests is longer than `FUNCTION_LINES_MAX` lines, from its
//! signature to its closing brace. The functions that still are, listed in `LONG_FUNCTIONS`,
//! may only leave the list: a new long function fails the test, and so does a listed one
//! that became short (take it off the list).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The most lines a function may span.
const FUNCTION_LINES_MAX: usize = 70;

/// Functions over the limit when the test was written (file, function), to be cut down.
const LONG_FUNCTIONS: &[(&str, &str)] = &[
    ("crates/cdr/src/measure.rs", "measure_with_hop"), // 113 lines
    ("crates/cdr/src/run.rs", "control"),              // 72 lines
    ("crates/cdr/src/run.rs", "run_pipeline"),         // 113 lines
    ("crates/cli/src/commands/cdr.rs", "run_validation"), // 84 lines
    ("crates/cli/src/commands/delivery.rs", "gateway"), // 77 lines
    ("crates/cli/src/commands/exchange.rs", "present"), // 83 lines
    ("crates/cli/src/commands/exchange_serve.rs", "serve"), // 108 lines
    ("crates/cli/src/commands/web_lab.rs", "run_load"), // 79 lines
    ("crates/delivery/src/publish.rs", "connect_member"), // 75 lines
    ("crates/exchange/src/durability.rs", "open_shard"), // 74 lines
    ("crates/exchange/src/durability.rs", "open_shards"), // 98 lines
    ("crates/gateway/src/client.rs", "parse_script_line_in"), // 76 lines
    ("crates/gateway/src/fix_server.rs", "logon"),     // 73 lines
    ("crates/gateway/src/fix_server.rs", "on_message"), // 74 lines
    ("crates/gateway/src/fix_server.rs", "order_fields"), // 80 lines
    ("crates/gateway/src/server.rs", "start"),         // 84 lines
    ("crates/gateway/src/store.rs", "apply"),          // 92 lines
    ("crates/lab/src/stats.rs", "factorial_2kr"),      // 76 lines
    ("crates/labs/src/mq_load.rs", "analyse"),         // 99 lines
    ("crates/labs/src/mq_load.rs", "run"),             // 84 lines
    ("crates/labs/src/web_load.rs", "drive"),          // 72 lines
    ("crates/matching/src/core/snapshot.rs", "restore"), // 78 lines
    ("crates/mq/src/connection.rs", "read_requests"),  // 79 lines
    ("crates/mq/src/store/conformance.rs", "scenario"), // 169 lines
    ("crates/mq/src/store/sqlite.rs", "execute"),      // 97 lines
    ("crates/pipeline/src/stage.rs", "start"),         // 80 lines
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// Whether `attrs` mark test-only code (`#[test]`, `#[cfg(test)]`, `#[cfg(loom)]`).
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let cfg = attr.path().is_ident("cfg").then(|| attr.meta.to_token_stream().to_string());
        let cfg_test = cfg.is_some_and(|cfg| cfg.contains("test") || cfg.contains("loom"));
        attr.path().is_ident("test") || cfg_test
    })
}

/// Functions longer than the limit in one file: (name, lines).
struct LongFunctions {
    found: Vec<(String, usize)>,
}

impl LongFunctions {
    fn check(&mut self, name: String, sig: &syn::Signature, block: &syn::Block) {
        let lines = block.span().end().line - sig.span().start().line + 1;
        if lines > FUNCTION_LINES_MAX {
            self.found.push((name, lines));
        }
    }
}

impl<'ast> Visit<'ast> for LongFunctions {
    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        if !test_only(&item.attrs) {
            self.check(item.sig.ident.to_string(), &item.sig, &item.block);
            syn::visit::visit_item_fn(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !test_only(&item.attrs) {
            self.check(item.sig.ident.to_string(), &item.sig, &item.block);
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(block) = &item.default {
            self.check(item.sig.ident.to_string(), &item.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, item);
    }

    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if !test_only(&module.attrs) {
            syn::visit::visit_item_mod(self, module);
        }
    }
}

#[test]
fn no_function_outside_tests_is_longer_than_the_limit() {
    let root = workspace_root();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let src = entry.path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    let mut long = BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let syntax = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut visitor = LongFunctions { found: Vec::new() };
        visitor.visit_file(&syntax);
        let relative = file.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
        for (name, lines) in visitor.found {
            long.insert((relative.clone(), name, lines));
        }
    }
    let listed: BTreeSet<(&str, &str)> = LONG_FUNCTIONS.iter().copied().collect();
    let new: Vec<String> = long
        .iter()
        .filter(|(file, name, _)| !listed.contains(&(file.as_str(), name.as_str())))
        .map(|(file, name, lines)| format!("{file}: {name} ({lines} lines)"))
        .collect();
    let shortened: Vec<&(&str, &str)> = LONG_FUNCTIONS
        .iter()
        .filter(|(file, name)| !long.iter().any(|(f, n, _)| f == file && n == name))
        .collect();
    assert!(new.is_empty(), "over {FUNCTION_LINES_MAX} lines, not listed:\n{}", new.join("\n"));
    assert!(shortened.is_empty(), "listed but no longer long (take them off): {shortened:?}");
}
