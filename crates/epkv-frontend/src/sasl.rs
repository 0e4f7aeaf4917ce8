//! SASL_LIST_MECHS, SASL_AUTH and SASL_STEP on a [`Session`], answered by `epkv-auth`.
//!
//! Replies: 0x00 with the server's final message (SCRAM's `v=` signature) when
//! authentication succeeds, 0x21 AuthContinue with the challenge when the mechanism needs
//! another step, 0x20 AuthError when the credentials are refused, 0x04 Einval for a
//! message that breaks the mechanism's grammar, 0x86 Etmpfail when the password-check
//! pool's queue is full. Failures are logged with the user name the client claimed, the
//! source address and the mechanism, never with the password or proof.
//!
//! PLAIN attempts, and every attempt from a source that has failed too often, do not run
//! here: they become a [`PendingAuth`] that the connection waits for (see
//! [`crate::auth_guard`]).

use crate::auth_guard::MAX_FAILURES_PER_CONNECTION;
use crate::dispatch::Flow;
use crate::frontend::Shared;
use crate::response::{ReplyTo, put_error_text, put_success};
use crate::session::Session;
use bytes::BytesMut;
use epkv_auth::audit::{AuditEvent, AuditKind, Interface};
use epkv_auth::{AuthError, MECHANISMS, SaslServer, SaslStep};
use epkv_protocol::{Response, Status};
use epkv_types::{Cas, Datatype};
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use tokio::sync::oneshot;

/// What a SASL_AUTH run off the connection gives back.
pub(crate) type AuthOutcome = Result<(SaslServer, SaslStep), AuthError>;

/// A SASL_AUTH the connection waits for: its source's delay first, if any, then the
/// password check on the pool. The connection executes nothing else meanwhile.
pub(crate) struct PendingAuth {
    to: ReplyTo,
    mechanism: String,
    source: IpAddr,
    /// Until submitted: when it may start, and the request's mechanism and data.
    waiting: Option<(Instant, Vec<u8>, Vec<u8>)>,
    /// Once submitted: the pool's answer.
    running: Option<oneshot::Receiver<AuthOutcome>>,
}

impl PendingAuth {
    /// Waits out the delay (checking the source again after it: more failures may have
    /// come meanwhile), runs the attempt on the pool and returns its outcome; `None` when
    /// the pool's queue was full. Cancel-safe: the connection may drop this future and
    /// call it again.
    pub(crate) async fn outcome(&mut self, shared: &Shared) -> Option<AuthOutcome> {
        while let Some((at, _, _)) = &self.waiting {
            tokio::time::sleep_until(tokio::time::Instant::from_std(*at)).await;
            match shared.auth.admit(self.source, shared.config.clock.now()) {
                Some(later) => {
                    if let Some(w) = self.waiting.as_mut() {
                        w.0 = later;
                    }
                }
                None => {
                    let Some((_, mechanism, data)) = self.waiting.take() else {
                        break;
                    };
                    let (tx, rx) = oneshot::channel();
                    let users = shared.users.current();
                    let submitted = shared.auth.run(move || {
                        // The connection may be gone; then nobody waits.
                        let _ = tx.send(SaslServer::start(users, &mechanism, &data));
                    });
                    if !submitted {
                        return None;
                    }
                    self.running = Some(rx);
                }
            }
        }
        match &mut self.running {
            // A pool thread that died without answering counts as a busy pool.
            Some(rx) => rx.await.ok(),
            None => None,
        }
    }
}

impl Session {
    /// SASL_LIST_MECHS: the mechanisms, space separated, strongest first.
    pub(crate) fn sasl_list_mechs(&self, _shared: &Shared, out: &mut BytesMut, to: ReplyTo) {
        put_success(
            out,
            to,
            Cas::ANY,
            Datatype::RAW,
            &[],
            &[],
            MECHANISMS.as_bytes(),
        );
    }

    /// SASL_AUTH: starts a new attempt (any attempt in progress is dropped). A PLAIN
    /// attempt, or any attempt from a source that must wait, is left pending for the
    /// connection (see [`PendingAuth`]); a SCRAM start (HMACs only) runs here.
    pub(crate) fn sasl_auth(
        &mut self,
        shared: &Shared,
        mechanism: &[u8],
        data: &[u8],
        out: &mut BytesMut,
        to: ReplyTo,
    ) -> Flow {
        self.sasl = None;
        shared.auth.stats.attempts.fetch_add(1, Relaxed);
        if shared.open_default && shared.users.current().is_empty() {
            return self.sasl_open(shared, mechanism, data, out, to);
        }
        let now = shared.config.clock.now();
        let delayed = shared.auth.admit(self.peer.ip(), now);
        if delayed.is_some() {
            shared.auth.stats.throttled.fetch_add(1, Relaxed);
        }
        if delayed.is_some() || mechanism.eq_ignore_ascii_case(b"PLAIN") {
            self.pending_auth = Some(PendingAuth {
                to,
                mechanism: String::from_utf8_lossy(mechanism).into_owned(),
                source: self.peer.ip(),
                waiting: Some((delayed.unwrap_or(now), mechanism.to_vec(), data.to_vec())),
                running: None,
            });
            return Flow::Continue;
        }
        let result = SaslServer::start(shared.users.current(), mechanism, data);
        let mechanism = String::from_utf8_lossy(mechanism);
        self.sasl_outcome(shared, &mechanism, result, out, to)
    }

