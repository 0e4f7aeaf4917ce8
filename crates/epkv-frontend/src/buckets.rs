//! [`Buckets`]: the named buckets a front end serves, each its own engine.

use crate::error::{FrontendError, Result};
use epkv_engine_api::Engine;
use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The name of the bucket that always exists, and that unauthenticated connections use
/// in the zero-configuration loopback mode.
pub const DEFAULT_BUCKET: &str = "default";

/// Longest bucket name (kv_engine's limit).
pub const MAX_BUCKET_NAME_LEN: usize = 100;

/// The buckets a front end serves, by name. Each is an independent engine; a connection
/// uses the one it selected (SELECT_BUCKET) or, in the open loopback mode, `default`.
///
/// Clones share one set, which can change while the server runs (the management REST
/// API creates and drops buckets). The lock is taken when a connection starts or selects
/// a bucket, never per request: a connection keeps the engine it selected, with a flag
/// that [`Buckets::remove`] raises so the connection closes at its next request.
#[derive(Clone, Default)]
pub struct Buckets {
    /// Name → bucket; the lock is held only to look up, insert or remove.
    by_name: Arc<RwLock<BTreeMap<String, LiveBucket>>>,
}

/// One served bucket: its engine and whether it has been dropped.
#[derive(Clone)]
pub(crate) struct LiveBucket {
    pub(crate) engine: Arc<dyn Engine>,
    /// Raised (once, never lowered) when the bucket is dropped; read with `Relaxed`
    /// ordering on every request of a connection that selected the bucket.
    pub(crate) dropped: Arc<AtomicBool>,
}

impl fmt::Debug for Buckets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.by_name.read().keys()).finish()
    }
}

/// Returns whether `name` is a valid bucket name: 1 to 100 characters of ASCII letters,
/// digits, `.`, `_`, `-` and `%` (Couchbase's rule), so it can be written into JSON and
/// used as a directory name unescaped.
#[must_use]
pub fn is_valid_bucket_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_BUCKET_NAME_LEN
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'%'))
}

impl Buckets {
    /// No buckets.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// One bucket named `default`.
    #[must_use]
    pub fn single(engine: Arc<dyn Engine>) -> Self {
        let b = Self::new();
        // A fresh set has no `default` yet, and the name is valid.
        let _ = b.insert(DEFAULT_BUCKET, engine);
        b
    }

    /// Adds a bucket; connections may select it at once.
    ///
    /// # Errors
    /// [`FrontendError::InvalidConfig`] for an invalid or duplicate name.
    pub fn insert(&self, name: &str, engine: Arc<dyn Engine>) -> Result<()> {
        if !is_valid_bucket_name(name) {
            return Err(FrontendError::InvalidConfig(format!(
                "invalid bucket name {name:?}: use 1-{MAX_BUCKET_NAME_LEN} letters, digits, \
                 '.', '_', '-' or '%', not starting with '.'"
            )));
        }
        let mut map = self.by_name.write();
        if map.contains_key(name) {
            return Err(FrontendError::InvalidConfig(format!(
                "bucket {name:?} already exists"
            )));
        }
        map.insert(
            name.to_owned(),
            LiveBucket {
                engine,
                dropped: Arc::new(AtomicBool::new(false)),
            },
        );
        Ok(())
    }

    /// Removes a bucket and marks it dropped: no connection can select it any more, and
    /// every connection that had selected it is closed at its next request. Returns its
    /// engine (to shut down once nothing uses it), or `None` if there was no such bucket.
    pub fn remove(&self, name: &str) -> Option<Arc<dyn Engine>> {
        let live = self.by_name.write().remove(name)?;
        live.dropped.store(true, Ordering::Relaxed);
        Some(live.engine)
    }

    /// The bucket called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Arc<dyn Engine>> {
        self.by_name.read().get(name).map(|b| Arc::clone(&b.engine))
    }

    /// The bucket called `name` with its dropped flag.
    pub(crate) fn live(&self, name: &str) -> Option<LiveBucket> {
        self.by_name.read().get(name).cloned()
    }

    /// Every bucket with its name, in name order: a snapshot of this moment.
    pub fn iter(&self) -> impl Iterator<Item = (String, Arc<dyn Engine>)> + use<> {
        let snapshot: Vec<_> = self
            .by_name
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(&v.engine)))
            .collect();
        snapshot.into_iter()
    }

    /// Whether a bucket called `name` exists.
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.read().contains_key(name)
    }

    /// How many buckets there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_name.read().len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_name.read().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_follow_couchbase_rules() {
        assert!(is_valid_bucket_name("default"));
        assert!(is_valid_bucket_name("travel-sample_2.x%"));
        assert!(!is_valid_bucket_name(""));
        assert!(!is_valid_bucket_name(".hidden"));
        assert!(!is_valid_bucket_name("a/b"));
        assert!(!is_valid_bucket_name("quote\""));
        assert!(!is_valid_bucket_name(&"b".repeat(101)));
        assert!(is_valid_bucket_name(&"b".repeat(100)));
    }
}
