//! The threaded executor: groups, wake/snooze from other threads, panics, shutdown.
//! Waits are bounded polls on conditions; nothing asserts a duration.
#![cfg(not(epkv_loom))]
#![allow(
    clippy::unwrap_used,
    reason = "integration-test helpers outside #[test] fns panic on failure by design"
)]

use epkv_executor::{
    Error, Executor, ExecutorConfig, Group, Next, Start, TaskContext, TaskSpec, TaskState,
};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(20);

/// Polls `cond` every millisecond for up to [`LIMIT`].
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..LIMIT.as_millis() {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("timed out waiting for {what}");
}

fn small() -> ExecutorConfig {
    ExecutorConfig::for_cores(2)
        .with_threads(Group::Reader, 1)
        .with_threads(Group::Writer, 1)
        .with_threads(Group::AuxIo, 1)
        .with_threads(Group::NonIo, 2)
}

#[test]
fn defaults_follow_the_core_count() {
    let c = ExecutorConfig::for_cores(2);
    assert_eq!(
        [
            c.reader_threads,
            c.writer_threads,
            c.aux_io_threads,
            c.non_io_threads
        ],
        [4, 4, 2, 2]
    );
    let c = ExecutorConfig::for_cores(64);
    assert_eq!(
        [
            c.reader_threads,
            c.writer_threads,
            c.aux_io_threads,
            c.non_io_threads
        ],
        [16, 4, 8, 8]
    );
}

#[test]
fn invalid_thread_counts_are_rejected() {
    for n in [0, 65] {
        let err = Executor::new(small().with_threads(Group::Writer, n)).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig(_)), "{err}");
    }
}

#[test]
fn each_group_runs_on_its_own_named_threads() {
    let exec = Executor::new(small()).unwrap();
    let (tx, rx) = mpsc::channel();
    for g in Group::ALL {
        let tx = tx.clone();
        exec.schedule(TaskSpec::new("where", g), move |_: &TaskContext<'_>| {
            let name = std::thread::current().name().unwrap_or("").to_owned();
            tx.send((g, name)).unwrap();
            Next::Done
        })
        .unwrap();
    }
    for _ in 0..4 {
        let (g, name) = rx.recv_timeout(LIMIT).unwrap();
        assert!(
            name.starts_with(&format!("epkv-{}-", g.as_str())),
            "{g} task ran on {name}"
        );
    }
    exec.shutdown(LIMIT).unwrap();
}

#[test]
fn periodic_task_runs_until_done() {
    let exec = Executor::new(small()).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let h = exec
        .schedule(
            TaskSpec::new("periodic", Group::NonIo),
            move |_: &TaskContext<'_>| {
                if r.fetch_add(1, SeqCst) + 1 < 5 {
                    Next::After(Duration::from_millis(1))
                } else {
                    Next::Done
                }
            },
        )
        .unwrap();
    wait_until("five runs", || h.is_done());
    assert_eq!(runs.load(SeqCst), 5);
    assert_eq!(h.stats().runs, 5);
    assert_eq!(h.state(), TaskState::Completed);
    exec.shutdown(LIMIT).unwrap();
}

#[test]
fn wake_and_earlier_snooze_from_another_thread_take_effect() {
    let exec = Executor::new(small()).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let h = exec
        .schedule(
            TaskSpec::new("t", Group::Writer).start(Start::After(Duration::from_secs(3600))),
            move |_: &TaskContext<'_>| {
                r.fetch_add(1, SeqCst);
                Next::After(Duration::from_secs(3600))
            },
        )
        .unwrap();
    let h2 = h.clone();
    std::thread::spawn(move || assert!(h2.snooze(Duration::from_millis(2))))
        .join()
        .unwrap();
    wait_until("the earlier snooze", || runs.load(SeqCst) == 1);
    let h2 = h.clone();
    std::thread::spawn(move || assert!(h2.wake()))
        .join()
        .unwrap();
    wait_until("the wake", || runs.load(SeqCst) == 2);
    exec.shutdown(LIMIT).unwrap();
    assert_eq!(h.state(), TaskState::Cancelled);
}

