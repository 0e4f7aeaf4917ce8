//! Compaction: the hourly pass over every file (purging tombstones and expired
//! documents) and the fragmentation compactor (files backend: the most fragmented
//! vBucket files; log: each shard's oldest files), paced at `compaction_bytes_per_sec`
//! or, under a write load, at the rate the flushers persist.

use crate::vbucket::{VBucket, WarmupPhase};
use epkv_storage::KvStore;
use epkv_types::Vbid;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

use super::{Persistence, Shard};

/// Under a write load, the fragmentation compactor may write up to this many times the
/// bytes the flushers commit per second (when that is more than
/// [`PersistenceConfig::compaction_bytes_per_sec`]): a compaction that writes at rate `c`
/// while overwrites leave garbage at rate `w` settles with files at `1 + w / c` times their
/// live bytes, so a fixed cap lets full-speed overwrites outrun it. `cargo xtask bench
/// space` (1M keys overwritten at ~200k SETs/s for 60 s), peak / live (data files only),
/// ops/s vs compaction off: fixed 64 MiB/s cap 3.18x (2.86x), 0.93x; factor 1 2.44x
/// (2.14x), 0.87x; factor 2 2.11x (1.82x), 0.75x (below the 0.8x goal).
const COMPACTION_INGEST_FACTOR: u64 = 1;

/// Threads per shard the fragmentation compactor runs at once. Compacting a small file
/// costs two or three fdatasyncs, and the disk completes concurrent ones together: with
/// one per shard, full-speed overwrites of 1M keys peaked at 3.33x the live bytes (data
/// files 3.02x), with two 3.18x (2.86x), with four 3.32x (3.02x): the rate cap, not the
/// syncs, bounds it past two (see [`COMPACTION_INGEST_FACTOR`]).
const COMPACTORS_PER_SHARD: usize = 2;

impl Persistence {
    /// Compacts every stored vBucket: tombstones that were persisted before the previous
    /// compaction and documents expired at `now_secs` are dropped from disk. Returns the
    /// summed outcome.
    pub(crate) fn compact_all(
        &self,
        vbuckets: &[VBucket],
        now_secs: u32,
        clock: &Arc<dyn epkv_executor::Clock>,
        dropped: &[u32],
    ) -> Result<epkv_storage::CompactionOutcome, epkv_storage::Error> {
        let mut total = epkv_storage::CompactionOutcome::default();
        for sh in &self.shards {
            for vbid in sh.store.vbuckets() {
                if self.stopping.load(Relaxed) {
                    return Err(epkv_storage::Error::Cancelled);
                }
                let Some(vb) = vbuckets.get(usize::from(vbid.0)) else {
                    continue;
                };
                if vb.warmup_phase() != WarmupPhase::Ready {
                    continue;
                }
                let mark = self.purge_marks.lock().get(&vbid.0).copied().unwrap_or(0);
                let persisted = vb.persist.persisted();
                // Under full eviction expired documents on disk only are expired when
                // read (with a tombstone and a seqno, so the item count stays exact),
                // never silently dropped here.
                let out = sh.store.compact_paced(
                    vbid,
                    &epkv_storage::PurgeRule {
                        purge_before_seqno: mark,
                        now_secs: vb.full.is_none().then_some(now_secs),
                        dropped_collections: dropped.to_vec(),
                        completed_prepares: true,
                        ..epkv_storage::PurgeRule::default()
                    },
                    &mut self.pacer(clock, 1),
                )?;
                self.purge_marks.lock().insert(vbid.0, persisted);
                self.purged_upto.lock().insert(vbid.0, mark);
                total.kept += out.kept;
                total.tombstones_purged += out.tombstones_purged;
                total.collection_docs_dropped += out.collection_docs_dropped;
                total.prepares_purged += out.prepares_purged;
                total.expired += out.expired;
                total.bytes_before += out.bytes_before;
                total.bytes_after += out.bytes_after;
                total.caught_up += out.caught_up;
            }
        }
        Ok(total)
    }

