//! The management REST subset on `--mgmt-port` (default 8091): what the Couchbase SDKs'
//! cluster, bucket and user managers and Couchbase's tools call. See `docs/rest.md`.
//!
//! - [`pools`]: the JSON of `/pools`, `/pools/default`, `/pools/nodes` and the buckets;
//! - [`rbac`]: users (`/settings/rbac/users`) and their Couchbase roles;
//! - [`form`]: form-encoded bodies and percent-encoded paths;
//! - [`scopes`]: the hook where scopes and collections will be served.
//!
//! Access is the KV port's users over HTTP Basic auth ([`crate::http_auth`]); each
//! endpoint family needs one Couchbase privilege of the user's roles, checked in
//! [`route`] through `need`/`guarded` (docs/rest.md lists them). No credentials: 401 with
//! `WWW-Authenticate`; not allowed: 403 with Couchbase's JSON body naming the permission,
//! and an `access_denied` event in the audit log when there is one. Every error has a JSON body;
//! anything unknown is 404. Building, dropping and flushing buckets and deriving password
//! verifiers run on Tokio's blocking pool, never on the thread that serves HTTP and
//! accepts KV connections.

mod form;
mod pools;
mod rbac;
mod rebalance;
mod scopes;

pub(crate) use rbac::{UserAdmin, UserChangeError};

use crate::bucket_manager::{
    BucketManager, BucketParams, BucketType, ChangeError, DurabilityMin, EvictionMode,
};
use crate::cluster_meta::{ClusterMeta, MetaError};
use crate::http_auth::{Access, Grants, Verdict};
use crate::http_server::{Authenticated, HttpListener, HttpResponse, reply};
use epkv_auth::{AuditKind, Interface, Privilege, Roles};
use epkv_cluster::{Cluster, ClusterError};
use epkv_engine_api::{Engine, EngineStatus};
use epkv_executor::Clock;
use epkv_frontend::FrontendHandle;
use form::Form;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, StatusCode};
use pools::NodeFacts;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// Largest request body read (forms are a few hundred bytes).
const MAX_BODY_BYTES: usize = 64 * 1024;

/// An answer before it becomes an HTTP response: a status and a JSON body (or none).
#[derive(Debug)]
pub(crate) struct Reply {
    status: StatusCode,
    body: Option<Value>,
}

impl Reply {
    fn json(body: Value) -> Self {
        Self {
            status: StatusCode::OK,
            body: Some(body),
        }
    }

    fn empty(status: StatusCode) -> Self {
        Self { status, body: None }
    }

    /// An error with `{"error": message}`.
    pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            body: Some(json!({ "error": message.into() })),
        }
    }

    /// A 400 with Couchbase's validation shape, `{"errors": {field: message}}`.
    pub(crate) fn invalid(field: &str, message: impl Into<String>) -> Self {
        let mut errors = serde_json::Map::new();
        errors.insert(field.to_owned(), Value::String(message.into()));
        Self::invalid_all(errors)
    }

    fn invalid_all(errors: serde_json::Map<String, Value>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            body: Some(json!({ "errors": errors, "summaries": {} })),
        }
    }

    fn forbidden(permission: &str) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            body: Some(json!({
                "message": "Forbidden. User needs the following permissions",
                "permissions": [permission],
            })),
        }
    }

    /// A 404 whose body is a JSON string, as Couchbase answers for an unknown user (the
    /// SDKs match the text `Unknown user` at its start).
    fn unknown_user() -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            body: Some(Value::String("Unknown user.".into())),
        }
    }

    fn not_found(what: impl Into<String>) -> Self {
        Self::error(StatusCode::NOT_FOUND, what)
    }

    fn into_response(self) -> HttpResponse {
        let Some(body) = self.body else {
            return reply(self.status, "");
        };
        let mut r = reply(self.status, body.to_string());
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r
    }
}

/// What the endpoint serves from.
pub(crate) struct Mgmt {
    access: Arc<Access>,
    buckets: Arc<BucketManager>,
    users: Arc<UserAdmin>,
    frontend: FrontendHandle,
    cluster: Arc<Cluster>,
    collections: Box<dyn scopes::CollectionsApi>,
    /// With `--etcd`: buckets, collections and users are the cluster's, changed in etcd.
    meta: Option<Arc<ClusterMeta>>,
    version: String,
    uuid: String,
    clock: Arc<dyn Clock>,
    started: Instant,
    /// Testing mode (`--testing`): `POST /diag/replication` pauses replication.
    testing: bool,
}

