//! Random wake / snooze / sleep / cancel / advance / run sequences on the ManualExecutor,
//! checked against a model of the documented semantics: requests set the next due time
//! (latest wins), a task never runs before it is due, a due task runs when the executor
//! runs what is ready, and a cancelled task never runs again.
#![cfg(not(epkv_loom))]
#![allow(
    clippy::unwrap_used,
    reason = "integration-test helpers outside #[test] fns panic on failure by design"
)]

use epkv_executor::{
    Clock, Group, ManualClock, ManualExecutor, Next, Start, TaskContext, TaskHandle, TaskSpec,
    TaskState,
};
use proptest::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

const TASKS: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    Wake(usize),
    Snooze(usize, u64),
    Sleep(usize),
    Cancel(usize),
    Advance(u64),
    RunAll,
    RunOne,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..TASKS).prop_map(Op::Wake),
        ((0..TASKS), 0u64..5_000).prop_map(|(i, ms)| Op::Snooze(i, ms)),
        (0..TASKS).prop_map(Op::Sleep),
        (0..TASKS).prop_map(Op::Cancel),
        (0u64..3_000).prop_map(Op::Advance),
        Just(Op::RunAll),
        Just(Op::RunOne),
    ]
}

#[derive(Debug, Clone, Copy)]
struct ModelTask {
    /// Due time in ns since the start; `None` = asleep.
    due: Option<u64>,
    cancelled: bool,
    runs: u64,
    /// The task's answer: `None` = Sleep, `Some(ms)` = After(ms).
    answer: Option<u64>,
}

impl ModelTask {
    fn is_due(&self, now: u64) -> bool {
        !self.cancelled && self.due.is_some_and(|d| d <= now)
    }

    fn ran(&mut self, now: u64) {
        self.runs += 1;
        self.due = self.answer.map(|ms| now + ms * 1_000_000);
    }
}

struct World {
    exec: ManualExecutor,
    start: Instant,
    handles: Vec<TaskHandle>,
    model: Vec<ModelTask>,
    now: u64,
}

impl World {
    fn new(answers: &[Option<u64>], starts: &[Option<u64>]) -> Self {
        let exec = ManualExecutor::new(Arc::new(ManualClock::new(Duration::from_secs(1 << 30))));
        let start = exec.clock().now();
        let mut handles = Vec::new();
        let mut model = Vec::new();
        for (i, (&answer, &first)) in answers.iter().zip(starts).enumerate() {
            let next = answer.map_or(Next::Sleep, |ms| Next::After(Duration::from_millis(ms)));
            let spec = TaskSpec::new(format!("task-{i}"), Group::ALL[i % 4]).start(match first {
                None => Start::Sleep,
                Some(ms) => Start::After(Duration::from_millis(ms)),
            });
            handles.push(
                exec.schedule(spec, move |_: &TaskContext<'_>| next)
                    .unwrap(),
            );
            model.push(ModelTask {
                due: first.map(|ms| ms * 1_000_000),
                cancelled: false,
                runs: 0,
                answer,
            });
        }
        Self {
            exec,
            start,
            handles,
            model,
            now: 0,
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Wake(i) => {
                let alive = self.handles[i].wake();
                prop_assert_eq!(alive, !self.model[i].cancelled);
                if alive {
                    self.model[i].due = Some(0);
                }
            }
            Op::Snooze(i, ms) => {
                let alive = self.handles[i].snooze(Duration::from_millis(ms));
                prop_assert_eq!(alive, !self.model[i].cancelled);
                if alive {
                    self.model[i].due = Some(self.now + ms * 1_000_000);
                }
            }
            Op::Sleep(i) => {
                let alive = self.handles[i].sleep();
                prop_assert_eq!(alive, !self.model[i].cancelled);
                if alive {
                    self.model[i].due = None;
                }
            }
            Op::Cancel(i) => {
                prop_assert_eq!(self.handles[i].cancel(), !self.model[i].cancelled);
                self.model[i].cancelled = true;
            }
            Op::Advance(ms) => {
                self.exec.advance(Duration::from_millis(ms));
                self.now += ms * 1_000_000;
            }
            Op::RunAll => {
                let expected = self.model.iter().filter(|t| t.is_due(self.now)).count();
                let ran = self.exec.run_until_idle(100);
                prop_assert_eq!(ran, expected);
                let now = self.now;
                for t in self.model.iter_mut().filter(|t| t.is_due(now)) {
                    t.ran(now);
                }
            }
            Op::RunOne => match self.exec.run_next() {
                Some(h) => {
                    let i = self.handles.iter().position(|x| *x == h).unwrap();
                    prop_assert!(
                        self.model[i].is_due(self.now),
                        "task {} ran when not due",
                        i
                    );
                    self.model[i].ran(self.now);
                }
                None => {
                    prop_assert!(!self.model.iter().any(|t| t.is_due(self.now)));
                }
            },
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        for (h, t) in self.handles.iter().zip(&self.model) {
            prop_assert_eq!(h.runs(), t.runs, "runs of {}", h.name());
            if t.cancelled {
                // A task cancelled while ready stays Cancelling until its queue entry is
                // popped (and then finished without running).
                prop_assert!(matches!(
                    h.state(),
                    TaskState::Cancelled | TaskState::Cancelling
                ));
            } else {
                let want = t.due.map(|d| self.start + Duration::from_nanos(d));
                prop_assert_eq!(h.next_due(), want, "due of {}", h.name());
                prop_assert!(!h.state().is_dead());
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn manual_executor_matches_model(
        answers in proptest::collection::vec(proptest::option::of(1u64..4_000), TASKS),
        starts in proptest::collection::vec(proptest::option::of(0u64..4_000), TASKS),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let mut w = World::new(&answers, &starts);
        w.check()?;
        for op in &ops {
            w.apply(op)?;
        }
        // Drain: run everything due from here on; cancelled tasks never run again.
        let runs_at_cancel: Vec<u64> = w.model.iter().map(|t| t.runs).collect();
        for _ in 0..10 {
            w.apply(&Op::Advance(5_000))?;
            w.apply(&Op::RunAll)?;
        }
        for ((h, t), before) in w.handles.iter().zip(&w.model).zip(runs_at_cancel) {
            if t.cancelled {
                prop_assert_eq!(h.runs(), before);
                prop_assert_eq!(h.state(), TaskState::Cancelled);
            }
        }
    }
}
