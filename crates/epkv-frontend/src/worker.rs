//! A worker thread: a single-threaded Tokio runtime running the connections dealt to it.

use crate::connection::Connection;
use crate::frontend::Shared;
use crate::timings::WorkerTimings;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
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
                            let conn = Connection::new(conn_id, a, Arc::clone(&timings), stop.clone());
                            if let Some(conn) = conn {
                                conns.spawn(conn.run());
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
