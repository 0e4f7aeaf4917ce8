//! The task state word: one atomic `u64` holding the task's lifecycle flags and its next due
//! time, so every hand-off between requesters (wake, snooze, cancel) and the thread running
//! the task is a single compare-and-swap on one word.
//!
//! Layout: bits 0..60 are the due time in nanoseconds since the executor's epoch
//! ([`NEVER`] = sleeping until woken, 0 = as soon as possible); the top four bits are
//! [`QUEUED`], [`RUNNING`], [`CANCELLED`] and [`DONE`]. A task with none of the flags set is
//! idle: it waits for its due time in a timer wheel, or sleeps.
//!
//! The model: *the task is due when its due time is not after now*. A wake sets the due
//! time to 0, a snooze sets it to the requested time; the latest request wins. A run queue
//! entry or a timer entry is only a reason to look at the task again: whoever looks re-reads
//! the word, so a stale look never runs a task that is no longer due. While the task runs,
//! requests accumulate in the word (a run starts by resetting the due time to [`NEVER`]), and
//! when the run ends the next due time is the earlier of the run's own answer and whatever
//! was requested during the run. That is what makes a wake during a run never lost.

use crate::sync::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;

/// Mask of the due-time bits.
pub(crate) const DUE_MASK: u64 = (1 << 60) - 1;
/// Due time of a task sleeping until woken.
pub(crate) const NEVER: u64 = DUE_MASK;
/// The task sits in a run queue (or is being picked from one).
pub(crate) const QUEUED: u64 = 1 << 60;
/// The task's body is running.
pub(crate) const RUNNING: u64 = 1 << 61;
/// Cancel was requested while the task was queued or running; whoever holds it finishes it.
pub(crate) const CANCELLED: u64 = 1 << 62;
/// The task is finished (completed, cancelled or panicked) and will never run again.
pub(crate) const DONE: u64 = 1 << 63;

/// What a requester must do after its request changed the word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Request {
    /// The task is finished or being cancelled; nothing changed.
    Dead,
    /// Recorded; whoever holds the task (queue, runner) will see it.
    Recorded,
    /// The idle task was woken: the requester must put it on a run queue.
    Enqueue,
    /// The idle task has a new due time: the requester must make sure a timer entry at or
    /// before it exists, or queue the task if that time has already come.
    Arm(u64),
}

/// What the thread that popped a task from a run queue must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Begin {
    /// Run the body.
    Run,
    /// Cancelled while queued: finish it without running.
    Finish,
    /// Snoozed into the future while queued: it is idle again; make sure it is armed.
    NotDue(u64),
}

/// What the runner must do after the body returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The task is done: release it.
    Finish,
    /// Due again at once: put it back on a run queue.
    Enqueue,
    /// Idle until the given due time ([`NEVER`]: asleep); arm a timer for it.
    Arm(u64),
}

/// What the timer shard must do when a task's timer entry comes round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expire {
    /// Nothing: the task is held elsewhere, finished, or asleep.
    Ignore,
    /// The task became due: put it on a run queue; the value is its due time.
    Enqueue(u64),
    /// Not due yet (it was snoozed later): file a new timer entry for this due time.
    Rearm(u64),
}

/// What cancel found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// Already finished or already cancelled.
    AlreadyDead,
    /// Marked; the queue or runner holding it finishes it.
    Marked,
    /// It was idle and is now finished; the canceller must release it.
    Finish,
}

/// The state word of one task.
#[derive(Debug)]
pub(crate) struct StateWord(AtomicU64);

/// Extracts the due time.
pub(crate) fn due_of(word: u64) -> u64 {
    word & DUE_MASK
}

impl StateWord {
    /// A task that is about to be put on a run queue (due now).
    pub(crate) fn queued() -> Self {
        Self(AtomicU64::new(QUEUED))
    }

    /// An idle task due at `due` (or asleep, for [`NEVER`]).
    pub(crate) fn idle(due: u64) -> Self {
        Self(AtomicU64::new(due.min(NEVER)))
    }

    /// The current word, for inspection.
    pub(crate) fn load(&self) -> u64 {
        self.0.load(SeqCst)
    }

