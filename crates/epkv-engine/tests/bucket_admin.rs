//! vBucket routing and states, FLUSH, stats groups, the memory quota, the clocks and the
//! expiry pager, through the public API.

mod support;

use epkv_engine::{
    Bucket, BucketConfig, EngineClock, EphemeralFullPolicy, Error, PagerRun, STATS, StatGroup,
};
use epkv_engine_api::{Engine, EngineStatus, Expiry, StoreOp};
use epkv_executor::{Clock, ManualClock, OffsetClock, SystemClock};
use epkv_types::{Cas, NUM_VBUCKETS, VBucketState, Vbid};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;

fn stats_of(b: &Bucket, group: &str) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let r = b.stats(group, &mut |k, v| {
        m.insert(k.to_owned(), v.to_owned());
    });
    assert_eq!(r, Ok(()), "stat group {group:?}");
    m
}

// ---------------------------------------------------------------- routing and states

#[test]
fn vbid_out_of_range_is_not_my_vbucket() {
    let f = Fixture::new();
    assert_eq!(
        f.bucket.get(Vbid(NUM_VBUCKETS), b"k"),
        Err(EngineStatus::NotMyVbucket)
    );
    assert_eq!(
        f.bucket.get(Vbid(u16::MAX), b"k"),
        Err(EngineStatus::NotMyVbucket)
    );
    assert_eq!(f.bucket.vbucket_state(Vbid(NUM_VBUCKETS)), None);
    assert_eq!(
        f.bucket
            .set_vbucket_state(Vbid(NUM_VBUCKETS), VBucketState::Active),
        Err(EngineStatus::NotMyVbucket)
    );
}

#[test]
fn key_sent_to_the_wrong_vbucket_is_not_my_vbucket() {
    let f = Fixture::new();
    let right = vb(b"k");
    let wrong = Vbid((right.0 + 1) % NUM_VBUCKETS);
    let mut req = store_req(StoreOp::Set, "k", "v");
    req.vbid = wrong;
    assert_eq!(f.bucket.store(req), Err(EngineStatus::NotMyVbucket));
    must_set(&f.bucket, "k", "v");
    assert_eq!(f.bucket.get(wrong, b"k"), Err(EngineStatus::NotMyVbucket));
    assert_eq!(
        f.bucket.touch(wrong, b"k", 1),
        Err(EngineStatus::NotMyVbucket)
    );
    assert_eq!(
        f.bucket.get_locked(wrong, b"k", 1),
        Err(EngineStatus::NotMyVbucket)
    );
    assert_eq!(
        f.bucket.unlock(wrong, b"k", Cas(1)),
        Err(EngineStatus::NotMyVbucket)
    );
    let mut del = remove_req("k", Cas::ANY);
    del.vbid = wrong;
    assert_eq!(f.bucket.remove(del), Err(EngineStatus::NotMyVbucket));
}

#[test]
fn all_vbuckets_start_active() {
    let f = Fixture::new();
    for i in 0..NUM_VBUCKETS {
        assert_eq!(f.bucket.vbucket_state(Vbid(i)), Some(VBucketState::Active));
    }
    assert_eq!(f.stat_u64("vb_active_num"), 1024);
    assert_eq!(f.stat_u64("vb_replica_num"), 0);
}

#[test]
fn replica_and_dead_refuse_clients_and_pending_parks_them() {
    let f = Fixture::new();
    must_set(&f.bucket, "k", "v");
    let id = vb(b"k");
    for (state, expected) in [
        (VBucketState::Replica, EngineStatus::NotMyVbucket),
        (VBucketState::Dead, EngineStatus::NotMyVbucket),
        // Parked: the caller waits with `when_fetched` (tests/pending_vbuckets.rs).
        (VBucketState::Pending, EngineStatus::WouldBlock),
    ] {
        f.bucket.set_vbucket_state(id, state).unwrap();
        assert_eq!(f.bucket.vbucket_state(id), Some(state));
        assert_eq!(get(&f.bucket, "k"), Err(expected));
        assert_eq!(
            f.bucket.store(store_req(StoreOp::Set, "k", "x")),
            Err(expected)
        );
        assert_eq!(f.bucket.remove(remove_req("k", Cas::ANY)), Err(expected));
        assert_eq!(
            f.bucket.arithmetic(arith_req(
                epkv_engine_api::ArithmeticOp::Increment,
                "k",
                1,
                0,
                0
            )),
            Err(expected)
        );
        assert_eq!(f.bucket.touch(id, b"k", 1), Err(expected));
        assert_eq!(f.bucket.get_locked(id, b"k", 1), Err(expected));
    }
    assert_eq!(f.stat_u64("vb_pending_num"), 1);
    assert_eq!(f.stat_u64("vb_pending_curr_items"), 1);
    assert_eq!(f.stat_u64("curr_items"), 0);
    assert_eq!(f.stat_u64("curr_items_tot"), 1);
    // The data survived the state changes.
    f.bucket
        .set_vbucket_state(id, VBucketState::Active)
        .unwrap();
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"v");
}

