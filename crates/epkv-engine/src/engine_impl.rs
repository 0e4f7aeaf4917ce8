//! `impl Engine for Bucket`: the front end's view of the bucket, delegating to the
//! operations in `ops.rs` and `stat_groups.rs`.

use crate::Bucket;
use epkv_engine_api::{
    ArithmeticRequest, Engine, EngineResult, EngineStatus, FailoverEntry, Item, MutationInfo,
    PersistedCallback, RemoveRequest, StatSink, StoreRequest, VBucketSeqnos,
};
use epkv_types::{Cas, Seqno, VBucketState, Vbid};

impl Engine for Bucket {
    fn get(&self, vbid: Vbid, key: &[u8]) -> EngineResult<Item> {
        self.op_get(vbid, key)
    }

    fn prefetch(&self, vbid: Vbid, key: &[u8]) {
        if let Some(vb) = self.core.vbuckets.get(usize::from(vbid.0)) {
            vb.table.prefetch(key);
        }
    }

    fn prefetch_vbucket(&self, vbid: Vbid) {
        // The vBucket's first cache line: its state, and the table's front.
        if let Some(vb) = self.core.vbuckets.get(usize::from(vbid.0)) {
            vb.table.prefetch_table();
        }
    }

    fn get_with(
        &self,
        vbid: Vbid,
        key: &[u8],
        f: &mut dyn FnMut(&epkv_engine_api::ItemView<'_>),
    ) -> EngineResult<()> {
        self.op_get_with(vbid, key, |sv, cas| {
            f(&crate::document::view_of(sv, vbid, cas))
        })
    }

    fn get_and_touch(&self, vbid: Vbid, key: &[u8], expiry_raw: u32) -> EngineResult<Item> {
        self.op_get_and_touch(vbid, key, expiry_raw)
    }

    fn touch(&self, vbid: Vbid, key: &[u8], expiry_raw: u32) -> EngineResult<MutationInfo> {
        self.op_touch(vbid, key, expiry_raw)
    }

    fn get_locked(&self, vbid: Vbid, key: &[u8], lock_timeout_secs: u32) -> EngineResult<Item> {
        self.op_get_locked(vbid, key, lock_timeout_secs)
    }

    fn unlock(&self, vbid: Vbid, key: &[u8], cas: Cas) -> EngineResult<()> {
        self.op_unlock(vbid, key, cas)
    }

    fn get_meta(&self, vbid: Vbid, key: &[u8]) -> EngineResult<epkv_engine_api::DocMeta> {
        self.op_get_meta(vbid, key)
    }

    fn observe(&self, vbid: Vbid, key: &[u8]) -> EngineResult<(epkv_engine_api::KeyState, Cas)> {
        self.op_observe(vbid, key)
    }

    fn subdoc_lookup(
        &self,
        vbid: Vbid,
        key: &[u8],
        specs: &[epkv_engine_api::SubdocSpec<'_>],
        flags: epkv_engine_api::LookupFlags,
    ) -> EngineResult<epkv_engine_api::SubdocLookup> {
        self.op_subdoc_lookup(vbid, key, specs, flags)
    }

    fn get_random_key(&self, cid: u32) -> EngineResult<Item> {
        self.op_get_random_key(cid)
    }

    fn subdoc_mutate(
        &self,
        req: epkv_engine_api::SubdocMutation<'_>,
    ) -> EngineResult<epkv_engine_api::SubdocMutated> {
        self.op_subdoc_mutate(&req)
    }

    fn manifest_uid(&self) -> u64 {
        self.core.collections.uid()
    }

    fn collections_manifest(&self) -> EngineResult<String> {
        Ok(self.core.collections.manifest().to_json().to_string())
    }

    fn collection_id(&self, path: &str) -> EngineResult<(u64, u32)> {
        self.core.collections.collection_id(path)
    }

    fn scope_id(&self, path: &str) -> EngineResult<(u64, u32)> {
        self.core.collections.scope_id(path)
    }

    fn collection_names(&self, cid: u32) -> EngineResult<(String, String)> {
        self.core
            .collections
            .manifest()
            .collection(cid)
            .map(|(s, c)| (s.name.clone(), c.name.clone()))
            .ok_or(EngineStatus::UnknownCollection)
    }

    fn create_scope(&self, name: &str) -> EngineResult<u64> {
        self.core.collections.create_scope(name)
    }

    fn drop_scope(&self, name: &str) -> EngineResult<u64> {
        let uid = self.core.collections.drop_scope(name)?;
        self.start_purge();
        Ok(uid)
    }

    fn create_collection(&self, scope: &str, name: &str, max_ttl: u32) -> EngineResult<u64> {
        self.core
            .collections
            .create_collection(scope, name, max_ttl)
    }

    fn drop_collection(&self, scope: &str, name: &str) -> EngineResult<u64> {
        let uid = self.core.collections.drop_collection(scope, name)?;
        self.start_purge();
        Ok(uid)
    }

    fn set_collections_manifest(&self, manifest: &str) -> EngineResult<u64> {
        let v: serde_json::Value =
            serde_json::from_str(manifest).map_err(|_| EngineStatus::Invalid)?;
        let target =
            crate::collections::Manifest::from_file_json(&v).map_err(|_| EngineStatus::Invalid)?;
        let done = self.core.collections.replace(target)?;
        if done.dropped_any {
            self.start_purge();
        }
        Ok(done.uid)
    }

    fn evict_key(&self, vbid: Vbid, key: &[u8]) -> EngineResult<bool> {
        Bucket::evict_key(self, vbid, key)
    }

    fn store(&self, req: StoreRequest<'_>) -> EngineResult<MutationInfo> {
        self.op_store(&req)
    }

    fn remove(&self, req: RemoveRequest<'_>) -> EngineResult<MutationInfo> {
        self.op_remove(&req)
    }

    fn arithmetic(&self, req: ArithmeticRequest<'_>) -> EngineResult<(u64, MutationInfo)> {
        self.op_arithmetic(&req)
    }

    fn when_fetched(&self, vbid: Vbid, key: &[u8], done: epkv_engine_api::FetchedCallback) {
        self.core.when_unblocked(vbid, key, done);
    }

    fn flush(&self) -> EngineResult<()> {
        self.op_flush()
    }

    fn stats(&self, group: &str, sink: StatSink<'_>) -> EngineResult<()> {
        self.op_stats(group, sink)
    }

    fn vbucket_state(&self, vbid: Vbid) -> Option<VBucketState> {
        self.core
            .vbuckets
            .get(usize::from(vbid.0))
            .map(|vb| *vb.state())
    }

    fn set_vbucket_state(&self, vbid: Vbid, state: VBucketState) -> EngineResult<()> {
        let vb = self
            .core
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        // Warmup restores the stored state; a change now would be overwritten.
        vb.check_warm()?;
        // The SyncWrites in flight are settled before any client operation sees the new
        // state; then the operations parked on a pending vBucket run again.
        vb.set_state(state, |was| {
            self.core.sync_writes_state_changed(vb, was, state)
        });
        if state != VBucketState::Active {
            // KV-Engine cancels a vBucket's scans when it stops being active.
            self.range_scans.close_vbucket(vbid);
        }
        if let Some(p) = &self.core.persistence {
            p.wake(vbid);
        }
        tracing::info!(bucket = %self.core.config.name, %vbid, state = state.as_str(), "vbucket state changed");
        Ok(())
    }

    fn adjust_time(&self, offset_secs: i64) -> EngineResult<()> {
        let clock = self
            .testing_clock
            .as_ref()
            .ok_or(EngineStatus::NotSupported)?;
        clock.set_offset_secs(offset_secs);
        tracing::info!(offset_secs, "engine clock adjusted (testing mode)");
        Ok(())
    }

    fn vbucket_seqnos(&self, vbid: Vbid) -> EngineResult<VBucketSeqnos> {
        let vb = self
            .core
            .vbuckets
            .get(usize::from(vbid.0))
            .ok_or(EngineStatus::NotMyVbucket)?;
        vb.check_warm()?;
        // Lock order: the failover log is read with the state lock held.
        let state = vb.state();
        if *state == VBucketState::Dead {
            return Err(EngineStatus::NotMyVbucket);
        }
        let failover_log = vb
            .failover_log()
            .iter()
            .map(|e| FailoverEntry {
                uuid: e.uuid,
                seqno: Seqno(e.seqno),
            })
            .collect();
        drop(state);
        let (high_seqno, _, _) = vb.ordering_snapshot();
        // A client polling OBSERVE_SEQNO waits for persistence (PersistTo): flush now
        // rather than after the batching delay.
        if let Some(p) = &self.core.persistence
            && vb.persist.persisted() < high_seqno
        {
            p.urgent(vbid);
        }
        Ok(VBucketSeqnos {
            failover_log,
            high_seqno: Seqno(high_seqno),
            // 0 for a memory-only bucket.
            persisted_seqno: Seqno(vb.persist.persisted()),
        })
    }

    fn persistent(&self) -> bool {
        self.core.persistence.is_some()
    }

    fn get_replica(&self, vbid: Vbid, key: &[u8]) -> EngineResult<Item> {
        self.op_get_replica(vbid, key)
    }

    fn replicate(&self, vbid: Vbid, event: epkv_engine_api::DcpEvent) -> EngineResult<()> {
        self.op_replicate(vbid, event)
    }

    fn adopt_failover_log(&self, vbid: Vbid, log: &[(u64, u64)]) -> EngineResult<()> {
        Bucket::adopt_failover_log(self, vbid, log)
    }

    fn reset_replica(&self, vbid: Vbid) -> EngineResult<()> {
        Bucket::reset_replica(self, vbid)
    }

    fn replica_prepared_seqno(&self, vbid: Vbid) -> EngineResult<u64> {
        self.op_replica_prepared_seqno(vbid)
    }

    fn seqno_acknowledged(&self, vbid: Vbid, replica: &str, seqno: u64) -> EngineResult<()> {
        self.core.op_seqno_acknowledged(vbid, replica, seqno)
    }

    fn set_replication_chain(&self, vbid: Vbid, replicas: usize, live: usize) -> EngineResult<()> {
        self.core.op_set_replication_chain(vbid, replicas, live)
    }

    fn set_replication_topology(
        &self,
        vbid: Vbid,
        me: &str,
        chains: &[Vec<Option<String>>],
    ) -> EngineResult<()> {
        self.core.op_set_replication_topology(vbid, me, chains)
    }

    fn dcp_stream(
        &self,
        vbid: Vbid,
        req: epkv_engine_api::DcpStreamRequest,
    ) -> Result<Box<dyn epkv_engine_api::DcpStream>, epkv_engine_api::DcpStreamError> {
        self.core.dcp_stream(vbid, req)
    }

    fn durability_min_level(&self) -> Option<epkv_types::DurabilityLevel> {
        self.core.config.durability_min_level
    }

    fn range_scan_create(
        &self,
        vbid: Vbid,
        req: &epkv_engine_api::RangeScanCreate,
        resume: Option<epkv_engine_api::RangeScanId>,
    ) -> EngineResult<epkv_engine_api::RangeScanCreated> {
        self.op_range_scan_create(vbid, req, resume)
    }

    fn range_scan_continue(
        &self,
        vbid: Vbid,
        id: epkv_engine_api::RangeScanId,
        limits: epkv_engine_api::RangeScanLimits,
        emit: &mut dyn FnMut(epkv_engine_api::ScanItem<'_>),
    ) -> EngineResult<epkv_engine_api::RangeScanProgress> {
        self.op_range_scan_continue(vbid, id, limits, emit)
    }

    fn range_scan_cancel(&self, vbid: Vbid, id: epkv_engine_api::RangeScanId) -> EngineResult<()> {
        self.op_range_scan_cancel(vbid, id)
    }

    fn when_range_scan_ready(
        &self,
        vbid: Vbid,
        id: epkv_engine_api::RangeScanId,
        done: epkv_engine_api::FetchedCallback,
    ) {
        self.op_when_range_scan_ready(vbid, id, done);
    }

    fn range_scan_release(&self, owner: u64) {
        self.range_scans.release(owner);
    }

    fn when_persisted(
        &self,
        vbid: Vbid,
        seqno: Seqno,
        done: PersistedCallback,
    ) -> EngineResult<()> {
        Bucket::when_persisted(self, vbid, seqno.0, move |persisted| done(Seqno(persisted)))
    }

    fn when_sync_write_completed(
        &self,
        vbid: Vbid,
        seqno: Seqno,
        done: epkv_engine_api::SyncWriteCallback,
    ) -> EngineResult<()> {
        Bucket::when_sync_write_completed(self, vbid, seqno.0, done)
    }

    fn shutdown(&self) {
        self.core.release_parked_ops();
        self.pager.stop();
        self.shutdown_persistence();
        tracing::info!(bucket = %self.core.config.name, "bucket shut down");
    }
}
