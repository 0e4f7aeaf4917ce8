//! Scopes and collections (kv_engine `docs/Collections.md`): a bucket's manifest, its
//! changes, and where documents meet it.
//!
//! - The manifest names scopes and their collections, each with an id, and has a uid that
//!   grows with every change. `_default` (scope and collection, id 0) exists from the
//!   start; the default collection may be dropped (and then its documents are gone), the
//!   default scope may not. New ids start at 8 (0-7 are reserved) and are never reused,
//!   so a collection created again under an old name gets a new id and none of the old
//!   documents.
//! - Keys reach the engine encoded with their collection ([`epkv_types::doc_key`]); every
//!   client operation checks the collection exists (`UnknownCollection`, and the client
//!   reads the manifest uid to refresh).
//! - A dropped collection's documents leave memory in the background, one vBucket at a
//!   time ([`crate::Bucket::purge_dropped`]); warmup skips them and compaction removes
//!   them from the data files (the manifest, persisted beside them, says which are
//!   dropped).
//! - A collection's `maxTTL` applies to writes without an expiry and caps longer ones.
//! - The manifest is kept in `collections.json` in the bucket's data directory, written
//!   atomically (temporary file, fsync, rename, fsync of the directory).

use epkv_engine_api::dcp::{CollectionEvent, CollectionEventKind};
use epkv_engine_api::{EngineResult, EngineStatus};
use epkv_types::doc_key::{self, DEFAULT_COLLECTION};
use parking_lot::{Mutex, RwLock};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The first id handed to a new scope or collection (0-7 are reserved).
const FIRST_ID: u32 = 8;
/// Most scopes, and most collections, a bucket may have.
pub const MAX_SCOPES: usize = 1000;
/// Most collections a bucket may have.
pub const MAX_COLLECTIONS: usize = 1000;
/// The manifest file in a bucket's data directory.
pub const MANIFEST_FILE: &str = "collections.json";

/// One collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionEntry {
    /// Its id (the key prefix clients send).
    pub id: u32,
    /// Its name, unique in its scope.
    pub name: String,
    /// Seconds of life of documents written without an expiry (and the most any may
    /// have); `None` for no limit.
    pub max_ttl: Option<u32>,
}

/// One scope and its collections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeEntry {
    /// Its id.
    pub id: u32,
    /// Its name, unique in the bucket.
    pub name: String,
    /// Its collections.
    pub collections: Vec<CollectionEntry>,
}

/// A bucket's scopes and collections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Grows with every change.
    pub uid: u64,
    /// The scopes (the default scope first).
    pub scopes: Vec<ScopeEntry>,
    /// The next id a scope or collection gets (ids are never reused).
    pub next_id: u32,
    /// Collections dropped whose documents may still be on disk (compaction removes
    /// them; warmup skips them).
    pub dropped: Vec<u32>,
}

impl Default for Manifest {
    fn default() -> Self {
        Self {
            uid: 0,
            scopes: vec![ScopeEntry {
                id: 0,
                name: "_default".into(),
                collections: vec![CollectionEntry {
                    id: DEFAULT_COLLECTION,
                    name: "_default".into(),
                    max_ttl: None,
                }],
            }],
            next_id: FIRST_ID,
            dropped: Vec::new(),
        }
    }
}

/// Whether `name` may name a scope or collection a user creates: 1-251 bytes of
/// `A-Z a-z 0-9 _ - %`, not starting with `_` or `%` (Couchbase's rule).
#[must_use]
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 251
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%'))
        && !name.starts_with(['_', '%'])
}

fn hex(v: u64) -> String {
    format!("{v:x}")
}

impl Manifest {
    /// The collection with id `cid`, and its scope.
    #[must_use]
    pub fn collection(&self, cid: u32) -> Option<(&ScopeEntry, &CollectionEntry)> {
        self.scopes
            .iter()
            .find_map(|s| s.collections.iter().find(|c| c.id == cid).map(|c| (s, c)))
    }

    fn scope(&self, name: &str) -> Option<&ScopeEntry> {
        self.scopes.iter().find(|s| s.name == name)
    }

    fn scope_mut(&mut self, name: &str) -> Option<&mut ScopeEntry> {
        self.scopes.iter_mut().find(|s| s.name == name)
    }

    fn collection_count(&self) -> usize {
        self.scopes.iter().map(|s| s.collections.len()).sum()
    }

