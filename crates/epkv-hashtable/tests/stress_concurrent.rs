//! Bounded multi-thread stress: concurrent check-and-modify through `with_entry` must lose
//! no update, and concurrent inserts, removes and visits must leave the item count and
//! memory accounting exact.

use epkv_hashtable::{HashTable, ItemMeta, MemoryTracker, StoredValue};
use epkv_types::Cas;
use std::sync::Arc;
use std::thread;

const THREADS: usize = 4;
const OPS_PER_THREAD: usize = 20_000;
const KEYS: usize = 64;

fn key(i: usize) -> Vec<u8> {
    format!("stress-{i}").into_bytes()
}

#[test]
fn concurrent_increments_lose_no_update() {
    let table = Arc::new(HashTable::unlimited(4).unwrap());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                for n in 0..OPS_PER_THREAD {
                    let k = key((n * 7 + t) % KEYS);
                    table.with_entry(&k, |e| {
                        if let Some(meta) = e.meta_mut() {
                            meta.flags += 1;
                        } else {
                            let sv = StoredValue::new(
                                &k,
                                b"counter",
                                ItemMeta {
                                    flags: 1,
                                    ..ItemMeta::default()
                                },
                            )
                            .unwrap();
                            e.insert(sv).unwrap();
                        }
                    });
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut total = 0u64;
    table.for_each(|sv| total += u64::from(sv.meta().flags));
    assert_eq!(total, (THREADS * OPS_PER_THREAD) as u64);
    assert_eq!(table.len(), KEYS);
}

#[test]
fn concurrent_churn_keeps_accounting_exact() {
    let tracker = Arc::new(MemoryTracker::unlimited());
    let table = Arc::new(HashTable::new(8, Arc::clone(&tracker)).unwrap());
    let mut handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                for n in 0..OPS_PER_THREAD {
                    let i = (n * 13 + t * 5) % (KEYS * 4);
                    let k = key(i);
                    match n % 4 {
                        0 | 1 => {
                            let sv = StoredValue::new(
                                &k,
                                &vec![b'x'; (n + t) % 100],
                                ItemMeta {
                                    cas: Cas(n as u64),
                                    ..ItemMeta::default()
                                },
                            )
                            .unwrap();
                            table.insert(sv).unwrap();
                        }
                        2 => {
                            table.remove(&k);
                        }
                        _ => {
                            if let Some(sv) = table.get(&k) {
                                assert_eq!(sv.key(), k.as_slice());
                            }
                        }
                    }
                }
            })
        })
        .collect();
    // A visitor running alongside the writers, removing a few items as it goes.
    let visitor_table = Arc::clone(&table);
    handles.push(thread::spawn(move || {
        for _ in 0..20 {
            visitor_table.retain(|sv| sv.meta().cas.0 % 11 != 0);
            let mut n = 0usize;
            visitor_table.for_each(|_| n += 1);
            assert!(n <= KEYS * 4);
        }
    }));
    for h in handles {
        h.join().unwrap();
    }
    let mut count = 0;
    let mut bytes = 0;
    table.for_each(|sv| {
        count += 1;
        bytes += sv.footprint();
    });
    assert_eq!(table.len(), count);
    assert_eq!(table.mem_used(), bytes);
    assert_eq!(tracker.used(), bytes);
}

#[test]
fn concurrent_writers_never_exceed_the_limit() {
    let one = StoredValue::footprint_for(key(0).len(), 10);
    let limit = one * 20;
    let tracker = Arc::new(MemoryTracker::new(limit));
    let table = Arc::new(HashTable::new(4, Arc::clone(&tracker)).unwrap());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = Arc::clone(&table);
            let tracker = Arc::clone(&tracker);
            thread::spawn(move || {
                for n in 0..5_000 {
                    let k = key((n * 3 + t) % 10 + t * 10);
                    let sv = StoredValue::new(&k, &[b'y'; 10], ItemMeta::default()).unwrap();
                    // Refusals are expected once the limit is reached.
                    let _ = table.insert(sv);
                    assert!(tracker.used() <= limit);
                    if n % 3 == 0 {
                        table.remove(&k);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(tracker.used() <= limit);
    assert_eq!(tracker.used(), table.mem_used());
}
