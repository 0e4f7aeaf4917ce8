//! The executor's guarantees, driven deterministically through the ManualExecutor.
#![cfg(not(epkv_loom))]
#![allow(
    clippy::unwrap_used,
    reason = "integration-test helpers outside #[test] fns panic on failure by design"
)]

use epkv_executor::{
    Clock, Error, Group, ManualClock, ManualExecutor, Next, Priority, Start, TaskContext,
    TaskHandle, TaskSpec, TaskState,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn exec() -> ManualExecutor {
    ManualExecutor::new(Arc::new(ManualClock::new(Duration::from_secs(
        1_700_000_000,
    ))))
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// A task counting its runs and answering `next`.
fn counting(
    exec: &ManualExecutor,
    name: &'static str,
    start: Start,
    next: Next,
) -> (TaskHandle, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let h = exec
        .schedule(
            TaskSpec::new(name, Group::NonIo).start(start),
            move |_: &TaskContext<'_>| {
                r.fetch_add(1, SeqCst);
                next
            },
        )
        .unwrap();
    (h, runs)
}

#[test]
fn one_shot_runs_once_and_is_released() {
    let exec = exec();
    let (h, runs) = counting(&exec, "one-shot", Start::Now, Next::Done);
    assert_eq!(h.state(), TaskState::Ready);
    assert_eq!(exec.handle().task_count(), 1);
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(h.state(), TaskState::Completed);
    assert_eq!(exec.handle().task_count(), 0);
    assert!(!h.wake(), "a finished task cannot be woken");
    assert_eq!(exec.run_until_idle(10), 0);
}

#[test]
fn periodic_task_runs_at_each_interval_and_not_before() {
    let exec = exec();
    let (_h, runs) = counting(&exec, "periodic", Start::Now, Next::After(secs(10)));
    assert_eq!(exec.run_until_idle(10), 1);
    exec.advance(secs(10) - Duration::from_nanos(1));
    assert_eq!(exec.run_until_idle(10), 0, "ran before its due time");
    exec.advance(Duration::from_nanos(1));
    assert_eq!(exec.run_until_idle(10), 1);
    exec.advance(secs(35));
    assert_eq!(exec.run_until_idle(10), 1, "missed periods do not pile up");
    assert_eq!(runs.load(SeqCst), 3);
}

#[test]
fn sleeping_task_runs_only_when_woken() {
    let exec = exec();
    let (h, runs) = counting(&exec, "sleeper", Start::Sleep, Next::Sleep);
    assert_eq!(h.state(), TaskState::Sleeping);
    exec.advance(secs(3600));
    assert_eq!(exec.run_until_idle(10), 0);
    assert!(h.wake());
    assert!(h.wake(), "a second wake before the run coalesces");
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(h.state(), TaskState::Sleeping);
}

#[test]
fn snooze_to_an_earlier_deadline_takes_effect() {
    let exec = exec();
    let (h, runs) = counting(&exec, "t", Start::After(secs(30)), Next::Sleep);
    assert!(h.snooze(secs(5)));
    exec.advance(secs(5));
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(runs.load(SeqCst), 1);
    exec.advance(secs(60));
    assert_eq!(
        exec.run_until_idle(10),
        0,
        "the old deadline must not fire too"
    );
}

#[test]
fn tasks_snoozed_to_a_grid_come_due_together_within_one_period() {
    let exec = exec();
    let (a, runs_a) = counting(&exec, "a", Start::Sleep, Next::Sleep);
    let (b, runs_b) = counting(&exec, "b", Start::Sleep, Next::Sleep);
    let period = Duration::from_millis(50);
    assert!(a.snooze_aligned(period));
    let due = a.next_due().unwrap();
    let now = exec.clock().now();
    assert!(due > now && due <= now + period, "within one period");
    exec.advance(Duration::from_millis(7));
    assert!(b.snooze_aligned(period));
    assert_eq!(
        b.next_due(),
        Some(due),
        "the later snooze lands on the same point"
    );
    exec.advance(due - exec.clock().now() - Duration::from_nanos(1));
    assert_eq!(exec.run_until_idle(10), 0, "ran before the grid point");
    exec.advance(Duration::from_nanos(1));
    assert_eq!(exec.run_until_idle(10), 2, "one point runs both");
    assert_eq!((runs_a.load(SeqCst), runs_b.load(SeqCst)), (1, 1));
    assert!(a.snooze_aligned(period));
    assert_eq!(
        a.next_due(),
        Some(due + period),
        "the next point, not the one just run"
    );
}

#[test]
fn snooze_to_a_later_deadline_takes_effect() {
    let exec = exec();
    let (h, runs) = counting(&exec, "t", Start::After(secs(5)), Next::Sleep);
    assert!(h.snooze(secs(30)));
    exec.advance(secs(29));
    assert_eq!(exec.run_until_idle(10), 0, "ran at the old deadline");
    assert_eq!(h.next_due(), Some(exec.clock().now() + secs(1)));
    exec.advance(secs(1));
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn snooze_of_a_ready_task_defers_it() {
    let exec = exec();
    let (h, runs) = counting(&exec, "t", Start::Now, Next::Sleep);
    assert!(h.snooze(secs(10)));
    assert_eq!(exec.run_until_idle(10), 0);
    assert_eq!(h.state(), TaskState::Snoozed);
    exec.advance(secs(10));
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn sleep_drops_the_deadline() {
    let exec = exec();
    let (h, runs) = counting(&exec, "t", Start::After(secs(5)), Next::Sleep);
    assert!(h.sleep());
    assert_eq!(h.next_due(), None);
    exec.advance(secs(100));
    assert_eq!(exec.run_until_idle(10), 0);
    assert_eq!(runs.load(SeqCst), 0);
    assert!(h.snooze_until(exec.clock().now()));
    assert_eq!(exec.run_until_idle(10), 1);
}

#[test]
fn repeated_re_arms_leave_one_run_and_few_timer_entries() {
    let exec = exec();
    let (h, runs) = counting(&exec, "timeout", Start::Sleep, Next::Sleep);
    for i in 0..10_000u64 {
        assert!(h.snooze(secs(10 + i % 20)));
    }
    assert!(
        exec.handle().timer_entries() <= 2,
        "re-arms later than the pending check must not add entries: {}",
        exec.handle().timer_entries()
    );
    assert!(h.snooze(secs(20)));
    for _ in 0..30 {
        exec.advance(secs(1));
        exec.run_until_idle(10);
    }
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn wake_during_run_makes_it_run_again() {
    let exec = exec();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let h = exec
        .schedule(
            TaskSpec::new("self-waker", Group::NonIo),
            move |cx: &TaskContext<'_>| {
                if r.fetch_add(1, SeqCst) == 0 {
                    assert!(cx.handle().wake());
                }
                Next::Sleep
            },
        )
        .unwrap();
    assert_eq!(exec.run_until_idle(10), 2);
    assert_eq!(runs.load(SeqCst), 2);
    assert_eq!(h.state(), TaskState::Sleeping);
}

#[test]
fn snooze_during_run_merges_with_the_answer_earliest_wins() {
    let exec = exec();
    let h = exec
        .schedule(
            TaskSpec::new("t", Group::NonIo),
            move |cx: &TaskContext<'_>| {
                assert!(cx.handle().snooze(Duration::from_secs(3)));
                Next::After(Duration::from_secs(60))
            },
        )
        .unwrap();
    assert_eq!(exec.run_until_idle(1), 1);
    assert_eq!(h.next_due(), Some(exec.clock().now() + secs(3)));
    let (h2, _) = counting(&exec, "t2", Start::Now, Next::After(secs(4)));
    exec.run_until_idle(10);
    assert_eq!(h2.next_due(), Some(exec.clock().now() + secs(4)));
}

#[test]
fn cancel_stops_future_runs_and_drops_the_body() {
    struct Body(Arc<AtomicBool>);
    impl Drop for Body {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let exec = exec();
    let dropped = Arc::new(AtomicBool::new(false));
    let body = Body(Arc::clone(&dropped));
    let h = exec
        .schedule(
            TaskSpec::new("t", Group::Writer).start(Start::After(secs(1))),
            move |_: &TaskContext<'_>| {
                let _keep = &body;
                Next::After(Duration::from_secs(1))
            },
        )
        .unwrap();
    exec.advance(secs(1));
    assert_eq!(exec.run_until_idle(10), 1);
    assert!(h.cancel());
    assert!(!h.cancel(), "second cancel reports already dead");
    assert!(
        dropped.load(SeqCst),
        "the body is dropped when cancelled while idle"
    );
    assert_eq!(h.state(), TaskState::Cancelled);
    assert!(!h.wake() && !h.snooze(Duration::ZERO));
    exec.advance(secs(10));
    assert_eq!(exec.run_until_idle(10), 0);
    assert_eq!(h.runs(), 1);
}

#[test]
fn cancel_of_a_ready_task_prevents_its_run() {
    let exec = exec();
    let (h, runs) = counting(&exec, "t", Start::Now, Next::Done);
    assert!(h.cancel());
    assert_eq!(h.state(), TaskState::Cancelling);
    assert_eq!(exec.run_until_idle(10), 0);
    assert_eq!(runs.load(SeqCst), 0);
    assert_eq!(h.state(), TaskState::Cancelled);
}

#[test]
fn cancel_inside_the_run_ends_the_task_after_it() {
    let exec = exec();
    let h = exec
        .schedule(TaskSpec::new("t", Group::AuxIo), |cx: &TaskContext<'_>| {
            assert!(cx.handle().cancel());
            assert!(cx.is_cancelled());
            assert!(!cx.handle().wake());
            Next::After(Duration::ZERO)
        })
        .unwrap();
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(h.state(), TaskState::Cancelled);
}

#[test]
fn done_answer_ends_the_task_even_if_woken_during_the_run() {
    let exec = exec();
    let h = exec
        .schedule(TaskSpec::new("t", Group::NonIo), |cx: &TaskContext<'_>| {
            cx.handle().wake();
            Next::Done
        })
        .unwrap();
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(h.state(), TaskState::Completed);
}

