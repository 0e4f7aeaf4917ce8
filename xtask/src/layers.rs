//! `cargo xtask check-layers`: the crate dependency rules of house-style 9.1, checked over
//! `cargo metadata`.
//!
//! Every workspace crate has a row in [`RULES`] saying which workspace crates it may
//! depend on through normal (and build) dependencies. Dev-dependencies are not
//! constrained: tests may reach further than the code they test. A workspace crate with no
//! row fails the check, so a new crate must be placed in the layering before it lands.
//! `anyhow` is allowed only in the binaries listed in [`ANYHOW_ALLOWED`].

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::util;

/// What a crate may depend on inside the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Allowed {
    /// Exactly these workspace crates (possibly none).
    Only(&'static [&'static str]),
    /// Any workspace library crate except the test and bench crates.
    AnyLibrary,
    /// Anything in the workspace (test, bench and automation crates).
    Anything,
}

/// The allow-list table of house-style 9.1, one row per workspace crate.
pub(crate) const RULES: &[(&str, Allowed)] = &[
    ("epkv-types", Allowed::Only(&[])),
    ("epkv-executor", Allowed::Only(&[])),
    ("epkv-protocol", Allowed::Only(&["epkv-types"])),
    ("epkv-storage", Allowed::Only(&["epkv-types"])),
    ("epkv-hashtable", Allowed::Only(&["epkv-types"])),
    ("epkv-engine-api", Allowed::Only(&["epkv-types"])),
    // SASL and users: pure logic over the credentials, no wire format, no engine.
    ("epkv-auth", Allowed::Only(&["epkv-types"])),
    (
        "epkv-engine",
        Allowed::Only(&[
            "epkv-types",
            "epkv-engine-api",
            "epkv-hashtable",
            "epkv-storage",
            "epkv-executor",
        ]),
    ),
    (
        "epkv-frontend",
        Allowed::Only(&[
            "epkv-types",
            "epkv-protocol",
            "epkv-engine-api",
            "epkv-executor",
            "epkv-auth",
        ]),
    ),
    // Replication and topology: it drives the engines through the Engine trait only and
    // speaks the protocol itself; below the server that starts it. The front end reaches
    // it only through epkv-engine-api's ClusterView.
    (
        "epkv-cluster",
        Allowed::Only(&["epkv-types", "epkv-protocol", "epkv-engine-api"]),
    ),
    (
        "epkv-client",
        Allowed::Only(&["epkv-types", "epkv-protocol"]),
    ),
    ("epkv-server", Allowed::AnyLibrary),
    (
        "epkv-loadgen",
        Allowed::Only(&["epkv-types", "epkv-protocol", "epkv-client"]),
    ),
    (
        "epkv-tools",
        Allowed::Only(&["epkv-types", "epkv-protocol", "epkv-client", "epkv-storage"]),
    ),
    ("epkv-testkit", Allowed::Anything),
    ("epkv-bench", Allowed::Anything),
    ("epkv-e2e", Allowed::Anything),
    ("xtask", Allowed::Anything),
];

/// Crates that exist only for tests and benches: nothing may take a normal dependency on
/// them except other crates allowed `Anything`.
const TEST_ONLY: &[&str] = &["epkv-testkit", "epkv-bench", "epkv-e2e", "xtask"];

/// Crates allowed a normal dependency on `anyhow` (house-style 9.1: binaries only).
pub(crate) const ANYHOW_ALLOWED: &[&str] = &["epkv-server", "epkv-loadgen", "epkv-tools", "xtask"];

/// One dependency edge read from the metadata.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Edge {
    /// The depending package.
    pub(crate) from: String,
    /// The package depended upon.
    pub(crate) to: String,
    /// `normal`, `build` or `dev`.
    pub(crate) kind: String,
}

/// The parts of `cargo metadata --no-deps` the check reads.
#[derive(Debug, Default)]
pub(crate) struct Workspace {
    /// Names of the workspace member packages.
    pub(crate) members: BTreeSet<String>,
    /// Every dependency edge of every member (external ones included).
    pub(crate) edges: Vec<Edge>,
}

