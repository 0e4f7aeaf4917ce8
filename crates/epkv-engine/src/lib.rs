//! The epkv bucket: an in-memory, vBucket-partitioned document store implementing
//! [`epkv_engine_api::Engine`].
//!
//! This crate is the engine the front end drives through `epkv-engine-api`: a [`Bucket`]
//! of 1024 (configurable) vBuckets, each with a state, a hash table of documents, a seqno
//! counter, hybrid-logical-clock CAS, revision seqnos and a failover log; memcached and
//! KV-Engine command semantics (SET/ADD/REPLACE/APPEND/PREPEND, DELETE, INCREMENT/
//! DECREMENT, TOUCH/GAT, GET_LOCKED/UNLOCK, FLUSH); expiry on access and by a background
//! expiry pager; a memory quota; and the `""`, `memory`, `vbucket` and `vbucket-details`
//! STAT groups. With [`BucketConfig::persistence`] set it persists through `epkv-storage`:
//! per-vBucket dirty queues (de-duplicating keys), one flusher task per shard on a Writer
//! thread, a persisted seqno per vBucket with non-blocking waiters
//! ([`Bucket::when_persisted`], [`Bucket::wait_persisted`]), warmup on Reader tasks
//! after creation ([`Bucket::wait_warmup`]; a vBucket still loading answers TempFail), a
//! compactor on AuxIO, and a final flush at shutdown (see `persistence/`). An item
//! pager on the NonIO group keeps item memory between the watermarks: it ejects the
//! values of persisted documents (value eviction) or whole documents with a per-vBucket
//! key filter ([`EvictionPolicy::Full`], `full_eviction.rs`, `key_filter.rs`), or, in a
//! memory-only bucket, deletes the least used documents or leaves writes to fail with ENOMEM
//! ([`EphemeralFullPolicy`]); an operation needing an ejected value answers
//! `WouldBlock` after queueing a background fetch on the Reader group, and runs again
//! once [`epkv_engine_api::Engine::when_fetched`] says the fetch is over (see
//! `docs/memory.md`). Writes with durability requirements are SyncWrites: prepares held
//! beside the committed version and committed in seqno order once their level is met (see
//! `durability.rs`, `docs/durability.md`). It has no replication, and never sees the
//! wire format.
//!
//! # Key types
//! - [`Bucket`]: the engine; build it with [`Bucket::new`] from a [`BucketConfig`] and an
//!   [`EngineClock`].
//! - [`BucketConfig`]: every setting, with its default and unit.
//! - [`EngineClock`]: the time source (system, testing offset clock, or any
//!   [`epkv_executor::Clock`] such as a `ManualClock`).
//! - [`STATS`]: the single table of the stats the engine emits.
//! - [`PersistenceConfig`], [`FlusherMode`], [`PersistedFuture`]: persistence settings
//!   and the persisted-seqno wait.
//!
//! # Layering
//! The modules import each other without cycles (`tests/module_cycles.rs` fails on one),
//! and each level imports only the levels below it:
//! 1. **Leaf types**, importing nothing of the crate (or only another leaf): `config`,
//!    `persistence_config`, `clock`, `error`, `hlc`, `stats`, `lazy_now`,
//!    `counter_value`, `subdoc`, `collections`, `shard_store`, `expiry_pager`,
//!    `pager_waker`, `bg_fetch_queue`, `scan_registry`; and the parts a vBucket owns: `dcp_log`,
//!    `durability_monitor`, `vb_persist`, `key_filter`, `pending_ops`.
//! 2. **The vBucket** (`vbucket`: state, hash table, ordering point, failover log) and
//!    what works on one of its documents: `document`, `xattrs`.
//! 3. **The store**: `persistence` (dirty queues taken by the flushers, warmup,
//!    compaction), over a slice of vBuckets.
//! 4. **The bucket core** (`bucket_core`): the vBuckets, the store, the memory tracker,
//!    the counters, the clock and the configuration, with the primitives every write
//!    shares (routing a request, admission under the quota, waking the flusher and the
//!    item pager). It holds no service.
//! 5. **The services**, each a set of methods of the core in a module of its own, none
//!    naming the bucket: `bg_fetcher`, `full_eviction`, `durability`, `item_pager`,
//!    `system_events`, `dcp`, `parking`. Background work that must not keep the bucket alive holds
//!    it as a `Weak<dyn CoreOwner>`.
//! 6. **The bucket** (`bucket`): the core plus the item and expiry pagers, the write path
//!    every operation shares (expiry on access, commit, delete) and the task wiring. The
//!    expiry pager (a leaf) is generic over its owner: the bucket starts it with a weak
//!    reference to itself and `Bucket::run_expiry_pass`.
//! 7. **The operations** on it: `ops`, `subdoc_ops`, `replica`, `stat_groups`,
//!    `bucket_collections`, `range_scan` (range and sampling scans, see
//!    `docs/range-scans.md`), and `engine_impl` (the `Engine` trait). Only this level
//!    names [`Bucket`].
//!
//! The hot paths stay static: an operation reaches the core as a by-value field of the
//! bucket (a fixed offset, no indirection), and every call below it is a plain method
//! call; `dyn` appears only in background work's weak handle and the clock.
//!
//! # Invariants
//! - Per vBucket, seqnos strictly increase and CAS values strictly increase in seqno
//!   order: both are handed out together at one ordering point (the vBucket's `order`
//!   mutex), taken while the written key's stripe lock is held.
//! - Item memory (key + value + fixed per-item overhead) never exceeds the quota: a write
//!   that would pass it fails with TempFail (or NoMemory in a memory-only bucket that fails
//!   new data) and changes nothing. Past the high watermark (85% by default) the item
//!   pager frees memory down to the low watermark (75%).
//! - The item pager never ejects a value that is not persisted (dirty), nor a prepare;
//!   a background fetch restores a value only into the unchanged non-resident version it
//!   read, so a write that raced it wins.
//! - An expired document is never returned: every access checks expiry under the stripe
//!   lock and removes the document (with a new seqno) if its time has come.
//! - Client operations only run on active vBuckets whose vbid the key maps to, and only
//!   once warmup has loaded the vBucket (`VBucket::warmup`, an atomic checked before the
//!   state lock: Loading → TempFail, Failed → NotMyVbucket). Warmup writes a vBucket's
//!   documents and ordering point before it publishes Ready (Release/Acquire), and
//!   nothing else writes to a vBucket that is not Ready (client ops, SET_VBUCKET, the
//!   expiry pass and compaction skip it; FLUSH waits for the whole warmup).
//!
//! # Locking
//! Locks, in the order they may be taken (never the reverse):
//! 0. The durability monitor's completion mutex (`durability_monitor::Monitor::completing`):
//!    held while resolved SyncWrites are committed or aborted, in seqno order; taken with
//!    no stripe lock held (after the write's closure returned, by the flusher's persisted
//!    callback, by the timeout task, by SET_VBUCKET). The exception to this order: it is
//!    also taken inside `state` (1), shared by the write that added a prepare, exclusively
//!    by SET_VBUCKET settling the SyncWrites of a state change; `state` is never taken
//!    while it is held. The monitor's state mutex is a leaf: taken inside
//!    `order` to track a prepare, or alone; never held while a stripe is locked by the
//!    same thread after it. Waiters are called after it is released.
//! 1. `VBucket::state` (`parking_lot::RwLock`): held shared by every client operation for
//!    its whole duration and by the expiry pass over that vBucket; exclusive only while
//!    SET_VBUCKET changes the state. It guarantees no write lands after a vBucket left
//!    the active state. The parked operations' mutex (`pending_ops`) is a leaf taken
//!    inside it (shared to park, exclusive to take them all at a change); their
//!    callbacks run after both are released.
//! 2. One hash-table stripe mutex (`epkv_hashtable`): protects the documents of that
//!    stripe; an operation holds exactly one, for one key. Visitors (expiry pass, flush,
//!    stats) take the stripes one after another, never two at once.
//! 3. `VBucket::order` (mutex): the ordering point — high seqno, max CAS, max deleted
//!    revision. Held for a few instructions.
//! 4. `VBucket::failover` (mutex): the failover log; taken only with `state` held
//!    exclusively (state change) or alone (stats).
//! 5. The vBucket's dirty queue (`VbPersist::dirty`): taken inside `order` when a write
//!    queues its document (so the queue holds every seqno up to the high seqno), or alone
//!    by the flusher. The persisted-seqno waiters' mutex is a leaf; callbacks run after it
//!    is released.
//!
//! 6. The store's locks (`epkv-storage`): never taken inside a stripe lock. The
//!    background fetcher reads with no engine lock held, then takes the key's stripe lock
//!    to restore the value; the flusher and warmup take stripe locks only with no store
//!    lock held; the storage layer never calls back into the engine.
//!
//! The item pager holds `state` shared and one stripe at a time, like the expiry pass; its
//! cycle mutex is taken only by its own runs. The background fetch queues' mutexes are
//! leaves (waiters are called after they are released).
//!
//! The flusher holds its shard's flush mutex while it takes queues and commits; it takes
//! `state` shared (briefly, to read the state it commits), never a stripe lock while
//! holding a queue.
//!
//! Lock-free: the memory tracker (compare-and-swap on one atomic), the per-thread sharded
//! counters, the failover uuid mirror. The expiry pager's stop flag and thread handle
//! have their own mutexes, never held while any lock above is taken. GET takes lock 1
//! shared, one stripe lock, and clones two `Bytes`; it reads the clock only when the
//! document has an expiry or a lock.
//!
//! # Semantics worth knowing
//! - A pending vBucket (a takeover in progress) parks client operations, as KV-Engine
//!   does: they answer WouldBlock, and `Engine::when_fetched` calls back once the state
//!   changes (at most `pending_ops::PARK_TIMEOUT`, 2 s, later) to run them again
//!   (`parking.rs`). It still streams over DCP. Replica and dead answer NotMyVbucket.
//! - ADD with a non-zero CAS is Invalid (memcached's validator says EINVAL).
//! - A write with durability requirements is a SyncWrite (`docs/durability.md`): Majority
//!   commits at once (a single node with no replicas is its own majority) unless an
//!   earlier persist-level prepare fences it; the persist levels commit once the prepare
//!   is persisted, and answer DurabilityInvalidLevel in a memory-only bucket, as an
//!   ephemeral bucket. The front end answers once `Engine::when_sync_write_completed`
//!   reports the outcome.
//! - Deleted and expired documents are removed from memory at once; the vBucket remembers
//!   the highest revision it deleted so a re-created key continues above it.
//! - FLUSH empties every vBucket but keeps seqnos counting and failover logs.
//! - Stored keys and values are copied out of the request buffers.
//!
//! # Stats
//! [`epkv_engine_api::Engine::stats`] answers these groups (anything else is
//! `UnknownStatGroup`):
//! - `""` (default) and `memory`: exactly the stats listed in [`STATS`] for that group,
//!   with their units and meanings.
//! - `vbucket`: `vb_N` → `active` / `replica` / `pending` / `dead` for every vBucket.
//! - `vbucket-details` (or `vbucket-details N` for one vBucket): `vb_N` → state, plus
//!   `vb_N:num_items`, `vb_N:mem_used` (bytes), `vb_N:high_seqno`, `vb_N:max_cas`,
//!   `vb_N:max_deleted_revid`, `vb_N:uuid` and `vb_N:num_failover_entries`; for a
//!   persistent bucket also `vb_N:db_file_size` and `vb_N:db_data_size` (its data file's
//!   bytes and live bytes; fragmentation is `1 - data / file`). A vbid outside
//!   the bucket is `NotMyVbucket`, a non-number `Invalid`.
//! - `vbucket-seqno` (or `vbucket-seqno N`): `vb_N:high_seqno`, `vb_N:abs_high_seqno`,
//!   `vb_N:max_visible_seqno`, `vb_N:last_persisted_seqno`, `vb_N:uuid`,
//!   `vb_N:purge_seqno`, `vb_N:high_prepared_seqno`, `vb_N:high_completed_seqno`, and
//!   (epkv's, for the rebalancer) `vb_N:state`.
//! - `kvstore`: per shard `rw_N:batches`, `items_flushed`, `syncs`, `bytes_written`,
//!   `journal_bytes`, `checkpoints`, `file_opens`, `compactions`, `commit_failures`,
//!   `data_file_bytes`, `live_bytes`, `bytes_reclaimed`; and
//!   `open_files`, `fd_budget` (empty for a memory-only bucket).
//! - `persistence`: exactly the stats listed in [`STATS`] for that group
//!   (`ep_persistence_enabled`, shards, journal mode, `ep_queue_size` (documents waiting
//!   for the flusher), waiters, commits and failures, totals of the storage counters,
//!   `ep_disk_full`, `ep_warmup_value_count`); only `ep_persistence_enabled` for a
//!   memory-only bucket.
//! - `warmup`: `ep_warmup` (enabled/disabled), `ep_warmup_state` (`loading data`, then
//!   `done`), `ep_warmup_thread` (`running` / `complete`), `ep_warmup_vbuckets` (stored
//!   vBuckets queued), `ep_warmup_vbuckets_loaded`, `ep_warmup_vbuckets_failed`,
//!   `ep_warmup_value_count` (documents loaded with their values),
//!   `ep_warmup_key_only_count` (loaded as key and metadata: memory at the low watermark),
//!   `ep_warmup_oom` (not loaded at all: memory at the high watermark),
//!   `ep_warmup_unclean_shutdown`, and `vb_N:warmup_error` for each vBucket that could not
//!   be loaded. The default group's `ep_bg_fetched` counts values read back from disk,
//!   and `ep_num_value_ejects`, `ep_num_non_resident`, `vb_active_perc_mem_resident`,
//!   `ep_num_pager_runs` and the `ep_bg_*` timings describe eviction, and
//!   `ep_bg_meta_fetched` and `ep_bloom_filter_*` full eviction (`docs/memory.md`).
//!
//! Counters are kept per thread (sharded, cache-line aligned) and summed when read, so
//! counting never makes two cores write one cache line.
//!
//! # Dependencies
//! Depends on `epkv-types`, `epkv-engine-api`, `epkv-hashtable`, `epkv-storage` and
//! `epkv-executor` (the clock, and the flusher tasks). Must never depend on `epkv-protocol`, `epkv-frontend` or `epkv-server`.
//!
//! # Example
//! ```
//! use epkv_engine::{Bucket, BucketConfig, EngineClock};
//! use epkv_engine_api::{Engine, EngineStatus, Expiry, StoreOp, StoreRequest};
//! use epkv_types::{vbucket_for_key, Cas, Datatype, NUM_VBUCKETS};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let bucket = Bucket::new(BucketConfig::default(), EngineClock::System)?;
//! let key: &[u8] = b"greeting";
//! let vbid = vbucket_for_key(key, NUM_VBUCKETS);
//! let info = bucket.store(StoreRequest {
//!     op: StoreOp::Set,
//!     vbid,
//!     key,
//!     value: b"hello",
//!     flags: 0,
//!     expiry: Expiry::Never,
//!     preserve_ttl: false,
//!     datatype: Datatype::RAW,
//!     cas: Cas::ANY,
//!     durability: None,
//! })?;
//! let item = bucket.get(vbid, key)?;
//! assert_eq!(item.value.as_ref(), b"hello");
//! assert_eq!(item.cas, info.cas);
//! let other = vbucket_for_key(b"missing", NUM_VBUCKETS);
//! assert_eq!(bucket.get(other, b"missing"), Err(EngineStatus::KeyNotFound));
//! bucket.shutdown();
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(rustdoc::broken_intra_doc_links)]

