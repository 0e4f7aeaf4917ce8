//! [`BucketManager`]: the buckets the server serves, built at start from the settings and
//! the runtime bucket list, and created or dropped while it runs (the management REST API).
//!
//! Two kinds of bucket:
//! - *configured* ones (`default` and `--buckets`), which come from the settings at every
//!   start and cannot be dropped at run time (they would come back at the next start);
//! - *runtime* ones, created through the REST API and recorded in the runtime bucket list
//!   `DATA_DIR/buckets.json` (written atomically on every change, read at start), so they
//!   survive a restart. A memory-only server (`--persistence false`) writes nothing under
//!   the data directory: its runtime buckets last until exit.
//!
//! Order of the steps, so that a crash at any point leaves a state the next start serves:
//! a create builds the engine (and its directory) and then records it in the list; a drop
//! takes it out of the list and then removes its directory. A directory left behind by an
//! interrupted create or drop is not in the list; it is removed before a bucket of the
//! same name is created again.
//!
//! Every change runs under one mutex (`table`); the front end's [`Buckets`] lock is taken
//! only for the insert or remove itself, so KV connections never wait on a bucket being
//! built or shut down.

use crate::settings::Settings;
use anyhow::{Context, Result};
use epkv_engine::{Bucket, BucketConfig, EngineClock, EphemeralFullPolicy, EvictionPolicy};
use epkv_engine_api::Engine;
use epkv_frontend::{Buckets, DEFAULT_BUCKET};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The runtime bucket list's file name, in the data directory.
pub(crate) const BUCKET_LIST_FILE: &str = "buckets.json";

/// The runtime bucket list's format version.
const LIST_VERSION: u32 = 1;

/// Couchbase's bucket types that epkv serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum BucketType {
    /// A persistent bucket (Couchbase's `couchbase`, reported as `membase`).
    #[serde(rename = "membase")]
    Membase,
    /// A memory-only bucket.
    #[serde(rename = "ephemeral")]
    Ephemeral,
}

/// Couchbase's eviction policy names: the first two for persistent buckets, the last two
/// for memory-only ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum EvictionMode {
    /// Values only (`--eviction-policy value`).
    #[serde(rename = "valueOnly")]
    ValueOnly,
    /// Whole documents (`--eviction-policy full`).
    #[serde(rename = "fullEviction")]
    FullEviction,
    /// Memory-only, refuse new data when full (`fail-new-data`).
    #[serde(rename = "noEviction")]
    NoEviction,
    /// Memory-only, delete the least used documents when full (`auto-delete`).
    #[serde(rename = "nruEviction")]
    NruEviction,
}

impl EvictionMode {
    /// Couchbase's name, as the REST API writes it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::ValueOnly => "valueOnly",
            Self::FullEviction => "fullEviction",
            Self::NoEviction => "noEviction",
            Self::NruEviction => "nruEviction",
        }
    }

    /// Parses Couchbase's name.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        [
            Self::ValueOnly,
            Self::FullEviction,
            Self::NoEviction,
            Self::NruEviction,
        ]
        .into_iter()
        .find(|e| e.as_str() == s)
    }

    /// Whether this policy applies to buckets of type `t`.
    pub(crate) fn fits(self, t: BucketType) -> bool {
        match t {
            BucketType::Membase => matches!(self, Self::ValueOnly | Self::FullEviction),
            BucketType::Ephemeral => matches!(self, Self::NoEviction | Self::NruEviction),
        }
    }
}

/// What defines a bucket: what the REST API reports and the runtime list records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BucketParams {
    /// The bucket name (valid: see `epkv_frontend::is_valid_bucket_name`).
    pub(crate) name: String,
    /// Persistent or memory-only.
    pub(crate) bucket_type: BucketType,
    /// The memory quota, in bytes.
    #[serde(rename = "ramQuota")]
    pub(crate) quota_bytes: u64,
    /// The eviction policy (fits `bucket_type`).
    pub(crate) eviction_policy: EvictionMode,
    /// Whether FLUSH (and the REST flush controller) may empty the bucket.
    pub(crate) flush_enabled: bool,
    /// The minimum durability level of every write (absent from lists written before it
    /// existed: none).
    #[serde(default)]
    pub(crate) durability_min_level: DurabilityMin,
}

/// A bucket's minimum durability level, in Couchbase's REST spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum DurabilityMin {
    /// Writes are as durable as each asks.
    #[default]
    None,
    /// At least Majority.
    Majority,
    /// At least MajorityAndPersistOnMaster.
    MajorityAndPersistActive,
    /// PersistToMajority.
    PersistToMajority,
}

