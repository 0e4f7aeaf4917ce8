//! Authentication that cannot stall the server.
//!
//! Checking a SASL PLAIN password derives its salted hash (PBKDF2, thousands of rounds,
//! milliseconds of CPU). Done on the front-end thread that read the request, a few
//! clients looping wrong passwords would stall every other connection of that thread.
//! So:
//!
//! - **A small pool** ([`AuthGuard::run`]) of `auth_threads` threads (`epkv-auth-N`) does
//!   the derivations. The connection waits for the outcome without blocking its worker
//!   thread and executes nothing else meanwhile (replies stay in request order); the
//!   worker serves its other connections at full speed. The pool's queue is bounded: an
//!   attempt that finds it full is answered TMPFAIL (`auth_busy`).
//! - **Throttling by source address.** Each failed attempt (wrong password, unknown user,
//!   bad SCRAM proof) counts against the client's IP address. After
//!   [`FREE_FAILURES`] failures, the next attempt from that address waits: 100 ms after
//!   the last failure, doubling with each further failure up to [`MAX_DELAY`]
//!   (`auth_throttled` counts the attempts made to wait). The wait is a timer, not a
//!   thread. A source's count is forgotten [`FORGET_AFTER`] after its last failure.
//!   Other addresses are never delayed by it, so a correct login from elsewhere goes
//!   through at once.
//! - **Throttling by connection.** A connection that fails [`MAX_FAILURES_PER_CONNECTION`]
//!   attempts in a row is closed after the reply (`auth_throttle_closes`).
//! - **Audit.** Each failure is logged once, at warn level, with the user name claimed
//!   (inside `<ud>` tags), the source address and the mechanism; never the password.
//!   `auth_cmds` and `auth_errors` (memcached's names) count attempts and failures.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Failures from one address before its attempts are delayed.
pub(crate) const FREE_FAILURES: u32 = 3;
/// The first delay, after [`FREE_FAILURES`] failures; it doubles with each failure after.
const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest delay between two attempts from a failing address.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(5);
/// A source's failures are forgotten this long after its last one.
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Consecutive failures after which a connection is closed.
pub(crate) const MAX_FAILURES_PER_CONNECTION: u32 = 5;
/// Derivations waiting for a pool thread, at most.
const QUEUE_BOUND: usize = 1024;
/// Sources remembered at most; past this the longest-quiet ones are forgotten first.
const MAX_SOURCES: usize = 65_536;

/// A job for the pool.
type Job = Box<dyn FnOnce() + Send>;

/// Authentication counters (STAT default group).
#[derive(Debug, Default)]
pub(crate) struct AuthStats {
    /// SASL_AUTH requests.
    pub(crate) attempts: AtomicU64,
    /// Attempts refused (wrong credentials, unknown user or mechanism, bad proof).
    pub(crate) failures: AtomicU64,
    /// Attempts made to wait because their source had failed too often.
    pub(crate) throttled: AtomicU64,
    /// Connections closed after too many failures in a row.
    pub(crate) closes: AtomicU64,
    /// Attempts answered TMPFAIL because the pool's queue was full.
    pub(crate) busy: AtomicU64,
}

/// One source address's recent failures.
#[derive(Debug, Clone, Copy)]
struct Source {
    failures: u32,
    last_failure: Instant,
}

impl Source {
    /// When the next attempt from this source may start.
    fn next_allowed(&self) -> Instant {
        match self.failures.checked_sub(FREE_FAILURES) {
            None => self.last_failure,
            Some(extra) => {
                let delay = FIRST_DELAY
                    .checked_mul(1 << extra.min(16))
                    .map_or(MAX_DELAY, |d| d.min(MAX_DELAY));
                self.last_failure + delay
            }
        }
    }
}

/// The pool, the per-source failure counts and the counters; one per front end.
pub(crate) struct AuthGuard {
    jobs: Mutex<Option<mpsc::SyncSender<Job>>>,
    sources: Mutex<HashMap<IpAddr, Source>>,
    pub(crate) stats: AuthStats,
}

impl std::fmt::Debug for AuthGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthGuard")
            .field("sources", &self.sources.lock().len())
            .finish_non_exhaustive()
    }
}

