//! A client of a whole epkv cluster for the benches, over blocking sockets, as an SDK
//! behaves: it routes each key to the node holding its vBucket's active copy by the map
//! (`GET /pools/default/b/default`), learns a newer map from a NOT_MY_VBUCKET reply's
//! body (or asks REST again), and retries TMPFAIL, ENOMEM, BUSY and lost connections.
//! An operation's latency runs from its first send to its final success.
//!
//! On top of it: a pipelined loader ([`populate`]), a 90/10 GET/SET load, closed-loop or
//! paced at a fixed rate ([`Load`]), and a `STAT` reader ([`stats`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use epkv_protocol::{Opcode, RequestBuilder, Status};
use epkv_types::{NUM_VBUCKETS, Vbid, vbucket_for_key};
use serde_json::Value;

use crate::bench_elastic::{exchange, http, kv_connect, read_response};
use crate::util::Stopwatch;

/// How long one operation may keep retrying before the load fails.
const OP_DEADLINE: Duration = Duration::from_secs(30);
/// How long a reply may take on a load connection (a parked operation waits for its
/// vBucket's takeover, at most seconds).
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Per vBucket, the KV port of the node holding its active copy; and the map's revision.
#[derive(Debug, Clone)]
pub(crate) struct VbMap {
    rev: i64,
    ports: Vec<u16>,
}

impl VbMap {
    /// Reads a bucket config (REST's terse bucket, or a NOT_MY_VBUCKET body): `rev`,
    /// `vBucketServerMap.serverList` (`HOST:PORT`) and the first column of `vBucketMap`.
    pub(crate) fn parse(doc: &Value) -> Option<VbMap> {
        let map = &doc["vBucketServerMap"];
        let servers: Vec<u16> = map["serverList"]
            .as_array()?
            .iter()
            .map(|s| s.as_str()?.rsplit(':').next()?.parse().ok())
            .collect::<Option<_>>()?;
        let ports = map["vBucketMap"]
            .as_array()?
            .iter()
            .map(|row| {
                servers
                    .get(usize::try_from(row[0].as_i64()?).ok()?)
                    .copied()
            })
            .collect::<Option<Vec<u16>>>()?;
        (ports.len() == usize::from(NUM_VBUCKETS)).then(|| VbMap {
            rev: doc["rev"].as_i64().unwrap_or(0),
            ports,
        })
    }

    /// The KV port of vBucket `vb`'s active copy.
    pub(crate) fn port(&self, vb: u16) -> u16 {
        self.ports[usize::from(vb)]
    }
}

/// The map a load routes by, shared by its threads.
pub(crate) struct Router {
    map: RwLock<VbMap>,
    /// Management addresses (`HOST:PORT`) to read the map from.
    rest: Vec<String>,
}

impl Router {
    /// Reads the map from the first of `rest` that answers.
    pub(crate) fn new(rest: Vec<String>) -> Result<Router> {
        let map = fetch_map(&rest)?;
        Ok(Router {
            map: RwLock::new(map),
            rest,
        })
    }

    /// The current map.
    pub(crate) fn map(&self) -> VbMap {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn port(&self, vb: u16) -> u16 {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .port(vb)
    }

    /// Takes `map` unless the one held is newer.
    fn offer(&self, map: VbMap) {
        let mut held = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if map.rev >= held.rev {
            *held = map;
        }
    }

    /// After NOT_MY_VBUCKET: the map in its body when there is one, else REST's.
    fn learn(&self, body: &[u8]) {
        let from_body = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|d| VbMap::parse(&d));
        match from_body {
            Some(m) => self.offer(m),
            None => self.refresh(),
        }
    }

    /// Reads the map from REST again (ignored when no node answers).
    pub(crate) fn refresh(&self) {
        if let Ok(m) = fetch_map(&self.rest) {
            self.offer(m);
        }
    }
}

fn fetch_map(rest: &[String]) -> Result<VbMap> {
    for addr in rest {
        let Ok((200, body)) = http(addr, "GET", "/pools/default/b/default", "", true) else {
            continue;
        };
        if let Some(m) = serde_json::from_str(&body)
            .ok()
            .and_then(|d| VbMap::parse(&d))
        {
            return Ok(m);
        }
    }
    bail!("no node of {rest:?} served a vBucket map")
}

