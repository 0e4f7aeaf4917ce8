//! The thin layer over etcd (the `etcd-client` crate) the cluster keeps its state in: one
//! key prefix per cluster, this node's lease, compare-and-swap writes and prefix watches.
//!
//! **Keys** (under `/epkv/<cluster-name>/`):
//! - `topology`: the [`crate::doc::ClusterDoc`] (members, maps, auto-failover
//!   settings), changed only by compare-and-swap on its `mod_revision`;
//! - `live/<host:port>`: one per running node, attached to its lease, so it disappears
//!   when the node stops renewing it;
//! - `leader`: the orchestrator's node id, attached to its lease;
//! - `meta/...`: cluster-wide metadata (buckets, collections, users) and
//!   `applied/<node>`, each node's last applied revision of it.
//!
//! **The lease.** A node grants itself a lease of [`LEASE_TTL`] and renews it every
//! [`RENEW_EVERY`]. [`Etcd::lease_held`] says whether the last renewal was answered
//! within the lease's time: a node that cannot say so may have lost its keys (and with
//! them its leadership) and must act as if it had. A lease found expired is replaced by a
//! new one and the node's keys are written again ([`Etcd::run_lease`]).
//!
//! Every call has a timeout ([`REQUEST_TIMEOUT`]) and needs an etcd leader (a member cut
//! off from its quorum refuses), so a lost etcd surfaces as an [`EtcdError`] within a
//! couple of seconds, never as a hang.

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions, WatchStream,
};
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// The lease's time to live. etcd rounds shorter ones up to about this much (1.5 times
/// its election timeout), and failover cannot start before a dead node's lease expired.
pub const LEASE_TTL: Duration = Duration::from_secs(2);
/// How often the lease is renewed.
pub const RENEW_EVERY: Duration = Duration::from_millis(400);
/// The longest one etcd request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// etcd could not be asked, or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdError(pub String);

impl std::fmt::Display for EtcdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd: {}", self.0)
    }
}

impl std::error::Error for EtcdError {}

impl From<etcd_client::Error> for EtcdError {
    fn from(e: etcd_client::Error) -> Self {
        EtcdError(e.to_string())
    }
}

/// Where the cluster's etcd is and which cluster in it this node belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSettings {
    /// Client URLs of the etcd members (`http://127.0.0.1:2379`).
    pub endpoints: Vec<String>,
    /// The cluster's name: its keys live under `/epkv/<name>/`.
    pub cluster_name: String,
}

/// One key's value and the revision that last changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The key, without the cluster's prefix.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
    /// etcd's `mod_revision` of the key.
    pub mod_revision: i64,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A key was written.
    Put(Versioned),
    /// A key was deleted (or its lease expired) at this revision.
    Delete {
        /// The key, without the prefix.
        key: String,
        /// The revision of the deletion.
        revision: i64,
    },
}

