//! [`FaultFs`]: a [`Vfs`] over the real file system that injects failures and simulates
//! crashes, for tests (in the manner of redb's crash backend and kv_engine's mock
//! `FileOpsInterface`).
//!
//! It keeps, per file, how many bytes a successful `fdatasync` made durable. A simulated
//! crash ([`FaultFs::crash`]) truncates every file it has seen to that length (optionally
//! keeping a random prefix of the unsynced bytes, a torn write) and makes every handle
//! opened before the crash fail, so the crashed store can no longer touch the files.
//! Names (create, rename, remove) are treated as durable at once.

use crate::vfs::{OpenMode, RealFs, VFile, Vfs};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The operations whose Nth call can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultOp {
    /// `write_all_at`.
    Write,
    /// `sync_data` (and directory syncs).
    Sync,
    /// `open`.
    Open,
    /// `rename`.
    Rename,
}

/// How many times each operation has been called since the [`FaultFs`] was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultCounts {
    /// Writes.
    pub writes: u64,
    /// Syncs.
    pub syncs: u64,
    /// Opens.
    pub opens: u64,
    /// Renames.
    pub renames: u64,
}

#[derive(Debug, Default)]
struct State {
    counts: FaultCounts,
    /// op → the count at which it fails (with EIO).
    fail_at: HashMap<FaultOp, u64>,
    /// The write count at which a write stores only half its bytes and fails.
    tear_at: Option<u64>,
    /// Opens left that fail with EMFILE.
    emfile: u32,
    /// Writes fail with ENOSPC while set.
    enospc: bool,
    /// path → bytes made durable.
    synced: HashMap<PathBuf, u64>,
    /// Bumped by a crash; handles of an older generation fail.
    generation: u64,
}

/// A fault-injecting [`Vfs`]; clones share their state.
#[derive(Debug, Clone, Default)]
pub struct FaultFs {
    inner: RealFs,
    state: Arc<Mutex<State>>,
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("injected failure: {what}"))
}

impl FaultFs {
    /// A fault-free file system until told otherwise.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the `n`th call of `op` from now fail with an I/O error (`n = 1`: the next).
    pub fn fail_nth(&self, op: FaultOp, n: u64) {
        let mut s = self.state.lock();
        let base = match op {
            FaultOp::Write => s.counts.writes,
            FaultOp::Sync => s.counts.syncs,
            FaultOp::Open => s.counts.opens,
            FaultOp::Rename => s.counts.renames,
        };
        s.fail_at.insert(op, base + n.max(1));
    }

    /// Makes the `n`th write from now store only half its bytes, then fail.
    pub fn tear_nth_write(&self, n: u64) {
        let mut s = self.state.lock();
        s.tear_at = Some(s.counts.writes + n.max(1));
    }

    /// Makes the next `count` opens (and directory syncs, which open the directory) fail
    /// with EMFILE.
    pub fn set_emfile(&self, count: u32) {
        self.state.lock().emfile = count;
    }

    /// While `on`, every write fails with ENOSPC (nothing is written).
    pub fn set_enospc(&self, on: bool) {
        self.state.lock().enospc = on;
    }

    /// Clears every pending failure.
    pub fn clear(&self) {
        let mut s = self.state.lock();
        s.fail_at.clear();
        s.tear_at = None;
        s.emfile = 0;
        s.enospc = false;
    }

    /// The call counts so far.
    #[must_use]
    pub fn counts(&self) -> FaultCounts {
        self.state.lock().counts
    }

    /// Simulates a power loss: every file is cut back to its synced length, keeping
    /// `torn_bytes(path, unsynced)` of its unsynced bytes, and every open handle dies.
    ///
    /// # Errors
    /// If a file cannot be truncated.
    pub fn crash_with(&self, mut torn_bytes: impl FnMut(&Path, u64) -> u64) -> io::Result<()> {
        let mut s = self.state.lock();
        s.generation += 1;
        for (path, synced) in &s.synced {
            let Ok(meta) = std::fs::metadata(path) else {
                continue;
            };
            let len = meta.len();
            if len > *synced {
                let keep = torn_bytes(path, len - synced).min(len - synced);
                let f = std::fs::OpenOptions::new().write(true).open(path)?;
                f.set_len(synced + keep)?;
            }
        }
        Ok(())
    }