impl Mgmt {
    /// The endpoint's state.
    pub(crate) fn new(
        access: Arc<Access>,
        buckets: Arc<BucketManager>,
        users: Arc<UserAdmin>,
        frontend: FrontendHandle,
        cluster: Arc<Cluster>,
        version: String,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut uuid = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut uuid);
        let collections_of = Arc::clone(&buckets);
        let started = clock.now();
        Self {
            access,
            buckets,
            users,
            frontend,
            cluster,
            collections: Box::new(scopes::EngineCollections {
                buckets: Arc::clone(&collections_of),
            }),
            meta: None,
            version,
            uuid: uuid.iter().map(|b| format!("{b:02x}")).collect(),
            clock,
            started,
            testing: false,
        }
    }

    /// Turns testing-only endpoints on.
    pub(crate) fn with_testing(mut self, testing: bool) -> Self {
        self.testing = testing;
        self
    }

    /// Makes bucket, scope, collection and user changes the cluster's: computed against
    /// and written to etcd, and answered once every live node applied them
    /// ([`ClusterMeta`]).
    pub(crate) fn with_meta(mut self, meta: Arc<ClusterMeta>) -> Self {
        self.collections = Box::new(scopes::MetaCollections {
            meta: Arc::clone(&meta),
            local: scopes::EngineCollections {
                buckets: Arc::clone(&self.buckets),
            },
        });
        self.meta = Some(meta);
        self
    }

    /// Serves on `listener` (on the current Tokio runtime).
    ///
    /// # Errors
    /// When the listener cannot be registered with the runtime.
    pub(crate) fn spawn(self, listener: HttpListener) -> std::io::Result<()> {
        let state = Arc::new(self);
        listener.spawn("mgmt", move |req, local, peer| {
            let state = Arc::clone(&state);
            async move { handle(state, req, local, peer).await }
        })
    }

    fn facts(&self) -> NodeFacts {
        NodeFacts {
            version: self.version.clone(),
            uuid: self.uuid.clone(),
            kv_port: self.frontend.kv_port(),
            kv_ssl_port: self.frontend.kv_ssl_port(),
            uptime_secs: self
                .clock
                .now()
                .saturating_duration_since(self.started)
                .as_secs(),
        }
    }
}

async fn handle(
    state: Arc<Mgmt>,
    req: Request<Incoming>,
    local: SocketAddr,
    peer: SocketAddr,
) -> HttpResponse {
    let authorization = req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes);
    let verdict = state
        .access
        .check(authorization, peer, Interface::Rest)
        .await;
    if verdict == Verdict::Denied {
        let mut r =
            Reply::error(StatusCode::UNAUTHORIZED, "authentication required").into_response();
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"epkv\""),
        );
        return r;
    }
    let authenticated = matches!(verdict, Verdict::User(_));
    let mut r = answer(state, req, verdict, local, peer).await;
    if authenticated {
        r.extensions_mut().insert(Authenticated);
    }
    r
}

/// Answers a request whose credentials were checked.
async fn answer(
    state: Arc<Mgmt>,
    req: Request<Incoming>,
    verdict: Verdict,
    local: SocketAddr,
    peer: SocketAddr,
) -> HttpResponse {
    let method = req.method().clone();
    let segments: Option<Vec<String>> = req
        .uri()
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| form::percent_decode(s, false))
        .collect();
    let Some(segments) = segments else {
        return Reply::not_found("no such resource").into_response();
    };
    let form = if method == Method::POST || method == Method::PUT {
        match http_body_util::Limited::new(req.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
        {
            Ok(body) => match Form::parse(&body.to_bytes()) {
                Ok(f) => f,
                Err(e) => return Reply::invalid("_", e).into_response(),
            },
            Err(_) => {
                return Reply::error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("the body is larger than {MAX_BODY_BYTES} bytes or was cut off"),
                )
                .into_response();
            }
        }
    } else {
        Form::default()
    };
    let state2 = Arc::clone(&state);
    let answered = tokio::task::spawn_blocking(move || {
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        let grants = state2.access.grants(&verdict);
        let caller = Caller {
            verdict,
            grants,
            peer,
        };
        route(&state2, &caller, &method, &segs, &segments, &form, local)
    })
    .await;
    match answered {
        Ok(r) => r.into_response(),
        Err(e) => {
            tracing::error!(error = %e, "management request failed");
            Reply::error(StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }
    }
}

fn method_not_allowed(allowed: &str) -> Reply {
    Reply::error(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed here; use {allowed}"),
    )
}

/// Who asks: the verdict on their credentials, what it grants (resolved once per
/// request) and their address.
pub(crate) struct Caller {
    verdict: Verdict,
    grants: Grants,
    peer: SocketAddr,
}

impl Caller {
    fn user(&self) -> Option<&str> {
        self.verdict.user()
    }
}

