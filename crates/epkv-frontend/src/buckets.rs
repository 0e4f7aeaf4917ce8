//! [`Buckets`]: the named buckets a front end serves, each its own engine.

use crate::error::{FrontendError, Result};
use epkv_engine_api::Engine;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The name of the bucket that always exists, and that unauthenticated connections use
/// in the zero-configuration loopback mode.
pub const DEFAULT_BUCKET: &str = "default";

/// Longest bucket name (kv_engine's limit).
pub const MAX_BUCKET_NAME_LEN: usize = 100;

/// The buckets a front end serves, by name. Each is an independent engine; a connection
/// uses the one it selected (SELECT_BUCKET) or, in the open loopback mode, `default`.
#[derive(Clone, Default)]
pub struct Buckets {
    by_name: BTreeMap<String, Arc<dyn Engine>>,
}

impl fmt::Debug for Buckets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
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
        let mut by_name = BTreeMap::new();
        by_name.insert(DEFAULT_BUCKET.to_owned(), engine);
        Self { by_name }
    }

    /// Adds a bucket.
    ///
    /// # Errors
    /// [`FrontendError::InvalidConfig`] for an invalid or duplicate name.
    pub fn insert(&mut self, name: &str, engine: Arc<dyn Engine>) -> Result<()> {
        if !is_valid_bucket_name(name) {
            return Err(FrontendError::InvalidConfig(format!(
                "invalid bucket name {name:?}: use 1-{MAX_BUCKET_NAME_LEN} letters, digits, \
                 '.', '_', '-' or '%', not starting with '.'"
            )));
        }
        if self.by_name.contains_key(name) {
            return Err(FrontendError::InvalidConfig(format!(
                "bucket {name:?} is configured twice"
            )));
        }
        self.by_name.insert(name.to_owned(), engine);
        Ok(())
    }

    /// The bucket called `name`.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Engine>> {
        self.by_name.get(name)
    }

    /// Every bucket with its name, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn Engine>)> {
        self.by_name.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// How many buckets there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
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
