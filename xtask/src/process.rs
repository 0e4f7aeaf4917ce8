//! Starting and stopping the servers that third-party clients are run against: our
//! `epkv-server` (on port 0, the port read back from its stdout), and Debian's `memcached`
//! and `redis-server` (on a port picked here), plus reading a process's CPU time from
//! `/proc/<pid>/stat`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::util::{self, Stopwatch};

/// How long a server may take to say it is listening.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a server may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A server process started by xtask; killed on drop if not stopped first.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    child: Option<Child>,
    /// The port the server listens on, on 127.0.0.1.
    pub(crate) port: u16,
    /// `epkv`, `memcached` or `redis`, for messages.
    pub(crate) name: &'static str,
    /// Where the server's stderr (and for memcached, stdout) goes.
    pub(crate) log: PathBuf,
    /// epkv's listening line (empty for the peers).
    pub(crate) listening_line: String,
}

/// Extracts the port from the server's `epkv listening on HOST:PORT ...` line.
pub(crate) fn parse_listening_line(line: &str) -> Option<u16> {
    let rest = line.split("listening on ").nth(1)?;
    let addr = rest.split_whitespace().next()?;
    let addr = addr.trim_end_matches([',', ';', '.', ')']);
    let port = addr.rsplit_once(':')?.1;
    port.parse().ok()
}

/// Returns a port on 127.0.0.1 that was free a moment ago (for servers that cannot be
/// told to pick one themselves).
pub(crate) fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Returns the path of the `epkv-server` binary for `profile` (`debug` or `release`).
pub(crate) fn epkv_server_bin(profile: &str) -> PathBuf {
    util::target_dir().join(profile).join("epkv-server")
}

/// The server binary a bench runs: `given` (its `--epkv-bin`), or a freshly built
/// `target/release/epkv-server`.
///
/// # Errors
/// The release build failed.
pub(crate) fn release_server_bin(given: Option<&PathBuf>) -> anyhow::Result<PathBuf> {
    match given {
        Some(b) => Ok(b.clone()),
        None => {
            util::run(util::cargo().args(["build", "--release", "-p", "epkv-server"]))?;
            Ok(epkv_server_bin("release"))
        }
    }
}

