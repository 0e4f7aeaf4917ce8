//! The crate's modules import each other without cycles (issue 12): the layering the crate
//! docs describe (leaf types, the vBucket, the services over narrow interfaces, the
//! bucket core, the bucket and its operations) is a DAG, so each layer can be read, tested
//! and changed without the ones above it.
//!
//! The check reads `src/`: for each module, every `crate::` path outside comments and
//! outside `#[cfg(test)]` items names the module it comes from (a name `lib.rs`
//! re-exports counts as its defining module). Submodules count as their top-level module
//! (`persistence::flush` is `persistence`), for the importer and the imported alike, as
//! `lib.rs` defines its levels by top-level module. A strongly connected component of
//! more than one module is a cycle, and the test fails naming it and each member's
//! imports.

#![expect(
    clippy::expect_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`a` for `src/a.rs` or `src/a/mod.rs`, `a::b` for `src/a/b.rs`) → file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_stem().and_then(|n| n.to_str()).map(str::to_owned) else {
                continue;
            };
            let full = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}::{name}")
            };
            if path.is_dir() {
                walk(&path, &full, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                if name == "mod" {
                    out.insert(prefix.to_owned(), path);
                } else if !(prefix.is_empty() && name == "lib") {
                    out.insert(full, path);
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, "", &mut out);
    out
}

/// The source without comments (line comments, doc comments included) and without the
/// items marked `#[cfg(test)]` (test modules, test-only helpers).
fn code_of(text: &str) -> String {
    let mut code: String = text
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    while let Some(at) = code.find("#[cfg(test)]") {
        let after = at + "#[cfg(test)]".len();
        let rest = &code[after..];
        let brace = rest.find('{');
        let semi = rest.find(';');
        let end = match (brace, semi) {
            (Some(b), Some(s)) if s < b => after + s + 1,
            (Some(b), _) => {
                let mut depth = 0usize;
                let mut end = code.len();
                for (i, c) in code[after + b..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = after + b + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, Some(s)) => after + s + 1,
            (None, None) => code.len(),
        };
        code.replace_range(at..end, "");
    }
    code
}

/// The first path of each `crate::` use: `crate::a::B` gives `a::B`, and
/// `crate::{a::B, c}` gives `a::B` and `c`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1usize;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        item.push(c);
                    }
                    '}' if depth == 1 => break,
                    '}' => {
                        depth -= 1;
                        item.push(c);
                    }
                    ',' if depth == 1 => out.push(std::mem::take(&mut item)),
                    _ => item.push(c),
                }
            }
            out.push(item);
        } else {
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(path);
        }
    }
    out.into_iter()
        .map(|p| p.split_whitespace().collect::<String>())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Names `lib.rs` re-exports (`pub use module::{A, B};`, `pub use module::A;`), mapped to
