//! Per-task statistics: run count, run-time and scheduling-lateness histograms, and the
//! snapshot types the STAT `tasks` group reads ([`TaskInfo`], [`TaskStats`], [`Histogram`]).
//!
//! Only the thread running a task writes its statistics, and a task never runs concurrently
//! with itself, so recording is a relaxed load and store per counter (no read-modify-write);
//! readers may see a run half recorded, never a torn counter.

use crate::task::{Group, Priority, TaskId};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Buckets per histogram. Bucket 0 holds values under 1.024 µs; bucket `i` holds
/// `[2^(i+9), 2^(i+10))` ns; the last bucket everything from 2^40 ns (about 18 minutes) up.
/// Power-of-two buckets match KV-Engine's task histograms in spirit and fit 256 bytes.
pub const HISTOGRAM_BUCKETS: usize = 32;

fn bucket_of(nanos: u64) -> usize {
    let micros_ish = nanos >> 10;
    let idx = (64 - micros_ish.leading_zeros()) as usize;
    idx.min(HISTOGRAM_BUCKETS - 1)
}

/// The lower bound of bucket `i`, in nanoseconds.
fn bucket_lower(i: usize) -> u64 {
    if i == 0 { 0 } else { 1u64 << (i + 9) }
}

#[derive(Debug)]
pub(crate) struct AtomicHistogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
}

impl AtomicHistogram {
    fn new() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Records one value; single writer only.
    fn record(&self, nanos: u64) {
        let b = &self.buckets[bucket_of(nanos)];
        b.store(b.load(Relaxed) + 1, Relaxed);
    }

    fn snapshot(&self) -> Histogram {
        Histogram {
            counts: std::array::from_fn(|i| self.buckets[i].load(Relaxed)),
        }
    }
}

/// The live statistics of one task.
#[derive(Debug)]
pub(crate) struct StatsCell {
    runs: AtomicU64,
    total_run_nanos: AtomicU64,
    total_late_nanos: AtomicU64,
    last_run_nanos: AtomicU64,
    max_run_nanos: AtomicU64,
    /// Start of the last run, in executor nanoseconds; `u64::MAX` before the first run.
    last_start: AtomicU64,
    run_time: AtomicHistogram,
    lateness: AtomicHistogram,
}

impl StatsCell {
    pub(crate) fn new() -> Self {
        Self {
            runs: AtomicU64::new(0),
            total_run_nanos: AtomicU64::new(0),
            total_late_nanos: AtomicU64::new(0),
            last_run_nanos: AtomicU64::new(0),
            max_run_nanos: AtomicU64::new(0),
            last_start: AtomicU64::new(u64::MAX),
            run_time: AtomicHistogram::new(),
            lateness: AtomicHistogram::new(),
        }
    }

    /// Records one run that started at `start` (executor nanoseconds), took `run_nanos`
    /// and started `late_nanos` after the task became ready. Single writer only.
    pub(crate) fn record(&self, start: u64, run_nanos: u64, late_nanos: u64) {
        self.runs.store(self.runs.load(Relaxed) + 1, Relaxed);
        self.total_run_nanos.store(
            self.total_run_nanos.load(Relaxed).saturating_add(run_nanos),
            Relaxed,
        );
        self.total_late_nanos.store(
            self.total_late_nanos
                .load(Relaxed)
                .saturating_add(late_nanos),
            Relaxed,
        );
        self.last_run_nanos.store(run_nanos, Relaxed);
        if run_nanos > self.max_run_nanos.load(Relaxed) {
            self.max_run_nanos.store(run_nanos, Relaxed);
        }
        self.last_start.store(start, Relaxed);
        self.run_time.record(run_nanos);
        self.lateness.record(late_nanos);
    }

    pub(crate) fn runs(&self) -> u64 {
        self.runs.load(Relaxed)
    }

    pub(crate) fn snapshot(&self, to_instant: impl Fn(u64) -> Instant) -> TaskStats {
        let start = self.last_start.load(Relaxed);
        TaskStats {
            runs: self.runs.load(Relaxed),
            total_run_time: Duration::from_nanos(self.total_run_nanos.load(Relaxed)),
            total_lateness: Duration::from_nanos(self.total_late_nanos.load(Relaxed)),
            last_run_time: Duration::from_nanos(self.last_run_nanos.load(Relaxed)),
            max_run_time: Duration::from_nanos(self.max_run_nanos.load(Relaxed)),
            last_start: (start != u64::MAX).then(|| to_instant(start)),
            run_time: self.run_time.snapshot(),
            lateness: self.lateness.snapshot(),
        }
    }
}

/// A task's statistics, allocated at its first run: a one-shot task's requester does not
/// pay for them, and a timeout task that never fires never allocates them.
#[derive(Debug, Default)]
pub(crate) struct LazyStats(std::sync::OnceLock<Box<StatsCell>>);

impl LazyStats {
    /// Records a run (see [`StatsCell::record`]); single writer only.
    pub(crate) fn record(&self, start: u64, run_nanos: u64, late_nanos: u64) {
        self.0
            .get_or_init(|| Box::new(StatsCell::new()))
            .record(start, run_nanos, late_nanos);
    }

    pub(crate) fn runs(&self) -> u64 {
        self.0.get().map_or(0, |s| s.runs())
    }

    pub(crate) fn snapshot(&self, to_instant: impl Fn(u64) -> Instant) -> TaskStats {
        match self.0.get() {
            Some(s) => s.snapshot(to_instant),
            None => TaskStats {
                runs: 0,
                total_run_time: Duration::ZERO,
                total_lateness: Duration::ZERO,
                last_run_time: Duration::ZERO,
                max_run_time: Duration::ZERO,
                last_start: None,
                run_time: Histogram::default(),
                lateness: Histogram::default(),
            },
        }
    }
}

