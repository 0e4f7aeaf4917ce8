//! The executor's shared core: task cells, the task registry, per-group run queues, timer
//! shards (one hierarchical [`Wheel`] per worker thread) and the run path. Both the threaded
//! [`Executor`](crate::Executor) and the [`ManualExecutor`](crate::ManualExecutor) drive the
//! same core; they differ only in who pops the queues and polls the wheels.
//!
//! # Timers and lazy re-arm
//!
//! A task's due time lives in its state word (see `state.rs`); the timer wheel only holds
//! *reasons to look at a task again*. Each task records in `armed_at` the tick of its live
//! timer entry. Re-arming a task to a due time at or after that tick is one compare-and-swap
//! on the state word and one load of `armed_at`: no lock, no wheel access. When the entry's
//! tick comes, the shard claims it (`armed_at` compare-and-swap to [`NOT_ARMED`]), re-reads
//! the state word and either queues the task (due) or files a new entry (snoozed later).
//! Only a re-arm to a time *before* the live entry touches the wheel.
//!
//! To make that rare, an entry for a due time far ahead is filed at a quarter of the way
//! there ([`check_tick`]): a task armed 20 s out is looked at after 5 s, then 3.75 s later,
//! and so on (about 30 looks over its life). A re-arm at least a quarter as far ahead as the
//! previous one, the SyncWrite timeout pattern, never moves an entry. Stale entries (the
//! task moved earlier, finished or was cancelled) are dropped when they come round.

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::handle::TaskHandle;
use crate::state::{Begin, Cancel, DONE, End, Expire, NEVER, QUEUED, Request, StateWord};
use crate::stats::{LazyStats, TaskInfo};
use crate::sync::{AtomicBool, AtomicU64, Mutex};
use crate::task::{Group, Next, Priority, Task, TaskContext, TaskId, TaskSpec};
use crate::wheel::{TICK_SHIFT, Wheel};
use crossbeam_queue::SegQueue;
use crossbeam_utils::CachePadded;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool as StdAtomicBool, AtomicU64 as StdAtomicU64, AtomicUsize};
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst, fence};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// `armed_at` value of a task with no live timer entry.
pub(crate) const NOT_ARMED: u64 = u64::MAX;
/// Due times closer than this many ticks are filed at their own tick.
const NEAR_TICKS: u64 = 8;
/// Registry shards: enough that two scheduling threads rarely meet on one.
const REGISTRY_SHARDS: usize = 32;

/// The first tick at or after `nanos`: an entry filed there never fires early.
pub(crate) fn ceil_tick(nanos: u64) -> u64 {
    nanos.div_ceil(1 << TICK_SHIFT)
}

/// Where to file the timer entry of a task due at `due`, seen at `now`: the due tick itself
/// when near, else a quarter of the way there (see the module docs).
pub(crate) fn check_tick(due: u64, now: u64) -> u64 {
    let due_tick = ceil_tick(due);
    let far = due.saturating_sub(now);
    if far >> TICK_SHIFT <= NEAR_TICKS {
        due_tick
    } else {
        ceil_tick(now + far / 4).min(due_tick)
    }
}

/// The shared part of one task; [`TaskHandle`] is an `Arc` of it.
pub(crate) struct TaskCell {
    /// Lifecycle flags and due time (see `state.rs`).
    pub(crate) state: StateWord,
    /// Tick of the live timer entry, or [`NOT_ARMED`]. Lowered by compare-and-swap only;
    /// reset by the shard that claims the entry.
    pub(crate) armed_at: AtomicU64,
    /// When the task last became ready (executor nanoseconds), for the lateness
    /// histogram. Written before the task is queued, read by the thread that pops it.
    pub(crate) ready_at: StdAtomicU64,
    /// Set before the final state change of a run whose body panicked.
    pub(crate) panicked: StdAtomicBool,
    pub(crate) id: TaskId,
    pub(crate) group: Group,
    pub(crate) priority: Priority,
    /// Index of the timer shard within the group.
    pub(crate) shard: usize,
    pub(crate) name: Cow<'static, str>,
    pub(crate) core: Arc<Core>,
    /// The body; `None` once the task is finished. Locked only by the thread running the
    /// task and by whoever finishes it, never concurrently with a run.
    pub(crate) body: Mutex<Option<Box<dyn Task>>>,
    pub(crate) stats: LazyStats,
}