/// One operation's outcome.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Done {
    /// From the first send to the final success.
    pub(crate) latency: Duration,
    /// NOT_MY_VBUCKET replies it followed.
    pub(crate) redirects: u32,
    /// TMPFAIL-like replies and lost connections it retried.
    pub(crate) retries: u32,
}

/// One thread's connections to the cluster's nodes.
pub(crate) struct Session {
    router: Arc<Router>,
    conns: HashMap<u16, TcpStream>,
}

impl Session {
    pub(crate) fn new(router: Arc<Router>) -> Session {
        Session {
            router,
            conns: HashMap::new(),
        }
    }

    fn conn(&mut self, port: u16) -> Result<&mut TcpStream> {
        Ok(match self.conns.entry(port) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let s = kv_connect(port)?;
                s.set_read_timeout(Some(READ_TIMEOUT))?;
                e.insert(s)
            }
        })
    }

    /// Sends `req` (for vBucket `vb`) to the node of its active copy until it succeeds
    /// (KEY_ENOENT counts as success), following the map and retrying as an SDK does.
    pub(crate) fn run(&mut self, vb: u16, req: &[u8]) -> Result<Done> {
        let clock = Stopwatch::start();
        let (mut redirects, mut retries) = (0, 0);
        loop {
            if clock.elapsed() > OP_DEADLINE {
                bail!("an operation on vb {vb} did not succeed within {OP_DEADLINE:?}");
            }
            let port = self.router.port(vb);
            let answer = self.conn(port).and_then(|s| exchange(s, req));
            match answer {
                Ok((status, _))
                    if status == Status::Success as u16 || status == Status::KeyEnoent as u16 =>
                {
                    return Ok(Done {
                        latency: clock.elapsed(),
                        redirects,
                        retries,
                    });
                }
                Ok((status, body)) if status == Status::NotMyVbucket as u16 => {
                    redirects += 1;
                    self.router.learn(&body);
                    if self.router.port(vb) == port {
                        // The node still names itself (a map not yet committed): ask again
                        // shortly, and REST every tenth time.
                        if redirects % 10 == 0 {
                            self.router.refresh();
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                Ok((status, _))
                    if [Status::Etmpfail, Status::Enomem, Status::Ebusy]
                        .iter()
                        .any(|s| *s as u16 == status) =>
                {
                    retries += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok((status, body)) => bail!(
                    "vb {vb} on port {port} answered {status:#x}: {}",
                    String::from_utf8_lossy(&body)
                ),
                Err(_) => {
                    self.conns.remove(&port);
                    retries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

/// The key of item `i`.
pub(crate) fn key(i: u64) -> String {
    format!("bench-{i:010}")
}

/// The vBucket of `key`.
pub(crate) fn vb_of(key: &[u8]) -> u16 {
    vbucket_for_key(key, NUM_VBUCKETS).0
}

fn set_request(key: &[u8], vb: u16, value: &[u8]) -> Result<Vec<u8>> {
    Ok(RequestBuilder::new(Opcode::Set)
        .key(key)
        .extras(&[0; 8])
        .value(value)
        .vbucket(Vbid(vb))
        .to_vec()?)
}

/// A value of `len` bytes that does not compress (a fixed pseudo-random pattern).
pub(crate) fn value(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b'!' + (x % 90) as u8
        })
        .collect()
}

/// SETs keys `0..items` to `value` with `threads` threads, each sending batches of 256
/// pipelined per node; a write refused in a batch is retried alone.
pub(crate) fn populate(
    router: &Arc<Router>,
    items: u64,
    value: &[u8],
    threads: usize,
) -> Result<()> {
    const BATCH: u64 = 256;
    let threads = u64::try_from(threads.max(1))?;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let router = Arc::clone(router);
                scope.spawn(move || -> Result<()> {
                    let mut session = Session::new(Arc::clone(&router));
                    let mut i = t * BATCH;
                    while i < items {
                        let end = (i + BATCH).min(items);
                        let mut by_port: HashMap<u16, Vec<(u16, Vec<u8>)>> = HashMap::new();
                        for n in i..end {
                            let k = key(n);
                            let vb = vb_of(k.as_bytes());
                            by_port
                                .entry(router.port(vb))
                                .or_default()
                                .push((vb, set_request(k.as_bytes(), vb, value)?));
                        }
                        for (port, reqs) in by_port {
                            let refused = pipeline(&mut session, port, &reqs)?;
                            for (vb, req) in refused {
                                session.run(*vb, req)?;
                            }
                        }
                        i += BATCH * threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a loader panicked"))??;
        }
        Ok(())
    })
}

/// Sends `reqs` to `port` back to back, then reads their replies; returns the ones not
/// answered with success (all of them when the connection failed).
fn pipeline<'r>(
    session: &mut Session,
    port: u16,
    reqs: &'r [(u16, Vec<u8>)],
) -> Result<Vec<&'r (u16, Vec<u8>)>> {
    let mut wire = Vec::with_capacity(reqs.iter().map(|(_, r)| r.len()).sum());
    for (_, r) in reqs {
        wire.extend_from_slice(r);
    }
    let sent = session.conn(port).and_then(|s| {
        s.write_all(&wire)?;
        (0..reqs.len())
            .map(|_| Ok(read_response(s)?.0))
            .collect::<Result<Vec<u16>>>()
    });
    match sent {
        Ok(statuses) => Ok(reqs
            .iter()
            .zip(statuses)
            .filter(|(_, st)| *st != Status::Success as u16)
            .map(|(r, _)| r)
            .collect()),
        Err(_) => {
            session.conns.remove(&port);
            Ok(reqs.iter().collect())
        }
    }
}

/// One operation of a [`Load`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    /// When it was first sent, in seconds since the load started.
    pub(crate) at: f64,
    /// From its first send to its success, µs.
    pub(crate) latency_us: u64,
    /// From when the pacing schedule wanted it sent to its success, µs (the latency plus
    /// the time its thread was behind schedule; the latency itself when closed-loop).
    pub(crate) scheduled_us: u64,
    pub(crate) vb: u16,
    /// Whether it followed a NOT_MY_VBUCKET.
    pub(crate) redirected: bool,
    pub(crate) retries: u32,
}

/// What a [`Load`] does.
#[derive(Debug, Clone)]
pub(crate) struct LoadSpec {
    /// Keys `0..items` are read and written.
    pub(crate) items: u64,
    pub(crate) value: Arc<Vec<u8>>,
    /// GETs among the operations (the rest are SETs).
    pub(crate) get_fraction: f64,
    /// Threads, one operation in flight each.
    pub(crate) threads: usize,
    /// Operations per second over all threads, each paced on its own fixed schedule;
    /// `None` sends as fast as replies come (closed loop).
    pub(crate) rate: Option<f64>,
}

/// A running 90/10-style load on its own threads.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    clock: Stopwatch,
    threads: Vec<JoinHandle<Result<Vec<Sample>>>>,
}

impl Load {
    /// Starts `spec.threads` threads routing by `router`.
    pub(crate) fn start(router: &Arc<Router>, spec: &LoadSpec) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let clock = Stopwatch::start();
        let per_thread = spec.rate.map(|r| r / spec.threads.max(1) as f64);
        let threads = (0..spec.threads)
            .map(|t| {
                let (router, stop, spec) = (Arc::clone(router), Arc::clone(&stop), spec.clone());
                std::thread::spawn(move || worker(&router, &spec, per_thread, t, &stop, clock))
            })
            .collect();
        Load {
            stop,
            clock,
            threads,
        }
    }

    /// Seconds since the load started (the clock of [`Sample::at`]).
    pub(crate) fn now(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// Stops the threads and returns every operation they completed.
    pub(crate) fn finish(self) -> Result<Vec<Sample>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.threads {
            all.extend(
                t.join()
                    .map_err(|_| anyhow::anyhow!("a load thread panicked"))??,
            );
        }
        Ok(all)
    }
}

fn worker(
    router: &Arc<Router>,
    spec: &LoadSpec,
    rate: Option<f64>,
    t: usize,
    stop: &AtomicBool,
    clock: Stopwatch,
) -> Result<Vec<Sample>> {
    let mut session = Session::new(Arc::clone(router));
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ (u64::try_from(t)? + 1).wrapping_mul(0x9e37_79b9);
    let mut next = |bound: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % bound
    };
    let mut out = Vec::new();
    // Each thread starts at a different point of its period, so the threads do not send
    // in lockstep.
    let mut due = rate.map_or(0.0, |r| t as f64 / spec.threads.max(1) as f64 / r);
    while !stop.load(Ordering::Relaxed) {
        if rate.is_some() {
            let wait = due - clock.elapsed().as_secs_f64();
            if wait > 0.0 {
                std::thread::sleep(Duration::from_secs_f64(wait));
            }
        }
        let k = key(next(spec.items.max(1)));
        let vb = vb_of(k.as_bytes());
        let get = (next(1_000_000) as f64) < spec.get_fraction * 1e6;
        let req = if get {
            RequestBuilder::new(Opcode::Get)
                .key(k.as_bytes())
                .vbucket(Vbid(vb))
                .to_vec()?
        } else {
            set_request(k.as_bytes(), vb, &spec.value)?
        };
        let at = clock.elapsed().as_secs_f64();
        let done = session
            .run(vb, &req)
            .with_context(|| format!("load thread {t}"))?;
        let latency_us = u64::try_from(done.latency.as_micros())?;
        let behind = if rate.is_some() {
            (at - due).max(0.0)
        } else {
            0.0
        };
        out.push(Sample {
            at,
            latency_us,
            scheduled_us: latency_us + (behind * 1e6) as u64,
            vb,
            redirected: done.redirects > 0,
            retries: done.retries,
        });
        if let Some(r) = rate {
            due += 1.0 / r;
        }
    }
    Ok(out)
}

