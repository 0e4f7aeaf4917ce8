//! Command semantics of the bucket through the Engine API, on a manual clock: stores and
//! CAS, APPEND/PREPEND, DELETE, INCREMENT/DECREMENT, TOUCH/GAT, expiry, GET_LOCKED/UNLOCK,
//! durability levels and size limits.

mod support;

use bytes::Bytes;
use epkv_engine::{BucketConfig, DEFAULT_MAX_ITEM_SIZE_BYTES};
use epkv_engine_api::{ArithmeticOp, Engine, EngineStatus, Expiry, StoreOp};
use epkv_types::{Cas, Datatype, DurabilityLevel, Seqno};
use support::*;

// ---------------------------------------------------------------- SET / ADD / REPLACE

#[test]
fn set_then_get_returns_what_was_stored() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "doc", r#"{"a":1}"#);
    req.flags = 0xdead_beef;
    req.datatype = Datatype::JSON;
    let info = f.bucket.store(req).unwrap();
    let item = must_get(&f.bucket, "doc");
    assert_eq!(item.key.as_ref(), b"doc");
    assert_eq!(item.value.as_ref(), br#"{"a":1}"#);
    assert_eq!(item.flags, 0xdead_beef);
    assert_eq!(item.datatype, Datatype::JSON);
    assert_eq!(item.expiry_unix_secs, 0);
    assert_eq!(item.cas, info.cas);
    assert_eq!(item.seqno, info.seqno);
    assert_eq!(item.vbid, vb(b"doc"));
    assert_ne!(info.cas, Cas(0));
    assert_ne!(info.vbucket_uuid, 0);
    assert_eq!(f.stat_u64("cmd_set"), 1);
    assert_eq!(f.stat_u64("get_hits"), 1);
}

#[test]
fn get_of_a_missing_key_is_key_not_found() {
    let f = Fixture::new();
    assert_eq!(get(&f.bucket, "nope"), Err(EngineStatus::KeyNotFound));
    assert_eq!(f.stat_u64("get_misses"), 1);
    assert_eq!(f.stat_u64("cmd_get"), 1);
}

#[test]
fn set_overwrites_and_each_mutation_gets_a_higher_seqno_and_cas() {
    let f = Fixture::new();
    let a = must_set(&f.bucket, "k", "1");
    let b = must_set(&f.bucket, "k", "2");
    assert!(b.seqno > a.seqno);
    assert!(b.cas > a.cas);
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"2");
}

#[test]
fn cas_set_matches_conflicts_and_misses_like_memcached() {
    let f = Fixture::new();
    let first = must_set(&f.bucket, "k", "v1");
    let mut req = store_req(StoreOp::Set, "k", "v2");
    req.cas = first.cas;
    let second = f.bucket.store(req).unwrap();
    // The same (now stale) CAS again: KeyExists, value unchanged.
    assert_eq!(f.bucket.store(req), Err(EngineStatus::KeyExists));
    assert_eq!(must_get(&f.bucket, "k").cas, second.cas);
    // A CAS on a missing key: KeyNotFound, nothing created.
    let mut missing = store_req(StoreOp::Set, "absent", "v");
    missing.cas = Cas(12345);
    assert_eq!(f.bucket.store(missing), Err(EngineStatus::KeyNotFound));
    assert_eq!(get(&f.bucket, "absent"), Err(EngineStatus::KeyNotFound));
    assert_eq!(f.stat_u64("cas_hits"), 1);
    assert_eq!(f.stat_u64("cas_badval"), 1);
    assert_eq!(f.stat_u64("cas_misses"), 1);
}

#[test]
fn add_creates_only_missing_keys() {
    let f = Fixture::new();
    f.bucket.store(store_req(StoreOp::Add, "k", "a")).unwrap();
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Add, "k", "b")),
        Err(EngineStatus::KeyExists)
    );
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"a");
}

#[test]
fn add_with_a_cas_is_invalid() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Add, "k", "a");
    req.cas = Cas(7);
    assert_eq!(f.bucket.store(req), Err(EngineStatus::Invalid));
    assert_eq!(get(&f.bucket, "k"), Err(EngineStatus::KeyNotFound));
}

