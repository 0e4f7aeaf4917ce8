//! The synchronisation primitives the task state machine uses, swapped for loom's when the
//! crate is built with `--cfg epkv_loom` so the loom models exercise the real hand-off code.
//!
//! Only the state that the wake/snooze/cancel/run hand-offs share goes through this shim: the
//! task state word, its armed-timer word, the task body lock, the registry and the manual
//! executor's queues. Thread parking, the lock-free run queues of the threaded pools and the
//! statistics counters use std and crossbeam directly; the loom models never reach them.

#[cfg(not(epkv_loom))]
mod imp {
    pub(crate) use parking_lot::Mutex;
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};
}

#[cfg(epkv_loom)]
mod imp {
    use loom::sync::MutexGuard;
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64};

    /// loom's mutex behind parking_lot's panic-free `lock()` signature.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // loom mutexes poison only when a model thread panics, which already fails the
            // model; recovering the guard keeps the shim's signature infallible.
            match self.0.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            }
        }
    }

    impl<T: Default> Default for Mutex<T> {
        fn default() -> Self {
            Self::new(T::default())
        }
    }
}

pub(crate) use imp::*;
