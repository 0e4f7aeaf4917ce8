//! Cluster-wide metadata in etcd (`--etcd`): bucket definitions, collection manifests and
//! REST-created users are the cluster's, not one node's. See docs/cluster.md, "Cluster-wide
//! metadata (etcd)".
//!
//! **Keys** (under the cluster's prefix `/epkv/<cluster-name>/`):
//! - `meta/initialized`: present once the cluster's metadata was seeded;
//! - `meta/buckets/<name>`: a bucket's definition ([`BucketParams`], as the runtime bucket
//!   list writes it);
//! - `meta/manifests/<bucket>`: its collections manifest with explicit ids, `uid` and
//!   `next_id` (the engine's manifest file format, without the node-local `dropped`);
//! - `meta/users/<name>`: a user as a one-user users file (salted SCRAM verifiers and
//!   roles, never a password);
//! - `applied/<node-id>`: `{"revision": R, "failed": {key: error}}`, the etcd revision of
//!   `meta/` this node has applied and what it could not apply; attached to its lease;
//! - `live/<node-id>` (written by the membership code): the nodes a change waits for.
//!
//! **A change** (a REST call on any node) is computed from etcd's state (validation
//! against it, with the errors a single node gives), then written in one transaction that
//! compares the `mod_revision`s it was computed from; on a conflict it is computed again
//! (at most [`MAX_ATTEMPTS`] times). The call then waits (at most the wait time, 10 s in
//! the server) until every node under `live/`, and this one, reports `applied/` at or
//! past the change's revision, and answers which nodes did not (the change stays
//! committed). etcd unreachable: the change is refused ([`MetaError::Unreachable`], 503).
//!
//! **Applying.** Each node keeps a copy of `meta/`, updated by a watch, and after every
//! batch makes its local state equal to it through the local code paths
//! ([`BucketManager::create`]/[`BucketManager::drop_bucket`],
//! [`Engine::set_collections_manifest`], [`UserAdmin::apply_put`]/`apply_remove`); then
//! writes `applied/`. A lost watch (etcd gone, revision compacted) starts over from a
//! fresh read; meanwhile the node serves its last state. At start, an empty cluster
//! (`meta/initialized` absent) is seeded from this node's state in one transaction;
//! otherwise the node reconciles its state to etcd's.
//!
//! Collection ids and manifest uids are decided once, in the transaction, and every node
//! installs the resulting manifest whole: no node assigns an id of its own.

use crate::bucket_manager::{BucketManager, BucketParams, ChangeError};
use crate::mgmt::{UserAdmin, UserChangeError};
use epkv_auth::{Roles, UserStore};
use epkv_cluster::etcd::{Change, Etcd, EtcdError, Versioned};
use epkv_engine::collections::{Manifest, ManifestChange};
use epkv_engine_api::{Engine, EngineStatus};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// How long a change waits for every live node to apply it.
pub(crate) const WAIT_FOR_NODES: Duration = Duration::from_secs(10);
/// How many times a change is computed again after a conflicting one.
pub(crate) const MAX_ATTEMPTS: usize = 8;
/// How often a waiting change reads the nodes' `applied/` keys.
const POLL_EVERY: Duration = Duration::from_millis(50);
/// The longest pause between two attempts to read etcd again after losing it.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

const META: &str = "meta/";
const INITIALIZED: &str = "meta/initialized";
const BUCKETS: &str = "meta/buckets/";
const MANIFESTS: &str = "meta/manifests/";
const USERS: &str = "meta/users/";
const APPLIED: &str = "applied/";
const LIVE: &str = "live/";

fn bucket_key(name: &str) -> String {
    format!("{BUCKETS}{name}")
}

fn manifest_key(bucket: &str) -> String {
    format!("{MANIFESTS}{bucket}")
}

fn user_key(name: &str) -> String {
    format!("{USERS}{name}")
}