#[test]
fn panicking_task_is_marked_dead_and_others_keep_running() {
    let exec = exec();
    let bad = exec
        .schedule(
            TaskSpec::new("bad", Group::NonIo),
            |_: &TaskContext<'_>| -> Next { panic!("boom") },
        )
        .unwrap();
    let (good, runs) = counting(&exec, "good", Start::Now, Next::Done);
    assert_eq!(exec.run_until_idle(10), 2);
    assert_eq!(bad.state(), TaskState::Panicked);
    assert!(!bad.wake());
    assert_eq!(good.state(), TaskState::Completed);
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn ready_tasks_run_in_order_high_priority_first() {
    let exec = exec();
    let order = Arc::new(Mutex::new(Vec::new()));
    for (name, prio) in [
        ("a", Priority::Normal),
        ("b", Priority::High),
        ("c", Priority::Normal),
        ("d", Priority::High),
    ] {
        let o = Arc::clone(&order);
        exec.schedule(
            TaskSpec::new(name, Group::Reader).priority(prio),
            move |cx: &TaskContext<'_>| {
                o.lock().unwrap().push(cx.name().to_owned());
                Next::Done
            },
        )
        .unwrap();
    }
    let names: Vec<String> = exec.ready().iter().map(|h| h.name().to_owned()).collect();
    assert_eq!(names, ["b", "d", "a", "c"]);
    exec.must_run_next("b");
    exec.must_run_next("d");
    assert_eq!(exec.run_until_idle(10), 2);
    assert_eq!(*order.lock().unwrap(), ["b", "d", "a", "c"]);
}