    /// The manifest as kv_engine's GET_COLLECTIONS_MANIFEST returns it (ids and uid in
    /// hex strings without `0x`).
    #[must_use]
    pub fn to_json(&self) -> Value {
        let scopes: Vec<Value> = self
            .scopes
            .iter()
            .map(|s| {
                let collections: Vec<Value> = s
                    .collections
                    .iter()
                    .map(|c| {
                        let mut v = json!({"name": c.name, "uid": hex(u64::from(c.id))});
                        if let Some(ttl) = c.max_ttl {
                            v["maxTTL"] = json!(ttl);
                        }
                        v
                    })
                    .collect();
                json!({"name": s.name, "uid": hex(u64::from(s.id)), "collections": collections})
            })
            .collect();
        json!({"uid": hex(self.uid), "scopes": scopes})
    }

    /// The manifest as its file keeps it: [`Self::to_json`] plus the next id and the
    /// dropped collections still to purge.
    #[must_use]
    pub fn to_file_json(&self) -> Value {
        let mut v = self.to_json();
        v["next_id"] = json!(self.next_id);
        v["dropped"] = json!(self.dropped);
        v
    }

    /// Reads a manifest file.
    ///
    /// # Errors
    /// A description of what is malformed.
    pub fn from_file_json(v: &Value) -> Result<Self, String> {
        let parse_hex = |v: &Value, what: &str| -> Result<u64, String> {
            v.as_str()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .ok_or_else(|| format!("{what} is not a hex string"))
        };
        let uid = parse_hex(&v["uid"], "uid")?;
        let mut scopes = Vec::new();
        for s in v["scopes"].as_array().ok_or("no scopes")? {
            let mut collections = Vec::new();
            for c in s["collections"]
                .as_array()
                .ok_or("scope without collections")?
            {
                collections.push(CollectionEntry {
                    id: u32::try_from(parse_hex(&c["uid"], "collection uid")?)
                        .map_err(|_| "collection uid out of range")?,
                    name: c["name"]
                        .as_str()
                        .ok_or("collection without a name")?
                        .into(),
                    max_ttl: c["maxTTL"].as_u64().and_then(|t| u32::try_from(t).ok()),
                });
            }
            scopes.push(ScopeEntry {
                id: u32::try_from(parse_hex(&s["uid"], "scope uid")?)
                    .map_err(|_| "scope uid out of range")?,
                name: s["name"].as_str().ok_or("scope without a name")?.into(),
                collections,
            });
        }
        let next_id = v["next_id"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or("no next_id")?;
        let dropped = v["dropped"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d.as_u64().and_then(|d| u32::try_from(d).ok()))
                    .collect()
            })
            .unwrap_or_default();
        if !scopes.iter().any(|s| s.id == 0) {
            return Err("no default scope".into());
        }
        Ok(Self {
            uid,
            scopes,
            next_id,
            dropped,
        })
    }
}

/// One change of a manifest, as the management API asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestChange {
    /// Create scope `name`.
    CreateScope {
        /// The new scope's name.
        name: String,
    },
    /// Drop scope `name` and its collections.
    DropScope {
        /// The scope's name.
        name: String,
    },
    /// Create collection `name` in `scope`, with `max_ttl` seconds (0 = none).
    CreateCollection {
        /// The scope's name.
        scope: String,
        /// The new collection's name.
        name: String,
        /// Its maxTTL in seconds, 0 for none.
        max_ttl: u32,
    },
    /// Drop collection `name` of `scope`.
    DropCollection {
        /// The scope's name.
        scope: String,
        /// The collection's name.
        name: String,
    },
}

/// What [`Collections::replace`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplaceOutcome {
    /// The manifest uid now.
    pub uid: u64,
    /// Whether some collection was dropped (its documents are to be purged).
    pub dropped_any: bool,
}

