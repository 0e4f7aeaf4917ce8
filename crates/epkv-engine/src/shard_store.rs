//! [`ShardStore`]: one shard's storage, whichever backend the bucket was built with
//! ([`StorageBackend`]): the files backend ([`FileStore`]: a journal, then per-vBucket data
//! files) or the write-once log ([`LogStore`]). The flusher, warmup, background fetches and
//! compaction use it through [`KvStore`]; the few calls only one backend has are here.

use epkv_storage::{
    CleanOutcome, CompactionOutcome, Document, FileStore, KeyMeta, KvStore, LogStore, PurgeRule,
    Quarantined, Result, ScanControl, StoreStats, VbCommit, VbState,
};
use epkv_types::Vbid;
use std::path::Path;

/// Which storage a persistent bucket's shards use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StorageBackend {
    /// Whatever a shard's directory already holds, and the write-once log for a new one:
    /// a data directory written by an earlier version (files backend) keeps working.
    #[default]
    Auto,
    /// Per-vBucket data files behind a per-shard journal ([`FileStore`]): each document is
    /// written twice (journal, then its vBucket's file by the background applier), and the
    /// index stays on disk.
    Files,
    /// The write-once log ([`LogStore`]): each document is written once, and an in-memory
    /// key index per vBucket says where (about 100 bytes per stored key).
    Log,
}

impl std::str::FromStr for StorageBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "files" => Ok(Self::Files),
            "log" => Ok(Self::Log),
            other => Err(format!(
                "unknown storage backend {other:?} (auto, files or log)"
            )),
        }
    }
}

impl StorageBackend {
    /// The name the setting takes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Files => "files",
            Self::Log => "log",
        }
    }

    /// The backend whose files `dir` (a shard directory) holds, if it holds any.
    fn found_in(dir: &Path) -> Option<Self> {
        let mut found = None;
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("log-") && name.ends_with(".epkv") {
                return Some(Self::Log);
            }
            found = Some(Self::Files);
        }
        found
    }

    /// The backend to open the shard directory `dir` with: `Files` or `Log` (never
    /// `Auto`). `Auto` follows what the directory holds (the log when it holds nothing);
    /// a named backend must match it, since opening the other backend's files would find
    /// nothing and look like an empty bucket.
    ///
    /// # Errors
    /// [`epkv_storage::Error::InvalidArgument`] naming the directory and the backend it
    /// holds.
    pub(crate) fn resolve(self, dir: &Path) -> Result<Self> {
        match (self, Self::found_in(dir)) {
            (Self::Auto, found) => Ok(found.unwrap_or(Self::Log)),
            (chosen, None) => Ok(chosen),
            (chosen, Some(found)) if chosen == found => Ok(chosen),
            (chosen, Some(found)) => Err(epkv_storage::Error::InvalidArgument(format!(
                "{} holds data of the {} storage backend, not {}; start with --storage {} \
                 or auto (a data directory is not converted between backends)",
                dir.display(),
                found.name(),
                chosen.name(),
                found.name()
            ))),
        }
    }
}

/// One shard's store.
#[derive(Debug)]
pub(crate) enum ShardStore {
    Files(Box<FileStore>),
    Log(Box<LogStore>),
}

impl ShardStore {
    /// Which backend this is (`Files` or `Log`).
    pub(crate) fn backend(&self) -> StorageBackend {
        match self {
            Self::Files(_) => StorageBackend::Files,
            Self::Log(_) => StorageBackend::Log,
        }
    }

    fn kv(&self) -> &dyn KvStore {
        match self {
            Self::Files(s) => &**s,
            Self::Log(s) => &**s,
        }
    }

    /// As [`FileStore::compact_paced`]. The log backend copies nothing here (it records
    /// what the rule purges; [`ShardStore::clean`] reclaims the bytes), so `pace` is not
    /// called.
    pub(crate) fn compact_paced(
        &self,
        vbid: Vbid,
        rule: &PurgeRule,
        pace: &mut dyn FnMut(u64),
    ) -> Result<CompactionOutcome> {
        match self {
            Self::Files(s) => s.compact_paced(vbid, rule, pace),
            Self::Log(s) => s.compact(vbid, rule),
        }
    }

    /// vBuckets the files backend set aside at open (none for the log backend, which
    /// refuses to open on damage anywhere but its torn tail).
    pub(crate) fn quarantined(&self) -> Vec<Quarantined> {
        match self {
            Self::Files(s) => s.quarantined(),
            Self::Log(_) => Vec::new(),
        }
    }

    /// The damage a log store was set aside for at open (all of its shard's vBuckets are
    /// unavailable until FLUSH); always `None` for the files backend, which sets aside only
    /// the damaged vBucket ([`ShardStore::quarantined`]).
    pub(crate) fn damage(&self) -> Option<epkv_storage::Damage> {
        match self {
            Self::Files(_) => None,
            Self::Log(s) => s.damage(),
        }
    }

