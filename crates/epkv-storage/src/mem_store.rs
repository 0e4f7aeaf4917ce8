//! [`MemStore`]: the memory backend of [`KvStore`], for tests and ephemeral buckets. It
//! has the same semantics as the files backend, without durability.

use crate::error::Result;
use crate::kv_store::KvStore;
use crate::types::{
    CompactionOutcome, Document, KeyMeta, PurgeRule, ScanControl, StoreStats, VbCommit, VbState,
};
use epkv_types::Vbid;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
struct MemVb {
    state: Option<VbState>,
    docs: BTreeMap<Vec<u8>, Document>,
}

/// A [`KvStore`] in memory. Locking: one mutex over all vBuckets.
#[derive(Debug, Default)]
pub struct MemStore {
    vbs: Mutex<HashMap<u16, MemVb>>,
    stats: Mutex<StoreStats>,
}

impl MemStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }
}

impl KvStore for MemStore {
    fn commit(&self, batch: &[VbCommit]) -> Result<()> {
        let mut g = self.vbs.lock();
        let mut items = 0u64;
        for c in batch {
            let vb = g.entry(c.vbid.0).or_default();
            let mut state = c.state.clone();
            // A commit never lowers the purge seqno compaction raised.
            state.purge_seqno = state
                .purge_seqno
                .max(vb.state.as_ref().map_or(0, |s| s.purge_seqno));
            for d in c.docs.iter() {
                state.high_seqno = state.high_seqno.max(d.seqno);
                state.max_cas = state.max_cas.max(d.cas);
                match vb.docs.get(&d.key) {
                    Some(old) if old.seqno > d.seqno => {}
                    _ => {
                        vb.docs.insert(d.key.clone(), d.clone());
                    }
                }
                items += 1;
            }
            state.persisted_seqno = state.high_seqno;
            vb.state = Some(state);
        }
        let mut s = self.stats.lock();
        s.batches += 1;
        s.items_flushed += items;
        Ok(())
    }

    fn get(&self, vbid: Vbid, key: &[u8]) -> Result<Option<Document>> {
        Ok(self
            .vbs
            .lock()
            .get(&vbid.0)
            .and_then(|vb| vb.docs.get(key).cloned()))
    }

    fn scan_by_seqno(
        &self,
        vbid: Vbid,
        start: u64,
        end: u64,
        visit: &mut dyn FnMut(Document) -> ScanControl,
    ) -> Result<u64> {
        let mut docs: Vec<Document> = self.vbs.lock().get(&vbid.0).map_or_else(Vec::new, |vb| {
            vb.docs
                .values()
                .filter(|d| d.seqno >= start && d.seqno <= end)
                .cloned()
                .collect()
        });
        docs.sort_by_key(|d| d.seqno);
        Ok(crate::types::deliver(docs, visit))
    }

    fn scan_keys(&self, vbid: Vbid, visit: &mut dyn FnMut(KeyMeta) -> ScanControl) -> Result<u64> {
        let metas: Vec<KeyMeta> = self.vbs.lock().get(&vbid.0).map_or_else(Vec::new, |vb| {
            vb.docs
                .values()
                .map(|d| KeyMeta {
                    key: d.key.clone(),
                    seqno: d.seqno,
                    deleted: d.deleted,
                })
                .collect()
        });
        Ok(crate::types::deliver(metas, visit))
    }

    fn vbucket_state(&self, vbid: Vbid) -> Result<Option<VbState>> {
        Ok(self.vbs.lock().get(&vbid.0).and_then(|v| v.state.clone()))
    }

    fn vbuckets(&self) -> Vec<Vbid> {
        let mut v: Vec<Vbid> = self
            .vbs
            .lock()
            .iter()
            .filter(|(_, vb)| vb.state.is_some())
            .map(|(id, _)| Vbid(*id))
            .collect();
        v.sort_unstable();
        v
    }

    fn delete_vbucket(&self, vbid: Vbid) -> Result<()> {
        self.vbs.lock().remove(&vbid.0);
        Ok(())
    }

    fn compact(&self, vbid: Vbid, rule: &PurgeRule) -> Result<CompactionOutcome> {
        let mut g = self.vbs.lock();
        let Some(vb) = g.get_mut(&vbid.0) else {
            return Ok(CompactionOutcome::default());
        };
        let Some(state) = vb.state.as_mut() else {
            return Ok(CompactionOutcome::default());
        };
        let mut out = CompactionOutcome::default();
        let mut purge = state.purge_seqno;
        let st: &VbState = state;
        vb.docs
            .retain(|_, d| out.judge(rule, st, &mut purge, (&d.key, d.seqno, d.deleted, d.expiry)));
        state.purge_seqno = purge;
        self.stats.lock().compactions += 1;
        Ok(out)
    }

    fn checkpoint(&self) -> Result<()> {
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        *self.stats.lock()
    }
}