/// A power-of-two histogram of durations (see [`HISTOGRAM_BUCKETS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: [u64; HISTOGRAM_BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: [0; HISTOGRAM_BUCKETS],
        }
    }
}

impl Histogram {
    /// Values recorded.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Non-empty buckets as `(lower bound, upper bound, count)`; the last bucket's upper
    /// bound is `Duration::MAX`.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, Duration, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| {
                let upper = if i + 1 == HISTOGRAM_BUCKETS {
                    Duration::MAX
                } else {
                    Duration::from_nanos(bucket_lower(i + 1))
                };
                (Duration::from_nanos(bucket_lower(i)), upper, *c)
            })
    }

    /// The upper bound of the bucket holding quantile `q` (0.0..=1.0), or `None` if
    /// empty. Values in the last bucket report its lower bound.
    #[must_use]
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "q is clamped to [0, 1] so the rank lies in [1, total]"
        )]
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let bound = if i + 1 == HISTOGRAM_BUCKETS {
                    bucket_lower(i)
                } else {
                    bucket_lower(i + 1)
                };
                return Some(Duration::from_nanos(bound));
            }
        }
        None
    }

    /// Adds another histogram's counts to this one (to aggregate tasks by name).
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
    }
}

/// A snapshot of one task's statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStats {
    /// Completed runs.
    pub runs: u64,
    /// Sum of all run times.
    pub total_run_time: Duration,
    /// Sum of all runs' scheduling lateness (see [`TaskStats::lateness`]).
    pub total_lateness: Duration,
    /// The last run's time.
    pub last_run_time: Duration,
    /// The longest run.
    pub max_run_time: Duration,
    /// When the last run started (executor clock), if it ran.
    pub last_start: Option<Instant>,
    /// Run times.
    pub run_time: Histogram,
    /// Scheduling lateness: from the moment the task became ready (its due time, or the
    /// wake) until its run started.
    pub lateness: Histogram,
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// On a run queue, waiting for a thread.
    Ready,
    /// Its body is running.
    Running,
    /// Idle until a due time.
    Snoozed,
    /// Idle until woken.
    Sleeping,
    /// Cancel was requested while it was queued or running; it will not run again.
    Cancelling,
    /// Returned [`Next::Done`](crate::Next::Done).
    Completed,
    /// Cancelled.
    Cancelled,
    /// Its body panicked.
    Panicked,
}

impl TaskState {
    /// The state's name for stats (`ready`, `running`, `snoozed`, ...).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Ready => "ready",
            TaskState::Running => "running",
            TaskState::Snoozed => "snoozed",
            TaskState::Sleeping => "sleeping",
            TaskState::Cancelling => "cancelling",
            TaskState::Completed => "completed",
            TaskState::Cancelled => "cancelled",
            TaskState::Panicked => "panicked",
        }
    }

    /// True for the three finished states.
    #[must_use]
    pub fn is_dead(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Cancelled | TaskState::Panicked
        )
    }
}

/// One row of the STAT `tasks` group: a task's identity, state and statistics.
#[derive(Debug, Clone)]
pub struct TaskInfo {
    /// The task's id.
    pub id: TaskId,
    /// The task's name.
    pub name: String,
    /// Its group.
    pub group: Group,
    /// Its priority.
    pub priority: Priority,
    /// Its state.
    pub state: TaskState,
    /// When it is next due, if it is snoozed or ready.
    pub next_due: Option<Instant>,
    /// Its statistics.
    pub stats: TaskStats,
}

#[cfg(all(test, not(epkv_loom)))]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_above_a_microsecond() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1023), 0);
        assert_eq!(bucket_of(1024), 1);
        assert_eq!(bucket_of(2047), 1);
        assert_eq!(bucket_of(2048), 2);
        assert_eq!(bucket_of(u64::MAX), HISTOGRAM_BUCKETS - 1);
        for i in 1..HISTOGRAM_BUCKETS {
            assert_eq!(bucket_of(bucket_lower(i)), i);
            assert_eq!(bucket_of(bucket_lower(i) - 1), i - 1);
        }
    }

    #[test]
    fn stats_record_runs_and_quantiles() {
        let s = StatsCell::new();
        for i in 0..100u64 {
            s.record(i, 1_000 * (i + 1), 500);
        }
        let base = crate::clock::Clock::now(&crate::clock::SystemClock);
        let snap = s.snapshot(|n| base + Duration::from_nanos(n));
        assert_eq!(snap.runs, 100);
        assert_eq!(snap.max_run_time, Duration::from_micros(100));
        assert_eq!(snap.last_run_time, Duration::from_micros(100));
        assert_eq!(snap.total_run_time, Duration::from_micros(5050));
        assert_eq!(snap.total_lateness, Duration::from_micros(50));
        assert_eq!(snap.run_time.count(), 100);
        assert_eq!(
            snap.lateness.quantile(1.0),
            Some(Duration::from_nanos(1024))
        );
        let p50 = snap.run_time.quantile(0.5).unwrap();
        assert!(p50 >= Duration::from_micros(50) && p50 <= Duration::from_micros(128));
        assert_eq!(snap.last_start, Some(base + Duration::from_nanos(99)));
        let mut merged = snap.run_time.clone();
        merged.merge(&snap.run_time);
        assert_eq!(merged.count(), 200);
        assert_eq!(Histogram::default().quantile(0.5), None);
    }
}
