//! Small helpers shared by every subcommand: locating the repository, running commands
//! with their output streamed, and a wall clock for step timings.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Returns the repository root (the parent of the xtask crate).
pub(crate) fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.to_path_buf(), Path::to_path_buf)
}

/// Returns the cargo target directory (`CARGO_TARGET_DIR` or `<root>/target`).
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        None => repo_root().join("target"),
    }
}

/// Returns the cargo executable that invoked us, so `cargo xtask` and a nested `cargo` agree.
pub(crate) fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(repo_root());
    cmd
}

/// A started stopwatch for reporting how long a step took.
///
/// xtask is a build tool measuring its own wall time, not engine time, so it reads
/// `Instant` directly instead of going through `epkv_executor::Clock`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch(Instant);

impl Stopwatch {
    /// Starts a stopwatch now.
    #[expect(
        clippy::disallowed_methods,
        reason = "xtask times its own steps and child processes; no engine code is involved"
    )]
    pub(crate) fn start() -> Self {
        Self(Instant::now())
    }

    /// Returns the time elapsed since `start`.
    pub(crate) fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// Formats a duration as `1m02.3s` or `4.5s`.
pub(crate) fn fmt_duration(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs >= 60.0 {
        let mins = (secs / 60.0).floor();
        format!("{mins:.0}m{:04.1}s", secs - mins * 60.0)
    } else {
        format!("{secs:.1}s")
    }
}

/// Renders a command line for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs `cmd` with inherited stdio and fails unless it exits with status 0.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    eprintln!("+ {line}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` capturing stdout, returning it only when the command succeeded.
pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let line = describe(cmd);
    let out = cmd
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Returns true when `program` is found on `PATH`.
pub(crate) fn on_path(program: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| dir.join(program).is_file())
}

/// The median of `v` (the mean of the middle two for an even count); NaN when empty.
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The number of cores this process may run on (2 if unknown).
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, std::num::NonZero::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fmt_duration_uses_minutes_past_sixty_seconds() {
        assert_eq!(fmt_duration(Duration::from_millis(4_500)), "4.5s");
        assert_eq!(fmt_duration(Duration::from_millis(62_300)), "1m02.3s");
    }

    #[test]
    fn repo_root_holds_the_workspace_manifest() {
        assert!(repo_root().join("Cargo.toml").is_file());
        assert!(repo_root().join("xtask").is_dir());
    }
}