/// A finished task's registry entry is dropped once its shard has grown to at least
/// this many entries (and twice its live count at the previous prune).
const PRUNE_MIN: usize = 64;

/// The registry shard of the calling thread: assigned round-robin on first use. (The
/// same as `epkv_types::thread_shard`, which the other crates share; the executor depends
/// on no workspace crate, so it keeps this copy.)
fn local_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Relaxed) % REGISTRY_SHARDS;
    }
    SHARD.with(|s| *s)
}

/// The tasks one registry shard holds, finished ones among them until the next prune.
#[derive(Default)]
struct RegistryShard {
    tasks: Vec<TaskHandle>,
    /// Length at which the next insert prunes finished tasks first.
    prune_at: usize,
}

impl RegistryShard {
    fn prune(&mut self) {
        self.tasks.retain(|h| !h.is_done());
        self.prune_at = (self.tasks.len() * 2).max(PRUNE_MIN);
        // After a burst, give back what a quarter-full vector holds on to.
        if self.tasks.capacity() > 2 * self.prune_at {
            self.tasks.shrink_to(self.prune_at);
        }
    }
}

/// Every live task, so shutdown can cancel sleeping ones and stats can list them.
///
/// Each scheduling thread files its tasks in its own shard, so that shard's lock and memory
/// stay in its cache. Finishing a task does not touch the registry (the worker that ran
/// it would otherwise take the scheduler's lock and move its lines on every task): a
/// finished task's entry stays until the shard's owner prunes it, which happens when the
/// shard has doubled since its previous prune (amortised O(1) per insert), and on every
/// listing. A shard so holds at most twice its live tasks plus [`PRUNE_MIN`]; the body of
/// a finished task is dropped when it finishes, not when its entry goes.
struct Registry {
    shards: Box<[CachePadded<Mutex<RegistryShard>>]>,
}

impl Registry {
    fn new() -> Self {
        Self {
            shards: (0..REGISTRY_SHARDS)
                .map(|_| CachePadded::new(Mutex::new(RegistryShard::default())))
                .collect(),
        }
    }

    fn insert(&self, h: TaskHandle) {
        let mut shard = self.shards[local_shard()].lock();
        if shard.tasks.len() >= shard.prune_at {
            shard.prune();
        }
        shard.tasks.push(h);
    }

    /// Drops every finished task's entry.
    fn prune_all(&self) {
        for shard in &self.shards {
            shard.lock().prune();
        }
    }

    /// The unfinished tasks (pruning the finished ones).
    fn all(&self) -> Vec<TaskHandle> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.lock();
            shard.prune();
            out.extend(shard.tasks.iter().cloned());
        }
        out
    }

    /// How many unfinished tasks there are (pruning the finished ones).
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let mut s = s.lock();
                s.prune();
                s.tasks.len()
            })
            .sum()
    }
}

/// One timer wheel and the tick its owner will next look at it.
pub(crate) struct TimerShard {
    pub(crate) wheel: Mutex<Wheel<TaskHandle>>,
    /// The earliest tick at which the wheel has something, as last published under the
    /// wheel lock; `u64::MAX` when empty. Lowered by inserters (who then unpark the owner).
    pub(crate) next_tick: StdAtomicU64,
}

/// A group's run queues, timer shards and worker bookkeeping.
pub(crate) struct GroupCore {
    pub(crate) high: SegQueue<TaskHandle>,
    pub(crate) normal: SegQueue<TaskHandle>,
    pub(crate) shards: Box<[CachePadded<TimerShard>]>,
    /// Bit `i` set while worker `i` is parked (or about to park).
    pub(crate) sleepers: CachePadded<StdAtomicU64>,
    /// Workers spinning for work; a pusher need not unpark anyone while one spins.
    pub(crate) spinning: CachePadded<AtomicUsize>,
    /// Worker threads, for unparking; set by each worker when it starts.
    pub(crate) threads: Box<[OnceLock<Thread>]>,
}

impl GroupCore {
    pub(crate) fn pop(&self) -> Option<TaskHandle> {
        self.high.pop().or_else(|| self.normal.pop())
    }

    pub(crate) fn has_work(&self) -> bool {
        !self.high.is_empty() || !self.normal.is_empty()
    }

