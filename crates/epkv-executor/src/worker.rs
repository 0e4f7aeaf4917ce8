//! The worker thread loop: poll the own timer shard, run ready tasks of the group, spin a
//! little after work, then park until the next timer tick or an unpark.
//!
//! Parking protocol (no lost wake-up): a worker sets its bit in the group's `sleepers`,
//! issues a SeqCst fence and re-checks the run queues before parking; a pusher pushes,
//! fences and then reads `sleepers` (and `spinning`). Of the two fenced sides one sees the
//! other. Timer inserts publish an earlier `next_tick` under the wheel lock and unpark the
//! shard's worker, whose park deadline is computed under the same lock.

use crate::core::{Core, GroupCore};
use crate::handle::TaskHandle;
use crate::wheel::TICK_SHIFT;
use std::hint::spin_loop;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::fence;
use std::thread;
use std::time::Duration;

/// The longest a worker parks without looking at its clock again. Bounds how late a timer
/// fires when the executor's clock jumps (an [`OffsetClock`](crate::OffsetClock) moved
/// forward) while the worker sleeps.
const MAX_PARK: Duration = Duration::from_secs(1);

/// Busy-polls the group's queues with pause instructions for a few microseconds after a
/// run, so back-to-back work is picked up without a park/unpark round trip. While this
/// lasts the worker counts as spinning and pushers skip the unpark; the phase is kept short
/// because a spinner the OS switches out would delay the work it was expected to take.
fn spin_for_work(g: &GroupCore, rounds: u32) -> Option<TaskHandle> {
    if rounds == 0 {
        return None;
    }
    g.spinning.fetch_add(1, SeqCst);
    let mut found = None;
    for _ in 0..rounds {
        if let Some(h) = g.pop() {
            found = Some(h);
            break;
        }
        spin_loop();
    }
    g.spinning.fetch_sub(1, SeqCst);
    found
}

/// Runs worker `me` of group `gi` until the core shuts down.
pub(crate) fn worker_loop(core: &Core, gi: usize, me: usize, spin_rounds: u32, yield_rounds: u32) {
    let g = &core.groups[gi];
    // Set once per slot; a second set can only come from a bug and is harmless.
    let _ = g.threads[me].set(thread::current());
    let shard = &g.shards[me];
    let bit = 1u64 << me;
    let mut hot = false;
    // The time read at the end of the previous run, if the loop comes straight from one.
    let mut last_end = None;
    loop {
        if core.is_shut_down() {
            break;
        }
        let now = last_end.take().unwrap_or_else(|| core.now_ns());
        if now >> TICK_SHIFT >= shard.next_tick.load(Relaxed) {
            core.poll_shard(shard, now, now >> TICK_SHIFT);
        }
        if let Some(h) = g.pop() {
            last_end = core.run_at(&h, now);
            hot = true;
            continue;
        }
        let was_hot = hot;
        if hot {
            hot = false;
            if let Some(h) = spin_for_work(g, spin_rounds) {
                if g.has_work() {
                    g.notify_one();
                }
                last_end = core.run_at(&h, core.now_ns());
                hot = true;
                continue;
            }
        }
        g.sleepers.fetch_or(bit, SeqCst);
        fence(SeqCst);
        if g.has_work() || core.is_shut_down() {
            g.sleepers.fetch_and(!bit, SeqCst);
            continue;
        }
        if was_hot {
            // Give the CPU away a few times before parking. The sleeper bit is already
            // set, so a pusher unparks this worker (a token, no syscall, while it is not
            // parked) instead of relying on it to come back by itself.
            for _ in 0..yield_rounds {
                thread::yield_now();
                if g.has_work() || core.is_shut_down() {
                    break;
                }
            }
            if g.has_work() || core.is_shut_down() {
                g.sleepers.fetch_and(!bit, SeqCst);
                continue;
            }
        }
        let next = {
            let wheel = shard.wheel.lock();
            let next = wheel.next_expiration().unwrap_or(u64::MAX);
            shard.next_tick.store(next, Relaxed);
            next
        };
        let wait = if next == u64::MAX {
            MAX_PARK
        } else {
            let at = next.saturating_mul(1 << TICK_SHIFT);
            Duration::from_nanos(at.saturating_sub(core.now_ns())).min(MAX_PARK)
        };
        if !wait.is_zero() {
            thread::park_timeout(wait);
        }
        g.sleepers.fetch_and(!bit, SeqCst);
    }
}
