//! A hierarchical timing wheel (Varghese & Lauck, "Hashed and Hierarchical Timing Wheels",
//! 1987), laid out as tokio's time driver lays out its wheel: [`LEVELS`] levels of
//! [`SLOTS`] slots, level `n` slots spanning `SLOTS^n` ticks, an occupancy bitmap per level
//! so the next non-empty slot is found with one `trailing_zeros`.
//!
//! The wheel is a plain single-threaded structure; the executor keeps one per worker thread
//! behind a mutex (a timer shard) and never removes entries from it. Re-arming a task stores
//! the new deadline in the task and leaves the old entry where it is; when the old entry's
//! slot comes round the executor looks at the task again (see `core.rs`). So insert and
//! expiry are O(1) and there is no `remove` at all.
//!
//! Time is counted in ticks (see [`TICK_SHIFT`]); an entry inserted for tick `at` is handed
//! out by the first [`Wheel::poll`] whose `now` is at least `at`, never earlier.

/// log2 of the slots per level.
const SLOT_BITS: u32 = 6;
/// Slots per level: 64, so one `u64` is a level's occupancy bitmap (as in tokio).
pub(crate) const SLOTS: usize = 1 << SLOT_BITS;
/// Levels: six levels of 64 slots cover 2^36 ticks, about 2.2 years at the 1.05 ms tick.
pub(crate) const LEVELS: usize = 6;
/// The furthest ahead an entry is filed, in ticks. Entries further out are filed at this
/// distance and cascaded again when their slot comes round. Half the wheel's span keeps the
/// top level from wrapping onto the slot that is current.
pub(crate) const MAX_FILE_DISTANCE: u64 = 1 << (SLOT_BITS * LEVELS as u32 - 1);
/// A tick is 2^20 ns (1.048576 ms): the timer resolution. Millisecond resolution is what
/// KV-Engine's folly backend gets from its HHWheelTimer, and a power of two turns the
/// nanosecond-to-tick conversion into a shift.
pub(crate) const TICK_SHIFT: u32 = 20;

/// The hierarchical wheel. `T` is the entry payload (a task reference in the executor).
#[derive(Debug)]
pub(crate) struct Wheel<T> {
    /// The tick up to which the wheel has been polled; entries at or before it are due.
    elapsed: u64,
    levels: Vec<Level<T>>,
    /// Entries inserted at or before `elapsed`, handed out by the next poll.
    overdue: Vec<(u64, T)>,
    len: usize,
}

#[derive(Debug)]
struct Level<T> {
    /// Bit `s` set when slot `s` is non-empty.
    occupied: u64,
    slots: Vec<Vec<(u64, T)>>,
}

/// The next slot to expire: where it is and the tick at which it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Expiration {
    level: usize,
    slot: usize,
    deadline: u64,
}

fn slot_range(level: usize) -> u64 {
    1u64 << (SLOT_BITS * level as u32)
}

fn level_range(level: usize) -> u64 {
    1u64 << (SLOT_BITS * (level as u32 + 1))
}

/// The level an entry for tick `at` belongs to, seen from `elapsed`: the level whose slot
/// bits hold the most significant bit in which the two differ.
fn level_for(elapsed: u64, at: u64) -> usize {
    let masked = (elapsed ^ at) | (SLOTS as u64 - 1);
    let significant = 63 - masked.leading_zeros();
    ((significant / SLOT_BITS) as usize).min(LEVELS - 1)
}

impl<T> Level<T> {
    fn new() -> Self {
        Self {
            occupied: 0,
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
        }
    }

    fn next_expiration(&self, level: usize, now: u64) -> Option<Expiration> {
        if self.occupied == 0 {
            return None;
        }
        let now_slot = ((now >> (SLOT_BITS * level as u32)) & (SLOTS as u64 - 1)) as u32;
        let rotated = self.occupied.rotate_right(now_slot);
        let slot = ((rotated.trailing_zeros() + now_slot) as usize) & (SLOTS - 1);
        let level_start = now & !(level_range(level) - 1);
        let mut deadline = level_start + slot as u64 * slot_range(level);
        if deadline <= now && level > 0 {
            // Only the top level wraps: its slots form a ring that entries filed up to
            // MAX_FILE_DISTANCE ahead go round once.
            deadline += level_range(level);
        }
        Some(Expiration {
            level,
            slot,
            deadline,
        })
    }
}

impl<T> Wheel<T> {
    /// Creates an empty wheel whose time starts at tick `elapsed`.
    pub(crate) fn new(elapsed: u64) -> Self {
        Self {
            elapsed,
            levels: (0..LEVELS).map(|_| Level::new()).collect(),
            overdue: Vec::new(),
            len: 0,
        }
    }

    /// The tick the wheel has been polled up to.
    pub(crate) fn elapsed(&self) -> u64 {
        self.elapsed
    }

    /// Entries held, stale ones included.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Files `item` for tick `at`. An entry at or before the wheel's current tick is handed
    /// out by the next poll.
    pub(crate) fn insert(&mut self, at: u64, item: T) {
        self.len += 1;
        if at <= self.elapsed {
            self.overdue.push((at, item));
            return;
        }
        self.file(at, item);
    }

    fn file(&mut self, at: u64, item: T) {
        let key = at.min(self.elapsed + MAX_FILE_DISTANCE - 1);
        let level = level_for(self.elapsed, key);
        let slot = ((key >> (SLOT_BITS * level as u32)) & (SLOTS as u64 - 1)) as usize;
        let lvl = &mut self.levels[level];
        lvl.slots[slot].push((at, item));
        lvl.occupied |= 1 << slot;
    }