impl Manifest {
    /// Applies `change` to this manifest, ids taken from (and `next_id` moved on by) it;
    /// the uid is left as it is (the caller moves it on). Returns the change's scope
    /// and collection events (their manifest uids unset).
    ///
    /// # Errors
    /// `Invalid` for a bad name or dropping the default scope; `KeyExists`,
    /// `UnknownScope`, `UnknownCollection`; `TooBig` past [`MAX_SCOPES`] or
    /// [`MAX_COLLECTIONS`]. The manifest is unchanged then.
    pub fn edit(&mut self, change: &ManifestChange) -> EngineResult<Vec<CollectionEvent>> {
        match change {
            ManifestChange::CreateScope { name } => {
                if !valid_name(name) {
                    return Err(EngineStatus::Invalid);
                }
                if self.scope(name).is_some() {
                    return Err(EngineStatus::KeyExists);
                }
                if self.scopes.len() >= MAX_SCOPES {
                    return Err(EngineStatus::TooBig);
                }
                let id = self.next_id;
                self.scopes.push(ScopeEntry {
                    id,
                    name: name.clone(),
                    collections: Vec::new(),
                });
                self.next_id += 1;
                Ok(vec![event(
                    CollectionEventKind::CreateScope,
                    id,
                    0,
                    name,
                    None,
                )])
            }
            ManifestChange::DropScope { name } => {
                if name == "_default" {
                    return Err(EngineStatus::Invalid);
                }
                let i = self
                    .scopes
                    .iter()
                    .position(|s| s.name == *name)
                    .ok_or(EngineStatus::UnknownScope)?;
                let s = self.scopes.remove(i);
                self.dropped.extend(s.collections.iter().map(|c| c.id));
                let mut events: Vec<_> = s
                    .collections
                    .iter()
                    .map(|c| event(CollectionEventKind::DropCollection, s.id, c.id, "", None))
                    .collect();
                events.push(event(CollectionEventKind::DropScope, s.id, 0, "", None));
                Ok(events)
            }
            ManifestChange::CreateCollection {
                scope,
                name,
                max_ttl,
            } => {
                if !valid_name(name) {
                    return Err(EngineStatus::Invalid);
                }
                if self.collection_count() >= MAX_COLLECTIONS {
                    return Err(EngineStatus::TooBig);
                }
                let id = self.next_id;
                let s = self.scope_mut(scope).ok_or(EngineStatus::UnknownScope)?;
                if s.collections.iter().any(|c| c.name == *name) {
                    return Err(EngineStatus::KeyExists);
                }
                let max_ttl = (*max_ttl > 0).then_some(*max_ttl);
                s.collections.push(CollectionEntry {
                    id,
                    name: name.clone(),
                    max_ttl,
                });
                let sid = s.id;
                self.next_id += 1;
                Ok(vec![event(
                    CollectionEventKind::CreateCollection,
                    sid,
                    id,
                    name,
                    max_ttl,
                )])
            }
            ManifestChange::DropCollection { scope, name } => {
                let s = self.scope_mut(scope).ok_or(EngineStatus::UnknownScope)?;
                let i = s
                    .collections
                    .iter()
                    .position(|c| c.name == *name)
                    .ok_or(EngineStatus::UnknownCollection)?;
                let c = s.collections.remove(i);
                let sid = s.id;
                self.dropped.push(c.id);
                Ok(vec![event(
                    CollectionEventKind::DropCollection,
                    sid,
                    c.id,
                    "",
                    None,
                )])
            }
        }
    }

    /// The manifest after `change`: edited ([`Self::edit`]) with the uid moved on by
    /// one, as [`Collections::change`] would make it. What a cluster decides centrally
    /// and every node then applies with [`Collections::replace`].
    ///
    /// # Errors
    /// As [`Self::edit`].
    pub fn changed(&self, change: &ManifestChange) -> EngineResult<Manifest> {
        let mut m = self.clone();
        m.edit(change)?;
        m.uid += 1;
        Ok(m)
    }
}

/// Collection ids below this are looked up without a lock ([`Collections::check_key`],
/// [`Collections::max_ttl`]); larger ones (after thousands of collections were created)
/// read the manifest.
const FAST_IDS: usize = 4096;

/// A bucket's collections: the manifest, and where it is kept.
pub struct Collections {
    manifest: RwLock<Arc<Manifest>>,
    /// For ids below [`FAST_IDS`]: 0 when the collection does not exist, else its
    /// maxTTL + 1 (so 1 is "exists, no maxTTL"). Written with the manifest.
    fast: Box<[AtomicU64]>,
    /// The default collection exists (the common case, checked without the lock).
    default_exists: AtomicBool,
    /// Some collection other than the default exists.
    any_named: AtomicBool,
    /// Where the manifest is kept; `None` in a memory-only bucket.
    file: Option<PathBuf>,
    /// Serializes changes (and their file writes).
    change: Mutex<()>,
    /// Records a change's events in the vBuckets ([`Self::set_on_change`]).
    on_change: std::sync::OnceLock<ChangeHook>,
}

/// What [`Collections::set_on_change`] installs.
type ChangeHook = Box<dyn Fn(&[CollectionEvent]) + Send + Sync>;

impl std::fmt::Debug for Collections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collections")
            .field("manifest", &*self.manifest.read())
            .finish_non_exhaustive()
    }
}

