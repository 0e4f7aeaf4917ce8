//! `cargo xtask memcapable`: libmemcached's `memcapable` (Debian: `memccapable`) binary
//! protocol conformance tests against a freshly started server.
//!
//! The expected list is what `memccapable -b` (libmemcached-tools 1.1.4 in Debian 12) runs
//! against memcached 1.6.18 started with `-U 0`, where all 27 pass; we require the same 27
//! to pass against epkv. `cargo xtask memcapable --against memcached` re-checks the list.

use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

/// The binary tests memccapable runs, in its order; all pass against memcached 1.6.
pub(crate) const EXPECTED_BINARY_TESTS: [&str; 27] = [
    "noop", "quit", "quitq", "set", "setq", "flush", "flushq", "add", "addq", "replace",
    "replaceq", "delete", "deleteq", "get", "getq", "getk", "getkq", "incr", "incrq", "decr",
    "decrq", "version", "append", "appendq", "prepend", "prependq", "stat",
];

/// How long one whole memccapable run may take (it finishes in about a second).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// The outcome of one memccapable test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `[pass]`
    Pass,
    /// `[FAIL]` or anything else memccapable printed in the brackets.
    Fail(String),
    /// `[skip]`
    Skip,
}

/// Parses memccapable's output into (test name without the `binary ` prefix, outcome).
pub(crate) fn parse_output(text: &str) -> Vec<(String, Outcome)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("binary ") else {
            continue;
        };
        let (Some(open), Some(close)) = (rest.rfind('['), rest.rfind(']')) else {
            continue;
        };
        if close < open {
            continue;
        }
        let name = rest[..open].trim().to_owned();
        let verdict = &rest[open + 1..close];
        let outcome = match verdict {
            "pass" => Outcome::Pass,
            "skip" => Outcome::Skip,
            other => Outcome::Fail(other.to_owned()),
        };
        out.push((name, outcome));
    }
    out
}

/// Compares parsed results with [`EXPECTED_BINARY_TESTS`]; returns the problems found.
pub(crate) fn judge(results: &[(String, Outcome)]) -> Vec<String> {
    let mut problems = Vec::new();
    for name in EXPECTED_BINARY_TESTS {
        match results.iter().find(|(n, _)| n == name) {
            None => problems.push(format!("binary {name}: did not run (memccapable stopped?)")),
            Some((_, Outcome::Pass)) => {}
            Some((_, Outcome::Skip)) => problems.push(format!("binary {name}: skipped")),
            Some((_, Outcome::Fail(v))) => problems.push(format!("binary {name}: [{v}]")),
        }
    }
    for (name, outcome) in results {
        if !EXPECTED_BINARY_TESTS.contains(&name.as_str()) && *outcome != Outcome::Pass {
            problems.push(format!(
                "binary {name} (not in the expected list): {outcome:?}"
            ));
        }
    }
    problems
}

/// Runs `memccapable <args>` with a time limit; returns (combined output, success).
fn run_memccapable(args: &[String]) -> Result<(String, bool)> {
    run_tool("memccapable", args)
}