#[test]
fn replace_needs_an_existing_key_and_honours_cas() {
    let f = Fixture::new();
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Replace, "k", "x")),
        Err(EngineStatus::KeyNotFound)
    );
    let set = must_set(&f.bucket, "k", "a");
    let mut stale = store_req(StoreOp::Replace, "k", "b");
    stale.cas = Cas(set.cas.0 - 1);
    assert_eq!(f.bucket.store(stale), Err(EngineStatus::KeyExists));
    let mut good = store_req(StoreOp::Replace, "k", "c");
    good.cas = set.cas;
    f.bucket.store(good).unwrap();
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"c");
}

#[test]
fn value_above_the_item_size_limit_is_too_big() {
    let f = Fixture::with_config(BucketConfig {
        max_item_size_bytes: 10,
        ..test_config()
    });
    must_set(&f.bucket, "k", "0123456789");
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Set, "k", "0123456789A")),
        Err(EngineStatus::TooBig)
    );
    assert_eq!(must_get(&f.bucket, "k").value.len(), 10);
    assert_eq!(f.stat_u64("ep_item_too_big"), 1);
}

#[test]
fn default_item_size_limit_is_20_mib() {
    let f = Fixture::new();
    let too_big = vec![b'x'; DEFAULT_MAX_ITEM_SIZE_BYTES + 1];
    let mut req = store_req(StoreOp::Set, "big", "");
    req.value = &too_big;
    assert_eq!(f.bucket.store(req), Err(EngineStatus::TooBig));
    req.value = &too_big[..DEFAULT_MAX_ITEM_SIZE_BYTES];
    f.bucket.store(req).unwrap();
}

#[test]
fn stored_bytes_do_not_alias_the_request_buffer() {
    let f = Fixture::new();
    let network_buffer = Bytes::from(b"xxkeyvalueyy".to_vec());
    let mut req = store_req(StoreOp::Set, "key", "");
    req.key = &network_buffer[2..5];
    req.value = &network_buffer[5..10];
    f.bucket.store(req).unwrap();
    let item = must_get(&f.bucket, "key");
    assert_eq!(item.value.as_ref(), b"value");
    // The stored value is its own allocation, not a view into the 12-byte buffer.
    assert_ne!(item.value.as_ptr(), network_buffer.slice(5..10).as_ptr());
}

// ---------------------------------------------------------------- APPEND / PREPEND

#[test]
fn append_and_prepend_need_an_existing_key() {
    let f = Fixture::new();
    for op in [StoreOp::Append, StoreOp::Prepend] {
        assert_eq!(
            f.bucket.store(store_req(op, "k", "x")),
            Err(EngineStatus::NotStored)
        );
    }
    assert_eq!(get(&f.bucket, "k"), Err(EngineStatus::KeyNotFound));
}

#[test]
fn append_and_prepend_keep_flags_and_expiry() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "k", "mid");
    req.flags = 42;
    req.expiry = Expiry::Relative(100);
    f.bucket.store(req).unwrap();
    let mut app = store_req(StoreOp::Append, "k", "-end");
    app.flags = 7;
    app.expiry = Expiry::Relative(5);
    f.bucket.store(app).unwrap();
    f.bucket
        .store(store_req(StoreOp::Prepend, "k", "start-"))
        .unwrap();
    let item = must_get(&f.bucket, "k");
    assert_eq!(item.value.as_ref(), b"start-mid-end");
    assert_eq!(item.flags, 42);
    assert_eq!(item.expiry_unix_secs, f.now_secs() + 100);
}

#[test]
fn append_honours_cas() {
    let f = Fixture::new();
    let set = must_set(&f.bucket, "k", "a");
    let mut stale = store_req(StoreOp::Append, "k", "b");
    stale.cas = Cas(set.cas.0 + 1);
    assert_eq!(f.bucket.store(stale), Err(EngineStatus::KeyExists));
    let mut good = store_req(StoreOp::Append, "k", "c");
    good.cas = set.cas;
    f.bucket.store(good).unwrap();
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"ac");
}

#[test]
fn append_beyond_the_size_limit_is_too_big_and_keeps_the_value() {
    let f = Fixture::with_config(BucketConfig {
        max_item_size_bytes: 8,
        ..test_config()
    });
    must_set(&f.bucket, "k", "12345");
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Append, "k", "6789")),
        Err(EngineStatus::TooBig)
    );
    f.bucket
        .store(store_req(StoreOp::Append, "k", "678"))
        .unwrap();
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"12345678");
}