/// Why a metadata change did not simply succeed.
#[derive(Debug)]
pub(crate) enum MetaError<E> {
    /// Refused against etcd's state, as a single node refuses it.
    Refused(E),
    /// etcd could not be asked: nothing changed (or, if it failed while committing,
    /// the change may have been made).
    Unreachable(String),
    /// Other changes kept winning for [`MAX_ATTEMPTS`] attempts.
    Contended,
    /// Committed at `revision`, but these nodes did not confirm within the wait.
    Unconfirmed {
        /// The change's etcd revision.
        revision: i64,
        /// The nodes that did not report it applied.
        nodes: Vec<String>,
        /// How long the change waited.
        waited: Duration,
    },
    /// Committed at `revision`, but these nodes could not apply it: (node, error).
    FailedOn {
        /// The change's etcd revision.
        revision: i64,
        /// Each node that failed, with its error.
        nodes: Vec<(String, String)>,
    },
}

impl<E> MetaError<E> {
    /// What to tell the caller, for every kind but [`MetaError::Refused`].
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Refused(_) => "refused".to_owned(),
            Self::Unreachable(e) => {
                format!("the cluster's metadata store (etcd) is unreachable: {e}")
            }
            Self::Contended => format!(
                "the cluster's metadata kept changing under this change ({MAX_ATTEMPTS} \
                 attempts); try again"
            ),
            Self::Unconfirmed {
                revision,
                nodes,
                waited,
            } => format!(
                "the change is committed (etcd revision {revision}) but these nodes did not \
                 confirm applying it within {} s: {}",
                waited.as_secs(),
                nodes.join(", ")
            ),
            Self::FailedOn { revision, nodes } => format!(
                "the change is committed (etcd revision {revision}) but these nodes could not \
                 apply it: {}",
                nodes
                    .iter()
                    .map(|(n, e)| format!("{n}: {e}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        }
    }

    fn unreachable(e: &EtcdError) -> Self {
        Self::Unreachable(e.0.clone())
    }
}

/// Why a scope or collection change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ManifestRefusal {
    /// The cluster has no such bucket.
    NoBucket,
    /// As the engine refuses it (`KeyExists`, `UnknownScope`, ...).
    Status(EngineStatus),
}

/// This node's state the metadata is applied to.
pub(crate) struct Local {
    /// The buckets.
    pub(crate) buckets: Arc<BucketManager>,
    /// The REST-managed users.
    pub(crate) users: Arc<UserAdmin>,
    /// Called after buckets were created or dropped (the cluster's `buckets_changed`).
    pub(crate) buckets_changed: Box<dyn Fn() + Send + Sync>,
    /// Called after users changed (cached verdicts are forgotten).
    pub(crate) users_changed: Box<dyn Fn() + Send + Sync>,
}

/// etcd's `meta/`, parsed.
#[derive(Debug, Default, Clone)]
struct MetaState {
    initialized: bool,
    buckets: BTreeMap<String, (BucketParams, i64)>,
    manifests: BTreeMap<String, (Manifest, i64)>,
    /// Users as one-user users files.
    users: BTreeMap<String, (String, i64)>,
}

impl MetaState {
    fn from_kvs(kvs: &[Versioned]) -> Self {
        let mut s = Self::default();
        for kv in kvs {
            s.put(kv);
        }
        s
    }

    fn apply(&mut self, change: &Change) {
        match change {
            Change::Put(kv) => self.put(kv),
            Change::Delete { key, .. } => {
                if key == INITIALIZED {
                    self.initialized = false;
                } else if let Some(n) = key.strip_prefix(BUCKETS) {
                    self.buckets.remove(n);
                } else if let Some(n) = key.strip_prefix(MANIFESTS) {
                    self.manifests.remove(n);
                } else if let Some(n) = key.strip_prefix(USERS) {
                    self.users.remove(n);
                }
            }
        }
    }