    /// Wakes one parked worker if no worker is spinning.
    pub(crate) fn notify_one(&self) {
        fence(SeqCst);
        if self.spinning.load(SeqCst) > 0 {
            return;
        }
        let mut s = self.sleepers.load(SeqCst);
        while s != 0 {
            let bit = 1u64 << s.trailing_zeros();
            match self
                .sleepers
                .compare_exchange_weak(s, s & !bit, SeqCst, SeqCst)
            {
                Ok(_) => {
                    if let Some(t) = self.threads[s.trailing_zeros() as usize].get() {
                        t.unpark();
                    }
                    return;
                }
                Err(actual) => s = actual,
            }
        }
    }

    pub(crate) fn unpark_all(&self) {
        for t in self.threads.iter().filter_map(OnceLock::get) {
            t.unpark();
        }
    }
}

/// The queue of the manual executor: ready tasks of every group in the order they became
/// ready, high priority first.
#[derive(Default)]
pub(crate) struct ManualQueues {
    pub(crate) high: VecDeque<TaskHandle>,
    pub(crate) normal: VecDeque<TaskHandle>,
}

/// How the core's queues are drained.
pub(crate) enum Driver {
    /// Worker threads per group.
    Threaded,
    /// The test's thread, through [`ManualExecutor`](crate::ManualExecutor).
    Manual(Mutex<ManualQueues>),
}

/// The executor's shared state.
pub(crate) struct Core {
    pub(crate) clock: Arc<dyn Clock>,
    /// Executor time zero: due times are nanoseconds since this instant.
    epoch: Instant,
    shutdown: AtomicBool,
    /// Set when `drain` has cancelled everything: from then on, finishing a task prunes
    /// the registry at once.
    drained: AtomicBool,
    registry: Registry,
    pub(crate) groups: Box<[GroupCore]>,
    pub(crate) driver: Driver,
}

static NEXT_ID_BLOCK: StdAtomicU64 = StdAtomicU64::new(1);
const ID_BLOCK: u64 = 1024;

