//! [`Frontend`]: the listeners (the KV port and, when configured, the TLS port), the
//! acceptor loop and the worker threads.

use crate::buckets::Buckets;
use crate::config::FrontendConfig;
use crate::error::{FrontendError, Result};
use crate::stats::ConnectionStats;
use crate::timings::WorkerTimings;
use crate::tls::TlsReloader;
use crate::worker::{Accepted, ConnectionSlot, Worker};
use epkv_auth::UserDirectory;
use epkv_engine_api::{ClusterView, Engine, NodePorts};
use epkv_protocol::Limits;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Pause after an accept error such as EMFILE, so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// What every worker and connection shares.
pub(crate) struct Shared {
    pub(crate) buckets: Buckets,
    /// The users that may authenticate (empty when none are configured); changes at run
    /// time through the management API.
    pub(crate) users: UserDirectory,
    /// The zero-configuration loopback mode: no users and a loopback listener, so every
    /// connection starts on `default` without authenticating.
    pub(crate) open_default: bool,
    pub(crate) config: FrontendConfig,
    pub(crate) limits: Limits,
    pub(crate) conns: ConnectionStats,
    pub(crate) timings: Vec<Arc<WorkerTimings>>,
    pub(crate) started: Instant,
    /// The password-check pool and the per-source failure counts.
    pub(crate) auth: crate::auth_guard::AuthGuard,
    /// The ports the cluster map advertises (`kv`, and `kvSSL` with TLS).
    pub(crate) ports: NodePorts,
    /// The TLS configuration and its reload counters, when TLS is on.
    pub(crate) tls: Option<TlsReloader>,
    /// The DCP producers, for the `dcp` STAT group.
    pub(crate) dcp: crate::dcp::Registry,
    /// Where the cluster map comes from, if anywhere ([`FrontendConfig::cluster`]).
    pub(crate) cluster: Option<Arc<dyn ClusterView>>,
    /// The cluster map's version, `(epoch, revision)`, as last published: the view's
    /// listener ([`ClusterView::subscribe`]) and SET_VBUCKET move it on, and every
    /// connection that asked for map change notifications waits on a receiver of it.
    /// Never moves without a view.
    pub(crate) map_version: watch::Sender<(i64, i64)>,
}

impl Shared {
    /// The version of the current cluster map, `(epoch, revision)`, if a map is served.
    pub(crate) fn cluster_version(&self) -> Option<(i64, i64)> {
        self.cluster.as_ref().map(|c| c.version())
    }

    /// Records a change of the cluster map (a client set a vBucket's state).
    pub(crate) fn bump_cluster_rev(&self) {
        if let Some(c) = &self.cluster {
            c.map_changed();
            // A view that does not call its listeners is caught up with here.
            publish_version(&self.map_version, c.version());
        }
    }

    /// The cluster map of bucket `name` (served by `engine`) for a client that reached
    /// this node at `local`, if a map is served.
    pub(crate) fn bucket_config(
        &self,
        name: &str,
        engine: &dyn Engine,
        local: SocketAddr,
    ) -> Option<String> {
        let c = self.cluster.as_ref()?;
        Some(c.bucket_config(name, engine, local, self.ports))
    }

    /// The global cluster map (no bucket selected), if a map is served.
    pub(crate) fn global_config(&self, local: SocketAddr) -> Option<String> {
        let c = self.cluster.as_ref()?;
        Some(c.global_config(local, self.ports))
    }
}

/// What the management REST API needs of a running front end: its buckets and users
/// (shared, so changes take effect at once), the cluster map and the KV ports.
#[derive(Clone)]
pub struct FrontendHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FrontendHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontendHandle")
            .field("buckets", &self.shared.buckets)
            .finish_non_exhaustive()
    }
}

impl FrontendHandle {
    /// The buckets served (shared with the connections).
    #[must_use]
    pub fn buckets(&self) -> &Buckets {
        &self.shared.buckets
    }

    /// The users (shared with the connections).
    #[must_use]
    pub fn users(&self) -> &UserDirectory {
        &self.shared.users
    }

    /// Whether connections on loopback use `default` without authenticating.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.shared.open_default
    }

    /// The plain KV port.
    #[must_use]
    pub fn kv_port(&self) -> u16 {
        self.shared.ports.kv
    }

    /// The TLS KV port, when TLS is on.
    #[must_use]
    pub fn kv_ssl_port(&self) -> Option<u16> {
        self.shared.ports.kv_ssl
    }

    /// The terse bucket config of `name` (the GET_CLUSTER_CONFIG JSON), for a client that
    /// reached this node at `local` (its IP is the node's hostname in the config), or
    /// `None` if there is no such bucket or no cluster map is served.
    #[must_use]
    pub fn bucket_config(&self, name: &str, local: SocketAddr) -> Option<String> {
        let engine = self.shared.buckets.get(name)?;
        self.shared.bucket_config(name, &*engine, local)
    }
}

