//! Starting and stopping a real `epkv-server` process, or using one that already runs.
//!
//! - The binary is `$EPKV_SERVER_BIN`, else `target/<profile>/epkv-server` next to this
//!   test executable (build it with `cargo build -p epkv-server`).
//! - `EPKV_E2E_ADDR=host:port` points the suite at a server that is already running
//!   (ours under a debugger, or another memcached-binary server for parity). Tests that
//!   need their own process (signals, limits, RSS, vBucket states, the clock) are skipped
//!   then, with a note on stderr.
//!
//! A spawned server listens on 127.0.0.1 port 0 with `--testing --flush-enabled` (plus
//! whatever a test adds), and the harness reads the bound address from the line it
//! prints on stdout. [`Server`] kills the process when dropped.

use epkv_client::{Client, ClientConfig};
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long the server may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long any client read may wait before the test fails.
pub(crate) const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The administrator of [`admin_args`].
pub(crate) const ADMIN: (&str, &str) = ("Administrator", "password");

/// The arguments of a server with the administrator [`ADMIN`] and a small memory quota
/// (the REST and metrics tests add their own).
pub(crate) fn admin_args() -> Vec<&'static str> {
    vec![
        "--admin-user",
        ADMIN.0,
        "--admin-password",
        ADMIN.1,
        "--memory-quota",
        "32MiB",
    ]
}

/// Locates the server binary.
pub(crate) fn server_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("EPKV_SERVER_BIN") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "EPKV_SERVER_BIN={} is not a file", p.display());
        return p;
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/e2e-<hash> → target/<profile>/epkv-server
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let bin = profile_dir.join("epkv-server");
    assert!(
        bin.is_file(),
        "epkv-server binary not found at {}: run `cargo build -p epkv-server` (same profile as \
         the tests) first, or set EPKV_SERVER_BIN",
        bin.display()
    );
    bin
}

/// The externally running server named by `EPKV_E2E_ADDR`, if any.
pub(crate) fn external_addr() -> Option<SocketAddr> {
    let v = std::env::var("EPKV_E2E_ADDR").ok()?;
    let addr = v
        .parse()
        .unwrap_or_else(|e| panic!("EPKV_E2E_ADDR={v:?} is not host:port: {e}"));
    Some(addr)
}

/// Returns true (and says so) when the suite runs against an external server, for tests
/// that need a process of their own.
pub(crate) fn skip_if_external(test: &str) -> bool {
    if external_addr().is_some() {
        eprintln!("{test}: skipped with EPKV_E2E_ADDR (needs its own server process)");
        return true;
    }
    false
}

/// A server under test: a child process (killed on drop) or an external address.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    child: Option<Child>,
    stderr: Option<std::thread::JoinHandle<String>>,
    data_dir: Option<PathBuf>,
    /// Whether `data_dir` is the server's own, removed when it is dropped (false for a
    /// directory the test passed in, to restart servers on it).
    owns_data_dir: bool,
    /// The first line the server printed on stdout (empty for an external server).
    pub(crate) listening_line: String,
}

impl Server {
    /// The external server if `EPKV_E2E_ADDR` is set, else a fresh process with the
    /// default test flags.
    pub(crate) fn start() -> Server {
        match external_addr() {
            Some(addr) => Server {
                addr,
                child: None,
                stderr: None,
                data_dir: None,
                owns_data_dir: false,
                listening_line: String::new(),
            },
            None => Server::spawn(&[]),
        }
    }

    /// A fresh process with `--port 0 --testing --flush-enabled` and `extra` flags.
    pub(crate) fn spawn(extra: &[&str]) -> Server {
        let mut args = vec!["--port", "0", "--testing", "--flush-enabled"];
        args.extend_from_slice(extra);
        Server::spawn_exact(&args)
    }

    /// A fresh process with exactly these arguments (plus a private data directory).
    pub(crate) fn spawn_exact(args: &[&str]) -> Server {
        Server::spawn_exact_env(args, &[])
    }

