//! Task executor for epkv background work, and the [`Clock`] every component reads time from.
//!
//! All of the engine's background work (flushers, background fetches, warmup, compaction,
//! pagers, one durability-timeout task per vBucket) runs here as [`Task`]s on four thread
//! groups ([`Group`]): Reader, Writer, AuxIO and NonIO, each with its own named threads. It
//! is **not** an async runtime: a task is a plain `run` method that says what comes next
//! ([`Next`]), and the engine stays runtime-agnostic. It knows no engine task names.
//!
//! # Key types
//!
//! - [`Executor`] (threads, built from an [`ExecutorConfig`]) and [`ManualExecutor`]
//!   (no threads; the test runs ready tasks one at a time with a [`ManualClock`]). Both hand
//!   out an [`ExecutorHandle`] for components to [`schedule`](ExecutorHandle::schedule) on.
//! - [`Task`], [`Next`], [`TaskSpec`] (name, [`Group`], [`Priority`], [`Start`]),
//!   [`TaskContext`].
//! - [`TaskHandle`]: wake, snooze (to a duration or an instant), sleep and cancel from any
//!   thread, including the task's own run.
//! - [`TaskInfo`], [`TaskStats`], [`Histogram`]: per-task runs, run-time and lateness
//!   histograms, what the STAT `tasks` group prints.
//! - [`Clock`], [`SystemClock`], [`OffsetClock`], [`ManualClock`]; [`spawn_named`], the
//!   one way epkv starts threads.
//!
//! # Guarantees (each one tested, see `docs/executor.md`)
//!
//! 1. A task never runs concurrently with itself.
//! 2. A cancelled task never starts another run (a run in progress finishes).
//! 3. No wake is lost: a wake during a run makes the task run again after it.
//! 4. Snoozing to an earlier or a later time takes effect, and is in force when the call
//!    returns. Requests set the next due time (latest wins); requests made during a run are
//!    merged with the run's answer (earliest wins).
//! 5. A task never runs before its due time, and with worker threads at most one timer
//!    tick (about 1 ms) after it, given a free thread.
//! 6. Shutdown cancels everything and joins the threads within the given bound, provided
//!    running tasks return within it; [`Executor::shutdown`] reports the ones that did not.
//! 7. A panic in a task is caught, logged with the task's name, and the task is marked
//!    dead ([`TaskState::Panicked`]).
//!
//! Re-arming a task's due time is one compare-and-swap on the task plus one load, with no
//! lock and no shared cache line, unless it moves the due time before the task's pending
//! timer check (see `docs/executor.md`, "Timers").
//!
//! # Dependencies
//!
//! Depends on no workspace crate and must never depend on one (`xtask check-layers`);
//! externally on parking_lot, crossbeam, thiserror and tracing (and loom under
//! `--cfg epkv_loom`).
//!
//! # Example
//!
//! ```
//! use epkv_executor::{Group, ManualClock, ManualExecutor, Next, TaskSpec, Start};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), epkv_executor::Error> {
//! let exec = ManualExecutor::new(Arc::new(ManualClock::new(Duration::from_secs(1_000_000))));
//! let mut runs = 0;
//! let h = exec.schedule(
//!     TaskSpec::new("pager", Group::NonIo).start(Start::After(Duration::from_secs(5))),
//!     move |_cx: &epkv_executor::TaskContext<'_>| {
//!         runs += 1;
//!         if runs < 2 { Next::After(Duration::from_secs(5)) } else { Next::Done }
//!     },
//! )?;
//! assert_eq!(exec.run_until_idle(10), 0); // not due yet
//! exec.advance(Duration::from_secs(5));
//! assert_eq!(exec.run_until_idle(10), 1);
//! h.wake(); // run again now instead of in 5 s
//! assert_eq!(exec.run_until_idle(10), 1);
//! assert!(h.is_done());
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod clock;
mod core;
mod deadline;
mod error;
mod executor;
mod handle;
mod manual;
mod state;
mod stats;
mod sync;
mod task;
mod thread;
mod wheel;
mod worker;

#[cfg(all(test, epkv_loom))]
mod loom_tests;

pub use clock::{Clock, ManualClock, OffsetClock, SystemClock};
pub use deadline::Deadline;
pub use error::{Error, Result};
pub use executor::{Executor, ExecutorConfig, ExecutorHandle, MAX_THREADS_PER_GROUP};
pub use handle::TaskHandle;
pub use manual::ManualExecutor;
pub use stats::{HISTOGRAM_BUCKETS, Histogram, TaskInfo, TaskState, TaskStats};
pub use task::{Group, Next, Priority, Start, Task, TaskContext, TaskId, TaskSpec};
pub use thread::spawn_named;
