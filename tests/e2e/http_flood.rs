//! The HTTP listeners stay reachable under a connection flood (issue 38, "the management
//! port must stay reachable"): idle and half-open connections from many loopback addresses
//! fill the management listener, and an authenticated request from yet another address is
//! still answered; one address is held to its limit; a client that never finishes its
//! headers is closed by the header timeout. The counters on the metrics page say what the
//! limits did.

use crate::harness::{ADMIN, Server, admin_args, http_request, skip_if_external};
use crate::metrics::{metrics_addr, series_value};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// Connections of each kind (idle, half-open) in the flood.
const FLOOD_PER_KIND: usize = 1000;

/// Flood connections opened from each source address (below the per-address limit, so the
/// flood reaches the listener's cap rather than the per-address one).
const FLOOD_PER_ADDRESS: usize = 10;

/// The bound on any single network step of these tests, and on the whole flood.
const STEP_DEADLINE: Duration = Duration::from_secs(10);
const FLOOD_DEADLINE: Duration = Duration::from_secs(120);

/// The request line and one header, without the blank line that would end the headers.
const HALF_REQUEST: &[u8] = b"GET /pools HTTP/1.1\r\nHost: x\r\n";

/// How much the server's resident memory may grow under the flood.
const RSS_GROWTH_BOUND: u64 = 200 << 20;

/// Raises this process's soft open-file limit towards `want` (up to the hard limit): the
/// flood holds two thousand sockets, more than the common default of 1024.
fn raise_open_file_limit(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) != 0 {
            return;
        }
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const lim);
        }
    }
}

