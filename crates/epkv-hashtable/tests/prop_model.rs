//! The hash table against a plain map model, committed and prepared versions included:
//! random operation sequences must give the same answers, the same statistics and the
//! same memory accounting, with and without a memory limit.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions may panic"
)]
use epkv_hashtable::{
    CommittedState, Error, HashTable, ItemMeta, MemoryTracker, Position, StoredValue,
    TrackReference, Visit, WantsDeleted,
};
use epkv_types::{Cas, Seqno};
use proptest::prelude::*;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

#[derive(Debug, Clone)]
enum Op {
    Set {
        key: u8,
        value_len: usize,
        cas: u64,
    },
    Tombstone {
        key: u8,
        cas: u64,
    },
    Remove {
        key: u8,
    },
    Prepare {
        key: u8,
        value_len: usize,
        cas: u64,
        maybe_visible: bool,
    },
    Commit {
        key: u8,
        cas: u64,
    },
    Convert {
        key: u8,
        cas: u64,
    },
    Abort {
        key: u8,
    },
    Read {
        key: u8,
        deleted: bool,
    },
    ReadForWrite {
        key: u8,
    },
    SetFlags {
        key: u8,
        flags: u32,
    },
    MarkClean {
        key: u8,
        cas: u64,
    },
    Evict {
        key: u8,
    },
    RetainEvenCas,
    VisitPausing {
        every: usize,
    },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u8..24, 0usize..40, 0u64..8).prop_map(|(key, value_len, cas)| Op::Set { key, value_len, cas }),
        2 => (0u8..24, 0u64..8).prop_map(|(key, cas)| Op::Tombstone { key, cas }),
        3 => (0u8..24).prop_map(|key| Op::Remove { key }),
        4 => (0u8..24, 0usize..40, 0u64..8, any::<bool>()).prop_map(|(key, value_len, cas, maybe_visible)| Op::Prepare { key, value_len, cas, maybe_visible }),
        3 => (0u8..24, 0u64..8).prop_map(|(key, cas)| Op::Commit { key, cas }),
        2 => (0u8..24, 0u64..8).prop_map(|(key, cas)| Op::Convert { key, cas }),
        2 => (0u8..24).prop_map(|key| Op::Abort { key }),
        4 => (0u8..24, any::<bool>()).prop_map(|(key, deleted)| Op::Read { key, deleted }),
        2 => (0u8..24).prop_map(|key| Op::ReadForWrite { key }),
        2 => (0u8..24, any::<u32>()).prop_map(|(key, flags)| Op::SetFlags { key, flags }),
        2 => (0u8..24, 0u64..8).prop_map(|(key, cas)| Op::MarkClean { key, cas }),
        2 => (0u8..24).prop_map(|key| Op::Evict { key }),
        1 => Just(Op::RetainEvenCas),
        1 => (1usize..5).prop_map(|every| Op::VisitPausing { every }),
        1 => Just(Op::Clear),
    ]
}

fn key_bytes(k: u8) -> Vec<u8> {
    // Varying key lengths, some longer than the inline limit, so footprints differ.
    format!("key-{k}-{}", "x".repeat(usize::from(k % 5) * 5)).into_bytes()
}

fn meta(cas: u64) -> ItemMeta {
    ItemMeta {
        cas: Cas(cas),
        by_seqno: Seqno(cas),
        ..ItemMeta::default()
    }
}

/// What the model knows of one version.
#[derive(Debug, Clone, PartialEq, Eq)]
struct V {
    value: Vec<u8>,
    meta: ItemMeta,
    state: CommittedState,
    deleted: bool,
    dirty: bool,
    resident: bool,
    key_len: usize,
}

impl V {
    fn of(sv: &StoredValue) -> Self {
        Self {
            value: sv.value().to_vec(),
            meta: *sv.meta(),
            state: sv.committed_state(),
            deleted: sv.is_deleted(),
            dirty: sv.is_dirty(),
            resident: sv.is_resident(),
            key_len: sv.key().len(),
        }
    }

    fn footprint(&self) -> usize {
        if self.resident {
            StoredValue::footprint_for(self.key_len, self.value.len())
        } else {
            StoredValue::footprint_for(self.key_len, 0)
        }
    }
}

