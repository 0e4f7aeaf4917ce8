//! Background fetches: reading evicted values back from disk on the Reader group, as
//! KV-Engine's `BgFetcher` / `MultiBGFetcherTask` do.
//!
//! An operation that finds the value it needs evicted queues the key on its shard's
//! [`BgFetchQueue`] (coalesced: one fetch per key however many operations wait for it) and
//! answers [`EngineStatus::WouldBlock`]; the caller registers a callback with
//! [`epkv_engine_api::Engine::when_fetched`] and runs the operation again once called. The
//! shard's fetcher task takes every queued key, reads them vBucket by vBucket (no lock of
//! the engine held during the read), then restores each value under the key's stripe lock
//! **only if the item is still the non-resident version that was read**: a write that
//! raced the fetch wins, and the waiting operation, run again, sees the write.
//!
//! Level: a service over [`crate::bucket_core::BucketCore`]; it never names the bucket.

use crate::bg_fetch_queue::{BgFetchQueue, record};
use crate::bucket_core::BucketCore;
use crate::stats::Counter;
use crate::vbucket::VBucket;
use epkv_engine_api::{EngineResult, EngineStatus, FetchedCallback};
use epkv_hashtable::{ItemMeta, StoredValue};
use epkv_types::Vbid;
use std::time::Duration;

/// Why a fetch did not restore its value.
enum FetchError {
    /// The value did not fit under the quota (the item pager was woken).
    NoRoom,
    /// Any other outcome, told to the waiters as it is.
    Failed(EngineStatus),
}
use FetchError::{Failed, NoRoom};

/// Pause before a fetch whose value did not fit is retried.
const NO_ROOM_RETRY_AFTER: Duration = Duration::from_millis(2);

impl BucketCore {
    /// Queues a background fetch of the entry's key in `vb` and answers WouldBlock: the
    /// caller waits with [`epkv_engine_api::Engine::when_fetched`] and runs the operation
    /// again. Internal for a bucket that cannot fetch (memory-only: nothing is ever
    /// evicted there).
    /// `value`: whether the operation needs the value or only the metadata.
    pub(crate) fn queue_bg_fetch(&self, vb: &VBucket, key: &[u8], value: bool) -> EngineStatus {
        let Some(p) = &self.persistence else {
            tracing::error!(vbid = %vb.id, "a memory-only bucket has a non-resident item");
            return EngineStatus::Internal;
        };
        let shard = p.shard_of(vb.id);
        let Some(q) = p.fetch_queues.get(shard) else {
            return EngineStatus::Internal;
        };
        if q.queue(vb.id, key, self.clock.now(), value) {
            p.wake_fetcher(shard);
        }
        EngineStatus::WouldBlock
    }

    /// Registers `done` for the end of the background fetch of `key` in `vbid` (at once
    /// when none is in flight).
    pub(crate) fn bg_fetch_when_done(&self, vbid: Vbid, key: &[u8], done: FetchedCallback) {
        let Some(p) = &self.persistence else {
            done(Ok(()));
            return;
        };
        match p.fetch_queues.get(p.shard_of(vbid)) {
            Some(q) => q.when_fetched(vbid, key, done),
            None => done(Ok(())),
        }
    }