/// Couchbase's name of the permission a REST request needs for `privilege` on `bucket`,
/// as a 403 body lists it.
pub(crate) fn permission(privilege: Privilege, bucket: Option<&str>) -> String {
    let b = bucket.unwrap_or("*");
    match privilege {
        Privilege::SettingsRead => format!("cluster.bucket[{b}].settings!read"),
        Privilege::BucketManagement => format!("cluster.bucket[{b}].settings!write"),
        Privilege::Flush => format!("cluster.bucket[{b}]!flush"),
        Privilege::CollectionManagement => format!("cluster.bucket[{b}].collections!write"),
        Privilege::SimpleStats => format!("cluster.bucket[{b}].stats!read"),
        Privilege::BucketCreate if bucket.is_some() => format!("cluster.bucket[{b}]!delete"),
        Privilege::BucketCreate => "cluster.buckets!create".to_owned(),
        Privilege::ClusterManagement => "cluster.pools!write".to_owned(),
        Privilege::SystemSettings => "cluster.pools!read".to_owned(),
        Privilege::SecurityRead => "cluster.admin.security!read".to_owned(),
        Privilege::SecurityManagement => "cluster.admin.security!write".to_owned(),
        Privilege::Stats => "cluster.stats!read".to_owned(),
        other => format!("cluster.admin!{}", other.name()),
    }
}

/// Whether `caller` holds `privilege` on `bucket`; when not, the 403 to answer (and the
/// refusal is audited).
fn need(
    m: &Mgmt,
    caller: &Caller,
    privilege: Privilege,
    bucket: Option<&str>,
) -> Result<(), Reply> {
    if caller.grants.allows(privilege, bucket) {
        return Ok(());
    }
    Err(refuse(m, caller, bucket, &permission(privilege, bucket)))
}

/// A 403 naming `permission`, audited.
fn refuse(m: &Mgmt, caller: &Caller, bucket: Option<&str>, permission: &str) -> Reply {
    audit_change(m, caller, AuditKind::AccessDenied, bucket, permission);
    Reply::forbidden(permission)
}

/// Records what `caller` did (or was refused).
fn audit_change(m: &Mgmt, caller: &Caller, kind: AuditKind, bucket: Option<&str>, detail: &str) {
    m.access.audit().record(
        &caller
            .verdict
            .audit_event(kind, Interface::Rest, caller.peer)
            .bucket_opt(bucket)
            .detail(detail),
    );
}

/// Answers `then()` if `caller` holds `privilege` on `bucket`, else 403.
fn guarded(
    m: &Mgmt,
    caller: &Caller,
    privilege: Privilege,
    bucket: Option<&str>,
    then: impl FnOnce() -> Reply,
) -> Reply {
    match need(m, caller, privilege, bucket) {
        Ok(()) => then(),
        Err(r) => r,
    }
}

fn no_bucket(name: &str) -> Reply {
    Reply::not_found(format!("Requested resource not found: no bucket {name:?}"))
}

