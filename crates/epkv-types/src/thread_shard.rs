//! [`thread_shard`]: which of a sharded structure's shards the calling thread uses.

use std::sync::atomic::{AtomicUsize, Ordering};

static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's index, drawn from [`NEXT`] on first use.
    static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
}

/// The shard, out of `shards`, that the calling thread uses in per-thread sharded counters
/// (the engine's statistics, the hash table's memory tracker).
///
/// Threads are numbered in the order they first call this and dealt to shards round robin,
/// so up to `shards` threads never share one. The number is the same for every structure
/// the thread touches.
///
/// # Panics
/// If `shards` is 0.
#[inline]
#[must_use]
pub fn thread_shard(shards: usize) -> usize {
    INDEX.with(|i| *i) % shards
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_shard_and_threads_are_dealt_round_robin() {
        let mine = thread_shard(1 << 20);
        assert_eq!(thread_shard(1 << 20), mine);
        let others: Vec<usize> = (0..4)
            .map(|_| std::thread::spawn(|| thread_shard(1 << 20)).join().unwrap())
            .collect();
        // Later threads get later numbers (other tests may draw some in between).
        assert!(others.windows(2).all(|w| w[0] < w[1]), "{others:?}");
        assert!(others.iter().all(|&o| o != mine));
        assert!(thread_shard(3) < 3);
    }
}
