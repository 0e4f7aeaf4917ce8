//! What a task is: the [`Task`] trait, its answer [`Next`], and how it is described when
//! scheduled ([`TaskSpec`], [`Group`], [`Priority`], [`Start`]).

use crate::handle::TaskHandle;
use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, Instant};

/// A unit of background work. The executor calls [`Task::run`] on one of its group's
/// threads, never concurrently with itself, and the answer says when to run it next.
///
/// Closures `FnMut(&TaskContext<'_>) -> Next + Send + 'static` are tasks.
pub trait Task: Send + 'static {
    /// Does one round of work and says what comes next.
    fn run(&mut self, cx: &TaskContext<'_>) -> Next;
}

impl<F> Task for F
where
    F: FnMut(&TaskContext<'_>) -> Next + Send + 'static,
{
    fn run(&mut self, cx: &TaskContext<'_>) -> Next {
        self(cx)
    }
}

/// A task's answer after a run.
///
/// Requests made while the task ran (a [`TaskHandle::wake`] or [`TaskHandle::snooze`] from
/// another thread or from the body itself) are merged with the answer: the task next runs at
/// the earlier of the two. So `Sleep` means "only when someone asks", and a wake that arrived
/// during the run makes the task run again at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Finished: the task is released and never runs again.
    Done,
    /// Run again this long after the run ended (`Duration::ZERO`: as soon as possible).
    After(Duration),
    /// Run again at this instant (at once if it has passed).
    At(Instant),
    /// Sleep until woken or snoozed.
    Sleep,
}

/// The thread groups. Each has its own threads, so slow disk work cannot hold up the
/// non-I/O housekeeping (KV-Engine's task types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// Reads from disk: background fetches, warmup.
    Reader,
    /// Writes to disk: the flusher.
    Writer,
    /// Other I/O: compaction, backfills, access scanner.
    AuxIo,
    /// Memory-only work: pagers, durability timeouts, checkpoint removal.
    NonIo,
}

impl Group {
    /// Every group, in index order.
    pub const ALL: [Group; 4] = [Group::Reader, Group::Writer, Group::AuxIo, Group::NonIo];

    /// The group's position in [`Group::ALL`].
    #[must_use]
    pub fn index(self) -> usize {
        match self {
            Group::Reader => 0,
            Group::Writer => 1,
            Group::AuxIo => 2,
            Group::NonIo => 3,
        }
    }

    /// The group's name as used in thread names and stats (`reader`, `writer`, `aux_io`,
    /// `non_io`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Group::Reader => "reader",
            Group::Writer => "writer",
            Group::AuxIo => "aux_io",
            Group::NonIo => "non_io",
        }
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Priority within a group: a group's threads take every ready `High` task before any
/// ready `Normal` one. (Two levels cost one extra queue check per pick; KV-Engine's finer
/// numeric priorities were ignored by its default backend anyway.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Ahead of normal tasks: latency-sensitive work such as durability timeouts.
    High,
    /// Everything else.
    #[default]
    Normal,
}

/// When a newly scheduled task first runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Start {
    /// As soon as possible.
    #[default]
    Now,
    /// This long from now.
    After(Duration),
    /// At this instant.
    At(Instant),
    /// Not until woken or snoozed (registered but dormant, like KV-Engine's timeout tasks
    /// scheduled with an infinite sleep).
    Sleep,
}

/// Describes a task to schedule: its name, group, priority and first run.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    pub(crate) name: Cow<'static, str>,
    pub(crate) group: Group,
    pub(crate) priority: Priority,
    pub(crate) start: Start,
}

impl TaskSpec {
    /// A task called `name` in `group`, normal priority, starting now.
    #[must_use]
    pub fn new(name: impl Into<Cow<'static, str>>, group: Group) -> Self {
        Self {
            name: name.into(),
            group,
            priority: Priority::Normal,
            start: Start::Now,
        }
    }

    /// Sets the priority.
    #[must_use]
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// Sets the first run.
    #[must_use]
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// The task's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The task's group.
    #[must_use]
    pub fn group(&self) -> Group {
        self.group
    }
}

/// A task's identity, unique in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What a running task can see of itself.
pub struct TaskContext<'a> {
    pub(crate) handle: &'a TaskHandle,
    pub(crate) now: Instant,
}

impl TaskContext<'_> {
    /// A handle to this task, to snooze or wake itself, or to hand to others.
    #[must_use]
    pub fn handle(&self) -> &TaskHandle {
        self.handle
    }

    /// The task's id.
    #[must_use]
    pub fn id(&self) -> TaskId {
        self.handle.id()
    }

    /// The task's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.handle.name()
    }

    /// The executor clock's time when this run started.
    #[must_use]
    pub fn now(&self) -> Instant {
        self.now
    }

    /// True once the task has been cancelled (for example by shutdown). Long runs should
    /// check it and return early: the run is never interrupted.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.handle.is_cancelled()
    }
}

impl fmt::Debug for TaskContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("id", &self.id())
            .field("name", &self.name())
            .finish()
    }
}