/// Answers one request. Runs on the blocking pool. Every endpoint family checks one
/// privilege through [`need`] (docs/rest.md lists them).
fn route(
    m: &Mgmt,
    caller: &Caller,
    method: &Method,
    segs: &[&str],
    owned: &[String],
    form: &Form,
    local: SocketAddr,
) -> Reply {
    let get = method == Method::GET || method == Method::HEAD;
    let c = caller;
    match segs {
        ["pools"] if get => guarded(m, c, Privilege::SystemSettings, None, || {
            Reply::json(pools::pools(
                &m.facts(),
                c.grants.is_admin(),
                c.grants.allows(Privilege::SecurityRead, None),
            ))
        }),
        ["controller", "reAddNode" | "setRecoveryType"] => match *method {
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                re_add_node(m, segs[1], form)
            }),
            _ => method_not_allowed("POST"),
        },
        ["controller", "failOver" | "startGracefulFailover"] => match *method {
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                fail_over_node(m, segs[1] == "startGracefulFailover", form)
            }),
            _ => method_not_allowed("POST"),
        },
        ["controller", "rebalance"] => match *method {
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                rebalance::start(m, form)
            }),
            _ => method_not_allowed("POST"),
        },
        ["controller", "stopRebalance"] => match *method {
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                rebalance::stop(m)
            }),
            _ => method_not_allowed("POST"),
        },
        ["pools", "default", "rebalanceProgress"] if get => {
            guarded(m, c, Privilege::SystemSettings, None, || {
                rebalance::progress(m)
            })
        }
        ["internalSettings"] => match *method {
            Method::GET | Method::HEAD => guarded(m, c, Privilege::SystemSettings, None, || {
                rebalance::internal_settings(m)
            }),
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                rebalance::set_internal_settings(m, form)
            }),
            _ => method_not_allowed("GET, POST"),
        },
        ["controller", "addNode"] => match *method {
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                match form.get("hostname") {
                    None => Reply::invalid("hostname", "name the node to add (HOST:PORT)"),
                    Some(h) => match m.cluster.add_node(h) {
                        Ok(id) => Reply::json(json!({ "otpNode": format!("ns_1@{id}") })),
                        Err(e) => cluster_error(e),
                    },
                }
            }),
            _ => method_not_allowed("POST"),
        },
        ["settings", "autoFailover"] => match *method {
            Method::GET | Method::HEAD => guarded(m, c, Privilege::SystemSettings, None, || {
                auto_failover_json(m.cluster.auto_failover())
            }),
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                set_auto_failover(m, form)
            }),
            _ => method_not_allowed("GET, POST"),
        },
        ["settings", "autoFailover", "resetCount"] => match *method {
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                match m.cluster.set_auto_failover(None, None, None, true) {
                    Ok(_) => Reply::empty(StatusCode::OK),
                    Err(e) => cluster_error(e),
                }
            }),
            _ => method_not_allowed("POST"),
        },
        ["diag", "replication"] if m.testing => match *method {
            Method::POST => guarded(m, c, Privilege::ClusterManagement, None, || {
                m.cluster
                    .pause_replication(form.get("paused") == Some("true"));
                Reply::empty(StatusCode::OK)
            }),
            _ => method_not_allowed("POST"),
        },
        ["pools", "default"] if get => guarded(m, c, Privilege::SystemSettings, None, || {
            Reply::json(pools::pools_default(
                &m.facts(),
                local,
                &m.buckets.snapshot(),
                &m.cluster.node_statuses(),
                m.cluster.rebalance_progress().is_some_and(|p| p.running),
            ))
        }),
        ["pools", "nodes"] if get => guarded(m, c, Privilege::SystemSettings, None, || {
            Reply::json(pools::pools_nodes(&m.facts(), local))
        }),
        ["pools"] | ["pools", "default" | "nodes"] => method_not_allowed("GET"),
        ["pools", "default", "buckets"] => match *method {
            Method::GET | Method::HEAD => {
                let facts = m.facts();
                let list: Vec<Value> = m
                    .buckets
                    .snapshot()
                    .iter()
                    .filter(|(p, _)| c.grants.allows(Privilege::SettingsRead, Some(&p.name)))
                    .map(|(p, b)| pools::bucket(&facts, local, p, b))
                    .collect();
                Reply::json(Value::Array(list))
            }
            Method::POST => guarded(m, c, Privilege::BucketCreate, None, || {
                create_bucket(m, c, form)
            }),
            _ => method_not_allowed("GET, POST"),
        },
        ["pools", "default", "buckets", name] => match *method {
            Method::GET | Method::HEAD => {
                guarded(m, c, Privilege::SettingsRead, Some(name), || {
                    match m.buckets.get(name) {
                        Some((p, b)) => Reply::json(pools::bucket(&m.facts(), local, &p, &b)),
                        None => no_bucket(name),
                    }
                })
            }
            Method::DELETE => guarded(m, c, Privilege::BucketCreate, Some(name), || {
                let dropped = match &m.meta {
                    Some(meta) => match meta.block_on(meta.drop_bucket(name)) {
                        Ok(()) => Ok(()),
                        Err(MetaError::Refused(e)) => Err(e),
                        Err(e) => return meta_error(&e),
                    },
                    None => m.buckets.drop_bucket(name),
                };
                match dropped {
                    Ok(()) => {
                        m.cluster.buckets_changed();
                        audit_change(m, c, AuditKind::BucketDropped, Some(name), "");
                        Reply::empty(StatusCode::OK)
                    }
                    Err(e) => change_error(e),
                }
            }),
            _ => method_not_allowed("GET, DELETE"),
        },
        ["pools", "default", "buckets", name, "controller", "doFlush"] => {
            if *method != Method::POST {
                return method_not_allowed("POST");
            }
            if let Err(r) = need(m, c, Privilege::Flush, Some(name)) {
                return r;
            }
            let Some((params, bucket)) = m.buckets.get(name) else {
                return no_bucket(name);
            };
            if !params.flush_enabled {
                return Reply::invalid("_", "Flush is disabled for the bucket");
            }
            match bucket.flush() {
                Ok(()) => {
                    audit_change(m, c, AuditKind::BucketFlushed, Some(name), "");
                    Reply::empty(StatusCode::OK)
                }
                Err(EngineStatus::NotSupported) => {
                    Reply::invalid("_", "Flush is disabled for the bucket")
                }
                Err(e) => Reply::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("flush failed: {e:?}"),
                ),
            }
        }
        ["pools", "default", "buckets", name, "scopes", ..] => {
            let privilege = if get {
                Privilege::SettingsRead
            } else {
                Privilege::CollectionManagement
            };
            if let Err(r) = need(m, c, privilege, Some(name)) {
                return r;
            }
            if m.buckets.get(name).is_none() {
                return no_bucket(name);
            }
            m.collections.handle(name, method, &owned[5..], form)
        }
        ["pools", "default", "b", name] if get => {
            guarded(m, c, Privilege::SettingsRead, Some(name), || {
                match m.frontend.bucket_config(name, local) {
                    Some(text) => match serde_json::from_str(&text) {
                        Ok(v) => Reply::json(v),
                        Err(e) => Reply::error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
                    },
                    None => no_bucket(name),
                }
            })
        }
        ["settings", "rbac", "users"] | ["settings", "rbac", "users", "local"] if get => {
            guarded(m, c, Privilege::SecurityRead, None, || {
                let users = m.users.current();
                let list: Vec<Value> = users
                    .user_names()
                    .filter_map(|n| users.roles(n).map(|a| rbac::user_json(n, a)))
                    .collect();
                Reply::json(Value::Array(list))
            })
        }
        ["settings", "rbac", "users", "local", name] => {
            match *method {
                Method::GET | Method::HEAD => guarded(m, c, Privilege::SecurityRead, None, || {
                    match m.users.current().roles(name) {
                        Some(a) => Reply::json(rbac::user_json(name, a)),
                        None => Reply::unknown_user(),
                    }
                }),
                Method::PUT => guarded(m, c, Privilege::SecurityManagement, None, || {
                    upsert_user(m, c, name, form)
                }),
                Method::DELETE => guarded(m, c, Privilege::SecurityManagement, None, || {
                    if let Err(r) = may_manage(m, c, name, None) {
                        return r;
                    }
                    let removed = match &m.meta {
                        Some(meta) => match meta.block_on(meta.remove_user(name)) {
                            Ok(()) => Ok(()),
                            Err(MetaError::Refused(e)) => Err(e),
                            Err(e) => return meta_error(&e),
                        },
                        None => m.users.remove(name),
                    };
                    match removed {
                        Ok(()) => {
                            m.access.forget();
                            audit_change(m, c, AuditKind::UserDeleted, None, name);
                            Reply::empty(StatusCode::OK)
                        }
                        Err(e) => user_error(e),
                    }
                }),
                _ => method_not_allowed("GET, PUT, DELETE"),
            }
        }
        _ => Reply::not_found(format!(
            "no such resource: {method} /{}; see docs/rest.md for what epkv serves",
            segs.join("/")
        )),
    }
}

