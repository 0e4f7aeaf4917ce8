//! [`DcpLog`]: a vBucket's log of its recent changes, read by DCP streams
//! ([`crate::dcp`]).
//!
//! It sits below the vBucket: the ordering point appends to it with the vBucket's ordering
//! lock held, so the log is in seqno order with no gaps (it holds every seqno above its
//! `base`). It is kept only while at least one stream is attached, so a bucket nobody
//! streams from pays one atomic load per write, and it is bounded: bytes are charged to
//! the bucket's memory quota, at most [`LOG_BYTES`] per vBucket, and when full (or when
//! the quota refuses the charge) the oldest entries go and `base` moves up.
//!
//! Level: a leaf. It imports no module of this crate.

use epkv_hashtable::MemoryTracker;
use epkv_storage::Document;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Waker};

/// Most bytes a vBucket's log holds (keys, values and a fixed overhead per entry).
pub(crate) const LOG_BYTES: usize = 1 << 20;
/// Bytes charged per entry besides its key and value.
const ENTRY_OVERHEAD: usize = 96;

/// What a log entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogKind {
    /// A mutation, or the commit of a SyncWrite to a stream without sync replication.
    Mutation,
    /// A deletion or expiry.
    Deletion,
    /// A SyncWrite's prepare at a durability level (1-3).
    Prepare(u8),
    /// The commit of the prepare with this seqno.
    Commit(u64),
    /// The abort of the prepare with this seqno.
    Abort(u64),
    /// A scope or collection change ([`crate::system_events`]).
    System,
}

/// One change in the log: what it is and the document the flusher persists for it.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) kind: LogKind,
    pub(crate) doc: Document,
}

impl Entry {
    fn charge(&self) -> usize {
        ENTRY_OVERHEAD + self.doc.key.len() + self.doc.value.len()
    }
}

#[derive(Debug, Default)]
struct LogInner {
    /// Streams attached.
    streams: usize,
    /// Every seqno above `base` is in `entries` (which may still be empty).
    base: u64,
    entries: VecDeque<Entry>,
    /// Bytes charged for `entries`.
    bytes: usize,
    /// Streams waiting for an entry.
    wakers: Vec<Waker>,
}

/// A vBucket's log of recent changes for DCP streams (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct DcpLog {
    /// True while a stream is attached: the ordering point appends.
    on: AtomicBool,
    inner: Mutex<LogInner>,
}

/// What a read of the log found.
pub(crate) enum Read {
    /// Entries after the cursor (at least one).
    Entries(Vec<Entry>),
    /// The cursor is below the log's base: the log cannot serve it.
    Behind { base: u64 },
    /// Nothing after the cursor yet; the waker is registered.
    Empty,
}

impl DcpLog {
    /// True while streams are attached (the ordering point must call [`Self::append`]).
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Attaches a stream. The caller holds the vBucket's ordering lock and gives its high
    /// seqno, so that the first stream's log starts exactly after it.
    pub(crate) fn attach(&self, high_seqno: u64) {
        let mut l = self.inner.lock();
        if l.streams == 0 {
            l.base = high_seqno;
            self.on.store(true, Ordering::Relaxed);
        }
        l.streams += 1;
    }

    /// Detaches a stream; the last one turns the log off and frees it.
    pub(crate) fn detach(&self, memory: &MemoryTracker) {
        let mut l = self.inner.lock();
        l.streams = l.streams.saturating_sub(1);
        if l.streams == 0 {
            self.on.store(false, Ordering::Relaxed);
            l.entries.clear();
            memory.release(std::mem::take(&mut l.bytes));
            l.wakers.clear();
        }
    }

    /// Appends the change `doc` of `kind`. Called at the ordering point, with the
    /// ordering lock held, for every seqno while the log is on.
    pub(crate) fn append(&self, kind: LogKind, doc: &Document, memory: &MemoryTracker) {
        let entry = Entry {
            kind,
            doc: doc.clone(),
        };
        let charge = entry.charge();
        let wakers = {
            let mut l = self.inner.lock();
            if l.streams == 0 {
                return;
            }
            while !l.entries.is_empty()
                && (l.bytes + charge > LOG_BYTES || memory.try_charge(charge).is_err())
            {
                let old = l.entries.pop_front().map_or(0, |e| e.charge());
                l.bytes -= old;
                memory.release(old);
                l.base = l.entries.front().map_or(doc.seqno - 1, |e| e.doc.seqno - 1);
            }
            if l.entries.is_empty() && memory.try_charge(charge).is_err() {
                // No room even for this one: the log restarts after it.
                l.base = doc.seqno;
            } else {
                l.bytes += charge;
                l.entries.push_back(entry);
            }
            std::mem::take(&mut l.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Wakes every waiting stream (a state change).
    pub(crate) fn wake_all(&self) {
        let wakers = std::mem::take(&mut self.inner.lock().wakers);
        for w in wakers {
            w.wake();
        }
    }

    /// The entries after `cursor`, up to `end` and about `budget` bytes.
    pub(crate) fn read(&self, cursor: u64, end: u64, budget: usize, cx: &Context<'_>) -> Read {
        let mut l = self.inner.lock();
        if cursor < l.base {
            return Read::Behind { base: l.base };
        }
        let from = l.entries.partition_point(|e| e.doc.seqno <= cursor);
        if from == l.entries.len() {
            if !l.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                l.wakers.push(cx.waker().clone());
            }
            return Read::Empty;
        }
        let mut out = Vec::new();
        let mut size = 0;
        for e in l.entries.range(from..) {
            if e.doc.seqno > end || (size >= budget && !out.is_empty()) {
                break;
            }
            size += e.charge();
            out.push(e.clone());
        }
        Read::Entries(out)
    }
}