    fn next(&self) -> Option<Expiration> {
        // A lower level's next slot always expires before any slot of a higher level: the
        // lower level only holds entries inside the current span of the level above it.
        self.levels
            .iter()
            .enumerate()
            .find_map(|(i, level)| level.next_expiration(i, self.elapsed))
    }

    /// The earliest tick at which [`Wheel::poll`] can hand something out (the start of the
    /// next occupied slot, so possibly earlier than any entry in it), or `None` if empty.
    pub(crate) fn next_expiration(&self) -> Option<u64> {
        if !self.overdue.is_empty() {
            return Some(self.elapsed);
        }
        self.next().map(|e| e.deadline)
    }

    /// Advances the wheel to tick `now`, appending every entry filed for a tick `<= now` to
    /// `due` as `(tick, item)`, and cascading entries of higher levels down as their slots
    /// come round.
    pub(crate) fn poll(&mut self, now: u64, due: &mut Vec<(u64, T)>) {
        let before = due.len();
        due.append(&mut self.overdue);
        while let Some(exp) = self.next() {
            if exp.deadline > now {
                break;
            }
            let lvl = &mut self.levels[exp.level];
            let entries = std::mem::take(&mut lvl.slots[exp.slot]);
            lvl.occupied &= !(1 << exp.slot);
            self.elapsed = exp.deadline;
            for (at, item) in entries {
                if at <= self.elapsed {
                    due.push((at, item));
                } else {
                    self.file(at, item);
                }
            }
        }
        self.elapsed = self.elapsed.max(now);
        self.len -= due.len() - before;
    }

    /// Removes and returns every entry.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut out: Vec<T> = self.overdue.drain(..).map(|(_, t)| t).collect();
        for level in &mut self.levels {
            for slot in &mut level.slots {
                out.extend(slot.drain(..).map(|(_, t)| t));
            }
            level.occupied = 0;
        }
        self.len = 0;
        out
    }
}

#[cfg(all(test, not(epkv_loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn poll_all(w: &mut Wheel<u32>, now: u64) -> Vec<(u64, u32)> {
        let mut due = Vec::new();
        w.poll(now, &mut due);
        due.sort_unstable();
        due
    }

    #[test]
    fn entry_fires_at_its_tick_not_before() {
        let mut w = Wheel::new(0);
        w.insert(5, 1);
        w.insert(64, 2);
        w.insert(5000, 3);
        assert_eq!(w.next_expiration(), Some(5));
        assert!(poll_all(&mut w, 4).is_empty());
        assert_eq!(poll_all(&mut w, 5), vec![(5, 1)]);
        assert!(poll_all(&mut w, 63).is_empty());
        assert_eq!(poll_all(&mut w, 64), vec![(64, 2)]);
        assert!(poll_all(&mut w, 4999).is_empty());
        assert_eq!(poll_all(&mut w, 6000), vec![(5000, 3)]);
        assert_eq!(w.len(), 0);
        assert_eq!(w.next_expiration(), None);
    }

    #[test]
    fn overdue_insert_is_handed_out_next_poll() {
        let mut w = Wheel::new(100);
        w.insert(90, 7);
        w.insert(100, 8);
        assert_eq!(w.next_expiration(), Some(100));
        assert_eq!(poll_all(&mut w, 100), vec![(90, 7), (100, 8)]);
    }

    #[test]
    fn far_entries_are_clamped_and_cascade_until_due() {
        let mut w = Wheel::new(0);
        let far = MAX_FILE_DISTANCE * 3;
        w.insert(far, 1);
        let mut now = 0;
        let mut got = Vec::new();
        while got.is_empty() {
            let next = w.next_expiration().expect("entry still held");
            assert!(next <= far, "wheel would skip past the entry");
            now = next;
            got = poll_all(&mut w, now);
        }
        assert_eq!(now, far);
        assert_eq!(got, vec![(far, 1)]);
    }

    #[test]
    fn drain_returns_everything() {
        let mut w = Wheel::new(0);
        for i in 0..100u32 {
            w.insert(u64::from(i) * 977, i);
        }
        let mut all = w.drain();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        assert_eq!(w.len(), 0);
    }

    proptest! {
        /// The wheel hands every entry out at the first poll whose time reaches the entry's
        /// tick, exactly as a sorted map of entries would.
        #[test]
        fn wheel_matches_sorted_map_model(
            start in 0u64..1 << 40,
            ops in proptest::collection::vec((any::<bool>(), 0u64..1 << 22, 0u64..3000), 1..200),
        ) {
            let mut w = Wheel::new(start);
            let mut model: BTreeMap<(u64, u32), ()> = BTreeMap::new();
            let mut now = start;
            for (n, (is_insert, far, step)) in ops.into_iter().enumerate() {
                let id = u32::try_from(n).unwrap();
                if is_insert {
                    // Mix near and far ticks (and the occasional overdue one).
                    let at = if far % 7 == 0 { now.saturating_sub(far % 5) } else { now + far % (1 << (far % 23)) };
                    w.insert(at, id);
                    model.insert((at, id), ());
                } else {
                    // Jump straight to the next expiration now and then, to hit slot starts.
                    now = if step % 5 == 0 { w.next_expiration().unwrap_or(now).max(now) } else { now + step };
                    let got = poll_all(&mut w, now);
                    let mut want = Vec::new();
                    while let Some((&(at, id), ())) = model.first_key_value() {
                        if at > now { break; }
                        want.push((at, id));
                        model.pop_first();
                    }
                    want.sort_unstable();
                    prop_assert_eq!(got, want);
                    if let Some(next) = w.next_expiration() {
                        let earliest = model.keys().next().map(|k| k.0).unwrap();
                        prop_assert!(next <= earliest.max(now));
                    }
                }
                prop_assert_eq!(w.len(), model.len());
            }
        }
    }
}