    /// A pacing callback for [`FileStore::compact_paced`] that keeps a compaction's writes
    /// under [`PersistenceConfig::compaction_bytes_per_sec`]: after each chunk it sleeps
    /// until the bytes written so far are no longer ahead of the rate.
    /// `share` compactions run at once, each at 1/`share` of the rate.
    pub(crate) fn pacer(
        &self,
        clock: &Arc<dyn epkv_executor::Clock>,
        share: u64,
    ) -> impl FnMut(u64) + use<> {
        let rate = self.compaction_rate(clock, share);
        let clock = Arc::clone(clock);
        let start = clock.now();
        let mut written = 0u64;
        move |n| {
            if rate == 0 {
                return;
            }
            written += n;
            #[expect(clippy::cast_precision_loss, reason = "a duration from a byte count")]
            let due = Duration::from_secs_f64(written as f64 / rate as f64);
            let elapsed = clock.now().saturating_duration_since(start);
            if let Some(ahead) = due.checked_sub(elapsed) {
                std::thread::sleep(ahead.min(Duration::from_secs(1)));
            }
        }
    }

    /// The files past the fragmentation threshold and the minimum size, most fragmented
    /// first, as (shard, vbid, usage). Empty when the fragmentation compactor is off.
    pub(crate) fn fragmented_files(
        &self,
        vbuckets: &[VBucket],
    ) -> Vec<(usize, Vbid, epkv_storage::FileUsage)> {
        let threshold = f64::from(self.config.compaction_fragmentation_percent);
        if threshold <= 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, sh) in self.shards.iter().enumerate() {
            for (vbid, u) in sh.store.file_usage() {
                if u.file_bytes >= self.config.compaction_min_file_bytes
                    && u.fragmentation_percent() >= threshold
                    && vbuckets
                        .get(usize::from(vbid.0))
                        .is_some_and(|vb| vb.warmup_phase() == WarmupPhase::Ready)
                {
                    out.push((i, vbid, u));
                }
            }
        }
        out.sort_by(|a, b| {
            b.2.fragmentation_percent()
                .total_cmp(&a.2.fragmentation_percent())
        });
        out
    }

    /// Bytes per second each of `share` compaction threads may write (0: unlimited): its
    /// share of [`PersistenceConfig::compaction_bytes_per_sec`] or, when more, of
    /// [`COMPACTION_INGEST_FACTOR`] times the rate the flushers commit bytes at.
    fn compaction_rate(&self, clock: &Arc<dyn epkv_executor::Clock>, share: u64) -> u64 {
        match self.config.compaction_bytes_per_sec {
            0 => 0,
            r => (r.max(
                self.ingest_rate(clock)
                    .saturating_mul(COMPACTION_INGEST_FACTOR),
            ) / share.max(1))
            .max(1),
        }
    }

    /// Bytes per second the flushers committed, measured over at least a second (0 until
    /// then).
    fn ingest_rate(&self, clock: &Arc<dyn epkv_executor::Clock>) -> u64 {
        let now = clock.now();
        let total = self.flushed_bytes.load(Relaxed);
        let mut g = self.ingest.lock();
        match *g {
            None => {
                *g = Some((now, total, 0));
                0
            }
            Some((at, before, rate)) => {
                let elapsed = now.saturating_duration_since(at);
                if elapsed < Duration::from_secs(1) {
                    return rate;
                }
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss,
                    reason = "a rate from a byte count"
                )]
                let rate = (total.saturating_sub(before) as f64 / elapsed.as_secs_f64()) as u64;
                *g = Some((now, total, rate));
                rate
            }
        }
    }

    /// Compacts the files [`Persistence::fragmented_files`] lists, [`COMPACTORS_PER_SHARD`]
    /// threads per shard with candidates (compactions overlap their syncs, which bound the
    /// rate at which small files can be compacted; most fragmented first), each thread
    /// writing at most its share of
    /// [`PersistenceConfig::compaction_bytes_per_sec`] and compacting about its share of
    /// `budget_bytes` of files. Returns how many files were compacted and whether
    /// candidates remain.
    pub(crate) fn compact_fragmented_files(
        &self,
        vbuckets: &[VBucket],
        now_secs: u32,
        clock: &Arc<dyn epkv_executor::Clock>,
        budget_bytes: u64,
        dropped: &[u32],
    ) -> Result<(usize, bool), epkv_storage::Error> {
        if self.shards.iter().any(|s| s.store.log_usage().is_some()) {
            return self.clean_logs(clock, budget_bytes);
        }
        let mut per_shard: Vec<Vec<(Vbid, epkv_storage::FileUsage)>> =
            vec![Vec::new(); self.shards.len()];
        for (shard, vbid, u) in self.fragmented_files(vbuckets) {
            if let Some(list) = per_shard.get_mut(shard) {
                list.push((vbid, u));
            }
        }
        // Each shard's candidates (most fragmented first) dealt to its threads in turn.
        let lists: Vec<(usize, Vec<(Vbid, epkv_storage::FileUsage)>)> = per_shard
            .into_iter()
            .enumerate()
            .flat_map(|(shard, list)| {
                let mut parts = vec![Vec::new(); COMPACTORS_PER_SHARD];
                for (i, c) in list.into_iter().enumerate() {
                    parts[i % COMPACTORS_PER_SHARD].push(c);
                }
                parts.into_iter().map(move |p| (shard, p))
            })
            .filter(|(_, p)| !p.is_empty())
            .collect();
        let busy = lists.len();
        if busy == 0 {
            return Ok((0, false));
        }
        let share = busy as u64;
        let budget = budget_bytes / share;
        let done = std::sync::atomic::AtomicUsize::new(0);
        let more = AtomicBool::new(false);
        let failed: Mutex<Option<epkv_storage::Error>> = Mutex::new(None);
        let work = |shard: usize, list: &[(Vbid, epkv_storage::FileUsage)]| {
            let mut spent = 0u64;
            for (vbid, usage) in list {
                if spent >= budget || failed.lock().is_some() {
                    more.store(true, Relaxed);
                    return;
                }
                let Some(vb) = vbuckets.get(usize::from(vbid.0)) else {
                    continue;
                };
                match self.compact_fragmented(shard, vb, now_secs, clock, share, dropped) {
                    Ok(out) => {
                        tracing::debug!(
                            vbid = vbid.0,
                            file_bytes = usage.file_bytes,
                            live_bytes = usage.live_bytes,
                            bytes_after = out.bytes_after,
                            "fragmentation compaction"
                        );
                        done.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        failed.lock().get_or_insert(e);
                        return;
                    }
                }
                spent += usage.file_bytes;
            }
        };
        std::thread::scope(|sc| {
            for (shard, list) in &lists {
                let (shard, work) = (*shard, &work);
                let spawned = std::thread::Builder::new()
                    .name(format!("epkv-compact-{shard}"))
                    .spawn_scoped(sc, move || {
                        let cpu = ThreadCpu::start();
                        work(shard, list);
                        cpu.add_to(&self.compaction_cpu_us);
                    });
                if spawned.is_err() {
                    // Left for the next run.
                    more.store(true, Relaxed);
                }
            }
        });
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        Ok((done.into_inner(), more.into_inner()))
    }

    /// The garbage share past which a shard's log is cleaned now: the setting, or at
    /// least [`LOG_BUSY_FRAGMENTATION_PERCENT`] while the flushers commit more bytes per
    /// second than the compaction rate. The oldest file then holds less live data, so
    /// each byte reclaimed costs fewer copies, index updates and reads (cleaning took 28%
    /// of the server's CPU under a full-speed overwrite load at 30%; `cargo xtask bench
    /// space`); once the load eases, cleaning goes on down to the setting.
    fn log_clean_threshold(&self, clock: &Arc<dyn epkv_executor::Clock>) -> u8 {
        let base = self.config.compaction_fragmentation_percent;
        let busy = self.ingest_rate(clock) > self.config.compaction_bytes_per_sec;
        if busy && base > 0 {
            base.max(LOG_BUSY_FRAGMENTATION_PERCENT)
        } else {
            base
        }
    }

    /// The log backend's share of the fragmentation compactor: each shard whose log files
    /// hold more than [`PersistenceConfig::compaction_fragmentation_percent`] garbage (and
    /// at least [`PersistenceConfig::compaction_min_file_bytes`] in all) cleans its oldest
    /// files ([`epkv_storage::LogStore::clean`]) on a thread of its own, at its share of
    /// the compaction rate, until about its share of `budget_bytes` is cleaned. Returns
    /// the files cleaned and whether a shard is still past the threshold.
    fn clean_logs(
        &self,
        clock: &Arc<dyn epkv_executor::Clock>,
        budget_bytes: u64,
    ) -> Result<(usize, bool), epkv_storage::Error> {
        let threshold = self.log_clean_threshold(clock);
        let min = self.config.compaction_min_file_bytes;
        let past = |sh: &Shard| {
            sh.store.log_usage().is_some_and(|(bytes, live)| {
                bytes >= min && bytes.saturating_sub(live) * 100 > bytes * u64::from(threshold)
            })
        };
        if threshold == 0 {
            return Ok((0, false));
        }
        let due: Vec<&Shard> = self.shards.iter().filter(|sh| past(sh)).collect();
        if due.is_empty() {
            return Ok((0, false));
        }
        let share = due.len() as u64;
        let files_each = usize::try_from(
            (budget_bytes / share / epkv_storage::LogStoreConfig::DEFAULT_FILE_BYTES).max(1),
        )
        .unwrap_or(usize::MAX);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let failed: Mutex<Option<epkv_storage::Error>> = Mutex::new(None);
        std::thread::scope(|sc| {
            for (i, sh) in due.iter().enumerate() {
                let (done, failed) = (&done, &failed);
                let mut pace = self.pacer(clock, share);
                let _ = std::thread::Builder::new()
                    .name(format!("epkv-clean-{i}"))
                    .spawn_scoped(sc, move || {
                        let cpu = ThreadCpu::start();
                        let r = sh.store.clean(threshold, min, files_each, &mut pace);
                        cpu.add_to(&self.compaction_cpu_us);
                        match r {
                            Ok(out) => {
                                done.fetch_add(usize::try_from(out.files).unwrap_or(0), Relaxed);
                            }
                            Err(e) => {
                                failed.lock().get_or_insert(e);
                            }
                        }
                    });
            }
        });
        if let Some(e) = failed.into_inner() {
            return Err(e);
        }
        let more = self.shards.iter().any(past);
        let n = done.into_inner();
        self.fragmentation_compactions.fetch_add(n as u64, Relaxed);
        Ok((n, more))
    }

    /// Compacts one vBucket's file for fragmentation, purging what the interval
    /// compactor's last run purged (tombstones up to the same seqno, documents expired at
    /// `now_secs`); the purge marks are left to the interval compactor.
    pub(crate) fn compact_fragmented(
        &self,
        shard: usize,
        vb: &VBucket,
        now_secs: u32,
        clock: &Arc<dyn epkv_executor::Clock>,
        share: u64,
        dropped: &[u32],
    ) -> Result<epkv_storage::CompactionOutcome, epkv_storage::Error> {
        let Some(sh) = self.shards.get(shard) else {
            return Ok(epkv_storage::CompactionOutcome::default());
        };
        let upto = self.purged_upto.lock().get(&vb.id.0).copied().unwrap_or(0);
        let out = sh.store.compact_paced(
            vb.id,
            &epkv_storage::PurgeRule {
                purge_before_seqno: upto,
                now_secs: vb.full.is_none().then_some(now_secs),
                dropped_collections: dropped.to_vec(),
                completed_prepares: true,
                ..epkv_storage::PurgeRule::default()
            },
            &mut self.pacer(clock, share),
        )?;
        self.fragmentation_compactions.fetch_add(1, Relaxed);
        Ok(out)
    }
}

