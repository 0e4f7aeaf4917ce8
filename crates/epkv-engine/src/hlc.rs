//! Hybrid logical clock CAS generation (KV-Engine `hlc.h`).
//!
//! A CAS is the wall clock in nanoseconds with the low 16 bits zeroed, as long as that is
//! above every CAS the vBucket has handed out; otherwise (the clock stalled or went back,
//! or many mutations fell in one 65 µs tick) it is the previous maximum plus one. CAS values
//! of one vBucket therefore strictly increase, and their top 48 bits approximate the time
//! of the mutation.

/// Mask that clears the low 16 bits of a nanosecond reading.
const PHYSICAL_MASK: u64 = !0xffff;

/// Returns the next CAS after `max_cas` for a wall clock reading of `now_nanos`.
/// The result is strictly greater than `max_cas` (saturating at `u64::MAX - 1`, a value
/// the clock reaches in the year 2554; `u64::MAX` is reserved for "locked").
#[must_use]
pub(crate) fn next_cas(max_cas: u64, now_nanos: u64) -> u64 {
    let physical = now_nanos & PHYSICAL_MASK;
    if physical > max_cas {
        physical
    } else {
        max_cas.saturating_add(1).min(u64::MAX - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_time_mode_zeroes_low_bits() {
        assert_eq!(next_cas(0, 0x1_2345_6789), 0x1_2345_0000);
    }

    #[test]
    fn logical_mode_when_clock_does_not_advance() {
        let first = next_cas(0, 0x10_0000);
        let second = next_cas(first, 0x10_0000);
        let third = next_cas(second, 0x0f_0000);
        assert_eq!(second, first + 1);
        assert_eq!(third, first + 2);
        // The clock catching up switches back to real time.
        assert_eq!(next_cas(third, 0x20_0000), 0x20_0000);
    }

    #[test]
    fn never_zero_and_never_the_locked_marker() {
        assert_eq!(next_cas(0, 0), 1);
        assert_eq!(next_cas(u64::MAX - 1, 5), u64::MAX - 1);
    }
}