    fn put(&mut self, kv: &Versioned) {
        let rev = kv.mod_revision;
        let parsed: Result<(), String> = if kv.key == INITIALIZED {
            self.initialized = true;
            Ok(())
        } else if let Some(n) = kv.key.strip_prefix(BUCKETS) {
            serde_json::from_slice::<BucketParams>(&kv.value)
                .map_err(|e| e.to_string())
                .map(|p| {
                    self.buckets.insert(n.to_owned(), (p, rev));
                })
        } else if let Some(n) = kv.key.strip_prefix(MANIFESTS) {
            parse_manifest(&kv.value).map(|m| {
                self.manifests.insert(n.to_owned(), (m, rev));
            })
        } else if let Some(n) = kv.key.strip_prefix(USERS) {
            String::from_utf8(kv.value.clone())
                .map_err(|e| e.to_string())
                .map(|t| {
                    self.users.insert(n.to_owned(), (t, rev));
                })
        } else {
            Ok(())
        };
        if let Err(e) = parsed {
            tracing::error!(key = %kv.key, error = %e, "ignoring a malformed cluster metadata key");
        }
    }
}

fn parse_manifest(value: &[u8]) -> Result<Manifest, String> {
    let v: Value = serde_json::from_slice(value).map_err(|e| e.to_string())?;
    Manifest::from_file_json(&v)
}

/// A manifest as etcd keeps it: ids, uid and next id, without the node-local list of
/// dropped collections still to purge.
fn manifest_value(m: &Manifest) -> Vec<u8> {
    let mut v = m.to_file_json();
    if let Some(o) = v.as_object_mut() {
        o.remove("dropped");
    }
    v.to_string().into_bytes()
}

fn user_value(one: &UserStore) -> Result<Vec<u8>, String> {
    one.to_toml()
        .map(String::into_bytes)
        .map_err(|e| e.to_string())
}

fn bucket_value(p: &BucketParams) -> Vec<u8> {
    serde_json::to_vec(p).unwrap_or_default()
}

/// What this node has applied, beyond its local state.
#[derive(Default)]
struct Applier {
    /// Bucket name → the `mod_revision` of the definition it was built from (a bucket
    /// dropped and created again in the cluster has a new one).
    buckets: HashMap<String, i64>,
    /// User name → the `mod_revision` applied.
    users: HashMap<String, i64>,
    /// Keys this node could not apply, with why.
    failed: BTreeMap<String, String>,
    /// Configured buckets etcd does not have, already warned about.
    warned: HashSet<String>,
}

/// The cluster-wide metadata of one node (see the module documentation).
pub(crate) struct ClusterMeta {
    etcd: Etcd,
    node_id: String,
    local: Local,
    wait_for: Duration,
    runtime: tokio::runtime::Handle,
    /// One reconcile at a time.
    applier: tokio::sync::Mutex<Applier>,
    /// The revision of `meta/` applied.
    applied: AtomicI64,
    /// Whether the watch is following etcd.
    following: AtomicBool,
    watcher: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for ClusterMeta {
    fn drop(&mut self) {
        if let Some(w) = self.watcher.lock().take() {
            w.abort();
        }
    }
}

impl std::fmt::Debug for ClusterMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterMeta")
            .field("node_id", &self.node_id)
            .field("applied", &self.applied.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Writes `applied/<node-id>` again each time the node registers with a new lease (the
/// old lease's keys are gone), for as long as the metadata lives.
pub(crate) async fn register_on_new_leases(
    meta: std::sync::Weak<ClusterMeta>,
    mut registrations: tokio::sync::watch::Receiver<u64>,
) {
    while registrations.changed().await.is_ok() {
        let Some(m) = meta.upgrade() else { return };
        if let Err(e) = m.register().await {
            tracing::warn!(error = %e, "cannot write this node's applied revision again");
        }
    }
}

impl ClusterMeta {
    /// Seeds etcd from this node when the cluster has no metadata yet, else makes this
    /// node's state etcd's; then follows etcd's changes. Call it on a Tokio runtime that
    /// keeps running (the one REST calls will wait on).
    ///
    /// # Errors
    /// etcd could not be asked.
    pub(crate) async fn start(
        etcd: Etcd,
        node_id: String,
        local: Local,
        wait_for: Duration,
    ) -> Result<Arc<Self>, EtcdError> {
        let meta = Arc::new(Self {
            etcd,
            node_id,
            local,
            wait_for,
            runtime: tokio::runtime::Handle::current(),
            applier: tokio::sync::Mutex::new(Applier::default()),
            applied: AtomicI64::new(0),
            following: AtomicBool::new(false),
            watcher: Mutex::new(None),
        });
        meta.seed_if_empty().await?;
        let (state, revision) = meta.read().await?;
        meta.reconcile(&state, revision).await;
        meta.following.store(true, Ordering::Release);
        let task = tokio::spawn(follow(Arc::downgrade(&meta), state, revision));
        *meta.watcher.lock() = Some(task.abort_handle());
        Ok(meta)
    }

    /// This node's id (`host:port`).
    pub(crate) fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The revision of the cluster's metadata this node has applied.
    pub(crate) fn applied_revision(&self) -> i64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Whether this node is following etcd's changes (false while etcd is lost).
    #[cfg(test)]
    pub(crate) fn is_following(&self) -> bool {
        self.following.load(Ordering::Acquire)
    }

    /// Writes `applied/<node-id>` again (after the lease was replaced).
    ///
    /// # Errors
    /// etcd could not be asked.
    pub(crate) async fn register(&self) -> Result<(), EtcdError> {
        let failed = self.applier.lock().await.failed.clone();
        self.publish(self.applied_revision(), &failed).await
    }

    async fn publish(
        &self,
        revision: i64,
        failed: &BTreeMap<String, String>,
    ) -> Result<(), EtcdError> {
        let value = json!({ "revision": revision, "failed": failed });
        self.etcd
            .put_leased(&format!("{APPLIED}{}", self.node_id), value.to_string())
            .await
    }

    /// Runs `f` on the runtime the metadata was started on, from a thread that is not
    /// one of its workers (the management API's blocking pool).
    pub(crate) fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }

    async fn read(&self) -> Result<(MetaState, i64), EtcdError> {
        let (kvs, revision) = self.etcd.get_prefix(META).await?;
        Ok((MetaState::from_kvs(&kvs), revision))
    }

    /// Writes this node's buckets, manifests and REST users to etcd, in one
    /// transaction, if `meta/initialized` is absent.
    async fn seed_if_empty(&self) -> Result<(), EtcdError> {
        if self.etcd.get(INITIALIZED).await?.is_some() {
            return Ok(());
        }
        let mut puts = vec![(
            INITIALIZED.to_owned(),
            json!({ "seededBy": self.node_id }).to_string().into_bytes(),
        )];
        for (params, bucket) in self.local.buckets.snapshot() {
            puts.push((
                manifest_key(&params.name),
                manifest_value(&bucket.manifest()),
            ));
            puts.push((bucket_key(&params.name), bucket_value(&params)));
        }
        let saved = self.local.users.saved();
        for name in saved.user_names() {
            let mut one = UserStore::empty();
            one.copy_user_from(&saved, name);
            match user_value(&one) {
                Ok(v) => puts.push((user_key(name), v)),
                Err(e) => {
                    tracing::error!(user = %format_args!("<ud>{name}</ud>"), error = %e, "cannot seed a user")
                }
            }
        }
        let count = puts.len();
        match self
            .etcd
            .transact(&[(INITIALIZED.to_owned(), 0)], puts, &[])
            .await?
        {
            Some(revision) => tracing::info!(
                node = %self.node_id,
                revision,
                keys = count,
                "seeded the cluster's metadata in etcd from this node"
            ),
            None => tracing::info!("another node seeded the cluster's metadata first"),
        }
        Ok(())
    }

    /// Makes this node's state `state` (at `revision`), then reports it applied.
    async fn reconcile(self: &Arc<Self>, state: &MetaState, revision: i64) {
        let mut applier = self.applier.lock().await;
        let me = Arc::clone(self);
        let st = state.clone();
        let mut taken = std::mem::take(&mut *applier);
        let done = tokio::task::spawn_blocking(move || {
            me.reconcile_locally(&st, &mut taken);
            taken
        })
        .await;
        match done {
            Ok(a) => *applier = a,
            Err(e) => {
                tracing::error!(error = %e, "applying the cluster's metadata failed");
                return;
            }
        }
        self.applied.fetch_max(revision, Ordering::AcqRel);
        if let Err(e) = self.publish(revision, &applier.failed).await {
            tracing::warn!(error = %e, revision, "cannot report the applied metadata revision to etcd");
        }
    }

    /// Buckets, then manifests, then users, through the local code paths. Runs on the
    /// blocking pool (building a bucket touches the disk).
    fn reconcile_locally(&self, state: &MetaState, a: &mut Applier) {
        let buckets = &self.local.buckets;
        let mut buckets_changed = false;
        for (params, _) in buckets.snapshot() {
            let name = params.name;
            if state.buckets.contains_key(&name) {
                continue;
            }
            if buckets.is_configured(&name) {
                if a.warned.insert(name.clone()) {
                    tracing::warn!(bucket = %name, "the cluster's metadata has no bucket this node's settings configure; it stays on this node");
                }
                continue;
            }
            let key = bucket_key(&name);
            match buckets.drop_bucket(&name) {
                Ok(()) => {
                    buckets_changed = true;
                    a.buckets.remove(&name);
                    a.failed.remove(&key);
                }
                Err(e) => {
                    a.failed
                        .insert(key, format!("cannot drop bucket {name:?}: {e}"));
                }
            }
        }
        for (name, (params, rev)) in &state.buckets {
            let key = bucket_key(name);
            let here = buckets.get(name).is_some();
            if here {
                match a.buckets.get(name) {
                    None => {
                        a.buckets.insert(name.clone(), *rev);
                        continue;
                    }
                    Some(r) if r == rev || buckets.is_configured(name) => continue,
                    // Dropped and created again while this node was not following.
                    Some(_) => {
                        if let Err(e) = buckets.drop_bucket(name) {
                            a.failed
                                .insert(key, format!("cannot drop bucket {name:?}: {e}"));
                            continue;
                        }
                        buckets_changed = true;
                    }
                }
            }
            match buckets.create(params.clone()) {
                Ok(()) => {
                    buckets_changed = true;
                    a.buckets.insert(name.clone(), *rev);
                    a.failed.remove(&key);
                }
                Err(e) => {
                    tracing::error!(bucket = %name, error = %e, "cannot create a bucket of the cluster's metadata");
                    a.failed
                        .insert(key, format!("cannot create bucket {name:?}: {e}"));
                }
            }
        }
        if buckets_changed {
            (self.local.buckets_changed)();
        }
        for (name, (manifest, _)) in &state.manifests {
            let Some((_, bucket)) = buckets.get(name) else {
                continue;
            };
            let key = manifest_key(name);
            let current = bucket.manifest();
            if current.uid == manifest.uid && current.scopes == manifest.scopes {
                a.failed.remove(&key);
                continue;
            }
            let text = String::from_utf8_lossy(&manifest_value(manifest)).into_owned();
            match bucket.set_collections_manifest(&text) {
                Ok(uid) => {
                    tracing::info!(bucket = %name, uid, "collections manifest applied from the cluster's metadata");
                    a.failed.remove(&key);
                }
                Err(e) => {
                    a.failed.insert(
                        key,
                        format!("cannot apply the collections of bucket {name:?}: {e}"),
                    );
                }
            }
        }
        let users = &self.local.users;
        let mut users_changed = false;
        let saved = users.saved();
        for name in saved.user_names() {
            if state.users.contains_key(name) {
                continue;
            }
            match users.apply_remove(name) {
                Ok(_) => {
                    users_changed = true;
                    a.users.remove(name);
                    a.failed.remove(&user_key(name));
                }
                Err(e) => {
                    a.failed.insert(user_key(name), user_error_text(&e));
                }
            }
        }
        for (name, (text, rev)) in &state.users {
            if a.users.get(name) == Some(rev) {
                continue;
            }
            let key = user_key(name);
            let applied = UserStore::parse_toml(text)
                .map_err(|e| format!("malformed user: {e}"))
                .and_then(|one| users.apply_put(name, &one).map_err(|e| user_error_text(&e)));
            match applied {
                Ok(()) => {
                    users_changed = true;
                    a.users.insert(name.clone(), *rev);
                    a.failed.remove(&key);
                }
                Err(e) => {
                    a.failed.insert(key, e);
                }
            }
        }
        if users_changed {
            (self.local.users_changed)();
        }
    }

    /// Waits until every live node (and this one) has applied `revision`, and checks
    /// none failed to apply `keys`.
    async fn confirm<E>(&self, revision: i64, keys: &[String]) -> Result<(), MetaError<E>> {
        let started = Instant::now();
        let deadline = started + self.wait_for;
        let mut missing: Vec<String>;
        // Woken by every node's report instead of polling (a change is confirmed as soon
        // as the last node reports); the poll stays as the fallback.
        let mut report_watch = self.etcd.watch_prefix(APPLIED, revision).await.ok();
        loop {
            missing = vec![self.node_id.clone()];
            if let (Ok((live, _)), Ok((applied, _))) = (
                self.etcd.get_prefix(LIVE).await,
                self.etcd.get_prefix(APPLIED).await,
            ) {
                let mut nodes: Vec<String> = live
                    .iter()
                    .filter_map(|kv| kv.key.strip_prefix(LIVE).map(str::to_owned))
                    .collect();
                if !nodes.contains(&self.node_id) {
                    nodes.push(self.node_id.clone());
                }
                let reports: HashMap<&str, Value> = applied
                    .iter()
                    .filter_map(|kv| {
                        let node = kv.key.strip_prefix(APPLIED)?;
                        Some((node, serde_json::from_slice(&kv.value).ok()?))
                    })
                    .collect();
                missing = nodes
                    .iter()
                    .filter(|n| {
                        reports
                            .get(n.as_str())
                            .and_then(|r| r["revision"].as_i64())
                            .is_none_or(|r| r < revision)
                    })
                    .cloned()
                    .collect();
                if missing.is_empty() {
                    let failed: Vec<(String, String)> = nodes
                        .iter()
                        .filter_map(|n| {
                            let f = &reports.get(n.as_str())?["failed"];
                            keys.iter()
                                .find_map(|k| f[k].as_str())
                                .map(|e| (n.clone(), e.to_owned()))
                        })
                        .collect();
                    if failed.is_empty() {
                        return Ok(());
                    }
                    return Err(MetaError::FailedOn {
                        revision,
                        nodes: failed,
                    });
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            match report_watch.as_mut() {
                Some(w) => {
                    if let Ok(Err(_)) = tokio::time::timeout(POLL_EVERY, w.next()).await {
                        report_watch = None;
                    }
                }
                None => tokio::time::sleep(POLL_EVERY).await,
            }
        }
        missing.sort();
        Err(MetaError::Unconfirmed {
            revision,
            nodes: missing,
            waited: started.elapsed(),
        })
    }

    /// Creates a bucket in the cluster.
    ///
    /// # Errors
    /// [`MetaError`]; refusals as [`BucketManager::create`]'s.
    pub(crate) async fn create_bucket(
        &self,
        params: BucketParams,
    ) -> Result<(), MetaError<ChangeError>> {
        self.local
            .buckets
            .check_create(&params)
            .map_err(MetaError::Refused)?;
        let bk = bucket_key(&params.name);
        let mk = manifest_key(&params.name);
        for _ in 0..MAX_ATTEMPTS {
            let unreachable = |e| MetaError::unreachable(&e);
            if self.etcd.get(&bk).await.map_err(unreachable)?.is_some() {
                return Err(MetaError::Refused(ChangeError::Exists));
            }
            let left = self.etcd.get(&mk).await.map_err(unreachable)?;
            let puts = vec![
                (bk.clone(), bucket_value(&params)),
                (mk.clone(), manifest_value(&Manifest::default())),
            ];
            let compare = [
                (bk.clone(), 0),
                (mk.clone(), left.map_or(0, |v| v.mod_revision)),
            ];
            if let Some(revision) = self
                .etcd
                .transact(&compare, puts, &[])
                .await
                .map_err(unreachable)?
            {
                return self.confirm(revision, &[bk]).await;
            }
        }
        Err(MetaError::Contended)
    }

    /// Drops a bucket from the cluster.
    ///
    /// # Errors
    /// [`MetaError`]; refusals as [`BucketManager::drop_bucket`]'s.
    pub(crate) async fn drop_bucket(&self, name: &str) -> Result<(), MetaError<ChangeError>> {
        let bk = bucket_key(name);
        let mk = manifest_key(name);
        for _ in 0..MAX_ATTEMPTS {
            let unreachable = |e| MetaError::unreachable(&e);
            let Some(current) = self.etcd.get(&bk).await.map_err(unreachable)? else {
                return Err(MetaError::Refused(ChangeError::NotFound));
            };
            if self.local.buckets.is_configured(name) {
                return Err(MetaError::Refused(BucketManager::configured_error(name)));
            }
            let manifest = self.etcd.get(&mk).await.map_err(unreachable)?;
            let compare = [
                (bk.clone(), current.mod_revision),
                (mk.clone(), manifest.map_or(0, |v| v.mod_revision)),
            ];
            if let Some(revision) = self
                .etcd
                .transact(&compare, Vec::new(), &[bk.clone(), mk.clone()])
                .await
                .map_err(unreachable)?
            {
                return self.confirm(revision, &[bk]).await;
            }
        }
        Err(MetaError::Contended)
    }

    /// Changes a bucket's scopes or collections; returns the new manifest uid.
    ///
    /// # Errors
    /// [`MetaError`]; refusals as the engine's (`KeyExists`, `UnknownScope`, ...).
    pub(crate) async fn change_manifest(
        &self,
        bucket: &str,
        change: &ManifestChange,
    ) -> Result<u64, MetaError<ManifestRefusal>> {
        let mk = manifest_key(bucket);
        for _ in 0..MAX_ATTEMPTS {
            let unreachable = |e| MetaError::unreachable(&e);
            let Some(current) = self.etcd.get(&mk).await.map_err(unreachable)? else {
                return Err(MetaError::Refused(ManifestRefusal::NoBucket));
            };
            let manifest = parse_manifest(&current.value).map_err(|e| {
                MetaError::Refused(ManifestRefusal::Status({
                    tracing::error!(bucket, error = %e, "the cluster's manifest is malformed");
                    EngineStatus::TempFail
                }))
            })?;
            let mut next = manifest
                .changed(change)
                .map_err(|s| MetaError::Refused(ManifestRefusal::Status(s)))?;
            next.dropped.clear();
            if let Some(revision) = self
                .etcd
                .transact(
                    &[(mk.clone(), current.mod_revision)],
                    vec![(mk.clone(), manifest_value(&next))],
                    &[],
                )
                .await
                .map_err(unreachable)?
            {
                self.confirm(revision, std::slice::from_ref(&mk)).await?;
                return Ok(next.uid);
            }
        }
        Err(MetaError::Contended)
    }

    /// Creates or replaces a user in the cluster (PUT); returns whether it existed.
    /// Derives the password's verifiers: call it off the serving thread.
    ///
    /// # Errors
    /// [`MetaError`]; refusals as [`UserAdmin::upsert`]'s.
    pub(crate) async fn upsert_user(
        &self,
        name: &str,
        password: Option<&str>,
        roles: &Roles,
    ) -> Result<bool, MetaError<UserChangeError>> {
        let uk = user_key(name);
        for _ in 0..MAX_ATTEMPTS {
            let unreachable = |e| MetaError::unreachable(&e);
            let current = self.etcd.get(&uk).await.map_err(unreachable)?;
            let existing = match &current {
                None => None,
                Some(v) => Some(
                    UserStore::parse_toml(&String::from_utf8_lossy(&v.value)).map_err(|e| {
                        MetaError::Refused(UserChangeError::Failed(format!(
                            "the cluster's record of this user is malformed: {e}"
                        )))
                    })?,
                ),
            };
            let one = self
                .local
                .users
                .prepare_upsert(name, password, roles.clone(), existing.as_ref())
                .map_err(MetaError::Refused)?;
            let value =
                user_value(&one).map_err(|e| MetaError::Refused(UserChangeError::Failed(e)))?;
            let expected = current.as_ref().map_or(0, |v| v.mod_revision);
            if let Some(revision) = self
                .etcd
                .transact(&[(uk.clone(), expected)], vec![(uk.clone(), value)], &[])
                .await
                .map_err(unreachable)?
            {
                self.confirm(revision, std::slice::from_ref(&uk)).await?;
                return Ok(current.is_some());
            }
        }
        Err(MetaError::Contended)
    }

    /// Removes a user from the cluster (DELETE).
    ///
    /// # Errors
    /// [`MetaError`]; refusals as [`UserAdmin::remove`]'s.
    pub(crate) async fn remove_user(&self, name: &str) -> Result<(), MetaError<UserChangeError>> {
        self.local
            .users
            .check_remove(name)
            .map_err(MetaError::Refused)?;
        let uk = user_key(name);
        for _ in 0..MAX_ATTEMPTS {
            let unreachable = |e| MetaError::unreachable(&e);
            let Some(current) = self.etcd.get(&uk).await.map_err(unreachable)? else {
                return Err(MetaError::Refused(UserChangeError::NotFound));
            };
            if let Some(revision) = self
                .etcd
                .transact(
                    &[(uk.clone(), current.mod_revision)],
                    Vec::new(),
                    std::slice::from_ref(&uk),
                )
                .await
                .map_err(unreachable)?
            {
                return self.confirm(revision, &[uk]).await;
            }
        }
        Err(MetaError::Contended)
    }
}

fn user_error_text(e: &UserChangeError) -> String {
    match e {
        UserChangeError::NotFound => "no such user".to_owned(),
        UserChangeError::Invalid(_, m) | UserChangeError::Failed(m) => m.clone(),
    }
}

/// Follows etcd's `meta/` from `revision` on, applying every batch; starts over from a
/// fresh read when the watch is lost. Ends when the metadata is dropped.
async fn follow(meta: Weak<ClusterMeta>, mut state: MetaState, mut revision: i64) {
    let mut backoff = POLL_EVERY;
    loop {
        let Some(etcd) = meta.upgrade().map(|m| m.etcd.clone()) else {
            return;
        };
        match etcd.watch_prefix(META, revision + 1).await {
            Ok(mut watch) => loop {
                match watch.next().await {
                    Ok((changes, rev)) => {
                        for c in &changes {
                            state.apply(c);
                        }
                        revision = rev;
                        let Some(m) = meta.upgrade() else {
                            return;
                        };
                        m.reconcile(&state, revision).await;
                        backoff = POLL_EVERY;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lost the watch on the cluster's metadata; serving the last state until etcd answers again");
                        break;
                    }
                }
            },
            Err(e) => {
                tracing::debug!(error = %e, "cannot watch the cluster's metadata");
            }
        }
        if let Some(m) = meta.upgrade() {
            m.following.store(false, Ordering::Release);
        }
        // Start over from a fresh read, as soon as etcd answers.
        loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            let Some(m) = meta.upgrade() else {
                return;
            };
            match m.read().await {
                Ok((fresh, rev)) => {
                    state = fresh;
                    revision = rev;
                    m.reconcile(&state, revision).await;
                    m.following.store(true, Ordering::Release);
                    tracing::info!(revision, "following the cluster's metadata again");
                    break;
                }
                Err(e) => tracing::debug!(error = %e, "etcd still unreachable"),
            }
        }
    }
}

#[cfg(test)]
mod tests;