impl AuthGuard {
    /// Starts `threads` pool threads (at least one).
    ///
    /// # Errors
    /// A thread could not be started.
    pub(crate) fn new(threads: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE_BOUND);
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = std::sync::Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("epkv-auth-{i}"))
                .spawn(move || {
                    loop {
                        // The lock is held only to take a job, never while running one.
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            // The guard is gone: the front end stopped.
                            Err(_) => return,
                        }
                    }
                })?;
        }
        Ok(Self {
            jobs: Mutex::new(Some(tx)),
            sources: Mutex::new(HashMap::new()),
            stats: AuthStats::default(),
        })
    }

    /// Runs `job` on a pool thread. Returns false (and drops it) when the queue is full.
    pub(crate) fn run(&self, job: impl FnOnce() + Send + 'static) -> bool {
        let sent = match &*self.jobs.lock() {
            Some(tx) => tx.try_send(Box::new(job)).is_ok(),
            None => false,
        };
        if !sent {
            self.stats.busy.fetch_add(1, Relaxed);
        }
        sent
    }

    /// Stops the pool: queued jobs still run, then the threads exit.
    pub(crate) fn stop(&self) {
        self.jobs.lock().take();
    }

    /// When an attempt from `ip` arriving at `now` may start: `None` for at once, else
    /// the moment its source's delay ends.
    pub(crate) fn admit(&self, ip: IpAddr, now: Instant) -> Option<Instant> {
        let mut sources = self.sources.lock();
        let source = *sources.get(&ip)?;
        if now.saturating_duration_since(source.last_failure) >= FORGET_AFTER {
            sources.remove(&ip);
            return None;
        }
        let at = source.next_allowed();
        (at > now).then_some(at)
    }

    /// Counts a failed attempt from `ip` at `now`.
    pub(crate) fn failed(&self, ip: IpAddr, now: Instant) {
        self.stats.failures.fetch_add(1, Relaxed);
        let mut sources = self.sources.lock();
        if sources.len() >= MAX_SOURCES && !sources.contains_key(&ip) {
            forget_quietest(&mut sources, now);
        }
        let s = sources.entry(ip).or_insert(Source {
            failures: 0,
            last_failure: now,
        });
        if now.saturating_duration_since(s.last_failure) >= FORGET_AFTER {
            s.failures = 0;
        }
        s.failures = s.failures.saturating_add(1);
        s.last_failure = s.last_failure.max(now);
    }
}

impl Drop for AuthGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Drops sources whose failures are forgotten anyway, or, if none, the quietest tenth.
fn forget_quietest(sources: &mut HashMap<IpAddr, Source>, now: Instant) {
    let before = sources.len();
    sources.retain(|_, s| now.saturating_duration_since(s.last_failure) < FORGET_AFTER);
    if sources.len() < before {
        return;
    }
    let mut by_age: Vec<(Instant, IpAddr)> = sources
        .iter()
        .map(|(ip, s)| (s.last_failure, *ip))
        .collect();
    by_age.sort_unstable();
    for (_, ip) in by_age.into_iter().take((before / 10).max(1)) {
        sources.remove(&ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }

    #[test]
    fn a_source_is_delayed_after_its_free_failures_doubling_up_to_the_cap() {
        let g = AuthGuard::new(1).unwrap();
        let t0 = epkv_executor::Clock::now(&epkv_executor::SystemClock);
        for _ in 0..FREE_FAILURES {
            assert_eq!(g.admit(ip(1), t0), None);
            g.failed(ip(1), t0);
        }
        // Three failures are free; then each attempt waits, 100 ms, then doubling.
        assert_eq!(g.admit(ip(1), t0), Some(t0 + FIRST_DELAY));
        g.failed(ip(1), t0);
        assert_eq!(g.admit(ip(1), t0), Some(t0 + FIRST_DELAY * 2));
        for _ in 0..20 {
            g.failed(ip(1), t0);
        }
        assert_eq!(g.admit(ip(1), t0), Some(t0 + MAX_DELAY));
        assert_eq!(g.admit(ip(1), t0 + MAX_DELAY), None, "the delay ends");
        // Another source is never delayed by it.
        assert_eq!(g.admit(ip(2), t0), None);
        // Forgotten after a quiet while.
        assert_eq!(g.admit(ip(1), t0 + FORGET_AFTER), None);
        g.failed(ip(1), t0 + FORGET_AFTER);
        assert_eq!(
            g.admit(ip(1), t0 + FORGET_AFTER),
            None,
            "counting starts over"
        );
        assert_eq!(g.stats.failures.load(Relaxed), 25);
    }

    #[test]
    fn the_pool_runs_jobs_and_refuses_when_stopped() {
        let g = AuthGuard::new(2).unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 0..10 {
            let tx = tx.clone();
            assert!(g.run(move || tx.send(i).unwrap()));
        }
        let mut got: Vec<i32> = (0..10)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        g.stop();
        assert!(!g.run(|| {}));
        assert_eq!(g.stats.busy.load(Relaxed), 1);
    }

    #[test]
    fn the_source_table_stays_bounded() {
        let mut sources = HashMap::new();
        let t0 = epkv_executor::Clock::now(&epkv_executor::SystemClock);
        for i in 0..100u32 {
            sources.insert(
                IpAddr::V4(Ipv4Addr::from(i)),
                Source {
                    failures: 1,
                    last_failure: t0 + Duration::from_secs(u64::from(i)),
                },
            );
        }
        forget_quietest(&mut sources, t0 + Duration::from_secs(100));
        assert_eq!(sources.len(), 90, "the quietest tenth goes");
        assert!(!sources.contains_key(&IpAddr::V4(Ipv4Addr::from(0))));
        forget_quietest(&mut sources, t0 + FORGET_AFTER + Duration::from_secs(50));
        assert_eq!(sources.len(), 49, "those quiet for FORGET_AFTER go first");
    }
}
