//! `cargo xtask bench auth`: an authenticated client's latency while others loop failing
//! SASL PLAIN logins (issue 19), against the same client's latency with nobody else
//! connected, in the same run.
//!
//! One epkv-server (memory-only, one admin user). The victim authenticates with PLAIN,
//! selects `default` and times NOOP round trips one at a time for `secs` seconds:
//!
//! - `quiet` and, last, `quiet-after`: nobody else connected (the better of the two
//!   p99s is the baseline: an idle 2-core VM answers the first phase slower);
//! - `storm-one-source`: `attackers` connections from 127.0.0.1 loop SASL_AUTH PLAIN with a
//!   wrong password, reconnecting when the server closes them (the storm);
//! - `storm-many-sources`: the same, but every connection comes from a new loopback
//!   address (127.1.x.y) and reconnects after three failures, so that no source is ever
//!   throttled: every attempt costs the server a password derivation, and only the pool
//!   keeps it off the front-end threads.
//!
//! Each storm row gives its p99 against the quiet p99 (goal: at most 5x), the attempts
//! the attackers got answered per second, and the server's CPU. JSON rows go to
//! `target/bench/auth.json`, the table to `target/bench/auth.md`.

use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use epkv_protocol::{Opcode, Status};
use serde_json::{Value, json};

use crate::bench_memory::wire::BinClient;
use crate::memcapable::tempdir;
use crate::process::{self, ServerProcess};
use crate::util::{self, Stopwatch};

const USER: &str = "bench-admin";
const PASSWORD: &str = "the right password";

/// `cargo xtask bench auth` options.
#[derive(Debug, clap::Args)]
pub(crate) struct AuthOptions {
    /// Shorter phases (3 s instead of 10).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Seconds of each phase.
    #[arg(long)]
    pub(crate) secs: Option<u64>,
    /// Attacking connections.
    #[arg(long, default_value_t = 4)]
    pub(crate) attackers: usize,
    /// Use this epkv-server binary instead of building target/release/epkv-server.
    #[arg(long)]
    pub(crate) epkv_bin: Option<PathBuf>,
}

/// Latency percentiles in microseconds, with the sample count.
#[derive(Debug, Clone, Copy)]
struct Latency {
    count: usize,
    p50_us: f64,
    p99_us: f64,
}

