//! [`FdCache`]: open data-file handles kept across writes under a descriptor budget, with
//! least-recently-used closing.
//!
//! One cache can be shared by every shard of a bucket, so the budget is per process part
//! rather than per shard. A handle handed out is an `Arc`; closing it in the cache only
//! drops the cache's reference, so a scan holding it keeps reading safely and the descriptor
//! is released when the scan ends (the budget can be exceeded by the number of running
//! scans, never more).
//!
//! Locking: one mutex around the map; `open(2)` runs under it, which serialises opens (they
//! are rare once files stay open).

use crate::error::{Error, Result};
use crate::vfs::{OpenMode, VFile, Vfs};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Descriptors left for connections, logs and everything else when the budget is derived
/// from RLIMIT_NOFILE: a quarter of the limit, at least 256 (memcached keeps 1000 of its
/// own for "temporary internal use", seed 001).
const MIN_RESERVE: u64 = 256;
/// Upper bound of the default budget (KV-Engine's ep-engine share is 30000).
const MAX_DEFAULT_BUDGET: u64 = 30_000;

/// Returns the default budget: the soft RLIMIT_NOFILE minus a reserve, between 16 and
/// 30000.
#[must_use]
pub fn default_fd_budget() -> usize {
    let soft = nofile_soft_limit().unwrap_or(1024);
    let reserve = (soft / 4).max(MIN_RESERVE);
    let budget = soft.saturating_sub(reserve).clamp(16, MAX_DEFAULT_BUDGET);
    usize::try_from(budget).unwrap_or(16)
}

#[expect(unsafe_code, reason = "getrlimit has no safe std wrapper")]
fn nofile_soft_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit struct that outlives the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut lim) };
    (rc == 0).then_some(lim.rlim_cur)
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<PathBuf, (Arc<dyn VFile>, u64)>,
    tick: u64,
}

/// An LRU of open files bounded by a descriptor budget.
#[derive(Debug)]
pub struct FdCache {
    vfs: Arc<dyn Vfs>,
    budget: usize,
    inner: Mutex<Inner>,
    opens: AtomicU64,
    emfile_retries: AtomicU64,
}

