//! Executor benchmarks (seeds 002 and 000), epkv and its peers side by side in one run.
//!
//! `cargo bench -p epkv-bench --bench executor -- [--quick] [--threads 1,2]
//!  [--timeouts 1000,4096,30000] [--waiter-spin-us 2,50] [--epkv-idle SPIN,YIELD]
//!  [--burst 64] [--impls epkv,tokio,...]
//!  [OneShotScheduleRun|OneShotBurst|Timeout]`
//!
//! - **OneShotScheduleRun**: N requesting threads each create a one-shot task, schedule it
//!   on a pool of N worker threads, and wait for the task to signal back. items/s =
//!   completed schedule-run-signal round trips per wall second, all threads together.
//!   Peers: tokio (`Handle::spawn` of an async block on a multi-thread runtime with N
//!   workers) and a naive `Mutex<BinaryHeap>` + `Condvar` pool with N workers. All three
//!   signal back through the same spin-then-park baton. `floor` (not a peer) is a bare
//!   lock-free queue with always-polling workers and no task machinery: the ceiling.
//! - **OneShotBurst** (`--burst 64`): the same peers, but each requester schedules a burst
//!   of one-shot tasks back to back and waits for the last; items/s = tasks run. The
//!   queue holds work, so the per-task cost on the workers counts, not only the hand-off.
//! - **TimeoutAddCancel**: K timeouts split over N threads, each armed 10-30 s ahead; every
//!   operation re-arms the thread's next timeout to a new uniform 10-30 s deadline. items/s
//!   = *completed* re-arms (the new deadline is in force when the call returns) per wall
//!   second. Peers: tokio `Sleep::reset` (one `Sleep` per timeout, shared timer driver,
//!   1 worker thread), `tokio_util::time::DelayQueue::reset_at` (one queue per thread,
//!   since it needs `&mut`), and a naive mutex-protected heap with lazy deletion. Deadlines
//!   for every peer are `base + offset`, `base` being the clock read every 64 re-arms, so
//!   no peer pays a clock read per re-arm, and `offset` a random pick per re-arm, so about
//!   half the re-arms move a timeout earlier and half later, at every K.

use epkv_bench::baton::Baton;
use epkv_bench::floor::BarePool;
use epkv_bench::harness::{Args, Measurement, Report, Runner, compare, run_threads};
use epkv_bench::naive::{NaivePool, NaiveTimers};
use epkv_executor::{
    Clock, Executor, ExecutorConfig, Group, Next, Start, SystemClock, TaskContext, TaskSpec,
};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Every peer allocates per task (epkv's task cell, tokio's task, the naive pool's boxed
/// job), so the allocator is part of what is measured: the benchmark uses mimalloc, the
/// allocator `epkv-server` runs with, for all of them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A small xorshift generator: every peer draws its deadlines the same way.
struct Rng(u64);

impl Rng {
    fn new(seed: usize) -> Self {
        Self(0x9E37_79B9_7F4A_7C15 ^ ((seed as u64 + 1) << 17))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A uniform 10-30 s offset, in milliseconds.
    fn offset(&mut self) -> Duration {
        Duration::from_millis(10_000 + self.next() % 20_000)
    }
}

/// Deadlines `base + offset`: `base` is the clock re-read every 64 calls, `offset` is a
/// random pick (one xorshift step) from a per-thread table of 1024 uniform 10-30 s values
/// drawn up front, so drawing a deadline costs every peer the same few nanoseconds.
///
/// The pick must be random per call: indexing the table by a call counter would give a
/// timeout the same offset on every visit whenever K is a multiple of the table size
/// (K = 4096), so each re-arm would move it slightly *later*, never earlier, and the run
/// would measure only the peers' "later" fast paths.
struct Deadlines<T, F> {
    offsets: Vec<Duration>,
    rng: Rng,
    base: T,
    now: F,
    n: usize,
}

impl Deadlines<Instant, fn() -> Instant> {
    /// Deadlines as `Instant`s, every peer's native type except epkv's.
    fn new(seed: usize) -> Self {
        Self::with_clock(seed, || SystemClock.now())
    }
}

impl<T: Copy + std::ops::Add<Duration, Output = T>, F: Fn() -> T> Deadlines<T, F> {
    /// Deadlines in the type `now` reads: epkv's native one is its executor's `Deadline`.
    fn with_clock(seed: usize, now: F) -> Self {
        let mut rng = Rng::new(seed);
        Self {
            offsets: (0..1024).map(|_| rng.offset()).collect(),
            rng,
            base: now(),
            now,
            n: 0,
        }
    }

    fn next(&mut self) -> T {
        self.n += 1;
        if self.n.is_multiple_of(64) {
            self.base = (self.now)();
        }
        // The top 10 bits: always below 1024, so the index needs no bounds check.
        let pick = (self.rng.next() >> 54) as usize;
        self.base + self.offsets[pick]
    }
}

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("{what}: {e}");
    std::process::exit(2)
}

/// Idle spin and yield rounds of epkv's workers (`--epkv-idle spin,yield`), default the
/// executor's own defaults.
static IDLE: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

fn executor(non_io: usize) -> Executor {
    let defaults = ExecutorConfig::for_cores(2);
    let (spin, yields) = *IDLE.get_or_init(|| (defaults.spin_rounds, defaults.yield_rounds));
    let config = defaults
        .with_idle_rounds(spin, yields)
        .with_threads(Group::Reader, 1)
        .with_threads(Group::Writer, 1)
        .with_threads(Group::AuxIo, 1)
        .with_threads(Group::NonIo, non_io);
    Executor::new(config).unwrap_or_else(|e| die("executor", e))
}

fn tokio_rt(workers: usize, time: bool) -> tokio::runtime::Runtime {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.worker_threads(workers);
    if time {
        b.enable_time();
    }
    b.build().unwrap_or_else(|e| die("tokio runtime", e))
}

// ---------------------------------------------------------------- OneShotScheduleRun

/// What a one-shot task signals when it has run, and what its requester waits on.
trait Done: Default + Send + Sync + 'static {
    /// Expects `n` signals before the next wait returns.
    fn arm(&self, n: usize);
    fn done(&self);
    fn wait(&self);
}

