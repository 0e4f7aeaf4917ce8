//! [`ManualExecutor`]: the same task machinery with no threads. The test's thread fires
//! timers and runs ready tasks one at a time, with time moved by a [`ManualClock`], so
//! engine tests drive background work deterministically (KV-Engine's fake executor).

use crate::clock::{Clock, ManualClock};
use crate::core::{Core, Driver, ManualQueues};
use crate::error::Result;
use crate::executor::ExecutorHandle;
use crate::handle::TaskHandle;
use crate::state::{DONE, NEVER, RUNNING, due_of};
use crate::stats::TaskInfo;
use crate::sync::Mutex;
use crate::task::{Task, TaskSpec};
use crate::wheel::TICK_SHIFT;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A single-threaded executor driven by the caller.
///
/// Tasks become ready when woken, or when the clock has reached their due time and the
/// executor looks at its timers (every `run_*` call does). Ready tasks run in the order they
/// became ready, high priority first, whatever their group. Nothing runs unless the test
/// asks. All methods may also be called from several threads (the loom models do).
pub struct ManualExecutor {
    handle: ExecutorHandle,
    clock: Arc<ManualClock>,
}

impl ManualExecutor {
    /// A manual executor reading time from `clock`.
    #[must_use]
    pub fn new(clock: Arc<ManualClock>) -> Self {
        let dyn_clock: Arc<dyn Clock> = Arc::clone(&clock) as Arc<dyn Clock>;
        let core = Core::new(
            dyn_clock,
            [1; 4],
            Driver::Manual(Mutex::new(ManualQueues::default())),
        );
        Self {
            handle: ExecutorHandle { core },
            clock,
        }
    }

    fn core(&self) -> &Core {
        &self.handle.core
    }

    fn queues(&self) -> &Mutex<ManualQueues> {
        match &self.core().driver {
            Driver::Manual(q) => q,
            Driver::Threaded => unreachable!("a manual executor always has manual queues"),
        }
    }

    /// A handle for components to schedule work on this executor.
    #[must_use]
    pub fn handle(&self) -> ExecutorHandle {
        self.handle.clone()
    }

    /// The clock.
    #[must_use]
    pub fn clock(&self) -> &Arc<ManualClock> {
        &self.clock
    }

    /// Moves the clock forward by `d` (runs nothing).
    pub fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    /// Schedules `task` (see [`ExecutorHandle::schedule`]).
    ///
    /// # Errors
    ///
    /// [`Error::ShutDown`](crate::Error::ShutDown) after [`ManualExecutor::shutdown`].
    pub fn schedule(&self, spec: TaskSpec, task: impl Task) -> Result<TaskHandle> {
        self.handle.schedule(spec, task)
    }

    /// Makes every task whose due time has come ready.
    pub fn fire_timers(&self) {
        let core = self.core();
        let now = core.now_ns();
        for g in core.groups.iter() {
            for shard in g.shards.iter() {
                core.poll_shard(shard, now, (now >> TICK_SHIFT) + 1);
            }
        }
    }

    /// The ready tasks, in the order they will run (after firing due timers).
    #[must_use]
    pub fn ready(&self) -> Vec<TaskHandle> {
        self.fire_timers();
        let q = self.queues().lock();
        q.high.iter().chain(q.normal.iter()).cloned().collect()
    }

    /// Fires due timers, then runs the first ready task. Returns its handle, or `None` if
    /// nothing was ready. Queue entries of tasks cancelled or snoozed away meanwhile are
    /// skipped, not counted as runs.
    pub fn run_next(&self) -> Option<TaskHandle> {
        self.fire_timers();
        loop {
            let h = {
                let mut q = self.queues().lock();
                q.high.pop_front().or_else(|| q.normal.pop_front())
            }?;
            let before = h.runs();
            self.core().run(&h);
            if h.runs() > before {
                return Some(h);
            }
        }
    }

    /// Runs the next ready task, which must be called `name`.
    ///
    /// # Panics
    ///
    /// If nothing is ready or the next task has another name: a test assertion.
    #[track_caller]
    pub fn must_run_next(&self, name: &str) -> TaskHandle {
        let ready = self.ready();
        match ready.first() {
            Some(h) if h.name() == name => {}
            Some(h) => panic!("next ready task is {:?}, expected {name:?}", h.name()),
            None => panic!("no task is ready, expected {name:?}"),
        }
        match self.run_next() {
            Some(h) if h.name() == name => h,
            Some(h) => panic!("ran {:?}, expected {name:?}", h.name()),
            None => panic!("{name:?} was ready but did not run"),
        }
    }

    /// Runs ready tasks until none is ready at the current time, at most `max_runs`
    /// (a task that keeps waking itself would otherwise never stop). Returns the runs made.
    pub fn run_until_idle(&self, max_runs: usize) -> usize {
        let mut runs = 0;
        while runs < max_runs && self.run_next().is_some() {
            runs += 1;
        }
        runs
    }

    /// The earliest due time of any idle or ready task, `None` if all sleep.
    #[must_use]
    pub fn next_due(&self) -> Option<Instant> {
        let core = self.core();
        core.tasks_handles()
            .iter()
            .map(|h| h.cell().state.load())
            .filter(|w| w & (DONE | RUNNING) == 0 && due_of(*w) != NEVER)
            .map(due_of)
            .min()
            .map(|d| core.to_instant(d))
    }

    /// Moves the clock to the next due time (if it is in the future) and runs everything
    /// ready then, at most `max_runs`. Returns the runs made; 0 if nothing is due.
    pub fn advance_to_next_due(&self, max_runs: usize) -> usize {
        let Some(due) = self.next_due() else {
            return 0;
        };
        let now = self.clock.now();
        if due > now {
            self.clock.advance(due - now);
        }
        self.run_until_idle(max_runs)
    }

    /// One row per registered task (see [`ExecutorHandle::tasks`]).
    #[must_use]
    pub fn tasks(&self) -> Vec<TaskInfo> {
        self.handle.tasks()
    }

    /// Cancels every task and refuses new ones.
    pub fn shutdown(&self) {
        self.core().begin_shutdown();
        self.core().drain();
    }
}

impl Drop for ManualExecutor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl fmt::Debug for ManualExecutor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualExecutor")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}