/// A process-unique task id, taken from a per-thread block so scheduling threads do not
/// share a counter's cache line.
fn next_id() -> TaskId {
    thread_local! {
        static IDS: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    }
    IDS.with(|ids| {
        let (mut next, mut end) = ids.get();
        if next == end {
            next = NEXT_ID_BLOCK.fetch_add(ID_BLOCK, Relaxed);
            end = next + ID_BLOCK;
        }
        ids.set((next + 1, end));
        TaskId(next)
    })
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

impl Core {
    /// Builds a core with `workers[g]` timer shards (one per worker) for each group.
    pub(crate) fn new(clock: Arc<dyn Clock>, workers: [usize; 4], driver: Driver) -> Arc<Self> {
        let epoch = clock.now();
        let groups = Group::ALL
            .iter()
            .map(|&group| {
                let n = workers[group.index()].max(1);
                GroupCore {
                    high: SegQueue::new(),
                    normal: SegQueue::new(),
                    shards: (0..n)
                        .map(|_| {
                            CachePadded::new(TimerShard {
                                wheel: Mutex::new(Wheel::new(0)),
                                next_tick: StdAtomicU64::new(u64::MAX),
                            })
                        })
                        .collect(),
                    sleepers: CachePadded::new(StdAtomicU64::new(0)),
                    spinning: CachePadded::new(AtomicUsize::new(0)),
                    threads: (0..n).map(|_| OnceLock::new()).collect(),
                }
            })
            .collect();
        Arc::new(Self {
            clock,
            epoch,
            shutdown: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            registry: Registry::new(),
            groups,
            driver,
        })
    }

    /// Executor time now, in nanoseconds since the epoch.
    pub(crate) fn now_ns(&self) -> u64 {
        self.to_ns(self.clock.now())
    }

    /// Executor nanoseconds of `at` (0 if before the epoch), below [`NEVER`].
    #[inline]
    pub(crate) fn to_ns(&self, at: Instant) -> u64 {
        // On every re-arm: u64 arithmetic rather than `as_nanos()`'s u128 multiply.
        let d = at.saturating_duration_since(self.epoch);
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
            .min(NEVER - 1)
    }

    pub(crate) fn to_instant(&self, ns: u64) -> Instant {
        self.epoch + Duration::from_nanos(ns)
    }

    /// `now + d` in executor nanoseconds, saturating below [`NEVER`].
    pub(crate) fn after(now: u64, d: Duration) -> u64 {
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        now.saturating_add(d).min(NEVER - 1)
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(SeqCst)
    }

    pub(crate) fn task_count(&self) -> usize {
        self.registry.len()
    }

    /// Registers and starts a task.
    pub(crate) fn schedule(
        self: &Arc<Self>,
        spec: TaskSpec,
        body: Box<dyn Task>,
    ) -> Result<TaskHandle> {
        if self.is_shut_down() {
            return Err(Error::ShutDown);
        }
        let now = self.now_ns();
        let due = match spec.start {
            crate::task::Start::Now => 0,
            crate::task::Start::After(d) => Self::after(now, d),
            crate::task::Start::At(t) => self.to_ns(t),
            crate::task::Start::Sleep => NEVER,
        };
        let id = next_id();
        let group = &self.groups[spec.group.index()];
        #[expect(
            clippy::cast_possible_truncation,
            reason = "only the low bits select a shard"
        )]
        let shard = (id.0 as usize) % group.shards.len();
        let immediate = due <= now;
        let cell = TaskCell {
            state: if immediate {
                StateWord::queued()
            } else {
                StateWord::idle(due)
            },
            armed_at: AtomicU64::new(NOT_ARMED),
            ready_at: StdAtomicU64::new(now),
            panicked: StdAtomicBool::new(false),
            id,
            group: spec.group,
            priority: spec.priority,
            shard,
            name: spec.name,
            core: Arc::clone(self),
            body: Mutex::new(Some(body)),
            stats: LazyStats::default(),
        };
        let h = TaskHandle::from_cell(Arc::new(cell));
        self.registry.insert(h.clone());
        // A shutdown that began before the insert is seen here; one that begins after it
        // finds the task in the registry and cancels it.
        if self.is_shut_down() {
            self.cancel(&h);
            return Err(Error::ShutDown);
        }
        if immediate {
            self.enqueue(h.clone());
        } else {
            self.arm(&h, due, Some(now));
        }
        Ok(h)
    }

    /// Asks for `h` to be due at `due`; `false` if it is finished or cancelled. `now` is
    /// the current time if the caller has it (it is read only if needed otherwise).
    #[inline]
    pub(crate) fn request(&self, h: &TaskHandle, due: u64, now: Option<u64>) -> bool {
        match h.cell().state.request(due) {
            Request::Dead => false,
            Request::Recorded => true,
            Request::Enqueue => {
                let now = now.unwrap_or_else(|| self.now_ns());
                h.cell().ready_at.store(now, Relaxed);
                self.enqueue(h.clone());
                true
            }
            Request::Arm(due) => {
                self.arm(h, due, now);
                true
            }
        }
    }

    /// Cancels `h`; `false` if it was already finished or cancelled.
    pub(crate) fn cancel(&self, h: &TaskHandle) -> bool {
        match h.cell().state.cancel() {
            Cancel::AlreadyDead => false,
            Cancel::Marked => true,
            Cancel::Finish => {
                self.finish(h);
                true
            }
        }
    }

    /// Puts a task whose state word says QUEUED on its run queue.
    pub(crate) fn enqueue(&self, h: TaskHandle) {
        match &self.driver {
            Driver::Threaded => {
                let g = &self.groups[h.cell().group.index()];
                match h.cell().priority {
                    Priority::High => g.high.push(h),
                    Priority::Normal => g.normal.push(h),
                }
                g.notify_one();
            }
            Driver::Manual(q) => {
                let mut q = q.lock();
                match h.cell().priority {
                    Priority::High => q.high.push_back(h),
                    Priority::Normal => q.normal.push_back(h),
                }
            }
        }
    }

    /// Makes sure an idle task due at `due` has a timer entry at or before it, or queues
    /// it if `due` has come. The fast path (an entry at or before `due` already exists)
    /// is one load and reads no clock.
    #[inline]
    pub(crate) fn arm(&self, h: &TaskHandle, due: u64, now: Option<u64>) {
        if due >= NEVER || h.cell().armed_at.load(SeqCst) <= ceil_tick(due) {
            // Asleep, or the live entry comes round first and re-reads the due time.
            return;
        }
        self.arm_slow(h, due, now);
    }

    #[inline(never)]
    fn arm_slow(&self, h: &TaskHandle, due: u64, now: Option<u64>) {
        let cell = h.cell();
        let due_tick = ceil_tick(due);
        let mut cur = cell.armed_at.load(SeqCst);
        if cur <= due_tick {
            return;
        }
        let now = now.unwrap_or_else(|| self.now_ns());
        if due <= now {
            // Already due: queue it now rather than through a timer tick. If the word
            // changed meanwhile, whoever changed it acts on it.
            if let Expire::Enqueue(due) = cell.state.expire(now) {
                cell.ready_at.store(due, Relaxed);
                self.enqueue(h.clone());
            }
            return;
        }
        let at = check_tick(due, now);
        loop {
            match cell.armed_at.compare_exchange(cur, at, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(actual) if actual <= due_tick => return,
                Err(actual) => cur = actual,
            }
        }
        let group = &self.groups[cell.group.index()];
        let shard = &group.shards[cell.shard];
        let unpark = {
            let mut wheel = shard.wheel.lock();
            wheel.insert(at, h.clone());
            let at = at.max(wheel.elapsed());
            if at < shard.next_tick.load(Relaxed) {
                shard.next_tick.store(at, Relaxed);
                true
            } else {
                false
            }
        };
        if unpark
            && matches!(self.driver, Driver::Threaded)
            && let Some(t) = group.threads[cell.shard].get()
        {
            t.unpark();
        }
    }

    /// Advances one timer shard to tick `upto` and acts on every entry that came round,
    /// judging due times against `now`. Worker threads poll up to the tick `now` is in, so
    /// a task runs at most one tick after its due time; the manual executor polls one tick
    /// further, so a task is ready as soon as the manual clock reaches its due time.
    pub(crate) fn poll_shard(&self, shard: &TimerShard, now: u64, upto: u64) {
        let mut due = Vec::new();
        {
            let mut wheel = shard.wheel.lock();
            wheel.poll(upto, &mut due);
            shard
                .next_tick
                .store(wheel.next_expiration().unwrap_or(u64::MAX), Relaxed);
        }
        for (at, h) in due {
            self.expire(at, &h, now);
        }
    }

    /// Handles one timer entry filed at tick `at`.
    fn expire(&self, at: u64, h: &TaskHandle, now: u64) {
        let cell = h.cell();
        if cell
            .armed_at
            .compare_exchange(at, NOT_ARMED, SeqCst, SeqCst)
            .is_err()
        {
            return; // stale: the task was re-armed earlier since this entry was filed
        }
        match cell.state.expire(now) {
            Expire::Ignore => {}
            Expire::Enqueue(due) => {
                cell.ready_at.store(due, Relaxed);
                self.enqueue(h.clone());
            }
            Expire::Rearm(due) => self.arm(h, due, Some(now)),
        }
    }

    /// Runs a task popped from a run queue: checks it is still due, runs the body with
    /// panics caught, records statistics and acts on the answer.
    pub(crate) fn run(&self, h: &TaskHandle) {
        self.run_at(h, self.now_ns());
    }

    /// [`Core::run`] with the start time already read (a worker passes the time it read
    /// before popping the task, at most one run old); returns the time read after the run
    /// (`None` if the body did not run), which the worker reuses rather than reading its
    /// clock again: one clock read per run instead of three.
    pub(crate) fn run_at(&self, h: &TaskHandle, start: u64) -> Option<u64> {
        let cell = h.cell();
        match cell.state.begin(start) {
            Begin::Finish => {
                self.finish(h);
                return None;
            }
            Begin::NotDue(due) => {
                self.arm(h, due, Some(start));
                return None;
            }
            Begin::Run => {}
        }
        let ready = cell.ready_at.load(Relaxed);
        let answer = {
            let mut body = cell.body.lock();
            match body.as_mut() {
                Some(task) => {
                    let cx = TaskContext {
                        handle: h,
                        now: self.to_instant(start),
                    };
                    catch_unwind(AssertUnwindSafe(|| task.run(&cx)))
                }
                None => Ok(Next::Done),
            }
        };
        let end = self.now_ns();
        cell.stats.record(
            start,
            end.saturating_sub(start),
            start.saturating_sub(ready),
        );
        let next = match answer {
            Ok(Next::Done) => None,
            Ok(Next::After(d)) => Some(Self::after(end, d)),
            Ok(Next::At(t)) => Some(self.to_ns(t)),
            Ok(Next::Sleep) => Some(NEVER),
            Err(payload) => {
                tracing::error!(
                    task = %cell.name,
                    task_id = cell.id.0,
                    group = %cell.group,
                    "task panicked, marking it dead: {}",
                    panic_message(payload.as_ref())
                );
                cell.panicked.store(true, SeqCst);
                None
            }
        };
        match cell.state.end(next, end) {
            End::Finish => self.finish(h),
            End::Enqueue => {
                cell.ready_at.store(end, Relaxed);
                self.enqueue(h.clone());
            }
            End::Arm(due) => self.arm(h, due, Some(end)),
        }
        Some(end)
    }

    /// Releases a task whose state word says DONE: drops its body. Its registry entry goes
    /// at its shard's next prune, or at once after shutdown's drain.
    fn finish(&self, h: &TaskHandle) {
        debug_assert!(h.cell().state.load() & DONE != 0);
        let body = h.cell().body.lock().take();
        // The body's destructor runs with no executor lock held: it may schedule or
        // cancel other tasks.
        drop(body);
        if self.drained.load(SeqCst) {
            // No owner will prune again (no schedule succeeds after shutdown), and an entry
            // left behind would keep the core alive through a cycle (core, registry, task,
            // core). Finishing is rare once drained: a task that outlived a timed-out
            // shutdown, or one scheduled in a race with it. (The bulk of shutdown's
            // cancellations finish before `drain` ends, which prunes them all at once.)
            self.registry.prune_all();
        }
    }

    /// Marks the core shut down and cancels every registered task.
    pub(crate) fn begin_shutdown(&self) {
        self.shutdown.store(true, SeqCst);
        for h in self.registry.all() {
            self.cancel(&h);
        }
    }

    /// After shutdown: finishes every task still queued and empties every wheel, so no
    /// task keeps the core alive through a reference cycle.
    pub(crate) fn drain(&self) {
        for g in self.groups.iter() {
            while let Some(h) = g.pop() {
                self.drain_one(&h);
            }
            for shard in g.shards.iter() {
                let entries = shard.wheel.lock().drain();
                drop(entries);
            }
        }
        if let Driver::Manual(q) = &self.driver {
            let taken: Vec<TaskHandle> = {
                let mut q = q.lock();
                let q = &mut *q;
                q.high.drain(..).chain(q.normal.drain(..)).collect()
            };
            for h in &taken {
                self.drain_one(h);
            }
        }
        // Anything left registered is idle and uncancelled only if it was scheduled in a
        // race with shutdown; cancel it too.
        for h in self.registry.all() {
            self.cancel(&h);
        }
        // From here every finish prunes the registry. Set before the prune below: a task
        // finishing concurrently either sees the flag and prunes, or set DONE early enough
        // for this prune to see it (all SeqCst).
        self.drained.store(true, SeqCst);
        self.registry.prune_all();
    }

    /// Finishes a task taken off a run queue during shutdown. Every queued task was
    /// cancelled by `begin_shutdown`; cancelling again covers one scheduled in a race.
    fn drain_one(&self, h: &TaskHandle) {
        let _ = h.cell().state.cancel();
        if h.cell().state.load() & QUEUED != 0 && h.cell().state.begin(0) == Begin::Finish {
            self.finish(h);
        }
    }

    /// Timer entries held by all wheels, stale ones included.
    pub(crate) fn timer_entries(&self) -> usize {
        self.groups
            .iter()
            .flat_map(|g| g.shards.iter())
            .map(|s| s.wheel.lock().len())
            .sum()
    }

    /// Every registered task.
    pub(crate) fn tasks_handles(&self) -> Vec<TaskHandle> {
        self.registry.all()
    }

    /// A snapshot of every registered task, ordered by id.
    pub(crate) fn tasks(&self) -> Vec<TaskInfo> {
        let mut all: Vec<TaskInfo> = self.registry.all().iter().map(TaskHandle::info).collect();
        all.sort_by_key(|t| t.id);
        all
    }
}