mod bg_fetch_queue;
mod bg_fetcher;
mod bucket;
mod bucket_collections;
mod bucket_core;
mod clock;
pub mod collections;
mod config;
mod counter_value;
mod dcp;
mod dcp_log;
mod document;
mod durability;
mod durability_monitor;
mod engine_impl;
mod error;
mod expiry_pager;
mod full_eviction;
mod hlc;
mod item_pager;
mod key_filter;
mod lazy_now;
mod ops;
mod pager_waker;
mod parking;
mod pending_ops;
mod persistence;
mod persistence_config;
mod random_key;
mod range_scan;
mod replica;
mod scan_registry;
mod shard_store;
mod stat_groups;
mod stats;
mod subdoc;
mod subdoc_ops;
mod system_events;
mod vb_persist;
mod vbucket;
mod xattrs;

/// Entry points for the fuzz targets (`fuzz/fuzz_targets/subdoc.rs`); not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    /// Whether a sub-document path parses.
    #[must_use]
    pub fn subdoc_path_parses(path: &[u8]) -> bool {
        crate::subdoc::parse_path(path).is_ok()
    }

    /// Runs sub-document operation `op` (an index into the lookups then the mutations,
    /// modulo their number) on `doc`; returns the document afterwards (mutations) or the
    /// lookup's result, or `None` when the operation failed.
    #[must_use]
    pub fn subdoc_apply(
        doc: &[u8],
        op: u8,
        path: &[u8],
        value: &[u8],
        mkdir: bool,
    ) -> Option<Vec<u8>> {
        use epkv_engine_api::SubdocOp;
        const LOOKUPS: [SubdocOp; 3] = [SubdocOp::Get, SubdocOp::Exists, SubdocOp::GetCount];
        const MUTATIONS: [SubdocOp; 9] = [
            SubdocOp::DictAdd,
            SubdocOp::DictUpsert,
            SubdocOp::Delete,
            SubdocOp::Replace,
            SubdocOp::ArrayPushLast,
            SubdocOp::ArrayPushFirst,
            SubdocOp::ArrayInsert,
            SubdocOp::ArrayAddUnique,
            SubdocOp::Counter,
        ];
        let i = usize::from(op) % (LOOKUPS.len() + MUTATIONS.len());
        if let Some(l) = LOOKUPS.get(i) {
            // The text scanners, checking and trusting the document.
            let _ = crate::subdoc::lookup_raw(doc, *l, path, false);
            let _ = crate::subdoc::lookup_raw(doc, *l, path, true);
        }
        let mut parsed = crate::subdoc::parse_doc(doc).ok()?;
        match LOOKUPS.get(i) {
            Some(l) => crate::subdoc::lookup(&parsed, *l, path).ok(),
            None => {
                crate::subdoc::mutate(
                    &mut parsed,
                    MUTATIONS[i - LOOKUPS.len()],
                    path,
                    value,
                    mkdir,
                )
                .ok()?;
                serde_json::to_vec(&parsed).ok()
            }
        }
    }

    /// Runs a value a client sends with datatype XATTR through the attribute checks and,
    /// when it passes, through parsing, macro expansion of its first attribute and
    /// encoding. Panics if an accepted section does not read back the same.
    #[expect(clippy::expect_used, reason = "a fuzz target's failures are panics")]
    pub fn xattr_value(value: &[u8]) {
        use crate::xattrs::{Attrs, Patches, valid_section};
        let Ok((section, _body)) = epkv_engine_api::xattr::split(value) else {
            return;
        };
        if !valid_section(section) {
            return;
        }
        let attrs = Attrs::parse(section).expect("an accepted section parses");
        let mut patches = Patches::default();
        let again = attrs.to_section(0, &mut patches);
        let back = Attrs::parse(&again).expect("an encoded section parses");
        assert_eq!(back, attrs, "attributes survive encoding");
        if let Some(v) = attrs.0.values().next()
            && let Ok(text) = serde_json::to_vec(v)
            && let Ok(expanded) =
                Attrs::expand_macros(&text, &mut || serde_json::json!({"$document": {}}))
        {
            let mut with = attrs.clone();
            if let Some(first) = with.0.values_mut().next() {
                *first = serde_json::from_slice(&expanded).expect("expanded value is JSON");
            }
            let mut patches = Patches::default();
            let mut section = with.to_section(0, &mut patches);
            let a = crate::vbucket::Assigned {
                seqno: epkv_types::Seqno(1),
                cas: epkv_types::Cas(2),
                new_key_rev: 1,
            };
            patches.apply(&mut section, &a);
            Attrs::parse(&section).expect("a section with macros written parses");
        }
    }
}

