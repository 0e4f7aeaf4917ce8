//! `StoredValue::footprint` counts exactly the bytes the item asks the allocator for, from
//! its insertion through reads and eviction to its removal: measured with a counting
//! global allocator.

use epkv_hashtable::{HashTable, ItemMeta, StoredValue};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed by this thread (other threads, such as the test
    /// harness's, must not disturb the measurement).
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn live() -> isize {
    LIVE.with(Cell::get)
}

fn count(delta: isize) {
    // `try_with`: the thread-local may be gone while the thread exits.
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
}

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: same layout contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: same layout contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn footprint_is_what_the_allocator_is_asked_for() {
    let table = HashTable::unlimited(1).unwrap();
    // Pre-size the stripe so the measurement sees no table growth.
    for i in 0..64u32 {
        table
            .insert(StoredValue::new(&i.to_be_bytes(), b"", ItemMeta::default()).unwrap())
            .unwrap();
    }
    table.clear();
    for (key_len, value_len) in [(20usize, 512usize), (5, 0), (22, 1), (23, 100), (200, 4096)] {
        let key = vec![b'k'; key_len];
        let value = vec![b'v'; value_len];
        let table = HashTable::unlimited(1).unwrap();
        // Warm the stripe's arrays and MFU histogram with one item, then measure another.
        table
            .insert(StoredValue::new(b"warm", b"x", ItemMeta::default()).unwrap())
            .unwrap();
        let before_stats = table.stats();
        let before = live();
        let sv = StoredValue::new(&key, &value, ItemMeta::default()).unwrap();
        table.insert(sv).unwrap();
        let stored = live();
        let after_stats = table.stats();
        assert_eq!(
            after_stats.table_bytes, before_stats.table_bytes,
            "no resize"
        );
        let expected = StoredValue::footprint_for(key_len, value_len);
        assert_eq!(after_stats.mem_bytes - before_stats.mem_bytes, expected);
        drop(after_stats);
        assert_eq!(
            (stored - before) as usize,
            expected,
            "key {key_len} value {value_len}"
        );
        // Reads that borrow the value allocate nothing.
        let before_read = live();
        let v = table.find_for_read(
            &key,
            epkv_hashtable::TrackReference::Yes,
            epkv_hashtable::WantsDeleted::No,
            |sv| sv.value().len(),
        );
        assert_eq!(v, Some(value_len));
        assert_eq!(live(), before_read);
        // Ejecting the value gives back exactly its bytes, and the charge follows.
        let before_evict = live();
        let evicted = table.with_entry(&key, |e| {
            let seqno = e.get().expect("there").meta().by_seqno;
            assert!(e.mark_clean(seqno));
            e.evict_value()
        });
        assert!(evicted);
        assert_eq!((before_evict - live()) as usize, value_len);
        assert_eq!(
            table.stats().mem_bytes - before_stats.mem_bytes,
            StoredValue::footprint_for(key_len, 0)
        );
        let expected = StoredValue::footprint_for(key_len, 0);
        // Removing gives it all back.
        let before = live();
        drop(table.remove(&key));
        assert_eq!((before - live()) as usize, expected);
    }
}
