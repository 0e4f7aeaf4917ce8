//! The one place epkv starts OS threads: every thread gets a name, so `top -H`, debuggers
//! and panic messages say what it is.

use std::io;
use std::thread::{Builder, JoinHandle};

/// Spawns a thread called `name` running `f`.
///
/// # Errors
///
/// The operating system's error if the thread cannot be created.
pub fn spawn_named<F, T>(name: impl Into<String>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    Builder::new().name(name.into()).spawn(f)
}

#[cfg(all(test, not(epkv_loom)))]
mod tests {
    #[test]
    fn spawned_thread_has_its_name() {
        let h = super::spawn_named("epkv-test-thread", || {
            std::thread::current().name().map(str::to_owned)
        })
        .unwrap();
        assert_eq!(h.join().unwrap().as_deref(), Some("epkv-test-thread"));
    }
}