/// Parses the JSON printed by `cargo metadata --format-version 1 --no-deps`.
pub(crate) fn parse_metadata(json: &str) -> Result<Workspace> {
    let root: Value = serde_json::from_str(json).context("cargo metadata printed invalid JSON")?;
    let packages = root
        .get("packages")
        .and_then(Value::as_array)
        .context("metadata has no packages")?;
    let mut ws = Workspace::default();
    for pkg in packages {
        let name = pkg
            .get("name")
            .and_then(Value::as_str)
            .context("package without a name")?;
        ws.members.insert(name.to_owned());
        let deps = pkg
            .get("dependencies")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        for dep in deps {
            let to = dep
                .get("name")
                .and_then(Value::as_str)
                .context("dependency without a name")?;
            let kind = dep.get("kind").and_then(Value::as_str).unwrap_or("normal");
            ws.edges.push(Edge {
                from: name.to_owned(),
                to: to.to_owned(),
                kind: kind.to_owned(),
            });
        }
    }
    Ok(ws)
}

fn rule_for(krate: &str) -> Option<Allowed> {
    RULES
        .iter()
        .find(|(name, _)| *name == krate)
        .map(|(_, rule)| *rule)
}

/// Returns every violation of the layering rules, one human-readable line each.
pub(crate) fn violations(ws: &Workspace) -> Vec<String> {
    let mut out = Vec::new();
    for member in &ws.members {
        if rule_for(member).is_none() {
            out.push(format!(
                "crate `{member}` has no row in the layering table: add it to house-style 9.1 \
                 and to RULES in xtask/src/layers.rs"
            ));
        }
    }
    for edge in &ws.edges {
        if edge.kind == "dev" {
            continue;
        }
        if edge.to == "anyhow" && !ANYHOW_ALLOWED.contains(&edge.from.as_str()) {
            out.push(format!(
                "`{}` depends on `anyhow` ({}); only {} may (libraries use a thiserror enum)",
                edge.from,
                edge.kind,
                ANYHOW_ALLOWED.join(", ")
            ));
        }
        if !ws.members.contains(&edge.to) {
            continue;
        }
        let Some(rule) = rule_for(&edge.from) else {
            continue;
        };
        let allowed = match rule {
            Allowed::Only(list) => list.contains(&edge.to.as_str()),
            Allowed::AnyLibrary => !TEST_ONLY.contains(&edge.to.as_str()),
            Allowed::Anything => true,
        };
        if !allowed {
            let may = match rule {
                Allowed::Only([]) => "no workspace crate".to_owned(),
                Allowed::Only(list) => list.join(", "),
                Allowed::AnyLibrary => "any library crate (not test or bench crates)".to_owned(),
                Allowed::Anything => "anything".to_owned(),
            };
            out.push(format!(
                "`{}` -> `{}` ({} dependency) is not allowed; `{}` may depend on: {may}",
                edge.from, edge.to, edge.kind, edge.from
            ));
        }
    }
    out
}

