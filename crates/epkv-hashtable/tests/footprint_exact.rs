//! `StoredValue::footprint` counts exactly the bytes the item asks the allocator for:
//! measured with a counting global allocator.

use epkv_hashtable::{HashTable, ItemMeta, StoredValue};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: same layout contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::SeqCst);
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
        let before = LIVE.load(Ordering::SeqCst);
        let sv = StoredValue::new(&key, &value, ItemMeta::default()).unwrap();
        table.insert(sv).unwrap();
        let after = LIVE.load(Ordering::SeqCst);
        let after_stats = table.stats();
        assert_eq!(
            after_stats.table_bytes, before_stats.table_bytes,
            "no resize"
        );
        let expected = StoredValue::footprint_for(key_len, value_len);
        assert_eq!(
            (after - before) as usize,
            expected,
            "key {key_len} value {value_len}"
        );
        assert_eq!(after_stats.mem_bytes - before_stats.mem_bytes, expected);
        // Reading the value shares it: no allocation.
        let before = LIVE.load(Ordering::SeqCst);
        let v = table.find_for_read(
            &key,
            epkv_hashtable::TrackReference::Yes,
            epkv_hashtable::WantsDeleted::No,
            StoredValue::value_bytes,
        );
        assert_eq!(v.unwrap().len(), value_len);
        assert_eq!(LIVE.load(Ordering::SeqCst), before);
        // Removing gives it all back.
        let before = LIVE.load(Ordering::SeqCst);
        drop(table.remove(&key));
        assert_eq!((before - LIVE.load(Ordering::SeqCst)) as usize, expected);
    }
}
