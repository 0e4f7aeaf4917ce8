//! `cargo xtask ci`: the whole test suite, the same locally and in CI (`.ci/run`).
//!
//! Steps run in the order of [`STEPS`] and the run stops at the first failure. Each step
//! prints its duration, and a summary table closes the run. `--skip`/`--only` select steps
//! for local iteration; `--quick` shortens the fuzz smoke and leaves out the bench build;
//! `--long` (or `EPKV_SOAK=1`) fuzzes for ten minutes.

use anyhow::{Result, bail};

use crate::deps::{self, DepsOptions};
use crate::util::{self, Stopwatch};
use crate::{fuzz, layers, memcapable, python};

/// Every CI step: name and one-line description, in run order.
pub(crate) const STEPS: &[(&str, &str)] = &[
    (
        "deps",
        "install apt packages, the .venv, nightly cargo-fuzz (idempotent)",
    ),
    ("fmt", "cargo fmt --all -- --check"),
    (
        "clippy",
        "cargo clippy --workspace --all-targets -- -D warnings",
    ),
    ("layers", "crate dependency rules (house-style 9.1)"),
    ("build", "cargo build --workspace --all-targets (debug)"),
    (
        "test",
        "cargo test --workspace: unit, property, integration, doc, e2e",
    ),
    (
        "doc",
        "cargo doc --workspace --no-deps with RUSTDOCFLAGS=-D warnings",
    ),
    (
        "memcapable",
        "memccapable -b against target/debug/epkv-server: all 27 must pass",
    ),
    (
        "python",
        "pytest tests/python (python-binary-memcached, Couchbase Python SDK) against epkv-server",
    ),
    (
        "fuzz",
        "cargo +nightly fuzz run decode_request for 30 s; the other targets (storage, response, SASL, subdoc, xattr, DCP, range scan decoders) for 10 s each",
    ),
    (
        "miri",
        "cargo +nightly miri test of the hash table's unsafe item layout (skipped, with a notice, where Miri cannot be installed)",
    ),
    ("bench-build", "cargo bench -p epkv-bench --no-run"),
];

/// Runs the hash table's tests that exercise its unsafe code (the item allocation in
/// `stored_value.rs`, and the slot table and layout tests over it) under Miri, which
/// reports any undefined behaviour. Miri is a rustup component of the nightly toolchain:
/// installed here when missing; where rustup cannot download it, the step says so and
/// passes (the code is unchanged by that machine, and developers' runs still check it).
fn miri() -> Result<()> {
    let have = |c: &mut std::process::Command| util::output(c).is_ok();
    let miri = || {
        let mut c = std::process::Command::new("cargo");
        c.args(["+nightly", "miri", "--version"]);
        c
    };
    if !have(&mut miri()) {
        println!("miri: installing the nightly miri and rust-src components");
        let installed = util::run(std::process::Command::new("rustup").args([
            "component",
            "add",
            "--toolchain",
            "nightly",
            "miri",
            "rust-src",
        ]));
        if installed.is_err() || !have(&mut miri()) {
            println!("miri: NOT RUN: Miri is not installed and rustup could not install it");
            return Ok(());
        }
    }
    util::run(
        std::process::Command::new("cargo")
            .args([
                "+nightly",
                "miri",
                "test",
                "-p",
                "epkv-hashtable",
                "--lib",
                "--",
                "stored_value",
                "slot_table::tests::colliding",
                "slot_table::tests::shrink",
                "layout_tests",
            ])
            // proptest's failure persistence reads the file system.
            .env("MIRIFLAGS", "-Zmiri-disable-isolation"),
    )
}

/// Options of `cargo xtask ci`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CiOptions {
    /// Steps to leave out (comma separated; see --list).
    #[arg(long, value_delimiter = ',')]
    pub(crate) skip: Vec<String>,
    /// Run only these steps (comma separated), in the usual order.
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// Shorter run for local iteration: 5 s fuzz smoke, no bench build.
    #[arg(long)]
    pub(crate) quick: bool,
    /// Longer fuzzing (600 s per target); also set by EPKV_SOAK=1.
    #[arg(long)]
    pub(crate) long: bool,
    /// Seconds of fuzzing per target (overrides --quick and --long).
    #[arg(long)]
    pub(crate) fuzz_secs: Option<u64>,
    /// Print the steps and exit.
    #[arg(long)]
    pub(crate) list: bool,
}

/// Returns the steps selected by `opts`, validating the names it mentions.
pub(crate) fn selected_steps(opts: &CiOptions) -> Result<Vec<&'static str>> {
    for name in opts.skip.iter().chain(&opts.only) {
        if !STEPS.iter().any(|(s, _)| s == name) {
            bail!("unknown step `{name}`; steps: {}", step_names().join(", "));
        }
    }
    Ok(STEPS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| opts.only.is_empty() || opts.only.iter().any(|o| o == name))
        .filter(|name| !opts.skip.iter().any(|s| s == name))
        .filter(|name| !(opts.quick && *name == "bench-build" && opts.only.is_empty()))
        .collect())
}

fn step_names() -> Vec<&'static str> {
    STEPS.iter().map(|(n, _)| *n).collect()
}

fn fuzz_secs(opts: &CiOptions) -> u64 {
    let soak = std::env::var("EPKV_SOAK").is_ok_and(|v| !v.is_empty() && v != "0");
    opts.fuzz_secs.unwrap_or(if opts.long || soak {
        600
    } else if opts.quick {
        5
    } else {
        30
    })
}

