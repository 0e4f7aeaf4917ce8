//! The hook for `/pools/default/buckets/NAME/scopes[/...]`: scopes and collections, once
//! the engine has a collections manifest.
//!
//! The router hands every request under a bucket's `scopes` path to a
//! [`CollectionsApi`] with the method, the path segments after `scopes` and the decoded
//! form. Today the only implementation is [`NoCollections`], which answers 404 with a
//! JSON error saying collections are not supported yet (the SDKs report it as a failed
//! management request). The implementation that lists, creates and drops scopes and
//! collections (and returns the manifest uid) replaces it without touching the router.

use super::Reply;
use super::form::Form;
use hyper::{Method, StatusCode};

/// Scopes and collections management for one bucket.
pub(crate) trait CollectionsApi: Send + Sync {
    /// Answers `METHOD /pools/default/buckets/{bucket}/scopes/{rest...}` from an
    /// administrator (the router has checked access and that the bucket exists).
    fn handle(&self, bucket: &str, method: &Method, rest: &[String], form: &Form) -> Reply;
}

/// The engine has no collections yet: every request is answered 404.
pub(crate) struct NoCollections;

impl CollectionsApi for NoCollections {
    fn handle(&self, bucket: &str, _method: &Method, _rest: &[String], _form: &Form) -> Reply {
        Reply::error(
            StatusCode::NOT_FOUND,
            format!(
                "scopes and collections are not supported yet: bucket {bucket:?} has only the \
                 default collection"
            ),
        )
    }
}