    /// SASL_AUTH in the zero-configuration mode (no users, loopback only): any name and
    /// password succeed at once, so Couchbase SDKs, which always authenticate, work with
    /// no setup. The connection keeps the open mode's privileges (every bucket); the name
    /// is only logged.
    fn sasl_open(
        &mut self,
        shared: &Shared,
        mechanism: &[u8],
        data: &[u8],
        out: &mut BytesMut,
        to: ReplyTo,
    ) -> Flow {
        let mechanism_text = String::from_utf8_lossy(mechanism);
        match SaslServer::open(mechanism, data) {
            Ok(user) => {
                tracing::info!(user = %format_args!("<ud>{user}</ud>"), mechanism = %mechanism_text, agent = self.agent.as_deref().unwrap_or(""), "authenticated: open mode (no users configured), any credentials accepted");
                self.audit(
                    AuditEvent::new(AuditKind::AuthSuccess, Interface::Kv)
                        .user(&user)
                        .detail(&mechanism_text),
                );
                put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &[]);
                Flow::Continue
            }
            Err(e) => self.sasl_failed(shared, &mechanism_text, &e, out, to),
        }
    }

    /// Takes the SASL_AUTH the last request left pending, if any.
    pub(crate) fn take_pending_auth(&mut self) -> Option<PendingAuth> {
        self.pending_auth.take()
    }

    /// Whether the last request left a SASL_AUTH pending.
    pub(crate) fn has_pending_auth(&self) -> bool {
        self.pending_auth.is_some()
    }

    /// Answers a pending SASL_AUTH with its outcome (`None`: the pool was full, TMPFAIL).
    /// Returns true when the connection must close after the reply (too many failures).
    pub(crate) fn complete_auth(
        &mut self,
        shared: &Shared,
        out: &mut BytesMut,
        p: PendingAuth,
        outcome: Option<AuthOutcome>,
    ) -> bool {
        match outcome {
            Some(result) => !matches!(
                self.sasl_outcome(shared, &p.mechanism, result, out, p.to),
                Flow::Continue
            ),
            None => {
                tracing::warn!(source = %p.source, mechanism = %p.mechanism, "authentication refused for now: the password-check queue is full");
                put_error_text(out, p.to, Status::Etmpfail);
                false
            }
        }
    }

    /// Answers a SASL_AUTH's outcome.
    fn sasl_outcome(
        &mut self,
        shared: &Shared,
        mechanism: &str,
        result: AuthOutcome,
        out: &mut BytesMut,
        to: ReplyTo,
    ) -> Flow {
        match result {
            Ok((server, step)) => {
                if matches!(step, SaslStep::Continue(_)) {
                    self.sasl = Some(server);
                }
                self.sasl_reply(shared, mechanism, step, out, to);
                Flow::Continue
            }
            Err(e) => self.sasl_failed(shared, mechanism, &e, out, to),
        }
    }

    /// SASL_STEP: continues the attempt SASL_AUTH started.
    pub(crate) fn sasl_step(
        &mut self,
        shared: &Shared,
        mechanism: &[u8],
        data: &[u8],
        out: &mut BytesMut,
        to: ReplyTo,
    ) -> Flow {
        let mechanism = String::from_utf8_lossy(mechanism);
        let Some(mut server) = self.sasl.take() else {
            tracing::info!(%mechanism, "SASL_STEP without an authentication in progress");
            put_error_text(out, to, Status::Einval);
            return Flow::Continue;
        };
        match server.step(data) {
            Ok(step) => {
                if matches!(step, SaslStep::Continue(_)) {
                    self.sasl = Some(server);
                }
                self.sasl_reply(shared, &mechanism, step, out, to);
                Flow::Continue
            }
            Err(e) => self.sasl_failed(shared, &mechanism, &e, out, to),
        }
    }

    fn sasl_reply(
        &mut self,
        shared: &Shared,
        mechanism: &str,
        step: SaslStep,
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
        match step {
            SaslStep::Continue(challenge) => crate::response::put(
                out,
                &Response::new(to.opcode, Status::AuthContinue, to.opaque).with_value(&challenge),
            ),
            SaslStep::Done { user, server_final } => {
                tracing::info!(user = %format_args!("<ud>{user}</ud>"), %mechanism, agent = self.agent.as_deref().unwrap_or(""), "authenticated");
                self.auth_failures = 0;
                self.audit(
                    AuditEvent::new(AuditKind::AuthSuccess, Interface::Kv)
                        .user(&user)
                        .detail(mechanism),
                );
                self.set_user(shared, user);
                put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &server_final);
            }
        }
    }

    /// Answers a refused attempt. A refusal of the credentials counts against the source
    /// address and the connection; the connection closes after too many in a row.
    fn sasl_failed(
        &mut self,
        shared: &Shared,
        mechanism: &str,
        e: &AuthError,
        out: &mut BytesMut,
        to: ReplyTo,
    ) -> Flow {
        // `AuthError`'s text never holds a password, proof or key; it names the user
        // the client claimed inside <ud> tags.
        tracing::warn!(source = %self.peer.ip(), %mechanism, error = %e, agent = self.agent.as_deref().unwrap_or(""), "authentication failed");
        if !e.is_auth_failure() {
            put_error_text(out, to, Status::Einval);
            return Flow::Continue;
        }
        put_error_text(out, to, Status::AuthError);
        let detail = format!("{mechanism}: {e}");
        self.audit(AuditEvent::new(AuditKind::AuthFailure, Interface::Kv).detail(&detail));
        shared
            .auth
            .failed(self.peer.ip(), shared.config.clock.now());
        self.auth_failures += 1;
        if self.auth_failures >= MAX_FAILURES_PER_CONNECTION {
            shared.auth.stats.closes.fetch_add(1, Relaxed);
            tracing::warn!(source = %self.peer.ip(), failures = self.auth_failures, "closing connection: too many failed authentication attempts");
            return Flow::Close;
        }
        Flow::Continue
    }
}