impl Collections {
    /// Loads the manifest of the bucket whose data directory is `dir` (a fresh one when
    /// there is no file), or a memory-only bucket's (`None`).
    ///
    /// # Errors
    /// A manifest file that cannot be read or parsed (the bucket does not start: its
    /// documents' collections would be unknown).
    pub fn open(dir: Option<PathBuf>) -> Result<Self, String> {
        let file = dir.map(|d| d.join(MANIFEST_FILE));
        let manifest = match &file {
            Some(f) if f.exists() => {
                let text = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
                let v: Value =
                    serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", f.display()))?;
                Manifest::from_file_json(&v).map_err(|e| format!("{}: {e}", f.display()))?
            }
            _ => Manifest::default(),
        };
        let c = Self {
            manifest: RwLock::new(Arc::new(Manifest::default())),
            fast: (0..FAST_IDS).map(|_| AtomicU64::new(0)).collect(),
            default_exists: AtomicBool::new(true),
            any_named: AtomicBool::new(false),
            file,
            change: Mutex::new(()),
            on_change: std::sync::OnceLock::new(),
        };
        c.install(manifest);
        Ok(c)
    }

    fn install(&self, m: Manifest) {
        self.default_exists
            .store(m.collection(DEFAULT_COLLECTION).is_some(), Relaxed);
        self.any_named.store(m.collection_count() > 1, Relaxed);
        let mut fast = vec![0u64; FAST_IDS];
        for c in m.scopes.iter().flat_map(|s| &s.collections) {
            if let Some(slot) = usize::try_from(c.id).ok().and_then(|i| fast.get_mut(i)) {
                *slot = u64::from(c.max_ttl.unwrap_or(0)) + 1;
            }
        }
        // Collections that exist are published before the manifest and those gone are
        // withdrawn after it: the fast path never knows less than the manifest about a
        // collection created, nor more about one dropped (for longer than this loop).
        for (slot, v) in self.fast.iter().zip(&fast) {
            if *v != 0 {
                slot.store(*v, Relaxed);
            }
        }
        *self.manifest.write() = Arc::new(m);
        for (slot, v) in self.fast.iter().zip(&fast) {
            if *v == 0 {
                slot.store(0, Relaxed);
            }
        }
    }

    /// The fast-path entry of `cid`: `Some(0)` absent, `Some(ttl + 1)` present, `None`
    /// for an id past the table.
    #[inline]
    fn fast(&self, cid: u32) -> Option<u64> {
        usize::try_from(cid)
            .ok()
            .and_then(|i| self.fast.get(i))
            .map(|a| a.load(Relaxed))
    }

    /// The current manifest.
    #[must_use]
    pub fn manifest(&self) -> Arc<Manifest> {
        self.manifest.read().clone()
    }

    /// The manifest uid.
    #[must_use]
    pub fn uid(&self) -> u64 {
        self.manifest.read().uid
    }

    /// Checks that the collection of engine key `key` exists.
    ///
    /// # Errors
    /// `UnknownCollection`.
    #[inline]
    pub fn check_key(&self, key: &[u8]) -> EngineResult<()> {
        let cid = doc_key::collection_of(key);
        if cid == DEFAULT_COLLECTION {
            if self.default_exists.load(Relaxed) {
                return Ok(());
            }
            return Err(EngineStatus::UnknownCollection);
        }
        let exists = match self.fast(cid) {
            Some(v) => v != 0,
            None => self.any_named.load(Relaxed) && self.manifest.read().collection(cid).is_some(),
        };
        if exists {
            Ok(())
        } else {
            Err(EngineStatus::UnknownCollection)
        }
    }

    /// The `maxTTL` of the collection of engine key `key`, if it has one.
    #[must_use]
    pub fn max_ttl(&self, key: &[u8]) -> Option<u32> {
        // The default collection has no maxTTL (it is never created with one).
        let cid = doc_key::collection_of(key);
        if cid == DEFAULT_COLLECTION {
            return None;
        }
        match self.fast(cid) {
            Some(v) => u32::try_from(v.saturating_sub(1)).ok().filter(|t| *t > 0),
            None => self
                .manifest
                .read()
                .collection(cid)
                .and_then(|(_, c)| c.max_ttl),
        }
    }

    /// Collection ids dropped whose documents may remain on disk.
    #[must_use]
    pub fn dropped(&self) -> Vec<u32> {
        self.manifest.read().dropped.clone()
    }

    /// Whether documents of collection `cid` are to be kept (it exists).
    #[must_use]
    pub fn is_live(&self, cid: u32) -> bool {
        if cid == DEFAULT_COLLECTION {
            return self.default_exists.load(Relaxed);
        }
        self.manifest.read().collection(cid).is_some()
    }