#[derive(Default)]
struct Model {
    committed: HashMap<Vec<u8>, V>,
    prepared: HashMap<Vec<u8>, V>,
}

impl Model {
    fn used(&self) -> usize {
        self.committed
            .values()
            .chain(self.prepared.values())
            .map(V::footprint)
            .sum()
    }
}

fn check(table: &HashTable, model: &Model) {
    let s = table.stats();
    let live = model.committed.values().filter(|v| !v.deleted).count();
    assert_eq!(table.len(), live);
    assert_eq!(s.items, live);
    assert_eq!(s.deleted, model.committed.len() - live);
    assert_eq!(s.prepared, model.prepared.len());
    assert_eq!(
        s.non_resident,
        model
            .committed
            .values()
            .filter(|v| !v.deleted && !v.resident)
            .count()
    );
    assert_eq!(
        s.dirty,
        model
            .committed
            .values()
            .chain(model.prepared.values())
            .filter(|v| v.dirty)
            .count()
    );
    assert_eq!(s.mem_bytes, model.used());
    assert_eq!(table.tracker().used(), model.used());
    // The MFU histogram equals a scan of the live resident committed items.
    let mut hist = [0u64; 256];
    let mut seen = 0;
    table.visit(Position::START, |item| {
        let (Some(sv), Some(mfu)) = (item.item(), item.mfu()) else {
            panic!("a visited item is there until removed");
        };
        assert_eq!(model.committed.get(sv.key()), Some(&V::of(sv)), "{sv:?}");
        if !sv.is_deleted() && sv.is_resident() {
            hist[usize::from(mfu)] += 1;
        }
        seen += 1;
        Visit::Continue
    });
    assert_eq!(seen, model.committed.len());
    assert_eq!(*s.mfu_histogram, hist);
    let mut prepared = 0;
    table.for_each_prepared(|sv| {
        assert_eq!(model.prepared.get(sv.key()), Some(&V::of(sv)));
        prepared += 1;
    });
    assert_eq!(prepared, model.prepared.len());
}

fn fits(model: &Model, limit: usize, old: usize, new: usize) -> bool {
    new <= old || model.used() - old + new <= limit
}

