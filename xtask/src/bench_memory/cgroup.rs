//! A memory cgroup that caps the page cache of the processes put in it, so that a read
//! benchmark on a machine with far more memory than its data set still reads the disk:
//! the kernel charges page cache to the cgroup of the process that faulted it in and
//! reclaims it at the cgroup's limit.
//!
//! Made under the cgroup this process runs in: cgroup v1's `memory` hierarchy
//! (`memory.limit_in_bytes`), else cgroup v2 (`memory.max`). Needs root. Removed on drop,
//! after moving any process still in it back to the parent.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// A memory cgroup with a limit; see the module docs.
#[derive(Debug)]
pub(crate) struct MemCgroup {
    dir: PathBuf,
    parent: PathBuf,
    /// True for cgroup v1's memory hierarchy.
    v1: bool,
}

/// The directory of this process's memory cgroup and whether it is cgroup v1.
fn own_memory_cgroup() -> Result<(PathBuf, bool)> {
    let text = fs::read_to_string("/proc/self/cgroup").context("reading /proc/self/cgroup")?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        if controllers.split(',').any(|c| c == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
            if dir.join("memory.limit_in_bytes").exists() {
                return Ok((dir, true));
            }
        }
    }
    for line in text.lines() {
        if let Some(path) = line.strip_prefix("0::") {
            let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            let controllers =
                fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "memory") {
                // Children get the memory controller only if this cgroup hands it down.
                let _ = fs::write(dir.join("cgroup.subtree_control"), "+memory");
                return Ok((dir, false));
            }
        }
    }
    bail!("no memory cgroup controller found in /proc/self/cgroup")
}

impl MemCgroup {
    /// Creates a child of this process's memory cgroup named `name` (plus the pid), with
    /// `limit` bytes of memory for everything charged in it.
    ///
    /// # Errors
    /// No memory controller, not root, or a write refused.
    pub(crate) fn create(name: &str, limit: u64) -> Result<Self> {
        let (parent, v1) = own_memory_cgroup()?;
        let dir = parent.join(format!("{name}-{}", std::process::id()));
        fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let cg = Self { dir, parent, v1 };
        let file = if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        fs::write(cg.dir.join(file), limit.to_string())
            .with_context(|| format!("setting {file} of {}", cg.dir.display()))?;
        Ok(cg)
    }

    /// The file a process writes its pid to in order to join.
    pub(crate) fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Moves process `pid` (all its threads) into the cgroup. Memory it had is not moved;
    /// what it charges from now on is.
    ///
    /// # Errors
    /// The write was refused.
    pub(crate) fn add(&self, pid: u32) -> Result<()> {
        fs::write(self.procs_file(), pid.to_string())
            .with_context(|| format!("moving {pid} into {}", self.dir.display()))
    }

    /// How many times the limit was hit (v1 `memory.failcnt`, v2 `memory.events` max).
    pub(crate) fn limit_hits(&self) -> u64 {
        let read = |f: &str| fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        if self.v1 {
            read("memory.failcnt").trim().parse().unwrap_or(0)
        } else {
            read("memory.events")
                .lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0)
        }
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = fs::read_to_string(self.procs_file()) {
            for pid in procs.lines() {
                let _ = fs::write(self.parent.join("cgroup.procs"), pid);
            }
        }
        if let Err(e) = fs::remove_dir(&self.dir) {
            eprintln!("warning: cannot remove cgroup {}: {e}", self.dir.display());
        }
    }
}