    /// GET_COLLECTION_ID: the manifest uid and the id of the collection at `path`
    /// (`scope.collection`; an empty part is `_default`).
    ///
    /// # Errors
    /// `Invalid` for a path without one dot; `UnknownScope`, `UnknownCollection`.
    pub fn collection_id(&self, path: &str) -> EngineResult<(u64, u32)> {
        let (scope, collection) = path.split_once('.').ok_or(EngineStatus::Invalid)?;
        if collection.contains('.') {
            return Err(EngineStatus::Invalid);
        }
        let or_default = |s: &'_ str| if s.is_empty() { "_default" } else { s }.to_owned();
        let (scope, collection) = (or_default(scope), or_default(collection));
        let m = self.manifest.read();
        let s = m.scope(&scope).ok_or(EngineStatus::UnknownScope)?;
        let c = s
            .collections
            .iter()
            .find(|c| c.name == collection)
            .ok_or(EngineStatus::UnknownCollection)?;
        Ok((m.uid, c.id))
    }

    /// GET_SCOPE_ID: the manifest uid and the id of the scope at `path` (`scope`, or
    /// `scope.collection` whose collection part is ignored; empty is `_default`).
    ///
    /// # Errors
    /// `Invalid` for more than one dot; `UnknownScope`.
    pub fn scope_id(&self, path: &str) -> EngineResult<(u64, u32)> {
        let mut parts = path.split('.');
        let scope = parts.next().unwrap_or_default();
        let _ = parts.next();
        if parts.next().is_some() {
            return Err(EngineStatus::Invalid);
        }
        let scope = if scope.is_empty() { "_default" } else { scope };
        let m = self.manifest.read();
        let s = m.scope(scope).ok_or(EngineStatus::UnknownScope)?;
        Ok((m.uid, s.id))
    }

    /// Installs what records each change's scope and collection events in the vBuckets
    /// (the bucket's [`crate::system_events`]); called once, when the bucket is built.
    pub(crate) fn set_on_change(&self, hook: ChangeHook) {
        let _ = self.on_change.set(hook);
    }

    /// Applies `change` to a copy of the manifest, persists it, then installs it;
    /// returns the new uid. The events `change` returns (their manifest uids are set
    /// here: the new uid on the last, the previous one on the others) are recorded with
    /// the change lock held: creations before the manifest is installed, drops after it
    /// (see [`crate::system_events`]).
    fn update(
        &self,
        change: impl FnOnce(&mut Manifest) -> EngineResult<Vec<CollectionEvent>>,
    ) -> EngineResult<u64> {
        let _one_at_a_time = self.change.lock();
        let mut m = (*self.manifest()).clone();
        let events = change(&mut m)?;
        let previous = m.uid;
        m.uid += 1;
        let uid = m.uid;
        self.commit(m, events, previous)?;
        Ok(uid)
    }

    /// Persists and installs `m` (the change lock held), recording `events`: their
    /// manifest uids are set here (`m`'s uid on the last, `previous` on the others);
    /// creations are recorded before the manifest is installed, drops after it.
    fn commit(
        &self,
        m: Manifest,
        mut events: Vec<CollectionEvent>,
        previous: u64,
    ) -> EngineResult<()> {
        let count = events.len();
        for (i, ev) in events.iter_mut().enumerate() {
            ev.manifest_uid = if i + 1 == count { m.uid } else { previous };
        }
        let (creations, drops): (Vec<_>, Vec<_>) = events.into_iter().partition(|e| {
            matches!(
                e.kind,
                CollectionEventKind::CreateCollection | CollectionEventKind::CreateScope
            )
        });
        let record = |events: &[CollectionEvent]| {
            if let Some(hook) = self.on_change.get()
                && !events.is_empty()
            {
                hook(events);
            }
        };
        if let Some(f) = &self.file {
            epkv_types::fs::write_atomically(f, &serde_json::to_vec_pretty(&m.to_file_json()).unwrap_or_default())
                .map_err(|e| {
                    tracing::error!(file = %f.display(), error = %e, "cannot write the collections manifest");
                    EngineStatus::TempFail
                })?;
        }
        record(&creations);
        self.install(m);
        record(&drops);
        Ok(())
    }

    /// Creates scope `name`.
    ///
    /// # Errors
    /// `Invalid` for a bad name, `KeyExists` if it exists, `TooBig` past [`MAX_SCOPES`].
    pub fn create_scope(&self, name: &str) -> EngineResult<u64> {
        self.change(&ManifestChange::CreateScope {
            name: name.to_owned(),
        })
    }

