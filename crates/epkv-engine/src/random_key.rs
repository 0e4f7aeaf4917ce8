//! GET_RANDOM_KEY (0xb6): a document of one collection picked at random, as KV-Engine's:
//! from a random active vBucket, a random stripe of its hash table, the first resident,
//! live, unexpired document of the collection found from there (wrapping round both).
//! Evicted documents are not read back for it (KV-Engine also searches resident items
//! only), so an empty answer means no resident document of the collection.

use crate::Bucket;
use crate::document::{expired, item_of, locked};
use crate::lazy_now::LazyNow;
use crate::stats::Counter;
use epkv_engine_api::{EngineResult, EngineStatus, Item};
use epkv_hashtable::{Position, Visit};
use epkv_types::{Cas, VBucketState, Vbid, doc_key};
use rand::Rng;

impl Bucket {
    /// GET_RANDOM_KEY for collection `cid`.
    ///
    /// # Errors
    /// `UnknownCollection`; `KeyNotFound` when no active vBucket holds a resident live
    /// document of the collection.
    pub(crate) fn op_get_random_key(&self, cid: u32) -> EngineResult<Item> {
        self.core.counters.incr(Counter::CmdGet);
        if !self.core.collections.is_live(cid) {
            return Err(EngineStatus::UnknownCollection);
        }
        let vbuckets = &self.core.vbuckets;
        if vbuckets.is_empty() {
            return Err(EngineStatus::KeyNotFound);
        }
        let mut rng = rand::thread_rng();
        let first = rng.gen_range(0..vbuckets.len());
        let now = LazyNow::new(&*self.core.clock);
        for i in 0..vbuckets.len() {
            let index = (first + i) % vbuckets.len();
            let vb = &vbuckets[index];
            let state = vb.state();
            if *state != VBucketState::Active || vb.table.is_empty() {
                continue;
            }
            let vbid = Vbid(u16::try_from(index).unwrap_or(u16::MAX));
            let stripes = vb.table.num_stripes();
            let start = rng.gen_range(0..stripes.max(1));
            let mut found = None;
            let mut pick = |item: &mut epkv_hashtable::VisitedItem<'_>| {
                if let Some(sv) = item.item()
                    && !sv.is_deleted()
                    && sv.is_resident()
                    && doc_key::collection_of(sv.key()) == cid
                    && !expired(sv.meta(), &now)
                {
                    let cas = if locked(sv.meta(), &now) {
                        Cas(u64::MAX)
                    } else {
                        sv.meta().cas
                    };
                    found = Some(item_of(sv, vbid, cas));
                    return Visit::Pause;
                }
                Visit::Continue
            };
            // From the random stripe to the end, then from the start (the stripes after
            // the random one again, when the collection has nothing resident here: a
            // rare second look, cheaper than tracking where the first visit began).
            let paused = vb.table.visit(Position::stripe_start(start), &mut pick);
            if paused.is_none() && start > 0 {
                vb.table.visit(Position::START, &mut pick);
            }
            if let Some(item) = found {
                self.core.counters.incr(Counter::GetHits);
                return Ok(item);
            }
        }
        Err(EngineStatus::KeyNotFound)
    }
}