#[test]
fn a_task_never_runs_concurrently_with_itself() {
    let exec = Executor::new(small().with_threads(Group::NonIo, 4)).unwrap();
    let in_run = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (i, o) = (Arc::clone(&in_run), Arc::clone(&overlaps));
    let h = exec
        .schedule(
            TaskSpec::new("busy", Group::NonIo).start(Start::Sleep),
            move |_: &TaskContext<'_>| {
                if i.swap(true, SeqCst) {
                    o.fetch_add(1, SeqCst);
                }
                std::hint::black_box((0..200).sum::<u64>());
                i.store(false, SeqCst);
                Next::Sleep
            },
        )
        .unwrap();
    let wakers: Vec<_> = (0..3)
        .map(|_| {
            let h = h.clone();
            std::thread::spawn(move || {
                for _ in 0..20_000 {
                    h.wake();
                }
            })
        })
        .collect();
    for w in wakers {
        w.join().unwrap();
    }
    // The last wakes leave a run due; on a loaded machine no worker may have started it
    // yet, and shutdown cancels what has not started, so wait for a run first.
    wait_until("a run after the wakes", || h.runs() >= 1);
    exec.shutdown(LIMIT).unwrap();
    assert_eq!(overlaps.load(SeqCst), 0);
}

#[test]
fn a_panicking_task_dies_and_the_worker_keeps_serving() {
    let exec = Executor::new(small().with_threads(Group::AuxIo, 1)).unwrap();
    let bad = exec
        .schedule(
            TaskSpec::new("bad", Group::AuxIo),
            |_: &TaskContext<'_>| -> Next { panic!("deliberate test panic") },
        )
        .unwrap();
    wait_until("the panic", || bad.is_done());
    assert_eq!(bad.state(), TaskState::Panicked);
    let (tx, rx) = mpsc::channel();
    exec.schedule(
        TaskSpec::new("after", Group::AuxIo),
        move |_: &TaskContext<'_>| {
            tx.send(()).unwrap();
            Next::Done
        },
    )
    .unwrap();
    rx.recv_timeout(LIMIT).unwrap();
    exec.shutdown(LIMIT).unwrap();
}

#[test]
fn shutdown_cancels_a_task_mid_run_and_joins() {
    let exec = Executor::new(small()).unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let saw_cancel = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&saw_cancel);
    let h = exec
        .schedule(
            TaskSpec::new("long", Group::Writer),
            move |cx: &TaskContext<'_>| {
                started_tx.send(()).unwrap();
                for _ in 0..LIMIT.as_millis() {
                    if cx.is_cancelled() {
                        s.store(true, SeqCst);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Next::After(Duration::ZERO)
            },
        )
        .unwrap();
    let idle = exec
        .schedule(
            TaskSpec::new("idle", Group::NonIo).start(Start::Sleep),
            |_: &TaskContext<'_>| Next::Sleep,
        )
        .unwrap();
    started_rx.recv_timeout(LIMIT).unwrap();
    exec.shutdown(LIMIT).unwrap();
    assert!(saw_cancel.load(SeqCst));
    assert_eq!(h.state(), TaskState::Cancelled);
    assert_eq!(h.runs(), 1, "a cancelled task never starts another run");
    assert_eq!(idle.state(), TaskState::Cancelled);
    assert_eq!(exec.handle().task_count(), 0);
    assert!(matches!(
        exec.schedule(
            TaskSpec::new("late", Group::NonIo),
            |_: &TaskContext<'_>| Next::Done
        ),
        Err(Error::ShutDown)
    ));
    assert!(exec.shutdown(LIMIT).is_ok(), "second shutdown is a no-op");
}

#[test]
fn shutdown_reports_a_task_that_does_not_return_in_time() {
    let exec = Executor::new(small()).unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Mutex::new(release_rx);
    exec.schedule(
        TaskSpec::new("stuck", Group::Reader),
        move |_: &TaskContext<'_>| {
            started_tx.send(()).unwrap();
            let _ = release_rx.lock().unwrap().recv_timeout(LIMIT);
            Next::Done
        },
    )
    .unwrap();
    started_rx.recv_timeout(LIMIT).unwrap();
    match exec.shutdown(Duration::from_millis(50)) {
        Err(Error::ShutdownTimeout { threads, running }) => {
            assert_eq!(threads, 1);
            assert_eq!(running, ["stuck"]);
        }
        other => panic!("expected a shutdown timeout, got {other:?}"),
    }
    release_tx.send(()).unwrap();
}