    /// Drops scope `name` and its collections.
    ///
    /// # Errors
    /// `Invalid` for the default scope, `UnknownScope`.
    pub fn drop_scope(&self, name: &str) -> EngineResult<u64> {
        self.change(&ManifestChange::DropScope {
            name: name.to_owned(),
        })
    }

    /// Creates collection `name` in scope `scope`, with `max_ttl` seconds (0 = none).
    ///
    /// # Errors
    /// `Invalid` for a bad name, `UnknownScope`, `KeyExists` if it exists, `TooBig` past
    /// [`MAX_COLLECTIONS`].
    pub fn create_collection(&self, scope: &str, name: &str, max_ttl: u32) -> EngineResult<u64> {
        self.change(&ManifestChange::CreateCollection {
            scope: scope.to_owned(),
            name: name.to_owned(),
            max_ttl,
        })
    }

    /// Drops collection `name` of scope `scope`.
    ///
    /// # Errors
    /// `UnknownScope`, `UnknownCollection`.
    pub fn drop_collection(&self, scope: &str, name: &str) -> EngineResult<u64> {
        self.change(&ManifestChange::DropCollection {
            scope: scope.to_owned(),
            name: name.to_owned(),
        })
    }

    /// Applies one change; returns the new uid.
    ///
    /// # Errors
    /// As [`Manifest::edit`].
    pub fn change(&self, change: &ManifestChange) -> EngineResult<u64> {
        self.update(|m| m.edit(change))
    }

    /// Replaces the manifest by `target`, ids and uid included (kv_engine's
    /// SET_COLLECTIONS_MANIFEST): what a node of a cluster whose manifests are decided
    /// elsewhere (etcd) applies, so that every node has the same ids and uid. Scopes and
    /// collections are matched by id: those only in the current manifest are dropped
    /// (their documents purged, as for a drop), those only in `target` created; one whose
    /// id is in both but whose name, scope or maxTTL differ is dropped and created again.
    /// The next id becomes the larger of the two (ids are never reused here). Returns the
    /// new uid; a `target` equal to the current manifest changes nothing.
    ///
    /// # Errors
    /// `Invalid` for a target without the default scope or with an id used twice;
    /// `TempFail` when the manifest cannot be written.
    pub fn replace(&self, target: Manifest) -> EngineResult<ReplaceOutcome> {
        let mut ids = std::collections::HashSet::new();
        let unique = target.scopes.iter().all(|s| ids.insert((0, s.id)))
            && target
                .scopes
                .iter()
                .flat_map(|s| &s.collections)
                .all(|c| ids.insert((1, c.id)));
        if !unique || !target.scopes.iter().any(|s| s.id == 0) {
            return Err(EngineStatus::Invalid);
        }
        let _one_at_a_time = self.change.lock();
        let current = self.manifest();
        if current.uid == target.uid && current.scopes == target.scopes {
            return Ok(ReplaceOutcome {
                uid: current.uid,
                dropped_any: false,
            });
        }
        let mut events = Vec::new();
        let mut dropped = current.dropped.clone();
        // Drops first: every collection whose id is gone or changed, then the scopes.
        let kept = |sid: u32, c: &CollectionEntry| {
            target
                .scopes
                .iter()
                .any(|ts| ts.id == sid && ts.collections.iter().any(|tc| tc == c))
        };
        for s in &current.scopes {
            let scope_kept = target
                .scopes
                .iter()
                .any(|ts| ts.id == s.id && ts.name == s.name);
            for c in &s.collections {
                if !scope_kept || !kept(s.id, c) {
                    dropped.push(c.id);
                    events.push(event(
                        CollectionEventKind::DropCollection,
                        s.id,
                        c.id,
                        "",
                        None,
                    ));
                }
            }
            if !scope_kept {
                events.push(event(CollectionEventKind::DropScope, s.id, 0, "", None));
            }
        }
        let dropped_any = !events.is_empty();
        for s in &target.scopes {
            let old = current
                .scopes
                .iter()
                .find(|cs| cs.id == s.id && cs.name == s.name);
            if old.is_none() {
                events.push(event(
                    CollectionEventKind::CreateScope,
                    s.id,
                    0,
                    &s.name,
                    None,
                ));
            }
            for c in &s.collections {
                if !old.is_some_and(|o| o.collections.contains(c)) {
                    events.push(event(
                        CollectionEventKind::CreateCollection,
                        s.id,
                        c.id,
                        &c.name,
                        c.max_ttl,
                    ));
                }
            }
        }
        let live: std::collections::HashSet<u32> = target
            .scopes
            .iter()
            .flat_map(|s| s.collections.iter().map(|c| c.id))
            .collect();
        dropped.retain(|d| !live.contains(d));
        dropped.sort_unstable();
        dropped.dedup();
        let next_id = target.next_id.max(current.next_id);
        let m = Manifest {
            uid: target.uid,
            scopes: target.scopes,
            next_id,
            dropped,
        };
        let previous = current.uid;
        self.commit(m, events, previous)?;
        Ok(ReplaceOutcome {
            uid: target.uid,
            dropped_any,
        })
    }