#[test]
fn append_recomputes_the_json_datatype() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "k", "[1");
    req.datatype = Datatype::RAW;
    f.bucket.store(req).unwrap();
    f.bucket
        .store(store_req(StoreOp::Append, "k", "]"))
        .unwrap();
    assert_eq!(must_get(&f.bucket, "k").datatype, Datatype::JSON);
    f.bucket
        .store(store_req(StoreOp::Append, "k", "x"))
        .unwrap();
    assert_eq!(must_get(&f.bucket, "k").datatype, Datatype::RAW);
}

// ---------------------------------------------------------------- DELETE

#[test]
fn delete_removes_and_reports_a_new_seqno() {
    let f = Fixture::new();
    let set = must_set(&f.bucket, "k", "v");
    let del = f.bucket.remove(remove_req("k", Cas::ANY)).unwrap();
    assert!(del.seqno > set.seqno);
    assert!(del.cas > set.cas);
    assert_eq!(get(&f.bucket, "k"), Err(EngineStatus::KeyNotFound));
    assert_eq!(
        f.bucket.remove(remove_req("k", Cas::ANY)),
        Err(EngineStatus::KeyNotFound)
    );
    assert_eq!(f.stat_u64("delete_hits"), 1);
    assert_eq!(f.stat_u64("delete_misses"), 1);
}

#[test]
fn delete_with_a_stale_cas_is_key_exists() {
    let f = Fixture::new();
    let set = must_set(&f.bucket, "k", "v");
    assert_eq!(
        f.bucket.remove(remove_req("k", Cas(set.cas.0 + 1))),
        Err(EngineStatus::KeyExists)
    );
    f.bucket.remove(remove_req("k", set.cas)).unwrap();
}

// ---------------------------------------------------------------- INCREMENT / DECREMENT

#[test]
fn incr_of_a_missing_key_creates_it_with_initial_without_applying_delta() {
    let f = Fixture::new();
    let (v, info) = f
        .bucket
        .arithmetic(arith_req(ArithmeticOp::Increment, "c", 5, 100, 60))
        .unwrap();
    assert_eq!(v, 100);
    let item = must_get(&f.bucket, "c");
    assert_eq!(item.value.as_ref(), b"100");
    assert_eq!(item.cas, info.cas);
    assert_eq!(item.flags, 0);
    assert_eq!(item.expiry_unix_secs, f.now_secs() + 60);
    assert_eq!(item.datatype, Datatype::JSON);
    let (v, _) = f
        .bucket
        .arithmetic(arith_req(ArithmeticOp::Increment, "c", 5, 100, 60))
        .unwrap();
    assert_eq!(v, 105);
    assert_eq!(must_get(&f.bucket, "c").value.as_ref(), b"105");
    assert_eq!(f.stat_u64("incr_hits"), 2);
}

#[test]
fn arithmetic_with_no_create_expiry_misses() {
    let f = Fixture::new();
    for op in [ArithmeticOp::Increment, ArithmeticOp::Decrement] {
        assert_eq!(
            f.bucket.arithmetic(arith_req(op, "c", 1, 0, 0xffff_ffff)),
            Err(EngineStatus::KeyNotFound)
        );
    }
    assert_eq!(get(&f.bucket, "c"), Err(EngineStatus::KeyNotFound));
    assert_eq!(f.stat_u64("incr_misses"), 1);
    assert_eq!(f.stat_u64("decr_misses"), 1);
}

#[test]
fn incr_wraps_at_two_to_the_64_and_decr_stops_at_zero() {
    let f = Fixture::new();
    must_set(&f.bucket, "c", &u64::MAX.to_string());
    let (v, _) = f
        .bucket
        .arithmetic(arith_req(ArithmeticOp::Increment, "c", 2, 0, 0))
        .unwrap();
    assert_eq!(v, 1);
    let (v, _) = f
        .bucket
        .arithmetic(arith_req(ArithmeticOp::Decrement, "c", 10, 0, 0))
        .unwrap();
    assert_eq!(v, 0);
    assert_eq!(must_get(&f.bucket, "c").value.as_ref(), b"0");
    assert_eq!(f.stat_u64("decr_hits"), 1);
}