    /// Deletes the data of `vbids`, which are all of the shard's vBuckets (FLUSH): a
    /// damaged log store deletes all of its files and starts empty.
    pub(crate) fn wipe(&self, vbids: &[Vbid]) -> Result<()> {
        match self {
            Self::Log(s) if s.damage().is_some() => s.reset(),
            _ => self.delete_vbuckets(vbids),
        }
    }

    /// The log backend's (bytes, live bytes); `None` for the files backend.
    pub(crate) fn log_usage(&self) -> Option<(u64, u64)> {
        match self {
            Self::Files(_) => None,
            Self::Log(s) => Some(s.usage()),
        }
    }

    /// The log backend's cleaning ([`LogStore::clean`]); nothing for the files backend,
    /// whose files are compacted one vBucket at a time.
    pub(crate) fn clean(
        &self,
        fragmentation_percent: u8,
        min_bytes: u64,
        max_files: usize,
        pace: &mut dyn FnMut(u64),
    ) -> Result<CleanOutcome> {
        match self {
            Self::Files(_) => Ok(CleanOutcome::default()),
            Self::Log(s) => s.clean(fragmentation_percent, min_bytes, max_files, pace),
        }
    }
}

impl KvStore for ShardStore {
    fn commit(&self, batch: &[VbCommit]) -> Result<()> {
        self.kv().commit(batch)
    }

    fn get(&self, vbid: Vbid, key: &[u8]) -> Result<Option<Document>> {
        self.kv().get(vbid, key)
    }

    fn key_meta(&self, vbid: Vbid, key: &[u8]) -> Result<Option<KeyMeta>> {
        self.kv().key_meta(vbid, key)
    }

    fn scan_by_seqno(
        &self,
        vbid: Vbid,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(Document) -> ScanControl,
    ) -> Result<u64> {
        self.kv().scan_by_seqno(vbid, start, end, visit)
    }

    fn scan_keys(&self, vbid: Vbid, visit: &mut dyn FnMut(KeyMeta) -> ScanControl) -> Result<u64> {
        self.kv().scan_keys(vbid, visit)
    }

    fn vbucket_state(&self, vbid: Vbid) -> Result<Option<VbState>> {
        self.kv().vbucket_state(vbid)
    }

    fn set_vbucket_state(&self, vbid: Vbid, state: &VbState) -> Result<()> {
        self.kv().set_vbucket_state(vbid, state)
    }

    fn vbuckets(&self) -> Vec<Vbid> {
        self.kv().vbuckets()
    }

    fn delete_vbucket(&self, vbid: Vbid) -> Result<()> {
        self.kv().delete_vbucket(vbid)
    }

    fn delete_vbuckets(&self, vbids: &[Vbid]) -> Result<()> {
        self.kv().delete_vbuckets(vbids)
    }

    fn compact(&self, vbid: Vbid, rule: &PurgeRule) -> Result<CompactionOutcome> {
        self.kv().compact(vbid, rule)
    }

    fn apply_pending(&self, max_vbuckets: usize) -> Result<usize> {
        self.kv().apply_pending(max_vbuckets)
    }

    fn checkpoint(&self) -> Result<()> {
        self.kv().checkpoint()
    }

    fn stats(&self) -> StoreStats {
        self.kv().stats()
    }

    fn file_usage(&self) -> Vec<(Vbid, epkv_storage::FileUsage)> {
        self.kv().file_usage()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_directory_and_a_named_backend_must_match_it() {
        let dir = tempfile::tempdir().unwrap();
        // Empty or missing: auto means the log; a named backend is taken as it is.
        assert_eq!(
            StorageBackend::Auto.resolve(dir.path()).unwrap(),
            StorageBackend::Log
        );
        let missing = dir.path().join("missing");
        assert_eq!(
            StorageBackend::Files.resolve(&missing).unwrap(),
            StorageBackend::Files
        );
        std::fs::write(dir.path().join("log-00000001.epkv"), b"").unwrap();
        assert_eq!(
            StorageBackend::Auto.resolve(dir.path()).unwrap(),
            StorageBackend::Log
        );
        assert_eq!(
            StorageBackend::Log.resolve(dir.path()).unwrap(),
            StorageBackend::Log
        );
        let e = StorageBackend::Files.resolve(dir.path()).unwrap_err();
        assert!(e.to_string().contains("--storage log"), "{e}");
        // A directory of an earlier version (files backend) keeps its backend.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("journal.log"), b"").unwrap();
        assert_eq!(
            StorageBackend::Auto.resolve(dir.path()).unwrap(),
            StorageBackend::Files
        );
        assert_eq!(
            StorageBackend::Files.resolve(dir.path()).unwrap(),
            StorageBackend::Files
        );
        let e = StorageBackend::Log.resolve(dir.path()).unwrap_err();
        assert!(e.to_string().contains("--storage files"), "{e}");
    }

    #[test]
    fn backend_names_parse_back() {
        for b in [
            StorageBackend::Auto,
            StorageBackend::Files,
            StorageBackend::Log,
        ] {
            assert_eq!(b.name().parse::<StorageBackend>(), Ok(b));
        }
        assert!("couchstore".parse::<StorageBackend>().is_err());
    }
}