/// OneShotScheduleRun: one task per wait, signalled straight through the baton.
impl Done for Baton {
    fn arm(&self, n: usize) {
        debug_assert_eq!(n, 1, "a baton takes one signal per wait");
    }

    fn done(&self) {
        self.post();
    }

    fn wait(&self) {
        Baton::wait(self);
    }
}

/// OneShotBurst: the last of a burst's tasks posts the baton.
#[derive(Default)]
struct Countdown {
    left: AtomicUsize,
    baton: Baton,
}

impl Done for Countdown {
    fn arm(&self, n: usize) {
        self.left.store(n, Relaxed);
    }

    fn done(&self) {
        if self.left.fetch_sub(1, AcqRel) == 1 {
            self.baton.post();
        }
    }

    fn wait(&self) {
        self.baton.wait();
    }
}

/// The loop every one-shot peer shares: each of `threads` requesters schedules `burst`
/// tasks through `submit` (each must signal the `Done` it is given once it has run), then
/// waits for all of them. Counts tasks run.
fn one_shots<D: Done>(
    threads: usize,
    d: Duration,
    burst: usize,
    submit: impl Fn(Arc<D>) + Sync,
) -> Measurement {
    let m = run_threads(threads, d, |_| {
        let done = Arc::new(D::default());
        let submit = &submit;
        move || {
            done.arm(burst);
            for _ in 0..burst {
                submit(Arc::clone(&done));
            }
            done.wait();
        }
    });
    Measurement {
        ops: m.ops * burst as u64,
        ..m
    }
}

fn one_shot_epkv<D: Done>(threads: usize, d: Duration, burst: usize) -> Measurement {
    let exec = executor(threads);
    let handle = exec.handle();
    let m = one_shots(threads, d, burst, |b: Arc<D>| {
        let spec = TaskSpec::new("one-shot", Group::NonIo);
        let scheduled = handle.schedule(spec, move |_: &TaskContext<'_>| {
            b.done();
            Next::Done
        });
        if let Err(e) = scheduled {
            die("schedule", e);
        }
    });
    if let Err(e) = exec.shutdown(Duration::from_secs(10)) {
        die("shutdown", e);
    }
    m
}

fn one_shot_tokio<D: Done>(threads: usize, d: Duration, burst: usize) -> Measurement {
    let rt = tokio_rt(threads, false);
    let handle = rt.handle();
    one_shots(threads, d, burst, |b: Arc<D>| {
        drop(handle.spawn(async move { b.done() }));
    })
}

fn one_shot_naive<D: Done>(threads: usize, d: Duration, burst: usize) -> Measurement {
    let pool = NaivePool::new(threads).unwrap_or_else(|e| die("naive pool", e));
    one_shots(threads, d, burst, |b: Arc<D>| {
        pool.schedule_now(move || b.done())
    })
}

