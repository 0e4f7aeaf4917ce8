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

/// Writers commit and abort SyncWrites and churn plain writes while readers check what
/// they may see and a paused-and-resumed visitor walks the table; afterwards the
/// statistics equal a full scan.
#[test]
fn concurrent_sync_writes_keep_invariants() {
    use epkv_hashtable::{CommittedState, Position, TrackReference, Visit, WantsDeleted};
    let tracker = Arc::new(MemoryTracker::unlimited());
    let table = Arc::new(HashTable::new(4, Arc::clone(&tracker)).unwrap());
    let mut handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                for n in 0..OPS_PER_THREAD / 2 {
                    let k = key((n * 5 + t) % KEYS);
                    match (n + t) % 6 {
                        0 => {
                            let sv = StoredValue::new(&k, b"p", ItemMeta::default())
                                .unwrap()
                                .with_state(CommittedState::Pending);
                            table.insert(sv).unwrap();
                        }
                        1 => {
                            let _ =
                                table.with_entry(&k, |e| e.commit_prepared(ItemMeta::default()));
                        }
                        2 => {
                            table.with_entry(&k, |e| e.remove_prepared());
                        }
                        3 => {
                            table
                                .insert(StoredValue::new(&k, b"c", ItemMeta::default()).unwrap())
                                .unwrap();
                        }
                        4 => {
                            // A reader never sees a pending prepare.
                            let v = table.find_for_read(
                                &k,
                                TrackReference::Yes,
                                WantsDeleted::No,
                                |sv| sv.is_committed(),
                            );
                            assert_ne!(v, Some(false));
                        }
                        _ => {
                            table.with_entry(&k, |e| {
                                assert!(e.committed().is_none_or(|c| c.is_committed()));
                                assert!(e.prepared().is_none_or(|p| p.is_prepared()));
                                if n % 12 == 5 {
                                    e.remove();
                                }
                            });
                        }
                    }
                }
            })
        })
        .collect();
    let visitor_table = Arc::clone(&table);
    handles.push(thread::spawn(move || {
        for _ in 0..50 {
            let mut pos = Some(Position::START);
            let mut n = 0;
            while let Some(p) = pos {
                pos = visitor_table.visit(p, |item| {
                    assert!(item.item().unwrap().is_committed());
                    n += 1;
                    if n % 7 == 0 {
                        Visit::Pause
                    } else {
                        Visit::Continue
                    }
                });
            }
        }
    }));
    for h in handles {
        h.join().unwrap();
    }
    let s = table.stats();
    let (mut items, mut bytes, mut hist) = (0, 0, [0u64; 256]);
    table.visit(Position::START, |item| {
        let (Some(sv), Some(mfu)) = (item.item(), item.mfu()) else {
            panic!("a visited item is there until removed");
        };
        items += 1;
        bytes += sv.footprint();
        hist[usize::from(mfu)] += 1;
        Visit::Continue
    });
    let mut prepared = 0;
    table.for_each_prepared(|sv| {
        prepared += 1;
        bytes += sv.footprint();
    });
    assert_eq!((s.items, s.prepared, s.mem_bytes), (items, prepared, bytes));
    assert_eq!(tracker.used(), bytes);
    assert_eq!(*s.mfu_histogram, hist);
}

/// Stripes grow and shrink while other threads read and write: no key a thread owns is
/// ever lost or duplicated.
#[test]
fn resize_under_concurrent_access_loses_nothing() {
    let table = Arc::new(HashTable::unlimited(2).unwrap());
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                for round in 0..3 {
                    // Fill far past the initial size (many growths), check, then empty
                    // (shrinks), checking the keys that remain.
                    for i in 0..4_000 {
                        let k = format!("r-{t}-{i}").into_bytes();
                        let sv = StoredValue::new(&k, b"v", ItemMeta::default()).unwrap();
                        assert!(table.insert(sv).unwrap().is_none(), "round {round}");
                    }
                    for i in 0..4_000 {
                        let k = format!("r-{t}-{i}").into_bytes();
                        assert!(table.get(&k).is_some());
                    }
                    for i in 0..3_990 {
                        let k = format!("r-{t}-{i}").into_bytes();
                        assert!(table.remove(&k).is_some());
                    }
                    for i in 3_990..4_000 {
                        let k = format!("r-{t}-{i}").into_bytes();
                        assert!(table.remove(&k).is_some());
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = table.stats();
    assert_eq!((s.items, s.mem_bytes), (0, 0));
    assert!(s.resizes > 10, "{s:?}");
}
