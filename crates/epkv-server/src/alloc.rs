//! The server's global allocator: mimalloc, called so that small blocks are not rounded up.
//!
//! `mimalloc::MiMalloc` passes every Rust allocation to `mi_malloc_aligned(size, align)`.
//! In mimalloc 3 that call over-allocates `size + align - 1` whenever its current page for
//! the size class is used up (unless the class is a power of two), so the hash table's
//! 96-byte items mostly land in 112-byte blocks. Every mimalloc block is at least 8-byte
//! aligned, so layouts with an alignment of 8 or less go to plain `mi_malloc` /
//! `mi_zalloc` / `mi_realloc`; larger alignments keep the aligned calls. Measured with
//! `cargo xtask bench hashtable Memory` (20-byte keys, 512-byte values, usable size of
//! every live block): 670 bytes per item through `MiMalloc`, 654 through this.
//!
//! Why mimalloc at all: every SET allocates and frees item memory on the worker threads,
//! and glibc's per-thread arenas grew and trimmed their heaps with an mprotect call every
//! ~60 operations under memaslap (measured with strace -c).

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// Alignment every mimalloc block has whatever call made it.
const MIMALLOC_MIN_ALIGN: usize = 8;

/// mimalloc, with the plain (unaligned) entry points for alignments it always meets.
pub(crate) struct EpkvAlloc;

// SAFETY: every method forwards to mimalloc. The plain entry points are used only when the
// requested alignment is at most 8, which every mimalloc block satisfies; blocks from either
// family are freed and resized by `mi_free` / `mi_realloc*`, which accept both.
unsafe impl GlobalAlloc for EpkvAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIMALLOC_MIN_ALIGN {
            // SAFETY: returns null or a block of at least `size` bytes, 8-aligned.
            unsafe { libmimalloc_sys::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: the caller's layout, forwarded.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIMALLOC_MIN_ALIGN {
            // SAFETY: as `alloc`, zero-filled.
            unsafe { libmimalloc_sys::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: the caller's layout, forwarded.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` is a live block from this allocator (the caller's contract).
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MIMALLOC_MIN_ALIGN {
            // SAFETY: `ptr` is a live mimalloc block; the result keeps 8-byte alignment.
            unsafe { libmimalloc_sys::mi_realloc(ptr.cast::<c_void>(), new_size).cast() }
        } else {
            // SAFETY: the caller's arguments, forwarded.
            unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_sized_and_reusable() {
        let a = EpkvAlloc;
        for (size, align) in [(1, 1), (7, 8), (96, 8), (100, 16), (4096, 64), (24, 4)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero sizes; every block is freed with its layout.
            unsafe {
                let p = a.alloc_zeroed(layout);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0, "{size}/{align}");
                assert!(std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0));
                p.write_bytes(0xab, size);
                let q = a.realloc(p, layout, size * 3);
                assert!(!q.is_null());
                assert_eq!(q as usize % align, 0);
                assert!(
                    std::slice::from_raw_parts(q, size)
                        .iter()
                        .all(|&b| b == 0xab)
                );
                a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
            }
        }
    }
}