impl DurabilityMin {
    /// Parses the REST spelling.
    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => Self::None,
            "majority" => Self::Majority,
            "majorityAndPersistActive" => Self::MajorityAndPersistActive,
            "persistToMajority" => Self::PersistToMajority,
            _ => return None,
        })
    }

    /// The REST spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Majority => "majority",
            Self::MajorityAndPersistActive => "majorityAndPersistActive",
            Self::PersistToMajority => "persistToMajority",
        }
    }

    /// The engine's level.
    pub(crate) fn level(self) -> Option<epkv_types::DurabilityLevel> {
        use epkv_types::DurabilityLevel as L;
        match self {
            Self::None => None,
            Self::Majority => Some(L::Majority),
            Self::MajorityAndPersistActive => Some(L::MajorityAndPersistOnMaster),
            Self::PersistToMajority => Some(L::PersistToMajority),
        }
    }

    /// Whether a bucket of type `t` can honour it (an ephemeral bucket cannot persist).
    pub(crate) fn fits(self, t: BucketType) -> bool {
        t == BucketType::Membase || matches!(self, Self::None | Self::Majority)
    }
}

/// The runtime bucket list file.
#[derive(Debug, Serialize, Deserialize)]
struct ListFile {
    version: u32,
    buckets: Vec<BucketParams>,
}

/// Why a create or drop was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    /// A bucket of that name exists.
    #[error("Bucket with given name already exists")]
    Exists,
    /// No bucket of that name.
    #[error("Requested resource not found.")]
    NotFound,
    /// A parameter is not acceptable: (field, message).
    #[error("{1}")]
    Invalid(&'static str, String),
    /// Building the engine or writing the list failed.
    #[error("{0:#}")]
    Failed(anyhow::Error),
}

/// One served bucket.
struct Served {
    bucket: Arc<Bucket>,
    params: BucketParams,
    /// From the settings (cannot be dropped at run time).
    configured: bool,
}

/// What every bucket is built with besides its own parameters (from the settings).
struct Template {
    data_dir: PathBuf,
    persistence: bool,
    mem_high_wat: u8,
    mem_low_wat: u8,
    journal: bool,
    storage: epkv_engine::StorageBackend,
    fd_budget: usize,
    writer_threads: usize,
    flush_delay: std::time::Duration,
    compaction_fragmentation_percent: u8,
    compaction_min_file_bytes: u64,
    compaction_bytes_per_sec: u64,
    manual_flush: bool,
    range_scan_idle_timeout: std::time::Duration,
    clock: EngineClock,
}

/// The served buckets, and the only place that builds or drops one.
pub(crate) struct BucketManager {
    template: Template,
    /// The front end's view (shared with the connections).
    buckets: Buckets,
    /// Name → bucket; held for the whole of a create or drop.
    table: Mutex<BTreeMap<String, Served>>,
}

impl BucketManager {
    /// Builds `default`, the configured buckets and the runtime ones recorded in the data
    /// directory's list (a runtime bucket named like a configured one is ignored, with a
    /// warning: the settings win).
    ///
    /// # Errors
    /// A bucket that cannot be built, or an unreadable runtime list.
    pub(crate) fn start(s: &Settings, clock: &EngineClock, manual_flush: bool) -> Result<Self> {
        let manager = Self {
            template: Template {
                data_dir: s.data_dir.clone(),
                persistence: s.persistence,
                mem_high_wat: s.mem_high_wat,
                mem_low_wat: s.mem_low_wat,
                journal: s.journal,
                storage: s.storage.0,
                fd_budget: s.fd_budget,
                writer_threads: s.writer_threads,
                flush_delay: std::time::Duration::from_millis(s.flush_delay),
                compaction_fragmentation_percent: s.compaction_fragmentation_percent,
                compaction_min_file_bytes: s.compaction_min_file_size.bytes(),
                compaction_bytes_per_sec: s.compaction_rate.bytes(),
                manual_flush,
                range_scan_idle_timeout: std::time::Duration::from_millis(
                    s.range_scan_idle_timeout,
                ),
                clock: clock.clone(),
            },
            buckets: Buckets::new(),
            table: Mutex::new(BTreeMap::new()),
        };
        let (bucket_type, ephemeral_eviction) = if s.persistence {
            (BucketType::Membase, EvictionMode::NruEviction)
        } else {
            let e = match s.ephemeral_full_policy.0 {
                EphemeralFullPolicy::AutoDelete => EvictionMode::NruEviction,
                EphemeralFullPolicy::FailNewData => EvictionMode::NoEviction,
            };
            (BucketType::Ephemeral, e)
        };
        let mut specs = vec![crate::bucket_list::BucketSpec {
            name: DEFAULT_BUCKET.to_owned(),
            quota: None,
            eviction: None,
        }];
        for b in &s.buckets.0 {
            match specs.iter_mut().find(|d| d.name == b.name) {
                Some(existing) => {
                    existing.quota = b.quota;
                    existing.eviction = b.eviction;
                }
                None => specs.push(b.clone()),
            }
        }
        let mut table = manager.table.lock();
        for spec in specs {
            let eviction = match bucket_type {
                BucketType::Ephemeral => ephemeral_eviction,
                BucketType::Membase => match spec.eviction.unwrap_or(s.eviction_policy).0 {
                    EvictionPolicy::Value => EvictionMode::ValueOnly,
                    EvictionPolicy::Full => EvictionMode::FullEviction,
                },
            };
            let params = BucketParams {
                name: spec.name,
                bucket_type,
                quota_bytes: spec.quota.unwrap_or(s.memory_quota).bytes(),
                eviction_policy: eviction,
                flush_enabled: s.flush_enabled,
                durability_min_level: DurabilityMin::None,
            };
            manager.build(&mut table, params, true)?;
        }
        for params in manager.load_list()? {
            if table.contains_key(&params.name) {
                tracing::warn!(bucket = %params.name, "a bucket created at run time has the name of a configured one; the settings win");
                continue;
            }
            let name = params.name.clone();
            manager
                .build(&mut table, params, false)
                .with_context(|| format!("cannot restore bucket {name:?} created at run time"))?;
        }
        drop(table);
        manager.declare_collections(&s.collections)?;
        Ok(manager)
    }

