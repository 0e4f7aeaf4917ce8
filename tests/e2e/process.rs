//! The server process: connection limit, idle timeout, signals, port errors, config file.

use crate::harness::{Server, parse_listening_line, server_binary, skip_if_external};
use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

#[tokio::test]
async fn connections_over_the_limit_are_closed_and_counted() {
    if skip_if_external("connection_limit") {
        return;
    }
    let server = Server::spawn(&["--max-connections", "3"]);
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = server.client().await;
        c.noop().await.unwrap();
        held.push(c);
    }
    for _ in 0..3 {
        let mut c = server.client().await;
        c.wait_closed().await.unwrap();
    }
    let stats: HashMap<String, String> = held[0].stat("").await.unwrap().into_iter().collect();
    assert_eq!(stats["max_connections"], "3");
    assert_eq!(stats["rejected_conns"], "3");
    assert_eq!(stats["curr_connections"], "3");
    // Closing one frees a slot (the server sees the close asynchronously: retry, bounded).
    drop(held.pop());
    let mut served = false;
    for _ in 0..200 {
        let mut c = server.client().await;
        if c.noop().await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(served, "no slot became free after a client left");
}

#[tokio::test]
async fn idle_connections_are_closed_when_configured() {
    if skip_if_external("idle_timeout") {
        return;
    }
    let server = Server::spawn(&["--idle-timeout", "1"]);
    let mut c = server.client().await;
    c.noop().await.unwrap();
    // No more requests: the server closes it (the client waits at most its timeout).
    c.wait_closed().await.unwrap();
    let mut fresh = server.client().await;
    fresh.noop().await.unwrap();
}

#[tokio::test]
async fn sigterm_shuts_down_gracefully_with_exit_code_zero() {
    if skip_if_external("sigterm") {
        return;
    }
    let server = Server::spawn(&["--log-level", "info"]);
    let mut c = server.client().await;
    c.noop().await.unwrap();
    let (status, stderr) = server.terminate();
    assert!(
        status.success(),
        "exit status {status:?}; stderr:\n{stderr}"
    );
    assert!(stderr.contains("SIGTERM"), "stderr:\n{stderr}");
    assert!(
        c.wait_closed().await.is_ok(),
        "the connection is closed at shutdown"
    );
}

#[tokio::test]
async fn a_port_in_use_is_a_one_line_error_and_a_failure_exit() {
    if skip_if_external("port_in_use") {
        return;
    }
    let first = Server::spawn(&[]);
    let port = first.addr.port().to_string();
    let second = Server::spawn_exact_expecting_failure(&["--port", &port]);
    let (status, stderr) = second;
    assert!(!status.success());
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "stderr:\n{stderr}");
    assert!(errors[0].contains("already in use"), "stderr:\n{stderr}");
    let mut c = first.client().await;
    c.noop().await.unwrap();
}

#[tokio::test]
async fn settings_come_from_a_toml_file_and_flags_win() {
    if skip_if_external("config_file") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("epkv-e2e-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("epkv.toml");
    std::fs::write(
        &file,
        "max-connections = 7\nthreads = 3\nmemory_quota = \"64MiB\"\nport = 1\n",
    )
    .unwrap();
    let file_arg = file.to_str().unwrap();
    let server = Server::spawn_exact(&["--config", file_arg, "--threads", "2", "--port", "0"]);
    let mut c = server.client().await;
    let stats: HashMap<String, String> = c.stat("").await.unwrap().into_iter().collect();
    assert_eq!(stats["max_connections"], "7", "from the file");
    assert_eq!(stats["threads"], "2", "the flag wins over the file");
    let mem: HashMap<String, String> = c.stat("memory").await.unwrap().into_iter().collect();
    assert_eq!(mem["ep_max_size"], (64u64 << 20).to_string());

    std::fs::write(&file, "no-such-setting = 1\n").unwrap();
    let (status, stderr) =
        Server::spawn_exact_expecting_failure(&["--config", file_arg, "--port", "0"]);
    assert!(!status.success());
    assert!(stderr.contains("unknown setting"), "stderr:\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn persistence_is_on_by_default_and_memory_only_writes_nothing() {
    if skip_if_external("persistence_default") {
        return;
    }
    let server = Server::spawn(&[]);
    let dir = server.data_dir().unwrap().to_owned();
    assert!(
        server
            .listening_line
            .contains(&format!("data {}", dir.display())),
        "{}",
        server.listening_line
    );
    assert!(
        dir.join("default").is_dir(),
        "the bucket's directory exists"
    );
    drop(server);

    let server = Server::spawn(&["--persistence", "false"]);
    assert!(
        server.listening_line.contains("memory only"),
        "{}",
        server.listening_line
    );
    let mut c = server.client().await;
    c.set(b"k", b"v", epkv_client::StoreOptions::new())
        .await
        .unwrap();
    let persistence: HashMap<String, String> =
        c.stat("vbucket-seqno").await.unwrap().into_iter().collect();
    let vb = epkv_types::vbucket_for_key(b"k", epkv_types::NUM_VBUCKETS).0;
    assert_eq!(persistence[&format!("vb_{vb}:last_persisted_seqno")], "0");
    assert!(
        !server.data_dir().unwrap().exists(),
        "a memory-only server creates nothing under --data-dir"
    );
}

#[test]
fn print_settings_lists_every_flag() {
    let out = Command::new(server_binary())
        .arg("--print-settings")
        .output()
        .unwrap();
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--port",
        "--bind",
        "--threads",
        "--memory-quota",
        "--data-dir",
        "--max-connections",
        "--flush-enabled",
        "--idle-timeout",
        "--max-packet-size",
        "--persistence",
    ] {
        assert!(
            table.contains(&format!("`{flag}`")),
            "missing {flag}:\n{table}"
        );
    }
}

#[test]
fn the_listening_line_is_parsed() {
    let addr = parse_listening_line(
        "epkv listening on 127.0.0.1:4242 (bucket \"default\", data ./epkv-data)",
    );
    assert_eq!(addr.port(), 4242);
}
