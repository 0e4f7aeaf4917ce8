//! The Prometheus endpoint (`--metrics-port`) of a real server process: the document
//! count, the access rules, `promtool check metrics` and a real Prometheus scraping it.
//!
//! `promtool` and `prometheus` come from Debian's `prometheus` package (installed by
//! `cargo xtask deps`). Where one is missing, a test prints `NOT RUN` and passes, except
//! in CI (`CI` or `EPKV_CI` set, as `cargo xtask ci` does), where it fails: the suite
//! must not silently lose a check there.

use crate::harness::{HttpReply, Server, http_request, skip_if_external};
use epkv_client::StoreOptions;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a real Prometheus may take to scrape and answer the count.
const PROMETHEUS_DEADLINE: Duration = Duration::from_secs(30);

/// The metrics address from the server's startup line (`..., metrics http://ADDR/metrics)`).
pub(crate) fn metrics_addr(server: &Server) -> SocketAddr {
    let line = &server.listening_line;
    line.split("metrics http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no metrics address in {line:?}"))
}

/// `GET path` with optional Basic credentials, over a fresh connection.
fn http_get(addr: SocketAddr, path: &str, basic: Option<(&str, &str)>) -> HttpReply {
    http_request(addr, "GET", path, basic, None)
}

/// The value of the series `series` (name and labels exactly as written) in `text`.
pub(crate) fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether `tool` is on PATH; if not, prints NOT RUN (or fails in CI).
fn have_tool(tool: &str, test: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if found {
        return true;
    }
    let in_ci = ["CI", "EPKV_CI"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.is_empty() && s != "0"));
    assert!(
        !in_ci,
        "{test}: `{tool}` is missing; install Debian's prometheus package (cargo xtask deps)"
    );
    eprintln!("{test}: NOT RUN: `{tool}` is missing (apt-get install prometheus)");
    false
}

/// Stores `n` documents; returns the (still open) client.
async fn store_documents(server: &Server, n: usize) -> epkv_client::Client {
    let mut c = server.client().await;
    for i in 0..n {
        c.set(format!("doc{i}").as_bytes(), b"value", StoreOptions::new())
            .await
            .unwrap();
    }
    c
}

#[tokio::test]
async fn metrics_report_the_document_count_and_pass_promtool() {
    if skip_if_external("metrics_count") {
        return;
    }
    let server = Server::spawn(&["--metrics-port", "0"]);
    server.wait_warmed_up().await;
    let _client = store_documents(&server, 37).await;
    let addr = metrics_addr(&server);
    assert_eq!(addr.ip(), server.addr.ip(), "the KV port's address");

    let r = http_get(addr, "/metrics", None);
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(
        r.head
            .to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{}",
        r.head
    );
    let text = &r.body;
    assert_eq!(
        series_value(text, r#"kv_curr_items{bucket="default"}"#),
        Some(37.0),
        "{text}"
    );
    assert_eq!(
        series_value(text, r#"kv_cmd_set_total{bucket="default"}"#),
        Some(37.0)
    );
    assert_eq!(
        series_value(text, r#"kv_cmd_duration_seconds_count{opcode="SET"}"#),
        Some(37.0),
        "the front end timed every SET"
    );
    assert!(series_value(text, "kv_curr_connections").is_some_and(|v| v >= 1.0));
    assert!(text.contains("# TYPE kv_task_duration_seconds histogram"));
    assert!(text.contains(r#"kv_task_duration_seconds_count{bucket="default",task="flusher-0"}"#));
    assert!(!text.contains("vb_0"), "nothing per vBucket");

    assert_eq!(http_get(addr, "/", None).status, 404);

    if have_tool("promtool", "metrics_promtool") {
        let mut child = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn promtool");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn metrics_need_a_users_password_when_users_are_configured() {
    if skip_if_external("metrics_auth") {
        return;
    }
    let server = Server::spawn(&[
        "--metrics-port",
        "0",
        "--admin-user",
        "Administrator",
        "--admin-password",
        "password",
    ]);
    let addr = metrics_addr(&server);
    for creds in [
        None,
        Some(("Administrator", "wrong")),
        Some(("nobody", "password")),
    ] {
        let r = http_get(addr, "/metrics", creds);
        assert_eq!(r.status, 401, "{creds:?}: {}", r.head);
        assert!(
            r.head
                .to_ascii_lowercase()
                .contains("www-authenticate: basic realm=\"epkv\""),
            "{}",
            r.head
        );
        assert!(!r.body.contains("kv_"), "nothing leaks without credentials");
    }
    // Twice: the second is answered from the cache of verified credentials.
    for _ in 0..2 {
        let r = http_get(addr, "/metrics", Some(("Administrator", "password")));
        assert_eq!(r.status, 200, "{}", r.head);
        assert_eq!(
            series_value(&r.body, r#"kv_curr_items{bucket="default"}"#),
            Some(0.0)
        );
    }
}

/// A Prometheus server process, killed when dropped.
struct Prometheus {
    child: Child,
    dir: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn start_prometheus(target: SocketAddr, dir: &Path) -> (Prometheus, SocketAddr) {
    std::fs::create_dir_all(dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: epkv\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let web: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn prometheus");
    (
        Prometheus {
            child,
            dir: dir.to_owned(),
        },
        web,
    )
}

/// `kv_curr_items{bucket="default"}` as Prometheus answers it, if it has a sample yet.
fn prometheus_curr_items(web: SocketAddr) -> Option<f64> {
    let mut s = TcpStream::connect_timeout(&web, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET /api/v1/query?query=kv_curr_items HTTP/1.1\r\nHost: {web}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (_, body) = raw.split_once("\r\n\r\n")?;
    let json: serde_json::Value = serde_json::from_str(body).ok()?;
    json["data"]["result"]
        .as_array()?
        .iter()
        .find(|r| r["metric"]["bucket"] == "default")
        .and_then(|r| r["value"][1].as_str()?.parse().ok())
}

#[tokio::test]
async fn a_real_prometheus_scrapes_the_document_count() {
    if skip_if_external("metrics_prometheus") || !have_tool("prometheus", "metrics_prometheus") {
        return;
    }
    let server = Server::spawn(&["--metrics-port", "0"]);
    server.wait_warmed_up().await;
    store_documents(&server, 23).await;
    let dir = std::env::temp_dir().join(format!("epkv-e2e-prometheus-{}", std::process::id()));
    let (prometheus, web) = start_prometheus(metrics_addr(&server), &dir);
    let step = Duration::from_millis(250);
    let mut waited = Duration::ZERO;
    let mut last = None;
    while waited < PROMETHEUS_DEADLINE {
        last = prometheus_curr_items(web);
        if last == Some(23.0) {
            break;
        }
        tokio::time::sleep(step).await;
        waited += step;
    }
    drop(prometheus);
    assert_eq!(
        last,
        Some(23.0),
        "Prometheus did not report kv_curr_items{{bucket=\"default\"}} = 23 within {PROMETHEUS_DEADLINE:?}"
    );
}
