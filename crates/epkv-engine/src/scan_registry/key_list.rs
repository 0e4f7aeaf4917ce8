//! [`KeyList`]: a scan's keys, sorted, in one buffer: what a scan holds for its whole
//! life, so its memory is the keys' bytes plus four bytes of offset per key.

use epkv_engine_api::ScanBound;
use rand::SeedableRng;

/// Sorted, distinct raw keys (without their collection) packed end to end.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct KeyList {
    /// The keys' bytes, in key order.
    bytes: Vec<u8>,
    /// Where each key ends in `bytes`.
    ends: Vec<u32>,
}

impl KeyList {
    /// Packs `keys` (any order, duplicates allowed) into a sorted list of distinct keys.
    pub(crate) fn from_unsorted(mut keys: Vec<Vec<u8>>) -> Self {
        keys.sort_unstable();
        keys.dedup();
        let mut list = Self {
            bytes: Vec::with_capacity(keys.iter().map(Vec::len).sum()),
            ends: Vec::with_capacity(keys.len()),
        };
        for k in keys {
            list.bytes.extend_from_slice(&k);
            // Scans refuse more key bytes than fit in u32 long before (see the limits).
            list.ends
                .push(u32::try_from(list.bytes.len()).unwrap_or(u32::MAX));
        }
        list
    }

    /// The number of keys.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether there is no key.
    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The memory the list holds, in bytes.
    pub(crate) fn footprint(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * std::mem::size_of::<u32>()
    }

    /// Key `i`, if there is one.
    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        let end = usize::try_from(*self.ends.get(i)?).ok()?;
        let start = match i.checked_sub(1) {
            Some(p) => usize::try_from(*self.ends.get(p)?).ok()?,
            None => 0,
        };
        self.bytes.get(start..end)
    }
}

/// Whether `key` lies between `start` and `end`.
pub(crate) fn in_range(key: &[u8], start: &ScanBound, end: &ScanBound) -> bool {
    let after_start = match start {
        ScanBound::Inclusive(s) => key >= s.as_slice(),
        ScanBound::Exclusive(s) => key > s.as_slice(),
    };
    let before_end = match end {
        ScanBound::Inclusive(e) => key <= e.as_slice(),
        ScanBound::Exclusive(e) => key < e.as_slice(),
    };
    after_start && before_end
}

/// Draws `min(samples, keys.len())` of `keys` at random with a generator seeded by
/// `seed` (the same keys and seed draw the same sample), keeping their order.
pub(crate) fn sample(keys: Vec<Vec<u8>>, samples: u64, seed: u32) -> Vec<Vec<u8>> {
    let n = keys.len();
    let want = usize::try_from(samples).unwrap_or(usize::MAX);
    if want >= n {
        return keys;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(u64::from(seed));
    let mut picked = rand::seq::index::sample(&mut rng, n, want).into_vec();
    picked.sort_unstable();
    let mut keep = vec![false; n];
    for i in picked {
        keep[i] = true;
    }
    keys.into_iter()
        .zip(keep)
        .filter_map(|(k, keep)| keep.then_some(k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(ks: &[&str]) -> Vec<Vec<u8>> {
        ks.iter().map(|k| k.as_bytes().to_vec()).collect()
    }

    #[test]
    fn a_list_is_sorted_and_distinct() {
        let l = KeyList::from_unsorted(keys(&["c", "a", "bb", "a", ""]));
        let got: Vec<&[u8]> = (0..l.len()).map(|i| l.get(i).unwrap()).collect();
        assert_eq!(got, vec![&b""[..], b"a", b"bb", b"c"]);
        assert_eq!(l.get(4), None);
        assert!(!l.is_empty());
        assert!(l.footprint() >= 4 + 4 * 4);
        assert!(KeyList::from_unsorted(Vec::new()).is_empty());
    }

    #[test]
    fn bounds_include_or_exclude_their_key() {
        let i = |k: &str| ScanBound::Inclusive(k.as_bytes().to_vec());
        let x = |k: &str| ScanBound::Exclusive(k.as_bytes().to_vec());
        assert!(in_range(b"b", &i("b"), &i("b")));
        assert!(!in_range(b"b", &x("b"), &i("c")));
        assert!(!in_range(b"c", &i("b"), &x("c")));
        assert!(in_range(b"bz", &x("b"), &x("c")));
        assert!(!in_range(b"a", &i("b"), &i("c")));
    }

    #[test]
    fn a_sample_is_the_size_asked_for_and_repeatable() {
        let all: Vec<Vec<u8>> = (0..100).map(|i| format!("k{i:03}").into_bytes()).collect();
        let s1 = sample(all.clone(), 10, 7);
        assert_eq!(s1.len(), 10);
        assert!(s1.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s1, sample(all.clone(), 10, 7));
        assert_ne!(s1, sample(all.clone(), 10, 8));
        assert_eq!(sample(all.clone(), 100, 1), all);
        assert_eq!(sample(all.clone(), 1000, 1), all);
    }
}