#[test]
fn tasks_lists_every_live_task_with_stats() {
    let exec = Executor::new(small()).unwrap();
    let h = exec
        .schedule(
            TaskSpec::new("counted", Group::NonIo),
            |_: &TaskContext<'_>| Next::Sleep,
        )
        .unwrap();
    wait_until("the first run", || h.runs() == 1);
    let _far = exec
        .schedule(
            TaskSpec::new("far", Group::Reader).start(Start::After(Duration::from_secs(3600))),
            |_: &TaskContext<'_>| Next::Done,
        )
        .unwrap();
    let rows = exec.tasks();
    assert_eq!(rows.len(), 2);
    let counted = rows.iter().find(|r| r.name == "counted").unwrap();
    assert_eq!(counted.state, TaskState::Sleeping);
    assert_eq!(counted.stats.runs, 1);
    assert_eq!(counted.stats.run_time.count(), 1);
    assert_eq!(counted.stats.lateness.count(), 1);
    let far = rows.iter().find(|r| r.name == "far").unwrap();
    assert_eq!(far.state, TaskState::Snoozed);
    assert!(far.next_due.is_some());
    exec.shutdown(LIMIT).unwrap();
}

#[test]
fn handles_and_executors_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<epkv_executor::TaskHandle>();
    check::<epkv_executor::ExecutorHandle>();
    check::<Executor>();
    check::<epkv_executor::ManualExecutor>();
}

#[test]
fn timers_follow_an_offset_clock_that_jumps_forward() {
    let clock = epkv_executor::OffsetClock::new();
    let exec = Executor::new(small().with_clock(clock.clone())).unwrap();
    let (tx, rx) = mpsc::channel();
    exec.schedule(
        TaskSpec::new("in-an-hour", Group::NonIo).start(Start::After(Duration::from_secs(3600))),
        move |_: &TaskContext<'_>| {
            tx.send(()).unwrap();
            Next::Done
        },
    )
    .unwrap();
    // ADJUST_TIMEOFDAY-style jump: the parked worker notices within its longest park.
    clock.set_offset_secs(3601);
    rx.recv_timeout(LIMIT).unwrap();
    exec.shutdown(LIMIT).unwrap();
}

/// Drops one count when the task body holding it is dropped.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

#[test]
fn registry_lists_only_live_tasks_while_several_threads_schedule() {
    const THREADS: usize = 4;
    const ONE_SHOTS: usize = 2_000;
    const SLEEPERS: usize = 50;
    let exec = Executor::new(small()).unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let stop_listing = AtomicBool::new(false);
    let sleepers: Vec<_> = std::thread::scope(|s| {
        // A lister runs beside the schedulers: every task it sees must be unfinished
        // when it is listed (finished ones are pruned under the same shard lock).
        s.spawn(|| {
            while !stop_listing.load(SeqCst) {
                let listed = exec.handle().tasks();
                assert!(listed.len() <= THREADS * (ONE_SHOTS + SLEEPERS));
                std::thread::yield_now();
            }
        });
        let schedulers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (exec, ran, dropped) = (&exec, &ran, &dropped);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..ONE_SHOTS {
                        let (ran, guard) = (Arc::clone(ran), DropCount(Arc::clone(dropped)));
                        let spec = TaskSpec::new("one-shot", Group::NonIo);
                        drop(exec.handle().schedule(spec, move |_: &TaskContext<'_>| {
                            let _held = &guard;
                            ran.fetch_add(1, SeqCst);
                            Next::Done
                        }));
                        if i % (ONE_SHOTS / SLEEPERS) == 0 {
                            let guard = DropCount(Arc::clone(dropped));
                            let spec = TaskSpec::new(format!("sleeper-{t}"), Group::AuxIo)
                                .start(Start::Sleep);
                            mine.push(
                                exec.handle()
                                    .schedule(spec, move |_: &TaskContext<'_>| {
                                        let _held = &guard;
                                        Next::Sleep
                                    })
                                    .unwrap(),
                            );
                        }
                    }
                    mine
                })
            })
            .collect();
        let sleepers = schedulers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        wait_until("every one-shot to run", || {
            ran.load(SeqCst) == THREADS * ONE_SHOTS
        });
        stop_listing.store(true, SeqCst);
        sleepers
    });
    wait_until("every one-shot body to be dropped", || {
        dropped.load(SeqCst) == THREADS * ONE_SHOTS
    });
    assert_eq!(sleepers.len(), THREADS * SLEEPERS);
    assert_eq!(exec.handle().task_count(), sleepers.len());
    let listed = exec.handle().tasks();
    assert_eq!(listed.len(), sleepers.len());
    assert!(listed.iter().all(|t| t.name.starts_with("sleeper-")));
    // Shutdown cancels the sleepers, which only the registry and these handles hold.
    exec.shutdown(LIMIT).unwrap();
    assert!(sleepers.iter().all(|h| h.is_done()));
    assert_eq!(dropped.load(SeqCst), THREADS * (ONE_SHOTS + SLEEPERS));
}
