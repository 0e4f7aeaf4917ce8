//! `/pools/default/buckets/NAME/scopes[/...]`: scopes and collections.
//!
//! The router hands every request under a bucket's `scopes` path to a
//! [`CollectionsApi`] with the method, the path segments after `scopes` and the decoded
//! form. [`EngineCollections`] serves them from the bucket's engine:
//! - `GET scopes`: the manifest (`uid`, `scopes[].name/uid/collections[].name/uid/maxTTL`,
//!   ids and uid in hex, as GET_COLLECTIONS_MANIFEST);
//! - `POST scopes` (`name`): creates a scope;
//! - `DELETE scopes/S`: drops scope S and its collections;
//! - `POST scopes/S/collections` (`name`, optional `maxTTL` seconds): creates a
//!   collection;
//! - `DELETE scopes/S/collections/C`: drops a collection (its documents go in the
//!   background).
//!
//! A change answers `{"uid": "<new manifest uid in hex>"}`. Errors carry Couchbase's
//! wording, which the SDKs match: "already exists" (400), "not found" (404).

use super::Reply;
use super::form::Form;
use crate::bucket_manager::BucketManager;
use epkv_engine_api::{Engine, EngineStatus};
use hyper::{Method, StatusCode};
use serde_json::json;
use std::sync::Arc;

/// Scopes and collections management for one bucket.
pub(crate) trait CollectionsApi: Send + Sync {
    /// Answers `METHOD /pools/default/buckets/{bucket}/scopes/{rest...}` from an
    /// administrator (the router has checked access and that the bucket exists).
    fn handle(&self, bucket: &str, method: &Method, rest: &[String], form: &Form) -> Reply;
}

/// Scopes and collections of the server's buckets, from their engines.
pub(crate) struct EngineCollections {
    /// The buckets.
    pub(crate) buckets: Arc<BucketManager>,
}

fn changed(result: Result<u64, EngineStatus>, what: &str) -> Reply {
    match result {
        Ok(uid) => Reply::json(json!({ "uid": format!("{uid:x}") })),
        Err(EngineStatus::KeyExists) => {
            Reply::invalid("name", format!("{what} with this name already exists"))
        }
        Err(EngineStatus::UnknownScope) => Reply::error(
            StatusCode::NOT_FOUND,
            "Scope with this name is not found".to_string(),
        ),
        Err(EngineStatus::UnknownCollection) => Reply::error(
            StatusCode::NOT_FOUND,
            "Collection with this name is not found".to_string(),
        ),
        Err(EngineStatus::Invalid) => Reply::invalid(
            "name",
            "Name must be 1-251 characters of A-Z, a-z, 0-9, _, - and %, and cannot start \
             with _ or %; the default scope cannot be dropped",
        ),
        Err(EngineStatus::TooBig) => {
            Reply::invalid("_", format!("Maximum number of {what}s has been reached"))
        }
        Err(e) => Reply::error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}")),
    }
}

impl CollectionsApi for EngineCollections {
    fn handle(&self, bucket: &str, method: &Method, rest: &[String], form: &Form) -> Reply {
        let Some((_, b)) = self.buckets.get(bucket) else {
            return Reply::error(StatusCode::NOT_FOUND, format!("no bucket {bucket:?}"));
        };
        let engine: &dyn Engine = &*b;
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        match (method, rest.as_slice()) {
            (&Method::GET, []) => match engine.collections_manifest() {
                Ok(text) => match serde_json::from_str(&text) {
                    Ok(v) => Reply::json(v),
                    Err(e) => Reply::error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                },
                Err(e) => Reply::error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}")),
            },
            (&Method::POST, []) => match form.get("name") {
                Some(name) => changed(engine.create_scope(name), "Scope"),
                None => Reply::invalid("name", "The value must be supplied"),
            },
            (&Method::DELETE, [scope]) => changed(engine.drop_scope(scope), "Scope"),
            (&Method::POST, [scope, "collections"]) => {
                let Some(name) = form.get("name") else {
                    return Reply::invalid("name", "The value must be supplied");
                };
                let max_ttl = match form.get("maxTTL").map(str::parse::<i64>) {
                    None => 0,
                    Some(Ok(t)) if (0..=i64::from(i32::MAX)).contains(&t) => {
                        u32::try_from(t).unwrap_or(0)
                    }
                    Some(_) => {
                        return Reply::invalid(
                            "maxTTL",
                            "The value must be an integer between 0 and 2147483647",
                        );
                    }
                };
                changed(engine.create_collection(scope, name, max_ttl), "Collection")
            }
            (&Method::DELETE, [scope, "collections", name]) => {
                changed(engine.drop_collection(scope, name), "Collection")
            }
            (&Method::GET | &Method::POST | &Method::DELETE, _) => Reply::error(
                StatusCode::NOT_FOUND,
                "Requested resource not found".to_string(),
            ),
            _ => Reply::error(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed"),
        }
    }
}