#[test]
fn arithmetic_on_a_non_number_is_delta_bad_value() {
    let f = Fixture::new();
    for bad in ["abc", "", "-5", "1.0", "123456789012345678901"] {
        must_set(&f.bucket, "c", bad);
        assert_eq!(
            f.bucket
                .arithmetic(arith_req(ArithmeticOp::Increment, "c", 1, 0, 0)),
            Err(EngineStatus::DeltaBadValue),
            "value {bad:?}"
        );
        assert_eq!(must_get(&f.bucket, "c").value.as_ref(), bad.as_bytes());
    }
}

#[test]
fn arithmetic_keeps_flags_and_expiry_of_an_existing_counter() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "c", "10");
    req.flags = 9;
    req.expiry = Expiry::Relative(50);
    f.bucket.store(req).unwrap();
    f.bucket
        .arithmetic(arith_req(ArithmeticOp::Decrement, "c", 3, 0, 999))
        .unwrap();
    let item = must_get(&f.bucket, "c");
    assert_eq!(item.value.as_ref(), b"7");
    assert_eq!(item.flags, 9);
    assert_eq!(item.expiry_unix_secs, f.now_secs() + 50);
}

#[test]
fn arithmetic_honours_cas() {
    let f = Fixture::new();
    let set = must_set(&f.bucket, "c", "1");
    let mut req = arith_req(ArithmeticOp::Increment, "c", 1, 0, 0);
    req.cas = Cas(set.cas.0 + 1);
    assert_eq!(f.bucket.arithmetic(req), Err(EngineStatus::KeyExists));
    req.cas = set.cas;
    assert_eq!(f.bucket.arithmetic(req).unwrap().0, 2);
}

// ---------------------------------------------------------------- TOUCH / GAT / expiry

#[test]
fn relative_expiry_hides_the_item_once_the_clock_reaches_it() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "k", "v");
    req.expiry = Expiry::Relative(10);
    let set = f.bucket.store(req).unwrap();
    assert_eq!(must_get(&f.bucket, "k").expiry_unix_secs, f.now_secs() + 10);
    f.advance(9);
    must_get(&f.bucket, "k");
    f.advance(1);
    assert_eq!(get(&f.bucket, "k"), Err(EngineStatus::KeyNotFound));
    assert_eq!(f.stat_u64("ep_expired_access"), 1);
    assert_eq!(f.stat_u64("curr_items"), 0);
    // The expiry was a mutation of its own.
    let next = must_set(&f.bucket, "k", "again");
    assert_eq!(next.seqno, Seqno(set.seqno.0 + 2));
}

#[test]
fn absolute_expiry_and_past_absolute_times() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "future", "v");
    req.expiry = Expiry::from_wire(f.now_secs() + 100);
    f.bucket.store(req).unwrap();
    let mut past = store_req(StoreOp::Set, "past", "v");
    past.expiry = Expiry::from_wire(f.now_secs() - 100);
    f.bucket.store(past).unwrap();
    assert_eq!(get(&f.bucket, "past"), Err(EngineStatus::KeyNotFound));
    f.advance(99);
    must_get(&f.bucket, "future");
    f.advance(1);
    assert_eq!(get(&f.bucket, "future"), Err(EngineStatus::KeyNotFound));
}

#[test]
fn writes_treat_an_expired_item_as_missing() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "k", "v");
    req.expiry = Expiry::Relative(1);
    f.bucket.store(req).unwrap();
    f.advance(1);
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Replace, "k", "x")),
        Err(EngineStatus::KeyNotFound)
    );
    f.bucket.store(store_req(StoreOp::Add, "k", "new")).unwrap();
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"new");
}

#[test]
fn preserve_ttl_keeps_the_existing_expiry() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "k", "v1");
    req.expiry = Expiry::Relative(100);
    f.bucket.store(req).unwrap();
    let expiry = must_get(&f.bucket, "k").expiry_unix_secs;
    f.advance(10);
    let mut keep = store_req(StoreOp::Replace, "k", "v2");
    keep.preserve_ttl = true;
    keep.expiry = Expiry::Relative(5);
    f.bucket.store(keep).unwrap();
    assert_eq!(must_get(&f.bucket, "k").expiry_unix_secs, expiry);
    let mut set = store_req(StoreOp::Set, "k", "v3");
    set.preserve_ttl = true;
    f.bucket.store(set).unwrap();
    assert_eq!(must_get(&f.bucket, "k").expiry_unix_secs, expiry);
    // Without the flag a set replaces the expiry (here: none).
    must_set(&f.bucket, "k", "v4");
    assert_eq!(must_get(&f.bucket, "k").expiry_unix_secs, 0);
    // On a new key, preserve-TTL uses the request's expiry.
    let mut fresh = store_req(StoreOp::Set, "fresh", "v");
    fresh.preserve_ttl = true;
    fresh.expiry = Expiry::Relative(7);
    f.bucket.store(fresh).unwrap();
    assert_eq!(
        must_get(&f.bucket, "fresh").expiry_unix_secs,
        f.now_secs() + 7
    );
}