#[test]
fn promotion_to_active_changes_the_vbucket_uuid() {
    let f = Fixture::new();
    let before = must_set(&f.bucket, "k", "v").vbucket_uuid;
    let id = vb(b"k");
    f.bucket
        .set_vbucket_state(id, VBucketState::Replica)
        .unwrap();
    f.bucket
        .set_vbucket_state(id, VBucketState::Active)
        .unwrap();
    let after = must_set(&f.bucket, "k", "w").vbucket_uuid;
    assert_ne!(before, after);
    let details = stats_of(&f.bucket, &format!("vbucket-details {}", id.0));
    assert_eq!(details[&format!("vb_{}:uuid", id.0)], after.to_string());
    assert_eq!(details[&format!("vb_{}:num_failover_entries", id.0)], "2");
}

#[test]
fn seqnos_count_up_per_vbucket() {
    let f = Fixture::new();
    let keys = keys_in_one_vbucket(5);
    let id = vb(keys[0].as_bytes());
    let seqnos: Vec<u64> = keys
        .iter()
        .map(|k| must_set(&f.bucket, k, "v").seqno.0)
        .collect();
    assert_eq!(seqnos, vec![1, 2, 3, 4, 5]);
    assert_eq!(f.bucket.high_seqno(id), Some(5));
    assert_eq!(f.bucket.high_seqno(Vbid(NUM_VBUCKETS)), None);
}

#[test]
fn cas_stays_unique_when_the_clock_stands_still() {
    let f = Fixture::new();
    let a = must_set(&f.bucket, "k", "1").cas;
    let b = must_set(&f.bucket, "k", "2").cas;
    let c = must_set(&f.bucket, "k", "3").cas;
    assert_eq!(b.0, a.0 + 1);
    assert_eq!(c.0, b.0 + 1);
    // The physical part is the clock with the low 16 bits cleared.
    let nanos = u64::try_from(Duration::from_secs(START_UNIX_SECS).as_nanos()).unwrap();
    assert_eq!(a.0, nanos & !0xffff);
    f.advance(1);
    let d = must_set(&f.bucket, "k", "4").cas;
    assert_eq!(d.0, (nanos + 1_000_000_000) & !0xffff);
}

// ---------------------------------------------------------------- FLUSH

#[test]
fn flush_is_not_supported_unless_enabled() {
    let f = Fixture::new();
    must_set(&f.bucket, "k", "v");
    assert_eq!(f.bucket.flush(), Err(EngineStatus::NotSupported));
    must_get(&f.bucket, "k");
}

#[test]
fn flush_empties_every_vbucket() {
    let f = Fixture::with_config(BucketConfig {
        flush_enabled: true,
        ..test_config()
    });
    for i in 0..200 {
        must_set(&f.bucket, &format!("key{i}"), "v");
    }
    assert_eq!(f.stat_u64("curr_items"), 200);
    f.bucket.flush().unwrap();
    assert_eq!(f.stat_u64("curr_items"), 0);
    assert_eq!(f.bucket.mem_used(), 0);
    assert_eq!(get(&f.bucket, "key7"), Err(EngineStatus::KeyNotFound));
    must_set(&f.bucket, "key7", "back");
}

// ---------------------------------------------------------------- stats

#[test]
fn default_and_memory_groups_emit_exactly_the_stat_table() {
    let f = Fixture::new();
    for (group, sg) in [("", StatGroup::Default), ("memory", StatGroup::Memory)] {
        let emitted = stats_of(&f.bucket, group);
        let defined: Vec<_> = STATS.iter().filter(|d| d.group == sg).collect();
        assert_eq!(emitted.len(), defined.len(), "group {group:?}");
        for d in defined {
            assert!(emitted.contains_key(d.name), "{} missing", d.name);
        }
    }
}

