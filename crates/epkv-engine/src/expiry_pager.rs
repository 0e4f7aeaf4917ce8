//! The background expiry pager: a thread named `epkv-expiry-pager` that calls
//! [`crate::Bucket::run_expiry_pass`] every `expiry_pager_interval`.
//!
//! It stands in for KV-Engine's `ExpiredItemPager` task until epkv-executor exists. The
//! thread holds only a weak reference to the bucket between passes, so dropping the bucket
//! ends it; it sleeps on a condition variable so that stopping it is immediate. The
//! interval is measured on the real clock (it only paces the work); which items have
//! expired is decided with the bucket's [`epkv_executor::Clock`].

use crate::{Bucket, Error, Result};
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

    /// Starts the thread for `bucket`.
    pub(crate) fn start(bucket: &Arc<Bucket>, interval: Duration) -> Result<()> {
        let weak: Weak<Bucket> = Arc::downgrade(bucket);
        let signal = Arc::clone(&bucket.pager.signal);
        let handle = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || run(&weak, &signal, interval))
            .map_err(Error::SpawnPager)?;
        *bucket.pager.handle.lock() = Some(handle);
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

fn run(bucket: &Weak<Bucket>, signal: &Signal, interval: Duration) {
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
        let Some(bucket) = bucket.upgrade() else {
            return;
        };
        let pass =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bucket.run_expiry_pass()));
        match pass {
            Ok(removed) => tracing::debug!(removed, "expiry pager pass"),
            Err(_) => tracing::error!("expiry pager pass panicked; the pager keeps running"),
        }
    }
}
