//! The background expiry pager: a thread named `epkv-expiry-pager` that runs its owner's
//! expiry pass (the bucket's `run_expiry_pass`) every `expiry_pager_interval`.
//!
//! It stands in for KV-Engine's `ExpiredItemPager` task until epkv-executor exists. The
//! thread holds only a weak reference to its owner between passes, so dropping the bucket
//! ends it; it sleeps on a condition variable so that stopping it is immediate. The
//! interval is measured on the real clock (it only paces the work); which items have
//! expired is decided with the bucket's [`epkv_executor::Clock`].
//!
//! Level: a leaf. It is generic over its owner (as `bucket_core::schedule_weak` is) and
//! names nothing above it: the bucket starts it with a weak reference to itself and its
//! pass as a function.

use crate::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Name of the pager thread.
pub(crate) const THREAD_NAME: &str = "epkv-expiry-pager";

/// Stop flag and wake-up shared by the bucket and the thread.
#[derive(Default)]
struct Signal {
    /// True once stop was requested. Protected by the mutex, waited on through `wake`.
    stopped: Mutex<bool>,
    wake: Condvar,
}

/// Handle on the pager thread.
#[derive(Default)]
pub(crate) struct ExpiryPager {
    signal: Arc<Signal>,
    /// The running thread, taken by [`ExpiryPager::stop`].
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl ExpiryPager {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Starts the thread: every `interval` it upgrades `owner` and calls `pass` on it
    /// (which returns how many documents it removed), and it ends once `owner` is gone.
    pub(crate) fn start<T: ?Sized + Send + Sync + 'static>(
        &self,
        owner: Weak<T>,
        interval: Duration,
        pass: fn(&T) -> usize,
    ) -> Result<()> {
        let signal = Arc::clone(&self.signal);
        let handle = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || run(&owner, &signal, interval, pass))
            .map_err(Error::SpawnPager)?;
        *self.handle.lock() = Some(handle);
        Ok(())
    }

    /// Asks the thread to stop without waiting for it.
    pub(crate) fn signal_stop(&self) {
        *self.signal.stopped.lock() = true;
        self.signal.wake.notify_all();
    }

    /// Stops the thread and waits for it (unless called from the thread itself).
    pub(crate) fn stop(&self) {
        self.signal_stop();
        let handle = self.handle.lock().take();
        if let Some(h) = handle
            && h.thread().id() != std::thread::current().id()
            && h.join().is_err()
        {
            tracing::error!("the expiry pager thread panicked");
        }
    }

    /// Returns true while the thread exists and has not been stopped.
    pub(crate) fn is_running(&self) -> bool {
        self.handle
            .lock()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }
}

fn run<T: ?Sized>(owner: &Weak<T>, signal: &Signal, interval: Duration, pass: fn(&T) -> usize) {
    loop {
        {
            let mut stopped = signal.stopped.lock();
            if !*stopped {
                // parking_lot condition variables do not wake spuriously: this returns on
                // timeout or on stop.
                signal.wake.wait_for(&mut stopped, interval);
            }
            if *stopped {
                return;
            }
        }
        let Some(owner) = owner.upgrade() else {
            return;
        };
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pass(&owner)));
        match outcome {
            Ok(removed) => tracing::debug!(removed, "expiry pager pass"),
            Err(_) => tracing::error!("expiry pager pass panicked; the pager keeps running"),
        }
    }
}