    /// The front end's view of the buckets (shared).
    pub(crate) fn buckets(&self) -> &Buckets {
        &self.buckets
    }

    /// Every bucket with its parameters, in name order.
    pub(crate) fn snapshot(&self) -> Vec<(BucketParams, Arc<Bucket>)> {
        self.table
            .lock()
            .values()
            .map(|s| (s.params.clone(), Arc::clone(&s.bucket)))
            .collect()
    }

    /// One bucket with its parameters.
    /// Creates the configured scopes and collections that do not exist yet.
    ///
    /// # Errors
    /// A collection of a bucket that does not exist, or a change the engine refuses.
    fn declare_collections(&self, list: &crate::bucket_list::CollectionList) -> Result<()> {
        use epkv_engine_api::{Engine, EngineStatus};
        for c in &list.0 {
            let Some((_, bucket)) = self.get(&c.bucket) else {
                anyhow::bail!(
                    "collections setting: no bucket {:?} for {}.{}",
                    c.bucket,
                    c.scope,
                    c.name
                );
            };
            match bucket.create_scope(&c.scope) {
                Ok(_) | Err(EngineStatus::KeyExists) => {}
                Err(_) if c.scope == "_default" => {}
                Err(e) => anyhow::bail!("collections setting: scope {:?}: {e}", c.scope),
            }
            match bucket.create_collection(&c.scope, &c.name, c.max_ttl) {
                Ok(_) | Err(EngineStatus::KeyExists) => {}
                Err(e) => {
                    anyhow::bail!("collections setting: {}.{}: {e}", c.scope, c.name)
                }
            }
        }
        Ok(())
    }

    pub(crate) fn get(&self, name: &str) -> Option<(BucketParams, Arc<Bucket>)> {
        self.table
            .lock()
            .get(name)
            .map(|s| (s.params.clone(), Arc::clone(&s.bucket)))
    }

