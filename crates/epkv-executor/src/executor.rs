//! The threaded [`Executor`], its [`ExecutorConfig`], and the [`ExecutorHandle`] components
//! hold to schedule work on either the threaded or the manual executor.

use crate::clock::{Clock, SystemClock};
use crate::core::{Core, Driver};
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::handle::TaskHandle;
use crate::stats::{TaskInfo, TaskState};
use crate::task::{Group, Task, TaskSpec};
use crate::thread::spawn_named;
use crate::worker::worker_loop;
use parking_lot::{Condvar, Mutex};
use std::fmt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most threads one group may have (a worker's parked flag is one bit of a `u64`).
pub const MAX_THREADS_PER_GROUP: usize = 64;

/// Thread counts and tuning of an [`Executor`].
#[derive(Clone)]
pub struct ExecutorConfig {
    /// Reader threads.
    pub reader_threads: usize,
    /// Writer threads.
    pub writer_threads: usize,
    /// AuxIO threads.
    pub aux_io_threads: usize,
    /// NonIO threads.
    pub non_io_threads: usize,
    /// How long an idle worker busy-polls for more work after a run, in rounds of one
    /// queue check and one pause instruction (256 rounds: a few microseconds). 0 skips
    /// the spin.
    pub spin_rounds: u32,
    /// After the spin, how many times an idle worker yields the CPU (checking for work in
    /// between, and wakeable by pushers) before it parks. 0 parks at once.
    pub yield_rounds: u32,
    /// Per group (indexed by [`Group::index`]), spin and yield rounds that replace
    /// [`Self::spin_rounds`] and [`Self::yield_rounds`] for its threads: a group whose
    /// tasks come milliseconds apart (the flushers) parks at once instead of burning the
    /// CPU on a spin that never finds work.
    pub group_idle_rounds: [Option<(u32, u32)>; 4],
    /// Threads are named `<prefix>-<group>-<n>`.
    pub thread_name_prefix: String,
    /// The clock every due time is read from.
    pub clock: Arc<dyn Clock>,
}

impl ExecutorConfig {
    /// Defaults for this machine's core count (see [`ExecutorConfig::for_cores`]).
    #[must_use]
    pub fn new() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        Self::for_cores(cores)
    }

    /// Defaults for `cores` cores, after KV-Engine's: Reader clamp(cores, 4, 16), Writer 4,
    /// AuxIO clamp(cores, 2, 8), NonIO clamp(30% of cores, 2, 8); the system clock.
    #[must_use]
    pub fn for_cores(cores: usize) -> Self {
        Self {
            reader_threads: cores.clamp(4, 16),
            writer_threads: 4,
            aux_io_threads: cores.clamp(2, 8),
            non_io_threads: (cores * 3 / 10).clamp(2, 8),
            spin_rounds: 256,
            yield_rounds: 16,
            group_idle_rounds: [None; 4],
            thread_name_prefix: "epkv".to_owned(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The thread count of `group`.
    #[must_use]
    pub fn threads(&self, group: Group) -> usize {
        match group {
            Group::Reader => self.reader_threads,
            Group::Writer => self.writer_threads,
            Group::AuxIo => self.aux_io_threads,
            Group::NonIo => self.non_io_threads,
        }
    }

    /// Sets the thread count of `group`.
    #[must_use]
    pub fn with_threads(mut self, group: Group, threads: usize) -> Self {
        match group {
            Group::Reader => self.reader_threads = threads,
            Group::Writer => self.writer_threads = threads,
            Group::AuxIo => self.aux_io_threads = threads,
            Group::NonIo => self.non_io_threads = threads,
        }
        self
    }

    /// Sets the clock.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets the idle spin and yield rounds (see [`ExecutorConfig::spin_rounds`] and
    /// [`ExecutorConfig::yield_rounds`]).
    #[must_use]
    pub fn with_idle_rounds(mut self, spin_rounds: u32, yield_rounds: u32) -> Self {
        self.spin_rounds = spin_rounds;
        self.yield_rounds = yield_rounds;
        self
    }

    /// Sets the idle spin and yield rounds of `group`'s threads only
    /// ([`ExecutorConfig::group_idle_rounds`]).
    #[must_use]
    pub fn with_group_idle_rounds(
        mut self,
        group: Group,
        spin_rounds: u32,
        yield_rounds: u32,
    ) -> Self {
        self.group_idle_rounds[group.index()] = Some((spin_rounds, yield_rounds));
        self
    }

    /// The idle spin and yield rounds of `group`'s threads.
    #[must_use]
    pub fn idle_rounds(&self, group: Group) -> (u32, u32) {
        self.group_idle_rounds[group.index()].unwrap_or((self.spin_rounds, self.yield_rounds))
    }

    fn validate(&self) -> Result<()> {
        for g in Group::ALL {
            let n = self.threads(g);
            if n == 0 || n > MAX_THREADS_PER_GROUP {
                return Err(Error::InvalidConfig(format!(
                    "{g} threads must be 1..={MAX_THREADS_PER_GROUP}, got {n}"
                )));
            }
        }
        Ok(())
    }
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ExecutorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutorConfig")
            .field("reader_threads", &self.reader_threads)
            .field("writer_threads", &self.writer_threads)
            .field("aux_io_threads", &self.aux_io_threads)
            .field("non_io_threads", &self.non_io_threads)
            .field("spin_rounds", &self.spin_rounds)
            .field("yield_rounds", &self.yield_rounds)
            .field("group_idle_rounds", &self.group_idle_rounds)
            .field("thread_name_prefix", &self.thread_name_prefix)
            .finish_non_exhaustive()
    }
}

/// What components hold to schedule background work: a cheap, cloneable reference to a
/// threaded [`Executor`] or a [`ManualExecutor`](crate::ManualExecutor).
#[derive(Clone)]
pub struct ExecutorHandle {
    pub(crate) core: Arc<Core>,
}

impl ExecutorHandle {
    /// Schedules `task` as described by `spec`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] once the executor is shutting down.
    pub fn schedule(&self, spec: TaskSpec, task: impl Task) -> Result<TaskHandle> {
        self.core.schedule(spec, Box::new(task))
    }

    /// One row per registered (not yet finished) task, ordered by id: what the STAT
    /// `tasks` group prints.
    #[must_use]
    pub fn tasks(&self) -> Vec<TaskInfo> {
        self.core.tasks()
    }

    /// Registered (not yet finished) tasks.
    #[must_use]
    pub fn task_count(&self) -> usize {
        self.core.task_count()
    }

    /// Timer entries held by the wheels, stale ones (left behind by re-arms, collected
    /// when their tick comes) included. A diagnostic for stats.
    #[must_use]
    pub fn timer_entries(&self) -> usize {
        self.core.timer_entries()
    }

    /// The executor's clock.
    #[must_use]
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.core.clock
    }

    /// The executor clock's current time.
    #[must_use]
    pub fn now(&self) -> Instant {
        self.core.clock.now()
    }

    /// `at` as this executor's [`Deadline`] (its epoch if `at` is earlier).
    #[must_use]
    pub fn deadline(&self, at: Instant) -> Deadline {
        Deadline(self.core.to_ns(at))
    }

    /// The executor clock's current time as a [`Deadline`]: read it once, then add
    /// durations to it for cheap re-arms with [`TaskHandle::snooze_to`].
    #[must_use]
    pub fn now_deadline(&self) -> Deadline {
        Deadline(self.core.now_ns())
    }

    /// True once shutdown has begun.
    #[must_use]
    pub fn is_shut_down(&self) -> bool {
        self.core.is_shut_down()
    }
}

impl fmt::Debug for ExecutorHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutorHandle")
            .field("tasks", &self.core.task_count())
            .field("shut_down", &self.core.is_shut_down())
            .finish()
    }
}