/// Couchbase's permission for managing administrators and security administrators,
/// which only `admin` holds.
const MANAGE_ADMINS: &str = "cluster.admin.security.admin!write";

/// Whether the roles grant `admin` or `security_admin`.
fn has_admin_roles(roles: &Roles) -> bool {
    roles
        .roles()
        .iter()
        .any(|r| matches!(r.name(), "admin" | "security_admin"))
}

/// The rules of Couchbase for a user manager who is not `admin` (a `security_admin`):
/// they cannot grant `admin` or `security_admin`, change or delete a user who holds
/// either, nor change or delete themselves. `new_roles` is what a PUT would grant.
fn may_manage(m: &Mgmt, c: &Caller, target: &str, new_roles: Option<&Roles>) -> Result<(), Reply> {
    if c.grants.is_admin() {
        return Ok(());
    }
    let current = m.users.current().roles(target).cloned();
    if c.user() == Some(target)
        || new_roles.is_some_and(has_admin_roles)
        || current.as_ref().is_some_and(has_admin_roles)
    {
        return Err(refuse(m, c, None, MANAGE_ADMINS));
    }
    Ok(())
}

fn change_error(e: ChangeError) -> Reply {
    match e {
        ChangeError::Exists => Reply::invalid("name", e.to_string()),
        ChangeError::NotFound => Reply::not_found(e.to_string()),
        ChangeError::Invalid(field, msg) => Reply::invalid(field, msg),
        ChangeError::Failed(e) => {
            tracing::error!(error = %format!("{e:#}"), "bucket change failed");
            Reply::error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
        }
    }
}

