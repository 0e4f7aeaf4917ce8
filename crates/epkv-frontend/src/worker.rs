//! A worker thread: a single-threaded Tokio runtime running the connections dealt to it,
//! TLS handshakes included.

use crate::connection::{Connection, Opened};
use crate::frontend::Shared;
use crate::timings::WorkerTimings;
use crate::tls::user_for_certificate;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

/// Keeps a connection counted in `curr_connections` until dropped.
pub(crate) struct ConnectionSlot {
    shared: Arc<Shared>,
}

impl ConnectionSlot {
    /// The caller has already incremented the counter.
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.shared.conns.curr.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection on its way from the acceptor to a worker.
pub(crate) struct Accepted {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) slot: ConnectionSlot,
    /// For a connection to the TLS listener, the TLS configuration current when it was
    /// accepted; the worker runs the handshake.
    pub(crate) tls: Option<Arc<rustls::ServerConfig>>,
}

/// One worker: its runtime and its inbox of accepted connections.
pub(crate) struct Worker {
    id: usize,
    runtime: tokio::runtime::Runtime,
    inbox: mpsc::UnboundedReceiver<Accepted>,
    stop: watch::Receiver<bool>,
    timings: Arc<WorkerTimings>,
    shared: Arc<Shared>,
}

impl Worker {
    pub(crate) fn new(
        id: usize,
        shared: Arc<Shared>,
        inbox: mpsc::UnboundedReceiver<Accepted>,
        stop: watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let timings = Arc::clone(&shared.timings[id]);
        Ok(Self {
            id,
            runtime,
            inbox,
            stop,
            timings,
            shared,
        })
    }

    /// Runs until the stop signal, then drains its connections (bounded by the shutdown
    /// timeout) and returns.
    pub(crate) fn run(self) {
        let Worker {
            id,
            runtime,
            mut inbox,
            mut stop,
            timings,
            shared,
        } = self;
        runtime.block_on(async move {
            let mut conns = JoinSet::new();
            let mut next_id = 0u64;
            loop {
                tokio::select! {
                    accepted = inbox.recv() => match accepted {
                        Some(a) => {
                            next_id += 1;
                            let conn_id = (next_id << 8) | (id as u64 & 0xff);
                            let timings = Arc::clone(&timings);
                            // Plain and TLS connections are separate tasks, so a plain
                            // connection's future is not sized for a TLS session.
                            if a.tls.is_some() {
                                conns.spawn(serve_tls(conn_id, a, timings, stop.clone()));
                            } else {
                                conns.spawn(serve_plain(conn_id, a, timings, stop.clone()));
                            }
                        }
                        None => break,
                    },
                    changed = stop.changed() => {
                        if changed.is_err() || *stop.borrow() {
                            break;
                        }
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
            drop(inbox);
            let open = conns.len();
            if open > 0 {
                tracing::debug!(worker = id, open, "waiting for connections to flush");
            }
            let drained = tokio::time::timeout(shared.config.shutdown_timeout, async {
                while conns.join_next().await.is_some() {}
            })
            .await;
            if drained.is_err() {
                tracing::info!(
                    worker = id,
                    left = conns.len(),
                    "shutdown timeout reached; closing connections that did not flush"
                );
                conns.shutdown().await;
            }
        });
    }
}

/// Registers an accepted socket with the current (worker) runtime and reads its local
/// address. `None`, after logging, if either fails; the socket is then closed.
fn register(stream: std::net::TcpStream, peer: SocketAddr) -> Option<(TcpStream, SocketAddr)> {
    let stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot register connection");
            return None;
        }
    };
    match stream.local_addr() {
        Ok(local) => Some((stream, local)),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot read the connection's local address");
            None
        }
    }
}

/// Serves a connection of the plain KV listener.
async fn serve_plain(
    id: u64,
    accepted: Accepted,
    timings: Arc<WorkerTimings>,
    stop: watch::Receiver<bool>,
) {
    let Accepted {
        stream, peer, slot, ..
    } = accepted;
    let Some((stream, local)) = register(stream, peer) else {
        return;
    };
    let opened = Opened {
        peer,
        local,
        slot,
        user: None,
    };
    Connection::new(id, stream, opened, timings, stop)
        .run()
        .await;
}

/// Serves a connection of the TLS listener: the handshake (bounded by the handshake
/// timeout), the client certificate's user if one was presented, then the same
/// connection loop as plain connections.
async fn serve_tls(
    id: u64,
    accepted: Accepted,
    timings: Arc<WorkerTimings>,
    stop: watch::Receiver<bool>,
) {
    let Accepted {
        stream,
        peer,
        slot,
        tls,
    } = accepted;
    let Some(config) = tls else { return };
    let Some((stream, local)) = register(stream, peer) else {
        return;
    };
    let shared = Arc::clone(slot.shared());
    let Some(limit) = shared.tls.as_ref().map(|t| t.config().handshake_timeout) else {
        return;
    };
    let handshake = tokio_rustls::TlsAcceptor::from(config).accept(stream);
    let stream = match tokio::time::timeout(limit, handshake).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            shared.conns.tls_failures.fetch_add(1, Ordering::Relaxed);
            tracing::info!(conn = id, %peer, error = %e, "TLS handshake failed; closing the connection");
            return;
        }
        Err(_) => {
            shared.conns.tls_failures.fetch_add(1, Ordering::Relaxed);
            tracing::info!(conn = id, %peer, timeout_secs = limit.as_secs_f64(), "TLS handshake timed out; closing the connection");
            return;
        }
    };
    shared.conns.tls_total.fetch_add(1, Ordering::Relaxed);
    let user = match stream.get_ref().1.peer_certificates() {
        Some([leaf, ..]) => match user_for_certificate(leaf, &shared.users.current()) {
            Ok(user) => {
                tracing::info!(conn = id, %peer, user = %format_args!("<ud>{user}</ud>"), mechanism = %"client-certificate", "authenticated");
                Some(user)
            }
            Err(e) => {
                shared.conns.tls_failures.fetch_add(1, Ordering::Relaxed);
                tracing::info!(conn = id, %peer, reason = %e, "client certificate names no user; closing the connection");
                return;
            }
        },
        _ => None,
    };
    let opened = Opened {
        peer,
        local,
        slot,
        user,
    };
    Connection::new(id, stream, opened, timings, stop)
        .run()
        .await;
}
