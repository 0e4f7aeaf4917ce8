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
//! With `--etcd` ([`MetaCollections`]) a change is made in the cluster's manifest in etcd
//! and answered once every live node applied it (`cluster_meta.rs`).
//!
//! A change answers `{"uid": "<new manifest uid in hex>"}`. Errors carry Couchbase's
//! wording, which the SDKs match: "already exists" (400), "not found" (404).

use super::Reply;
use super::form::Form;
use crate::bucket_manager::BucketManager;
use crate::cluster_meta::{ClusterMeta, ManifestRefusal, MetaError};
use epkv_engine::collections::ManifestChange;
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

/// A request under `scopes`, parsed.
enum Request {
    /// The manifest.
    Get,
    /// A change, and what it changes ("Scope" or "Collection", for the messages).
    Change(ManifestChange, &'static str),
}

/// Parses `METHOD scopes/{rest...}`; a malformed one is the answer.
fn parse(method: &Method, rest: &[String], form: &Form) -> Result<Request, Reply> {
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (method, rest.as_slice()) {
        (&Method::GET, []) => Ok(Request::Get),
        (&Method::POST, []) => match form.get("name") {
            Some(name) => Ok(Request::Change(
                ManifestChange::CreateScope {
                    name: name.to_owned(),
                },
                "Scope",
            )),
            None => Err(Reply::invalid("name", "The value must be supplied")),
        },
        (&Method::DELETE, [scope]) => Ok(Request::Change(
            ManifestChange::DropScope {
                name: (*scope).to_owned(),
            },
            "Scope",
        )),
        (&Method::POST, [scope, "collections"]) => {
            let Some(name) = form.get("name") else {
                return Err(Reply::invalid("name", "The value must be supplied"));
            };
            let max_ttl = match form.get("maxTTL").map(str::parse::<i64>) {
                None => 0,
                Some(Ok(t)) if (0..=i64::from(i32::MAX)).contains(&t) => {
                    u32::try_from(t).unwrap_or(0)
                }
                Some(_) => {
                    return Err(Reply::invalid(
                        "maxTTL",
                        "The value must be an integer between 0 and 2147483647",
                    ));
                }
            };
            Ok(Request::Change(
                ManifestChange::CreateCollection {
                    scope: (*scope).to_owned(),
                    name: name.to_owned(),
                    max_ttl,
                },
                "Collection",
            ))
        }
        (&Method::DELETE, [scope, "collections", name]) => Ok(Request::Change(
            ManifestChange::DropCollection {
                scope: (*scope).to_owned(),
                name: (*name).to_owned(),
            },
            "Collection",
        )),
        (&Method::GET | &Method::POST | &Method::DELETE, _) => Err(Reply::error(
            StatusCode::NOT_FOUND,
            "Requested resource not found".to_string(),
        )),
        _ => Err(Reply::error(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
        )),
    }
}

impl CollectionsApi for EngineCollections {
    fn handle(&self, bucket: &str, method: &Method, rest: &[String], form: &Form) -> Reply {
        let Some((_, b)) = self.buckets.get(bucket) else {
            return Reply::error(StatusCode::NOT_FOUND, format!("no bucket {bucket:?}"));
        };
        let engine: &dyn Engine = &*b;
        match parse(method, rest, form) {
            Err(r) => r,
            Ok(Request::Get) => match engine.collections_manifest() {
                Ok(text) => match serde_json::from_str(&text) {
                    Ok(v) => Reply::json(v),
                    Err(e) => Reply::error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                },
                Err(e) => Reply::error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}")),
            },
            Ok(Request::Change(change, what)) => {
                let result = match &change {
                    ManifestChange::CreateScope { name } => engine.create_scope(name),
                    ManifestChange::DropScope { name } => engine.drop_scope(name),
                    ManifestChange::CreateCollection {
                        scope,
                        name,
                        max_ttl,
                    } => engine.create_collection(scope, name, *max_ttl),
                    ManifestChange::DropCollection { scope, name } => {
                        engine.drop_collection(scope, name)
                    }
                };
                changed(result, what)
            }
        }
    }
}

/// With `--etcd`: changes are the cluster's ([`ClusterMeta::change_manifest`]), reads
/// are this node's (which has applied every change its callers were answered).
pub(crate) struct MetaCollections {
    /// The cluster's metadata.
    pub(crate) meta: Arc<ClusterMeta>,
    /// This node's engines, for reads.
    pub(crate) local: EngineCollections,
}

impl CollectionsApi for MetaCollections {
    fn handle(&self, bucket: &str, method: &Method, rest: &[String], form: &Form) -> Reply {
        match parse(method, rest, form) {
            Err(r) => r,
            Ok(Request::Get) => self.local.handle(bucket, method, rest, form),
            Ok(Request::Change(change, what)) => {
                match self
                    .meta
                    .block_on(self.meta.change_manifest(bucket, &change))
                {
                    Ok(uid) => changed(Ok(uid), what),
                    Err(MetaError::Refused(ManifestRefusal::Status(s))) => changed(Err(s), what),
                    Err(MetaError::Refused(ManifestRefusal::NoBucket)) => {
                        Reply::error(StatusCode::NOT_FOUND, format!("no bucket {bucket:?}"))
                    }
                    Err(e) => super::meta_error(&e),
                }
            }
        }
    }
}