/// `cargo` for the CI steps: without incremental compilation, whose caches a single clean
/// run never reads back and which doubled the debug target directory (a CI machine ran out
/// of disk building it). `CARGO_INCREMENTAL` set by the caller wins.
fn cargo() -> std::process::Command {
    let mut cmd = util::cargo();
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    cmd
}

fn run_step(name: &str, opts: &CiOptions, steps: &[&str]) -> Result<()> {
    match name {
        "deps" => deps::deps(DepsOptions {
            fuzz: steps.contains(&"fuzz"),
            python: steps.contains(&"python"),
        }),
        "fmt" => util::run(cargo().args(["fmt", "--all", "--", "--check"])),
        "clippy" => util::run(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])),
        "layers" => layers::check_layers(),
        "build" => util::run(cargo().args(["build", "--workspace", "--all-targets"])),
        "test" => {
            // e2e spawns target/debug/epkv-server; make sure it exists even when `build`
            // was skipped.
            util::run(cargo().args(["build", "-p", "epkv-server"]))?;
            // EPKV_CI: tests that need an external tool (promtool, prometheus) fail
            // instead of printing NOT RUN when it is missing.
            util::run(cargo().args(["test", "--workspace"]).env("EPKV_CI", "1"))
        }
        "doc" => util::run(
            cargo()
                .args(["doc", "--workspace", "--no-deps"])
                .env("RUSTDOCFLAGS", "-D warnings"),
        ),
        "memcapable" => {
            util::run(cargo().args(["build", "-p", "epkv-server"]))?;
            memcapable::memcapable(memcapable::Target::Epkv, "debug", None)
        }
        "python" => {
            util::run(cargo().args(["build", "-p", "epkv-server"]))?;
            // ci: the gocbcore DCP test fails instead of skipping without Go.
            python::pytest_ci("debug", &[])
        }
        "fuzz" => fuzz::fuzz_smoke(fuzz_secs(opts)),
        "miri" => miri(),
        "bench-build" => util::run(cargo().args(["bench", "-p", "epkv-bench", "--no-run"])),
        other => bail!("unknown step {other}"),
    }
}

/// Runs the selected steps, stopping at the first failure.
pub(crate) fn ci(opts: &CiOptions) -> Result<()> {
    if opts.list {
        for (name, what) in STEPS {
            println!("{name:<12} {what}");
        }
        return Ok(());
    }
    let steps = selected_steps(opts)?;
    let total = Stopwatch::start();
    let mut done: Vec<(&str, String)> = Vec::new();
    for (i, name) in steps.iter().enumerate() {
        println!("\n==> ci [{}/{}] {name}", i + 1, steps.len());
        let watch = Stopwatch::start();
        let result = run_step(name, opts, &steps);
        let took = util::fmt_duration(watch.elapsed());
        match result {
            Ok(()) => {
                println!("<== ci {name}: ok in {took}");
                done.push((name, took));
            }
            Err(err) => {
                summary(&done);
                eprintln!("\nci: step `{name}` FAILED after {took}: {err:#}");
                let rest: Vec<&str> = steps[i + 1..].to_vec();
                if !rest.is_empty() {
                    eprintln!("ci: not run: {}", rest.join(", "));
                }
                eprintln!(
                    "ci: re-run just this step with `cargo xtask ci --only {name}` (total {})",
                    util::fmt_duration(total.elapsed())
                );
                bail!("ci: {} passed, 1 failed", done.len());
            }
        }
    }
    summary(&done);
    println!("ci: total {}", util::fmt_duration(total.elapsed()));
    println!("ci: {} passed, 0 failed", done.len());
    Ok(())
}

fn summary(done: &[(&str, String)]) {
    if done.is_empty() {
        return;
    }
    println!("\nci summary:");
    for (name, took) in done {
        println!("  {name:<12} ok {took:>9}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> CiOptions {
        CiOptions {
            skip: vec![],
            only: vec![],
            quick: false,
            long: false,
            fuzz_secs: None,
            list: false,
        }
    }

    #[test]
    fn default_runs_every_step_in_order() {
        assert_eq!(selected_steps(&opts()).unwrap(), step_names());
    }

    #[test]
    fn skip_and_only_select_steps() {
        let mut o = opts();
        o.skip = vec!["fuzz".into(), "deps".into()];
        let s = selected_steps(&o).unwrap();
        assert!(!s.contains(&"fuzz") && !s.contains(&"deps") && s.contains(&"test"));
        let mut o = opts();
        o.only = vec!["python".into(), "fmt".into()];
        assert_eq!(selected_steps(&o).unwrap(), vec!["fmt", "python"]);
    }

    #[test]
    fn unknown_step_is_an_error() {
        let mut o = opts();
        o.skip = vec!["lint".into()];
        assert!(selected_steps(&o).is_err());
    }

    #[test]
    fn quick_drops_the_bench_build_and_shortens_fuzzing() {
        let mut o = opts();
        o.quick = true;
        assert!(!selected_steps(&o).unwrap().contains(&"bench-build"));
        assert_eq!(fuzz_secs(&o), 5);
        o.fuzz_secs = Some(42);
        assert_eq!(fuzz_secs(&o), 42);
    }
}
