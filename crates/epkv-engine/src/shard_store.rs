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
    /// Per-vBucket data files behind a per-shard journal ([`FileStore`]): each document is
    /// written twice (journal, then its vBucket's file by the background applier).
    #[default]
    Files,
    /// The write-once log ([`LogStore`]): each document is written once, and an in-memory
    /// key index per vBucket says where (about 50 bytes plus the key per stored key).
    Log,
}

impl std::str::FromStr for StorageBackend {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "files" => Ok(Self::Files),
            "log" => Ok(Self::Log),
            other => Err(format!("unknown storage backend {other:?} (files or log)")),
        }
    }
}

impl StorageBackend {
    /// The name the setting takes.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Files => "files",
            Self::Log => "log",
        }
    }

    /// Whether `file` (a name in a shard directory) belongs to this backend's format.
    fn owns(self, file: &str) -> bool {
        let log = file.starts_with("log-") && file.ends_with(".epkv");
        match self {
            Self::Log => log,
            Self::Files => !log,
        }
    }

    /// Refuses a shard directory that holds the other backend's files: opening it would
    /// find nothing and look like an empty bucket.
    ///
    /// # Errors
    /// [`epkv_storage::Error::InvalidArgument`] naming the directory and the other backend.
    pub(crate) fn check_dir(self, dir: &Path) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(());
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !self.owns(&name) {
                let other = match self {
                    Self::Files => Self::Log,
                    Self::Log => Self::Files,
                };
                return Err(epkv_storage::Error::InvalidArgument(format!(
                    "{} holds data of the {} storage backend ({name}); start with --storage {} \
                     (this bucket's data is not converted between backends)",
                    dir.display(),
                    other.name(),
                    other.name()
                )));
            }
        }
        Ok(())
    }
}

/// One shard's store.
#[derive(Debug)]
pub(crate) enum ShardStore {
    Files(FileStore),
    Log(LogStore),
}

impl ShardStore {
    fn kv(&self) -> &dyn KvStore {
        match self {
            Self::Files(s) => s,
            Self::Log(s) => s,
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
    fn each_backend_refuses_a_directory_of_the_other() {
        let dir = tempfile::tempdir().unwrap();
        // Empty or missing: either may open it.
        StorageBackend::Log.check_dir(dir.path()).unwrap();
        StorageBackend::Files
            .check_dir(&dir.path().join("missing"))
            .unwrap();
        std::fs::write(dir.path().join("log-00000001.epkv"), b"").unwrap();
        StorageBackend::Log.check_dir(dir.path()).unwrap();
        let e = StorageBackend::Files.check_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("--storage log"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("journal.log"), b"").unwrap();
        StorageBackend::Files.check_dir(dir.path()).unwrap();
        let e = StorageBackend::Log.check_dir(dir.path()).unwrap_err();
        assert!(e.to_string().contains("--storage files"), "{e}");
    }

    #[test]
    fn backend_names_parse_back() {
        for b in [StorageBackend::Files, StorageBackend::Log] {
            assert_eq!(b.name().parse::<StorageBackend>(), Ok(b));
        }
        assert!("couchstore".parse::<StorageBackend>().is_err());
    }
}
