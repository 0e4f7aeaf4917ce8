//! Pending vBuckets (a takeover in progress) through the engine: client operations are
//! parked (WouldBlock, then `when_fetched` calls back) until the state changes or their
//! wait passes, and then run again in the new state; a move rolled back commits the
//! SyncWrites the pending vBucket held.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions panic on failure"
)]
mod support;

use epkv_engine::{Bucket, BucketConfig, EngineClock};
use epkv_engine_api::{
    DurabilityRequirements, Engine, EngineResult, EngineStatus, Expiry, StoreOp, StoreRequest,
};
use epkv_executor::{ManualClock, ManualExecutor};
use epkv_types::{Cas, Datatype, DurabilityLevel, VBucketState, Vbid};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::key_in;

const VB: Vbid = Vbid(11);

/// A memory-only bucket whose tasks (the parked operations' timeouts among them) run on
/// a manual executor, driven by hand.
fn on_manual_executor() -> (ManualExecutor, Arc<Bucket>) {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(
        support::START_UNIX_SECS,
    )));
    let exec = ManualExecutor::new(Arc::clone(&clock));
    let bucket = Bucket::new_on_executor(
        BucketConfig {
            item_pager_interval: Duration::ZERO,
            ..support::test_config()
        },
        EngineClock::Custom(clock),
        exec.handle(),
    )
    .unwrap();
    (exec, bucket)
}

fn store(b: &Bucket, key: &str, value: &str) -> EngineResult<u64> {
    store_durable(b, key, value, None)
}

fn store_durable(
    b: &Bucket,
    key: &str,
    value: &str,
    durability: Option<DurabilityRequirements>,
) -> EngineResult<u64> {
    b.store(StoreRequest {
        op: StoreOp::Set,
        vbid: VB,
        key: key.as_bytes(),
        value: value.as_bytes(),
        flags: 0,
        expiry: Expiry::Never,
        cas: Cas::ANY,
        datatype: Datatype::RAW,
        durability,
        preserve_ttl: false,
    })
    .map(|m| m.seqno.0)
}

fn value(b: &Bucket, key: &str) -> EngineResult<Vec<u8>> {
    b.get(VB, key.as_bytes()).map(|it| it.value.to_vec())
}

/// Where a callback leaves the outcome it was called with.
type Outcome<T> = Arc<Mutex<Option<T>>>;

fn outcome<T>(o: &Outcome<T>) -> Option<T>
where
    T: Clone,
{
    o.lock().unwrap().clone()
}

/// Waits for `key`'s operation as the front end does after WouldBlock.
fn park(b: &Bucket, key: &str) -> Outcome<EngineResult<()>> {
    let seen = Arc::new(Mutex::new(None));
    let s = Arc::clone(&seen);
    b.when_fetched(
        VB,
        key.as_bytes(),
        Box::new(move |r| *s.lock().unwrap() = Some(r)),
    );
    seen
}

#[test]
fn an_operation_parked_on_a_pending_vbucket_runs_again_when_it_becomes_active() {
    let (exec, b) = on_manual_executor();
    let k = key_in(VB, 0);
    store(&b, &k, "before").unwrap();
    b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
    // Reads and writes alike are parked, not refused.
    assert_eq!(value(&b, &k), Err(EngineStatus::WouldBlock));
    assert_eq!(store(&b, &k, "after"), Err(EngineStatus::WouldBlock));
    let parked = park(&b, &k);
    exec.run_until_idle(100);
    assert_eq!(outcome(&parked), None, "parked until the state changes");
    // The move rolled back: active again, and the operation runs there.
    b.set_vbucket_state(VB, VBucketState::Active).unwrap();
    assert_eq!(outcome(&parked), Some(Ok(())));
    store(&b, &k, "after").unwrap();
    assert_eq!(value(&b, &k).unwrap(), b"after");
    // Not pending: nothing to park on, the caller runs the operation again at once.
    assert_eq!(outcome(&park(&b, &k)), Some(Ok(())));
    b.shutdown();
}

#[test]
fn a_takeover_done_sends_the_parked_operation_to_the_new_active() {
    let (_exec, b) = on_manual_executor();
    let k = key_in(VB, 0);
    b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
    assert_eq!(store(&b, &k, "v"), Err(EngineStatus::WouldBlock));
    let parked = park(&b, &k);
    b.set_vbucket_state(VB, VBucketState::Dead).unwrap();
    assert_eq!(outcome(&parked), Some(Ok(())));
    // Run again: the client is told to go elsewhere (the front end adds the map).
    assert_eq!(store(&b, &k, "v"), Err(EngineStatus::NotMyVbucket));
    b.shutdown();
}

#[test]
fn a_parked_operation_runs_again_after_its_timeout_and_is_answered_at_shutdown() {
    let (exec, b) = on_manual_executor();
    let k = key_in(VB, 0);
    b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
    let first = park(&b, &k);
    exec.advance(Duration::from_secs(1));
    exec.run_until_idle(100);
    let second = park(&b, &k);
    exec.advance(Duration::from_millis(999));
    exec.run_until_idle(100);
    assert_eq!((outcome(&first), outcome(&second)), (None, None));
    // Two seconds after it was parked, the first runs again; still pending, it would
    // be parked again.
    exec.advance(Duration::from_millis(1));
    exec.run_until_idle(100);
    assert_eq!((outcome(&first), outcome(&second)), (Some(Ok(())), None));
    assert_eq!(store(&b, &k, "v"), Err(EngineStatus::WouldBlock));
    exec.advance(Duration::from_secs(1));
    exec.run_until_idle(100);
    assert_eq!(outcome(&second), Some(Ok(())));
    // Nothing is left waiting for a state change that will not come.
    let third = park(&b, &k);
    b.shutdown();
    assert_eq!(outcome(&third), Some(Err(EngineStatus::TempFail)));
}

