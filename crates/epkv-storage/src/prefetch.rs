//! Cache prefetch hints for the commit path.
//!
//! A commit reads, for every document, memory another thread wrote a while ago: its key
//! and value (copied into the batch's buffer) and the index slot its key lands in. Each is
//! a cache miss, and taken one after another they serialise: the CPU waits for one line
//! before it knows the address of the next. Hinting the lines a few documents ahead lets
//! those misses overlap (`cargo xtask bench flusher` has the before and after figures;
//! see `docs/benchmarks.md`, issue 22).
//!
//! The prefetch intrinsic is `unsafe` to call and the standard library's safe prefetch
//! hints are not stable, so this is written here (as `epkv-hashtable` does for its
//! lookups); it is the crate's only unsafe code besides `getrlimit` in `fd_cache.rs`.

/// The most cache lines of one byte range [`bytes`] hints (512 bytes): enough for the
/// hardware's stream prefetcher to take over on longer values.
const MAX_LINES: usize = 8;

/// Asks the CPU to start loading the cache line holding `addr` into every cache level.
#[inline(always)]
#[expect(
    unsafe_code,
    reason = "the prefetch intrinsic; stable Rust has no safe hint"
)]
pub(crate) fn line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, whatever the address (valid,
    // unmapped or freed), and changes no memory. SSE is part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Hints the cache lines of `b` (at most the first [`MAX_LINES`]).
#[inline]
pub(crate) fn bytes(b: &[u8]) {
    if b.is_empty() {
        return;
    }
    let start = b.as_ptr() as usize;
    let end = start + b.len().min(MAX_LINES * 64);
    let mut at = start & !63;
    while at < end {
        line(at);
        at += 64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hinting_any_address_or_range_is_harmless() {
        for addr in [0, 1, 4096, usize::MAX, 0xdead_beef_0000] {
            line(addr);
        }
        bytes(&[]);
        bytes(&[1, 2, 3]);
        bytes(&vec![7u8; 10_000]);
    }
}