fn run(ops: Vec<Op>, stripes: usize, limit: usize) {
    let table = HashTable::new(stripes, Arc::new(MemoryTracker::new(limit))).unwrap();
    let mut model = Model::default();
    for op in ops {
        match op {
            Op::Set {
                key,
                value_len,
                cas,
            } => {
                let k = key_bytes(key);
                let sv = StoredValue::new(&k, &vec![b'v'; value_len], meta(cas)).unwrap();
                let old = model.committed.get(&k).map_or(0, V::footprint);
                let ok = fits(&model, limit, old, sv.footprint());
                let v = V::of(&sv);
                let got = table.insert(sv);
                if ok {
                    assert_eq!(
                        got.unwrap().map(|o| V::of(&o)),
                        model.committed.insert(k, v)
                    );
                } else {
                    assert!(matches!(got, Err(Error::QuotaExceeded { .. })));
                }
            }
            Op::Tombstone { key, cas } => {
                let k = key_bytes(key);
                let sv = StoredValue::new_deleted(&k, meta(cas)).unwrap();
                let old = model.committed.get(&k).map_or(0, V::footprint);
                let ok = fits(&model, limit, old, sv.footprint());
                let v = V::of(&sv);
                let got = table.with_entry(&k, |e| e.insert(sv));
                if ok {
                    assert_eq!(
                        got.unwrap().map(|o| V::of(&o)),
                        model.committed.insert(k, v)
                    );
                } else {
                    assert!(got.is_err());
                }
            }
            Op::Remove { key } => {
                let k = key_bytes(key);
                assert_eq!(
                    table.remove(&k).map(|o| V::of(&o)),
                    model.committed.remove(&k)
                );
            }
            Op::Prepare {
                key,
                value_len,
                cas,
                maybe_visible,
            } => {
                let k = key_bytes(key);
                let state = if maybe_visible {
                    CommittedState::PreparedMaybeVisible
                } else {
                    CommittedState::Pending
                };
                let sv = StoredValue::new(&k, &vec![b'p'; value_len], meta(cas))
                    .unwrap()
                    .with_state(state);
                let old = model.prepared.get(&k).map_or(0, V::footprint);
                let ok = fits(&model, limit, old, sv.footprint());
                let v = V::of(&sv);
                let got = table.insert(sv);
                if ok {
                    assert_eq!(got.unwrap().map(|o| V::of(&o)), model.prepared.insert(k, v));
                } else {
                    assert!(got.is_err());
                }
            }
            Op::Commit { key, cas } => {
                let k = key_bytes(key);
                let got = table.with_entry(&k, |e| e.commit_prepared(meta(cas)));
                match model.prepared.get(&k).cloned() {
                    None => assert_eq!(got, Err(Error::NotFound)),
                    Some(p) => {
                        let mut c = p.clone();
                        c.state = CommittedState::CommittedViaPrepare;
                        c.meta = meta(cas);
                        let old = model.committed.get(&k).map_or(0, V::footprint);
                        // The new committed version is charged before the prepare is freed.
                        if fits(&model, limit, old, c.footprint()) {
                            assert_eq!(
                                got.unwrap().map(|o| V::of(&o)),
                                model.committed.insert(k.clone(), c)
                            );
                            model.prepared.remove(&k);
                        } else {
                            assert!(got.is_err());
                        }
                    }
                }
            }
            Op::Convert { key, cas } => {
                // Never refused for memory: the prepare's charge carries over.
                let k = key_bytes(key);
                let got = table.with_entry(&k, |e| e.convert_prepared(meta(cas)));
                match model.prepared.remove(&k) {
                    None => assert_eq!(got, Err(Error::NotFound)),
                    Some(mut c) => {
                        c.state = CommittedState::CommittedViaPrepare;
                        c.meta = meta(cas);
                        assert_eq!(
                            got.unwrap().map(|o| V::of(&o)),
                            model.committed.insert(k.clone(), c)
                        );
                    }
                }
            }
            Op::Abort { key } => {
                let k = key_bytes(key);
                let got = table.with_entry(&k, |e| e.remove_prepared());
                assert_eq!(got.map(|o| V::of(&o)), model.prepared.remove(&k));
            }
            Op::Read { key, deleted } => {
                let k = key_bytes(key);
                let wants = if deleted {
                    WantsDeleted::Yes
                } else {
                    WantsDeleted::No
                };
                let got = table.find_for_read(&k, TrackReference::Yes, wants, V::of);
                let expected = match model.prepared.get(&k) {
                    Some(p) if p.state == CommittedState::PreparedMaybeVisible => Some(p.clone()),
                    _ => model
                        .committed
                        .get(&k)
                        .filter(|c| deleted || !c.deleted)
                        .cloned(),
                };
                assert_eq!(got, expected);
            }
            Op::ReadForWrite { key } => {
                let k = key_bytes(key);
                let got = table.find_for_write(&k, V::of);
                let expected = match model.prepared.get(&k) {
                    Some(p) if p.state.is_in_flight() => Some(p.clone()),
                    _ => model.committed.get(&k).cloned(),
                };
                assert_eq!(got, expected);
            }
            Op::SetFlags { key, flags } => {
                let k = key_bytes(key);
                let changed = table.with_entry(&k, |e| e.meta_mut().map(|m| m.flags = flags));
                let expected = model.committed.get_mut(&k).map(|v| v.meta.flags = flags);
                assert_eq!(changed, expected);
            }
            Op::MarkClean { key, cas } => {
                let k = key_bytes(key);
                let got = table.with_entry(&k, |e| e.mark_clean(Seqno(cas)));
                let expected = match model.committed.get_mut(&k) {
                    Some(v) if v.meta.by_seqno == Seqno(cas) && v.dirty => {
                        v.dirty = false;
                        true
                    }
                    _ => false,
                };
                assert_eq!(got, expected);
            }
            Op::Evict { key } => {
                let k = key_bytes(key);
                let got = table.with_entry(&k, |e| e.evict_value());
                let expected = match model.committed.get_mut(&k) {
                    Some(v) if !v.deleted && !v.dirty && v.resident => {
                        v.resident = false;
                        v.value.clear();
                        true
                    }
                    _ => false,
                };
                assert_eq!(got, expected);
            }
            Op::RetainEvenCas => {
                let before = model.committed.len();
                model.committed.retain(|_, v| v.meta.cas.0 % 2 == 0);
                assert_eq!(
                    table.retain(|sv| sv.meta().cas.0 % 2 == 0),
                    before - model.committed.len()
                );
            }
            Op::VisitPausing { every } => {
                // Pause every `every` items and resume: every committed item is seen once.
                let mut seen = BTreeSet::new();
                let mut pos = Some(Position::START);
                let mut rounds = 0;
                while let Some(p) = pos {
                    let mut n = 0;
                    pos = table.visit(p, |item| {
                        assert!(seen.insert(item.item().unwrap().key().to_vec()));
                        n += 1;
                        if n == every {
                            Visit::Pause
                        } else {
                            Visit::Continue
                        }
                    });
                    rounds += 1;
                    assert!(rounds <= model.committed.len() + 1);
                }
                let expected: BTreeSet<Vec<u8>> = model.committed.keys().cloned().collect();
                assert_eq!(seen, expected);
            }
            Op::Clear => {
                assert_eq!(table.clear(), model.committed.len());
                model.committed.clear();
                model.prepared.clear();
            }
        }
        check(&table, &model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn table_matches_map_model(ops in proptest::collection::vec(op(), 1..150), stripes in 1usize..9) {
        run(ops, stripes, usize::MAX);
    }

    #[test]
    fn table_matches_model_under_a_memory_limit(
        ops in proptest::collection::vec(op(), 1..150),
        stripes in 1usize..5,
        limit in 0usize..3_000,
    ) {
        run(ops, stripes, limit);
    }
}

#[test]
fn many_keys_grow_then_shrink_every_stripe() {
    let t = HashTable::unlimited(3).unwrap();
    for i in 0..5_000u32 {
        t.insert(StoredValue::new(i.to_string().as_bytes(), b"v", meta(u64::from(i))).unwrap())
            .unwrap();
    }
    let grown = t.stats();
    assert_eq!(grown.items, 5_000);
    for i in 0..5_000u32 {
        assert!(t.get(i.to_string().as_bytes()).is_some());
    }
    for i in 0..4_950u32 {
        t.remove(i.to_string().as_bytes()).unwrap();
    }
    let shrunk = t.stats();
    assert_eq!(shrunk.items, 50);
    assert!(
        shrunk.resizes > grown.resizes,
        "removals shrink sparse stripes"
    );
    assert!(
        shrunk.table_bytes < grown.table_bytes / 10,
        "{shrunk:?} vs {grown:?}"
    );
    for i in 4_950..5_000u32 {
        assert!(t.get(i.to_string().as_bytes()).is_some());
    }
}

#[test]
fn a_visit_paused_across_resizes_still_sees_every_item() {
    let t = HashTable::unlimited(2).unwrap();
    let key = |i: u32| format!("v-{i}").into_bytes();
    for i in 0..200u32 {
        t.insert(StoredValue::new(&key(i), b"v", meta(u64::from(i))).unwrap())
            .unwrap();
    }
    let mut seen = BTreeSet::new();
    let mut pos = Some(Position::START);
    let mut step = 0u32;
    while let Some(p) = pos {
        let mut n = 0;
        pos = t.visit(p, |item| {
            seen.insert(item.item().unwrap().key().to_vec());
            n += 1;
            if n == 10 {
                Visit::Pause
            } else {
                Visit::Continue
            }
        });
        // During every pause, grow (and later shrink) the stripes so buckets move.
        step += 1;
        let base = 10_000 + step * 300;
        for i in base..base + 300 {
            t.insert(StoredValue::new(&key(i), b"x", meta(0)).unwrap())
                .unwrap();
        }
        if step.is_multiple_of(3) {
            for i in 10_000..base + 300 {
                t.remove(&key(i));
            }
        }
        assert!(step < 1_000, "the visit must end");
    }
    for i in 0..200u32 {
        assert!(
            seen.contains(&key(i)),
            "item {i} present for the whole visit was missed"
        );
    }
    assert!(t.stats().resizes > 4);
}
