//! Failing logins cannot stall the server (issue 19): a storm of wrong PLAIN passwords
//! and bad SCRAM proofs from several connections is checked on a pool thread, throttled
//! by source address and closed per connection, while an authenticated client keeps
//! being answered and a correct login from another address goes through undelayed.
//! Behaviour only: no timing is asserted (the benchmark measures latency).

use crate::harness::{Server, skip_if_external};
use crate::scram::{ScramOutcome, scram_sha512};
use epkv_client::{Client, ClientConfig};
use epkv_protocol::Status;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const ADMIN: (&str, &str) = ("storm-admin", "the right password");

/// A client from `source` (any 127/8 address reaches a loopback listener on Linux), with
/// no client timeout: a throttled attempt may wait seconds.
async fn client_from(source: &str, server: SocketAddr) -> std::io::Result<Client> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(format!("{source}:0").parse().unwrap())?;
    let stream = sock.connect(server).await?;
    stream.set_nodelay(true)?;
    Ok(Client::from_stream(stream, ClientConfig::default()))
}

async fn stats(c: &mut Client) -> HashMap<String, u64> {
    c.stat("")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k, v)))
        .collect()
}

/// Loops failing logins until `stop`, reconnecting whenever the server closes the
/// connection; counts the refusals it got.
async fn attacker(addr: SocketAddr, scram: bool, stop: Arc<AtomicBool>, refused: Arc<AtomicU64>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut c) = client_from("127.0.0.1", addr).await else {
            return;
        };
        while !stop.load(Ordering::Relaxed) {
            let status = if scram {
                match scram_sha512(&mut c, ADMIN.0, "a wrong password").await {
                    ScramOutcome::Refused(s) => s,
                    ScramOutcome::Authenticated => panic!("a wrong SCRAM password was accepted"),
                }
            } else {
                match c
                    .sasl_auth("PLAIN", b"\0storm-admin\0a wrong password")
                    .await
                {
                    Ok(r) => r.status(),
                    // Closed after too many failures: connect again.
                    Err(_) => break,
                }
            };
            match status {
                Some(Status::AuthError) => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                None => break,
                other => panic!("a wrong password got {other:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_failing_logins_is_throttled_and_stalls_nobody() {
    if skip_if_external("auth_storm") {
        return;
    }
    let server = Server::spawn(&["--admin-user", ADMIN.0, "--admin-password", ADMIN.1]);
    let addr = server.addr;
    // The victim logs in first, from the same address the attackers will use.
    let mut victim = client_from("127.0.0.1", addr).await.unwrap();
    victim.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(victim.select_bucket("default").await.unwrap().is_success());
    let set = victim
        .set(b"victim", b"still served", epkv_client::StoreOptions::new())
        .await
        .unwrap();
    assert!(set.is_success());

    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let attackers: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(attacker(
                addr,
                i >= 4,
                Arc::clone(&stop),
                Arc::clone(&refused),
            ))
        })
        .collect();
    // The victim's requests keep being answered, correctly, throughout the storm.
    let storm = tokio::time::Instant::now();
    let mut answered = 0u64;
    while storm.elapsed() < Duration::from_secs(3) {
        let r = victim.get(b"victim").await.unwrap();
        assert!(r.is_success(), "{r:?}");
        assert_eq!(r.value.as_ref(), b"still served");
        answered += 1;
    }
    assert!(answered > 0);
    // A correct login from another address is not delayed by this one's failures...
    let before = stats(&mut victim).await;
    let mut elsewhere = client_from("127.0.0.2", addr).await.unwrap();
    elsewhere.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    let during = stats(&mut victim).await;
    assert_eq!(
        during["auth_throttled"], before["auth_throttled"],
        "a login from another source waited"
    );
    // ...and SCRAM from there works too.
    let mut scram_elsewhere = client_from("127.0.0.2", addr).await.unwrap();
    assert_eq!(
        scram_sha512(&mut scram_elsewhere, ADMIN.0, ADMIN.1).await,
        ScramOutcome::Authenticated
    );
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        // An attacker may be waiting out a delay of seconds: no need to wait for it.
        a.abort();
    }
    let s = stats(&mut victim).await;
    eprintln!(
        "storm: victim answered {answered} GETs; attackers refused {} times; auth_cmds {} \
         auth_errors {} auth_throttled {} auth_throttle_closes {}",
        refused.load(Ordering::Relaxed),
        s["auth_cmds"],
        s["auth_errors"],
        s["auth_throttled"],
        s["auth_throttle_closes"]
    );
    assert!(refused.load(Ordering::Relaxed) > 0);
    assert!(s["auth_errors"] >= refused.load(Ordering::Relaxed));
    assert!(
        s["auth_throttled"] > 0,
        "the failing source was made to wait"
    );
    // One connection failing five times in a row (from a fresh source) is closed.
    let mut persistent = client_from("127.0.0.3", addr).await.unwrap();
    for i in 0..5 {
        let r = persistent
            .sasl_auth("PLAIN", b"\0storm-admin\0a wrong password")
            .await
            .unwrap();
        assert_eq!(r.status(), Some(Status::AuthError), "attempt {i}");
    }
    persistent.wait_closed().await.unwrap();
    let closes = stats(&mut victim).await["auth_throttle_closes"];
    assert_eq!(closes, s["auth_throttle_closes"] + 1);
    // The failing source is still throttled, but a correct login from it gets through
    // once its delay is over.
    let mut same_source = client_from("127.0.0.1", addr).await.unwrap();
    same_source.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    let after = stats(&mut victim).await;
    assert!(after["auth_throttled"] > s["auth_throttled"]);
}