/// `STAT group` of the `default` bucket on the node at `port`, as (key, value) pairs.
pub(crate) fn stats(port: u16, group: &str) -> Result<Vec<(String, String)>> {
    let mut s = kv_connect(port)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let req = RequestBuilder::new(Opcode::Stat)
        .key(group.as_bytes())
        .to_vec()?;
    s.write_all(&req)?;
    let mut out = Vec::new();
    loop {
        let mut head = [0u8; 24];
        std::io::Read::read_exact(&mut s, &mut head)?;
        let key_len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let extras = usize::from(head[4]);
        let status = u16::from_be_bytes([head[6], head[7]]);
        let body = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
        let mut b = vec![0u8; body];
        std::io::Read::read_exact(&mut s, &mut b)?;
        if status != 0 {
            bail!("STAT {group} on port {port} answered {status:#x}");
        }
        if key_len == 0 {
            return Ok(out);
        }
        let k = String::from_utf8_lossy(&b[extras..extras + key_len]).into_owned();
        let v = String::from_utf8_lossy(&b[extras + key_len..]).into_owned();
        out.push((k, v));
    }
}

/// The `q` quantile (0..=1) of sorted `v`; NaN when empty.
pub(crate) fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i.min(v.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_map_routes_by_the_first_column_and_keeps_the_newer_revision() {
        let rows: Vec<Value> = (0..NUM_VBUCKETS)
            .map(|v| json!([i64::from(v % 2), -1]))
            .collect();
        let doc = json!({"rev": 7, "vBucketServerMap": {
            "serverList": ["127.0.0.1:1000", "$HOST:2000"], "vBucketMap": rows}});
        let m = VbMap::parse(&doc).unwrap();
        assert_eq!((m.rev, m.port(0), m.port(1)), (7, 1000, 2000));
        let router = Router {
            map: RwLock::new(m.clone()),
            rest: Vec::new(),
        };
        router.offer(VbMap {
            rev: 6,
            ports: vec![9; usize::from(NUM_VBUCKETS)],
        });
        assert_eq!(router.port(0), 1000);
        router.offer(VbMap {
            rev: 8,
            ports: vec![9; usize::from(NUM_VBUCKETS)],
        });
        assert_eq!(router.port(0), 9);
        assert!(VbMap::parse(&json!({"vBucketServerMap": {}})).is_none());
    }

    #[test]
    fn quantiles_of_a_sorted_list() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
