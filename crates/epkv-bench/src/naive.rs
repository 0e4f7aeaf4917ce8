//! Naive peers, modelling the design seed 002 calls slow (KV-Engine's legacy CB3 task
//! queues): one `Mutex<BinaryHeap>` ordered by due time plus a `Condvar`, shared by every
//! scheduling thread and every worker.

use epkv_executor::{Clock, SystemClock};
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type JobFn = Box<dyn FnOnce() + Send>;

struct Job {
    due: Instant,
    seq: u64,
    f: JobFn,
}

impl PartialEq for Job {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}

impl Eq for Job {}

impl PartialOrd for Job {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Job {
    fn cmp(&self, other: &Self) -> Ordering {
        // Max-heap: the earliest due (then the oldest) compares greatest.
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

#[derive(Default)]
struct PoolState {
    heap: BinaryHeap<Job>,
    seq: u64,
    stop: bool,
}

struct PoolShared {
    state: Mutex<PoolState>,
    cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A thread pool whose run queue is one mutex-protected heap ordered by due time.
pub struct NaivePool {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
}

impl NaivePool {
    /// Starts `threads` workers.
    ///
    /// # Errors
    ///
    /// If a thread cannot be spawned.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let shared = Arc::new(PoolShared {
            state: Mutex::new(PoolState::default()),
            cv: Condvar::new(),
        });
        let mut handles = Vec::new();
        for i in 0..threads {
            let s = Arc::clone(&shared);
            handles.push(epkv_executor::spawn_named(
                format!("naive-{i}"),
                move || {
                    worker(&s);
                },
            )?);
        }
        Ok(Self {
            shared,
            threads: handles,
        })
    }

    /// Runs `f` on a worker as soon as possible.
    pub fn schedule_now(&self, f: impl FnOnce() + Send + 'static) {
        self.schedule_at(SystemClock.now(), Box::new(f));
    }

    /// Runs `f` on a worker at `due`.
    pub fn schedule_at(&self, due: Instant, f: JobFn) {
        {
            let mut st = lock(&self.shared.state);
            st.seq += 1;
            let seq = st.seq;
            st.heap.push(Job { due, seq, f });
        }
        self.shared.cv.notify_one();
    }
}

fn worker(s: &PoolShared) {
    let mut st = lock(&s.state);
    loop {
        if st.stop {
            return;
        }
        let now = SystemClock.now();
        match st.heap.peek().map(|j| j.due) {
            None => st = s.cv.wait(st).unwrap_or_else(PoisonError::into_inner),
            Some(due) if due > now => {
                st =
                    s.cv.wait_timeout(st, due - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
            }
            Some(_) => {
                if let Some(job) = st.heap.pop() {
                    drop(st);
                    (job.f)();
                    st = lock(&s.state);
                }
            }
        }
    }
}

impl Drop for NaivePool {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.cv.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct TimerState {
    /// Entries `(due, id, generation)`; an entry whose generation is not the timer's
    /// current one was re-armed since and is skipped (lazy deletion).
    heap: BinaryHeap<Reverse<(Instant, u32, u32)>>,
    generation: Vec<u32>,
    fired: u64,
    stop: bool,
}

struct TimerShared {
    state: Mutex<TimerState>,
    cv: Condvar,
}

/// Timeouts in one mutex-protected heap with a timer thread waiting on a condvar for the
/// earliest; re-arming pushes a new entry and lazily drops the old one, compacting the
/// heap when stale entries outnumber live ones.
pub struct NaiveTimers {
    shared: Arc<TimerShared>,
    thread: Option<JoinHandle<()>>,
}

impl NaiveTimers {
    /// `count` timeouts, all unarmed, and the timer thread.
    ///
    /// # Errors
    ///
    /// If the thread cannot be spawned.
    pub fn new(count: usize) -> std::io::Result<Self> {
        let shared = Arc::new(TimerShared {
            state: Mutex::new(TimerState {
                heap: BinaryHeap::with_capacity(count * 2),
                generation: vec![0; count],
                fired: 0,
                stop: false,
            }),
            cv: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        let thread = epkv_executor::spawn_named("naive-timer", move || timer_thread(&s))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Arms timeout `id` to fire at `due`, replacing its previous due time.
    pub fn rearm(&self, id: u32, due: Instant) {
        let earliest = {
            let mut st = lock(&self.shared.state);
            let live = st.generation.len();
            let g = {
                let slot = &mut st.generation[id as usize];
                *slot = slot.wrapping_add(1);
                *slot
            };
            st.heap.push(Reverse((due, id, g)));
            if st.heap.len() > 2 * live + 1024 {
                let TimerState {
                    heap, generation, ..
                } = &mut *st;
                heap.retain(|Reverse((_, id, g))| generation[*id as usize] == *g);
            }
            st.heap
                .peek()
                .is_some_and(|Reverse((d, i, _))| *d == due && *i == id)
        };
        if earliest {
            self.shared.cv.notify_one();
        }
    }

    /// Timeouts that fired.
    #[must_use]
    pub fn fired(&self) -> u64 {
        lock(&self.shared.state).fired
    }
}

fn timer_thread(s: &TimerShared) {
    let mut st = lock(&s.state);
    loop {
        if st.stop {
            return;
        }
        let now = SystemClock.now();
        let top = st.heap.peek().map(|Reverse(e)| *e);
        match top {
            None => st = s.cv.wait(st).unwrap_or_else(PoisonError::into_inner),
            Some((_, id, g)) if st.generation[id as usize] != g => {
                st.heap.pop();
            }
            Some((due, _, _)) if due > now => {
                let wait = (due - now).min(Duration::from_secs(1));
                st =
                    s.cv.wait_timeout(st, wait)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
            }
            Some(_) => {
                st.heap.pop();
                st.fired += 1;
            }
        }
    }
}

impl Drop for NaiveTimers {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn pool_runs_jobs_in_due_order() {
        let pool = NaivePool::new(1).unwrap();
        let (tx, rx) = mpsc::channel();
        let now = SystemClock.now();
        let (t1, t2) = (tx.clone(), tx);
        // Both queued before the worker can take either; the earlier due runs first.
        pool.schedule_at(
            now + Duration::from_millis(20),
            Box::new(move || t2.send(2).unwrap()),
        );
        pool.schedule_at(
            now + Duration::from_millis(10),
            Box::new(move || t1.send(1).unwrap()),
        );
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 2);
    }

    #[test]
    fn timers_rearm_replaces_and_compacts() {
        let t = NaiveTimers::new(4).unwrap();
        let far = SystemClock.now() + Duration::from_secs(3600);
        for i in 0..10_000u32 {
            t.rearm(i % 4, far + Duration::from_millis(u64::from(i)));
        }
        let len = lock(&t.shared.state).heap.len();
        assert!(len <= 2 * 4 + 1024 + 1, "heap not compacted: {len}");
        t.rearm(0, SystemClock.now());
        for _ in 0..10_000 {
            if t.fired() == 1 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(t.fired(), 1);
    }
}
