//! Parking client operations on a pending vBucket, as KV-Engine does during a takeover.
//!
//! A vBucket is pending while the node taking it over catches up (rebalance): its client
//! operations must neither run (the new active would miss their changes) nor be refused
//! (the client would retry against a map that has not changed yet). So
//! [`BucketCore::client_vbucket`] answers WouldBlock, and [`BucketCore::when_unblocked`],
//! the engine's [`epkv_engine_api::Engine::when_fetched`], parks the caller's callback on
//! the vBucket ([`crate::pending_ops`]) instead of waiting for a background fetch. The
//! state change calls it: the operation runs again, on an active vBucket (the move rolled
//! back) or answering NotMyVbucket with the new map (the move done). The check and the
//! parking happen under the vBucket's state lock, which the change holds exclusively, so
//! no operation is parked after the change and left behind.
//!
//! The wait is bounded: a timeout task per vBucket (created at its first parked
//! operation, on the NonIO group, sleeping while nothing is parked) calls each callback
//! [`PARK_TIMEOUT`] after it was parked, and the operation runs again (parked again while
//! the vBucket stays pending; the front end answers TMPFAIL after a few rounds). At
//! shutdown every parked operation is answered TempFail.
//!
//! Level: a service over [`crate::bucket_core::BucketCore`]; it never names the bucket.

use crate::bucket_core::{BucketCore, CoreOwner, schedule_weak};
use crate::pending_ops::PARK_TIMEOUT;
use crate::vbucket::VBucket;
use epkv_engine_api::{EngineStatus, FetchedCallback};
use epkv_types::{VBucketState, Vbid};

impl BucketCore {
    /// See [`epkv_engine_api::Engine::when_fetched`]: parks `done` while `vbid` is
    /// pending, else waits for the background fetch of `key` (at once when none is in
    /// flight).
    pub(crate) fn when_unblocked(&self, vbid: Vbid, key: &[u8], done: FetchedCallback) {
        let done = match self.vbuckets.get(usize::from(vbid.0)) {
            Some(vb) => match self.park_if_pending(vb, done) {
                Some(done) => done,
                None => return,
            },
            None => done,
        };
        self.bg_fetch_when_done(vbid, key, done);
    }

    /// Parks `done` on `vb` if it is pending; returns it otherwise (or when the timeout
    /// task cannot run, so that nothing is parked without a bound).
    fn park_if_pending(&self, vb: &VBucket, done: FetchedCallback) -> Option<FetchedCallback> {
        // The operation saw the state under the state lock, so the hint is at least as
        // new: not pending means it has left that state, and the operation runs again.
        if vb.state_hint() != VBucketState::Pending {
            return Some(done);
        }
        // Once the executor has stopped (shutdown), no timeout would release it.
        let Some(exec) = self.task_executor.get().filter(|e| !e.is_shut_down()) else {
            return Some(done);
        };
        let now = exec.now();
        let Some(task) = self.pending_ops_task(vb) else {
            return Some(done);
        };
        match vb.park_if_pending(now + PARK_TIMEOUT, done) {
            Ok(Some(at)) => {
                task.snooze_until(at);
                None
            }
            Ok(None) => None,
            Err(done) => Some(done),
        }
    }

    /// `vb`'s timeout task for parked operations, created on first use.
    fn pending_ops_task<'v>(&self, vb: &'v VBucket) -> Option<&'v epkv_executor::TaskHandle> {
        if let Some(t) = vb.pending_ops.task.get() {
            return Some(t);
        }
        let exec = self.task_executor.get()?;
        self.owner.upgrade()?;
        let spec = epkv_executor::TaskSpec::new(
            format!("pending-ops-timeout-{}", vb.id.0),
            epkv_executor::Group::NonIo,
        )
        .start(epkv_executor::Start::Sleep);
        let index = usize::from(vb.id.0);
        let handle = match schedule_weak(
            exec,
            self.owner.clone(),
            spec,
            move |b: &(dyn CoreOwner + 'static)| b.core().pending_ops_run(index),
        ) {
            Ok(h) => h,
            Err(e) => {
                tracing::error!(vbid = %vb.id, error = %e, "cannot start the timeout task of parked operations; operations on this pending vBucket are not parked");
                return None;
            }
        };
        if let Err(extra) = vb.pending_ops.task.set(handle) {
            // Another operation created it first.
            extra.cancel();
        }
        vb.pending_ops.task.get()
    }

    /// One run of a vBucket's timeout task: the operations parked for [`PARK_TIMEOUT`]
    /// run again; it sleeps until the next one is due.
    fn pending_ops_run(&self, index: usize) -> epkv_executor::Next {
        let (Some(vb), Some(now)) = (self.vbuckets.get(index), self.sync_now()) else {
            return epkv_executor::Next::Done;
        };
        let (due, next) = vb.pending_ops.take_expired(now);
        if !due.is_empty() {
            tracing::debug!(vbid = %vb.id, released = due.len(), "operations parked on a pending vBucket run again after their timeout");
        }
        for done in due {
            done(Ok(()));
        }
        // A park arming the task meanwhile wins if earlier (the executor keeps the
        // earlier of a run's answer and a request made during the run).
        match next {
            Some(at) => epkv_executor::Next::At(at),
            None => epkv_executor::Next::Sleep,
        }
    }

    /// Answers every parked operation TempFail (the bucket shuts down): none waits for a
    /// state change that will not come.
    pub(crate) fn release_parked_ops(&self) {
        for vb in &self.vbuckets {
            for done in vb.pending_ops.take_all() {
                done(Err(EngineStatus::TempFail));
            }
        }
    }
}