fn is_emfile(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

impl FdCache {
    /// A cache keeping at most `budget` files open; 0 closes every file after each use
    /// (KV-Engine's behaviour before MB-36572, kept for comparison).
    #[must_use]
    pub fn new(vfs: Arc<dyn Vfs>, budget: usize) -> Self {
        Self {
            vfs,
            budget,
            inner: Mutex::new(Inner::default()),
            opens: AtomicU64::new(0),
            emfile_retries: AtomicU64::new(0),
        }
    }

    /// The budget.
    #[must_use]
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Files open in the cache now.
    #[must_use]
    pub fn open_files(&self) -> usize {
        self.inner.lock().map.len()
    }

    /// Files opened since start.
    #[must_use]
    pub fn opens(&self) -> u64 {
        self.opens.load(Relaxed)
    }

    /// Opens that hit EMFILE/ENFILE and were retried after closing idle files.
    #[must_use]
    pub fn emfile_retries(&self) -> u64 {
        self.emfile_retries.load(Relaxed)
    }

    /// Returns an open handle to `path`, opening it (and closing the least recently used
    /// file if at budget) when needed.
    ///
    /// # Errors
    /// [`Error::TooManyOpenFiles`] if the OS still refuses after every cached file was
    /// closed; otherwise the open error.
    pub fn get(&self, path: &Path, mode: OpenMode) -> Result<Arc<dyn VFile>> {
        let mut g = self.inner.lock();
        g.tick += 1;
        let tick = g.tick;
        if let Some((f, t)) = g.map.get_mut(path) {
            *t = tick;
            return Ok(Arc::clone(f));
        }
        while self.budget > 0 && g.map.len() >= self.budget {
            Self::evict_lru(&mut g);
        }
        let f = match self.vfs.open(path, mode) {
            Err(e) if is_emfile(&e) && self.empty_for_retry(&mut g, path) => {
                self.vfs.open(path, mode)
            }
            r => r,
        }
        .map_err(|e| Error::io("open", path, e))?;
        self.opens.fetch_add(1, Relaxed);
        if self.budget > 0 {
            g.map.insert(path.to_owned(), (Arc::clone(&f), tick));
        }
        Ok(f)
    }

    /// Runs `op`, a descriptor-consuming call made outside the cache (a directory sync, the
    /// journal's open); if the OS is out of descriptors, closes every cached file and runs
    /// it once more. Without this a full cache could starve the store's own bookkeeping.
    ///
    /// # Errors
    /// The error of the last attempt.
    pub fn with_room<T>(
        &self,
        path: &Path,
        op: impl Fn() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        // Not under the cache's lock: `op` may be slow (an fsync), and only the retry
        // needs the cache.
        match op() {
            Err(e) if is_emfile(&e) => {
                if !self.empty_for_retry(&mut self.inner.lock(), path) {
                    return Err(e);
                }
                op()
            }
            r => r,
        }
    }

    /// Closes every cached file ahead of a retry; false if there was none to close.
    fn empty_for_retry(&self, g: &mut Inner, path: &Path) -> bool {
        if g.map.is_empty() {
            return false;
        }
        self.emfile_retries.fetch_add(1, Relaxed);
        tracing::warn!(path = %path.display(), open = g.map.len(), "EMFILE: closing cached data files and retrying");
        g.map.clear();
        true
    }

    fn evict_lru(g: &mut Inner) {
        let oldest = g
            .map
            .iter()
            .min_by_key(|(_, (_, t))| *t)
            .map(|(p, _)| p.clone());
        if let Some(p) = oldest {
            g.map.remove(&p);
        }
    }

    /// Closes the cached handle of `path`, if any (after a rename, removal or failure).
    pub fn forget(&self, path: &Path) {
        self.inner.lock().map.remove(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultFs;

    #[test]
    fn budget_bounds_open_files_and_evicts_least_recent() {
        let dir = tempfile::tempdir().unwrap();
        let c = FdCache::new(Arc::new(FaultFs::new()), 2);
        let p = |i: u32| dir.path().join(format!("f{i}"));
        c.get(&p(1), OpenMode::Create).unwrap();
        c.get(&p(2), OpenMode::Create).unwrap();
        c.get(&p(1), OpenMode::Create).unwrap();
        c.get(&p(3), OpenMode::Create).unwrap();
        assert_eq!(c.open_files(), 2);
        assert_eq!(c.opens(), 3);
        // f2 was least recently used, so it is the one reopened.
        c.get(&p(1), OpenMode::Create).unwrap();
        assert_eq!(c.opens(), 3);
        c.get(&p(2), OpenMode::Create).unwrap();
        assert_eq!(c.opens(), 4);
    }

    #[test]
    fn emfile_closes_idle_files_and_retries_then_reports() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let c = FdCache::new(Arc::new(fs.clone()), 8);
        c.get(&dir.path().join("a"), OpenMode::Create).unwrap();
        fs.set_emfile(1);
        c.get(&dir.path().join("b"), OpenMode::Create).unwrap();
        assert_eq!(c.emfile_retries(), 1);
        assert_eq!(c.open_files(), 1);
        fs.set_emfile(2);
        let e = c.get(&dir.path().join("c"), OpenMode::Create).unwrap_err();
        assert!(matches!(e, Error::TooManyOpenFiles { .. }), "{e}");
        assert!(e.is_temporary());
    }

    #[test]
    fn a_directory_sync_out_of_descriptors_closes_cached_files_and_retries() {
        let dir = tempfile::tempdir().unwrap();
        let fs = FaultFs::new();
        let c = FdCache::new(Arc::new(fs.clone()), 8);
        c.get(&dir.path().join("a"), OpenMode::Create).unwrap();
        c.get(&dir.path().join("b"), OpenMode::Create).unwrap();
        fs.set_emfile(1);
        c.with_room(dir.path(), || fs.sync_dir(dir.path())).unwrap();
        assert_eq!((c.emfile_retries(), c.open_files()), (1, 0));
        // Nothing left to close: the error is reported, not retried.
        fs.set_emfile(1);
        let e = c
            .with_room(dir.path(), || fs.sync_dir(dir.path()))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
        assert_eq!(c.emfile_retries(), 1);
    }

    #[test]
    fn default_budget_leaves_a_reserve() {
        let b = default_fd_budget() as u64;
        let soft = nofile_soft_limit().unwrap();
        assert!(b >= 16 && (b < soft || soft < 16), "{b} vs {soft}");
    }
}
