//! The bucket's work on scopes and collections: purging the documents of dropped
//! collections, the `collections` and `scopes` STAT groups, and a collection's maxTTL.
//!
//! Level: the top (operations on [`Bucket`]); the manifest itself is
//! [`crate::collections`], a leaf.

use crate::Bucket;
use epkv_types::doc_key;

impl Bucket {
    /// Removes the documents of collections that no longer exist: from memory, one
    /// vBucket at a time (each a stripe at a time: no request waits long); then, in a
    /// persistent bucket, from the data files by a compaction of every file (paced as
    /// any compaction), after which the manifest forgets them. Returns the documents
    /// removed from memory.
    pub fn purge_dropped(&self) -> usize {
        let mut removed = 0;
        for vb in &self.core.vbuckets {
            removed += vb.table.retain(|sv| {
                self.core
                    .collections
                    .is_live(doc_key::collection_of(sv.key()))
            });
            std::thread::yield_now();
        }
        if self.core.persistence.is_none() {
            self.core
                .collections
                .forget_dropped(&self.core.collections.dropped());
        } else if let Err(e) = self.compact_all() {
            tracing::warn!(bucket = %self.core.config.name, error = %e, "dropped collections stay on disk until the next compaction");
        }
        removed
    }

    /// The collections manifest with its ids, next id and dropped collections (what a
    /// cluster's metadata store is seeded from).
    #[must_use]
    pub fn manifest(&self) -> std::sync::Arc<crate::collections::Manifest> {
        self.core.collections.manifest()
    }

    /// Items and memory of each collection, counted over memory (under full eviction,
    /// documents only on disk are not counted).
    fn collection_usage(&self) -> std::collections::HashMap<u32, (u64, u64)> {
        let mut usage: std::collections::HashMap<u32, (u64, u64)> =
            std::collections::HashMap::new();
        for vb in &self.core.vbuckets {
            vb.table.for_each(|sv| {
                if !sv.is_deleted() {
                    let u = usage.entry(doc_key::collection_of(sv.key())).or_default();
                    u.0 += 1;
                    u.1 += sv.footprint() as u64;
                }
            });
        }
        usage
    }

    /// `STAT collections`: the manifest uid, then for each collection
    /// `SCOPE_ID:COLLECTION_ID:` `name`, `scope_name`, `items`, `mem_used`, `maxTTL`,
    /// `ops_get`, `ops_store`, `ops_delete` (ids in hex with `0x`, as KV-Engine).
    pub(crate) fn emit_collections(&self, sink: epkv_engine_api::StatSink<'_>) {
        let m = self.core.collections.manifest();
        let usage = self.collection_usage();
        sink("manifest_uid", &m.uid.to_string());
        for s in &m.scopes {
            for c in &s.collections {
                let p = format!("{:#x}:{:#x}:", s.id, c.id);
                let (items, mem) = usage.get(&c.id).copied().unwrap_or_default();
                let [gets, stores, deletes] = self.collection_ops.get(c.id);
                sink(&format!("{p}name"), &c.name);
                sink(&format!("{p}scope_name"), &s.name);
                sink(&format!("{p}items"), &items.to_string());
                sink(&format!("{p}mem_used"), &mem.to_string());
                sink(&format!("{p}maxTTL"), &c.max_ttl.unwrap_or(0).to_string());
                sink(&format!("{p}ops_get"), &gets.to_string());
                sink(&format!("{p}ops_store"), &stores.to_string());
                sink(&format!("{p}ops_delete"), &deletes.to_string());
            }
        }
    }

    /// `STAT scopes`: the manifest uid, then for each scope `SCOPE_ID:` `name`,
    /// `collections` (how many) and `items`.
    pub(crate) fn emit_scopes(&self, sink: epkv_engine_api::StatSink<'_>) {
        let m = self.core.collections.manifest();
        let usage = self.collection_usage();
        sink("manifest_uid", &m.uid.to_string());
        for s in &m.scopes {
            let p = format!("{:#x}:", s.id);
            let items: u64 = s
                .collections
                .iter()
                .map(|c| usage.get(&c.id).map_or(0, |u| u.0))
                .sum();
            sink(&format!("{p}name"), &s.name);
            sink(&format!("{p}collections"), &s.collections.len().to_string());
            sink(&format!("{p}items"), &items.to_string());
        }
    }

    /// Starts [`Self::purge_dropped`] on a thread of its own (a drop answers at once).
    pub(crate) fn start_purge(&self) {
        let weak = self.self_ref.clone();
        let spawned = std::thread::Builder::new()
            .name("epkv-collection-purge".into())
            .spawn(move || {
                let Some(bucket) = weak.upgrade() else {
                    return;
                };
                let started = bucket.core.clock.now();
                let removed = bucket.purge_dropped();
                tracing::info!(
                    bucket = %bucket.core.config.name,
                    removed,
                    millis = bucket.core.clock.now().saturating_duration_since(started).as_millis(),
                    "dropped collections purged from memory"
                );
            });
        match spawned {
            Ok(t) => {
                let mut purges = self.purges.lock();
                purges.retain(|t| !t.is_finished());
                purges.push(t);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start the purge of dropped collections; it runs now");
                self.purge_dropped();
            }
        }
    }

    /// The expiry a write gets in the collection of engine key `key`: its `maxTTL`
    /// applies to a write without an expiry and caps a longer one.
    pub(crate) fn collection_expiry(&self, key: &[u8], expiry_unix: u32, now_secs: u32) -> u32 {
        match self.core.collections.max_ttl(key) {
            Some(ttl) => {
                let limit = now_secs.saturating_add(ttl);
                if expiry_unix == 0 || expiry_unix > limit {
                    limit
                } else {
                    expiry_unix
                }
            }
            None => expiry_unix,
        }
    }
}