/// Runs the check over the current workspace.
pub(crate) fn check_layers() -> Result<()> {
    let json =
        util::output(util::cargo().args(["metadata", "--format-version", "1", "--no-deps"]))?;
    let ws = parse_metadata(&json)?;
    let found = violations(&ws);
    if !found.is_empty() {
        for v in &found {
            eprintln!("check-layers: {v}");
        }
        bail!(
            "{} layering violation(s); see house-style.md 9.1",
            found.len()
        );
    }
    let internal = ws
        .edges
        .iter()
        .filter(|e| e.kind != "dev" && ws.members.contains(&e.to))
        .count();
    println!(
        "check-layers: {} crates, {internal} workspace dependency edges, all allowed",
        ws.members.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ws(members: &[&str], edges: &[(&str, &str, &str)]) -> Workspace {
        Workspace {
            members: members.iter().map(|s| (*s).to_owned()).collect(),
            edges: edges
                .iter()
                .map(|(f, t, k)| Edge {
                    from: (*f).into(),
                    to: (*t).into(),
                    kind: (*k).into(),
                })
                .collect(),
        }
    }

    const MEMBERS: &[&str] = &[
        "epkv-types",
        "epkv-protocol",
        "epkv-engine-api",
        "epkv-engine",
        "epkv-frontend",
        "epkv-server",
        "epkv-bench",
        "epkv-e2e",
        "xtask",
    ];

    #[test]
    fn downward_edges_pass() {
        let w = ws(
            MEMBERS,
            &[
                ("epkv-protocol", "epkv-types", "normal"),
                ("epkv-engine", "epkv-engine-api", "normal"),
                ("epkv-frontend", "epkv-protocol", "normal"),
                ("epkv-server", "epkv-engine", "normal"),
                ("epkv-server", "epkv-frontend", "normal"),
                ("epkv-e2e", "epkv-server", "normal"),
                ("epkv-protocol", "bytes", "normal"),
            ],
        );
        assert_eq!(violations(&w), Vec::<String>::new());
    }

    #[test]
    fn frontend_depending_on_engine_fails() {
        let w = ws(MEMBERS, &[("epkv-frontend", "epkv-engine", "normal")]);
        let v = violations(&w);
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("`epkv-frontend` -> `epkv-engine`"), "{v:?}");
    }

    #[test]
    fn engine_depending_on_protocol_fails() {
        let w = ws(MEMBERS, &[("epkv-engine", "epkv-protocol", "normal")]);
        assert_eq!(violations(&w).len(), 1);
    }

    #[test]
    fn types_may_depend_on_no_workspace_crate() {
        let w = ws(MEMBERS, &[("epkv-types", "epkv-protocol", "normal")]);
        let v = violations(&w);
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("no workspace crate"), "{v:?}");
    }

    #[test]
    fn build_dependencies_are_constrained_too() {
        let w = ws(MEMBERS, &[("epkv-types", "epkv-protocol", "build")]);
        assert_eq!(violations(&w).len(), 1);
    }

    #[test]
    fn dev_dependencies_are_not_constrained() {
        let w = ws(
            MEMBERS,
            &[
                ("epkv-protocol", "epkv-bench", "dev"),
                ("epkv-engine", "epkv-frontend", "dev"),
            ],
        );
        assert!(violations(&w).is_empty());
    }

    #[test]
    fn server_may_not_take_a_normal_dependency_on_a_test_crate() {
        let w = ws(MEMBERS, &[("epkv-server", "epkv-bench", "normal")]);
        assert_eq!(violations(&w).len(), 1);
    }

    #[test]
    fn unknown_member_fails() {
        let mut members = MEMBERS.to_vec();
        members.push("epkv-mystery");
        let v = violations(&ws(&members, &[]));
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("epkv-mystery"), "{v:?}");
    }

    #[test]
    fn anyhow_only_in_binaries() {
        let w = ws(
            MEMBERS,
            &[
                ("epkv-server", "anyhow", "normal"),
                ("xtask", "anyhow", "normal"),
                ("epkv-protocol", "anyhow", "dev"),
                ("epkv-engine", "anyhow", "normal"),
            ],
        );
        let v = violations(&w);
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("`epkv-engine` depends on `anyhow`"), "{v:?}");
    }

    #[test]
    fn parse_metadata_reads_members_and_kinds() {
        let json = r#"{"packages":[
            {"name":"epkv-protocol","dependencies":[
                {"name":"epkv-types","kind":null,"path":"/x"},
                {"name":"proptest","kind":"dev"}]},
            {"name":"epkv-types","dependencies":[]}
        ],"workspace_members":[]}"#;
        let w = parse_metadata(json).unwrap();
        assert_eq!(w.members.len(), 2);
        assert_eq!(
            w.edges,
            vec![
                Edge {
                    from: "epkv-protocol".into(),
                    to: "epkv-types".into(),
                    kind: "normal".into()
                },
                Edge {
                    from: "epkv-protocol".into(),
                    to: "proptest".into(),
                    kind: "dev".into()
                },
            ]
        );
    }

    #[test]
    fn every_rule_names_known_crates() {
        let names: BTreeSet<&str> = RULES.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.len(), RULES.len(), "duplicate row");
        for (krate, rule) in RULES {
            if let Allowed::Only(list) = rule {
                for dep in *list {
                    assert!(names.contains(dep), "{krate} lists unknown crate {dep}");
                    assert!(!TEST_ONLY.contains(dep), "{krate} lists a test-only crate");
                }
            }
        }
    }
}