    /// The bucket names, in name order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.table.lock().keys().cloned().collect()
    }

    /// Creates a bucket at run time and records it in the runtime list.
    ///
    /// # Errors
    /// [`ChangeError::Exists`]; [`ChangeError::Invalid`] for a bucket this server cannot
    /// serve (persistent on a memory-only server); [`ChangeError::Failed`] when the engine
    /// cannot be built or the list written (the bucket is then not created).
    pub(crate) fn create(&self, params: BucketParams) -> Result<(), ChangeError> {
        self.check_create(&params)?;
        let mut table = self.table.lock();
        if table.contains_key(&params.name) {
            return Err(ChangeError::Exists);
        }
        let dir = self.template.data_dir.join(&params.name);
        if self.template.persistence && dir.exists() {
            // Not in the list, so left by an interrupted create or drop.
            tracing::warn!(dir = %dir.display(), "removing the directory a dropped bucket left behind");
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove {}", dir.display()))
                .map_err(ChangeError::Failed)?;
        }
        let name = params.name.clone();
        self.build(&mut table, params, false)
            .map_err(ChangeError::Failed)?;
        if let Err(e) = self.save_list(&table) {
            if let Some(served) = table.remove(&name) {
                self.buckets.remove(&name);
                served.bucket.shutdown();
            }
            return Err(ChangeError::Failed(e));
        }
        tracing::info!(bucket = %name, "bucket created through the management API");
        Ok(())
    }

    /// Whether this server can serve a bucket of `params` (a persistent one needs
    /// persistence).
    ///
    /// # Errors
    /// [`ChangeError::Invalid`].
    pub(crate) fn check_create(&self, params: &BucketParams) -> Result<(), ChangeError> {
        if params.bucket_type == BucketType::Membase && !self.template.persistence {
            return Err(ChangeError::Invalid(
                "bucketType",
                "this server runs with --persistence false: only ephemeral buckets can be \
                 created"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether bucket `name` comes from the settings (and cannot be dropped at run
    /// time).
    pub(crate) fn is_configured(&self, name: &str) -> bool {
        self.table.lock().get(name).is_some_and(|s| s.configured)
    }

    /// The refusal of a drop of configured bucket `name`.
    pub(crate) fn configured_error(name: &str) -> ChangeError {
        ChangeError::Invalid(
            "name",
            format!(
                "bucket {name:?} is configured in the server's settings (default or \
                 --buckets) and cannot be dropped at run time"
            ),
        )
    }

    /// Drops a runtime bucket: no connection can select it any more, those that had are
    /// closed at their next request, its background work stops, and its directory is
    /// removed.
    ///
    /// # Errors
    /// [`ChangeError::NotFound`]; [`ChangeError::Invalid`] for a configured bucket;
    /// [`ChangeError::Failed`] when the list cannot be written (the bucket stays).
    pub(crate) fn drop_bucket(&self, name: &str) -> Result<(), ChangeError> {
        let mut table = self.table.lock();
        let configured = table.get(name).ok_or(ChangeError::NotFound)?.configured;
        if configured {
            return Err(Self::configured_error(name));
        }
        let Some(served) = table.remove(name) else {
            return Err(ChangeError::NotFound);
        };
        if let Err(e) = self.save_list(&table) {
            table.insert(name.to_owned(), served);
            return Err(ChangeError::Failed(e));
        }
        self.buckets.remove(name);
        served.bucket.shutdown();
        if served.params.bucket_type == BucketType::Membase && self.template.persistence {
            let dir = self.template.data_dir.join(name);
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::error!(dir = %dir.display(), error = %e, "cannot remove a dropped bucket's directory; it is removed before a bucket of that name is created again");
            }
        }
        tracing::info!(bucket = %name, "bucket dropped through the management API");
        Ok(())
    }

    /// Builds one bucket's engine and serves it.
    fn build(
        &self,
        table: &mut BTreeMap<String, Served>,
        params: BucketParams,
        configured: bool,
    ) -> Result<()> {
        let t = &self.template;
        let dir = t.data_dir.join(&params.name);
        let persistent = t.persistence && params.bucket_type == BucketType::Membase;
        if persistent {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create data directory {}", dir.display()))?;
        }
        let config = BucketConfig {
            name: params.name.clone(),
            memory_quota_bytes: params.quota_bytes,
            mem_high_wat_percent: t.mem_high_wat,
            mem_low_wat_percent: t.mem_low_wat,
            ephemeral_full_policy: match params.eviction_policy {
                EvictionMode::NoEviction => EphemeralFullPolicy::FailNewData,
                _ => EphemeralFullPolicy::AutoDelete,
            },
            eviction_policy: match params.eviction_policy {
                EvictionMode::FullEviction => EvictionPolicy::Full,
                _ => EvictionPolicy::Value,
            },
            flush_enabled: params.flush_enabled,
            durability_min_level: params.durability_min_level.level(),
            range_scan_idle_timeout: t.range_scan_idle_timeout,
            persistence: persistent.then(|| epkv_engine::PersistenceConfig {
                flusher: if t.manual_flush {
                    epkv_engine::FlusherMode::Manual
                } else {
                    epkv_engine::FlusherMode::Tasks
                },
                journal: if t.journal {
                    epkv_engine::JournalMode::On
                } else {
                    epkv_engine::JournalMode::Off
                },
                storage: t.storage,
                fd_budget: (t.fd_budget > 0).then_some(t.fd_budget),
                writer_threads: t.writer_threads,
                flush_delay: t.flush_delay,
                compaction_fragmentation_percent: t.compaction_fragmentation_percent,
                compaction_min_file_bytes: t.compaction_min_file_bytes,
                compaction_bytes_per_sec: t.compaction_bytes_per_sec,
                ..epkv_engine::PersistenceConfig::new(&dir)
            }),
            ..BucketConfig::default()
        };
        let bucket = Bucket::new(config, t.clock.clone())
            .with_context(|| format!("cannot create bucket {:?}", params.name))?;
        tracing::info!(bucket = %params.name, memory_quota_bytes = params.quota_bytes, persistent, data_dir = %dir.display(), "bucket created");
        if let Err(e) = self
            .buckets
            .insert(&params.name, Arc::clone(&bucket) as Arc<dyn Engine>)
        {
            bucket.shutdown();
            return Err(e.into());
        }
        table.insert(
            params.name.clone(),
            Served {
                bucket,
                params,
                configured,
            },
        );
        Ok(())
    }

    /// The runtime list's path, when the server persists.
    fn list_path(&self) -> Option<PathBuf> {
        self.template
            .persistence
            .then(|| self.template.data_dir.join(BUCKET_LIST_FILE))
    }

    /// Reads the runtime list (empty when there is none).
    fn load_list(&self) -> Result<Vec<BucketParams>> {
        let Some(path) = self.list_path() else {
            return Ok(Vec::new());
        };
        read_list(&path)
    }

    /// Writes the runtime list: the runtime buckets of `table`.
    fn save_list(&self, table: &BTreeMap<String, Served>) -> Result<()> {
        let Some(path) = self.list_path() else {
            return Ok(());
        };
        let file = ListFile {
            version: LIST_VERSION,
            buckets: table
                .values()
                .filter(|s| !s.configured)
                .map(|s| s.params.clone())
                .collect(),
        };
        let text = serde_json::to_vec_pretty(&file).context("cannot encode the bucket list")?;
        epkv_auth::write_file_atomically(&path, &text)
            .with_context(|| format!("cannot write {}", path.display()))
    }
}

/// Reads a runtime bucket list file; a missing file is an empty list.
fn read_list(path: &Path) -> Result<Vec<BucketParams>> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let file: ListFile = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a valid bucket list", path.display()))?;
    if file.version != LIST_VERSION {
        anyhow::bail!(
            "{} has version {}, this server reads version {LIST_VERSION}",
            path.display(),
            file.version
        );
    }
    for b in &file.buckets {
        if !epkv_frontend::is_valid_bucket_name(&b.name) || !b.eviction_policy.fits(b.bucket_type) {
            anyhow::bail!("{} holds an invalid bucket {:?}", path.display(), b.name);
        }
    }
    Ok(file.buckets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_names_round_trip_and_fit_their_type() {
        for e in [
            EvictionMode::ValueOnly,
            EvictionMode::FullEviction,
            EvictionMode::NoEviction,
            EvictionMode::NruEviction,
        ] {
            assert_eq!(EvictionMode::parse(e.as_str()), Some(e));
        }
        assert_eq!(EvictionMode::parse("value"), None);
        assert!(EvictionMode::ValueOnly.fits(BucketType::Membase));
        assert!(!EvictionMode::ValueOnly.fits(BucketType::Ephemeral));
        assert!(EvictionMode::NoEviction.fits(BucketType::Ephemeral));
    }

    #[test]
    fn the_runtime_list_round_trips_and_rejects_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(BUCKET_LIST_FILE);
        assert!(read_list(&path).unwrap().is_empty(), "no file, no buckets");
        let b = BucketParams {
            name: "travel".into(),
            bucket_type: BucketType::Membase,
            quota_bytes: 100 << 20,
            eviction_policy: EvictionMode::FullEviction,
            flush_enabled: true,
            durability_min_level: DurabilityMin::PersistToMajority,
        };
        let file = ListFile {
            version: LIST_VERSION,
            buckets: vec![b.clone()],
        };
        let text = serde_json::to_vec(&file).unwrap();
        assert!(String::from_utf8_lossy(&text).contains("\"ramQuota\":104857600"));
        epkv_auth::write_file_atomically(&path, &text).unwrap();
        assert_eq!(read_list(&path).unwrap(), vec![b]);
        std::fs::write(&path, b"{\"version\":2,\"buckets\":[]}").unwrap();
        assert!(read_list(&path).is_err());
        std::fs::write(
            &path,
            br#"{"version":1,"buckets":[{"name":"x","bucketType":"ephemeral","ramQuota":1,"evictionPolicy":"valueOnly","flushEnabled":false}]}"#,
        )
        .unwrap();
        assert!(
            read_list(&path).is_err(),
            "an ephemeral bucket cannot be valueOnly"
        );
        std::fs::write(&path, b"not json").unwrap();
        assert!(read_list(&path).is_err());
    }
}
