//! The floor of the one-shot round trip: the least a thread pool can do to run a closure on
//! another thread. One lock-free queue (`crossbeam` `SegQueue`) of boxed closures and
//! workers that poll it without ever sleeping. It has no task object, no statistics, no
//! shutdown guarantees and burns a core per worker while idle, so it is not a peer: it
//! shows the ceiling any pool with real task machinery can approach on this machine.

use crossbeam_queue::SegQueue;
use std::hint::spin_loop;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;

type JobFn = Box<dyn FnOnce() + Send>;

struct Shared {
    queue: SegQueue<JobFn>,
    stop: AtomicBool,
}

/// A pool of always-polling workers over one lock-free queue.
pub struct BarePool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl BarePool {
    /// Starts `threads` workers.
    ///
    /// # Errors
    ///
    /// If a thread cannot be spawned.
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            queue: SegQueue::new(),
            stop: AtomicBool::new(false),
        });
        let mut handles = Vec::new();
        for i in 0..threads {
            let s = Arc::clone(&shared);
            handles.push(epkv_executor::spawn_named(
                format!("floor-{i}"),
                move || {
                    while !s.stop.load(Relaxed) {
                        match s.queue.pop() {
                            Some(job) => job(),
                            None => spin_loop(),
                        }
                    }
                },
            )?);
        }
        Ok(Self {
            shared,
            threads: handles,
        })
    }

    /// Runs `f` on a worker as soon as one polls the queue.
    pub fn run(&self, f: impl FnOnce() + Send + 'static) {
        self.shared.queue.push(Box::new(f));
    }
}

impl Drop for BarePool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Jobs pushed after the workers stopped are dropped unrun with the queue.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn runs_every_job_on_a_worker() {
        let pool = BarePool::new(2).unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 0..100 {
            let tx = tx.clone();
            pool.run(move || {
                let name = std::thread::current().name().map(str::to_owned);
                tx.send((i, name)).unwrap();
            });
        }
        let mut seen: Vec<usize> = (0..100)
            .map(|_| {
                let (i, name) = rx.recv().unwrap();
                assert!(name.unwrap().starts_with("floor-"));
                i
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }
}