/// Runs a libmemcached-tools program with a time limit; returns (combined output,
/// success).
fn run_tool(tool: &str, args: &[String]) -> Result<(String, bool)> {
    let mut cmd = Command::new(tool);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let line = util::describe(&cmd);
    let mut child = cmd.spawn().with_context(|| {
        format!("cannot start `{line}`; install libmemcached-tools (cargo xtask deps)")
    })?;
    let watch = Stopwatch::start();
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if watch.elapsed() > RUN_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{line}` did not finish within {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output()?;
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok((text, out.status.success()))
}

fn base_args(addr: &str) -> Result<Vec<String>> {
    let (host, port) = addr.rsplit_once(':').context("address must be HOST:PORT")?;
    Ok(vec![
        "-b".into(),
        "-h".into(),
        host.into(),
        "-p".into(),
        port.into(),
        "-t".into(),
        "10".into(),
    ])
}

/// Runs the binary suite against `addr` and fails unless all expected tests pass.
pub(crate) fn run_against(addr: &str) -> Result<usize> {
    let args = base_args(addr)?;
    eprintln!("+ memccapable {}", args.join(" "));
    let (text, ok) = run_memccapable(&args)?;
    print!("{text}");
    let results = parse_output(&text);
    let problems = judge(&results);
    let passed = results.iter().filter(|(_, o)| *o == Outcome::Pass).count();
    if problems.is_empty() && ok {
        println!(
            "memcapable: {passed} passed, 0 failed (expected {} as against memcached 1.6)",
            EXPECTED_BINARY_TESTS.len()
        );
        return Ok(passed);
    }
    eprintln!("memcapable: failures against {addr}:");
    for p in &problems {
        eprintln!("  {p}");
    }
    // Re-run each failing test alone with -v so the assertion that broke is printed.
    for (name, outcome) in &results {
        if matches!(outcome, Outcome::Fail(_)) {
            let mut verbose = args.clone();
            verbose.extend(["-v".into(), "-T".into(), format!("binary {name}")]);
            eprintln!("--- memccapable {} ---", verbose.join(" "));
            match run_memccapable(&verbose) {
                Ok((t, _)) => eprintln!("{t}"),
                Err(e) => eprintln!("(re-run failed: {e:#})"),
            }
        }
    }
    bail!(
        "memcapable: {passed} passed, {} failed of {} expected",
        problems.len(),
        EXPECTED_BINARY_TESTS.len()
    )
}

/// Runs libmemcached's `memcstat --binary` against `addr`: it sends VERSION first and
/// refuses a server whose version does not start with a major version above 0, then
/// reads every STAT. Returns the number of stats it printed.
pub(crate) fn memcstat_against(addr: &str) -> Result<usize> {
    let args = vec!["--binary".to_owned(), format!("--servers={addr}")];
    eprintln!("+ memcstat {}", args.join(" "));
    let (text, ok) = run_tool("memcstat", &args)?;
    let stats = text.lines().filter(|l| l.contains(": ")).count();
    if !ok || !text.lines().any(|l| l.trim_start().starts_with("version:")) {
        bail!("memcstat against {addr} failed:\n{text}");
    }
    println!("memcstat: {stats} stats read, version parsed");
    Ok(stats)
}

/// Which server `cargo xtask memcapable` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Target {
    /// `target/<profile>/epkv-server`
    Epkv,
    /// Debian's memcached, to confirm the expected list
    Memcached,
}

/// Starts a fresh server of the given kind and runs the suite against it.
pub(crate) fn memcapable(target: Target, profile: &str, addr: Option<&str>) -> Result<()> {
    if let Some(addr) = addr {
        run_against(addr)?;
        memcstat_against(addr)?;
        return Ok(());
    }
    let logs = util::target_dir().join("xtask");
    std::fs::create_dir_all(&logs)?;
    // The server persists by default: it gets a data directory of its own, removed after
    // it stops (`data` outlives `server`).
    let mut data = None;
    let server = match target {
        Target::Epkv => {
            let dir = data.insert(tempdir("memcapable")?);
            let args = vec![
                "--flush-enabled".to_owned(),
                "--data-dir".to_owned(),
                dir.path().display().to_string(),
            ];
            let log = logs.join("memcapable-epkv.log");
            ServerProcess::start_epkv(&process::epkv_server_bin(profile), &args, log)?
        }
        Target::Memcached => {
            ServerProcess::start_memcached(&[], logs.join("memcapable-memcached.log"))?
        }
    };
    let result = run_against(&server.addr()).and_then(|_| memcstat_against(&server.addr()));
    let mut server = server;
    let alive = server.is_running();
    let tail = server.log_tail();
    let stopped = server.stop();
    if !alive {
        eprintln!("server log tail:\n{tail}");
        bail!("the server died during memcapable");
    }
    drop(data);
    result?;
    stopped
}

/// A server's private data directory under target/xtask/tmp, removed when dropped (after
/// the server using it has stopped).
#[derive(Debug)]
pub(crate) struct TempDir(std::path::PathBuf);

impl TempDir {
    /// The directory.
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates a fresh empty directory under target/xtask/tmp for a server's data, named
/// after this process, removed when the returned guard drops; directories left by xtask
/// processes that are gone (killed before cleaning up) are removed too.
pub(crate) fn tempdir(name: &str) -> Result<TempDir> {
    let root = util::target_dir().join("xtask").join("tmp");
    if let Ok(entries) = std::fs::read_dir(&root) {
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let pid = file_name
                .to_string_lossy()
                .rsplit_once('-')
                .map(|(_, p)| p.to_owned());
            let stale = pid.is_some_and(|p| {
                p.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(&p).exists()
            });
            if stale {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = root.join(format!("{name}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(TempDir(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_PASS: &str = include_str!("../testdata/memcapable-memcached-1.6.18.txt");

    #[test]
    fn memcached_output_parses_to_27_passes() {
        let results = parse_output(ALL_PASS);
        assert_eq!(results.len(), 27);
        assert!(results.iter().all(|(_, o)| *o == Outcome::Pass));
        assert!(judge(&results).is_empty());
        let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, EXPECTED_BINARY_TESTS);
    }

    #[test]
    fn a_failure_and_a_missing_test_are_both_reported() {
        let text = ALL_PASS
            .replace(
                "binary getk                             [pass]",
                "binary getk [FAIL]",
            )
            .replace("binary stat                             [pass]\n", "");
        let problems = judge(&parse_output(&text));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("getk: [FAIL]")));
        assert!(problems.iter().any(|p| p.contains("stat: did not run")));
    }

    #[test]
    fn skips_count_as_problems() {
        let text = ALL_PASS.replace(
            "binary quit                             [pass]",
            "binary quit [skip]",
        );
        assert_eq!(
            judge(&parse_output(&text)),
            vec!["binary quit: skipped".to_owned()]
        );
    }

    #[test]
    fn unparsable_lines_are_ignored() {
        assert!(parse_output("Failed to connect\nbinary noop\n").is_empty());
    }
}