    #[inline]
    fn update<R>(&self, mut f: impl FnMut(u64) -> Result<(u64, R), R>) -> R {
        let mut cur = self.0.load(SeqCst);
        loop {
            let (new, result) = match f(cur) {
                Ok(x) => x,
                Err(result) => return result,
            };
            match self.0.compare_exchange_weak(cur, new, SeqCst, SeqCst) {
                Ok(_) => return result,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Asks for the task to be due at `due` (0 = wake now). Needs no clock: an idle task
    /// with a non-zero due time is left to [`Request::Arm`], which reads the clock only if
    /// it has to file a timer entry.
    #[inline]
    pub(crate) fn request(&self, due: u64) -> Request {
        let due = due.min(NEVER);
        self.update(|cur| {
            if cur & (CANCELLED | DONE) != 0 {
                return Err(Request::Dead);
            }
            let new = (cur & !DUE_MASK) | due;
            if cur & (QUEUED | RUNNING) != 0 {
                Ok((new, Request::Recorded))
            } else if due == 0 {
                Ok((new | QUEUED, Request::Enqueue))
            } else {
                Ok((new, Request::Arm(due)))
            }
        })
    }

    /// Called by the thread that popped the task from a run queue.
    pub(crate) fn begin(&self, now: u64) -> Begin {
        self.update(|cur| {
            debug_assert!(cur & QUEUED != 0, "popped a task that was not queued");
            if cur & CANCELLED != 0 {
                return Ok((DONE | CANCELLED, Begin::Finish));
            }
            let due = due_of(cur);
            if due > now {
                return Ok((due, Begin::NotDue(due)));
            }
            // Consume the due time: requests made during the run land here.
            Ok((RUNNING | NEVER, Begin::Run))
        })
    }

    /// Called by the runner after the body returned. `next` is the run's own answer
    /// (`None` = done, otherwise a due time).
    pub(crate) fn end(&self, next: Option<u64>, now: u64) -> End {
        self.update(|cur| {
            debug_assert!(cur & RUNNING != 0, "ended a run that was not running");
            let Some(next) = next else {
                return Ok((DONE | (cur & CANCELLED), End::Finish));
            };
            if cur & CANCELLED != 0 {
                return Ok((DONE | CANCELLED, End::Finish));
            }
            let due = next.min(due_of(cur));
            if due <= now {
                Ok((QUEUED | due, End::Enqueue))
            } else {
                Ok((due, End::Arm(due)))
            }
        })
    }

    /// Called when the task's timer entry comes round (after the entry was claimed).
    pub(crate) fn expire(&self, now: u64) -> Expire {
        self.update(|cur| {
            if cur & (QUEUED | RUNNING | CANCELLED | DONE) != 0 {
                return Err(Expire::Ignore);
            }
            let due = due_of(cur);
            if due == NEVER {
                Err(Expire::Ignore)
            } else if due <= now {
                Ok((cur | QUEUED, Expire::Enqueue(due)))
            } else {
                Err(Expire::Rearm(due))
            }
        })
    }

    /// Cancels the task.
    pub(crate) fn cancel(&self) -> Cancel {
        self.update(|cur| {
            if cur & (CANCELLED | DONE) != 0 {
                Err(Cancel::AlreadyDead)
            } else if cur & (QUEUED | RUNNING) != 0 {
                Ok((cur | CANCELLED, Cancel::Marked))
            } else {
                Ok((DONE | CANCELLED, Cancel::Finish))
            }
        })
    }
}

#[cfg(all(test, not(epkv_loom)))]
mod tests {
    use super::*;

    #[test]
    fn wake_of_idle_task_enqueues_once() {
        let s = StateWord::idle(NEVER);
        assert_eq!(s.request(0), Request::Enqueue);
        assert_eq!(s.request(0), Request::Recorded);
        assert_eq!(s.begin(10), Begin::Run);
    }

    #[test]
    fn wake_during_run_makes_it_due_again() {
        let s = StateWord::queued();
        assert_eq!(s.begin(5), Begin::Run);
        assert_eq!(s.request(0), Request::Recorded);
        assert_eq!(s.end(Some(NEVER), 7), End::Enqueue);
    }

    #[test]
    fn run_answer_and_requests_during_run_merge_to_the_earlier() {
        let s = StateWord::queued();
        assert_eq!(s.begin(5), Begin::Run);
        assert_eq!(s.request(500), Request::Recorded);
        assert_eq!(s.end(Some(900), 7), End::Arm(500));
        let s = StateWord::queued();
        assert_eq!(s.begin(5), Begin::Run);
        assert_eq!(s.end(Some(900), 7), End::Arm(900));
    }

    #[test]
    fn snooze_while_queued_defers_the_run() {
        let s = StateWord::queued();
        assert_eq!(s.request(1000), Request::Recorded);
        assert_eq!(s.begin(6), Begin::NotDue(1000));
        assert_eq!(s.expire(999), Expire::Rearm(1000));
        assert_eq!(s.expire(1000), Expire::Enqueue(1000));
    }

    #[test]
    fn cancel_of_idle_task_finishes_it_and_stops_requests() {
        let s = StateWord::idle(100);
        assert_eq!(s.cancel(), Cancel::Finish);
        assert_eq!(s.cancel(), Cancel::AlreadyDead);
        assert_eq!(s.request(0), Request::Dead);
        assert_eq!(s.expire(1000), Expire::Ignore);
    }

    #[test]
    fn cancel_during_run_finishes_after_the_run() {
        let s = StateWord::queued();
        assert_eq!(s.begin(1), Begin::Run);
        assert_eq!(s.cancel(), Cancel::Marked);
        assert_eq!(s.request(0), Request::Dead);
        assert_eq!(s.end(Some(0), 3), End::Finish);
        assert_eq!(s.load() & DONE, DONE);
    }

    #[test]
    fn cancel_while_queued_never_runs() {
        let s = StateWord::queued();
        assert_eq!(s.cancel(), Cancel::Marked);
        assert_eq!(s.begin(1), Begin::Finish);
    }

    #[test]
    fn done_answer_wins_over_wake_during_run() {
        let s = StateWord::queued();
        assert_eq!(s.begin(1), Begin::Run);
        assert_eq!(s.request(0), Request::Recorded);
        assert_eq!(s.end(None, 3), End::Finish);
    }
}