#[test]
fn no_parked_operation_is_lost_to_a_concurrent_state_change() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Timeouts never fire here (the manual clock stands still): an operation parked
    // after the change that should have released it would wait forever.
    let (_exec, b) = on_manual_executor();
    let k = key_in(VB, 0);
    let (parked, released) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    // Bounded in count, not time: the stores go on (up to 200,000) until one was parked,
    // and the state keeps changing until both store threads are done, so a loaded
    // machine that schedules the threads one after the other still interleaves them.
    let storers_done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for i in 0..200_000 {
                    if i >= 2000 && parked.load(Ordering::SeqCst) > 0 {
                        break;
                    }
                    if store(&b, &k, "v") == Err(EngineStatus::WouldBlock) {
                        parked.fetch_add(1, Ordering::SeqCst);
                        let r = Arc::clone(&released);
                        b.when_fetched(
                            VB,
                            k.as_bytes(),
                            Box::new(move |_| {
                                r.fetch_add(1, Ordering::SeqCst);
                            }),
                        );
                    }
                }
                storers_done.fetch_add(1, Ordering::SeqCst);
            });
        }
        s.spawn(|| {
            for i in 0..1_000_000 {
                if i >= 500 && storers_done.load(Ordering::SeqCst) == 2 {
                    break;
                }
                b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
                b.set_vbucket_state(VB, VBucketState::Active).unwrap();
            }
        });
    });
    assert!(
        parked.load(Ordering::SeqCst) > 0,
        "some operation was parked"
    );
    assert_eq!(
        released.load(Ordering::SeqCst),
        parked.load(Ordering::SeqCst)
    );
    b.shutdown();
}

#[test]
fn a_move_rolled_back_commits_the_prepares_the_pending_vbucket_held() {
    let dir = tempfile::tempdir().unwrap();
    let b = support::open_manual_flush(dir.path());
    // A replica must acknowledge: the prepare stays in flight.
    b.set_replication_chain(VB, 1, 1).unwrap();
    let k = key_in(VB, 0);
    store(&b, &k, "old").unwrap();
    let durable = Some(DurabilityRequirements {
        level: DurabilityLevel::Majority,
        timeout: Some(Duration::from_secs(30)),
    });
    let seqno = store_durable(&b, &k, "new", durable).unwrap();
    let answered: Outcome<EngineResult<()>> = Arc::new(Mutex::new(None));
    let a = Arc::clone(&answered);
    b.when_sync_write_completed(VB, seqno, Box::new(move |r| *a.lock().unwrap() = Some(r)))
        .unwrap();
    // The takeover starts: the client hears ambiguous, the prepare is kept (no abort
    // written: the new active has the same history).
    b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
    assert_eq!(
        outcome(&answered),
        Some(Err(EngineStatus::SyncWriteAmbiguous))
    );
    assert_eq!(b.vbucket_seqnos(VB).unwrap().high_seqno.0, seqno);
    // Rolled back: active again, the held prepare is committed once on disk (needing no
    // acknowledgement) and no longer blocks its key.
    b.set_vbucket_state(VB, VBucketState::Active).unwrap();
    let mut committed = false;
    for _ in 0..100 {
        b.flush_all().unwrap();
        if value(&b, &k).is_ok_and(|v| v == b"new") {
            committed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(committed, "the held prepare was committed");
    store(&b, &k, "later").unwrap();
    assert_eq!(value(&b, &k).unwrap(), b"later");
    b.shutdown();
}

#[test]
fn a_pending_vbucket_restarted_still_holds_its_prepares_until_it_is_active() {
    let dir = tempfile::tempdir().unwrap();
    let k = key_in(VB, 0);
    let seqno = {
        let b = support::open_manual_flush(dir.path());
        b.set_replication_chain(VB, 1, 1).unwrap();
        store(&b, &k, "old").unwrap();
        let durable = Some(DurabilityRequirements {
            level: DurabilityLevel::Majority,
            timeout: Some(Duration::from_secs(30)),
        });
        let seqno = store_durable(&b, &k, "new", durable).unwrap();
        b.set_vbucket_state(VB, VBucketState::Pending).unwrap();
        b.flush_all().unwrap();
        b.shutdown();
        seqno
    };
    let b = support::open_manual_flush(dir.path());
    assert_eq!(b.vbucket_state(VB), Some(VBucketState::Pending));
    // Warmup wrote nothing: the prepare is held, not committed.
    assert_eq!(b.vbucket_seqnos(VB).unwrap().high_seqno.0, seqno);
    b.set_vbucket_state(VB, VBucketState::Active).unwrap();
    b.flush_all().unwrap();
    assert_eq!(value(&b, &k).unwrap(), b"new");
    b.shutdown();
}
