//! Bounded multi-thread stress: driver threads issue random wake / snooze / sleep / cancel
//! requests at tasks running on a threaded executor while the tasks check, on every run,
//! that they are not running twice at once and have not been cancelled. At the end every
//! surviving task is woken once more and must run after that wake (no lost wake), and
//! shutdown must join everything. Bounded in iterations and in waiting time.
#![cfg(not(epkv_loom))]
#![allow(
    clippy::unwrap_used,
    reason = "integration-test helpers outside #[test] fns panic on failure by design"
)]

use epkv_executor::{
    Executor, ExecutorConfig, Group, Next, Start, TaskContext, TaskHandle, TaskSpec, TaskState,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

const TASKS: usize = 48;
const DRIVERS: usize = 3;
const OPS_PER_DRIVER: usize = 200_000;

struct Probe {
    in_run: AtomicBool,
    /// Set by a driver after its `cancel()` returned true.
    cancelled: AtomicBool,
    /// Bumped by a driver before it wakes the task.
    wake_gen: AtomicU64,
    /// The `wake_gen` the task saw at the start of its latest run.
    seen_gen: AtomicU64,
    runs: AtomicU64,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_requests_keep_every_guarantee() {
    let exec = Executor::new(
        ExecutorConfig::for_cores(2)
            .with_threads(Group::Reader, 1)
            .with_threads(Group::Writer, 2)
            .with_threads(Group::AuxIo, 1)
            .with_threads(Group::NonIo, 3),
    )
    .unwrap();
    let violations = Arc::new(AtomicUsize::new(0));
    let mut probes = Vec::new();
    let mut handles: Vec<TaskHandle> = Vec::new();
    for i in 0..TASKS {
        let p = Arc::new(Probe {
            in_run: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            wake_gen: AtomicU64::new(0),
            seen_gen: AtomicU64::new(0),
            runs: AtomicU64::new(0),
        });
        let (probe, bad) = (Arc::clone(&p), Arc::clone(&violations));
        let group = if i % 3 == 0 {
            Group::Writer
        } else {
            Group::NonIo
        };
        let h = exec
            .schedule(
                TaskSpec::new(format!("stress-{i}"), group).start(Start::Sleep),
                move |_: &TaskContext<'_>| {
                    if probe.in_run.swap(true, SeqCst) {
                        bad.fetch_add(1, SeqCst);
                    }
                    if probe.cancelled.load(SeqCst) {
                        bad.fetch_add(1, SeqCst);
                    }
                    probe.seen_gen.store(probe.wake_gen.load(SeqCst), SeqCst);
                    let n = probe.runs.fetch_add(1, SeqCst);
                    std::hint::black_box((0..(n % 64)).sum::<u64>());
                    probe.in_run.store(false, SeqCst);
                    match n % 4 {
                        0 => Next::After(Duration::from_micros(n % 1500)),
                        1 => Next::After(Duration::ZERO),
                        _ => Next::Sleep,
                    }
                },
            )
            .unwrap();
        probes.push(p);
        handles.push(h);
    }

    std::thread::scope(|s| {
        for d in 0..DRIVERS {
            let (handles, probes) = (&handles, &probes);
            s.spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (d as u64 + 1));
                for _ in 0..OPS_PER_DRIVER {
                    let r = rng.next();
                    #[expect(clippy::cast_possible_truncation, reason = "modulo a small count")]
                    let i = (r % TASKS as u64) as usize;
                    let (h, p) = (&handles[i], &probes[i]);
                    match (r >> 32) % 100 {
                        0..=39 => {
                            p.wake_gen.fetch_add(1, SeqCst);
                            h.wake();
                        }
                        40..=69 => {
                            h.snooze(Duration::from_micros((r >> 40) % 3000));
                        }
                        70..=89 => {
                            h.snooze(Duration::from_secs(10 + (r >> 40) % 20));
                        }
                        90..=98 => {
                            h.sleep();
                        }
                        _ => {
                            // Cancel a few tasks, never the first ones, so most survive.
                            if i >= TASKS / 2 && (r >> 48).is_multiple_of(8) && h.cancel() {
                                p.cancelled.store(true, SeqCst);
                            }
                        }
                    }
                }
            });
        }
    });

    // No lost wake: every surviving task, woken once more, runs after that wake.
    for (h, p) in handles.iter().zip(&probes) {
        if !p.cancelled.load(SeqCst) {
            let g = p.wake_gen.fetch_add(1, SeqCst) + 1;
            assert!(h.wake(), "{} died without being cancelled", h.name());
            wait(|| p.seen_gen.load(SeqCst) >= g);
        }
    }
    for (h, p) in handles.iter().zip(&probes) {
        if p.cancelled.load(SeqCst) {
            wait(|| h.state() == TaskState::Cancelled);
        } else {
            assert!(!h.state().is_dead());
        }
        assert_eq!(h.runs(), p.runs.load(SeqCst));
    }
    let total: u64 = probes.iter().map(|p| p.runs.load(SeqCst)).sum();
    eprintln!("stress: {total} runs");
    assert!(total > TASKS as u64, "the storm must actually run tasks");
    exec.shutdown(Duration::from_secs(20)).unwrap();
    assert_eq!(violations.load(SeqCst), 0);
    assert!(handles.iter().all(TaskHandle::is_done));
    assert_eq!(exec.handle().task_count(), 0);
}

fn wait(mut cond: impl FnMut() -> bool) {
    for _ in 0..20_000 {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("condition not reached within 20 s");
}