    /// Forgets dropped collections whose documents are gone from disk too.
    /// Not a change clients see: the uid stays (every node of a cluster keeps the same
    /// uid for the same manifest, whenever its purges finish).
    pub fn forget_dropped(&self, purged: &[u32]) {
        if purged.is_empty() {
            return;
        }
        let _one_at_a_time = self.change.lock();
        let mut m = (*self.manifest()).clone();
        m.dropped.retain(|d| !purged.contains(d));
        let uid = m.uid;
        let _ = self.commit(m, Vec::new(), uid);
    }
}

/// A change's event, its manifest uid set by [`Collections::update`].
fn event(
    kind: CollectionEventKind,
    scope_id: u32,
    collection_id: u32,
    name: &str,
    max_ttl: Option<u32>,
) -> CollectionEvent {
    CollectionEvent {
        kind,
        manifest_uid: 0,
        scope_id,
        collection_id,
        name: name.into(),
        max_ttl,
    }
}

/// Operation counts per collection (`STAT collections`): GETs, stores and deletions. Ids
/// past the table share its last slot (ids grow with every collection created; the
/// first 4,095 get their own).
pub struct CollectionOps(Box<[[AtomicU64; 3]]>);

/// Slots of [`CollectionOps`].
const OPS_SLOTS: usize = 4096;

/// What a [`CollectionOps`] count is of.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    Get = 0,
    Store = 1,
    Delete = 2,
}

impl Default for CollectionOps {
    fn default() -> Self {
        Self(
            (0..OPS_SLOTS)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
        )
    }
}

impl CollectionOps {
    fn slot(&self, cid: u32) -> &[AtomicU64; 3] {
        let i = usize::try_from(cid)
            .unwrap_or(usize::MAX)
            .min(OPS_SLOTS - 1);
        &self.0[i]
    }

    /// Counts one `op` on engine key `key`.
    #[inline]
    pub(crate) fn count(&self, key: &[u8], op: Op) {
        self.slot(doc_key::collection_of(key))[op as usize].fetch_add(1, Relaxed);
    }

