//! `cargo xtask deps`: installs what the test suite needs on a fresh Debian machine, and
//! does nothing for what is already there.
//!
//! - Debian packages: `libmemcached-tools` (memccapable, memcaslap), `memcached` (the
//!   benchmark and parity peer), `python3-venv`, `prometheus` (`promtool` and the server
//!   the metrics tests scrape with), `openssl` (certificates for the SDK TLS test),
//!   `golang-go` when no `go` is on PATH (tests/dcp-go, the gocbcore DCP client: gocbcore
//!   v10.8.1 needs Go >= 1.21, as in trixie; bookworm's golang-go is 1.19, too old, and the
//!   pytest fixture says so), `etcd-server` (the etcd members the cluster tests start);
//!   `apt-get update && apt-get install` runs only when one is missing.
//! - A Python virtualenv at `.venv` with the pinned packages of
//!   `tests/python/requirements.txt` (python-binary-memcached, pytest and the Couchbase
//!   Python SDK `couchbase==4.6.3`, a manylinux wheel bundling its C++ core); pip runs only when that file changed since the last
//!   install (a copy is kept in `.venv/epkv-requirements.txt`).
//! - For the fuzz smoke: the nightly toolchain (must already be installed; rustup cannot
//!   download here) and `cargo-fuzz` (installed from crates.io when missing).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::util;

/// A Debian package and a way to tell it is installed without asking dpkg.
struct AptPackage {
    name: &'static str,
    /// A program the package provides; when it is on PATH the package counts as present.
    provides: Option<&'static str>,
}

const APT_PACKAGES: &[AptPackage] = &[
    AptPackage {
        name: "libmemcached-tools",
        provides: Some("memccapable"),
    },
    AptPackage {
        name: "memcached",
        provides: Some("memcached"),
    },
    AptPackage {
        name: "python3-venv",
        provides: None,
    },
    AptPackage {
        name: "prometheus",
        provides: Some("promtool"),
    },
    // The Couchbase SDK's couchbases:// test makes its CA and certificates with it.
    AptPackage {
        name: "openssl",
        provides: Some("openssl"),
    },
    // tests/python/test_dcp_gocbcore.py builds tests/dcp-go (gocbcore's DCP client) with it.
    // A `go` already on PATH (such as an upstream toolchain in /usr/local/go) counts.
    AptPackage {
        name: "golang-go",
        provides: Some("go"),
    },
    // The etcd-backed cluster's tests (tests/e2e/etcd_cluster.rs, the Python SDK's
    // failover tests) start their own etcd members from it.
    AptPackage {
        name: "etcd-server",
        provides: Some("etcd"),
    },
];

/// What `deps` should install.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DepsOptions {
    /// Install the nightly/cargo-fuzz prerequisites of the fuzz smoke.
    pub(crate) fuzz: bool,
    /// Create the Python venv.
    pub(crate) python: bool,
}

/// Returns the path of the project's Python virtualenv.
pub(crate) fn venv_dir() -> PathBuf {
    util::repo_root().join(".venv")
}

/// Returns the path of the pinned Python requirements.
pub(crate) fn requirements_file() -> PathBuf {
    util::repo_root()
        .join("tests")
        .join("python")
        .join("requirements.txt")
}

/// Installs everything missing.
pub(crate) fn deps(opts: DepsOptions) -> Result<()> {
    apt()?;
    if opts.python {
        python_venv()?;
    }
    if opts.fuzz {
        fuzz_tools()?;
    }
    Ok(())
}

fn dpkg_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .output()
        .map(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
        .unwrap_or(false)
}

fn apt() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .filter(|p| !(p.provides.is_some_and(util::on_path) || dpkg_installed(p.name)))
        .map(|p| p.name)
        .collect();
    if missing.is_empty() {
        println!("deps: apt packages present ({})", names(APT_PACKAGES));
        return Ok(());
    }
    println!("deps: installing apt packages: {}", missing.join(" "));
    if !util::on_path("apt-get") {
        bail!(
            "missing {} and apt-get is not available; install them by hand (this project \
             targets Debian 12)",
            missing.join(", ")
        );
    }
    let sudo = !is_root() && util::on_path("sudo");
    let apt_get = |args: &[&str]| -> Result<()> {
        let mut cmd = if sudo {
            let mut c = Command::new("sudo");
            c.args(["-E", "apt-get"]);
            c
        } else {
            Command::new("apt-get")
        };
        cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
        util::run(&mut cmd)
    };
    apt_get(&["update", "-q"])?;
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend(&missing);
    apt_get(&install)?;
    Ok(())
}

fn names(pkgs: &[AptPackage]) -> String {
    pkgs.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

fn is_root() -> bool {
    util::output(Command::new("id").arg("-u"))
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

/// Returns the python interpreter to build the venv with: `$EPKV_PYTHON`, else `python3`.
fn system_python() -> String {
    std::env::var("EPKV_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Returns the venv's python executable.
pub(crate) fn venv_python() -> PathBuf {
    venv_dir().join("bin").join("python")
}

pub(crate) fn python_venv() -> Result<()> {
    let venv = venv_dir();
    let python = venv_python();
    if !python.is_file() || util::output(Command::new(&python).arg("--version")).is_err() {
        if venv.exists() {
            println!("deps: {} is broken; recreating it", venv.display());
            std::fs::remove_dir_all(&venv)?;
        }
        util::run(
            Command::new(system_python())
                .args(["-m", "venv"])
                .arg(&venv),
        )?;
    }
    let wanted = std::fs::read_to_string(requirements_file())
        .with_context(|| format!("read {}", requirements_file().display()))?;
    let stamp = venv.join("epkv-requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
        println!(
            "deps: {} up to date with {}",
            venv.display(),
            rel(&requirements_file())
        );
        return Ok(());
    }
    util::run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(requirements_file()),
    )?;
    std::fs::write(&stamp, wanted)?;
    println!(
        "deps: installed {} into {}",
        rel(&requirements_file()),
        venv.display()
    );
    Ok(())
}

fn rel(path: &Path) -> String {
    path.strip_prefix(util::repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn fuzz_tools() -> Result<()> {
    let nightly =
        util::output(Command::new("rustup").args(["run", "nightly", "rustc", "--version"]));
    match nightly {
        Ok(v) => println!("deps: nightly toolchain present ({})", v.trim()),
        Err(_) => bail!(
            "the fuzz smoke needs a nightly toolchain (cargo-fuzz uses sanitizer flags only \
             nightly accepts) and none is installed: run `rustup toolchain install nightly`, \
             or skip the step with `cargo xtask ci --skip fuzz`"
        ),
    }
    if util::output(Command::new("cargo").args(["+nightly", "fuzz", "--version"])).is_ok() {
        println!("deps: cargo-fuzz present");
        return Ok(());
    }
    println!("deps: installing cargo-fuzz from crates.io (a few minutes, once)");
    util::run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))
}
