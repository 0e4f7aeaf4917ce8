//! loom models of the wake / snooze / cancel / run hand-offs, through the real code paths:
//! a [`ManualExecutor`] whose queues, wheels, registry, task bodies and state words are all
//! loom primitives (see `sync.rs`), with model threads calling the handle methods while
//! others pop and run tasks.
//!
//! Run with:
//! `RUSTFLAGS="--cfg epkv_loom" cargo test -p epkv-executor --release --lib loom`

use crate::state::RUNNING;
use crate::{
    Clock, Group, ManualClock, ManualExecutor, Next, Start, TaskContext, TaskSpec, TaskState,
};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use loom::thread;
use std::sync::Arc;
use std::time::Duration;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

fn exec() -> Arc<ManualExecutor> {
    Arc::new(ManualExecutor::new(Arc::new(ManualClock::new(
        Duration::from_secs(1_000_000),
    ))))
}

/// A wake from another thread while the task is queued or running is never lost: the
/// last run observes everything written before the wake.
#[test]
fn loom_wake_during_run_is_not_lost() {
    model(|| {
        let exec = exec();
        let flag = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(AtomicUsize::new(0));
        let (f, s) = (Arc::clone(&flag), Arc::clone(&seen));
        let h = exec
            .schedule(
                TaskSpec::new("t", Group::NonIo).start(Start::Sleep),
                move |_: &TaskContext<'_>| {
                    s.store(f.load(SeqCst), SeqCst);
                    Next::Sleep
                },
            )
            .unwrap();
        assert!(h.wake());
        let (h2, f2) = (h.clone(), Arc::clone(&flag));
        let waker = thread::spawn(move || {
            f2.store(1, SeqCst);
            assert!(h2.wake());
        });
        exec.run_next();
        waker.join().unwrap();
        exec.run_until_idle(4);
        assert_eq!(seen.load(SeqCst), 1, "the wake after the store was lost");
        assert_eq!(h.state(), TaskState::Sleeping);
    });
}

/// Two threads running the executor never run one task at once, and once `cancel`
/// returns no new run starts (only a run already in progress may finish).
#[test]
fn loom_cancel_and_concurrent_runners() {
    model(|| {
        let exec = exec();
        let in_run = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicUsize::new(0));
        let overlap = Arc::new(AtomicBool::new(false));
        let (i, st, o) = (
            Arc::clone(&in_run),
            Arc::clone(&started),
            Arc::clone(&overlap),
        );
        let h = exec
            .schedule(
                TaskSpec::new("t", Group::Writer),
                move |_: &TaskContext<'_>| {
                    st.fetch_add(1, SeqCst);
                    if i.swap(true, SeqCst) {
                        o.store(true, SeqCst);
                    }
                    i.store(false, SeqCst);
                    Next::After(Duration::ZERO)
                },
            )
            .unwrap();
        let e2 = Arc::clone(&exec);
        let runner = thread::spawn(move || {
            e2.run_next();
        });
        let (h2, st2) = (h.clone(), Arc::clone(&started));
        let canceller = thread::spawn(move || {
            assert!(h2.cancel());
            let running = h2.cell().state.load() & RUNNING != 0;
            (running, st2.load(SeqCst))
        });
        exec.run_next();
        runner.join().unwrap();
        let (running, at_cancel) = canceller.join().unwrap();
        exec.run_until_idle(4);
        let total = started.load(SeqCst);
        assert!(
            total <= at_cancel + usize::from(running),
            "a run started after cancel returned ({total} > {at_cancel} + {running})"
        );
        assert!(
            !overlap.load(SeqCst),
            "the task ran concurrently with itself"
        );
        assert_eq!(h.state(), TaskState::Cancelled);
    });
}

/// Snoozing a task with a later due time to an earlier one (already passed) from another
/// thread while the executor looks at its timers: it runs exactly once, promptly.
#[test]
fn loom_snooze_earlier_races_timers() {
    model(|| {
        let exec = exec();
        let t0 = exec.clock().now();
        let h = exec
            .schedule(
                TaskSpec::new("t", Group::NonIo).start(Start::At(t0 + Duration::from_secs(10))),
                |_: &TaskContext<'_>| Next::Sleep,
            )
            .unwrap();
        exec.advance(Duration::from_secs(2));
        let h2 = h.clone();
        let snoozer = thread::spawn(move || assert!(h2.snooze_until(t0 + Duration::from_secs(1))));
        exec.run_next();
        snoozer.join().unwrap();
        exec.run_until_idle(4);
        assert_eq!(h.runs(), 1);
        assert_eq!(h.state(), TaskState::Sleeping);
        exec.advance(Duration::from_secs(20));
        assert_eq!(exec.run_until_idle(4), 0, "the old due time fired as well");
    });
}

/// Snoozing a due task to a later time while the executor may be running it: whatever the
/// interleaving, the later due time is in force afterwards and the task runs then.
#[test]
fn loom_snooze_later_races_run() {
    model(|| {
        let exec = exec();
        let t0 = exec.clock().now();
        let later = t0 + Duration::from_secs(10);
        let h = exec
            .schedule(
                TaskSpec::new("t", Group::NonIo).start(Start::At(t0 + Duration::from_secs(1))),
                |_: &TaskContext<'_>| Next::Sleep,
            )
            .unwrap();
        exec.advance(Duration::from_secs(2));
        let h2 = h.clone();
        let snoozer = thread::spawn(move || assert!(h2.snooze_until(later)));
        exec.run_next();
        snoozer.join().unwrap();
        exec.run_until_idle(4);
        let runs = h.runs();
        assert!(runs <= 1);
        assert_eq!(h.next_due(), Some(later));
        exec.advance(Duration::from_secs(8));
        assert_eq!(exec.run_until_idle(4), 1);
        assert_eq!(h.runs(), runs + 1);
    });
}

/// Wake and cancel racing a run: the task ends cancelled, its body is dropped exactly
/// once, and nothing runs after cancel returned.
#[test]
fn loom_wake_cancel_run_release_the_body() {
    struct Body(Arc<AtomicUsize>);
    impl Drop for Body {
        fn drop(&mut self) {
            self.0.fetch_add(1, SeqCst);
        }
    }
    model(|| {
        let exec = exec();
        let drops = Arc::new(AtomicUsize::new(0));
        let body = Body(Arc::clone(&drops));
        let h = exec
            .schedule(
                TaskSpec::new("t", Group::AuxIo).start(Start::Sleep),
                move |_: &TaskContext<'_>| {
                    let _keep = &body;
                    Next::Sleep
                },
            )
            .unwrap();
        let h2 = h.clone();
        let waker = thread::spawn(move || {
            h2.wake();
        });
        let h3 = h.clone();
        let canceller = thread::spawn(move || assert!(h3.cancel()));
        exec.run_next();
        waker.join().unwrap();
        canceller.join().unwrap();
        exec.run_until_idle(4);
        assert_eq!(h.state(), TaskState::Cancelled);
        assert_eq!(
            drops.load(SeqCst),
            1,
            "the body must be dropped exactly once"
        );
        assert_eq!(exec.handle().task_count(), 0);
    });
}