/// A connection to the cluster's etcd, with this node's lease. Cheap to clone.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    prefix: String,
    lease: Arc<LeaseState>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("prefix", &self.prefix)
            .field("lease", &self.lease.id.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The lease and when it was last known to be alive.
struct LeaseState {
    id: AtomicI64,
    /// When the last renewal that etcd answered was sent.
    renewed: Mutex<Instant>,
}

impl Etcd {
    /// Connects to etcd and grants this node a lease.
    ///
    /// # Errors
    /// etcd does not answer within the timeouts, or refuses.
    pub async fn connect(settings: &EtcdSettings) -> Result<Etcd, EtcdError> {
        if settings.endpoints.is_empty() {
            return Err(EtcdError("no endpoints".into()));
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        let mut client = tokio::time::timeout(
            REQUEST_TIMEOUT,
            Client::connect(&settings.endpoints, Some(options)),
        )
        .await
        .map_err(|_| EtcdError("connection timed out".into()))??;
        let sent = Instant::now();
        let lease = client.lease_grant(ttl_secs(), None).await?.id();
        Ok(Etcd {
            client,
            prefix: format!("/epkv/{}/", settings.cluster_name),
            lease: Arc::new(LeaseState {
                id: AtomicI64::new(lease),
                renewed: Mutex::new(sent),
            }),
        })
    }

    /// The full etcd key of `rel`.
    #[must_use]
    pub fn key(&self, rel: &str) -> String {
        format!("{}{rel}", self.prefix)
    }

    fn rel(&self, key: &[u8]) -> String {
        let key = String::from_utf8_lossy(key);
        key.strip_prefix(&self.prefix).unwrap_or(&key).to_owned()
    }

    /// This node's current lease.
    #[must_use]
    pub fn lease_id(&self) -> i64 {
        self.lease.id.load(Ordering::Acquire)
    }

    /// Whether this node's lease is certainly still alive: its last renewal that etcd
    /// answered was sent less than [`LEASE_TTL`] ago.
    #[must_use]
    pub fn lease_held(&self) -> bool {
        self.lease.renewed.lock().elapsed() < LEASE_TTL
    }

    /// How long ago the last answered renewal was sent.
    #[must_use]
    pub fn since_renewed(&self) -> Duration {
        self.lease.renewed.lock().elapsed()
    }

    /// Keeps the lease alive, forever. When etcd says the lease expired (the node was
    /// cut off for longer than its time to live), grants a new one and calls
    /// `registered` with it so that the node writes its leased keys again; `registered`
    /// is also called once at the start.
    pub async fn run_lease<F, Fut>(self, registered: F)
    where
        F: Fn(Etcd) -> Fut,
        Fut: std::future::Future<Output = Result<(), EtcdError>>,
    {
        let mut need_register = true;
        loop {
            if need_register {
                match registered(self.clone()).await {
                    Ok(()) => need_register = false,
                    Err(e) => tracing::warn!(error = %e, "cannot register this node in etcd"),
                }
            }
            let sent = Instant::now();
            match self.renew_once().await {
                Ok(true) => *self.lease.renewed.lock() = sent,
                Ok(false) => {
                    tracing::warn!(
                        "this node's etcd lease expired; granting a new one and registering again"
                    );
                    match self.clone().client.lease_grant(ttl_secs(), None).await {
                        Ok(l) => {
                            self.lease.id.store(l.id(), Ordering::Release);
                            *self.lease.renewed.lock() = sent;
                            need_register = true;
                        }
                        Err(e) => tracing::warn!(error = %e, "cannot grant an etcd lease"),
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot renew the etcd lease");
                }
            }
            tokio::time::sleep(RENEW_EVERY.saturating_sub(sent.elapsed())).await;
        }
    }

    /// One renewal: `Ok(false)` when etcd no longer knows the lease.
    async fn renew_once(&self) -> Result<bool, EtcdError> {
        let mut client = self.client.clone();
        let id = self.lease_id();
        let renewed = tokio::time::timeout(REQUEST_TIMEOUT, async move {
            // etcd-client answers a lease etcd no longer knows with this error (from the
            // first reply, ttl 0) rather than a reply.
            let (mut keeper, mut stream) = match client.lease_keep_alive(id).await {
                Err(etcd_client::Error::LeaseKeepAliveError(m)) if m == "lease not found" => {
                    return Ok(false);
                }
                other => other?,
            };
            keeper.keep_alive().await?;
            match stream.message().await? {
                Some(r) => Ok::<_, etcd_client::Error>(r.ttl() > 0),
                None => Err(etcd_client::Error::LeaseKeepAliveError(
                    "the stream ended".into(),
                )),
            }
        })
        .await
        .map_err(|_| EtcdError("lease renewal timed out".into()))??;
        Ok(renewed)
    }

    /// The value of `rel`, if it exists.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn get(&self, rel: &str) -> Result<Option<Versioned>, EtcdError> {
        let r = self.client.clone().get(self.key(rel), None).await?;
        Ok(r.kvs().first().map(|kv| Versioned {
            key: rel.to_owned(),
            value: kv.value().to_vec(),
            mod_revision: kv.mod_revision(),
        }))
    }

    /// Every key under `rel`, and the store's revision the answer is from.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn get_prefix(&self, rel: &str) -> Result<(Vec<Versioned>, i64), EtcdError> {
        let r = self
            .client
            .clone()
            .get(self.key(rel), Some(GetOptions::new().with_prefix()))
            .await?;
        let revision = r.header().map_or(0, |h| h.revision());
        let kvs = r
            .kvs()
            .iter()
            .map(|kv| Versioned {
                key: self.rel(kv.key()),
                value: kv.value().to_vec(),
                mod_revision: kv.mod_revision(),
            })
            .collect();
        Ok((kvs, revision))
    }

    /// Writes `rel` attached to this node's lease (it goes when the node stops renewing).
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn put_leased(&self, rel: &str, value: impl Into<Vec<u8>>) -> Result<(), EtcdError> {
        let options = PutOptions::new().with_lease(self.lease_id());
        self.client
            .clone()
            .put(self.key(rel), value.into(), Some(options))
            .await?;
        Ok(())
    }

    /// Writes `rel` if its `mod_revision` is still `expected` (0: if it does not exist).
    /// Returns the new revision, or `None` when someone changed it first.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn compare_and_put(
        &self,
        rel: &str,
        value: impl Into<Vec<u8>>,
        expected: i64,
    ) -> Result<Option<i64>, EtcdError> {
        self.transact(
            &[(rel.to_owned(), expected)],
            vec![(rel.to_owned(), value.into())],
            &[],
        )
        .await
    }

    /// Deletes `rel` if its `mod_revision` is still `expected`. Returns the revision of
    /// the deletion, or `None` when someone changed it first.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn compare_and_delete(
        &self,
        rel: &str,
        expected: i64,
    ) -> Result<Option<i64>, EtcdError> {
        self.transact(&[(rel.to_owned(), expected)], Vec::new(), &[rel.to_owned()])
            .await
    }

    /// One transaction over several keys: if every `(key, mod_revision)` of `compare`
    /// still holds (0: the key does not exist), writes `put` and deletes `delete`.
    /// Returns the new revision, or `None` when some key changed first.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn transact(
        &self,
        compare: &[(String, i64)],
        put: Vec<(String, Vec<u8>)>,
        delete: &[String],
    ) -> Result<Option<i64>, EtcdError> {
        let compares: Vec<Compare> = compare
            .iter()
            .map(|(rel, rev)| Compare::mod_revision(self.key(rel), CompareOp::Equal, *rev))
            .collect();
        let ops: Vec<TxnOp> = put
            .into_iter()
            .map(|(rel, value)| TxnOp::put(self.key(&rel), value, None))
            .chain(delete.iter().map(|rel| TxnOp::delete(self.key(rel), None)))
            .collect();
        self.commit(Txn::new().when(compares).and_then(ops)).await
    }

    /// Creates `rel` (with `value`) attached to this node's lease if no one holds it.
    /// Returns whether this node holds it afterwards (it created it now, or did before
    /// with this lease), and the holder's value.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn hold(
        &self,
        rel: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<(bool, Vec<u8>), EtcdError> {
        let key = self.key(rel);
        let lease = self.lease_id();
        let value = value.into();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let r = self.client.clone().txn(txn).await?;
        if r.succeeded() {
            return Ok((true, value));
        }
        for op in r.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = op
                && let Some(kv) = g.kvs().first()
            {
                return Ok((kv.lease() == lease, kv.value().to_vec()));
            }
        }
        Ok((false, Vec::new()))
    }

    /// Gives key `rel` up if this node holds it (with its current lease), as a leader
    /// that leaves the cluster does.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn release(&self, rel: &str) -> Result<(), EtcdError> {
        let key = self.key(rel);
        let txn = Txn::new()
            .when([Compare::lease(
                key.clone(),
                CompareOp::Equal,
                self.lease_id(),
            )])
            .and_then([TxnOp::delete(key, None)]);
        self.client.clone().txn(txn).await?;
        Ok(())
    }

    async fn commit(&self, txn: Txn) -> Result<Option<i64>, EtcdError> {
        let r = self.client.clone().txn(txn).await?;
        let revision = r.header().map_or(0, |h| h.revision());
        Ok(r.succeeded().then_some(revision))
    }

    /// Watches every key under `rel` from revision `from` on.
    ///
    /// # Errors
    /// etcd could not be asked.
    pub async fn watch_prefix(&self, rel: &str, from: i64) -> Result<Watch, EtcdError> {
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let stream = self
            .client
            .clone()
            .watch(self.key(rel), Some(options))
            .await?;
        Ok(Watch {
            stream,
            etcd: self.clone(),
        })
    }
}