pub use bucket::Bucket;
pub use clock::EngineClock;
pub use config::{
    BucketConfig, DEFAULT_EXPIRY_PAGER_INTERVAL, DEFAULT_GETL_DEFAULT_TIMEOUT_SECS,
    DEFAULT_GETL_MAX_TIMEOUT_SECS, DEFAULT_HT_LOCKS, DEFAULT_ITEM_PAGER_INTERVAL,
    DEFAULT_MAX_ITEM_SIZE_BYTES, DEFAULT_MEM_HIGH_WAT_PERCENT, DEFAULT_MEM_LOW_WAT_PERCENT,
    DEFAULT_MEMORY_QUOTA_BYTES, DEFAULT_RANGE_SCAN_IDLE_TIMEOUT, DEFAULT_RANGE_SCAN_MAX_KEY_BYTES,
    DEFAULT_RANGE_SCAN_MAX_OWNER_KEY_BYTES, DEFAULT_RANGE_SCAN_MAX_PER_OWNER, EphemeralFullPolicy,
    EvictionPolicy, MIN_MEMORY_QUOTA_BYTES,
};
pub use epkv_storage::JournalMode;
pub use error::{Error, Result};
pub use item_pager::PagerRun;
pub use persistence::PersistedFuture;
pub use persistence_config::{FlusherMode, PersistenceConfig};
pub use scan_registry::{CONTINUE_MAX_BYTES, LOAD_BYTES, LOAD_ITEMS};
pub use shard_store::StorageBackend;
pub use stats::{STATS, StatDefinition, StatGroup, StatUnit};
