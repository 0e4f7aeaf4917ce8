//! The 8-bit probabilistic MFU counter (KV-Engine's `ProbabilisticCounter`): at value `c`
//! an access increments it with probability `1 / (1 + 0.012 * c^2)`, so about 65,000
//! accesses take it from 0 to 255.
//!
//! The random draw is a thread-local SplitMix64 generator (written here: a draw is an
//! addition to the state and two multiplies, cheaper than any shared or locked generator),
//! compared with a table of 256 precomputed 32-bit thresholds.

use std::cell::Cell;

/// The counter a new item starts with (KV-Engine's initial MFU under
/// `learning_age_and_mfu`, and the floor of its dynamic initial MFU).
pub const INITIAL: u8 = 4;

/// The increment factor of the counter.
const FACTOR: f64 = 0.012;

/// `THRESHOLDS[c] = 2^32 / (1 + FACTOR * c^2)`, clamped to `u32::MAX`: increment when a
/// uniform 32-bit draw is below it.
static THRESHOLDS: [u32; 256] = thresholds();

const fn thresholds() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut c = 0;
    while c < 256 {
        let cf = c as f64;
        let p = 1.0 / (1.0 + FACTOR * cf * cf);
        let v = p * 4_294_967_296.0;
        t[c] = if v >= 4_294_967_295.0 {
            u32::MAX
        } else {
            v as u32
        };
        c += 1;
    }
    t
}

thread_local! {
    static RNG: Cell<u64> = const { Cell::new(0) };
}

/// A uniform 32-bit draw from this thread's generator: SplitMix64, whose state advances
/// by one addition, so consecutive draws (one per lookup in a tight loop) wait on each
/// other for a single add; the mixing that makes the output uniform is off that chain.
#[inline]
fn draw() -> u32 {
    RNG.with(|s| {
        let mut x = s.get();
        if x == 0 {
            x = seed();
        }
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 32) as u32
    })
}

/// A non-zero per-thread seed: the std hasher's random keys over the address of a
/// thread-local (distinct per live thread; no allocation, unlike `thread::current`).
#[cold]
fn seed() -> u64 {
    use std::hash::BuildHasher;
    let addr = RNG.with(|c| std::ptr::from_ref(c) as usize);
    std::collections::hash_map::RandomState::new().hash_one(addr) | 1
}

/// Returns `c` after one access: `c + 1` with probability `1 / (1 + 0.012 c^2)`, else `c`;
/// 255 stays 255.
///
/// Branch-free (`|` and `&` on booleans, not `||` and `&&`): whether an access increments
/// is a coin toss the CPU cannot predict, and the mispredicted branch cost FindForRead
/// more than computing both outcomes does.
#[inline]
#[must_use]
pub fn next_on_access(c: u8) -> u8 {
    let inc = (draw() < THRESHOLDS[usize::from(c)]) | (c == 0);
    c + u8::from(inc & (c != u8::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_always_increments_and_max_saturates() {
        assert_eq!(next_on_access(0), 1);
        assert_eq!(next_on_access(255), 255);
        assert_eq!(THRESHOLDS[0], u32::MAX);
        assert!(THRESHOLDS[255] < THRESHOLDS[100]);
    }

    #[test]
    fn probability_matches_the_formula() {
        // At c = 10 the probability is 1 / 2.2.
        let n = 200_000;
        let hits = (0..n).filter(|_| next_on_access(10) == 11).count();
        let p = hits as f64 / f64::from(n);
        assert!((p - 1.0 / 2.2).abs() < 0.01, "p = {p}");
    }

    #[test]
    fn saturation_takes_tens_of_thousands_of_accesses() {
        let mut c = 0u8;
        let mut n = 0u32;
        while c < 255 && n < 1_000_000 {
            c = next_on_access(c);
            n += 1;
        }
        assert_eq!(c, 255);
        // KV-Engine: about 65k; allow generous randomness.
        assert!((30_000..130_000).contains(&n), "n = {n}");
    }
}