/// A prefix watch ([`Etcd::watch_prefix`]).
pub struct Watch {
    stream: WatchStream,
    etcd: Etcd,
}

impl Watch {
    /// The next batch of changes (all from one revision or a few), with the revision
    /// they bring the store to.
    ///
    /// # Errors
    /// The watch ended (etcd lost, the revision compacted away): start over from a fresh
    /// read.
    pub async fn next(&mut self) -> Result<(Vec<Change>, i64), EtcdError> {
        loop {
            let Some(r) = self.stream.message().await? else {
                return Err(EtcdError("the watch ended".into()));
            };
            if r.canceled() {
                return Err(EtcdError(format!(
                    "the watch was cancelled: {}",
                    r.cancel_reason()
                )));
            }
            let revision = r.header().map_or(0, |h| h.revision());
            let changes: Vec<Change> = r
                .events()
                .iter()
                .filter_map(|e| {
                    let kv = e.kv()?;
                    let key = self.etcd.rel(kv.key());
                    Some(match e.event_type() {
                        EventType::Put => Change::Put(Versioned {
                            key,
                            value: kv.value().to_vec(),
                            mod_revision: kv.mod_revision(),
                        }),
                        EventType::Delete => Change::Delete {
                            key,
                            revision: kv.mod_revision(),
                        },
                    })
                })
                .collect();
            if !changes.is_empty() {
                return Ok((changes, revision));
            }
        }
    }
}

fn ttl_secs() -> i64 {
    i64::try_from(LEASE_TTL.as_secs()).unwrap_or(2)
}