/// The network front end: a bound listener plus the buckets it serves.
///
/// [`Frontend::bind`] creates the listening socket at once, so a port that is in use is
/// reported before anything else starts and [`Frontend::local_addr`] tells the port when
/// port 0 was asked for. [`Frontend::run_until`] then serves until a shutdown future
/// completes.
pub struct Frontend {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    /// The TLS listener, its address and its configuration, when TLS is configured.
    tls: Option<TlsListener>,
    shared: Arc<Shared>,
}

/// The second listener, serving TLS.
struct TlsListener {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
    reloader: TlsReloader,
}

impl std::fmt::Debug for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontend")
            .field("local_addr", &self.local_addr)
            .field("tls_local_addr", &self.tls_local_addr())
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl Frontend {
    /// Validates the configuration and binds the listening socket, serving one bucket,
    /// `default`.
    ///
    /// # Errors
    /// [`FrontendError::InvalidConfig`] for a bad setting; [`FrontendError::Bind`] when the
    /// address cannot be bound (in use, privileged port, unknown address).
    pub fn bind(config: FrontendConfig, engine: Arc<dyn Engine>) -> Result<Frontend> {
        Self::bind_buckets(config, Buckets::single(engine))
    }

    /// Validates the configuration and binds the listening socket, serving `buckets`.
    /// With `config.tls`, also loads the certificate and key and binds the TLS listener
    /// on the same address.
    ///
    /// Access: with no users in `config.users` and a loopback `config.bind` address, every
    /// connection starts on the `default` bucket without authenticating (the
    /// zero-configuration mode). Otherwise a connection must authenticate with SASL (or a
    /// client certificate on the TLS port) and then SELECT_BUCKET a bucket its user may
    /// use.
    ///
    /// # Errors
    /// [`FrontendError::InvalidConfig`] for a bad setting or no buckets;
    /// [`FrontendError::Tls`] when the certificate, key or CA cannot be used;
    /// [`FrontendError::Bind`] when an address cannot be bound.
    pub fn bind_buckets(config: FrontendConfig, buckets: Buckets) -> Result<Frontend> {
        config.validate()?;
        if buckets.is_empty() {
            return Err(FrontendError::InvalidConfig("no buckets to serve".into()));
        }
        let addr = config.bind;
        let listener = listen(addr).map_err(|source| FrontendError::Bind { addr, source })?;
        let local_addr = listener.local_addr()?;
        let tls = match &config.tls {
            None => None,
            Some(tls_config) => {
                let reloader = TlsReloader::new(tls_config.clone())?;
                let addr = SocketAddr::new(config.bind.ip(), tls_config.port);
                let listener =
                    listen(addr).map_err(|source| FrontendError::Bind { addr, source })?;
                let local_addr = listener.local_addr()?;
                Some(TlsListener {
                    listener,
                    local_addr,
                    reloader,
                })
            }
        };
        let ports = NodePorts {
            kv: local_addr.port(),
            kv_ssl: tls.as_ref().map(|t| t.local_addr.port()),
            mgmt: config.mgmt_port,
        };
        let timings = (0..config.threads)
            .map(|_| Arc::new(WorkerTimings::new()))
            .collect();
        let limits = config.limits();
        let started = config.clock.now();
        let auth = crate::auth_guard::AuthGuard::new(config.auth_threads)?;
        let tls_reloader = tls.as_ref().map(|t| t.reloader.clone());
        let cluster = config.cluster.clone();
        let (map_version, _) = watch::channel(cluster.as_ref().map_or((0, 0), |c| c.version()));
        if let Some(c) = &cluster {
            let tx = map_version.clone();
            c.subscribe(Box::new(move |version| publish_version(&tx, version)));
        }
        Ok(Frontend {
            listener,
            local_addr,
            tls,
            shared: Arc::new(Shared {
                open_default: config.users.current().is_empty() && config.bind.ip().is_loopback(),
                users: config.users.clone(),
                buckets,
                config,
                limits,
                conns: ConnectionStats::default(),
                timings,
                started,
                auth,
                ports,
                tls: tls_reloader,
                dcp: crate::dcp::Registry::default(),
                cluster,
                map_version,
            }),
        })
    }

    /// The address the listener is bound to (with the real port when port 0 was asked).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// A handle on the connection counters and command timings, valid for the front
    /// end's whole life (take it before [`Frontend::run_until`] consumes `self`).
    #[must_use]
    pub fn stats(&self) -> crate::FrontendStats {
        crate::FrontendStats::new(Arc::clone(&self.shared))
    }

    /// The address of the TLS listener (with the real port when port 0 was asked), if TLS
    /// is configured.
    #[must_use]
    pub fn tls_local_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().map(|t| t.local_addr)
    }

    /// The handle the management API works through; it stays valid while the front end
    /// runs.
    #[must_use]
    pub fn handle(&self) -> FrontendHandle {
        FrontendHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The handle that reloads the TLS certificate and key (on SIGHUP), if TLS is
    /// configured. It stays valid while the front end runs.
    #[must_use]
    pub fn tls_reloader(&self) -> Option<TlsReloader> {
        self.tls.as_ref().map(|t| t.reloader.clone())
    }

    /// Serves connections until `shutdown` completes, then shuts down gracefully: stops
    /// accepting, lets every connection finish the batch it is executing and flush its
    /// replies (for at most `shutdown_timeout`), closes the connections, joins the worker
    /// threads and finally calls [`Engine::shutdown`].
    ///
    /// Must be called inside a Tokio runtime (any flavour): the acceptor runs on it. The
    /// workers run on their own threads, each with a single-threaded runtime.
    ///
    /// # Errors
    /// [`FrontendError::Io`] when a worker runtime or thread cannot be created, or the
    /// listener cannot be registered with the runtime.
    pub async fn run_until<F>(self, shutdown: F) -> Result<()>
    where
        F: Future<Output = ()>,
    {
        let Frontend {
            listener,
            local_addr,
            tls,
            shared,
        } = self;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let tls = match tls {
            Some(t) => {
                t.listener.set_nonblocking(true)?;
                Some((tokio::net::TcpListener::from_std(t.listener)?, t.reloader))
            }
            None => None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut senders = Vec::with_capacity(shared.config.threads);
        let mut done = Vec::with_capacity(shared.config.threads);
        let mut threads = Vec::with_capacity(shared.config.threads);
        for id in 0..shared.config.threads {
            let (tx, rx) = mpsc::unbounded_channel();
            let (done_tx, done_rx) = oneshot::channel();
            let worker = Worker::new(id, Arc::clone(&shared), rx, stop_rx.clone())?;
            let handle = std::thread::Builder::new()
                .name(format!("epkv-worker-{id}"))
                .spawn(move || {
                    worker.run();
                    let _ = done_tx.send(());
                })?;
            senders.push(tx);
            done.push(done_rx);
            threads.push(handle);
        }
        tracing::info!(addr = %local_addr, threads = shared.config.threads, "front end serving");
        if let Some((l, _)) = &tls {
            tracing::info!(addr = %l.local_addr()?, "front end serving TLS");
        }

        tokio::pin!(shutdown);
        let mut next = 0usize;
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        if let Some(conn) = admit(&shared, stream, peer, None) {
                            // A worker only goes away at shutdown; if one did, the
                            // connection is dropped (closed) with the message.
                            let _ = senders[next].send(conn);
                            next = (next + 1) % senders.len();
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed; pausing briefly");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    }
                },
                accepted = accept_tls(tls.as_ref()) => match accepted {
                    Ok((stream, peer, config)) => {
                        if let Some(conn) = admit(&shared, stream, peer, Some(config)) {
                            let _ = senders[next].send(conn);
                            next = (next + 1) % senders.len();
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS accept failed; pausing briefly");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    }
                },
            }
        }

        tracing::info!("shutting down: no longer accepting connections");
        drop(listener);
        drop(tls);
        let _ = stop_tx.send(true);
        drop(senders);
        for d in done {
            let _ = d.await;
        }
        for t in threads {
            if t.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
        for (_, engine) in shared.buckets.iter() {
            engine.shutdown();
        }
        tracing::info!("front end stopped");
        Ok(())
    }
}

/// Moves the published map version on to `version`, waking the connections waiting for
/// map changes; an older or equal version (a listener racing SET_VBUCKET) changes nothing.
fn publish_version(tx: &watch::Sender<(i64, i64)>, version: (i64, i64)) {
    tx.send_if_modified(|current| {
        let newer = version > *current;
        if newer {
            *current = version;
        }
        newer
    });
}

/// Accepts from the TLS listener, with the TLS configuration current at that moment;
/// never resolves without a TLS listener.
async fn accept_tls(
    tls: Option<&(tokio::net::TcpListener, TlsReloader)>,
) -> std::io::Result<(tokio::net::TcpStream, SocketAddr, Arc<rustls::ServerConfig>)> {
    match tls {
        Some((listener, reloader)) => {
            let (stream, peer) = listener.accept().await?;
            Ok((stream, peer, reloader.current()))
        }
        None => std::future::pending().await,
    }
}

/// Counts an accepted connection, rejecting it when the limit is reached.
fn admit(
    shared: &Arc<Shared>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Option<Accepted> {
    let conns = &shared.conns;
    conns.total.fetch_add(1, Ordering::Relaxed);
    let before = conns.curr.fetch_add(1, Ordering::Relaxed);
    let slot = ConnectionSlot::new(Arc::clone(shared));
    if before >= shared.config.max_connections {
        conns.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%peer, max = shared.config.max_connections, "too many connections; closing the new one");
        drop(slot);
        return None;
    }
    match stream.into_std() {
        Ok(stream) => Some(Accepted {
            stream,
            peer,
            slot,
            tls,
        }),
        Err(e) => {
            tracing::debug!(%peer, error = %e, "cannot hand the connection to a worker");
            None
        }
    }
}

/// Binds and listens (the standard library sets SO_REUSEADDR on Unix, so a restart does
/// not wait for TIME_WAIT connections of the previous run).
fn listen(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr)
}