#[test]
#[should_panic(expected = "expected \"pager\"")]
fn must_run_next_panics_on_the_wrong_task() {
    let exec = exec();
    counting(&exec, "flusher", Start::Now, Next::Done);
    exec.must_run_next("pager");
}

#[test]
fn stats_count_runs_and_lateness() {
    let exec = exec();
    let clock = Arc::clone(exec.clock());
    let (h, _) = counting(&exec, "t", Start::After(secs(1)), Next::After(secs(1)));
    exec.advance(secs(3)); // due at 1 s, starts at 3 s: 2 s late
    assert_eq!(exec.run_until_idle(10), 1);
    let s = h.stats();
    assert_eq!(s.runs, 1);
    assert_eq!(s.lateness.count(), 1);
    let late = s.lateness.quantile(1.0).unwrap();
    assert!(
        late >= secs(2) && late <= secs(4),
        "lateness bucket {late:?}"
    );
    assert_eq!(s.last_start, Some(clock.now()));
    assert_eq!(s.run_time.count(), 1);
    let info = exec.tasks();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].name, "t");
    assert_eq!(info[0].group, Group::NonIo);
    assert_eq!(info[0].state, TaskState::Snoozed);
    assert_eq!(info[0].next_due, Some(clock.now() + secs(1)));
    assert_eq!(info[0].stats.runs, 1);
}

