//! The [`Engine`] trait: everything the front end can ask of a bucket.

use crate::range_scan::{
    RangeScanCreate, RangeScanCreated, RangeScanId, RangeScanLimits, RangeScanProgress, ScanItem,
};
use crate::{
    ArithmeticRequest, EngineResult, EngineStatus, Item, MutationInfo, RemoveRequest, StoreRequest,
    VBucketSeqnos,
};
use epkv_types::{Cas, Seqno, VBucketState, Vbid};

/// Receives stat key/value pairs from [`Engine::stats`].
pub type StatSink<'a> = &'a mut dyn FnMut(&str, &str);

/// Called by [`Engine::when_persisted`] with the vBucket's persisted seqno once it has
/// reached the seqno waited for. It runs on an engine thread (the flusher's, or the
/// caller's when the seqno is already persisted), so it must be quick and never block:
/// typically it completes a channel the waiting connection polls.
pub type PersistedCallback = Box<dyn FnOnce(Seqno) + Send + 'static>;

/// Called by [`Engine::when_sync_write_completed`] with the outcome of a SyncWrite (a
/// write with durability requirements): `Ok(())` once it is committed, or the status to
/// answer (`SyncWriteAmbiguous` when its timeout passed first and it was aborted). It
/// runs on an engine thread (a front-end worker, the flusher, or the durability timeout
/// task), so it must be quick and never block.
pub type SyncWriteCallback = Box<dyn FnOnce(EngineResult<()>) + Send + 'static>;

/// Called by [`Engine::when_fetched`] once what an operation's
/// [`EngineStatus::WouldBlock`] waited for is over (the background fetch of a key, or the
/// pending state of its vBucket): `Ok(())` means "execute the operation again" (the value
/// is back in memory, the vBucket left the pending state, or the wait's bound passed; the
/// new attempt sees how things are now); an error is the outcome to answer instead (the
/// disk read failed, memory is too full to hold the value, the engine is shutting down).
/// It runs on an engine thread (a Reader or NonIO thread, the thread changing the
/// vBucket's state, or the caller's when nothing is in flight), so it must be quick and
/// never block.
pub type FetchedCallback = Box<dyn FnOnce(EngineResult<()>) + Send + 'static>;

