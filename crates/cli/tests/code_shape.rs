//! The code's shape (ARCHITECTURE.md, "Invariants"):
//! - functions one can see whole (TigerBeetle's rule): no function outside tests is longer than
//!   `FUNCTION_LINES_MAX` lines, from its signature to its closing brace;
//! - no module cycles: within a crate, the top-level modules' `crate::…` paths form no cycle.
//!
//! What still breaks a rule when the test was written is listed (`LONG_FUNCTIONS`,
//! `MODULE_CYCLES`) and may only leave the list: a new offender fails the test, and so does a
//! listed one that is gone (take it off the list).

use std::collections::BTreeSet;
use std::path::Path;

#[path = "common/workspace.rs"]
mod workspace;
use workspace::{rust_files, workspace_root};

use quote::ToTokens;
use syn::spanned::Spanned;
use syn::visit::Visit;

/// The most lines a function may span.
const FUNCTION_LINES_MAX: usize = 70;

/// Functions over the limit when the test was written (file, function), to be cut down.
const LONG_FUNCTIONS: &[(&str, &str)] = &[];

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
            files.extend(rust_files(&src));
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

/// The top-level modules one file of a crate names through `crate::…` paths.
struct ModuleUses {
    names: BTreeSet<String>,
}

impl<'ast> Visit<'ast> for ModuleUses {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let mut segments = path.segments.iter();
        if let (Some(first), Some(second)) = (segments.next(), segments.next())
            && first.ident == "crate"
        {
            self.names.insert(second.ident.to_string());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_use_tree(&mut self, tree: &'ast syn::UseTree) {
        if let syn::UseTree::Path(path) = tree
            && path.ident == "crate"
        {
            let mut add = |ident: &syn::Ident| _ = self.names.insert(ident.to_string());
            match &*path.tree {
                syn::UseTree::Path(next) => add(&next.ident),
                syn::UseTree::Name(name) => add(&name.ident),
                syn::UseTree::Rename(rename) => add(&rename.ident),
                syn::UseTree::Group(group) => group.items.iter().for_each(|item| match item {
                    syn::UseTree::Path(next) => add(&next.ident),
                    syn::UseTree::Name(name) => add(&name.ident),
                    syn::UseTree::Rename(rename) => add(&rename.ident),
                    _ => {}
                }),
                syn::UseTree::Glob(_) => {}
            }
            return;
        }
        syn::visit::visit_use_tree(self, tree);
    }

    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if !test_only(&module.attrs) {
            syn::visit::visit_item_mod(self, module);
        }
    }
}

/// A crate's top-level module → the top-level modules it uses (`crate::x`), from its `src`.
fn module_graph(src: &Path) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(src);
    let mut graph = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let top = relative.components().next().unwrap().as_os_str().to_string_lossy();
        let module = top.trim_end_matches(".rs").to_string();
        if ["lib", "main", "bin"].contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let syntax = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut uses = ModuleUses { names: BTreeSet::new() };
        uses.visit_file(&syntax);
        uses.names.remove(&module);
        graph.entry(module).or_default().extend(uses.names);
    }
    graph
}

/// The module cycles of `graph`: each strongly connected component of more than one module,
/// as its sorted members joined by " ↔ ".
fn cycles(graph: &std::collections::BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let reaches = |from: &String| -> BTreeSet<String> {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![from.clone()]);
        while let Some(module) = todo.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: std::collections::BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|module| (module, reaches(module))).collect();
    let mut found = BTreeSet::new();
    for (module, reached) in &reach {
        // The modules that reach back: with `module`, its cycle (a module's own name is
        // never its edge, so any is another module).
        let mut component: BTreeSet<&str> = reached
            .iter()
            .filter(|other| reach.get(other).is_some_and(|back| back.contains(*module)))
            .map(String::as_str)
            .collect();
        if !component.is_empty() {
            component.insert(module.as_str());
            found.insert(component.into_iter().collect::<Vec<_>>().join(" ↔ "));
        }
    }
    found
}

/// Module cycles when the test was written (crate, the cycle's modules), to be broken.
const MODULE_CYCLES: &[(&str, &str)] = &[];

/// No crate's top-level modules use each other in a cycle (a module's `crate::x` paths are its
/// edges); the cycles in `MODULE_CYCLES` may only be broken, not added to.
#[test]
fn no_crate_has_a_module_cycle() {
    let root = workspace_root();
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let src = entry.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        for cycle in cycles(&module_graph(&src)) {
            found.insert((name.clone(), cycle));
        }
    }
    let listed: BTreeSet<(String, String)> =
        MODULE_CYCLES.iter().map(|(c, m)| (c.to_string(), m.to_string())).collect();
    let new: Vec<_> = found.difference(&listed).collect();
    let broken: Vec<_> = listed.difference(&found).collect();
    assert!(new.is_empty(), "module cycles not listed:\n{new:#?}");
    assert!(broken.is_empty(), "listed cycles no longer there (take them off): {broken:#?}");
}