/// The garbage share at least past which a shard's log is cleaned while the flushers
/// commit more bytes per second than `compaction_bytes_per_sec` (see
/// `Persistence::clean_logs`): a log at the limit is 1/(1-0.45) = 1.8 times its live
/// bytes, under the 2x the space goal allows after an idle spell.
const LOG_BUSY_FRAGMENTATION_PERCENT: u8 = 45;

/// The calling thread's CPU time from a start point, for `ep_compaction_cpu_time`.
/// Linux reports it in `/proc/thread-self/schedstat` (nanoseconds on the CPU, the first
/// field); elsewhere it reads 0.
struct ThreadCpu(Option<u64>);

impl ThreadCpu {
    fn now_ns() -> Option<u64> {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn start() -> Self {
        Self(Self::now_ns())
    }

    /// Adds the CPU time since [`Self::start`], in µs, to `total`.
    fn add_to(&self, total: &AtomicU64) {
        if let (Some(a), Some(b)) = (self.0, Self::now_ns()) {
            total.fetch_add(b.saturating_sub(a) / 1000, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persistence_config::PersistenceConfig;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn the_log_is_cleaned_at_a_higher_garbage_share_only_under_load() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = PersistenceConfig::new(dir.path());
        config.compaction_bytes_per_sec = 4 << 20;
        let p = Persistence::open(config.clone()).unwrap();
        let manual = Arc::new(epkv_executor::ManualClock::new(Duration::ZERO));
        let clock: Arc<dyn epkv_executor::Clock> = manual.clone();
        assert_eq!(p.log_clean_threshold(&clock), 30, "no load measured yet");
        p.flushed_bytes.fetch_add(40 << 20, Relaxed);
        manual.advance(Duration::from_secs(2));
        assert_eq!(
            p.log_clean_threshold(&clock),
            LOG_BUSY_FRAGMENTATION_PERCENT
        );
        manual.advance(Duration::from_millis(1100));
        assert_eq!(p.log_clean_threshold(&clock), 30, "a quiet second");
        // A setting above it stands; 0 (off) stays off.
        for (set, busy) in [(60, 60), (0, 0)] {
            let dir = tempfile::tempdir().unwrap();
            let mut c = PersistenceConfig::new(dir.path());
            c.compaction_bytes_per_sec = 4 << 20;
            c.compaction_fragmentation_percent = set;
            let p = Persistence::open(c).unwrap();
            p.ingest_rate(&clock);
            p.flushed_bytes.fetch_add(40 << 20, Relaxed);
            manual.advance(Duration::from_secs(2));
            assert_eq!(p.log_clean_threshold(&clock), busy);
        }
    }

    #[test]
    fn compaction_may_write_as_fast_as_the_flushers_persist() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = PersistenceConfig::new(dir.path());
        config.compaction_bytes_per_sec = 4 << 20;
        let p = Persistence::open(config).unwrap();
        let manual = Arc::new(epkv_executor::ManualClock::new(Duration::ZERO));
        let clock: Arc<dyn epkv_executor::Clock> = manual.clone();
        // No rate measured yet: the configured cap, shared by the threads.
        assert_eq!(p.compaction_rate(&clock, 2), 2 << 20);
        // 40 MiB persisted over 2 s: 20 MiB/s, above the cap, is what compaction may write.
        p.flushed_bytes.fetch_add(40 << 20, Relaxed);
        manual.advance(Duration::from_secs(2));
        assert_eq!(p.compaction_rate(&clock, 1), 20 << 20);
        assert_eq!(p.compaction_rate(&clock, 4), 5 << 20);
        // Within a second of the last sample the rate is kept; then it is measured again:
        // a quiet second falls back to the cap.
        manual.advance(Duration::from_millis(500));
        assert_eq!(p.compaction_rate(&clock, 1), 20 << 20);
        manual.advance(Duration::from_millis(600));
        assert_eq!(p.compaction_rate(&clock, 1), 4 << 20);
        // Unlimited stays unlimited.
        let dir = tempfile::tempdir().unwrap();
        let mut config = PersistenceConfig::new(dir.path());
        config.compaction_bytes_per_sec = 0;
        let p = Persistence::open(config).unwrap();
        assert_eq!(p.compaction_rate(&clock, 1), 0);
    }
}
