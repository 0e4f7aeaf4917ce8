//! The bucket against a simple model: random sequences of every command (with wildcard,
//! current, stale and lock CASes), clock advances and expiry passes must give the model's
//! status, values, flags, expiry and lock CAS visibility, and the bucket's seqnos, CAS
//! order, item count and memory accounting must follow.
#![expect(
    clippy::unwrap_used,
    reason = "the model harness lives outside #[test] functions and may panic"
)]

mod support;

use epkv_engine::{BucketConfig, EngineClock};
use epkv_engine_api::{
    ArithmeticOp, Engine, EngineResult, EngineStatus, Expiry, Item, MutationInfo, StoreOp,
};
use epkv_hashtable::StoredValue;
use epkv_types::{Cas, Datatype, Vbid};
use proptest::prelude::*;
use std::collections::HashMap;
use support::*;

const MAX_ITEM: usize = 16;

#[derive(Debug, Clone, Copy)]
enum CasChoice {
    Any,
    Current,
    Stale,
    LockCas,
}

#[derive(Debug, Clone, Copy)]
enum Exp {
    Never,
    Rel(u32),
    /// Absolute: now + offset (may be in the past).
    AbsOffset(i32),
}

#[derive(Debug, Clone)]
enum Op {
    Store {
        op: StoreOp,
        key: usize,
        value: String,
        flags: u32,
        exp: Exp,
        preserve: bool,
        cas: CasChoice,
    },
    Delete {
        key: usize,
        cas: CasChoice,
    },
    Arith {
        incr: bool,
        key: usize,
        delta: u64,
        initial: u64,
        exp: Option<Exp>,
        cas: CasChoice,
    },
    Touch {
        key: usize,
        exp: Exp,
    },
    Gat {
        key: usize,
        exp: Exp,
    },
    Get {
        key: usize,
    },
    GetLocked {
        key: usize,
        timeout: u32,
    },
    Unlock {
        key: usize,
        cas: CasChoice,
    },
    Advance {
        secs: u64,
    },
    ExpiryPass,
}

fn cas_choice() -> impl Strategy<Value = CasChoice> {
    prop_oneof![
        3 => Just(CasChoice::Any),
        2 => Just(CasChoice::Current),
        1 => Just(CasChoice::Stale),
        1 => Just(CasChoice::LockCas),
    ]
}

fn exp() -> impl Strategy<Value = Exp> {
    prop_oneof![
        3 => Just(Exp::Never),
        3 => (1u32..20).prop_map(Exp::Rel),
        1 => (-5i32..20).prop_map(Exp::AbsOffset),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,8}",
        "[0-9]{1,2}",
        "[0-9]{3,6}",
        Just("18446744073709551615".to_owned()),
    ]
}

fn store_op() -> impl Strategy<Value = StoreOp> {
    prop_oneof![
        Just(StoreOp::Set),
        Just(StoreOp::Add),
        Just(StoreOp::Replace),
        Just(StoreOp::Append),
        Just(StoreOp::Prepend),
    ]
}

const KEYS: usize = 6;

fn op() -> impl Strategy<Value = Op> {
    let key = 0..KEYS;
    prop_oneof![
        8 => (store_op(), key.clone(), value(), 0u32..4, exp(), any::<bool>(), cas_choice())
            .prop_map(|(op, key, value, flags, exp, preserve, cas)| Op::Store { op, key, value, flags, exp, preserve, cas }),
        2 => (key.clone(), cas_choice()).prop_map(|(key, cas)| Op::Delete { key, cas }),
        3 => (any::<bool>(), key.clone(), 0u64..30, 0u64..20, proptest::option::of(exp()), cas_choice())
            .prop_map(|(incr, key, delta, initial, exp, cas)| Op::Arith { incr, key, delta, initial, exp, cas }),
        1 => (key.clone(), exp()).prop_map(|(key, exp)| Op::Touch { key, exp }),
        1 => (key.clone(), exp()).prop_map(|(key, exp)| Op::Gat { key, exp }),
        3 => key.clone().prop_map(|key| Op::Get { key }),
        2 => (key.clone(), prop_oneof![Just(0u32), Just(1), Just(5), Just(40)])
            .prop_map(|(key, timeout)| Op::GetLocked { key, timeout }),
        1 => (key.clone(), cas_choice()).prop_map(|(key, cas)| Op::Unlock { key, cas }),
        2 => (0u64..25).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::ExpiryPass),
    ]
}