    /// Simulates a power loss that drops every unsynced byte.
    ///
    /// # Errors
    /// If a file cannot be truncated.
    pub fn crash(&self) -> io::Result<()> {
        self.crash_with(|_, _| 0)
    }
}

#[derive(Debug)]
struct FaultFile {
    inner: Arc<dyn VFile>,
    path: PathBuf,
    generation: u64,
    state: Arc<Mutex<State>>,
}

impl FaultFile {
    fn alive(&self, s: &State) -> io::Result<()> {
        if s.generation == self.generation {
            Ok(())
        } else {
            Err(eio("handle from before a simulated crash"))
        }
    }
}

impl VFile for FaultFile {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.alive(&self.state.lock())?;
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        self.alive(&s)?;
        s.counts.writes += 1;
        let n = s.counts.writes;
        if s.enospc {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if s.fail_at.get(&FaultOp::Write) == Some(&n) {
            return Err(eio("write"));
        }
        if s.tear_at == Some(n) {
            self.inner.write_all_at(&buf[..buf.len() / 2], offset)?;
            return Err(eio("torn write"));
        }
        self.inner.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        self.alive(&s)?;
        s.counts.syncs += 1;
        let n = s.counts.syncs;
        if s.fail_at.get(&FaultOp::Sync) == Some(&n) {
            return Err(eio("sync"));
        }
        self.inner.sync_data()?;
        let len = self.inner.len()?;
        s.synced.insert(self.path.clone(), len);
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        self.alive(&self.state.lock())?;
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.state.lock();
        self.alive(&s)?;
        self.inner.set_len(len)?;
        if let Some(v) = s.synced.get_mut(&self.path) {
            *v = (*v).min(len);
        }
        Ok(())
    }
}

impl FaultFs {
    /// One open (plain or direct) through the fault layer: counted, failed if told to,
    /// and the handle wrapped so that its writes and syncs are too.
    fn open_with(
        &self,
        path: &Path,
        open: impl FnOnce(&RealFs) -> io::Result<Option<Arc<dyn VFile>>>,
    ) -> io::Result<Option<Arc<dyn VFile>>> {
        let mut s = self.state.lock();
        s.counts.opens += 1;
        let n = s.counts.opens;
        if s.emfile > 0 {
            s.emfile -= 1;
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        if s.fail_at.get(&FaultOp::Open) == Some(&n) {
            return Err(eio("open"));
        }
        let Some(inner) = open(&self.inner)? else {
            return Ok(None);
        };
        let len = inner.len()?;
        // A file first seen now is durable as it stands (it predates the fault layer or
        // was just created empty).
        s.synced.entry(path.to_owned()).or_insert(len);
        Ok(Some(Arc::new(FaultFile {
            inner,
            path: path.to_owned(),
            generation: s.generation,
            state: Arc::clone(&self.state),
        })))
    }
}

impl Vfs for FaultFs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VFile>> {
        self.open_with(path, |fs| fs.open(path, mode).map(Some))?
            .ok_or_else(|| io::Error::other("no handle"))
    }

    fn open_direct(&self, path: &Path) -> io::Result<Option<Arc<dyn VFile>>> {
        self.open_with(path, |fs| fs.open_direct(path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        s.counts.renames += 1;
        let n = s.counts.renames;
        if s.fail_at.get(&FaultOp::Rename) == Some(&n) {
            return Err(eio("rename"));
        }
        self.inner.rename(from, to)?;
        if let Some(v) = s.synced.remove(from) {
            s.synced.insert(to.to_owned(), v);
        }
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)?;
        self.state.lock().synced.remove(path);
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.list(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.state.lock();
        if s.emfile > 0 {
            s.emfile -= 1;
            return Err(io::Error::from_raw_os_error(libc::EMFILE));
        }
        s.counts.syncs += 1;
        let n = s.counts.syncs;
        if s.fail_at.get(&FaultOp::Sync) == Some(&n) {
            return Err(eio("sync dir"));
        }
        drop(s);
        self.inner.sync_dir(dir)
    }
}