impl ServerProcess {
    /// Starts `bin --port 0 <args>` and waits until it prints its listening line.
    ///
    /// # Errors
    /// Fails if the binary is missing, exits early or stays silent for 30 s.
    pub(crate) fn start_epkv(bin: &Path, args: &[String], log: PathBuf) -> Result<Self> {
        if !bin.is_file() {
            bail!(
                "{} does not exist; build it first (cargo build -p epkv-server)",
                bin.display()
            );
        }
        let stderr = File::create(&log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new(bin);
        // A free management port: 8091 may be taken by another server on the machine.
        cmd.args(["--port", "0", "--mgmt-port", "0"]).args(args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let line = util::describe(&cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start `{line}`"))?;
        let stdout = child.stdout.take().context("no stdout pipe")?;
        let (tx, rx) = mpsc::channel();
        // Keeps draining stdout after the listening line so the server never blocks on it.
        thread::spawn(move || {
            let mut sent = false;
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if !sent {
                    if let Some(port) = parse_listening_line(&l) {
                        let _ = tx.send(Ok((port, l)));
                        sent = true;
                    } else {
                        let _ = tx.send(Err(l));
                    }
                }
            }
        });
        let mut server = ServerProcess {
            child: Some(child),
            port: 0,
            name: "epkv",
            log,
            listening_line: String::new(),
        };
        let watch = Stopwatch::start();
        let mut seen = Vec::new();
        loop {
            let left = START_TIMEOUT.saturating_sub(watch.elapsed());
            match rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(Ok((port, l))) => {
                    server.port = port;
                    server.listening_line = l;
                    server.wait_accepting(&line)?;
                    eprintln!(
                        "started `{line}` (pid {}) on 127.0.0.1:{port}",
                        server.pid()
                    );
                    return Ok(server);
                }
                Ok(Err(other)) => seen.push(other),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(status) = server.try_exited()? {
                        bail!(
                            "`{line}` exited with {status} before listening; stdout: {seen:?}; \
                             log:\n{}",
                            server.log_tail()
                        );
                    }
                    if left.is_zero() {
                        bail!(
                            "`{line}` did not print `epkv listening on HOST:PORT` within {:?}; \
                             stdout: {seen:?}; log:\n{}",
                            START_TIMEOUT,
                            server.log_tail()
                        );
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = server.wait_exit(Duration::from_secs(2));
                    bail!(
                        "`{line}` closed stdout before listening ({status:?}); stdout: {seen:?}; \
                         log:\n{}",
                        server.log_tail()
                    );
                }
            }
        }
    }

    /// Starts `memcached -l 127.0.0.1 -p PORT -U 0 <args>` and waits until it accepts.
    pub(crate) fn start_memcached(args: &[String], log: PathBuf) -> Result<Self> {
        let port = free_port()?;
        let mut cmd = Command::new("memcached");
        cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(args);
        if is_root() {
            // memcached refuses to run as root without being told which user to be.
            cmd.args(["-u", "root"]);
        }
        Self::spawn_peer(cmd, port, "memcached", log)
    }

    /// Starts `redis-server --bind 127.0.0.1 --port PORT --save '' --appendonly no` (no
    /// snapshots, no append-only file: memory only, like memcached) in `dir`, with `args`
    /// after, and waits until it accepts.
    pub(crate) fn start_redis(args: &[String], dir: &Path, log: PathBuf) -> Result<Self> {
        let port = free_port()?;
        let mut cmd = Command::new("redis-server");
        cmd.args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .args(args);
        Self::spawn_peer(cmd, port, "redis", log)
    }

    /// Starts a peer server told to listen on `port`, its stdout and stderr to `log`, and
    /// waits until it accepts.
    fn spawn_peer(mut cmd: Command, port: u16, name: &'static str, log: PathBuf) -> Result<Self> {
        let out = File::create(&log).with_context(|| format!("create {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let line = util::describe(&cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start `{line}`"))?;
        let mut server = ServerProcess {
            child: Some(child),
            port,
            name,
            log,
            listening_line: String::new(),
        };
        server.wait_accepting(&line)?;
        eprintln!("started `{line}` (pid {})", server.pid());
        Ok(server)
    }

    /// Waits (bounded) until the server accepts TCP connections on its port.
    fn wait_accepting(&mut self, line: &str) -> Result<()> {
        let watch = Stopwatch::start();
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.try_exited()? {
                bail!("`{line}` exited with {status}; log:\n{}", self.log_tail());
            }
            if watch.elapsed() > START_TIMEOUT {
                bail!("`{line}` does not accept connections within {START_TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Returns the process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Returns `host:port` for clients.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn try_exited(&mut self) -> Result<Option<std::process::ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => Ok(child.try_wait()?),
            None => Ok(None),
        }
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let watch = Stopwatch::start();
        while watch.elapsed() < limit {
            if let Ok(Some(status)) = self.try_exited() {
                return Some(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Returns true while the process is still running.
    pub(crate) fn is_running(&mut self) -> bool {
        matches!(self.try_exited(), Ok(None))
    }

    /// Returns the last 40 lines of the server's log.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Sends SIGTERM, waits up to 10 s for a graceful exit, then kills.
    ///
    /// # Errors
    /// Fails if the server had to be killed or exited with a failure status after SIGTERM.
    pub(crate) fn stop(mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(status) = child.try_wait()? {
            bail!(
                "{} (pid {}) had already exited with {status}",
                self.name,
                child.id()
            );
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let watch = Stopwatch::start();
        while watch.elapsed() < STOP_TIMEOUT {
            if let Some(status) = child.try_wait()? {
                // memcached exits with 0 on SIGTERM; so must we.
                if !status.success() {
                    bail!("{} exited with {status} after SIGTERM", self.name);
                }
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "{} did not exit within {STOP_TIMEOUT:?} of SIGTERM; killed",
            self.name
        )
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// CPU time a process has used so far, in clock ticks (user + system).
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    parse_stat_cpu_ticks(&stat).with_context(|| format!("cannot parse /proc/{pid}/stat: {stat}"))
}

/// CPU ticks of the server's threads whose name starts with `prefix`.
pub(crate) fn thread_ticks(pid: u32, prefix: &str) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = e?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        total += parse_stat_cpu_ticks(&stat).unwrap_or(0);
    }
    Ok(total)
}

/// Returns utime + stime (fields 14 and 15) from a `/proc/<pid>/stat` line.
pub(crate) fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may contain spaces or ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state), so field N is at index N - 3.
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// Returns the kernel's clock ticks per second (`getconf CLK_TCK`, almost always 100).
pub(crate) fn clock_ticks_per_sec() -> u64 {
    util::output(Command::new("getconf").arg("CLK_TCK"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_line_gives_the_port() {
        assert_eq!(
            parse_listening_line("epkv listening on 127.0.0.1:40123 (bucket default, data ./d)"),
            Some(40123)
        );
        assert_eq!(
            parse_listening_line("epkv listening on 127.0.0.1:11210"),
            Some(11210)
        );
        assert_eq!(
            parse_listening_line("epkv listening on [::1]:5000, bucket"),
            Some(5000)
        );
        assert_eq!(parse_listening_line("starting up"), None);
        assert_eq!(parse_listening_line("epkv listening on nowhere"), None);
    }

    #[test]
    fn stat_parse_handles_spaces_and_parens_in_comm() {
        let stat = "1234 (my (odd) srv) S 1 1234 1234 0 -1 4194560 100 0 0 0 \
                    250 37 0 0 20 0 4 0 100 1000 50";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(287));
        assert_eq!(parse_stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn own_cpu_ticks_are_readable() {
        assert!(cpu_ticks(std::process::id()).is_ok());
    }

    #[test]
    fn free_port_is_nonzero() {
        assert_ne!(free_port().unwrap(), 0);
    }
}