fn latency(mut us: Vec<f64>) -> Latency {
    us.sort_by(f64::total_cmp);
    let pct = |q: f64| crate::bench_memory::percentile(&us, q);
    Latency {
        count: us.len(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

/// One phase's figures.
#[derive(Debug, Clone)]
struct Phase {
    name: &'static str,
    victim: Latency,
    /// Failed logins the attackers got answered, per second.
    refused_per_sec: f64,
    /// Server CPU over the phase, in percent of one core.
    server_cpu_pct: f64,
}

/// Authenticates `c` with PLAIN; returns the status.
fn plain(c: &mut BinClient, user: &str, password: &str) -> Result<u16> {
    let data = format!("\0{user}\0{password}");
    c.queue(Opcode::SaslAuth, b"PLAIN", b"", data.as_bytes(), 1)?;
    c.flush()?;
    Ok(c.recv()?.status)
}

/// A connection from `source` (bound before connecting) to `addr`.
fn connect_from(source: Ipv4Addr, addr: &str) -> Result<TcpStream> {
    let target: std::net::SocketAddr = addr.parse().context("server address")?;
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&SocketAddrV4::new(source, 0).into())
        .with_context(|| format!("bind {source}"))?;
    sock.connect(&target.into())
        .with_context(|| format!("connect {addr} from {source}"))?;
    Ok(sock.into())
}

/// Loops failing logins until `stop`. With `many_sources`, each connection comes from
/// a new address and makes three attempts (never throttled); else all come from
/// 127.0.0.1 and reconnect only when closed.
fn attacker(
    id: usize,
    addr: String,
    many_sources: bool,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
) {
    let mut next = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let source = if many_sources {
            next += 1;
            // 127.1.0.0/16 per attacker slice: never the victim's 127.0.0.1.
            let n = (id as u32) << 12 | (next & 0xfff);
            Ipv4Addr::new(127, 1, (n >> 8) as u8, (n & 0xff) as u8)
        } else {
            Ipv4Addr::LOCALHOST
        };
        let Ok(stream) = connect_from(source, &addr) else {
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let mut c = BinClient::from_stream(stream);
        let mut attempts = 0;
        while !stop.load(Ordering::Relaxed) && (!many_sources || attempts < 3) {
            attempts += 1;
            if c.queue(Opcode::SaslAuth, b"PLAIN", b"", b"\0bench-admin\0wrong", 1)
                .and_then(|()| c.flush())
                .is_err()
            {
                break;
            }
            // A throttled attempt may wait seconds: keep polling until answered or stopped.
            let reply = loop {
                match c.recv() {
                    Ok(r) => break Some(r),
                    Err(e)
                        if e.downcast_ref::<std::io::Error>().is_some_and(|io| {
                            matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
                        }) && !stop.load(Ordering::Relaxed) =>
                    {
                        continue;
                    }
                    Err(_) => break None,
                }
            };
            match reply {
                Some(r) if r.status == Status::AuthError.as_u16() => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                _ => break,
            }
        }
    }
}

/// Times NOOP round trips on `victim` for `secs`.
fn victim_noops(victim: &mut BinClient, secs: u64) -> Result<Vec<f64>> {
    let mut us = Vec::new();
    let watch = Stopwatch::start();
    while watch.elapsed() < Duration::from_secs(secs) {
        let t0 = Stopwatch::start();
        victim.queue(Opcode::Noop, b"", b"", b"", 7)?;
        victim.flush()?;
        let r = victim.recv()?;
        if r.status != 0 {
            bail!("victim NOOP answered {:#x}", r.status);
        }
        us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(us)
}

fn phase(
    name: &'static str,
    server: &ServerProcess,
    victim: &mut BinClient,
    storm: Option<(usize, bool)>,
    secs: u64,
) -> Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    if let Some((n, many)) = storm {
        for id in 0..n {
            let (addr, stop, refused) = (server.addr(), Arc::clone(&stop), Arc::clone(&refused));
            threads.push(thread::spawn(move || {
                attacker(id, addr, many, stop, refused)
            }));
        }
        // Let the storm start before measuring.
        thread::sleep(Duration::from_millis(300));
    }
    let ticks0 = process::cpu_ticks(server.pid())?;
    let refused0 = refused.load(Ordering::Relaxed);
    let watch = Stopwatch::start();
    let us = victim_noops(victim, secs)?;
    let elapsed = watch.elapsed().as_secs_f64();
    let ticks = process::cpu_ticks(server.pid())?.saturating_sub(ticks0);
    let refused_n = refused.load(Ordering::Relaxed) - refused0;
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Ok(Phase {
        name,
        victim: latency(us),
        refused_per_sec: refused_n as f64 / elapsed,
        server_cpu_pct: ticks as f64 / process::clock_ticks_per_sec() as f64 / elapsed * 100.0,
    })
}

/// Runs the bench and writes its report.
pub(crate) fn bench_auth(opts: &AuthOptions) -> Result<()> {
    let bin = process::release_server_bin(opts.epkv_bin.as_ref())?;
    let secs = opts.secs.unwrap_or(if opts.quick { 3 } else { 10 }).max(1);
    let out_dir = util::target_dir().join("bench");
    std::fs::create_dir_all(&out_dir)?;
    let data = tempdir("bench-auth")?;
    let args: Vec<String> = [
        "--persistence",
        "false",
        "--admin-user",
        USER,
        "--admin-password",
        PASSWORD,
        "--data-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([data.path().display().to_string()])
    .collect();
    let server = ServerProcess::start_epkv(&bin, &args, out_dir.join("auth-epkv.log"))?;
    let mut victim = BinClient::connect(&server.addr(), true)?;
    let status = plain(&mut victim, USER, PASSWORD)?;
    if status != 0 {
        bail!("the victim could not authenticate: {status:#x}");
    }
    victim.queue(Opcode::SelectBucket, b"default", b"", b"", 2)?;
    victim.flush()?;
    if victim.recv()?.status != 0 {
        bail!("the victim could not select default");
    }
    let mut phases = vec![phase("quiet", &server, &mut victim, None, secs)?];
    phases.push(phase(
        "storm-one-source",
        &server,
        &mut victim,
        Some((opts.attackers, false)),
        secs,
    )?);
    phases.push(phase(
        "storm-many-sources",
        &server,
        &mut victim,
        Some((opts.attackers, true)),
        secs,
    )?);
    phases.push(phase("quiet-after", &server, &mut victim, None, secs)?);
    let stats = victim.stats("")?;
    crate::bench_memory::stop(server);
    drop(data);

    let quiet_p99 = phases
        .iter()
        .filter(|p| p.name.starts_with("quiet"))
        .map(|p| p.victim.p99_us)
        .fold(f64::INFINITY, f64::min);
    let mut rows: Vec<Value> = Vec::new();
    let mut md = String::from(
        "### Authentication storm\n\n| phase | victim NOOP p50 | p99 | p99 / quiet p99 | \
         failed logins answered/s | server CPU |\n|---|---:|---:|---:|---:|---:|\n",
    );
    for p in &phases {
        let ratio = p.victim.p99_us / quiet_p99;
        rows.push(json!({
            "bench": "auth/victim_noop",
            "params": {"phase": p.name, "attackers": opts.attackers, "secs": secs},
            "impl": "epkv",
            "items_per_sec": 1e6 / p.victim.p50_us,
            "ns_per_op": p.victim.p50_us * 1e3,
            "p50_us": p.victim.p50_us,
            "p99_us": p.victim.p99_us,
            "samples": p.victim.count,
            "p99_ratio_vs_quiet": ratio,
            "refused_logins_per_sec": p.refused_per_sec,
            "server_cpu_pct": p.server_cpu_pct,
        }));
        md.push_str(&format!(
            "| {} | {:.0} us | {:.0} us | {:.2}x | {:.0} | {:.0}% |\n",
            p.name, p.victim.p50_us, p.victim.p99_us, ratio, p.refused_per_sec, p.server_cpu_pct
        ));
    }
    let stat = |k: &str| stats.get(k).map_or("?", String::as_str).to_owned();
    md.push_str(&format!(
        "\nServer counters at the end: auth_cmds {}, auth_errors {}, auth_throttled {}, \
         auth_throttle_closes {}, auth_busy {}. Ratios are to the better quiet p99 ({:.0} us). \
         Goal: each storm's p99 at most 5x the quiet p99.\n",
        stat("auth_cmds"),
        stat("auth_errors"),
        stat("auth_throttled"),
        stat("auth_throttle_closes"),
        stat("auth_busy"),
        quiet_p99,
    ));
    std::fs::write(
        out_dir.join("auth.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    std::fs::write(out_dir.join("auth.md"), &md)?;
    println!("\n{md}");
    Ok(())
}