    /// [`Server::spawn`] with extra environment variables.
    pub(crate) fn spawn_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut args = vec!["--port", "0", "--testing", "--flush-enabled"];
        args.extend_from_slice(extra);
        Server::spawn_exact_env(&args, env)
    }

    /// A fresh process with exactly these arguments and extra environment variables (plus
    /// a private data directory).
    pub(crate) fn spawn_exact_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut server = Server::spawn_on(args, env, &fresh_data_dir());
        server.owns_data_dir = true;
        server
    }

    /// [`Server::spawn`] on the data directory `data_dir`, which outlives the server (for
    /// restarts); the test removes it (see [`TestDir`]).
    pub(crate) fn spawn_in(data_dir: &std::path::Path, extra: &[&str]) -> Server {
        let mut args = vec!["--port", "0", "--testing", "--flush-enabled"];
        args.extend_from_slice(extra);
        Server::spawn_on(&args, &[], data_dir)
    }

    /// A fresh process with exactly `args` on the data directory `data_dir`, which
    /// outlives the server (see [`TestDir`]).
    pub(crate) fn spawn_in_exact(data_dir: &std::path::Path, args: &[&str]) -> Server {
        Server::spawn_on(args, &[], data_dir)
    }

    fn spawn_on(args: &[&str], env: &[(&str, &str)], data_dir: &std::path::Path) -> Server {
        let data_dir = data_dir.to_owned();
        let mut child = Command::new(server_binary())
            // A free management port (8091 may be taken; tests run side by side); a
            // test's own --mgmt-port comes later and wins.
            .args(["--mgmt-port", "0"])
            .args(args)
            .arg("--data-dir")
            .arg(&data_dir)
            .env(
                "RUST_LOG",
                std::env::var("EPKV_E2E_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn epkv-server");
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = BufReader::new(stderr).read_to_string(&mut s);
            s
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let first = lines.next();
            let _ = tx.send(first);
            for _ in lines {}
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(Some(Ok(line))) => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                let err = stderr.join().unwrap_or_default();
                panic!("epkv-server did not print its address ({other:?}); stderr:\n{err}");
            }
        };
        let addr = parse_listening_line(&line);
        Server {
            addr,
            child: Some(child),
            stderr: Some(stderr),
            data_dir: Some(data_dir),
            owns_data_dir: false,
            listening_line: line,
        }
    }

    /// Runs the server with `args` (plus a private data directory) expecting it to fail
    /// at start; returns its exit status and stderr.
    pub(crate) fn spawn_exact_expecting_failure(args: &[&str]) -> (ExitStatus, String) {
        let data_dir = fresh_data_dir();
        let mut child = Command::new(server_binary())
            // A free management port (8091 may be taken; tests run side by side); a
            // test's own --mgmt-port comes later and wins.
            .args(["--mgmt-port", "0"])
            .args(args)
            .arg("--data-dir")
            .arg(&data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn epkv-server");
        let mut stderr = child.stderr.take().expect("stderr");
        let status = wait_bounded(&mut child, START_TIMEOUT);
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = std::fs::remove_dir_all(&data_dir);
        (status, text)
    }

    /// The private data directory of a spawned server (removed when it is dropped).
    pub(crate) fn data_dir(&self) -> Option<&std::path::Path> {
        self.data_dir.as_deref()
    }

    /// The process id of a spawned server.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Resident memory of a spawned server, from /proc.
    pub(crate) fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Connects a client.
    pub(crate) async fn client(&self) -> Client {
        let config = ClientConfig {
            timeout: Some(CLIENT_TIMEOUT),
            ..ClientConfig::default()
        };
        Client::connect_with(self.addr, config)
            .await
            .expect("connect to epkv-server")
    }

    /// Waits (bounded) until warmup has loaded every stored vBucket (`STAT warmup`), so
    /// data requests no longer answer TMPFAIL. Needs the open mode (no users).
    pub(crate) async fn wait_warmed_up(&self) {
        let mut c = self.client().await;
        for _ in 0..3000 {
            let stats: std::collections::HashMap<String, String> =
                c.stat("warmup").await.unwrap().into_iter().collect();
            match stats.get("ep_warmup_state").map(String::as_str) {
                Some("done") | None => return,
                Some(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        panic!("warmup did not finish within 30 s");
    }

    /// SIGKILLs a spawned server (no chance to flush) and waits for it; returns its
    /// stderr.
    pub(crate) fn kill(mut self) -> String {
        let mut child = self.child.take().expect("a spawned server");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit; returns its status and
    /// stderr.
    pub(crate) fn terminate(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("a spawned server");
        let pid = child.id();
        let rc = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(rc.success(), "kill -TERM {pid} failed");
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (status, stderr)
    }
}

static NEXT_DIR: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A new directory name under the temporary directory, unique to this run.
fn fresh_data_dir() -> PathBuf {
    std::env::temp_dir().join(format!(
        "epkv-e2e-{}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
}

/// A data directory a test shares between the servers it starts one after the other;
/// removed when dropped.
pub(crate) struct TestDir(PathBuf);

impl TestDir {
    pub(crate) fn new() -> TestDir {
        TestDir(fresh_data_dir())
    }

    pub(crate) fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits for a child to exit, killing it (and failing) after `limit`.
fn wait_bounded(child: &mut Child, limit: Duration) -> ExitStatus {
    let step = Duration::from_millis(20);
    let mut waited = Duration::ZERO;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if waited >= limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("epkv-server did not exit within {limit:?}");
        }
        std::thread::sleep(step);
        waited += step;
    }
}

impl Server {
    /// The management REST address, from the `, mgmt http://HOST:PORT` part of the
    /// startup line (every spawned server gets `--mgmt-port 0` unless a test says else).
    pub(crate) fn mgmt_addr(&self) -> SocketAddr {
        parse_mgmt_addr(&self.listening_line)
            .unwrap_or_else(|| panic!("no management address in {:?}", self.listening_line))
    }

    /// The TLS listener's address, from the `..., tls HOST:PORT)` end of the startup
    /// line of a server started with `--tls-cert` and `--tls-key`.
    pub(crate) fn tls_addr(&self) -> SocketAddr {
        parse_tls_addr(&self.listening_line)
            .unwrap_or_else(|| panic!("no TLS address in {:?}", self.listening_line))
    }

    /// Sends a signal (`HUP`, `TERM`, ...) to a spawned server.
    pub(crate) fn signal(&self, name: &str) {
        let pid = self.pid().expect("a spawned server");
        let rc = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(rc.success(), "kill -{name} {pid} failed");
    }
}

/// An HTTP/1.1 response (read to the end of the connection).
pub(crate) struct HttpReply {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

/// `METHOD path` with optional Basic credentials and an optional form body, over a fresh
/// connection (`Connection: close`).
pub(crate) fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    basic: Option<(&str, &str)>,
    form: Option<&str>,
) -> HttpReply {
    use base64::Engine as _;
    use std::io::{Read, Write};
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let auth = basic.map_or_else(String::new, |(u, p)| {
        format!(
            "Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
        )
    });
    let body = form.unwrap_or("");
    let content = form.map_or_else(String::new, |f| {
        format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            f.len()
        )
    });
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}{content}Connection: close\r\n\r\n{body}"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the reply");
    let text = String::from_utf8(raw).expect("utf-8 reply");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header block");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    HttpReply {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// The `mgmt http://HOST:PORT` part of the startup line, if any.
pub(crate) fn parse_mgmt_addr(line: &str) -> Option<SocketAddr> {
    let rest = line.split(", mgmt http://").nth(1)?;
    rest.split([',', ')', ' ']).next()?.parse().ok()
}

/// The `tls HOST:PORT` part of the startup line, if any.
pub(crate) fn parse_tls_addr(line: &str) -> Option<SocketAddr> {
    let rest = line.split(", tls ").nth(1)?;
    rest.trim_end_matches(')')
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Parses `epkv listening on 127.0.0.1:PORT (bucket "default", data DIR)`.
pub(crate) fn parse_listening_line(line: &str) -> SocketAddr {
    line.strip_prefix("epkv listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first stdout line: {line:?}"))
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failing test shows what its servers logged last.
        if std::thread::panicking()
            && let Some(stderr) = self.stderr.take()
            && let Ok(log) = stderr.join()
        {
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!("--- epkv-server {} (last lines of its log) ---", self.addr);
            for l in tail {
                eprintln!("{l}");
            }
        }
        if let Some(dir) = self.data_dir.take()
            && self.owns_data_dir
        {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A key unique to this test run and `name`, so tests sharing an external server do not
/// step on each other.
pub(crate) fn key(name: &str) -> Vec<u8> {
    format!("e2e-{}-{name}", std::process::id()).into_bytes()
}

/// Free loopback ports (bound then released; a clash with another process is possible
/// but unlikely in the moment between).
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}
