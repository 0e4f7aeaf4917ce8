//! `cargo xtask pytest`: the Python third-party client tests (tests/python, run with the
//! `.venv` that `cargo xtask deps` builds, and that this step brings up to date) against
//! real epkv-server processes: python-binary-memcached and the Couchbase Python SDK.

use std::process::Command;

use anyhow::{Result, bail};

use crate::deps;
use crate::process;
use crate::util;

/// Runs pytest over tests/python with `EPKV_SERVER_BIN` pointing at `profile`'s binary,
/// after making sure `.venv` has the pinned packages (the Couchbase SDK among them; pip
/// runs only when `tests/python/requirements.txt` changed).
pub(crate) fn pytest(profile: &str, extra: &[String]) -> Result<()> {
    run_pytest(profile, extra, false)
}

/// [`pytest`] as CI runs it: with `EPKV_CI` set, so that tests needing a tool (Go for
/// the gocbcore DCP client) fail instead of skipping when it is missing.
pub(crate) fn pytest_ci(profile: &str, extra: &[String]) -> Result<()> {
    run_pytest(profile, extra, true)
}

fn run_pytest(profile: &str, extra: &[String], ci: bool) -> Result<()> {
    deps::python_venv()?;
    let python = deps::venv_python();
    if !python.is_file() {
        bail!(
            "{} is missing; run `cargo xtask deps` first",
            python.display()
        );
    }
    let bin = match std::env::var_os("EPKV_SERVER_BIN") {
        Some(bin) => bin.into(),
        None => process::epkv_server_bin(profile),
    };
    if !bin.is_file() {
        bail!(
            "{} does not exist; build it first (cargo build -p epkv-server)",
            bin.display()
        );
    }
    let mut cmd = Command::new(python);
    cmd.current_dir(util::repo_root())
        .args([
            "-m",
            "pytest",
            "tests/python",
            "-v",
            "-p",
            "no:cacheprovider",
        ])
        .args(extra)
        .env("EPKV_SERVER_BIN", &bin)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    if ci {
        cmd.env("EPKV_CI", "1");
    }
    // pytest exits 5 when it collected no test; `run` treats any non-zero exit as failure.
    util::run(&mut cmd)
}