fn one_shot_floor<D: Done>(threads: usize, d: Duration, burst: usize) -> Measurement {
    let pool = BarePool::new(threads).unwrap_or_else(|e| die("floor pool", e));
    one_shots(threads, d, burst, |b: Arc<D>| pool.run(move || b.done()))
}

// ---------------------------------------------------------------- TimeoutAddCancel

fn per_thread(k: usize, threads: usize, t: usize) -> usize {
    k / threads + usize::from(t < k % threads)
}

fn timeouts_epkv(k: usize, threads: usize, d: Duration) -> Measurement {
    let exec = executor(1);
    let handle = exec.handle();
    let fired = Arc::new(AtomicU64::new(0));
    let m = run_threads(threads, d, |t| {
        let clock = handle.clone();
        let mut deadlines = Deadlines::with_clock(t, move || clock.now_deadline());
        let tasks: Vec<_> = (0..per_thread(k, threads, t))
            .map(|_| {
                let f = Arc::clone(&fired);
                let spec = TaskSpec::new("timeout", Group::NonIo).start(Start::Sleep);
                handle
                    .schedule(spec, move |_: &TaskContext<'_>| {
                        f.fetch_add(1, Relaxed);
                        Next::Sleep
                    })
                    .unwrap_or_else(|e| die("schedule", e))
            })
            .collect();
        for task in &tasks {
            task.snooze_to(deadlines.next());
        }
        let mut i = 0;
        move || {
            tasks[i].snooze_to(deadlines.next());
            i += 1;
            if i == tasks.len() {
                i = 0;
            }
        }
    });
    if fired.load(Relaxed) != 0 {
        eprintln!("warning: epkv timeouts fired during the run");
    }
    if let Err(e) = exec.shutdown(Duration::from_secs(10)) {
        die("shutdown", e);
    }
    m
}

fn timeouts_tokio_sleep(k: usize, threads: usize, d: Duration) -> Measurement {
    let rt = tokio_rt(1, true);
    let handle = rt.handle().clone();
    run_threads(threads, d, |t| {
        let _enter = handle.enter();
        let mut deadlines = Deadlines::new(t);
        let mut sleeps: Vec<Pin<Box<tokio::time::Sleep>>> = (0..per_thread(k, threads, t))
            .map(|_| {
                let mut s = Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(
                    deadlines.next(),
                )));
                // The first reset registers the timer with the driver.
                s.as_mut()
                    .reset(tokio::time::Instant::from_std(deadlines.next()));
                s
            })
            .collect();
        let mut i = 0;
        move || {
            sleeps[i]
                .as_mut()
                .reset(tokio::time::Instant::from_std(deadlines.next()));
            i += 1;
            if i == sleeps.len() {
                i = 0;
            }
        }
    })
}

fn timeouts_tokio_delay_queue(k: usize, threads: usize, d: Duration) -> Measurement {
    let rt = tokio_rt(1, true);
    let handle = rt.handle().clone();
    run_threads(threads, d, |t| {
        let enter = handle.enter();
        let mut deadlines = Deadlines::new(t);
        let n = per_thread(k, threads, t);
        let mut queue = tokio_util::time::DelayQueue::with_capacity(n);
        let keys: Vec<_> = (0..n)
            .map(|j| queue.insert_at(j, tokio::time::Instant::from_std(deadlines.next())))
            .collect();
        let mut i = 0;
        move || {
            let _in_runtime = &enter;
            queue.reset_at(&keys[i], tokio::time::Instant::from_std(deadlines.next()));
            i += 1;
            if i == keys.len() {
                i = 0;
            }
        }
    })
}

fn timeouts_naive(k: usize, threads: usize, d: Duration) -> Measurement {
    let timers = NaiveTimers::new(k).unwrap_or_else(|e| die("naive timers", e));
    let m = run_threads(threads, d, |t| {
        let mut deadlines = Deadlines::new(t);
        let ids: Vec<u32> = (t..k)
            .step_by(threads)
            .map(|id| u32::try_from(id).unwrap_or(u32::MAX))
            .collect();
        for &id in &ids {
            timers.rearm(id, deadlines.next());
        }
        let timers = &timers;
        let mut i = 0;
        move || {
            timers.rearm(ids[i], deadlines.next());
            i += 1;
            if i == ids.len() {
                i = 0;
            }
        }
    });
    if timers.fired() != 0 {
        eprintln!("warning: naive timeouts fired during the run");
    }
    m
}

// ---------------------------------------------------------------- driver