    /// The GET, store and delete counts of collection `cid`.
    pub(crate) fn get(&self, cid: u32) -> [u64; 3] {
        let s = self.slot(cid);
        [s[0].load(Relaxed), s[1].load(Relaxed), s[2].load(Relaxed)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_changes_bump_the_uid_and_ids_are_never_reused() {
        let c = Collections::open(None).unwrap();
        assert_eq!(c.uid(), 0);
        assert_eq!(c.create_scope("inventory"), Ok(1));
        assert_eq!(c.create_collection("inventory", "airline", 0), Ok(2));
        assert_eq!(c.collection_id("inventory.airline"), Ok((2, 9)));
        assert_eq!(c.collection_id("."), Ok((2, 0)));
        assert_eq!(c.collection_id("_default._default"), Ok((2, 0)));
        assert_eq!(c.scope_id("inventory"), Ok((2, 8)));
        assert_eq!(
            c.collection_id("inventory.nope"),
            Err(EngineStatus::UnknownCollection)
        );
        assert_eq!(c.collection_id("nope.x"), Err(EngineStatus::UnknownScope));
        assert_eq!(c.collection_id("nodot"), Err(EngineStatus::Invalid));
        assert_eq!(
            c.create_collection("inventory", "airline", 0),
            Err(EngineStatus::KeyExists)
        );
        assert_eq!(
            c.create_collection("inventory", "_bad", 0),
            Err(EngineStatus::Invalid)
        );
        let mut buf = epkv_types::doc_key::DocKeyBuf::new();
        let key = doc_key::encode(9, b"k", &mut buf).to_vec();
        assert_eq!(c.check_key(&key), Ok(()));
        assert_eq!(c.check_key(b"plain"), Ok(()));
        assert_eq!(c.drop_collection("inventory", "airline"), Ok(3));
        assert_eq!(c.check_key(&key), Err(EngineStatus::UnknownCollection));
        assert_eq!(c.dropped(), vec![9]);
        // Created again: a new id.
        assert_eq!(c.create_collection("inventory", "airline", 60), Ok(4));
        assert_eq!(c.collection_id("inventory.airline"), Ok((4, 10)));
        let mut buf = epkv_types::doc_key::DocKeyBuf::new();
        assert_eq!(c.max_ttl(doc_key::encode(10, b"k", &mut buf)), Some(60));
        assert_eq!(c.max_ttl(b"k"), None);
        assert_eq!(c.drop_scope("_default"), Err(EngineStatus::Invalid));
        assert_eq!(c.drop_collection("_default", "_default"), Ok(5));
        assert_eq!(c.check_key(b"plain"), Err(EngineStatus::UnknownCollection));
    }

    #[test]
    fn a_change_computed_elsewhere_applies_with_the_same_ids_and_uid() {
        let c = Collections::open(None).unwrap();
        c.create_scope("here-only").unwrap();
        // Decided centrally from a fresh manifest, then replaced on this node.
        let base = Manifest::default();
        let m1 = base
            .changed(&ManifestChange::CreateScope { name: "s".into() })
            .unwrap();
        let m2 = m1
            .changed(&ManifestChange::CreateCollection {
                scope: "s".into(),
                name: "c".into(),
                max_ttl: 7,
            })
            .unwrap();
        assert_eq!((m2.uid, m2.next_id), (2, 10));
        let out = c.replace(m2.clone()).unwrap();
        assert_eq!(out.uid, 2);
        assert!(out.dropped_any, "the local-only scope went");
        assert_eq!(c.collection_id("s.c"), Ok((2, 9)));
        assert_eq!(c.scope_id("here-only"), Err(EngineStatus::UnknownScope));
        assert_eq!(c.manifest().next_id, 10);
        let mut buf = epkv_types::doc_key::DocKeyBuf::new();
        assert_eq!(c.max_ttl(doc_key::encode(9, b"k", &mut buf)), Some(7));
        // The same manifest again changes nothing.
        assert_eq!(
            c.replace(m2.clone()).unwrap(),
            ReplaceOutcome {
                uid: 2,
                dropped_any: false
            }
        );
        // Validation is the same as a local change's.
        assert_eq!(
            m2.changed(&ManifestChange::CreateScope { name: "s".into() }),
            Err(EngineStatus::KeyExists)
        );
        assert_eq!(
            m2.changed(&ManifestChange::DropScope {
                name: "nope".into()
            }),
            Err(EngineStatus::UnknownScope)
        );
        assert_eq!(
            m2.changed(&ManifestChange::DropScope {
                name: "_default".into()
            }),
            Err(EngineStatus::Invalid)
        );
        // A drop: the collection goes, its id is to be purged, ids are not reused.
        let m3 = m2
            .changed(&ManifestChange::DropCollection {
                scope: "s".into(),
                name: "c".into(),
            })
            .unwrap();
        let out = c.replace(m3).unwrap();
        assert!(out.dropped_any);
        assert_eq!(c.collection_id("s.c"), Err(EngineStatus::UnknownCollection));
        assert!(c.dropped().contains(&9));
        c.forget_dropped(&[9]);
        assert_eq!(c.uid(), 3, "forgetting purged collections keeps the uid");
        // A malformed target is refused.
        let mut bad = Manifest::default();
        bad.scopes.push(ScopeEntry {
            id: 0,
            name: "dup".into(),
            collections: Vec::new(),
        });
        assert_eq!(c.replace(bad), Err(EngineStatus::Invalid));
    }

    #[test]
    fn the_manifest_file_round_trips() {
        let dir = std::env::temp_dir().join(format!("epkv-coll-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = Collections::open(Some(dir.clone())).unwrap();
        c.create_scope("s1").unwrap();
        c.create_collection("s1", "c1", 5).unwrap();
        c.create_collection("s1", "c2", 0).unwrap();
        c.drop_collection("s1", "c2").unwrap();
        let again = Collections::open(Some(dir.clone())).unwrap();
        assert_eq!(*again.manifest(), *c.manifest());
        assert_eq!(again.manifest().dropped, vec![10]);
        let j = again.manifest().to_json();
        assert_eq!(j["uid"], "4");
        assert_eq!(j["scopes"][1]["collections"][0]["maxTTL"], 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