/// the module defining them.
fn reexports(lib: &str, modules: &BTreeMap<String, PathBuf>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let code = code_of(lib);
    // Each `pub use` statement wherever it starts (after a `mod x { ... }` block, which
    // ends without a `;`, too): from `pub use ` at the start of a line to the next `;`.
    let mut line_start = 0;
    let mut starts = Vec::new();
    for line in code.split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        if line.trim_start().starts_with("pub use ") {
            starts.push(line_start + indent + "pub use ".len());
        }
        line_start += line.len();
    }
    for start in starts {
        let rest = &code[start..];
        let stmt = rest.split(';').next().unwrap_or(rest);
        let path = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        let module = module.trim();
        if !modules.contains_key(module) {
            continue;
        }
        // Nested paths and groups (`a::{b::{X, Y}, Z}`) all come from `module`.
        let names: String = names.chars().filter(|c| !matches!(c, '{' | '}')).collect();
        for name in names.split(',') {
            let name = name.rsplit(" as ").next().unwrap_or(name);
            let name = name.rsplit("::").next().unwrap_or(name).trim();
            if !name.is_empty() {
                out.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    out
}

/// A module path's top-level module: `persistence::flush` → `persistence`.
fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or(module)
}

/// Each top-level module's imports of other top-level modules (a submodule's imports are
/// its top-level module's, and an import of a submodule is one of its top-level module).
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let names = reexports(&lib, &modules);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a module's source");
        let node = top(module);
        let deps = g.entry(node.to_owned()).or_default();
        for path in crate_paths(&code_of(&text)) {
            let segments: Vec<&str> = path.split("::").collect();
            // The longest prefix that is a module, else a re-exported name.
            let found = (1..=segments.len())
                .rev()
                .map(|n| segments[..n].join("::"))
                .find(|p| modules.contains_key(p))
                .or_else(|| names.get(segments[0]).cloned());
            if let Some(dep) = found
                && top(&dep) != node
            {
                deps.insert(top(&dep).to_owned());
            }
        }
    }
    g
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() > 10, "the check found the crate's modules: {g:?}");
    let found = cycles(&g);
    let described: Vec<String> = found
        .iter()
        .map(|scc| {
            let members: Vec<String> = scc
                .iter()
                .map(|m| {
                    let deps: Vec<&str> = g[m]
                        .iter()
                        .filter(|d| scc.contains(d))
                        .map(String::as_str)
                        .collect();
                    format!("  {m} -> {}", deps.join(" "))
                })
                .collect();
            format!("cycle of {}:\n{}", scc.len(), members.join("\n"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "module import cycles (see the layering in lib.rs):\n{}",
        described.join("\n")
    );
}

/// The modules that may name the bucket: its operations, its STAT groups and the
/// `Engine` implementation. Everything else is below it and sees narrower interfaces (the
/// bucket core, a vBucket, a store).
const TOP_LAYER: &[&str] = &[
    "bucket_collections",
    "engine_impl",
    "ops",
    "random_key",
    "range_scan",
    "replica",
    "stat_groups",
    "subdoc_ops",
];

#[test]
fn only_the_top_layer_names_the_bucket() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    let naming: Vec<&String> = g
        .iter()
        .filter(|(m, deps)| deps.contains("bucket") && !TOP_LAYER.contains(&m.as_str()))
        .map(|(m, _)| m)
        .collect();
    assert!(
        naming.is_empty(),
        "modules below the bucket import it: {naming:?}"
    );
}

#[test]
fn the_check_sees_imports_through_reexports_and_skips_tests_and_comments() {
    let code = code_of(
        "use crate::a::X;\n// use crate::b::Y;\nfn f() { crate::Bucket::new(); }\n\
         #[cfg(test)]\nmod tests { use crate::c::Z; }\nuse crate::{d::W, e};\n",
    );
    assert_eq!(crate_paths(&code), ["a::X", "Bucket::new", "d::W", "e"]);
    let mut modules = BTreeMap::new();
    modules.insert("bucket".to_owned(), PathBuf::new());
    let names = reexports("pub use bucket::Bucket;\npub use other::Thing;\n", &modules);
    assert_eq!(names.get("Bucket").map(String::as_str), Some("bucket"));
    assert!(!names.contains_key("Thing"));
    // A `pub use` after a `mod x { ... }` block (no `;` after its `}`) counts too.
    modules.insert("clock".to_owned(), PathBuf::new());
    let names = reexports(
        "pub mod x {\n    pub fn f() {}\n}\n\npub use bucket::Bucket;\n\
         pub use clock::{EngineClock, Other as Renamed};\n",
        &modules,
    );
    assert_eq!(names.get("Bucket").map(String::as_str), Some("bucket"));
    assert_eq!(names.get("EngineClock").map(String::as_str), Some("clock"));
    assert_eq!(names.get("Renamed").map(String::as_str), Some("clock"));
    let mut g = BTreeMap::new();
    for (m, deps) in [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ] {
        g.insert(
            m.to_owned(),
            deps.into_iter().map(str::to_owned).collect::<BTreeSet<_>>(),
        );
    }
    assert_eq!(cycles(&g), [vec!["a", "b", "c"]]);
}

#[test]
fn the_check_counts_submodules_as_their_top_level_module() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let src = dir.path();
    std::fs::create_dir(src.join("a")).expect("src/a");
    for (file, text) in [
        // A re-export after an inline module's block.
        (
            "lib.rs",
            "mod a;\nmod b;\nmod c;\npub mod inline {\n    pub fn f() {}\n}\n\
             pub use b::Bee;\n",
        ),
        // A `mod.rs` with children.
        ("a/mod.rs", "mod child;\nmod other;\npub(crate) struct A;\n"),
        // The cycle runs through a child: a::child -> b (by the re-export) -> a.
        ("a/child.rs", "use crate::Bee;\npub(crate) struct X;\n"),
        // An import of a sibling stays inside `a`; one of `c` is `a`'s.
        ("a/other.rs", "use crate::a::child::X;\nuse crate::c::C;\n"),
        ("b.rs", "use crate::a::A;\npub struct Bee;\n"),
        ("c.rs", "pub struct C;\n"),
    ] {
        std::fs::write(src.join(file), text).expect("a fixture file");
    }
    let g = graph(src);
    let edges: Vec<(&str, Vec<&str>)> = g
        .iter()
        .map(|(m, deps)| (m.as_str(), deps.iter().map(String::as_str).collect()))
        .collect();
    assert_eq!(
        edges,
        [("a", vec!["b", "c"]), ("b", vec!["a"]), ("c", vec![])]
    );
    assert_eq!(cycles(&g), [vec!["a", "b"]]);
}