fn main() {
    let args = Args::parse();
    if let [spin, yields] = args.list("epkv-idle", &[])[..] {
        let _ = IDLE.set((
            u32::try_from(spin).unwrap_or(u32::MAX),
            u32::try_from(yields).unwrap_or(u32::MAX),
        ));
    }
    let d = args.measure_time();
    let mut report = Report::new("executor");
    println!(
        "executor benchmarks: {} s per measurement, {} rounds (median), threads {:?}, {} cores",
        d.as_secs_f64(),
        args.rounds(),
        args.threads,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
    );
    if args.wants("OneShotScheduleRun") {
        for spin_us in args.list("waiter-spin-us", &[2, 50]) {
            epkv_bench::baton::set_spin(Duration::from_micros(spin_us as u64));
            for &t in &args.threads {
                let peers: Vec<Runner<'_>> = vec![
                    ("epkv", Box::new(move || one_shot_epkv::<Baton>(t, d, 1))),
                    ("tokio", Box::new(move || one_shot_tokio::<Baton>(t, d, 1))),
                    (
                        "naive-heap-pool",
                        Box::new(move || one_shot_naive::<Baton>(t, d, 1)),
                    ),
                    ("floor", Box::new(move || one_shot_floor::<Baton>(t, d, 1))),
                ];
                compare(
                    &mut report,
                    &args,
                    "OneShotScheduleRun",
                    &[("threads", t as u64), ("waiter_spin_us", spin_us as u64)],
                    &peers,
                );
            }
        }
        report.note(
            "OneShotScheduleRun counts completed schedule -> run -> signal round trips. \
             Every peer signals the requester through the same baton, which spins \
             waiter_spin_us before parking: 2 us is folly's Baton default, which the seed \
             used; 50 us shows the sensitivity (a requester that rarely parks lets the naive \
             pool ping-pong through its mutex without sleeping). `floor` is not a peer: a \
             bare lock-free queue of boxed closures and workers that poll it without ever \
             sleeping (no task object, statistics or shutdown guarantees), the ceiling any \
             pool can approach here.",
        );
    }
    if args.wants("OneShotBurst") {
        epkv_bench::baton::set_spin(Duration::from_micros(2));
        for burst in args.list("burst", &[64]) {
            for &t in &args.threads {
                let peers: Vec<Runner<'_>> = vec![
                    (
                        "epkv",
                        Box::new(move || one_shot_epkv::<Countdown>(t, d, burst)),
                    ),
                    (
                        "tokio",
                        Box::new(move || one_shot_tokio::<Countdown>(t, d, burst)),
                    ),
                    (
                        "naive-heap-pool",
                        Box::new(move || one_shot_naive::<Countdown>(t, d, burst)),
                    ),
                    (
                        "floor",
                        Box::new(move || one_shot_floor::<Countdown>(t, d, burst)),
                    ),
                ];
                compare(
                    &mut report,
                    &args,
                    "OneShotBurst",
                    &[("threads", t as u64), ("burst", burst as u64)],
                    &peers,
                );
            }
        }
        report.note(
            "OneShotBurst counts one-shot tasks run: each requester schedules `burst` tasks \
             back to back, then waits (2 us baton) until the last has run, so the queue \
             holds work and a task's cost on the worker (run, statistics, release) is \
             measured, not only the hand-off latency.",
        );
    }
    if args.wants("TimeoutAddCancel") {
        for k in args.list("timeouts", &[1000, 4096, 30000]) {
            for &t in &args.threads {
                let peers: Vec<Runner<'_>> = vec![
                    ("epkv", Box::new(move || timeouts_epkv(k, t, d))),
                    (
                        "tokio-sleep",
                        Box::new(move || timeouts_tokio_sleep(k, t, d)),
                    ),
                    (
                        "tokio-delay-queue",
                        Box::new(move || timeouts_tokio_delay_queue(k, t, d)),
                    ),
                    ("naive-heap", Box::new(move || timeouts_naive(k, t, d))),
                ];
                compare(
                    &mut report,
                    &args,
                    "TimeoutAddCancel",
                    &[("timeouts", k as u64), ("threads", t as u64)],
                    &peers,
                );
            }
        }
        report.note(
            "TimeoutAddCancel counts COMPLETED re-arms: the new deadline is in force when \
             the call returns (KV-Engine's seed counted re-arm requests posted to a \
             scheduler thread). Deadlines are base + uniform 10-30 s (a random pick per \
             re-arm from a per-thread table of 1024 random offsets), base re-read every 64 \
             re-arms, for every peer.",
        );
    }
    report.note(
        "Shared 2-core machine with other builds running: absolute numbers are noisy; the \
         ratios (peers interleaved round by round, medians) are the result.",
    );
    if let Err(e) = report.finish("epkv") {
        die("writing results", e);
    }
}
