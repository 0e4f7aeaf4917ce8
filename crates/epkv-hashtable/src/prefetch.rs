//! Cache prefetch hints for the lookup path.
//!
//! A lookup follows a chain of pointers, and on a large table every link is a cache
//! miss: stripe, slot, item, value. The table keeps, beside the stripes, where each
//! stripe's slots are, so the key's first slot is fetched while the stripe's lock is (see
//! `crate::slot_table::prefetch_bucket`); and the slot keeps a [`ValueHint`], the address
//! and size of the item's value, so that when a slot's tag matches, the item and its
//! value are fetched together instead of one after the other.
//!
//! The hashtable benchmark's `GetValue` (look up, copy the 512-byte value out under the
//! lock, peers side by side) measures it: 6.3-6.7 M/s without the hints, 7.2-8.0 M/s with
//! them on one thread; see "Prefetching the item and its value" in `docs/hashtable.md`.
//!
//! This is the crate's only unsafe code: the prefetch intrinsic, x86_64 only (elsewhere
//! the hints cost their word and do nothing). Written here because the standard
//! library's safe prefetch hints are not stable.

/// How many cache lines of a value are prefetched at most (512 bytes): enough for the
/// hardware's stream prefetcher to take over on longer values.
pub(crate) const MAX_VALUE_LINES: usize = 8;

const LINE: usize = 64;
/// The address bits kept; user-space addresses use at most 56 bits, even with 5-level
/// paging. The line count goes in the top byte.
const ADDR_BITS: usize = (1 << 56) - 1;

/// Where an item's value starts and how many of its cache lines to prefetch, in one word.
///
/// A hint only, never dereferenced. The table keeps it in step with the item's value; if
/// it were ever stale, prefetching the freed memory it points at could not fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ValueHint(usize);

impl ValueHint {
    /// No value: nothing to prefetch.
    pub(crate) const NONE: Self = Self(0);

    /// The hint for `value` (`None`: no value, nothing to prefetch).
    #[inline]
    pub(crate) fn of(value: Option<&[u8]>) -> Self {
        match value {
            Some(v) if !v.is_empty() => {
                let lines = v.len().div_ceil(LINE).min(MAX_VALUE_LINES);
                Self((v.as_ptr() as usize & ADDR_BITS) | (lines << 56))
            }
            _ => Self(0),
        }
    }

    #[inline]
    fn addr(self) -> usize {
        self.0 & ADDR_BITS
    }

    #[inline]
    fn lines(self) -> usize {
        self.0 >> 56
    }

    /// Starts loading the value's first lines.
    #[inline]
    pub(crate) fn prefetch(self) {
        let addr = self.addr();
        for i in 0..self.lines() {
            prefetch_line(addr + i * LINE);
        }
    }
}

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
    fn a_hint_keeps_the_address_and_caps_the_lines() {
        let v = vec![7u8; 1000];
        let h = ValueHint::of(Some(&v));
        assert_eq!(h.addr(), v.as_ptr() as usize);
        assert_eq!(h.lines(), MAX_VALUE_LINES);
        let short = vec![1u8; 65];
        let h = ValueHint::of(Some(&short));
        assert_eq!((h.addr(), h.lines()), (short.as_ptr() as usize, 2));
        assert_eq!(ValueHint::of(Some(&[])), ValueHint::default());
        assert_eq!(ValueHint::of(None), ValueHint::default());
        h.prefetch();
    }

    #[test]
    fn prefetching_any_address_is_harmless() {
        for addr in [0, 1, 4096, usize::MAX, ADDR_BITS, 0xdead_beef_0000] {
            prefetch_line(addr);
        }
        ValueHint(usize::MAX).prefetch();
    }
}
