//! A one-shot signal from a worker back to the thread that asked for the work, like
//! folly's `Baton` in the seed benchmark: the waiter spins briefly, then parks.

use epkv_executor::{Clock, SystemClock};
use std::hint::spin_loop;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::AcqRel, Ordering::Acquire};
use std::sync::atomic::{Ordering::Relaxed, Ordering::Release};
use std::thread::{self, Thread};
use std::time::Duration;

const EMPTY: u32 = 0;
const POSTED: u32 = 1;
const PARKED: u32 = 2;

/// How long a waiter spins before parking, in nanoseconds: 2 µs, folly's `Baton` default
/// (`WaitOptions::spin_max`), which the seed benchmark used.
static SPIN_NANOS: AtomicU64 = AtomicU64::new(2_000);

/// Sets how long waiters spin before parking.
pub fn set_spin(spin: Duration) {
    SPIN_NANOS.store(u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX), Relaxed);
}

/// A reusable signal owned by one waiting thread.
#[derive(Debug)]
pub struct Baton {
    state: AtomicU32,
    waiter: Thread,
}

impl Baton {
    /// A baton whose waiter is the calling thread.
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: AtomicU32::new(EMPTY),
            waiter: thread::current(),
        }
    }

    /// Signals the waiter.
    pub fn post(&self) {
        if self.state.swap(POSTED, AcqRel) == PARKED {
            self.waiter.unpark();
        }
    }

    fn try_take(&self) -> bool {
        if self.state.load(Acquire) == POSTED {
            self.state.store(EMPTY, Release);
            true
        } else {
            false
        }
    }

    /// Waits for a post (spinning up to the spin time, then parking), then resets the
    /// baton. Only the thread that created it may wait.
    pub fn wait(&self) {
        if self.try_take() {
            return;
        }
        let spin = Duration::from_nanos(SPIN_NANOS.load(Relaxed));
        if !spin.is_zero() {
            let t0 = SystemClock.now();
            loop {
                for _ in 0..16 {
                    if self.try_take() {
                        return;
                    }
                    spin_loop();
                }
                if SystemClock.now() - t0 >= spin {
                    break;
                }
            }
        }
        if self
            .state
            .compare_exchange(EMPTY, PARKED, AcqRel, Acquire)
            .is_ok()
        {
            while self.state.load(Acquire) != POSTED {
                thread::park();
            }
        }
        self.state.store(EMPTY, Release);
    }
}

impl Default for Baton {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn post_then_wait_and_wait_then_post_both_return() {
        let b = Arc::new(Baton::new());
        b.post();
        b.wait();
        for _ in 0..1000 {
            let b2 = Arc::clone(&b);
            let t = thread::spawn(move || b2.post());
            b.wait();
            t.join().unwrap();
        }
    }
}