/// Connects to `to` from `source` (any address of 127.0.0.0/8 works on loopback).
async fn connect_from(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    tokio::time::timeout(STEP_DEADLINE, socket.connect(to))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

/// `GET path` with Basic credentials from `source` (`Connection: close`); the status and
/// body.
async fn get_from(source: Ipv4Addr, to: SocketAddr, path: &str) -> (u16, String) {
    use base64::Engine as _;
    let step = async {
        let mut s = connect_from(source, to).await.expect("connect");
        let auth =
            base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", ADMIN.0, ADMIN.1));
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {to}\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("send the request");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read the reply");
        raw
    };
    let raw = tokio::time::timeout(STEP_DEADLINE, step)
        .await
        .unwrap_or_else(|_| panic!("GET {path} was not answered within {STEP_DEADLINE:?}"));
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete reply: {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    (status, body.to_owned())
}

/// The value of `series` on the metrics page (scraped as the admin).
fn metric(server: &Server, series: &str) -> f64 {
    let page = http_request(metrics_addr(server), "GET", "/metrics", Some(ADMIN), None);
    assert_eq!(page.status, 200, "{}", page.body);
    series_value(&page.body, series).unwrap_or_else(|| panic!("no {series} in the scrape"))
}

/// Polls `series` until its value satisfies `done`, and returns that value; fails the
/// test when it does not within [`STEP_DEADLINE`].
async fn wait_for_metric(server: &Server, series: &str, done: impl Fn(f64) -> bool) -> f64 {
    let start = Instant::now();
    loop {
        let v = metric(server, series);
        if done(v) {
            return v;
        }
        assert!(
            start.elapsed() <= STEP_DEADLINE,
            "{series} is still {v} after {STEP_DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `n`th flood source of a kind: 127.0.`subnet`.1, .2, ... with
/// [`FLOOD_PER_ADDRESS`] connections each.
fn flood_source(subnet: u8, n: usize) -> Ipv4Addr {
    let host = u8::try_from(1 + n / FLOOD_PER_ADDRESS).expect("fewer than 255 sources");
    Ipv4Addr::new(127, 0, subnet, host)
}

#[tokio::test]
async fn http_flood_of_idle_and_half_open_connections_leaves_an_authenticated_request_answered() {
    if skip_if_external("http_flood") {
        return;
    }
    raise_open_file_limit(4 * FLOOD_PER_KIND as u64 + 256);
    // Timeouts far beyond the test's length: the flood's connections stay open, so the
    // listener is full when the request comes and only the reserve lets it in.
    let mut args = admin_args();
    args.extend([
        "--metrics-port",
        "0",
        "--http-header-timeout",
        "600",
        "--http-idle-timeout",
        "600",
    ]);
    let server = Server::spawn(&args);
    let mgmt = server.mgmt_addr();
    let before = get_from(Ipv4Addr::new(127, 0, 3, 1), mgmt, "/pools/default").await;
    assert_eq!(before.0, 200, "{}", before.1);
    let rss_before = server.rss_bytes().expect("the server's VmRSS");

    let flood_start = Instant::now();
    let mut flood = Vec::with_capacity(2 * FLOOD_PER_KIND);
    let (mut idle, mut half_open, mut failed) = (0, 0, 0);
    for n in 0..FLOOD_PER_KIND {
        assert!(
            flood_start.elapsed() < FLOOD_DEADLINE,
            "the flood took too long"
        );
        match connect_from(flood_source(1, n), mgmt).await {
            Ok(s) => {
                idle += 1;
                flood.push(s);
            }
            Err(_) => failed += 1,
        }
        match connect_from(flood_source(2, n), mgmt).await {
            Ok(mut s) => {
                // The server may have evicted it already; a failed write is part of that.
                let _ = s.write_all(HALF_REQUEST).await;
                half_open += 1;
                flood.push(s);
            }
            Err(_) => failed += 1,
        }
    }
    println!(
        "flood: {idle} idle and {half_open} half-open connections opened ({failed} failed) in {:?}",
        flood_start.elapsed()
    );
    assert!(
        idle + half_open >= FLOOD_PER_KIND,
        "most flood connections must reach the server: {idle} idle, {half_open} half-open"
    );

    let asked = Instant::now();
    let (status, body) = get_from(Ipv4Addr::new(127, 0, 3, 2), mgmt, "/pools/default").await;
    let latency = asked.elapsed();
    println!("authenticated GET /pools/default under the flood answered {status} in {latency:?}");
    assert_eq!(status, 200, "{body}");
    let pools: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(pools["nodes"].is_array(), "{body}");

    let rss_after = server.rss_bytes().expect("the server's VmRSS");
    println!(
        "server RSS: {} KiB before the flood, {} KiB after",
        rss_before >> 10,
        rss_after >> 10
    );
    assert!(
        rss_after < rss_before + RSS_GROWTH_BOUND,
        "RSS grew from {rss_before} to {rss_after} bytes"
    );

    let evicted = metric(
        &server,
        "kv_http_evicted_connections_total{listener=\"mgmt\"}",
    );
    println!("evicted: {evicted}");
    assert!(evicted > 0.0, "a full listener evicts flood connections");
    let open = metric(&server, "kv_http_curr_connections{listener=\"mgmt\"}");
    assert!(open <= 256.0, "{open} connections open, above the cap");
    drop(flood);
}

#[tokio::test]
async fn http_flood_from_one_address_is_held_to_the_per_address_limit() {
    if skip_if_external("http_flood_per_address") {
        return;
    }
    let mut args = admin_args();
    args.extend([
        "--metrics-port",
        "0",
        "--http-max-connections-per-address",
        "4",
    ]);
    let server = Server::spawn(&args);
    let mgmt = server.mgmt_addr();
    let source = Ipv4Addr::new(127, 0, 4, 1);
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(connect_from(source, mgmt).await.expect("connect"));
    }
    let series = "kv_http_rejected_connections_total{listener=\"mgmt\",reason=\"per_address\"}";
    assert_eq!(wait_for_metric(&server, series, |n| n >= 6.0).await, 6.0);
    // The refused ones were closed: each reads end-of-file or a reset at once.
    let mut closed = 0;
    for s in &mut held[4..] {
        let mut byte = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(STEP_DEADLINE, s.read(&mut byte)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 6);
    // Another address is served, and so is this one once it closes its connections.
    let (status, _) = get_from(Ipv4Addr::new(127, 0, 4, 2), mgmt, "/pools").await;
    assert_eq!(status, 200);
    drop(held);
    let open = "kv_http_curr_connections{listener=\"mgmt\"}";
    wait_for_metric(&server, open, |n| n <= 1.0).await;
    let (status, _) = get_from(source, mgmt, "/pools").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn http_flood_half_request_is_closed_by_the_header_timeout() {
    if skip_if_external("http_flood_header_timeout") {
        return;
    }
    let mut args = admin_args();
    args.extend(["--metrics-port", "0", "--http-header-timeout", "1"]);
    let server = Server::spawn(&args);
    let mgmt = server.mgmt_addr();
    let mut s = connect_from(Ipv4Addr::new(127, 0, 5, 1), mgmt)
        .await
        .expect("connect");
    s.write_all(HALF_REQUEST)
        .await
        .expect("send half a request");
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(STEP_DEADLINE, s.read(&mut buf))
        .await
        .expect("the server closes a connection that never finishes its headers");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed without a reply: {read:?}"
    );
    let series = "kv_http_timed_out_connections_total{listener=\"mgmt\",reason=\"header\"}";
    assert_eq!(wait_for_metric(&server, series, |n| n >= 1.0).await, 1.0);
}
