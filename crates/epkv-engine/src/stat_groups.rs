//! Emission of the STAT groups the engine answers: the default group, `memory`,
//! `vbucket` and `vbucket-details` (optionally for one vBucket: `vbucket-details N`).

use crate::Bucket;
use crate::stats::{Counter, STATS, StatGroup};
use crate::vbucket::VBucket;
use epkv_engine_api::{EngineResult, EngineStatus, StatSink};
use epkv_hashtable::StoredValue;
use epkv_types::VBucketState;

/// Per-state totals over all vBuckets, gathered once per STAT call.
#[derive(Default)]
struct Totals {
    vbs: [usize; 4],
    items: [usize; 4],
    non_resident: [usize; 4],
}

fn state_index(s: VBucketState) -> usize {
    match s {
        VBucketState::Active => 0,
        VBucketState::Replica => 1,
        VBucketState::Pending => 2,
        VBucketState::Dead => 3,
    }
}

impl Bucket {
    fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for vb in self.core.vbuckets.iter() {
            let i = state_index(*vb.state());
            t.vbs[i] += 1;
            let items = vb.item_count();
            t.items[i] += items;
            // Under full eviction a document out of memory is non-resident too.
            t.non_resident[i] += items - vb.table.len() + vb.table.num_non_resident();
        }
        t
    }

    /// Returns the value of one default- or memory-group stat, or `None` for a name the
    /// group does not have.
    fn stat_value(&self, group: StatGroup, name: &str, t: &Totals) -> Option<String> {
        if group == StatGroup::Default
            && let Some(c) = Counter::ALL.iter().find(|c| c.name() == name)
        {
            return Some(self.core.counters.get(*c).to_string());
        }
        let c = &self.core.config;
        let v = match name {
            "ep_bucket_name" => c.name.clone(),
            "ep_bucket_type" => if self.core.persistence.is_some() {
                "persistent"
            } else {
                "ephemeral"
            }
            .to_owned(),
            "ep_range_scans_open" => self.range_scans.len().to_string(),
            "ep_range_scans_key_bytes" => self.range_scans.key_bytes().to_string(),
            "curr_items" | "vb_active_curr_items" => t.items[0].to_string(),
            "curr_items_tot" => t.items.iter().sum::<usize>().to_string(),
            "vb_replica_curr_items" => t.items[1].to_string(),
            "vb_pending_curr_items" => t.items[2].to_string(),
            "vb_active_num" => t.vbs[0].to_string(),
            "vb_replica_num" => t.vbs[1].to_string(),
            "vb_pending_num" => t.vbs[2].to_string(),
            "vb_dead_num" => t.vbs[3].to_string(),
            "ep_max_vbuckets" => c.num_vbuckets.to_string(),
            "ep_max_size" => c.memory_quota_bytes.to_string(),
            "mem_used" | "ep_kv_size" => self.core.memory.used().to_string(),
            "ep_mem_high_wat" => c.high_wat_bytes().to_string(),
            "ep_mem_low_wat" => c.low_wat_bytes().to_string(),
            "ep_mem_high_wat_percent" => c.mem_high_wat_percent.to_string(),
            "ep_mem_low_wat_percent" => c.mem_low_wat_percent.to_string(),
            "ep_item_overhead_bytes" => StoredValue::FIXED_BYTES.to_string(),
            "ep_tmp_oom_errors" => self.core.counters.get(Counter::TmpOomErrors).to_string(),
            "ep_max_item_size" => c.max_item_size_bytes.to_string(),
            "ep_flushall_enabled" => c.flush_enabled.to_string(),
            "ep_exp_pager_stime" => c.expiry_pager_interval.as_secs().to_string(),
            "ep_num_non_resident" => t.non_resident.iter().sum::<usize>().to_string(),
            "vb_active_perc_mem_resident" => {
                let (items, nr) = (t.items[0], t.non_resident[0]);
                ((items - nr.min(items)) * 100)
                    .checked_div(items)
                    .unwrap_or(100)
                    .to_string()
            }
            "ep_item_pager_interval" => c.item_pager_interval.as_secs().to_string(),
            "ep_ephemeral_full_policy" => c.ephemeral_full_policy.as_str().to_owned(),
            "ep_item_eviction_policy" => c.eviction_policy.as_str().to_owned(),
            "ep_bg_num_samples" => self.core.bg_times.wait_summary(|h| h.len()),
            "ep_bg_wait_avg" => self.core.bg_times.wait_summary(|h| h.mean() as u64),
            "ep_bg_wait_p99" => self
                .core
                .bg_times
                .wait_summary(|h| h.value_at_quantile(0.99)),
            "ep_bg_max_wait" => self.core.bg_times.wait_summary(|h| h.max()),
            "ep_bg_load_avg" => self.core.bg_times.load_summary(|h| h.mean() as u64),
            "ep_bg_load_p99" => self
                .core
                .bg_times
                .load_summary(|h| h.value_at_quantile(0.99)),
            "ep_bg_max_load" => self.core.bg_times.load_summary(|h| h.max()),
            _ => return None,
        };
        Some(v)
    }

    fn emit_group(&self, group: StatGroup, sink: StatSink<'_>) {
        let t = self.totals();
        for def in STATS.iter().filter(|d| d.group == group) {
            match self.stat_value(group, def.name, &t) {
                Some(v) => sink(def.name, &v),
                None => debug_assert!(false, "stat {} has no value", def.name),
            }
        }
    }

    fn emit_vbucket_states(&self, sink: StatSink<'_>) {
        for vb in self.core.vbuckets.iter() {
            let state = *vb.state();
            sink(&format!("vb_{}", vb.id.0), state.as_str());
        }
    }

    /// vBucket `only`, or every vBucket; `NotMyVbucket` for an id outside the bucket.
    fn selected_vbuckets(&self, only: Option<u16>) -> EngineResult<&[VBucket]> {
        match only {
            Some(id) => self
                .core
                .vbuckets
                .get(usize::from(id))
                .map(std::slice::from_ref)
                .ok_or(EngineStatus::NotMyVbucket),
            None => Ok(&self.core.vbuckets[..]),
        }
    }

    fn emit_vbucket_details(&self, only: Option<u16>, sink: StatSink<'_>) -> EngineResult<()> {
        let vbs = self.selected_vbuckets(only)?;
        let usage: std::collections::HashMap<u16, epkv_storage::FileUsage> = self
            .core
            .persistence
            .iter()
            .flat_map(|p| p.shards.iter())
            .flat_map(|s| epkv_storage::KvStore::file_usage(&s.store))
            .map(|(v, u)| (v.0, u))
            .collect();
        for vb in vbs {
            let state = *vb.state();
            let (high_seqno, max_cas, max_deleted_rev) = vb.ordering_snapshot();
            let p = format!("vb_{}", vb.id.0);
            sink(&p, state.as_str());
            sink(&format!("{p}:num_items"), &vb.item_count().to_string());
            if self.core.persistence.is_some() {
                let u = usage.get(&vb.id.0).copied().unwrap_or_default();
                sink(&format!("{p}:db_file_size"), &u.file_bytes.to_string());
                sink(&format!("{p}:db_data_size"), &u.live_bytes.to_string());
            }
            if let Some(full) = &vb.full {
                let (bits, sized_for) = full.filter.size();
                sink(&format!("{p}:bloom_filter_size"), &bits.to_string());
                sink(
                    &format!("{p}:bloom_filter_key_count"),
                    &sized_for.to_string(),
                );
            }
            sink(&format!("{p}:mem_used"), &vb.table.mem_used().to_string());
            sink(&format!("{p}:high_seqno"), &high_seqno.to_string());
            sink(&format!("{p}:max_cas"), &max_cas.to_string());
            sink(
                &format!("{p}:max_deleted_revid"),
                &max_deleted_rev.to_string(),
            );
            sink(&format!("{p}:uuid"), &vb.uuid().to_string());
            let log = vb.failover_log();
            sink(&format!("{p}:num_failover_entries"), &log.len().to_string());
        }
        Ok(())
    }

    /// `vbucket-seqno [N]`: per vBucket its seqnos as Couchbase names them.
    fn emit_vbucket_seqno(&self, only: Option<u16>, sink: StatSink<'_>) -> EngineResult<()> {
        let vbs = self.selected_vbuckets(only)?;
        for vb in vbs {
            let (high, _, _) = vb.ordering_snapshot();
            let p = format!("vb_{}", vb.id.0);
            // Not in KV-Engine's group: the rebalancer reads a move's state and seqno
            // in one request.
            sink(&format!("{p}:state"), vb.state_hint().as_str());
            sink(&format!("{p}:high_seqno"), &high.to_string());
            sink(&format!("{p}:abs_high_seqno"), &high.to_string());
            sink(
                &format!("{p}:max_visible_seqno"),
                &vb.max_visible_seqno().to_string(),
            );
            sink(
                &format!("{p}:last_persisted_seqno"),
                &vb.persist.persisted().to_string(),
            );
            sink(&format!("{p}:uuid"), &vb.uuid().to_string());
            sink(&format!("{p}:purge_seqno"), "0");
            let (hps, hcs) = vb.durability.seqnos();
            sink(&format!("{p}:high_prepared_seqno"), &hps.to_string());
            sink(&format!("{p}:high_completed_seqno"), &hcs.to_string());
        }
        Ok(())
    }

    /// `replication`: the sums of the high seqnos of the active and of the replica
    /// vBuckets, and how many there are (a replica's lag behind its active, summed, is
    /// the difference between two nodes' sums; `cargo xtask bench cluster` samples it).
    fn emit_replication(&self, sink: StatSink<'_>) {
        let (mut active, mut replica, mut na, mut nr) = (0u64, 0u64, 0u64, 0u64);
        for vb in &self.core.vbuckets {
            match vb.state_hint() {
                VBucketState::Active => {
                    active += vb.ordering_snapshot().0;
                    na += 1;
                }
                VBucketState::Replica => {
                    replica += vb.ordering_snapshot().0;
                    nr += 1;
                }
                _ => {}
            }
        }
        sink("vb_active_high_seqno_sum", &active.to_string());
        sink("vb_replica_high_seqno_sum", &replica.to_string());
        sink("vb_active_num", &na.to_string());
        sink("vb_replica_num", &nr.to_string());
    }

    /// `kvstore`: each shard's storage counters, prefixed `rw_N:` as in KV-Engine.
    fn emit_kvstore(&self, sink: StatSink<'_>) {
        let Some(p) = &self.core.persistence else {
            return;
        };
        for (i, s) in p.shards.iter().enumerate() {
            let x = epkv_storage::KvStore::stats(&s.store);
            for (name, v) in [
                ("batches", x.batches),
                ("items_flushed", x.items_flushed),
                ("syncs", x.syncs),
                ("bytes_written", x.bytes_written),
                ("journal_bytes", x.journal_bytes),
                ("checkpoints", x.checkpoints),
                ("file_opens", x.file_opens),
                ("compactions", x.compactions),
                ("commit_failures", x.commit_failures),
                ("data_file_bytes", x.data_file_bytes),
                ("live_bytes", x.live_bytes),
                ("bytes_reclaimed", x.bytes_reclaimed),
                ("index_bytes", x.index_bytes),
            ] {
                sink(&format!("rw_{i}:{name}"), &v.to_string());
            }
        }
        sink("open_files", &p.fds.open_files().to_string());
        sink("fd_budget", &p.fds.budget().to_string());
    }

    /// `persistence`: the bucket's flusher and storage totals.
    fn emit_persistence(&self, sink: StatSink<'_>) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(p) = &self.core.persistence else {
            sink("ep_persistence_enabled", "false");
            return;
        };
        let t = p.store_stats();
        let queue: usize = self
            .core
            .vbuckets
            .iter()
            .map(|vb| vb.persist.queued())
            .sum();
        let waiters: usize = self
            .core
            .vbuckets
            .iter()
            .map(|vb| vb.persist.waiter_count())
            .sum();
        for (name, v) in [
            ("ep_persistence_enabled", "true".to_owned()),
            ("ep_persistence_shards", p.shards.len().to_string()),
            (
                "ep_persistence_journal",
                format!("{:?}", p.config.journal).to_lowercase(),
            ),
            ("ep_queue_size", queue.to_string()),
            ("ep_persistence_waiters", waiters.to_string()),
            ("ep_flusher_commits", p.flushes.load(Relaxed).to_string()),
            (
                "ep_item_commit_failed",
                p.flush_failures.load(Relaxed).to_string(),
            ),
            ("ep_total_persisted", t.items_flushed.to_string()),
            ("ep_commit_num", t.batches.to_string()),
            ("ep_fsync_num", t.syncs.to_string()),
            ("ep_io_bytes_written", t.bytes_written.to_string()),
            ("ep_journal_bytes", t.journal_bytes.to_string()),
            ("ep_journal_checkpoints", t.checkpoints.to_string()),
            ("ep_open_files", t.open_files.to_string()),
            ("ep_file_opens", t.file_opens.to_string()),
            ("ep_compactions", t.compactions.to_string()),
            (
                "ep_fragmentation_compactions",
                p.fragmentation_compactions.load(Relaxed).to_string(),
            ),
            (
                "ep_compaction_bytes_reclaimed",
                t.bytes_reclaimed.to_string(),
            ),
            (
                "ep_compaction_cpu_time",
                p.compaction_cpu_us.load(Relaxed).to_string(),
            ),
            (
                "ep_persistence_storage",
                p.shards
                    .first()
                    .map_or("none", |s| s.store.backend().name())
                    .to_owned(),
            ),
            ("ep_storage_index_bytes", t.index_bytes.to_string()),
            ("ep_db_file_size", t.data_file_bytes.to_string()),
            ("ep_db_data_size", t.live_bytes.to_string()),
            (
                "ep_db_fragmentation",
                epkv_storage::FileUsage {
                    file_bytes: t.data_file_bytes,
                    live_bytes: t.live_bytes,
                }
                .fragmentation_percent()
                .round()
                .to_string(),
            ),
            ("ep_disk_full", p.disk_full.load(Relaxed).to_string()),
            (
                "ep_warmup_value_count",
                p.warmup_items.load(Relaxed).to_string(),
            ),
            (
                "ep_warmup_unclean_shutdown",
                p.unclean_restart.load(Relaxed).to_string(),
            ),
        ] {
            sink(name, &v);
        }
    }

    /// `warmup`: progress of loading the stored vBuckets at start.
    fn emit_warmup(&self, sink: StatSink<'_>) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(p) = &self.core.persistence else {
            sink("ep_warmup", "disabled");
            return;
        };
        let w = &p.warmup;
        let done = w.is_done();
        let failed = w.failed.lock().clone();
        for (name, v) in [
            ("ep_warmup", "enabled".to_owned()),
            (
                "ep_warmup_state",
                if done { "done" } else { "loading data" }.to_owned(),
            ),
            (
                "ep_warmup_thread",
                if done { "complete" } else { "running" }.to_owned(),
            ),
            (
                "ep_warmup_vbuckets",
                w.vbuckets_total.load(Relaxed).to_string(),
            ),
            (
                "ep_warmup_vbuckets_loaded",
                w.vbuckets_done.load(Relaxed).to_string(),
            ),
            ("ep_warmup_vbuckets_failed", failed.len().to_string()),
            (
                "ep_warmup_value_count",
                p.warmup_items.load(Relaxed).to_string(),
            ),
            (
                "ep_warmup_key_only_count",
                w.keys_only.load(Relaxed).to_string(),
            ),
            ("ep_warmup_oom", w.oom.load(Relaxed).to_string()),
            (
                "ep_warmup_unclean_shutdown",
                p.unclean_restart.load(Relaxed).to_string(),
            ),
        ] {
            sink(name, &v);
        }
        for (vbid, err) in failed {
            sink(&format!("vb_{}:warmup_error", vbid.0), &err);
        }
    }

    /// STAT: see [`epkv_engine_api::Engine::stats`].
    pub(crate) fn op_stats(&self, group: &str, sink: StatSink<'_>) -> EngineResult<()> {
        match group.trim() {
            "" => {
                self.emit_group(StatGroup::Default, sink);
                Ok(())
            }
            "memory" => {
                self.emit_group(StatGroup::Memory, sink);
                Ok(())
            }
            "vbucket" => {
                self.emit_vbucket_states(sink);
                Ok(())
            }
            "vbucket-details" => self.emit_vbucket_details(None, sink),
            "vbucket-seqno" => self.emit_vbucket_seqno(None, sink),
            "replication" => {
                self.emit_replication(sink);
                Ok(())
            }
            "kvstore" => {
                self.emit_kvstore(sink);
                Ok(())
            }
            "persistence" => {
                self.emit_persistence(sink);
                Ok(())
            }
            "warmup" => {
                self.emit_warmup(sink);
                Ok(())
            }
            "collections" => {
                self.emit_collections(sink);
                Ok(())
            }
            "scopes" => {
                self.emit_scopes(sink);
                Ok(())
            }
            g => {
                if let Some(id) = g.strip_prefix("vbucket-details ") {
                    let id = id.trim().parse().map_err(|_| EngineStatus::Invalid)?;
                    self.emit_vbucket_details(Some(id), sink)
                } else if let Some(id) = g.strip_prefix("vbucket-seqno ") {
                    let id = id.trim().parse().map_err(|_| EngineStatus::Invalid)?;
                    self.emit_vbucket_seqno(Some(id), sink)
                } else {
                    Err(EngineStatus::UnknownStatGroup)
                }
            }
        }
    }
}