#[test]
fn touch_sets_and_clears_expiry_as_a_new_mutation() {
    let f = Fixture::new();
    let set = must_set(&f.bucket, "k", "v");
    let t = f.bucket.touch(vb(b"k"), b"k", 30).unwrap();
    assert!(t.seqno > set.seqno && t.cas > set.cas);
    let item = must_get(&f.bucket, "k");
    assert_eq!(item.expiry_unix_secs, f.now_secs() + 30);
    assert_eq!(item.cas, t.cas);
    assert_eq!(item.value.as_ref(), b"v");
    f.bucket.touch(vb(b"k"), b"k", 0).unwrap();
    f.advance(31);
    assert_eq!(must_get(&f.bucket, "k").expiry_unix_secs, 0);
    assert_eq!(
        f.bucket.touch(vb(b"zz"), b"zz", 5),
        Err(EngineStatus::KeyNotFound)
    );
    assert_eq!(f.stat_u64("touch_hits"), 2);
    assert_eq!(f.stat_u64("touch_misses"), 1);
}

#[test]
fn gat_returns_the_item_with_its_new_cas_and_expiry() {
    let f = Fixture::new();
    let set = must_set(&f.bucket, "k", "v");
    let item = f.bucket.get_and_touch(vb(b"k"), b"k", 20).unwrap();
    assert_eq!(item.value.as_ref(), b"v");
    assert!(item.cas > set.cas);
    assert_eq!(item.expiry_unix_secs, f.now_secs() + 20);
    assert_eq!(must_get(&f.bucket, "k").cas, item.cas);
    f.advance(20);
    assert_eq!(
        f.bucket.get_and_touch(vb(b"k"), b"k", 20),
        Err(EngineStatus::KeyNotFound)
    );
}

// ---------------------------------------------------------------- GET_LOCKED / UNLOCK

#[test]
fn get_locked_hides_the_cas_and_blocks_writers_without_the_lock_cas() {
    let f = Fixture::new();
    let set = must_set(&f.bucket, "k", "v");
    let locked = f.bucket.get_locked(vb(b"k"), b"k", 10).unwrap();
    assert_eq!(locked.value.as_ref(), b"v");
    assert_ne!(locked.cas, set.cas);
    assert_eq!(must_get(&f.bucket, "k").cas, Cas(u64::MAX));
    assert_eq!(
        f.bucket.get_locked(vb(b"k"), b"k", 10),
        Err(EngineStatus::Locked)
    );
    // Writers without the lock CAS (wildcard or the CAS from before the lock) are refused.
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Set, "k", "x")),
        Err(EngineStatus::Locked)
    );
    let mut with_real_cas = store_req(StoreOp::Set, "k", "x");
    with_real_cas.cas = set.cas;
    assert_eq!(f.bucket.store(with_real_cas), Err(EngineStatus::Locked));
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Append, "k", "x")),
        Err(EngineStatus::Locked)
    );
    assert_eq!(
        f.bucket.remove(remove_req("k", Cas::ANY)),
        Err(EngineStatus::Locked)
    );
    assert_eq!(f.bucket.touch(vb(b"k"), b"k", 5), Err(EngineStatus::Locked));
    assert_eq!(
        f.bucket.get_and_touch(vb(b"k"), b"k", 5),
        Err(EngineStatus::Locked)
    );
    assert_eq!(
        f.bucket
            .arithmetic(arith_req(ArithmeticOp::Increment, "k", 1, 0, 0)),
        Err(EngineStatus::Locked)
    );
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"v");
    // The lock CAS lets a write through and releases the lock.
    let mut owner = store_req(StoreOp::Set, "k", "mine");
    owner.cas = locked.cas;
    let w = f.bucket.store(owner).unwrap();
    let item = must_get(&f.bucket, "k");
    assert_eq!(item.cas, w.cas);
    assert_eq!(item.value.as_ref(), b"mine");
    must_set(&f.bucket, "k", "anyone");
}

