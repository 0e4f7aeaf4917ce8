//! The hash table against a `HashMap` model: random operation sequences must give the same
//! answers, the same item count and the same memory accounting, with and without a limit.

#![expect(
    clippy::unwrap_used,
    reason = "test helpers outside #[test] functions may panic"
)]
use epkv_hashtable::{Error, HashTable, ItemMeta, MemoryTracker, StoredValue};
use epkv_types::Cas;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone)]
enum Op {
    Insert { key: u8, value_len: usize, cas: u64 },
    Remove { key: u8 },
    Get { key: u8 },
    SetFlags { key: u8, flags: u32 },
    RemoveIfCas { key: u8, cas: u64 },
    RetainEvenCas,
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..24, 0usize..40, 0u64..8).prop_map(|(key, value_len, cas)| Op::Insert { key, value_len, cas }),
        3 => (0u8..24).prop_map(|key| Op::Remove { key }),
        3 => (0u8..24).prop_map(|key| Op::Get { key }),
        2 => (0u8..24, any::<u32>()).prop_map(|(key, flags)| Op::SetFlags { key, flags }),
        2 => (0u8..24, 0u64..8).prop_map(|(key, cas)| Op::RemoveIfCas { key, cas }),
        1 => Just(Op::RetainEvenCas),
        1 => Just(Op::Clear),
    ]
}

fn key_bytes(k: u8) -> Vec<u8> {
    // Varying key lengths so footprints differ.
    format!("key-{k}-{}", "x".repeat(usize::from(k % 5))).into_bytes()
}

fn item(key: &[u8], value_len: usize, cas: u64) -> StoredValue {
    StoredValue::new(
        key,
        &vec![b'v'; value_len],
        ItemMeta {
            cas: Cas(cas),
            ..ItemMeta::default()
        },
    )
    .unwrap()
}

fn check(table: &HashTable, model: &HashMap<Vec<u8>, StoredValue>) {
    assert_eq!(table.len(), model.len());
    let expected_mem: usize = model.values().map(StoredValue::footprint).sum();
    assert_eq!(table.mem_used(), expected_mem);
    assert_eq!(table.tracker().used(), expected_mem);
    let mut seen = 0;
    table.for_each(|sv| {
        assert_eq!(model.get(sv.key()), Some(sv));
        seen += 1;
    });
    assert_eq!(seen, model.len());
}

fn run(ops: Vec<Op>, stripes: usize, limit: usize) {
    let table = HashTable::new(stripes, Arc::new(MemoryTracker::new(limit))).unwrap();
    let mut model: HashMap<Vec<u8>, StoredValue> = HashMap::new();
    for op in ops {
        match op {
            Op::Insert {
                key,
                value_len,
                cas,
            } => {
                let k = key_bytes(key);
                let sv = item(&k, value_len, cas);
                let used: usize = model.values().map(StoredValue::footprint).sum();
                let old_fp = model.get(&k).map_or(0, StoredValue::footprint);
                let fits = used - old_fp + sv.footprint() <= limit || sv.footprint() <= old_fp;
                let got = table.insert(sv.clone());
                if fits {
                    assert_eq!(got.unwrap(), model.insert(k, sv));
                } else {
                    assert!(matches!(got, Err(Error::QuotaExceeded { .. })));
                }
            }
            Op::Remove { key } => {
                let k = key_bytes(key);
                assert_eq!(table.remove(&k), model.remove(&k));
            }
            Op::Get { key } => {
                let k = key_bytes(key);
                assert_eq!(table.get(&k).as_ref(), model.get(&k));
            }
            Op::SetFlags { key, flags } => {
                let k = key_bytes(key);
                let changed = table.with_entry(&k, |e| {
                    e.meta_mut().map(|m| {
                        m.flags = flags;
                    })
                });
                let expected = model.get_mut(&k).map(|sv| {
                    let mut meta = *sv.meta();
                    meta.flags = flags;
                    *sv = sv.clone().with_meta(meta);
                });
                assert_eq!(changed, expected);
            }
            Op::RemoveIfCas { key, cas } => {
                let k = key_bytes(key);
                let removed = table.with_entry(&k, |e| {
                    if e.get().is_some_and(|sv| sv.meta().cas == Cas(cas)) {
                        e.remove()
                    } else {
                        None
                    }
                });
                let expected = if model.get(&k).is_some_and(|sv| sv.meta().cas == Cas(cas)) {
                    model.remove(&k)
                } else {
                    None
                };
                assert_eq!(removed, expected);
            }
            Op::RetainEvenCas => {
                let before = model.len();
                model.retain(|_, sv| sv.meta().cas.0 % 2 == 0);
                assert_eq!(
                    table.retain(|sv| sv.meta().cas.0 % 2 == 0),
                    before - model.len()
                );
            }
            Op::Clear => {
                assert_eq!(table.clear(), model.len());
                model.clear();
            }
        }
        check(&table, &model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn table_matches_hashmap_model(ops in proptest::collection::vec(op(), 1..120), stripes in 1usize..9) {
        run(ops, stripes, usize::MAX);
    }

    #[test]
    fn table_matches_model_under_a_memory_limit(
        ops in proptest::collection::vec(op(), 1..120),
        stripes in 1usize..5,
        limit in 0usize..2_000,
    ) {
        run(ops, stripes, limit);
    }
}