/// Live worker threads, and a condition variable signalled as each exits.
#[derive(Default)]
struct Live {
    count: Mutex<usize>,
    exited: Condvar,
}

/// Decrements the live count when a worker exits, even by unwinding.
struct ExitGuard(Arc<Live>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let mut n = self.0.count.lock();
        *n = n.saturating_sub(1);
        self.0.exited.notify_all();
    }
}

/// The threaded executor: four groups of named worker threads running [`Task`]s.
///
/// Dropping it shuts it down with [`Executor::DEFAULT_SHUTDOWN_TIMEOUT`] (logging if that
/// times out); call [`Executor::shutdown`] to choose the bound and see the outcome.
pub struct Executor {
    handle: ExecutorHandle,
    config: ExecutorConfig,
    workers: Mutex<Vec<JoinHandle<()>>>,
    live: Arc<Live>,
    shut: Mutex<bool>,
}

impl Executor {
    /// How long dropping an executor waits for running tasks to return.
    pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

    /// Starts the worker threads.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a group with 0 or more than
    /// [`MAX_THREADS_PER_GROUP`] threads; [`Error::SpawnThread`] if a thread cannot start
    /// (the ones already started are stopped).
    pub fn new(config: ExecutorConfig) -> Result<Self> {
        config.validate()?;
        let counts = Group::ALL.map(|g| config.threads(g));
        let core = Core::new(Arc::clone(&config.clock), counts, Driver::Threaded);
        let exec = Self {
            handle: ExecutorHandle { core },
            config,
            workers: Mutex::new(Vec::new()),
            live: Arc::new(Live::default()),
            shut: Mutex::new(false),
        };
        for g in Group::ALL {
            for i in 0..exec.config.threads(g) {
                let name = format!("{}-{}-{i}", exec.config.thread_name_prefix, g.as_str());
                let core = Arc::clone(&exec.handle.core);
                let guard = ExitGuard(Arc::clone(&exec.live));
                let (spin, yields) = exec.config.idle_rounds(g);
                *exec.live.count.lock() += 1;
                let spawned = spawn_named(name.clone(), move || {
                    let _guard = guard;
                    worker_loop(&core, g.index(), i, spin, yields);
                });
                match spawned {
                    Ok(j) => exec.workers.lock().push(j),
                    Err(source) => {
                        // The closure (and its guard) was dropped, so the count is right.
                        let _ = exec.shutdown(Self::DEFAULT_SHUTDOWN_TIMEOUT);
                        return Err(Error::SpawnThread { name, source });
                    }
                }
            }
        }
        Ok(exec)
    }