/// The answer to a cluster-wide change that etcd did not take, or that not every node
/// confirmed: 503 when etcd cannot be reached or kept changing, 504 when some node did
/// not confirm in time, 500 when some node could not apply it.
pub(crate) fn meta_error<E>(e: &MetaError<E>) -> Reply {
    let status = match e {
        MetaError::Unreachable(_) | MetaError::Contended | MetaError::Refused(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        MetaError::Unconfirmed { .. } => StatusCode::GATEWAY_TIMEOUT,
        MetaError::FailedOn { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let message = e.describe();
    tracing::warn!(error = %message, "cluster-wide metadata change");
    Reply::error(status, message)
}

fn user_error(e: rbac::UserChangeError) -> Reply {
    match e {
        rbac::UserChangeError::NotFound => Reply::unknown_user(),
        rbac::UserChangeError::Invalid(field, msg) => Reply::invalid(field, msg),
        rbac::UserChangeError::Failed(msg) => {
            tracing::error!(error = %msg, "user change failed");
            Reply::error(StatusCode::INTERNAL_SERVER_ERROR, msg)
        }
    }
}

fn upsert_user(m: &Mgmt, c: &Caller, name: &str, form: &Form) -> Reply {
    let roles = match rbac::parse_roles(form.get("roles").unwrap_or("")) {
        Ok(a) => a,
        Err(e) => return Reply::invalid("roles", e),
    };
    if let Err(r) = may_manage(m, c, name, Some(&roles)) {
        return r;
    }
    let mut existed = m.users.current().contains(name);
    let detail = format!("{name} roles={roles}");
    let saved = match &m.meta {
        Some(meta) => match meta.block_on(meta.upsert_user(name, form.get("password"), &roles)) {
            Ok(e) => {
                existed = e;
                Ok(())
            }
            Err(MetaError::Refused(e)) => Err(e),
            Err(e) => return meta_error(&e),
        },
        None => m.users.upsert(name, form.get("password"), roles),
    };
    match saved {
        Ok(()) => {
            m.access.forget();
            let kind = if existed {
                AuditKind::UserChanged
            } else {
                AuditKind::UserCreated
            };
            audit_change(m, c, kind, None, &detail);
            Reply::empty(StatusCode::OK)
        }
        Err(e) => user_error(e),
    }
}

/// Parses a non-negative integer field.
/// A cluster change's error as the REST API answers it: 400 for a refused request, 503
/// when the cluster's state store cannot be reached.
pub(crate) fn cluster_error(e: ClusterError) -> Reply {
    match e {
        ClusterError::Invalid(msg) => Reply::error(StatusCode::BAD_REQUEST, msg),
        ClusterError::Unavailable(msg) => Reply::error(StatusCode::SERVICE_UNAVAILABLE, msg),
    }
}

/// `POST /controller/failOver` (`otpNode`, `allowUnsafe=true` to fail over a node
/// holding the last copy of some vBuckets) and `/controller/startGracefulFailover`
/// (`otpNode`: the node refuses writes until its replicas caught up, then they are
/// promoted; answered once done).
fn fail_over_node(m: &Mgmt, graceful: bool, form: &Form) -> Reply {
    let Some(node) = form.get("otpNode") else {
        return Reply::invalid(
            "otpNode",
            "name the node to fail over (host:port or its index)",
        );
    };
    let done = if graceful {
        m.cluster.graceful_fail_over(node)
    } else {
        m.cluster
            .fail_over(node, form.get("allowUnsafe") == Some("true"))
    };
    match done {
        Ok(_) => Reply::empty(StatusCode::OK),
        Err(e) => cluster_error(e),
    }
}

/// `POST /controller/reAddNode` (`otpNode`) and `/controller/setRecoveryType`
/// (`otpNode`, `recoveryType=delta|full`): the node becomes a replica again and streams
/// the difference from the actives (delta recovery; a vBucket whose history diverged
/// starts over), or, with `full`, drops what it holds and streams everything.
fn re_add_node(m: &Mgmt, which: &str, form: &Form) -> Reply {
    let Some(node) = form.get("otpNode") else {
        return Reply::invalid(
            "otpNode",
            "name the node to add back (host:port or its index)",
        );
    };
    let full = match (which, form.get("recoveryType")) {
        ("reAddNode", _) | (_, Some("delta")) => false,
        (_, Some("full")) => true,
        _ => return Reply::invalid("recoveryType", "recoveryType must be delta or full"),
    };
    match m.cluster.re_add_with(node, full) {
        Ok(_) => Reply::empty(StatusCode::OK),
        Err(e) => cluster_error(e),
    }
}

/// `GET /settings/autoFailover`'s document.
fn auto_failover_json(a: epkv_cluster::AutoFailover) -> Reply {
    Reply::json(json!({
        "enabled": a.enabled,
        "timeout": a.timeout,
        "count": a.count,
        "maxCount": a.max_count,
        "failoverOnDataDiskIssues": { "enabled": false, "timePeriod": 120 },
        "failoverServerGroup": false,
    }))
}

/// `POST /settings/autoFailover` (`enabled`, `timeout`, `maxCount`).
fn set_auto_failover(m: &Mgmt, form: &Form) -> Reply {
    let enabled = match form.get("enabled") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(_) => {
            return Reply::invalid(
                "enabled",
                "The value must be one of the following: [true,false]",
            );
        }
    };
    let Ok(timeout) = int_field(form, &["timeout"]) else {
        return Reply::invalid("timeout", "The value must be an integer between 1 and 3600");
    };
    let max_count = match int_field(form, &["maxCount"]) {
        Ok(v) => v.map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
        Err(()) => {
            return Reply::invalid("maxCount", "The value must be an integer between 1 and 100");
        }
    };
    match m
        .cluster
        .set_auto_failover(enabled, timeout, max_count, false)
    {
        Ok(a) => auto_failover_json(a),
        Err(ClusterError::Invalid(msg)) if msg.starts_with("timeout") => {
            Reply::invalid("timeout", msg)
        }
        Err(ClusterError::Invalid(msg)) if msg.starts_with("maxCount") => {
            Reply::invalid("maxCount", msg)
        }
        Err(e) => cluster_error(e),
    }
}

fn int_field(form: &Form, names: &[&str]) -> Result<Option<u64>, ()> {
    match form.first_of(names) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| ()),
    }
}