#[test]
fn delete_with_the_lock_cas_succeeds() {
    let f = Fixture::new();
    must_set(&f.bucket, "k", "v");
    let locked = f.bucket.get_locked(vb(b"k"), b"k", 0).unwrap();
    f.bucket.remove(remove_req("k", locked.cas)).unwrap();
    assert_eq!(get(&f.bucket, "k"), Err(EngineStatus::KeyNotFound));
}

#[test]
fn unlock_outcomes() {
    let f = Fixture::new();
    assert_eq!(
        f.bucket.unlock(vb(b"k"), b"k", Cas(1)),
        Err(EngineStatus::KeyNotFound)
    );
    let set = must_set(&f.bucket, "k", "v");
    assert_eq!(
        f.bucket.unlock(vb(b"k"), b"k", set.cas),
        Err(EngineStatus::NotLocked)
    );
    let locked = f.bucket.get_locked(vb(b"k"), b"k", 0).unwrap();
    assert_eq!(
        f.bucket.unlock(vb(b"k"), b"k", set.cas),
        Err(EngineStatus::Locked)
    );
    f.bucket.unlock(vb(b"k"), b"k", locked.cas).unwrap();
    // As KV-Engine: the lock CAS stays the document's CAS after unlock, and anyone may
    // write again.
    assert_eq!(must_get(&f.bucket, "k").cas, locked.cas);
    assert_eq!(
        f.bucket.unlock(vb(b"k"), b"k", locked.cas),
        Err(EngineStatus::NotLocked)
    );
    must_set(&f.bucket, "k", "w");
}

#[test]
fn lock_expires_by_the_clock() {
    let f = Fixture::new();
    must_set(&f.bucket, "k", "v");
    let locked = f.bucket.get_locked(vb(b"k"), b"k", 5).unwrap();
    f.advance(4);
    assert_eq!(
        f.bucket.store(store_req(StoreOp::Set, "k", "x")),
        Err(EngineStatus::Locked)
    );
    f.advance(1);
    // Once the lock lapses readers see its CAS, which became the document's CAS.
    assert_eq!(must_get(&f.bucket, "k").cas, locked.cas);
    must_set(&f.bucket, "k", "x");
}

#[test]
fn lock_timeout_zero_or_above_the_maximum_uses_the_default() {
    for requested in [0, 31, u32::MAX] {
        let f = Fixture::new();
        must_set(&f.bucket, "k", "v");
        f.bucket.get_locked(vb(b"k"), b"k", requested).unwrap();
        f.advance(14);
        assert_eq!(
            f.bucket.get_locked(vb(b"k"), b"k", 1),
            Err(EngineStatus::Locked),
            "requested {requested}"
        );
        f.advance(1);
        f.bucket.get_locked(vb(b"k"), b"k", 1).unwrap();
    }
    // 30 s is allowed as asked.
    let f = Fixture::new();
    must_set(&f.bucket, "k", "v");
    f.bucket.get_locked(vb(b"k"), b"k", 30).unwrap();
    f.advance(29);
    assert_eq!(
        f.bucket.get_locked(vb(b"k"), b"k", 1),
        Err(EngineStatus::Locked)
    );
    f.advance(1);
    f.bucket.get_locked(vb(b"k"), b"k", 1).unwrap();
}

#[test]
fn get_locked_of_a_missing_key_is_key_not_found() {
    let f = Fixture::new();
    assert_eq!(
        f.bucket.get_locked(vb(b"k"), b"k", 0),
        Err(EngineStatus::KeyNotFound)
    );
}

// ---------------------------------------------------------------- durability

#[test]
fn majority_commits_at_once_and_persist_levels_are_invalid() {
    let f = Fixture::new();
    let mut req = store_req(StoreOp::Set, "k", "v");
    req.durability = durability(DurabilityLevel::Majority);
    f.bucket.store(req).unwrap();
    must_get(&f.bucket, "k");
    for level in [
        DurabilityLevel::MajorityAndPersistOnMaster,
        DurabilityLevel::PersistToMajority,
    ] {
        let mut req = store_req(StoreOp::Set, "k", "other");
        req.durability = durability(level);
        assert_eq!(
            f.bucket.store(req),
            Err(EngineStatus::DurabilityInvalidLevel)
        );
        let mut del = remove_req("k", Cas::ANY);
        del.durability = durability(level);
        assert_eq!(
            f.bucket.remove(del),
            Err(EngineStatus::DurabilityInvalidLevel)
        );
        let mut arith = arith_req(ArithmeticOp::Increment, "n", 1, 0, 0);
        arith.durability = durability(level);
        assert_eq!(
            f.bucket.arithmetic(arith),
            Err(EngineStatus::DurabilityInvalidLevel)
        );
    }
    assert_eq!(must_get(&f.bucket, "k").value.as_ref(), b"v");
    let mut del = remove_req("k", Cas::ANY);
    del.durability = durability(DurabilityLevel::Majority);
    f.bucket.remove(del).unwrap();
}

