//! [`PagerWaker`]: how a write, or the memory tracker's high-watermark hook, wakes the item
//! pager ([`crate::item_pager`]) without knowing it.
//!
//! Level: a leaf. It imports no module of this crate.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

/// Wakes the pager task; shared with the memory tracker's high-watermark hook.
#[derive(Debug, Default)]
pub(crate) struct PagerWaker {
    /// The pager task, once scheduled.
    pub(crate) task: OnceLock<epkv_executor::TaskHandle>,
    /// Set by a wake, cleared by the pager when it looks at memory (so a burst of
    /// wakes wakes the task once).
    pub(crate) woken: AtomicBool,
    /// Set when a write was refused for lack of memory: the next run starts a cycle
    /// even below the high watermark (if above the low one). The high-watermark hook does
    /// not set it: it fires on reserved bytes, which run ahead of the bytes items hold by
    /// up to the tracker's per-thread reserves, so the pager checks the exact figure.
    pub(crate) urgent: AtomicBool,
}

impl PagerWaker {
    /// Wakes the pager unless a wake is already pending.
    pub(crate) fn wake(&self) {
        if !self.woken.swap(true, Ordering::AcqRel)
            && let Some(t) = self.task.get()
        {
            t.wake();
        }
    }

    /// Wakes the pager for a refused write (see `urgent`).
    pub(crate) fn wake_urgent(&self) {
        self.urgent.store(true, Ordering::Release);
        self.wake();
    }
}
