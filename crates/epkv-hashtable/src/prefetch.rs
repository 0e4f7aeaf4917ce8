//! Cache prefetch hints for the lookup path.
//!
//! A lookup follows a chain of pointers, and on a large table every link is a cache
//! miss: stripe, slot, item. The table keeps, beside the stripes, where each stripe's
//! slots are, so the key's first slot is fetched while the stripe's lock is (see
//! `crate::slot_table::prefetch_bucket`); and the slot keeps how many cache lines its
//! item (value included, in the same allocation) spans, so that when a slot's tag
//! matches, all of the item is fetched at once instead of line after line.
//!
//! The hashtable benchmark's `GetValue` (look up, copy the 512-byte value out under the
//! lock, peers side by side) measures it: 6.3-6.7 M/s without the hints, 7.2-8.0 M/s with
//! them on one thread, when the value had an allocation of its own; see "Prefetching the
//! item and its value" in `docs/hashtable.md`.
//!
//! The prefetch intrinsic is unsafe, x86_64 only (elsewhere the hints do nothing).
//! Written here because the standard library's safe prefetch hints are not stable. (The
//! crate's other unsafe code is the item's allocation, in `stored_value.rs`.)

/// The address bits kept in a hint word; user-space addresses use at most 56 bits, even
/// with 5-level paging, so the top byte is free for a size.
pub(crate) const ADDR_BITS: u64 = (1 << 56) - 1;

/// Asks the CPU to start loading the cache line holding `addr` into every cache level.
#[inline(always)]
#[allow(unsafe_code)]
pub(crate) fn prefetch_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, whatever the address (valid,
    // unmapped or freed), and changes no memory. SSE is part of the x86_64 baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetching_any_address_is_harmless() {
        for addr in [0, 1, 4096, usize::MAX, ADDR_BITS as usize, 0xdead_beef_0000] {
            prefetch_line(addr);
        }
    }
}