/// A bucket engine. All methods are synchronous and must not block for I/O: an operation
/// that needs data from disk answers [`EngineStatus::WouldBlock`] after queueing a
/// background fetch, and the caller waits for it with [`Engine::when_fetched`] (without
/// blocking a thread) and executes the operation again. Every method is callable
/// concurrently from many front-end threads.
pub trait Engine: Send + Sync + 'static {
    /// Reads a live document (GET, GETK and their quiet variants).
    ///
    /// # Errors
    /// `KeyNotFound`, `NotMyVbucket`, `TempFail`.
    fn get(&self, vbid: Vbid, key: &[u8]) -> EngineResult<Item>;

    /// A hint that `key` of `vbid` is about to be read or written: the engine may start
    /// loading the memory its lookup will touch, so that the front end overlaps the cache
    /// misses of pipelined requests (it gives the hint for the next request in a
    /// connection's buffer while it runs the current one). It changes nothing and may
    /// be ignored; the default does nothing.
    fn prefetch(&self, vbid: Vbid, key: &[u8]) {
        let _ = (vbid, key);
    }

    /// The first stage of [`Self::prefetch`], for a request further ahead whose key is
    /// not looked at yet: the engine may start loading `vbid`'s own state. The default
    /// does nothing.
    fn prefetch_vbucket(&self, vbid: Vbid) {
        let _ = vbid;
    }

    /// Reads a live document as [`Self::get`] does, but lends it to `f` instead of
    /// returning a copy: the front end encodes the reply straight from the engine's
    /// memory. `f` runs while the engine holds the key (under its lock), so it must be
    /// short and must not call back into the engine. The default calls [`Self::get`].
    ///
    /// # Errors
    /// As [`Self::get`]; `f` is not called on an error.
    fn get_with(
        &self,
        vbid: Vbid,
        key: &[u8],
        f: &mut dyn FnMut(&crate::ItemView<'_>),
    ) -> EngineResult<()> {
        let item = self.get(vbid, key)?;
        f(&item.view());
        Ok(())
    }

    /// Reads a document and sets its expiry (GAT, GATQ).
    ///
    /// # Errors
    /// `KeyNotFound`, `Locked`, `NotMyVbucket`, `TempFail`.
    fn get_and_touch(&self, vbid: Vbid, key: &[u8], expiry_raw: u32) -> EngineResult<Item>;

    /// Sets a document's expiry (TOUCH).
    ///
    /// # Errors
    /// `KeyNotFound`, `Locked`, `NotMyVbucket`, `TempFail`.
    fn touch(&self, vbid: Vbid, key: &[u8], expiry_raw: u32) -> EngineResult<MutationInfo>;

    /// Reads a document and locks it for `lock_timeout_secs` (GET_LOCKED; 0 = the default,
    /// 15 s; values above the maximum, 30 s, are clamped to the default as KV-Engine does).
    /// The returned item carries the lock CAS, which UNLOCK_KEY or a CAS write must present.
    ///
    /// # Errors
    /// `KeyNotFound`, `Locked` (already locked), `NotMyVbucket`, `TempFail`.
    fn get_locked(&self, vbid: Vbid, key: &[u8], lock_timeout_secs: u32) -> EngineResult<Item>;

    /// Releases a lock taken by [`Engine::get_locked`] (UNLOCK_KEY).
    ///
    /// # Errors
    /// `KeyNotFound`, `Locked` (wrong CAS), `NotLocked`, `NotMyVbucket`.
    fn unlock(&self, vbid: Vbid, key: &[u8], cas: Cas) -> EngineResult<()>;

    /// A document's metadata, tombstones included (GET_META). A document whose metadata
    /// is on disk only answers `WouldBlock` first, as [`Engine::get`] does.
    ///
    /// # Errors
    /// `KeyNotFound` (no document and no tombstone), `WouldBlock`, `NotMyVbucket`,
    /// `TempFail`; `NotSupported` for an engine without it (the default).
    fn get_meta(&self, vbid: Vbid, key: &[u8]) -> EngineResult<crate::DocMeta> {
        let _ = (vbid, key);
        Err(EngineStatus::NotSupported)
    }

    /// Runs sub-document lookups on one document (SUBDOC_GET/EXISTS/GET_COUNT,
    /// MULTI_LOOKUP), on an active vBucket or, with `flags.replica_read`, a replica one.
    ///
    /// # Errors
    /// `KeyNotFound`, `WouldBlock`, `NotMyVbucket` (also for a replica read of a vBucket
    /// that is not a replica here), `TempFail`; `NotSupported` for an engine without it
    /// (the default).
    fn subdoc_lookup(
        &self,
        vbid: Vbid,
        key: &[u8],
        specs: &[crate::SubdocSpec<'_>],
        flags: crate::LookupFlags,
    ) -> EngineResult<crate::SubdocLookup> {
        let _ = (vbid, key, specs, flags);
        Err(EngineStatus::NotSupported)
    }

    /// GET_RANDOM_KEY: a resident live document of collection `cid` from a random active
    /// vBucket; its key is the engine's (collection-encoded) key.
    ///
    /// # Errors
    /// `UnknownCollection`; `KeyNotFound` when none is found; `NotSupported` for an
    /// engine without it (the default).
    fn get_random_key(&self, cid: u32) -> EngineResult<crate::Item> {
        let _ = cid;
        Err(EngineStatus::NotSupported)
    }

    /// The uid of the bucket's collections manifest (0 for an engine without
    /// collections).
    fn manifest_uid(&self) -> u64 {
        0
    }

    /// The collections manifest as JSON (GET_COLLECTIONS_MANIFEST).
    ///
    /// # Errors
    /// `NotSupported` for an engine without collections (the default).
    fn collections_manifest(&self) -> EngineResult<String> {
        Err(EngineStatus::NotSupported)
    }

    /// The manifest uid and the id of the collection at `path` (`scope.collection`).
    ///
    /// # Errors
    /// `Invalid`, `UnknownScope`, `UnknownCollection`; `NotSupported` (the default).
    fn collection_id(&self, path: &str) -> EngineResult<(u64, u32)> {
        let _ = path;
        Err(EngineStatus::NotSupported)
    }

    /// The manifest uid and the id of scope `path`.
    ///
    /// # Errors
    /// `Invalid`, `UnknownScope`; `NotSupported` (the default).
    fn scope_id(&self, path: &str) -> EngineResult<(u64, u32)> {
        let _ = path;
        Err(EngineStatus::NotSupported)
    }

    /// The names of collection `cid` and of its scope, `(scope, collection)`: what the
    /// front end needs to check the privileges of a user whose roles name a scope or a
    /// collection. Never asked on the common path (a user with a grant on the whole
    /// bucket). A collection id names one collection for the bucket's whole life (ids
    /// are never reused), so callers may keep the answer.
    ///
    /// # Errors
    /// `UnknownCollection` for an id that names no live collection. The default (an
    /// engine without collections) knows only the default collection, id 0.
    fn collection_names(&self, cid: u32) -> EngineResult<(String, String)> {
        if cid == 0 {
            Ok(("_default".to_owned(), "_default".to_owned()))
        } else {
            Err(EngineStatus::UnknownCollection)
        }
    }

    /// Creates a scope; returns the new manifest uid.
    ///
    /// # Errors
    /// `Invalid` (name), `KeyExists`, `TooBig` (limit); `NotSupported` (the default).
    fn create_scope(&self, name: &str) -> EngineResult<u64> {
        let _ = name;
        Err(EngineStatus::NotSupported)
    }

    /// Drops a scope and its collections; returns the new manifest uid.
    ///
    /// # Errors
    /// `Invalid` (the default scope), `UnknownScope`; `NotSupported` (the default).
    fn drop_scope(&self, name: &str) -> EngineResult<u64> {
        let _ = name;
        Err(EngineStatus::NotSupported)
    }

    /// Creates a collection with a `max_ttl` in seconds (0 = none); returns the new
    /// manifest uid.
    ///
    /// # Errors
    /// `Invalid` (name), `UnknownScope`, `KeyExists`, `TooBig`; `NotSupported` (the
    /// default).
    fn create_collection(&self, scope: &str, name: &str, max_ttl: u32) -> EngineResult<u64> {
        let _ = (scope, name, max_ttl);
        Err(EngineStatus::NotSupported)
    }

    /// Drops a collection (its documents go in the background); returns the new
    /// manifest uid.
    ///
    /// # Errors
    /// `UnknownScope`, `UnknownCollection`; `NotSupported` (the default).
    fn drop_collection(&self, scope: &str, name: &str) -> EngineResult<u64> {
        let _ = (scope, name);
        Err(EngineStatus::NotSupported)
    }

    /// Replaces the collections manifest by `manifest`, with its ids and uid
    /// (kv_engine's SET_COLLECTIONS_MANIFEST): what every node of a cluster applies so
    /// that all have the same collection ids and uid. `manifest` is the JSON of
    /// [`Engine::collections_manifest`] plus `next_id` (the next id a new scope or
    /// collection gets). Scopes and collections are matched by id: those gone are
    /// dropped (their documents purged in the background), new ones created. Returns
    /// the new manifest uid; the current manifest again changes nothing.
    ///
    /// # Errors
    /// `Invalid` for a malformed manifest (no default scope, an id used twice);
    /// `TempFail` when it cannot be persisted; `NotSupported` (the default).
    fn set_collections_manifest(&self, manifest: &str) -> EngineResult<u64> {
        let _ = manifest;
        Err(EngineStatus::NotSupported)
    }

    /// Applies sub-document mutations to one document, all or none (the single-path
    /// mutations and MULTI_MUTATION).
    ///
    /// # Errors
    /// As [`Engine::store`]: `KeyNotFound` (no document and no MKDOC/ADD), `KeyExists`
    /// (CAS mismatch, or ADD of an existing document), `Locked`, `TooBig`, `TempFail`,
    /// `WouldBlock`, `NotMyVbucket`; `NotSupported` for an engine without it.
    fn subdoc_mutate(&self, req: crate::SubdocMutation<'_>) -> EngineResult<crate::SubdocMutated> {
        let _ = req;
        Err(EngineStatus::NotSupported)
    }

    /// A key's persistence state and CAS (OBSERVE).
    ///
    /// # Errors
    /// `NotMyVbucket`, `TempFail`, `WouldBlock`; `NotSupported` for an engine without
    /// it (the default).
    fn observe(&self, vbid: Vbid, key: &[u8]) -> EngineResult<(crate::KeyState, Cas)> {
        let _ = (vbid, key);
        Err(EngineStatus::NotSupported)
    }

    /// Ejects a document from memory now (EVICT_KEY): its value, or under full eviction
    /// the whole document. `Ok(true)` when it ejected something, `Ok(false)` when there
    /// was nothing in memory to eject.
    ///
    /// # Errors
    /// `KeyNotFound`; `KeyExists` for a document not yet persisted; `NotSupported` for an
    /// engine that cannot read documents back (the default); `NotMyVbucket`, `TempFail`.
    fn evict_key(&self, vbid: Vbid, key: &[u8]) -> EngineResult<bool> {
        let _ = (vbid, key);
        Err(EngineStatus::NotSupported)
    }

    /// Stores a document (SET, ADD, REPLACE, APPEND, PREPEND).
    ///
    /// # Errors
    /// `KeyExists`, `KeyNotFound`, `NotStored`, `Locked`, `TooBig`, `NotMyVbucket`,
    /// `TempFail`, `NoMemory`, durability statuses.
    fn store(&self, req: StoreRequest<'_>) -> EngineResult<MutationInfo>;

    /// Deletes a document (DELETE), leaving a tombstone.
    ///
    /// # Errors
    /// `KeyNotFound`, `KeyExists` (CAS mismatch), `Locked`, `NotMyVbucket`, `TempFail`.
    fn remove(&self, req: RemoveRequest<'_>) -> EngineResult<MutationInfo>;

    /// Increments or decrements a decimal counter, returning the new value.
    ///
    /// # Errors
    /// `DeltaBadValue`, `KeyNotFound`, `KeyExists`, `Locked`, `NotMyVbucket`, `TempFail`.
    fn arithmetic(&self, req: ArithmeticRequest<'_>) -> EngineResult<(u64, MutationInfo)>;

    /// Removes every document from every vBucket (FLUSH).
    ///
    /// # Errors
    /// `NotSupported` when flush is disabled for the bucket.
    fn flush(&self) -> EngineResult<()>;

    /// Emits one stat group; `group` is the STAT key ("" for the default group,
    /// `vbucket`, `memory`, ...). Front-end groups (`timings`, connections) are answered by
    /// the front end itself.
    ///
    /// # Errors
    /// `UnknownStatGroup`.
    fn stats(&self, group: &str, sink: StatSink<'_>) -> EngineResult<()>;

    /// Returns a vBucket's state, or `None` if this node does not have it.
    fn vbucket_state(&self, vbid: Vbid) -> Option<VBucketState>;

    /// Creates a vBucket or changes its state (SET_VBUCKET).
    ///
    /// # Errors
    /// `NotMyVbucket` for a vbid outside the bucket's range.
    fn set_vbucket_state(&self, vbid: Vbid, state: VBucketState) -> EngineResult<()>;

    /// Shifts the engine clock by `offset_secs` relative to real time (ADJUST_TIMEOFDAY,
    /// only honoured when the engine was built with a testing clock).
    ///
    /// # Errors
    /// `NotSupported` unless the testing clock is enabled.
    fn adjust_time(&self, offset_secs: i64) -> EngineResult<()>;

    /// Stops background work and releases resources; called once at shutdown.
    fn shutdown(&self);

    /// Reports a vBucket's failover log and seqnos for OBSERVE_SEQNO: how far mutations
    /// have been applied (high seqno) and persisted.
    ///
    /// The default answers `NotSupported`, for engines that cannot report them; an engine
    /// that answers must report as persisted only what is durably on disk (an engine
    /// without persistence reports seqno 0).
    ///
    /// # Errors
    /// `NotMyVbucket` for a vBucket this node does not have or that is not active;
    /// `NotSupported` from the default implementation.
    fn vbucket_seqnos(&self, vbid: Vbid) -> EngineResult<VBucketSeqnos> {
        let _ = vbid;
        Err(EngineStatus::NotSupported)
    }

    /// True when the engine persists its writes, so that [`Engine::when_persisted`] can
    /// complete and the persist durability levels are accepted. The default is `false`
    /// (a memory-only engine, as a Couchbase ephemeral bucket).
    fn persistent(&self) -> bool {
        false
    }

    /// The bucket's minimum durability level: the front end makes every write at least
    /// this durable. The default is `None`.
    fn durability_min_level(&self) -> Option<epkv_types::DurabilityLevel> {
        None
    }

    /// Calls `done` once vBucket `vbid` has persisted `seqno` (at once if it already
    /// has), without blocking a thread while waiting. The front end uses it to acknowledge
    /// writes at the persist durability levels only once they are on disk. `done` may
    /// never be called (a write the disk never takes): the waiter bounds the wait with the
    /// durability timeout.
    ///
    /// The default answers `NotSupported`, for engines that do not persist; such an
    /// engine must refuse the persist durability levels (`DurabilityInvalidLevel`).
    ///
    /// # Errors
    /// `NotMyVbucket` for a vBucket outside the bucket; `NotSupported` for an engine
    /// without persistence.
    fn when_persisted(
        &self,
        vbid: Vbid,
        seqno: Seqno,
        done: PersistedCallback,
    ) -> EngineResult<()> {
        let _ = (vbid, seqno, done);
        Err(EngineStatus::NotSupported)
    }

    /// Calls `done` once the SyncWrite whose mutation (its prepare) got `seqno` in
    /// vBucket `vbid` has completed: `Ok(())` when committed, `SyncWriteAmbiguous` when
    /// aborted. A write whose request carried durability requirements is answered only
    /// then. At once if it has completed already. Nothing blocks.
    ///
    /// The default answers `NotSupported`, for engines without SyncWrites; such an
    /// engine must refuse durability requirements.
    ///
    /// # Errors
    /// `NotMyVbucket` for a vBucket outside the bucket; `NotSupported` for an engine
    /// without SyncWrites.
    fn when_sync_write_completed(
        &self,
        vbid: Vbid,
        seqno: Seqno,
        done: SyncWriteCallback,
    ) -> EngineResult<()> {
        let _ = (vbid, seqno, done);
        Err(EngineStatus::NotSupported)
    }

    /// Calls `done` once what an operation's [`EngineStatus::WouldBlock`] announced is
    /// over, and the caller executes the operation again: the background fetch of `key` in
    /// vBucket `vbid`; or, while `vbid` is pending (a takeover in progress), the vBucket
    /// leaving that state (to any state) or a bounded wait passing, whichever comes
    /// first. An operation on a pending vBucket is parked this way instead of refused, as
    /// KV-Engine parks it; a caller that keeps getting `WouldBlock` must give up at some
    /// point (the front end answers TMPFAIL after a few attempts). At once, with `Ok(())`,
    /// when nothing is in flight any more. Nothing blocks. The default calls
    /// `done(Ok(()))` at once: an engine that never answers `WouldBlock` has nothing in
    /// flight.
    fn when_fetched(&self, vbid: Vbid, key: &[u8], done: FetchedCallback) {
        let _ = (vbid, key);
        done(Ok(()));
    }

    /// Opens a DCP stream of vBucket `vbid` (an active or pending vBucket) as `req` asks:
    /// from its start seqno, after checking the client's history against the failover
    /// log. A pending vBucket streams as an active one does (the node taking it over
    /// catches up while its clients are parked), and a stream open when its vBucket goes
    /// pending goes on; any other change of state ends it.
    ///
    /// The default answers `NotSupported`.
    ///
    /// # Errors
    /// [`crate::DcpStreamError::Rollback`] when the client must roll back first; else
    /// `NotMyVbucket` (not an active or pending vBucket here), `OutOfRange` (start past
    /// the high seqno, or end before start), `NotSupported`.
    fn dcp_stream(
        &self,
        vbid: Vbid,
        req: crate::DcpStreamRequest,
    ) -> Result<Box<dyn crate::DcpStream>, crate::DcpStreamError> {
        let _ = (vbid, req);
        Err(crate::DcpStreamError::Status(EngineStatus::NotSupported))
    }

    /// RANGE_SCAN_CREATE: opens a scan of collection `req.collection` in active vBucket
    /// `vbid` (see [`crate::range_scan`]). The scan's keys are fixed now: keys written
    /// later are not returned, keys deleted later are not returned as documents. With
    /// `resume`, finishes the create that answered [`RangeScanCreated::Pending`] with that
    /// id (the caller waited with [`Self::when_range_scan_ready`]).
    ///
    /// The default answers `NotSupported`.
    ///
    /// # Errors
    /// `NotMyVbucket` (not active here), `UnknownCollection`, `KeyNotFound` (no key in
    /// the range, an empty collection to sample, or an unknown `resume`),
    /// `VbUuidNotEqual`, `TempFail` (the seqno required is not persisted, within the
    /// timeout if any), `NotStored` (`seqno_exists` and the seqno's mutation is gone),
    /// `TooBusy` (the owner has too many scans or too many keys in scans), `Invalid`,
    /// `NotSupported`.
    fn range_scan_create(
        &self,
        vbid: Vbid,
        req: &RangeScanCreate,
        resume: Option<RangeScanId>,
    ) -> EngineResult<RangeScanCreated> {
        let _ = (vbid, req, resume);
        Err(EngineStatus::NotSupported)
    }

    /// RANGE_SCAN_CONTINUE: hands the scan's next keys or documents, in key order, to
    /// `emit` (under the document's lock: `emit` must be quick and must not call back into
    /// the engine) until a limit is reached ([`RangeScanProgress::More`]) or the scan ends
    /// ([`RangeScanProgress::Complete`]; the scan is closed). Documents deleted or expired
    /// since the create are skipped. Nothing is emitted when it answers an error.
    ///
    /// The default answers `NotSupported`.
    ///
    /// # Errors
    /// `KeyNotFound` (no such scan in `vbid`: never opened, completed, cancelled or
    /// expired), `WouldBlock` (values must be read from disk first: wait with
    /// [`Self::when_range_scan_ready`] and continue again), `TooBusy` (another continue
    /// of the scan is running), `RangeScanCancelled` (cancelled while a continue waited),
    /// `NotMyVbucket`, `UnknownCollection` (the scan is closed), `NotSupported`.
    fn range_scan_continue(
        &self,
        vbid: Vbid,
        id: RangeScanId,
        limits: RangeScanLimits,
        emit: &mut dyn FnMut(ScanItem<'_>),
    ) -> EngineResult<RangeScanProgress> {
        let _ = (vbid, id, limits, emit);
        Err(EngineStatus::NotSupported)
    }

    /// RANGE_SCAN_CANCEL: closes a scan.
    ///
    /// # Errors
    /// `KeyNotFound` (no such scan in `vbid`), `NotSupported` (the default).
    fn range_scan_cancel(&self, vbid: Vbid, id: RangeScanId) -> EngineResult<()> {
        let _ = (vbid, id);
        Err(EngineStatus::NotSupported)
    }

    /// Calls `done` once what scan `id` waits for is over (its create's seqno, its keys or
    /// values read from disk), at once when it waits for nothing (or does not exist); the
    /// caller then runs the create (with `resume`) or the continue again. It runs on an
    /// engine thread, so it must be quick and never block. The default calls `done(Ok(()))`.
    fn when_range_scan_ready(&self, vbid: Vbid, id: RangeScanId, done: FetchedCallback) {
        let _ = (vbid, id);
        done(Ok(()));
    }

    /// Closes every scan `owner` opened (its connection closed). The default does nothing.
    fn range_scan_release(&self, owner: u64) {
        let _ = owner;
    }

    /// GET_REPLICA: reads a document from replica vBucket `vbid`.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here; `KeyNotFound`; `WouldBlock`;
    /// `NotSupported` from the default implementation.
    fn get_replica(&self, vbid: Vbid, key: &[u8]) -> EngineResult<Item> {
        let _ = (vbid, key);
        Err(EngineStatus::NotSupported)
    }

    /// Applies one change of a replication stream (a mutation or deletion with the
    /// active's seqno, CAS and metadata, a SyncWrite step, or a snapshot marker, which a
    /// replica needs for the end of a disk snapshot) to replica vBucket `vbid`.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here; `Invalid` for a seqno not above the
    /// replica's; `TempFail` when memory is full (apply it again later); `NotSupported`.
    fn replicate(&self, vbid: Vbid, event: crate::DcpEvent) -> EngineResult<()> {
        let _ = (vbid, event);
        Err(EngineStatus::NotSupported)
    }

    /// Makes replica vBucket `vbid`'s failover log (uuid, seqno; newest first) the
    /// active's.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here; `Invalid`; `NotSupported`.
    fn adopt_failover_log(&self, vbid: Vbid, log: &[(u64, u64)]) -> EngineResult<()> {
        let _ = (vbid, log);
        Err(EngineStatus::NotSupported)
    }

    /// Starts replica vBucket `vbid` over from seqno 0 (a rollback): its documents and
    /// files are dropped. A dead vBucket (moved away by a rebalance) is emptied the same
    /// way.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica or dead here; `TempFail`; `NotSupported`.
    fn reset_replica(&self, vbid: Vbid) -> EngineResult<()> {
        let _ = vbid;
        Err(EngineStatus::NotSupported)
    }

    /// The high prepared seqno replica vBucket `vbid` may acknowledge to its active
    /// (DCP_SEQNO_ACKNOWLEDGED): past every prepare it holds, except before the first
    /// persist-level one not yet on its disk.
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is a replica here; `NotSupported`.
    fn replica_prepared_seqno(&self, vbid: Vbid) -> EngineResult<u64> {
        let _ = vbid;
        Err(EngineStatus::NotSupported)
    }

    /// A replica (named by its DCP connection) acknowledged `seqno` of active vBucket
    /// `vbid`: the SyncWrites that now have a majority commit. A pending vBucket takes
    /// the acknowledgement too (its replicas still stream from it during a takeover).
    ///
    /// # Errors
    /// `NotMyVbucket` unless `vbid` is active or pending here; `NotSupported`.
    fn seqno_acknowledged(&self, vbid: Vbid, replica: &str, seqno: u64) -> EngineResult<()> {
        let _ = (vbid, replica, seqno);
        Err(EngineStatus::NotSupported)
    }

    /// Tells active vBucket `vbid` its replication chain: `replicas` replica slots, `live`
    /// of them held by a node. SyncWrites then need a majority of the chain
    /// (DurabilityImpossible when the live nodes cannot make one).
    ///
    /// # Errors
    /// `NotMyVbucket` for a vBucket outside the bucket; `NotSupported`.
    fn set_replication_chain(&self, vbid: Vbid, replicas: usize, live: usize) -> EngineResult<()> {
        let _ = (vbid, replicas, live);
        Err(EngineStatus::NotSupported)
    }

    /// Sets active vBucket `vbid`'s replication topology: one or two chains (KV-Engine's
    /// first and second chain, the second while the vBucket moves to other nodes), each a
    /// list of slots naming a node (`None`: an empty slot, as a failed-over node leaves).
    /// `me` names this node; every other name is the DCP connection name that node's
    /// replica stream uses here (what the producer passes to
    /// [`Self::seqno_acknowledged`]).
    ///
    /// A SyncWrite commits once EACH chain has a majority (`slots / 2 + 1`) holding it:
    /// this node counts in a chain it is in (and for the persist levels, which need this
    /// node's disk in any case, once there), the others by their acknowledged seqno.
    /// Acknowledgements of names in no chain are ignored; those so far are kept for the
    /// names that stay. SyncWrites in flight are judged again against the new topology
    /// (removing the second chain may commit some). A chain with fewer named slots than
    /// its majority makes new SyncWrites answer DurabilityImpossible.
    ///
    /// The default maps the first chain onto [`Self::set_replication_chain`]: its slots
    /// but the first are the replicas, and the named ones other than `me` are live (a
    /// second chain is not honoured).
    ///
    /// # Errors
    /// `Invalid` for no chain, more than two, an empty chain or a name twice in a chain;
    /// `NotMyVbucket` for a vBucket outside the bucket; `NotSupported`.
    fn set_replication_topology(
        &self,
        vbid: Vbid,
        me: &str,
        chains: &[Vec<Option<String>>],
    ) -> EngineResult<()> {
        let first = match chains {
            [first] | [first, _] if !first.is_empty() => first,
            _ => return Err(EngineStatus::Invalid),
        };
        let named: Vec<&String> = first.iter().flatten().collect();
        if named
            .iter()
            .enumerate()
            .any(|(i, n)| named[..i].contains(n))
        {
            return Err(EngineStatus::Invalid);
        }
        let replicas = first.len() - 1;
        let live = first
            .iter()
            .flatten()
            .filter(|name| name.as_str() != me)
            .count()
            .min(replicas);
        self.set_replication_chain(vbid, replicas, live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// An engine that only records the chains it is told.
    #[derive(Default)]
    struct Chains(Mutex<Vec<(Vbid, usize, usize)>>);

    impl Engine for Chains {
        fn get(&self, _: Vbid, _: &[u8]) -> EngineResult<Item> {
            Err(EngineStatus::NotSupported)
        }
        fn get_and_touch(&self, _: Vbid, _: &[u8], _: u32) -> EngineResult<Item> {
            Err(EngineStatus::NotSupported)
        }
        fn touch(&self, _: Vbid, _: &[u8], _: u32) -> EngineResult<MutationInfo> {
            Err(EngineStatus::NotSupported)
        }
        fn get_locked(&self, _: Vbid, _: &[u8], _: u32) -> EngineResult<Item> {
            Err(EngineStatus::NotSupported)
        }
        fn unlock(&self, _: Vbid, _: &[u8], _: Cas) -> EngineResult<()> {
            Err(EngineStatus::NotSupported)
        }
        fn store(&self, _: StoreRequest<'_>) -> EngineResult<MutationInfo> {
            Err(EngineStatus::NotSupported)
        }
        fn remove(&self, _: RemoveRequest<'_>) -> EngineResult<MutationInfo> {
            Err(EngineStatus::NotSupported)
        }
        fn arithmetic(&self, _: ArithmeticRequest<'_>) -> EngineResult<(u64, MutationInfo)> {
            Err(EngineStatus::NotSupported)
        }
        fn flush(&self) -> EngineResult<()> {
            Err(EngineStatus::NotSupported)
        }
        fn stats(&self, _: &str, _: StatSink<'_>) -> EngineResult<()> {
            Err(EngineStatus::NotSupported)
        }
        fn vbucket_state(&self, _: Vbid) -> Option<VBucketState> {
            None
        }
        fn set_vbucket_state(&self, _: Vbid, _: VBucketState) -> EngineResult<()> {
            Err(EngineStatus::NotSupported)
        }
        fn adjust_time(&self, _: i64) -> EngineResult<()> {
            Err(EngineStatus::NotSupported)
        }
        fn shutdown(&self) {}
        fn set_replication_chain(
            &self,
            vbid: Vbid,
            replicas: usize,
            live: usize,
        ) -> EngineResult<()> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((vbid, replicas, live));
            Ok(())
        }
    }

    fn chain(slots: &[Option<&str>]) -> Vec<Option<String>> {
        slots.iter().map(|s| s.map(str::to_owned)).collect()
    }

    #[test]
    fn the_default_topology_is_the_first_chain_as_counts() {
        let e = Chains::default();
        let v = Vbid(3);
        e.set_replication_topology(v, "a", &[chain(&[Some("a"), Some("c")])])
            .unwrap();
        // The second chain is not honoured; an empty slot is not live.
        e.set_replication_topology(
            v,
            "a",
            &[
                chain(&[Some("a"), None, Some("c")]),
                chain(&[Some("b"), Some("c")]),
            ],
        )
        .unwrap();
        e.set_replication_topology(v, "a", &[chain(&[Some("a")])])
            .unwrap();
        for bad in [
            vec![],
            vec![vec![]],
            vec![chain(&[Some("a")]); 3],
            vec![chain(&[Some("a"), Some("c"), Some("c")])],
        ] {
            assert_eq!(
                e.set_replication_topology(v, "a", &bad),
                Err(EngineStatus::Invalid)
            );
        }
        let seen =
            e.0.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
        assert_eq!(seen, vec![(v, 1, 1), (v, 2, 1), (v, 0, 0)]);
    }
}
