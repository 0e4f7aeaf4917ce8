//! [`TaskHandle`]: wake, snooze and cancel a task from any thread, including its own body.

use crate::core::TaskCell;
use crate::state::{CANCELLED, DONE, NEVER, QUEUED, RUNNING, due_of};
use crate::stats::{TaskInfo, TaskState, TaskStats};
use crate::task::{Group, Priority, TaskId};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::{Duration, Instant};

/// A reference to a scheduled task. Cheap to clone; every method may be called from any
/// thread, including from inside the task's own run.
///
/// The requests ([`wake`](Self::wake), [`snooze`](Self::snooze),
/// [`snooze_until`](Self::snooze_until), [`sleep`](Self::sleep)) all set when the task is
/// next due, and the latest one wins. While the task runs they are held and merged with the
/// run's [`Next`](crate::Next) answer: the task next runs at the earlier of the two. Each
/// returns `false` if the task is finished or cancelled. A request's effect is in force when
/// the call returns; there is no asynchronous hop to a scheduler thread.
#[derive(Clone)]
pub struct TaskHandle {
    cell: Arc<TaskCell>,
}

impl TaskHandle {
    pub(crate) fn from_cell(cell: Arc<TaskCell>) -> Self {
        Self { cell }
    }

    pub(crate) fn cell(&self) -> &TaskCell {
        &self.cell
    }

    /// The task's id.
    #[must_use]
    pub fn id(&self) -> TaskId {
        self.cell.id
    }

    /// The task's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.cell.name
    }

    /// The task's group.
    #[must_use]
    pub fn group(&self) -> Group {
        self.cell.group
    }

    /// The task's priority.
    #[must_use]
    pub fn priority(&self) -> Priority {
        self.cell.priority
    }

    /// Makes the task due as soon as possible. During a run, the task runs again right
    /// after it (unless the run answers [`Next::Done`](crate::Next::Done)).
    pub fn wake(&self) -> bool {
        let core = &self.cell.core;
        core.request(self, 0, None)
    }

    /// Makes the task due `after` from now, earlier or later than it was.
    pub fn snooze(&self, after: Duration) -> bool {
        let core = &self.cell.core;
        let now = core.now_ns();
        core.request(self, crate::core::Core::after(now, after), Some(now))
    }

    /// Makes the task due at the next multiple of `period` on the executor's clock (within
    /// `period` from now), earlier or later than it was. Tasks snoozed this way with the
    /// same period come due together, so that one timer wake-up runs them all instead of
    /// each waking a thread at its own time (the flushers of a bucket's shards).
    pub fn snooze_aligned(&self, period: Duration) -> bool {
        let core = &self.cell.core;
        let now = core.now_ns();
        let p = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX).max(1);
        let due = (now / p).saturating_add(1).saturating_mul(p);
        core.request(
            self,
            due.min(crate::core::Core::after(now, period)),
            Some(now),
        )
    }

    /// Makes the task due at `at`, earlier or later than it was (at once if `at` passed).
    #[inline]
    pub fn snooze_until(&self, at: Instant) -> bool {
        let core = &self.cell.core;
        core.request(self, core.to_ns(at), None)
    }

    /// Makes the task due at `at`, a [`Deadline`](crate::Deadline) of this task's
    /// executor, earlier or later than it was (at once if `at` passed). The cheapest
    /// re-arm: no clock read and no `Instant` conversion.
    #[inline]
    pub fn snooze_to(&self, at: crate::Deadline) -> bool {
        self.cell.core.request(self, at.0, None)
    }

    /// Makes the task sleep until woken or snoozed, dropping any due time.
    pub fn sleep(&self) -> bool {
        self.cell.core.request(self, NEVER, None)
    }

    /// Cancels the task: it never starts another run. A run in progress finishes (its
    /// body can poll [`TaskContext::is_cancelled`](crate::TaskContext::is_cancelled)); the
    /// body is dropped when no run holds it. Returns `false` if it was already finished or
    /// cancelled.
    pub fn cancel(&self) -> bool {
        self.cell.core.cancel(self)
    }

    /// True once the task has been cancelled, even if a run is still finishing.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.cell.state.load() & CANCELLED != 0
    }

    /// True once the task is finished and will never run again.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.cell.state.load() & DONE != 0
    }

    /// Where the task is in its life.
    #[must_use]
    pub fn state(&self) -> TaskState {
        let w = self.cell.state.load();
        if w & DONE != 0 {
            if w & CANCELLED != 0 {
                TaskState::Cancelled
            } else if self.cell.panicked.load(SeqCst) {
                TaskState::Panicked
            } else {
                TaskState::Completed
            }
        } else if w & CANCELLED != 0 {
            TaskState::Cancelling
        } else if w & RUNNING != 0 {
            TaskState::Running
        } else if w & QUEUED != 0 {
            TaskState::Ready
        } else if due_of(w) == NEVER {
            TaskState::Sleeping
        } else {
            TaskState::Snoozed
        }
    }

    /// When the task is next due: its due time if snoozed or queued, the time requested
    /// during a run if running. `None` if asleep or finished.
    #[must_use]
    pub fn next_due(&self) -> Option<Instant> {
        let w = self.cell.state.load();
        let due = due_of(w);
        (w & DONE == 0 && due != NEVER).then(|| self.cell.core.to_instant(due))
    }

    /// Completed runs so far.
    #[must_use]
    pub fn runs(&self) -> u64 {
        self.cell.stats.runs()
    }

    /// A snapshot of the task's statistics.
    #[must_use]
    pub fn stats(&self) -> TaskStats {
        let core = &self.cell.core;
        self.cell.stats.snapshot(|ns| core.to_instant(ns))
    }

    /// The task's row for the STAT `tasks` group.
    #[must_use]
    pub fn info(&self) -> TaskInfo {
        TaskInfo {
            id: self.id(),
            name: self.name().to_owned(),
            group: self.group(),
            priority: self.priority(),
            state: self.state(),
            next_due: self.next_due(),
            stats: self.stats(),
        }
    }
}

impl PartialEq for TaskHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.cell, &other.cell)
    }
}

impl Eq for TaskHandle {}

impl fmt::Debug for TaskHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskHandle")
            .field("id", &self.id())
            .field("name", &self.name())
            .field("group", &self.group())
            .field("state", &self.state())
            .finish()
    }
}