    /// See [`crate::Bucket::wait_fetched`].
    pub(crate) fn wait_fetched(
        &self,
        vbid: Vbid,
        key: &[u8],
        timeout: Duration,
    ) -> EngineResult<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.bg_fetch_when_done(
            vbid,
            key,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        );
        rx.recv_timeout(timeout)
            .unwrap_or(Err(EngineStatus::TempFail))
    }

    /// See [`crate::Bucket::run_bg_fetches`].
    pub(crate) fn run_bg_fetches(&self, shard: usize) -> (usize, usize) {
        let Some(p) = &self.persistence else {
            return (0, 0);
        };
        let Some(q) = p.fetch_queues.get(shard) else {
            return (0, 0);
        };
        let batch = q.take();
        let n = batch.len();
        let mut retried = 0;
        for (vbid, key, queued_at, value) in batch {
            let start = self.clock.now();
            let vb = self.vbuckets.get(usize::from(vbid.0));
            let outcome = match vb {
                Some(vb) => self.fetch_and_restore(vb, &key, value),
                None => Err(Failed(EngineStatus::NotMyVbucket)),
            };
            let end = self.clock.now();
            record(
                &self.bg_times.wait,
                start.saturating_duration_since(queued_at),
            );
            record(&self.bg_times.load, end.saturating_duration_since(start));
            match outcome {
                // Memory is full until the pager (woken by the refusal) ejects something:
                // try again shortly rather than fail the reader.
                Err(NoRoom) if q.retry_later(vbid, &key) => retried += 1,
                Ok(()) => q.complete(vbid, key, Ok(())),
                Err(err) => {
                    // A placeholder left behind would only make the next operation queue
                    // the same fetch again; remove it so that memory holds nothing stale.
                    if let Some(vb) = vb {
                        vb.table.with_entry(&key, |e| {
                            if e.committed().is_some_and(StoredValue::is_placeholder) {
                                e.remove();
                            }
                        });
                    }
                    let status = match err {
                        NoRoom => EngineStatus::TempFail,
                        Failed(status) => status,
                    };
                    q.complete(vbid, key, Err(status));
                }
            }
        }
        (n, retried)
    }

    /// One run of a shard's fetcher task.
    pub(crate) fn bg_fetcher_run(&self, shard: usize) -> epkv_executor::Next {
        let (_, retried) = self.run_bg_fetches(shard);
        let idle = self
            .persistence
            .as_ref()
            .and_then(|p| p.fetch_queues.get(shard))
            .is_none_or(BgFetchQueue::is_idle);
        if idle {
            epkv_executor::Next::Sleep
        } else if retried > 0 {
            // Values that did not fit are queued again: give the woken pager time. (Keys
            // queued meanwhile wait as long, at most 2 ms.)
            epkv_executor::Next::After(NO_ROOM_RETRY_AFTER)
        } else {
            epkv_executor::Next::After(Duration::ZERO)
        }
    }

    /// Reads `key`'s newest version from disk (no engine lock held), then, under the key's
    /// stripe lock, puts its value back if the item in memory is still that version and
    /// still non-resident. Anything else means the item changed while the read ran; the
    /// operation waiting runs again and sees the change.
    fn fetch_and_restore(&self, vb: &VBucket, key: &[u8], value: bool) -> Result<(), FetchError> {
        let Some(shard) = self
            .persistence
            .as_ref()
            .and_then(|p| p.shards.get(p.shard_of(vb.id)))
        else {
            return Err(Failed(EngineStatus::Internal));
        };
        // Full eviction: the placeholder the read is for. Restoring over another one (the
        // key was written, persisted and evicted again while the read ran, and a new
        // lookup began) would put back what the read found before that write.
        let placeholder = vb.table.with_entry(key, |e| {
            e.committed()
                .filter(|sv| sv.is_placeholder())
                .map(|sv| sv.meta().cas)
        });
        let doc = match epkv_storage::KvStore::get(&shard.store, vb.id, key) {
            Ok(d) => d,
            Err(err) if err.is_temporary() => return Err(Failed(EngineStatus::TempFail)),
            Err(err) => {
                tracing::error!(vbid = %vb.id, error = %err, "background fetch: cannot read a non-resident value from disk");
                return Err(Failed(EngineStatus::Internal));
            }
        };
        vb.table.with_entry(key, |e| {
            let meta = match e.committed() {
                Some(sv) if sv.is_placeholder() => {
                    return if placeholder == Some(sv.meta().cas) {
                        self.restore_looked_up(vb, e, doc, value)
                    } else {
                        Ok(())
                    };
                }
                Some(sv) if !sv.is_deleted() && !sv.is_resident() => *sv.meta(),
                // Resident again (a write raced the fetch) or gone: nothing to restore.
                _ => return Ok(()),
            };
            match doc {
                Some(d) if !d.deleted && d.seqno == meta.by_seqno.0 => {
                    let sv = StoredValue::new(key, &d.value, meta).map_err(|err| {
                        tracing::error!(vbid = %vb.id, error = %err, "background fetch: value refused");
                        Failed(EngineStatus::Internal)
                    })?;
                    match self.insert_or_tempfail(e, sv) {
                        Ok(()) => {}
                        Err(EngineStatus::TempFail) => return Err(NoRoom),
                        Err(s) => return Err(Failed(s)),
                    }
                    e.mark_clean(meta.by_seqno);
                    e.raise_mfu(epkv_hashtable::mfu::INITIAL);
                    self.counters.incr(Counter::BgFetched);
                    Ok(())
                }
                // Read before a newer version was written, flushed and evicted: the
                // operation runs again and fetches that one.
                Some(d) if d.seqno < meta.by_seqno.0 => Ok(()),
                other => {
                    tracing::error!(vbid = %vb.id, seqno = meta.by_seqno.0, on_disk = ?other.map(|d| (d.seqno, d.deleted)), "background fetch: a non-resident document's version is not on disk");
                    Err(Failed(EngineStatus::Internal))
                }
            }
        })
    }
}