// ---------------------------------------------------------------- hash-table state

#[test]
fn writes_are_dirty_with_their_seqno_and_gets_feed_the_mfu_histogram() {
    let f = Fixture::new();
    let info = must_set(&f.bucket, "hot", "v");
    let stats = f.bucket.hash_table_stats(vb(b"hot")).unwrap();
    assert_eq!((stats.items, stats.dirty, stats.prepared), (1, 1, 0));
    assert_eq!(stats.mfu_histogram.iter().sum::<u64>(), 1);
    let start = stats.mfu_percentile(50.0).unwrap();
    for _ in 0..200 {
        must_get(&f.bucket, "hot");
    }
    let after = f.bucket.hash_table_stats(vb(b"hot")).unwrap();
    assert!(
        after.mfu_percentile(50.0).unwrap() > start,
        "GETs bump the MFU counter"
    );
    assert!(info.seqno.0 > 0);
    assert!(
        f.bucket
            .hash_table_stats(epkv_types::Vbid(u16::MAX))
            .is_none()
    );
}

#[test]
fn get_random_key_picks_resident_live_documents_of_the_collection_asked() {
    use epkv_types::doc_key::{self, DocKeyBuf};
    let dir = tempfile::tempdir().unwrap();
    let fx = Fixture::manual_flush(dir.path());
    let b = &fx.bucket;
    assert_eq!(b.get_random_key(0).err(), Some(EngineStatus::KeyNotFound));
    assert_eq!(
        b.get_random_key(0x77).err(),
        Some(EngineStatus::UnknownCollection)
    );
    b.create_scope("s").unwrap();
    b.create_collection("s", "c", 0).unwrap();
    let cid = b.collection_id("s.c").unwrap().1;
    assert_eq!(b.get_random_key(cid).err(), Some(EngineStatus::KeyNotFound));
    // 100 documents in the default collection, 30 in `s.c`, and one deleted there.
    for i in 0..100 {
        must_set(b, &format!("d{i}"), "default");
    }
    let mut buf = DocKeyBuf::new();
    for i in 0..31 {
        let key = doc_key::encode(cid, format!("c{i}").as_bytes(), &mut buf).to_vec();
        let vbid = vb(format!("c{i}").as_bytes());
        b.store(epkv_engine_api::StoreRequest {
            key: &key,
            vbid,
            ..store_req(StoreOp::Set, "", "collected")
        })
        .unwrap();
    }
    let gone = doc_key::encode(cid, b"c30", &mut buf).to_vec();
    b.remove(epkv_engine_api::RemoveRequest {
        key: &gone,
        vbid: vb(b"c30"),
        ..remove_req("", Cas(0))
    })
    .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let item = b.get_random_key(cid).unwrap();
        let (c, raw) = doc_key::decode(&item.key);
        assert_eq!(c, cid);
        assert_ne!(raw, b"c30", "a deleted document is never picked");
        assert_eq!(&item.value[..], b"collected");
        seen.insert(raw.to_vec());
        let d = b.get_random_key(0).unwrap();
        assert_eq!(&d.value[..], b"default");
    }
    assert!(seen.len() > 1, "picks differ: {seen:?}");
    // Only resident documents: once every value of `s.c` is evicted, none is found.
    b.flush_all().unwrap();
    for i in 0..30 {
        let key = doc_key::encode(cid, format!("c{i}").as_bytes(), &mut buf).to_vec();
        assert!(b.evict_key(vb(format!("c{i}").as_bytes()), &key).unwrap());
    }
    assert_eq!(b.get_random_key(cid).err(), Some(EngineStatus::KeyNotFound));
    assert_eq!(&b.get_random_key(0).unwrap().value[..], b"default");
}