#[test]
fn default_group_reports_items_memory_and_config() {
    let f = Fixture::with_config(BucketConfig {
        expiry_pager_interval: Duration::from_secs(90),
        ..test_config()
    });
    must_set(&f.bucket, "a", "1");
    must_set(&f.bucket, "b", "22");
    let s = stats_of(&f.bucket, "");
    assert_eq!(s["curr_items"], "2");
    assert_eq!(s["curr_items_tot"], "2");
    assert_eq!(s["ep_max_size"], (1u64 << 30).to_string());
    assert_eq!(
        s["ep_mem_high_wat"],
        ((1usize << 30) / 100 * 85).to_string()
    );
    assert_eq!(s["mem_used"], f.bucket.mem_used().to_string());
    assert_eq!(s["ep_bucket_name"], "default");
    assert_eq!(s["ep_flushall_enabled"], "false");
    assert_eq!(s["ep_exp_pager_stime"], "90");
    assert!(f.bucket.mem_used() > 0);
    let m = stats_of(&f.bucket, "memory");
    assert_eq!(m["mem_used"], s["mem_used"]);
    assert_eq!(m["ep_kv_size"], s["mem_used"]);
    assert_eq!(m["ep_mem_low_wat"], ((1usize << 30) / 100 * 75).to_string());
}

#[test]
fn vbucket_group_lists_every_vbucket_state() {
    let f = Fixture::new();
    f.bucket
        .set_vbucket_state(Vbid(5), VBucketState::Replica)
        .unwrap();
    let s = stats_of(&f.bucket, "vbucket");
    assert_eq!(s.len(), usize::from(NUM_VBUCKETS));
    assert_eq!(s["vb_0"], "active");
    assert_eq!(s["vb_5"], "replica");
    assert_eq!(s["vb_1023"], "active");
    let d = stats_of(&f.bucket, "vbucket-details");
    assert_eq!(d["vb_5"], "replica");
    assert_eq!(d["vb_0:high_seqno"], "0");
}

#[test]
fn unknown_stat_group_and_bad_vbucket_details() {
    let f = Fixture::new();
    let mut sink = |_: &str, _: &str| {};
    assert_eq!(
        f.bucket.stats("no-such-group", &mut sink),
        Err(EngineStatus::UnknownStatGroup)
    );
    assert_eq!(
        f.bucket.stats("vbucket-details 5000", &mut sink),
        Err(EngineStatus::NotMyVbucket)
    );
    assert_eq!(
        f.bucket.stats("vbucket-details x", &mut sink),
        Err(EngineStatus::Invalid)
    );
}

// ---------------------------------------------------------------- memory quota

#[test]
fn a_memory_only_bucket_that_fails_new_data_refuses_with_enomem_at_its_quota() {
    let quota: usize = 1024 * 1024;
    let f = Fixture::with_config(BucketConfig {
        memory_quota_bytes: quota as u64,
        ephemeral_full_policy: EphemeralFullPolicy::FailNewData,
        ..test_config()
    });
    let value = "x".repeat(100 * 1024);
    let mut stored = Vec::new();
    let mut refused = None;
    for i in 0..20 {
        let k = format!("big{i}");
        match f.bucket.store(store_req(StoreOp::Set, &k, &value)) {
            Ok(_) => stored.push(k),
            Err(e) => {
                refused = Some((k, e));
                break;
            }
        }
        assert!(f.bucket.mem_used() <= quota);
    }
    let (k, e) = refused.expect("the quota must run out within 2 MiB of writes");
    assert_eq!(e, EngineStatus::NoMemory);
    assert_eq!(stored.len(), 10, "10 × 100 KiB fit in 1 MiB, 11 do not");
    assert!(f.bucket.mem_used() <= quota);
    assert_eq!(get(&f.bucket, &k), Err(EngineStatus::KeyNotFound));
    assert_eq!(f.stat("", "ep_oom_errors"), "1");
    // The pager deletes nothing under this policy.
    assert_eq!(f.bucket.run_item_pager(), PagerRun::default());
    assert_eq!(f.bucket.item_count(), 10);
    // Overwriting with a value of the same size needs no extra memory.
    must_set(&f.bucket, &stored[0], &value);
    // Deleting frees memory for a new write.
    f.bucket.remove(remove_req(&stored[1], Cas::ANY)).unwrap();
    must_set(&f.bucket, &k, &value);
}