    /// A cloneable handle to schedule work and read stats.
    #[must_use]
    pub fn handle(&self) -> ExecutorHandle {
        self.handle.clone()
    }

    /// Schedules `task` (see [`ExecutorHandle::schedule`]).
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`] once the executor is shutting down.
    pub fn schedule(&self, spec: TaskSpec, task: impl Task) -> Result<TaskHandle> {
        self.handle.schedule(spec, task)
    }

    /// One row per registered task (see [`ExecutorHandle::tasks`]).
    #[must_use]
    pub fn tasks(&self) -> Vec<TaskInfo> {
        self.handle.tasks()
    }

    /// The configuration the executor was built with.
    #[must_use]
    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// Shuts down: refuses new work, cancels every task (a run in progress finishes, and
    /// its body can see [`TaskContext::is_cancelled`](crate::TaskContext::is_cancelled)),
    /// wakes every worker and waits up to `timeout` for all of them to exit, then joins
    /// them. Calling it again returns `Ok` at once.
    ///
    /// # Errors
    ///
    /// [`Error::ShutdownTimeout`] if some worker was still inside a task's run when the
    /// time ran out; those threads are left to exit on their own when the run returns.
    pub fn shutdown(&self, timeout: Duration) -> Result<()> {
        {
            let mut shut = self.shut.lock();
            if *shut {
                return Ok(());
            }
            *shut = true;
        }
        let core = &self.handle.core;
        core.begin_shutdown();
        for g in core.groups.iter() {
            g.unpark_all();
        }
        let deadline = SystemClock.now() + timeout;
        let remaining = {
            let mut n = self.live.count.lock();
            while *n > 0 {
                let now = SystemClock.now();
                if now >= deadline {
                    break;
                }
                let _ = self.live.exited.wait_for(&mut n, deadline - now);
            }
            *n
        };
        let workers = std::mem::take(&mut *self.workers.lock());
        for j in workers {
            if j.is_finished() {
                // A worker that panicked outside a task body has already been logged by
                // the panic hook; there is nothing more to do with it here.
                let _ = j.join();
            }
        }
        core.drain();
        if remaining == 0 {
            return Ok(());
        }
        let running = core
            .tasks()
            .into_iter()
            .filter(|t| matches!(t.state, TaskState::Running | TaskState::Cancelling))
            .map(|t| t.name)
            .collect();
        Err(Error::ShutdownTimeout {
            threads: remaining,
            running,
        })
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown(Self::DEFAULT_SHUTDOWN_TIMEOUT) {
            tracing::error!("executor shutdown on drop: {e}");
        }
    }
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executor")
            .field("config", &self.config)
            .field("handle", &self.handle)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_can_have_its_own_idle_rounds() {
        let c = ExecutorConfig::for_cores(2).with_group_idle_rounds(Group::Writer, 0, 0);
        assert_eq!(c.idle_rounds(Group::Writer), (0, 0));
        assert_eq!(c.idle_rounds(Group::Reader), (256, 16));
        let c = c.with_idle_rounds(8, 2);
        assert_eq!(c.idle_rounds(Group::NonIo), (8, 2));
        assert_eq!(c.idle_rounds(Group::Writer), (0, 0));
    }
}