#[derive(Debug, Clone)]
struct MItem {
    value: Vec<u8>,
    flags: u32,
    expiry: u32,
    cas: Cas,
    seqno: u64,
    lock_until: u32,
    lock_cas: Cas,
}

impl MItem {
    fn locked(&self, now: u32) -> bool {
        self.lock_until > now
    }
}

struct Model {
    items: HashMap<usize, MItem>,
    high_seqno: HashMap<Vbid, u64>,
    max_cas: HashMap<Vbid, Cas>,
    /// The last lock CAS handed out per key, kept after unlock so LockCas can be stale.
    last_lock_cas: HashMap<usize, Cas>,
}

struct Harness {
    f: Fixture,
    keys: Vec<String>,
    m: Model,
}

fn resolve(e: Exp, now: u32) -> Expiry {
    match e {
        Exp::Never => Expiry::Never,
        Exp::Rel(r) => Expiry::from_wire(r),
        Exp::AbsOffset(o) => Expiry::from_wire(now.saturating_add_signed(o)),
    }
}

fn parse_counter(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

impl Harness {
    fn new() -> Self {
        let f = Fixture::with_config(BucketConfig {
            max_item_size_bytes: MAX_ITEM,
            expiry_pager_interval: std::time::Duration::ZERO,
            ..BucketConfig::default()
        });
        // Four keys share a vBucket so seqno and CAS ordering interleave across keys.
        let mut keys = keys_in_one_vbucket(4);
        keys.push("x".to_owned());
        keys.push("y".to_owned());
        Self {
            f,
            keys,
            m: Model {
                items: HashMap::new(),
                high_seqno: HashMap::new(),
                max_cas: HashMap::new(),
                last_lock_cas: HashMap::new(),
            },
        }
    }

    fn vbid(&self, k: usize) -> Vbid {
        vb(self.keys[k].as_bytes())
    }

    fn now(&self) -> u32 {
        self.f.now_secs()
    }

    fn cas_for(&self, k: usize, c: CasChoice) -> Cas {
        match c {
            CasChoice::Any => Cas::ANY,
            CasChoice::Current => self.m.items.get(&k).map_or(Cas(1), |i| i.cas),
            CasChoice::Stale => self.m.items.get(&k).map_or(Cas(2), |i| Cas(i.cas.0 - 1)),
            CasChoice::LockCas => self.m.last_lock_cas.get(&k).copied().unwrap_or(Cas(3)),
        }
    }

    /// Drops the key from the model if expired, as an access does; the removal takes a seqno.
    fn expire_key(&mut self, k: usize) {
        let now = self.now();
        if let Some(i) = self.m.items.get(&k)
            && i.expiry != 0
            && i.expiry <= now
        {
            self.m.items.remove(&k);
            *self.m.high_seqno.entry(self.vbid(k)).or_default() += 1;
        }
    }

    /// The lock/CAS rule for changing an existing item.
    fn check(&self, i: &MItem, cas: Cas) -> EngineResult<()> {
        if i.locked(self.now()) {
            if cas == i.lock_cas {
                Ok(())
            } else {
                Err(EngineStatus::Locked)
            }
        } else if cas.is_any() || cas == i.cas {
            Ok(())
        } else {
            Err(EngineStatus::KeyExists)
        }
    }

    /// Checks a mutation's seqno and CAS against the model's vBucket counters and updates them.
    fn observe_mutation(&mut self, k: usize, info: &MutationInfo) -> u64 {
        let vbid = self.vbid(k);
        let seqno = self.m.high_seqno.entry(vbid).or_default();
        *seqno += 1;
        assert_eq!(info.seqno.0, *seqno, "seqno of a mutation on {vbid}");
        let s = *seqno;
        self.observe_cas(vbid, info.cas);
        s
    }

    fn observe_cas(&mut self, vbid: Vbid, cas: Cas) {
        let max = self.m.max_cas.entry(vbid).or_default();
        assert!(cas > *max, "CAS {cas} not above {max} on {vbid}");
        *max = cas;
    }

    fn expect_item(&self, k: usize, got: &Item) {
        let i = &self.m.items[&k];
        assert_eq!(got.value.as_ref(), i.value.as_slice());
        assert_eq!(got.flags, i.flags);
        assert_eq!(got.expiry_unix_secs, i.expiry);
        assert_eq!(got.seqno.0, i.seqno);
        assert_eq!(got.vbid, self.vbid(k));
    }

    fn run(&mut self, op: Op) {
        let b = self.f.bucket.clone();
        match op {
            Op::Store {
                op,
                key: k,
                value,
                flags,
                exp,
                preserve,
                cas,
            } => {
                let cas = self.cas_for(k, cas);
                let now = self.now();
                let key = self.keys[k].clone();
                let mut req = store_req(op, &key, &value);
                req.flags = flags;
                req.expiry = resolve(exp, now);
                req.preserve_ttl = preserve;
                req.cas = cas;
                let got = b.store(req);
                let expected = (|| {
                    if value.len() > MAX_ITEM {
                        return Err(EngineStatus::TooBig);
                    }
                    if op == StoreOp::Add && !cas.is_any() {
                        return Err(EngineStatus::Invalid);
                    }
                    self.expire_key(k);
                    let existing = self.m.items.get(&k).cloned();
                    match (&existing, op) {
                        (Some(_), StoreOp::Add) => return Err(EngineStatus::KeyExists),
                        (Some(i), _) => self.check(i, cas)?,
                        (None, StoreOp::Replace) => return Err(EngineStatus::KeyNotFound),
                        (None, StoreOp::Append | StoreOp::Prepend) => {
                            return Err(EngineStatus::NotStored);
                        }
                        (None, StoreOp::Set) if !cas.is_any() => {
                            return Err(EngineStatus::KeyNotFound);
                        }
                        (None, _) => {}
                    }
                    let (v, fl, ex) = match (op, existing) {
                        (StoreOp::Append | StoreOp::Prepend, Some(i)) => {
                            if i.value.len() + value.len() > MAX_ITEM {
                                return Err(EngineStatus::TooBig);
                            }
                            let v = if op == StoreOp::Append {
                                [i.value.as_slice(), value.as_bytes()].concat()
                            } else {
                                [value.as_bytes(), i.value.as_slice()].concat()
                            };
                            (v, i.flags, i.expiry)
                        }
                        (_, Some(i)) if preserve => (value.clone().into_bytes(), flags, i.expiry),
                        _ => (
                            value.clone().into_bytes(),
                            flags,
                            req.expiry.to_unix_secs(now),
                        ),
                    };
                    Ok((v, fl, ex))
                })();
                match (got, expected) {
                    (Ok(info), Ok((v, fl, ex))) => {
                        let seqno = self.observe_mutation(k, &info);
                        self.m.items.insert(
                            k,
                            MItem {
                                value: v,
                                flags: fl,
                                expiry: ex,
                                cas: info.cas,
                                seqno,
                                lock_until: 0,
                                lock_cas: Cas(0),
                            },
                        );
                    }
                    (got, expected) => assert_eq!(got.err(), expected.err(), "store {op:?}"),
                }
            }
            Op::Delete { key: k, cas } => {
                let cas = self.cas_for(k, cas);
                let got = b.remove(remove_req(&self.keys[k], cas));
                self.expire_key(k);
                let expected = match self.m.items.get(&k) {
                    None => Err(EngineStatus::KeyNotFound),
                    Some(i) => self.check(i, cas),
                };
                match (got, expected) {
                    (Ok(info), Ok(())) => {
                        self.observe_mutation(k, &info);
                        self.m.items.remove(&k);
                    }
                    (got, expected) => assert_eq!(got.err(), expected.err(), "delete"),
                }
            }
            Op::Arith {
                incr,
                key: k,
                delta,
                initial,
                exp,
                cas,
            } => {
                let cas = self.cas_for(k, cas);
                let now = self.now();
                let raw = match exp {
                    None => 0xffff_ffff,
                    Some(Exp::Never) => 0,
                    Some(Exp::Rel(r)) => r,
                    Some(Exp::AbsOffset(o)) => now.saturating_add_signed(o),
                };
                let op = if incr {
                    ArithmeticOp::Increment
                } else {
                    ArithmeticOp::Decrement
                };
                let mut req = arith_req(op, &self.keys[k], delta, initial, raw);
                req.cas = cas;
                let got = b.arithmetic(req);
                self.expire_key(k);
                let expected = match self.m.items.get(&k) {
                    None if raw == 0xffff_ffff || !cas.is_any() => Err(EngineStatus::KeyNotFound),
                    None => Ok((initial, 0, Expiry::from_wire(raw).to_unix_secs(now))),
                    Some(i) => self.check(i, cas).and_then(|()| {
                        let cur = parse_counter(&i.value).ok_or(EngineStatus::DeltaBadValue)?;
                        let next = if incr {
                            cur.wrapping_add(delta)
                        } else {
                            cur.saturating_sub(delta)
                        };
                        Ok((next, i.flags, i.expiry))
                    }),
                };
                match (got, expected) {
                    (Ok((v, info)), Ok((ev, fl, ex))) => {
                        assert_eq!(v, ev);
                        let seqno = self.observe_mutation(k, &info);
                        self.m.items.insert(
                            k,
                            MItem {
                                value: ev.to_string().into_bytes(),
                                flags: fl,
                                expiry: ex,
                                cas: info.cas,
                                seqno,
                                lock_until: 0,
                                lock_cas: Cas(0),
                            },
                        );
                    }
                    (got, expected) => assert_eq!(got.err(), expected.err(), "arithmetic"),
                }
            }
            Op::Touch { key: k, exp } | Op::Gat { key: k, exp } => {
                let gat = matches!(op, Op::Gat { .. });
                let now = self.now();
                let raw = match exp {
                    Exp::Never => 0,
                    Exp::Rel(r) => r,
                    Exp::AbsOffset(o) => now.saturating_add_signed(o),
                };
                let vbid = self.vbid(k);
                let key = self.keys[k].clone();
                let got = if gat {
                    b.get_and_touch(vbid, key.as_bytes(), raw).map(|i| {
                        (
                            MutationInfo {
                                cas: i.cas,
                                vbucket_uuid: 0,
                                seqno: i.seqno,
                            },
                            Some(i),
                        )
                    })
                } else {
                    b.touch(vbid, key.as_bytes(), raw).map(|m| (m, None))
                };
                self.expire_key(k);
                let expected = match self.m.items.get(&k) {
                    None => Err(EngineStatus::KeyNotFound),
                    Some(i) if i.locked(now) => Err(EngineStatus::Locked),
                    Some(_) => Ok(()),
                };
                match (got, expected) {
                    (Ok((info, item)), Ok(())) => {
                        let seqno = self.observe_mutation(k, &info);
                        let i = self.m.items.get_mut(&k).unwrap();
                        i.expiry = Expiry::from_wire(raw).to_unix_secs(now);
                        i.cas = info.cas;
                        i.seqno = seqno;
                        i.lock_until = 0;
                        if let Some(item) = item {
                            self.expect_item(k, &item);
                            assert_eq!(item.cas, info.cas);
                        }
                    }
                    (got, expected) => assert_eq!(got.err(), expected.err(), "touch/gat"),
                }
            }
            Op::Get { key: k } => {
                let got = b.get(self.vbid(k), self.keys[k].as_bytes());
                // The borrowing read sees exactly what the copying one returned (no time
                // passes between them) and is not called on a miss.
                let mut lent = None;
                let lent_result = b.get_with(self.vbid(k), self.keys[k].as_bytes(), &mut |v| {
                    assert!(lent.is_none(), "get_with calls its callback once");
                    lent = Some((v.key.to_vec(), v.value.to_vec(), v.flags, v.cas, v.seqno));
                });
                match &got {
                    Ok(item) => {
                        assert_eq!(lent_result, Ok(()));
                        assert_eq!(
                            lent,
                            Some((
                                item.key.to_vec(),
                                item.value.to_vec(),
                                item.flags,
                                item.cas,
                                item.seqno
                            ))
                        );
                    }
                    Err(e) => {
                        assert_eq!(lent_result, Err(*e));
                        assert!(lent.is_none(), "get_with called its callback on {e:?}");
                    }
                }
                self.expire_key(k);
                match (got, self.m.items.get(&k)) {
                    (Ok(item), Some(i)) => {
                        let expected_cas = if i.locked(self.now()) {
                            Cas(u64::MAX)
                        } else {
                            i.cas
                        };
                        assert_eq!(item.cas, expected_cas);
                        self.expect_item(k, &item);
                    }
                    (Err(e), None) => assert_eq!(e, EngineStatus::KeyNotFound),
                    (got, model) => panic!("get: engine {got:?}, model {model:?}"),
                }
            }
            Op::GetLocked { key: k, timeout } => {
                let got = b.get_locked(self.vbid(k), self.keys[k].as_bytes(), timeout);
                self.expire_key(k);
                let now = self.now();
                let expected = match self.m.items.get(&k) {
                    None => Err(EngineStatus::KeyNotFound),
                    Some(i) if i.locked(now) => Err(EngineStatus::Locked),
                    Some(_) => Ok(()),
                };
                match (got, expected) {
                    (Ok(item), Ok(())) => {
                        self.observe_cas(self.vbid(k), item.cas);
                        self.expect_item(k, &item);
                        let eff = if timeout == 0 || timeout > 30 {
                            15
                        } else {
                            timeout
                        };
                        let i = self.m.items.get_mut(&k).unwrap();
                        assert_ne!(item.cas, i.cas);
                        // As KV-Engine: the lock CAS becomes the document's CAS (and stays
                        // its CAS after unlock or once the lock lapses).
                        i.cas = item.cas;
                        i.lock_until = now + eff;
                        i.lock_cas = item.cas;
                        self.m.last_lock_cas.insert(k, item.cas);
                    }
                    (got, expected) => assert_eq!(got.err(), expected.err(), "get_locked"),
                }
            }
            Op::Unlock { key: k, cas } => {
                let cas = self.cas_for(k, cas);
                let got = b.unlock(self.vbid(k), self.keys[k].as_bytes(), cas);
                self.expire_key(k);
                let now = self.now();
                let expected = match self.m.items.get(&k) {
                    None => Err(EngineStatus::KeyNotFound),
                    Some(i) if !i.locked(now) => Err(EngineStatus::NotLocked),
                    Some(i) if i.lock_cas != cas => Err(EngineStatus::Locked),
                    Some(_) => Ok(()),
                };
                assert_eq!(got, expected, "unlock");
                if expected.is_ok() {
                    self.m.items.get_mut(&k).unwrap().lock_until = 0;
                }
            }
            Op::Advance { secs } => self.f.advance(secs),
            Op::ExpiryPass => {
                let removed = b.run_expiry_pass();
                let now = self.now();
                let expired: Vec<usize> = self
                    .m
                    .items
                    .iter()
                    .filter(|(_, i)| i.expiry != 0 && i.expiry <= now)
                    .map(|(k, _)| *k)
                    .collect();
                assert_eq!(removed, expired.len(), "expiry pass");
                for k in expired {
                    self.m.items.remove(&k);
                    *self.m.high_seqno.entry(self.vbid(k)).or_default() += 1;
                }
            }
        }
        self.check_totals();
    }

    fn check_totals(&self) {
        let b = &self.f.bucket;
        assert_eq!(b.item_count(), self.m.items.len());
        let mem: usize = self
            .m
            .items
            .iter()
            .map(|(k, i)| StoredValue::footprint_for(self.keys[*k].len(), i.value.len()))
            .sum();
        assert_eq!(b.mem_used(), mem);
        for (vbid, seqno) in &self.m.high_seqno {
            assert_eq!(b.high_seqno(*vbid), Some(*seqno), "high seqno of {vbid}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn bucket_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        for op in ops {
            h.run(op);
        }
    }
}

#[test]
fn the_model_harness_can_tell_a_wrong_answer() {
    // Guard against a harness that accepts anything: a GET after a SET of another value
    // must disagree with a model that was not told about the SET.
    let mut h = Harness::new();
    h.run(Op::Store {
        op: StoreOp::Set,
        key: 0,
        value: "a".into(),
        flags: 0,
        exp: Exp::Never,
        preserve: false,
        cas: CasChoice::Any,
    });
    let key = h.keys[0].clone();
    let _ = h.f.bucket.store(epkv_engine_api::StoreRequest {
        value: b"b",
        datatype: Datatype::RAW,
        ..store_req(StoreOp::Set, &key, "b")
    });
    let caught =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.run(Op::Get { key: 0 })));
    assert!(caught.is_err());
    let _ = EngineClock::System;
}