#[test]
fn a_memory_only_bucket_with_auto_delete_keeps_taking_writes_past_its_quota() {
    let quota: usize = 1024 * 1024;
    // A manual executor: the pager task runs only when the test says (it is woken by
    // the writes, but the test runs the pager itself, so the counts below are stable).
    let clock = Arc::new(ManualClock::new(Duration::from_secs(START_UNIX_SECS)));
    let exec = epkv_executor::ManualExecutor::new(Arc::clone(&clock));
    let bucket = Bucket::new_on_executor(
        BucketConfig {
            memory_quota_bytes: quota as u64,
            ..test_config()
        },
        EngineClock::Custom(clock.clone()),
        exec.handle(),
    )
    .unwrap();
    let f = Fixture { bucket, clock };
    assert_eq!(f.stat("", "ep_pager_auto_deletes"), "0");
    let value = "y".repeat(50 * 1024);
    // 5 MiB of writes into 1 MiB: each one that does not fit is refused with TempFail,
    // the pager deletes the least used documents, and the retry fits.
    for i in 0..100 {
        let k = format!("doc{i}");
        let mut stored = false;
        for _ in 0..10 {
            match f.bucket.store(store_req(StoreOp::Set, &k, &value)) {
                Ok(_) => {
                    stored = true;
                    break;
                }
                Err(EngineStatus::TempFail) => while f.bucket.run_item_pager().more {},
                Err(e) => panic!("{k}: {e}"),
            }
        }
        assert!(stored, "{k} never fitted");
        assert!(f.bucket.mem_used() <= quota);
    }
    let deleted: usize = f.stat("", "ep_pager_auto_deletes").parse().unwrap();
    assert!(deleted > 0);
    assert_eq!(f.bucket.item_count() + deleted, 100);
    let live = (0..100)
        .filter(|i| get(&f.bucket, &format!("doc{i}")).is_ok())
        .count();
    assert_eq!(
        live,
        f.bucket.item_count(),
        "deleted documents read as missing"
    );
    // Each deletion took a seqno, as a DELETE does.
    let high: u64 = (0..NUM_VBUCKETS)
        .map(|v| f.bucket.high_seqno(Vbid(v)).unwrap())
        .sum();
    assert_eq!(high, 100 + deleted as u64);
}

// ---------------------------------------------------------------- clocks

#[test]
fn adjust_time_needs_the_testing_clock() {
    let sys = Bucket::new(BucketConfig::default(), EngineClock::System).unwrap();
    assert_eq!(sys.adjust_time(10), Err(EngineStatus::NotSupported));
    sys.shutdown();
    let f = Fixture::new();
    assert_eq!(f.bucket.adjust_time(10), Err(EngineStatus::NotSupported));
}

#[test]
fn adjust_time_moves_the_testing_clock_and_expires_items() {
    let clock = OffsetClock::new();
    let bucket = Bucket::new(BucketConfig::default(), EngineClock::Testing(clock.clone())).unwrap();
    let mut req = store_req(StoreOp::Set, "k", "v");
    req.expiry = Expiry::Relative(100);
    bucket.store(req).unwrap();
    must_get(&bucket, "k");
    bucket.adjust_time(101).unwrap();
    assert!(clock.unix_time() >= SystemClock.unix_time() + Duration::from_secs(100));
    assert_eq!(get(&bucket, "k"), Err(EngineStatus::KeyNotFound));
    bucket.adjust_time(0).unwrap();
    bucket.shutdown();
}

// ---------------------------------------------------------------- expiry pager

#[test]
fn expiry_pass_removes_expired_items_of_active_vbuckets_only() {
    let f = Fixture::new();
    for i in 0..50 {
        let key = format!("ttl{i}");
        let mut req = store_req(StoreOp::Set, &key, "v");
        req.expiry = Expiry::Relative(10);
        f.bucket.store(req).unwrap();
        must_set(&f.bucket, &format!("keep{i}"), "v");
    }
    let replica_vb = vb(b"ttl0");
    let in_replica = (0..50)
        .filter(|i| vb(format!("ttl{i}").as_bytes()) == replica_vb)
        .count();
    f.bucket
        .set_vbucket_state(replica_vb, VBucketState::Replica)
        .unwrap();
    assert_eq!(f.bucket.run_expiry_pass(), 0);
    f.advance(10);
    let before = f.bucket.high_seqno(vb(b"ttl1")).unwrap();
    let removed = f.bucket.run_expiry_pass();
    assert_eq!(removed, 50 - in_replica);
    assert_eq!(f.stat_u64("ep_expired_pager"), removed as u64);
    assert_eq!(f.stat_u64("ep_num_expiry_pager_runs"), 2);
    assert_eq!(f.stat_u64("curr_items_tot"), (50 + in_replica) as u64);
    // Each expiry is a mutation with a seqno.
    assert!(f.bucket.high_seqno(vb(b"ttl1")).unwrap() > before || vb(b"ttl1") == replica_vb);
    f.bucket
        .set_vbucket_state(replica_vb, VBucketState::Active)
        .unwrap();
    assert_eq!(f.bucket.run_expiry_pass(), in_replica);
    assert_eq!(f.stat_u64("curr_items"), 50);
}

