//! SASL_LIST_MECHS, SASL_AUTH and SASL_STEP on a [`Session`], answered by `epkv-auth`.
//!
//! Replies: 0x00 with the server's final message (SCRAM's `v=` signature) when
//! authentication succeeds, 0x21 AuthContinue with the challenge when the mechanism needs
//! another step, 0x20 AuthError when the credentials are refused, 0x04 Einval for a
//! message that breaks the mechanism's grammar. Failures are logged with the user name the
//! client claimed and never with the password or proof.

use crate::frontend::Shared;
use crate::response::{ReplyTo, put_error_text, put_success};
use crate::session::Session;
use bytes::BytesMut;
use epkv_auth::{AuthError, MECHANISMS, SaslServer, SaslStep};
use epkv_protocol::{Response, Status};
use epkv_types::{Cas, Datatype};
use std::sync::Arc;

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

    /// SASL_AUTH: starts a new attempt (any attempt in progress is dropped).
    pub(crate) fn sasl_auth(
        &mut self,
        shared: &Shared,
        mechanism: &[u8],
        data: &[u8],
        out: &mut BytesMut,
        to: ReplyTo,
    ) {
        self.sasl = None;
        let result = SaslServer::start(Arc::clone(&shared.users), mechanism, data);
        let mechanism = String::from_utf8_lossy(mechanism);
        match result {
            Ok((server, step)) => {
                if matches!(step, SaslStep::Continue(_)) {
                    self.sasl = Some(server);
                }
                self.sasl_reply(shared, &mechanism, step, out, to);
            }
            Err(e) => self.sasl_failed(&mechanism, &e, out, to),
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
    ) {
        let mechanism = String::from_utf8_lossy(mechanism);
        let Some(mut server) = self.sasl.take() else {
            tracing::info!(%mechanism, "SASL_STEP without an authentication in progress");
            put_error_text(out, to, Status::Einval);
            return;
        };
        match server.step(data) {
            Ok(step) => {
                if matches!(step, SaslStep::Continue(_)) {
                    self.sasl = Some(server);
                }
                self.sasl_reply(shared, &mechanism, step, out, to);
            }
            Err(e) => self.sasl_failed(&mechanism, &e, out, to),
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
                self.set_user(shared, user);
                put_success(out, to, Cas::ANY, Datatype::RAW, &[], &[], &server_final);
            }
        }
    }

    fn sasl_failed(&self, mechanism: &str, e: &AuthError, out: &mut BytesMut, to: ReplyTo) {
        // `AuthError`'s text never holds a password, proof or key.
        tracing::warn!(%mechanism, error = %e, agent = self.agent.as_deref().unwrap_or(""), "authentication failed");
        let status = if e.is_auth_failure() {
            Status::AuthError
        } else {
            Status::Einval
        };
        put_error_text(out, to, status);
    }
}