/// Validates a create form into the bucket's parameters, every bad field reported.
fn bucket_params(form: &Form, default_quota: u64) -> Result<BucketParams, Reply> {
    let mut errors = serde_json::Map::new();
    let mut bad = |field: &str, msg: &str| {
        errors.insert(field.to_owned(), Value::String(msg.to_owned()));
    };
    let name = form.get("name").unwrap_or("").to_owned();
    if name.is_empty() {
        bad("name", "Bucket name cannot be empty");
    } else if !epkv_frontend::is_valid_bucket_name(&name) {
        bad(
            "name",
            "Bucket name can only contain characters in range A-Z, a-z, 0-9 as well as \
             underscore, period, dash & percent, must not start with a period and must be at \
             most 100 characters long",
        );
    }
    let bucket_type = match form.get("bucketType").unwrap_or("membase") {
        "membase" | "couchbase" => Some(BucketType::Membase),
        "ephemeral" => Some(BucketType::Ephemeral),
        _ => {
            bad(
                "bucketType",
                "invalid bucket type: use couchbase (membase) or ephemeral",
            );
            None
        }
    };
    let quota = match int_field(form, &["ramQuotaMB", "ramQuota"]) {
        Ok(Some(mb)) if (1..=u64::MAX >> 20).contains(&mb) => mb << 20,
        Ok(None) => default_quota,
        _ => {
            bad(
                "ramQuota",
                "The RAM Quota must be specified and must be a positive integer (MiB).",
            );
            0
        }
    };
    match int_field(form, &["replicaNumber"]) {
        Ok(None | Some(0)) => {}
        Ok(Some(_)) => bad(
            "replicaNumber",
            "epkv has no replication: the replica number must be 0",
        ),
        Err(()) => bad(
            "replicaNumber",
            "The replica number must be specified and must be a non-negative integer.",
        ),
    }
    let flush_enabled = match form.get("flushEnabled") {
        None | Some("0") => false,
        Some("1") => true,
        Some(_) => {
            bad("flushEnabled", "flushEnabled can only be 1 or 0");
            false
        }
    };
    let durability_min_level = match form.get("durabilityMinLevel").map(DurabilityMin::parse) {
        None => DurabilityMin::None,
        Some(Some(d)) if bucket_type.is_none_or(|t| d.fits(t)) => d,
        Some(Some(_)) => {
            bad(
                "durabilityMinLevel",
                "Durability minimum level must be none or majority for ephemeral buckets",
            );
            DurabilityMin::None
        }
        Some(None) => {
            bad(
                "durabilityMinLevel",
                "Durability minimum level must be one of none, majority, \
                 majorityAndPersistActive or persistToMajority",
            );
            DurabilityMin::None
        }
    };
    match int_field(form, &["maxTTL"]) {
        Ok(None | Some(0)) => {}
        Ok(Some(_)) => bad(
            "maxTTL",
            "only maxTTL 0 is supported: a bucket maximum TTL is not implemented",
        ),
        Err(()) => bad(
            "maxTTL",
            "Max TTL must be an integer between 0 and 2147483647",
        ),
    }
    let eviction = match (form.get("evictionPolicy"), bucket_type) {
        (None, Some(BucketType::Ephemeral)) => Some(EvictionMode::NoEviction),
        (None, _) => Some(EvictionMode::ValueOnly),
        (Some(e), t) => match (EvictionMode::parse(e), t) {
            (Some(e), Some(t)) if e.fits(t) => Some(e),
            (Some(_), None) => None,
            _ => {
                bad(
                    "evictionPolicy",
                    "Eviction policy must be either 'valueOnly' or 'fullEviction' for \
                     couchbase buckets and 'noEviction' or 'nruEviction' for ephemeral buckets",
                );
                None
            }
        },
    };
    match (bucket_type, eviction) {
        (Some(bucket_type), Some(eviction_policy)) if errors.is_empty() => Ok(BucketParams {
            name,
            bucket_type,
            quota_bytes: quota,
            eviction_policy,
            flush_enabled,
            durability_min_level,
        }),
        _ => Err(Reply::invalid_all(errors)),
    }
}