#[test]
fn pager_thread_expires_items_on_the_injected_clock() {
    let clock = Arc::new(ManualClock::new(Duration::from_secs(START_UNIX_SECS)));
    let bucket = Bucket::new(
        BucketConfig {
            expiry_pager_interval: Duration::from_millis(5),
            ..BucketConfig::default()
        },
        EngineClock::Custom(clock.clone()),
    )
    .unwrap();
    assert!(bucket.is_expiry_pager_running());
    let mut req = store_req(StoreOp::Set, "k", "v");
    req.expiry = Expiry::Relative(30);
    bucket.store(req).unwrap();
    clock.advance(Duration::from_secs(30));
    // Wait (bounded) for a pager pass to pick the item up; nothing here sleeps to make
    // the item expire, the manual clock already did that.
    let expired_by_pager = || {
        let mut n = 0u64;
        bucket
            .stats("", &mut |k, v| {
                if k == "ep_expired_pager" {
                    n = v.parse().unwrap();
                }
            })
            .unwrap();
        n
    };
    let mut waited = 0;
    while expired_by_pager() == 0 {
        assert!(waited < 10_000, "the pager never ran");
        std::thread::sleep(Duration::from_millis(1));
        waited += 1;
    }
    assert_eq!(expired_by_pager(), 1);
    assert_eq!(bucket.item_count(), 0);
    assert_eq!(get(&bucket, "k"), Err(EngineStatus::KeyNotFound));
    bucket.shutdown();
    assert!(!bucket.is_expiry_pager_running());
}

#[test]
fn shutdown_stops_a_sleeping_pager_at_once() {
    let bucket = Bucket::new(
        BucketConfig {
            expiry_pager_interval: Duration::from_secs(3600),
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap();
    assert!(bucket.is_expiry_pager_running());
    // Would block for an hour if the sleep could not be interrupted.
    bucket.shutdown();
    assert!(!bucket.is_expiry_pager_running());
    bucket.shutdown();
}

#[test]
fn zero_interval_disables_the_pager() {
    let f = Fixture::with_config(BucketConfig {
        expiry_pager_interval: Duration::ZERO,
        ..test_config()
    });
    assert!(!f.bucket.is_expiry_pager_running());
    assert_eq!(f.stat("", "ep_exp_pager_stime"), "0");
}

#[test]
fn dropping_the_bucket_ends_the_pager_thread() {
    let bucket = Bucket::new(
        BucketConfig {
            expiry_pager_interval: Duration::from_secs(3600),
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap();
    let weak = Arc::downgrade(&bucket);
    drop(bucket);
    assert!(weak.upgrade().is_none());
}

#[test]
fn invalid_config_is_rejected_by_new() {
    let err = Bucket::new(
        BucketConfig {
            num_vbuckets: 0,
            ..BucketConfig::default()
        },
        EngineClock::System,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidConfig {
            field: "num_vbuckets",
            ..
        }
    ));
}

#[test]
fn fewer_vbuckets_route_by_the_smaller_count() {
    let f = Fixture::with_config(BucketConfig {
        num_vbuckets: 4,
        ..test_config()
    });
    let id = epkv_types::vbucket_for_key(b"k", 4);
    let mut req = store_req(StoreOp::Set, "k", "v");
    req.vbid = id;
    f.bucket.store(req).unwrap();
    assert_eq!(f.bucket.get(id, b"k").unwrap().value.as_ref(), b"v");
    assert_eq!(f.bucket.get(Vbid(4), b"k"), Err(EngineStatus::NotMyVbucket));
    assert_eq!(stats_of(&f.bucket, "vbucket").len(), 4);
}