#[cfg(all(test, not(epkv_loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::manual::ManualExecutor;

    impl Registry {
        /// Entries held, finished ones included.
        fn raw_len(&self) -> usize {
            self.shards.iter().map(|s| s.lock().tasks.len()).sum()
        }
    }

    #[test]
    fn shutdown_leaves_no_cycle_keeping_the_core_alive() {
        let exec = ManualExecutor::new(Arc::new(ManualClock::new(Duration::ZERO)));
        let core = Arc::downgrade(&exec.handle().core);
        for _ in 0..3 {
            drop(exec.schedule(
                TaskSpec::new("one-shot", Group::NonIo),
                |_: &TaskContext<'_>| Next::Done,
            ));
        }
        assert_eq!(exec.run_until_idle(10), 3);
        let sleeper = exec
            .schedule(
                TaskSpec::new("sleeper", Group::NonIo).start(crate::task::Start::Sleep),
                |_: &TaskContext<'_>| Next::Sleep,
            )
            .unwrap();
        drop(
            exec.schedule(
                TaskSpec::new("periodic", Group::NonIo)
                    .start(crate::task::Start::After(Duration::from_secs(5))),
                |_: &TaskContext<'_>| Next::After(Duration::from_secs(5)),
            ),
        );
        drop(sleeper);
        let handle = exec.handle();
        exec.shutdown();
        // Scheduling after shutdown is refused and leaves nothing behind either.
        assert!(
            handle
                .schedule(
                    TaskSpec::new("late", Group::NonIo),
                    |_: &TaskContext<'_>| { Next::Done }
                )
                .is_err()
        );
        drop(handle);
        drop(exec);
        assert!(core.upgrade().is_none(), "a task still holds the core");
    }

    #[test]
    fn a_task_that_outlives_a_timed_out_shutdown_leaves_no_cycle() {
        use crate::executor::{Executor, ExecutorConfig};
        use std::sync::mpsc;
        let limit = Duration::from_secs(20);
        let exec = Executor::new(ExecutorConfig::for_cores(2)).unwrap();
        let core = Arc::downgrade(&exec.handle().core);
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Mutex::new(release_rx);
        let stuck = exec
            .schedule(
                TaskSpec::new("stuck", Group::Reader),
                move |_: &TaskContext<'_>| {
                    started_tx.send(()).unwrap();
                    let _ = release_rx.lock().recv_timeout(limit);
                    Next::Done
                },
            )
            .unwrap();
        started_rx.recv_timeout(limit).unwrap();
        assert!(matches!(
            exec.shutdown(Duration::from_millis(50)),
            Err(Error::ShutdownTimeout { .. })
        ));
        release_tx.send(()).unwrap();
        drop(exec);
        // The stuck run ends, its worker exits and drops its reference to the core; then
        // nothing else may hold it.
        let wait = |cond: &dyn Fn() -> bool| {
            for _ in 0..limit.as_millis() {
                if cond() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            false
        };
        assert!(wait(&|| stuck.is_done()));
        drop(stuck);
        assert!(
            wait(&|| core.strong_count() == 0),
            "a task still holds the core"
        );
    }

    #[test]
    fn finished_tasks_leave_the_registry_within_the_prune_bound() {
        let exec = ManualExecutor::new(Arc::new(ManualClock::new(Duration::ZERO)));
        let core = Arc::clone(&exec.handle().core);
        let sleeper = exec
            .schedule(
                TaskSpec::new("sleeper", Group::NonIo).start(crate::task::Start::Sleep),
                |_: &TaskContext<'_>| Next::Sleep,
            )
            .unwrap();
        for i in 0..10 * PRUNE_MIN {
            drop(exec.schedule(
                TaskSpec::new("one-shot", Group::NonIo),
                |_: &TaskContext<'_>| Next::Done,
            ));
            assert_eq!(exec.run_until_idle(10), 1, "run {i}");
            // One live task: the shard prunes at PRUNE_MIN entries, so it never holds more.
            assert!(
                core.registry.raw_len() <= PRUNE_MIN,
                "{}",
                core.registry.raw_len()
            );
        }
        assert_eq!(core.task_count(), 1);
        assert_eq!(core.registry.raw_len(), 1, "a count prunes");
        // A burst of live tasks, then all finished: the shard gives the memory back.
        let burst: Vec<TaskHandle> = (0..20 * PRUNE_MIN)
            .map(|_| {
                exec.schedule(
                    TaskSpec::new("burst", Group::NonIo).start(crate::task::Start::Sleep),
                    |_: &TaskContext<'_>| Next::Done,
                )
                .unwrap()
            })
            .collect();
        assert_eq!(core.task_count(), 1 + burst.len());
        for h in &burst {
            assert!(h.cancel());
        }
        assert_eq!(core.task_count(), 1);
        let capacity: usize = core
            .registry
            .shards
            .iter()
            .map(|s| s.lock().tasks.capacity())
            .sum();
        assert!(capacity <= 2 * PRUNE_MIN, "{capacity}");
        assert_eq!(core.tasks_handles().len(), 1);
        assert!(sleeper.cancel());
        assert_eq!(core.task_count(), 0);
    }
}
