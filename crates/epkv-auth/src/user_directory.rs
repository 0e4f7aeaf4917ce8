//! [`UserDirectory`]: the current [`UserStore`], shared by every reader and replaced as a
//! whole when users change at run time (the management REST API).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use crate::user_store::UserStore;

/// A shared handle to the current user store. Clones share the same store.
///
/// Readers take a snapshot ([`UserDirectory::current`]: an `Arc` clone under a read lock
/// held for a few nanoseconds) and keep using it for the whole of an authentication, so a
/// change never tears an exchange in two. Writers build a new store from the current one
/// and swap it in ([`UserDirectory::update`]), so no reader ever waits on a PBKDF2
/// derivation.
#[derive(Clone, Default)]
pub struct UserDirectory {
    /// The current store; the lock is held only to clone or replace the `Arc`.
    current: Arc<RwLock<Arc<UserStore>>>,
    /// How many times the store was replaced: connections compare it with the value they
    /// computed their privileges at, so a change of users or roles reaches live
    /// connections at their next request (one atomic load per request).
    generation: Arc<AtomicU64>,
}

impl std::fmt::Debug for UserDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.current().fmt(f)
    }
}

impl From<UserStore> for UserDirectory {
    fn from(store: UserStore) -> Self {
        Self::new(store)
    }
}

impl UserDirectory {
    /// Returns a directory holding `store`.
    #[must_use]
    pub fn new(store: UserStore) -> Self {
        Self {
            current: Arc::new(RwLock::new(Arc::new(store))),
            generation: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many times the store was replaced. Read it before [`Self::current`]: a store
    /// taken after reading generation `g` is at least as new as `g`.
    #[must_use]
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Returns the current store.
    #[must_use]
    pub fn current(&self) -> Arc<UserStore> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the store with a changed copy: `change` edits a clone of the current
    /// store, which replaces it when `change` returns `Ok`. Concurrent updates are
    /// serialised, so none is lost; readers keep the store they took.
    ///
    /// # Errors
    /// Whatever `change` returns; the store is then left as it was.
    pub fn update<T, E>(
        &self,
        change: impl FnOnce(&mut UserStore) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        let mut guard = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let mut next = UserStore::clone(&guard);
        let out = change(&mut next)?;
        *guard = Arc::new(next);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BucketAccess;

    #[test]
    fn updates_are_seen_by_new_readers_and_not_by_old_snapshots() {
        let dir = UserDirectory::new(UserStore::empty().with_iterations(1));
        let before = dir.current();
        let shared = dir.clone();
        shared
            .update(|s| s.insert_with_password("a", "pw", BucketAccess::All))
            .unwrap();
        assert!(dir.current().contains("a"), "clones share the store");
        assert!(!before.contains("a"), "a snapshot never changes");
        let failed: std::result::Result<(), &str> = dir.update(|s| {
            s.remove("a");
            Err("no")
        });
        assert!(failed.is_err());
        assert!(
            dir.current().contains("a"),
            "a failed change is not applied"
        );
    }
}
