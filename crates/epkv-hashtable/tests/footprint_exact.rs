//! `StoredValue::footprint` counts exactly the bytes the item asks the allocator for once
//! its value has been shared (read) once, and 24 bytes more before: measured with a
//! counting global allocator.

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
        // Before its first read a value lacks only the shared header it is charged for.
        let header = if value_len == 0 { 0 } else { 24 };
        assert_eq!(
            (stored - before) as usize,
            expected - header,
            "key {key_len} value {value_len}"
        );
        // The first read shares the value: the header appears and the charge is exact.
        let v = table.find_for_read(
            &key,
            epkv_hashtable::TrackReference::Yes,
            epkv_hashtable::WantsDeleted::No,
            StoredValue::value_bytes,
        );
        assert_eq!(v.unwrap().len(), value_len);
        assert_eq!((live() - before) as usize, expected);
        // Later reads allocate nothing.
        let before_read = live();
        let v = table.find_for_read(
            &key,
            epkv_hashtable::TrackReference::Yes,
            epkv_hashtable::WantsDeleted::No,
            StoredValue::value_bytes,
        );
        drop(v);
        assert_eq!(live(), before_read);
        // Removing gives it all back.
        let before = live();
        drop(table.remove(&key));
        assert_eq!((before - live()) as usize, expected);
    }
}
