//! Bounded concurrent tests: several threads mutate keys of a few shared vBuckets. Per
//! vBucket, seqnos must be handed out without gaps or duplicates, every thread must see
//! its own seqnos increase, CAS must be unique and increase in seqno order, and no
//! counter update may be lost.

mod support;

use epkv_engine::{Bucket, BucketConfig, EngineClock};
use epkv_engine_api::{ArithmeticOp, Engine, EngineStatus, StoreOp};
use epkv_types::{Cas, Vbid};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::thread;
use support::*;

const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 4_000;

/// 32 keys spread over 4 vBuckets (8 per vBucket).
fn key_set() -> Vec<String> {
    let mut keys = Vec::new();
    let mut anchors = Vec::new();
    for i in 0.. {
        let k = format!("c{i}");
        let v = vb(k.as_bytes());
        if !anchors.contains(&v) {
            if anchors.len() == 4 {
                continue;
            }
            anchors.push(v);
        }
        if keys
            .iter()
            .filter(|x: &&String| vb(x.as_bytes()) == v)
            .count()
            < 8
        {
            keys.push(k);
        }
        if keys.len() == 32 {
            break;
        }
    }
    keys
}

#[test]
fn seqnos_and_cas_are_ordered_per_vbucket_under_concurrency() {
    let bucket = Bucket::new(
        BucketConfig {
            expiry_pager_interval: std::time::Duration::ZERO,
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap();
    let keys = Arc::new(key_set());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let bucket = Arc::clone(&bucket);
            let keys = Arc::clone(&keys);
            thread::spawn(move || {
                let mut seen: Vec<(Vbid, u64, Cas)> = Vec::new();
                for n in 0..OPS_PER_THREAD {
                    let k = &keys[(n * 7 + t * 3) % keys.len()];
                    let id = vb(k.as_bytes());
                    let result = match n % 5 {
                        0 | 1 => bucket.store(store_req(StoreOp::Set, k, "value")).map(Some),
                        2 => match bucket.remove(remove_req(k, Cas::ANY)) {
                            Err(EngineStatus::KeyNotFound) => Ok(None),
                            other => other.map(Some),
                        },
                        3 => bucket
                            .arithmetic(arith_req(ArithmeticOp::Increment, k, 1, 0, 0))
                            .map(|(_, m)| Some(m))
                            .or_else(|e| match e {
                                // The key may hold "value" from a SET.
                                EngineStatus::DeltaBadValue => Ok(None),
                                e => Err(e),
                            }),
                        _ => match bucket.get(id, k.as_bytes()) {
                            Ok(item) => {
                                assert_eq!(item.vbid, id);
                                Ok(None)
                            }
                            Err(EngineStatus::KeyNotFound) => Ok(None),
                            Err(e) => Err(e),
                        },
                    };
                    if let Some(info) = result.unwrap() {
                        seen.push((id, info.seqno.0, info.cas));
                    }
                }
                seen
            })
        })
        .collect();
    let mut per_vb: BTreeMap<Vbid, Vec<(u64, Cas)>> = BTreeMap::new();
    for h in handles {
        let seen = h.join().unwrap();
        // Each thread's own mutations of one vBucket come back in increasing seqno order.
        let mut last: BTreeMap<Vbid, u64> = BTreeMap::new();
        for (id, seqno, cas) in seen {
            let prev = last.insert(id, seqno).unwrap_or(0);
            assert!(
                seqno > prev,
                "{id}: seqno {seqno} after {prev} in one thread"
            );
            per_vb.entry(id).or_default().push((seqno, cas));
        }
    }
    assert_eq!(per_vb.len(), 4);
    for (id, mut muts) in per_vb {
        muts.sort_unstable();
        let seqnos: Vec<u64> = muts.iter().map(|m| m.0).collect();
        let expected: Vec<u64> = (1..=muts.len() as u64).collect();
        assert_eq!(seqnos, expected, "{id}: seqnos have gaps or duplicates");
        for w in muts.windows(2) {
            assert!(w[1].1 > w[0].1, "{id}: CAS not increasing with seqno");
        }
        let unique: HashSet<Cas> = muts.iter().map(|m| m.1).collect();
        assert_eq!(unique.len(), muts.len());
        assert_eq!(bucket.high_seqno(id), Some(muts.len() as u64));
    }
    bucket.shutdown();
}

#[test]
fn concurrent_increments_of_one_counter_lose_nothing() {
    let f = Fixture::new();
    let bucket = Arc::clone(&f.bucket);
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let bucket = Arc::clone(&bucket);
            thread::spawn(move || {
                for _ in 0..OPS_PER_THREAD {
                    bucket
                        .arithmetic(arith_req(ArithmeticOp::Increment, "hits", 1, 1, 0))
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // The first increment created the counter at 1 without adding the delta.
    let total = (THREADS * OPS_PER_THREAD) as u64;
    assert_eq!(
        must_get(&f.bucket, "hits").value.as_ref(),
        total.to_string().as_bytes()
    );
    assert_eq!(f.stat_u64("incr_hits"), total);
}

#[test]
fn concurrent_cas_updates_let_exactly_one_writer_win_each_round() {
    let f = Fixture::new();
    must_set(&f.bucket, "shared", "0");
    let bucket = Arc::clone(&f.bucket);
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let bucket = Arc::clone(&bucket);
            thread::spawn(move || {
                let mut wins = 0u64;
                for _ in 0..500 {
                    // Read-modify-write with CAS, retried until it wins.
                    loop {
                        let item = must_get(&bucket, "shared");
                        let n: u64 = std::str::from_utf8(&item.value).unwrap().parse().unwrap();
                        let next = (n + 1).to_string();
                        let mut req = store_req(StoreOp::Set, "shared", &next);
                        req.cas = item.cas;
                        match bucket.store(req) {
                            Ok(_) => {
                                wins += 1;
                                break;
                            }
                            Err(EngineStatus::KeyExists) => {}
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                }
                wins
            })
        })
        .collect();
    let wins: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(wins, (THREADS * 500) as u64);
    assert_eq!(
        must_get(&f.bucket, "shared").value.as_ref(),
        wins.to_string().as_bytes()
    );
}