fn create_bucket(m: &Mgmt, c: &Caller, form: &Form) -> Reply {
    let default_quota = m
        .buckets
        .get(epkv_frontend::DEFAULT_BUCKET)
        .map_or(1 << 30, |(p, _)| p.quota_bytes);
    let params = match bucket_params(form, default_quota) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let name = params.name.clone();
    let created = match &m.meta {
        Some(meta) => match meta.block_on(meta.create_bucket(params)) {
            Ok(()) => Ok(()),
            Err(MetaError::Refused(e)) => Err(e),
            Err(e) => return meta_error(&e),
        },
        None => m.buckets.create(params),
    };
    match created {
        Ok(()) => {
            m.cluster.buckets_changed();
            audit_change(m, c, AuditKind::BucketCreated, Some(&name), "");
            Reply::empty(StatusCode::ACCEPTED)
        }
        Err(e) => change_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(body: &str) -> Result<BucketParams, Value> {
        bucket_params(&Form::parse(body.as_bytes()).unwrap(), 7 << 20).map_err(|r| {
            assert_eq!(r.status, StatusCode::BAD_REQUEST);
            r.body.unwrap()["errors"].clone()
        })
    }

    #[test]
    fn a_minimal_form_makes_a_persistent_value_eviction_bucket() {
        let p = params("name=travel").unwrap();
        assert_eq!(p.bucket_type, BucketType::Membase);
        assert_eq!(
            p.quota_bytes,
            7 << 20,
            "the server's quota when none is given"
        );
        assert_eq!(p.eviction_policy, EvictionMode::ValueOnly);
        assert!(!p.flush_enabled);
        let p = params(
            "name=t&ramQuotaMB=100&bucketType=ephemeral&flushEnabled=1&replicaNumber=0&\
             durabilityMinLevel=none&maxTTL=0",
        )
        .unwrap();
        assert_eq!(p.quota_bytes, 100 << 20);
        assert_eq!(p.eviction_policy, EvictionMode::NoEviction);
        assert!(p.flush_enabled);
        assert_eq!(params("name=t&ramQuota=5").unwrap().quota_bytes, 5 << 20);
        assert_eq!(p.durability_min_level, DurabilityMin::None);
        for (level, want) in [
            ("majority", DurabilityMin::Majority),
            (
                "majorityAndPersistActive",
                DurabilityMin::MajorityAndPersistActive,
            ),
            ("persistToMajority", DurabilityMin::PersistToMajority),
        ] {
            let p = params(&format!("name=t&durabilityMinLevel={level}")).unwrap();
            assert_eq!(p.durability_min_level, want);
            assert_eq!(want.as_str(), level);
        }
        // An ephemeral bucket cannot persist: majority at most.
        let p = params("name=t&bucketType=ephemeral&durabilityMinLevel=majority").unwrap();
        assert_eq!(p.durability_min_level, DurabilityMin::Majority);
        let e =
            params("name=t&bucketType=ephemeral&durabilityMinLevel=persistToMajority").unwrap_err();
        assert!(e.get("durabilityMinLevel").is_some(), "{e}");
    }

    #[test]
    fn every_bad_field_is_reported_by_name() {
        let e = params(
            "name=.x&ramQuotaMB=abc&replicaNumber=1&flushEnabled=yes&durabilityMinLevel=always&\
             maxTTL=x&bucketType=memcached",
        )
        .unwrap_err();
        for f in [
            "name",
            "ramQuota",
            "replicaNumber",
            "flushEnabled",
            "durabilityMinLevel",
            "maxTTL",
            "bucketType",
        ] {
            assert!(e.get(f).is_some(), "{f} in {e}");
        }
        let e = params("name=a&evictionPolicy=noEviction").unwrap_err();
        assert!(e.get("evictionPolicy").is_some(), "{e}");
        assert!(params("").unwrap_err().get("name").is_some());
        assert!(
            params("name=a&ramQuotaMB=0")
                .unwrap_err()
                .get("ramQuota")
                .is_some()
        );
        assert!(
            params("name=a&replicaNumber=-1")
                .unwrap_err()
                .get("replicaNumber")
                .is_some()
        );
    }
}
