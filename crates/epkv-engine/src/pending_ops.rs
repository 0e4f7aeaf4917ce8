//! [`PendingOps`]: the client operations parked on a pending vBucket (KV-Engine's
//! `pendingOps`), each until the vBucket leaves the pending state or its wait reaches
//! [`PARK_TIMEOUT`].
//!
//! An operation on a pending vBucket (a takeover in progress) answers WouldBlock; the
//! front end's [`epkv_engine_api::Engine::when_fetched`] then parks its callback here,
//! and runs the operation again once called. The vBucket calls every parked callback when
//! its state changes ([`crate::vbucket::VBucket::set_state`]): the operation then runs on
//! an active vBucket (a move rolled back) or answers NotMyVbucket (the move done, the
//! client goes to the new active). A timeout task calls the callbacks whose wait passed
//! (the state change never came, or came late): the operation runs again, and a caller
//! that keeps being parked gives up (the front end answers TMPFAIL after a few rounds).
//!
//! Level: a leaf, owned by the vBucket. It imports no module of this crate.

use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use epkv_engine_api::FetchedCallback;
use parking_lot::Mutex;

/// How long an operation stays parked on a pending vBucket before it runs again. A
/// takeover keeps a vBucket pending for about as long as the new active takes to catch
/// up on the last changes, usually well under this; past it, the operation runs again
/// (parked again if the vBucket is still pending), so nothing waits on a takeover that
/// stalls. The front end gives up after a few such rounds (TMPFAIL).
pub(crate) const PARK_TIMEOUT: Duration = Duration::from_secs(2);

/// The parked callbacks and the timeout task's arming.
#[derive(Default)]
struct Parked {
    /// With their deadlines, in the order they were parked: deadlines grow with it (one
    /// timeout for all, each taken just before the lock; two parked at once may be a few
    /// microseconds out of order, and the later run releases the second).
    ops: VecDeque<(Instant, FetchedCallback)>,
    /// The deadline the timeout task was last armed for.
    armed: Option<Instant>,
}

/// A vBucket's parked operations (see the module docs).
#[derive(Default)]
pub(crate) struct PendingOps {
    parked: Mutex<Parked>,
    /// The timeout task, once an operation has been parked on the vBucket.
    pub(crate) task: OnceLock<epkv_executor::TaskHandle>,
}

impl std::fmt::Debug for PendingOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingOps")
            .field("parked", &self.len())
            .finish_non_exhaustive()
    }
}

impl PendingOps {
    /// Operations parked now.
    pub(crate) fn len(&self) -> usize {
        self.parked.lock().ops.len()
    }

    /// Parks `done` until `deadline`. Returns the deadline to arm the timeout task for
    /// (recorded as armed) when it must be: armed for nothing, or for later. As with the
    /// durability timeout, a task armed earlier runs once and re-arms itself.
    pub(crate) fn park(&self, deadline: Instant, done: FetchedCallback) -> Option<Instant> {
        let mut p = self.parked.lock();
        p.ops.push_back((deadline, done));
        if p.armed.is_some_and(|armed| armed <= deadline) {
            return None;
        }
        p.armed = Some(deadline);
        Some(deadline)
    }

    /// Takes every parked operation (the vBucket left the pending state, or the bucket
    /// shuts down).
    pub(crate) fn take_all(&self) -> Vec<FetchedCallback> {
        self.parked
            .lock()
            .ops
            .drain(..)
            .map(|(_, done)| done)
            .collect()
    }

    /// A run of the timeout task at `now`: takes the operations whose deadline has come,
    /// and returns them with the deadline the task must sleep until (recorded as armed),
    /// `None` when nothing is left parked.
    pub(crate) fn take_expired(&self, now: Instant) -> (Vec<FetchedCallback>, Option<Instant>) {
        let mut p = self.parked.lock();
        let mut due = Vec::new();
        while p.ops.front().is_some_and(|(deadline, _)| *deadline <= now) {
            if let Some((_, done)) = p.ops.pop_front() {
                due.push(done);
            }
        }
        p.armed = p.ops.front().map(|(deadline, _)| *deadline);
        (due, p.armed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_engine_api::EngineResult;
    use epkv_executor::Clock as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn t0() -> Instant {
        epkv_executor::ManualClock::new(Duration::ZERO).now()
    }

    fn counting(n: &Arc<AtomicUsize>) -> FetchedCallback {
        let n = Arc::clone(n);
        Box::new(move |r: EngineResult<()>| {
            assert_eq!(r, Ok(()));
            n.fetch_add(1, Ordering::Relaxed);
        })
    }

    #[test]
    fn the_task_is_armed_for_the_first_deadline_and_rearms_after_each_run() {
        let t0 = t0();
        let at = |ms| t0 + Duration::from_millis(ms);
        let ops = PendingOps::default();
        let ran = Arc::new(AtomicUsize::new(0));
        assert_eq!(ops.park(at(2000), counting(&ran)), Some(at(2000)));
        assert_eq!(ops.park(at(2500), counting(&ran)), None, "armed earlier");
        assert_eq!(ops.len(), 2);
        // Not due yet: nothing released, still armed for the head.
        let (due, next) = ops.take_expired(at(1999));
        assert!(due.is_empty());
        assert_eq!(next, Some(at(2000)));
        let (due, next) = ops.take_expired(at(2000));
        assert_eq!((due.len(), next), (1, Some(at(2500))));
        due.into_iter().for_each(|done| done(Ok(())));
        let (due, next) = ops.take_expired(at(3000));
        assert_eq!((due.len(), next), (1, None));
        due.into_iter().for_each(|done| done(Ok(())));
        assert_eq!(ran.load(Ordering::Relaxed), 2);
        // A sleeping task is armed again by the next park.
        assert_eq!(ops.park(at(5000), counting(&ran)), Some(at(5000)));
    }

    #[test]
    fn a_state_change_takes_everything_parked() {
        let t0 = t0();
        let ops = PendingOps::default();
        let ran = Arc::new(AtomicUsize::new(0));
        for i in 0..3 {
            ops.park(t0 + Duration::from_secs(i), counting(&ran));
        }
        let all = ops.take_all();
        assert_eq!((all.len(), ops.len()), (3, 0));
        all.into_iter().for_each(|done| done(Ok(())));
        assert_eq!(ran.load(Ordering::Relaxed), 3);
        let (due, next) = ops.take_expired(t0 + Duration::from_secs(10));
        assert!(
            due.is_empty() && next.is_none(),
            "a later run finds nothing"
        );
    }
}