impl BucketCore {
    /// Full eviction: replaces a placeholder with what the disk has for its key: the
    /// document (with its value if `value`, else metadata only), or a clean tombstone
    /// that reads as absent when the disk has no live version.
    fn restore_looked_up(
        &self,
        vb: &VBucket,
        e: &mut epkv_hashtable::Entry<'_>,
        doc: Option<epkv_storage::Document>,
        value: bool,
    ) -> Result<(), FetchError> {
        let key = e.key();
        let meta_of = |d: &epkv_storage::Document| ItemMeta {
            cas: epkv_types::Cas(d.cas),
            rev_seqno: d.rev_seqno,
            by_seqno: epkv_types::Seqno(d.seqno),
            flags: d.flags,
            expiry: d.expiry,
            datatype: crate::vbucket::client_datatype(d.datatype),
            ..ItemMeta::default()
        };
        let (sv, seqno, live) = match &doc {
            Some(d) if !d.deleted => (StoredValue::new(key, &d.value, meta_of(d)), d.seqno, true),
            other => {
                self.counters.incr(Counter::BloomFalsePositives);
                let meta = other.as_ref().map_or_else(ItemMeta::default, |d| ItemMeta {
                    expiry: 0,
                    flags: 0,
                    ..meta_of(d)
                });
                // A tombstone keeps its value: the system extended attributes.
                let value = other.as_ref().map_or(&[][..], |d| &d.value[..]);
                (
                    StoredValue::new_tombstone(key, value, meta),
                    meta.by_seqno.0,
                    false,
                )
            }
        };
        let sv = sv.map_err(|err| {
            tracing::error!(vbid = %vb.id, error = %err, "background fetch: document refused");
            Failed(EngineStatus::Internal)
        })?;
        match self.insert_or_tempfail(e, sv) {
            Ok(()) => {}
            Err(EngineStatus::TempFail) => return Err(NoRoom),
            Err(s) => return Err(Failed(s)),
        }
        e.mark_clean(epkv_types::Seqno(seqno));
        if !live {
            return Ok(());
        }
        if let Some(full) = &vb.full {
            full.sub_evicted(1);
        }
        e.raise_mfu(epkv_hashtable::mfu::INITIAL);
        if value {
            self.counters.incr(Counter::BgFetched);
        } else {
            e.evict_value();
            self.counters.incr(Counter::BgMetaFetched);
        }
        Ok(())
    }
}