#[test]
fn next_due_and_advance_to_next_due() {
    let exec = exec();
    let (_a, ra) = counting(&exec, "a", Start::After(secs(7)), Next::Sleep);
    let (_b, rb) = counting(&exec, "b", Start::After(secs(3)), Next::Sleep);
    let (_c, _) = counting(&exec, "c", Start::Sleep, Next::Sleep);
    assert_eq!(exec.next_due(), Some(exec.clock().now() + secs(3)));
    assert_eq!(exec.advance_to_next_due(10), 1);
    assert_eq!(rb.load(SeqCst), 1);
    assert_eq!(exec.advance_to_next_due(10), 1);
    assert_eq!(ra.load(SeqCst), 1);
    assert_eq!(exec.next_due(), None);
    assert_eq!(exec.advance_to_next_due(10), 0);
}

#[test]
fn shutdown_cancels_everything_and_refuses_new_work() {
    let exec = exec();
    let (a, _) = counting(&exec, "a", Start::Now, Next::Sleep);
    let (b, _) = counting(&exec, "b", Start::After(secs(5)), Next::Sleep);
    let (c, _) = counting(&exec, "c", Start::Sleep, Next::Sleep);
    exec.shutdown();
    for h in [&a, &b, &c] {
        assert_eq!(h.state(), TaskState::Cancelled, "{h:?}");
    }
    assert_eq!(exec.handle().task_count(), 0);
    assert_eq!(exec.handle().timer_entries(), 0);
    let err = exec
        .schedule(
            TaskSpec::new("late", Group::NonIo),
            |_: &TaskContext<'_>| Next::Done,
        )
        .unwrap_err();
    assert!(matches!(err, Error::ShutDown));
    assert_eq!(exec.run_until_idle(10), 0);
}

#[test]
fn run_at_an_instant_in_the_past_runs_at_once() {
    let exec = exec();
    let past = exec.clock().now();
    exec.advance(secs(5));
    let (h, runs) = counting(&exec, "t", Start::At(past), Next::At(past));
    assert_eq!(
        exec.run_until_idle(3),
        3,
        "Next::At in the past keeps it due"
    );
    assert_eq!(runs.load(SeqCst), 3);
    assert!(h.cancel());
}

#[test]
fn snooze_to_a_deadline_moves_the_task_earlier_and_later() {
    let exec = exec();
    let handle = exec.handle();
    let (h, runs) = counting(&exec, "timeout", Start::Sleep, Next::Sleep);
    let base = handle.now_deadline();
    assert_eq!(handle.deadline(exec.clock().now()), base);
    assert!(h.snooze_to(base + secs(30)));
    // Earlier: the 30 s arm must not hold it back.
    assert!(h.snooze_to(base + secs(10)));
    exec.advance(secs(9));
    assert_eq!(exec.run_until_idle(10), 0);
    exec.advance(secs(1));
    assert_eq!(exec.run_until_idle(10), 1);
    // Later: re-armed 20 s out, then pushed to 40 s; nothing runs at 20 s.
    assert!(h.snooze_to(handle.now_deadline() + secs(20)));
    assert!(h.snooze_to(handle.now_deadline() + secs(40)));
    exec.advance(secs(20));
    assert_eq!(exec.run_until_idle(10), 0);
    exec.advance(secs(20));
    assert_eq!(exec.run_until_idle(10), 1);
    assert_eq!(runs.load(SeqCst), 2);
    // A deadline in the past makes the task due at once.
    assert!(h.snooze_to(base));
    assert_eq!(exec.run_until_idle(10), 1);
    assert!(h.cancel());
    assert!(
        !h.snooze_to(base + secs(1)),
        "a cancelled task refuses re-arms"
    );
}
