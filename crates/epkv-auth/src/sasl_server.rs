//! One SASL authentication attempt on a connection: `SASL_AUTH` starts it, `SASL_STEP`
//! continues it.

use std::sync::Arc;

use crate::error::{AuthError, Result};
use crate::mechanism::Mechanism;
use crate::plain;
use crate::scram::{self, ScramExchange};
use crate::user_store::UserStore;

/// What the front end answers to a successful `SASL_AUTH` or `SASL_STEP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaslStep {
    /// Answer status `0x21` (AuthContinue) with this challenge as the value; the client
    /// goes on with `SASL_STEP`.
    Continue(Vec<u8>),
    /// Authentication succeeded: answer status `0x00` with `server_final` as the value
    /// (SCRAM's `v=` server signature; empty for PLAIN).
    Done {
        /// The authenticated user.
        user: String,
        /// The final server message.
        server_final: Vec<u8>,
    },
}

/// Where an attempt stands.
enum State {
    /// SCRAM sent its server-first message and waits for the client-final one.
    AwaitingFinal(Box<ScramExchange>),
    /// Succeeded or failed; any further step is a protocol error.
    Finished,
}

/// The server side of one SASL authentication attempt.
///
/// Create it with [`SaslServer::start`] on `SASL_AUTH`, keep it on the connection while
/// the answer is [`SaslStep::Continue`], feed `SASL_STEP` values to [`SaslServer::step`].
/// A new `SASL_AUTH` simply starts a new attempt (drop the old one). After success or any
/// error the attempt is finished and further steps fail with [`AuthError::Malformed`].
pub struct SaslServer {
    users: Arc<UserStore>,
    mechanism: Mechanism,
    state: State,
}

impl std::fmt::Debug for SaslServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::AwaitingFinal(x) => format!("awaiting final from <ud>{}</ud>", x.user()),
            State::Finished => "finished".to_owned(),
        };
        f.debug_struct("SaslServer")
            .field("mechanism", &self.mechanism.name())
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

/// Returns the requested mechanism name if it has the shape of one (RFC 4422 §3.1: 1 to
/// 20 characters of `A-Z 0-9 - _`), else a placeholder: whatever a confused client put in
/// the key must not reach the logs.
fn loggable_mechanism_name(raw: &[u8]) -> String {
    let shaped = (1..=20).contains(&raw.len())
        && raw
            .iter()
            .all(|&b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if shaped {
        String::from_utf8_lossy(raw).into_owned()
    } else {
        "(not a mechanism name)".to_owned()
    }
}

impl SaslServer {
    /// Handles `SASL_AUTH` (0x21): `mechanism` is the request key, `client_data` its value.
    ///
    /// # Errors
    /// [`AuthError::UnknownMechanism`] for a mechanism not in [`crate::MECHANISMS`],
    /// [`AuthError::Malformed`] for a message that breaks the mechanism's grammar,
    /// [`AuthError::Failed`] for refused credentials (PLAIN) or an authzid other than the
    /// user, [`AuthError::ChannelBindingNotSupported`] for SCRAM `p=`. Check
    /// [`AuthError::is_auth_failure`] to pick the status.
    pub fn start(
        users: Arc<UserStore>,
        mechanism: &[u8],
        client_data: &[u8],
    ) -> Result<(Self, SaslStep)> {
        Self::start_inner(users, mechanism, client_data, scram::random_server_nonce)
    }

    /// The zero-configuration mode (no users at all, loopback only): accepts any
    /// credentials in the client's first message and returns the name it claimed. The
    /// front end answers success at once, without a SCRAM exchange: with no stored
    /// password the server could not sign a `v=` the client would accept, and the
    /// Couchbase clients take a success to SASL_AUTH as the end of the exchange.
    ///
    /// # Errors
    /// [`AuthError::UnknownMechanism`] and [`AuthError::Malformed`] as
    /// [`SaslServer::start`]: a message that is not PLAIN or a SCRAM client-first is
    /// still refused.
    pub fn open(mechanism: &[u8], client_data: &[u8]) -> Result<String> {
        let Some(mech) = Mechanism::from_name(mechanism) else {
            return Err(AuthError::UnknownMechanism(loggable_mechanism_name(
                mechanism,
            )));
        };
        let name: &[u8] = match mech {
            Mechanism::Plain => {
                let mut parts = client_data.splitn(3, |&b| b == 0);
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(_), Some(user), Some(_)) => user,
                    _ => {
                        return Err(AuthError::Malformed(
                            "plain message needs two NUL separators",
                        ));
                    }
                }
            }
            Mechanism::Scram(_) => {
                // gs2 header (two fields), then `n=user,r=nonce,...`.
                let bare = client_data.splitn(3, |&b| b == b',').nth(2);
                match bare.and_then(|b| b.split(|&c| c == b',').next()?.strip_prefix(b"n=")) {
                    Some(raw) => return scram::decode_saslname(raw),
                    None => {
                        return Err(AuthError::Malformed("scram client-first has no n= user"));
                    }
                }
            }
        };
        String::from_utf8(name.to_vec())
            .map_err(|_| AuthError::Malformed("plain user name is not utf-8"))
    }

    /// [`SaslServer::start`] with a fixed SCRAM server nonce, to reproduce RFC examples.
    #[cfg(test)]
    pub(crate) fn start_with_nonce(
        users: Arc<UserStore>,
        mechanism: &[u8],
        client_data: &[u8],
        server_nonce: &str,
    ) -> Result<(Self, SaslStep)> {
        Self::start_inner(users, mechanism, client_data, || server_nonce.to_owned())
    }

    fn start_inner(
        users: Arc<UserStore>,
        mechanism: &[u8],
        client_data: &[u8],
        server_nonce: impl FnOnce() -> String,
    ) -> Result<(Self, SaslStep)> {
        let mech = Mechanism::from_name(mechanism)
            .ok_or_else(|| AuthError::UnknownMechanism(loggable_mechanism_name(mechanism)))?;
        match mech {
            Mechanism::Plain => {
                let user = plain::authenticate(&users, client_data)?;
                let server = Self {
                    users,
                    mechanism: mech,
                    state: State::Finished,
                };
                Ok((
                    server,
                    SaslStep::Done {
                        user,
                        server_final: Vec::new(),
                    },
                ))
            }
            Mechanism::Scram(hash) => {
                let (exchange, server_first) =
                    ScramExchange::start(&users, hash, client_data, &server_nonce())?;
                let server = Self {
                    users,
                    mechanism: mech,
                    state: State::AwaitingFinal(Box::new(exchange)),
                };
                Ok((server, SaslStep::Continue(server_first)))
            }
        }
    }

    /// Handles `SASL_STEP` (0x22) with the request value.
    ///
    /// # Errors
    /// [`AuthError::Failed`] for a wrong proof, a mismatched nonce or channel binding, or
    /// an unknown user; [`AuthError::Malformed`] for a bad message or a step when none is
    /// expected. The attempt is finished afterwards either way.
    pub fn step(&mut self, client_data: &[u8]) -> Result<SaslStep> {
        match std::mem::replace(&mut self.state, State::Finished) {
            State::AwaitingFinal(exchange) => {
                let user = exchange.user().to_owned();
                let server_final = exchange.finish(client_data)?;
                Ok(SaslStep::Done { user, server_final })
            }
            State::Finished => Err(AuthError::Malformed("no sasl exchange is in progress")),
        }
    }

    /// Returns the mechanism of this attempt.
    #[must_use]
    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// Returns the user store this attempt checks against.
    #[must_use]
    pub fn users(&self) -> &Arc<UserStore> {
        &self.users
    }

    /// Returns true when the attempt needs no more steps (succeeded or failed).
    #[must_use]
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished)
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as B64;

    use super::*;
    use crate::mechanism::ScramHash;
    use crate::user_store::BucketAccess;

    /// The user of both RFC examples: `user` / `pencil`, 4096 iterations.
    fn rfc_store(hash: ScramHash, salt_b64: &str) -> Arc<UserStore> {
        let mut s = UserStore::empty().with_iterations(4096);
        s.insert_with_salt(
            "user",
            "pencil",
            BucketAccess::All,
            hash,
            B64.decode(salt_b64).unwrap(),
            4096,
        );
        Arc::new(s)
    }

    const RFC5802_SALT: &str = "QSXCR+Q6sek8bf92";
    const RFC5802_SNONCE: &str = "3rfcNHYJY1ZVvWVs7j";
    const RFC5802_FIRST: &[u8] = b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL";
    const RFC5802_FINAL: &[u8] =
        b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=";

    #[test]
    fn open_mode_takes_the_claimed_name_of_each_mechanism() {
        assert_eq!(
            SaslServer::open(b"PLAIN", b"\0alice\0any").unwrap(),
            "alice"
        );
        assert_eq!(SaslServer::open(b"PLAIN", b"\0alice\0").unwrap(), "alice");
        assert_eq!(
            SaslServer::open(b"SCRAM-SHA512", b"n,,n=b=2Cob,r=abc").unwrap(),
            "b,ob"
        );
        assert_eq!(
            SaslServer::open(b"SCRAM-SHA1", RFC5802_FIRST).unwrap(),
            "user"
        );
        // Still refused: an unknown mechanism and messages of no known shape.
        assert!(matches!(
            SaslServer::open(b"GSSAPI", b"\0a\0b"),
            Err(AuthError::UnknownMechanism(_))
        ));
        for (mech, data) in [
            (&b"PLAIN"[..], &b"alice"[..]),
            (b"PLAIN", b"\0\xff\0pw"),
            (b"SCRAM-SHA256", b"n,,r=abc"),
            (b"SCRAM-SHA256", b""),
        ] {
            assert!(
                matches!(SaslServer::open(mech, data), Err(AuthError::Malformed(_))),
                "{data:?}"
            );
        }
    }

    fn rfc5802_start() -> SaslServer {
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        let (server, step) =
            SaslServer::start_with_nonce(users, b"SCRAM-SHA1", RFC5802_FIRST, RFC5802_SNONCE)
                .unwrap();
        assert_eq!(
            step,
            SaslStep::Continue(
                b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096".to_vec()
            )
        );
        server
    }

    #[test]
    fn rfc5802_sha1_example_exchange() {
        let mut server = rfc5802_start();
        assert!(!server.is_finished());
        let done = server.step(RFC5802_FINAL).unwrap();
        assert_eq!(
            done,
            SaslStep::Done {
                user: "user".into(),
                server_final: b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=".to_vec(),
            }
        );
        assert!(server.is_finished());
        assert!(matches!(
            server.step(RFC5802_FINAL),
            Err(AuthError::Malformed(_))
        ));
    }

    #[test]
    fn rfc7677_sha256_example_exchange() {
        let users = rfc_store(ScramHash::Sha256, "W22ZaJ0SNY7soEsUEjb6gQ==");
        let (mut server, step) = SaslServer::start_with_nonce(
            users,
            b"SCRAM-SHA256",
            b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        )
        .unwrap();
        assert_eq!(
            step,
            SaslStep::Continue(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
                    .to_vec()
            )
        );
        let done = server
            .step(
                b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            )
            .unwrap();
        assert_eq!(
            done,
            SaslStep::Done {
                user: "user".into(),
                server_final: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec(),
            }
        );
    }

    fn must_fail(result: Result<SaslStep>, user: &str) {
        match result {
            Err(AuthError::Failed { user: Some(u) }) => assert_eq!(u, user),
            other => panic!("expected an auth failure for {user}, got {other:?}"),
        }
    }

    #[test]
    fn wrong_proof_fails() {
        let mut server = rfc5802_start();
        let bad =
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ss=";
        must_fail(server.step(bad), "user");
        // The attempt is over; the right proof no longer helps.
        assert!(matches!(
            server.step(RFC5802_FINAL),
            Err(AuthError::Malformed(_))
        ));
    }

    #[test]
    fn replayed_final_message_fails_against_a_new_nonce() {
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        // A fresh exchange has a random server nonce, so the recorded final message
        // (valid for the RFC's nonce) must be refused.
        let (mut server, _) = SaslServer::start(users, b"SCRAM-SHA1", RFC5802_FIRST).unwrap();
        must_fail(server.step(RFC5802_FINAL), "user");
    }

    #[test]
    fn mismatched_nonce_or_binding_fails() {
        let mut server = rfc5802_start();
        must_fail(
            server.step(b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="),
            "user",
        );
        let mut server = rfc5802_start();
        // c= must repeat the gs2 header "n,," exactly; "y,," is eSws.
        must_fail(
            server.step(
                b"c=eSws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
            ),
            "user",
        );
    }

    #[test]
    fn channel_binding_request_is_refused_and_y_flag_accepted() {
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        let err = SaslServer::start(users.clone(), b"SCRAM-SHA1", b"p=tls-unique,,n=user,r=abc")
            .unwrap_err();
        assert!(matches!(err, AuthError::ChannelBindingNotSupported));
        assert!(err.is_auth_failure());
        let (_, step) = SaslServer::start(users, b"SCRAM-SHA1", b"y,,n=user,r=abc").unwrap();
        assert!(matches!(step, SaslStep::Continue(c) if c.starts_with(b"r=abc")));
    }

    #[test]
    fn authzid_must_be_absent_or_the_user() {
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        let first = b"n,a=user,n=user,r=fyko+d2lbbFgONRv9qkxdawL";
        let (mut server, _) =
            SaslServer::start_with_nonce(users.clone(), b"SCRAM-SHA1", first, RFC5802_SNONCE)
                .unwrap();
        // The gs2 header is now "n,a=user,", so the binding and proof change; build a
        // correct final with an independent client computation.
        let final_msg = client_final_sha1(first, "n,a=user,", "pencil");
        let step = server.step(&final_msg).unwrap();
        assert!(matches!(step, SaslStep::Done { user, .. } if user == "user"));

        let err = SaslServer::start(users, b"SCRAM-SHA1", b"n,a=admin,n=user,r=abc").unwrap_err();
        assert!(matches!(&err, AuthError::Failed { user: Some(u) } if u == "user"));
    }

    /// Computes the client-final message of an exchange with the RFC 5802 salt and nonce.
    fn client_final_sha1(client_first: &[u8], gs2: &str, password: &str) -> Vec<u8> {
        let h = ScramHash::Sha1;
        let salted = h.salted_password(
            password.as_bytes(),
            &B64.decode(RFC5802_SALT).unwrap(),
            4096,
        );
        let client_key = h.hmac(&salted, b"Client Key");
        let stored_key = h.hash(&client_key);
        let bare = &client_first[gs2.len()..];
        let nonce = "fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j";
        let server_first = format!("r={nonce},s={RFC5802_SALT},i=4096");
        let without_proof = format!("c={},r={nonce}", B64.encode(gs2));
        let mut auth = bare.to_vec();
        auth.extend_from_slice(format!(",{server_first},{without_proof}").as_bytes());
        let sig = h.hmac(&stored_key, &auth);
        let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
        format!("{without_proof},p={}", B64.encode(proof)).into_bytes()
    }

    #[test]
    fn escaped_user_names_are_decoded() {
        let mut s = UserStore::empty().with_iterations(16);
        s.insert_with_password("a,b=c", "pw", BucketAccess::All)
            .unwrap();
        let users = Arc::new(s);
        let (_, step) =
            SaslServer::start(users.clone(), b"SCRAM-SHA256", b"n,,n=a=2Cb=3Dc,r=xyz").unwrap();
        let SaslStep::Continue(first) = step else {
            panic!("expected a challenge")
        };
        let salt = users
            .credential("a,b=c", ScramHash::Sha256)
            .unwrap()
            .salt
            .clone();
        let want = format!("s={},i=16", B64.encode(salt));
        assert!(String::from_utf8(first).unwrap().ends_with(&want));
        let err = SaslServer::start(users, b"SCRAM-SHA256", b"n,,n=a=2Xb,r=xyz").unwrap_err();
        assert!(matches!(err, AuthError::Malformed(_)));
    }

    #[test]
    fn unknown_user_gets_a_stable_fake_salt_and_fails_at_the_end() {
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        // Returns the server and the challenge's (nonce, salt) attributes.
        let challenge = |u: &Arc<UserStore>| {
            let (server, step) =
                SaslServer::start(u.clone(), b"SCRAM-SHA1", b"n,,n=ghost,r=abc").unwrap();
            let SaslStep::Continue(c) = step else {
                panic!("expected a challenge")
            };
            let c = String::from_utf8(c).unwrap();
            let parts: Vec<&str> = c.split(',').collect();
            assert_eq!(parts.len(), 3, "{c}");
            assert_eq!(parts[2], "i=4096");
            (
                server,
                parts[0].strip_prefix("r=").unwrap().to_owned(),
                parts[1].strip_prefix("s=").unwrap().to_owned(),
            )
        };
        let (mut server, nonce, salt_a) = challenge(&users);
        let (_, _, salt_b) = challenge(&users);
        assert_eq!(salt_a, salt_b, "the same fake salt every time");
        assert_eq!(B64.decode(&salt_a).unwrap().len(), 20);
        assert!(nonce.starts_with("abc") && nonce.len() > 3);
        let proof = B64.encode([0_u8; 20]);
        must_fail(
            server.step(format!("c=biws,r={nonce},p={proof}").as_bytes()),
            "ghost",
        );
    }

    #[test]
    fn scram_user_without_that_hash_fails() {
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        let (mut server, step) =
            SaslServer::start_with_nonce(users, b"SCRAM-SHA512", b"n,,n=user,r=abc", "def")
                .unwrap();
        assert!(matches!(step, SaslStep::Continue(_)));
        let proof = B64.encode([0_u8; 64]);
        must_fail(
            server.step(format!("c=biws,r=abcdef,p={proof}").as_bytes()),
            "user",
        );
    }

    #[test]
    fn malformed_scram_messages_are_rejected() {
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        for first in [
            &b""[..],
            b"n",
            b"n,",
            b"x,,n=user,r=abc",
            b"n,,",
            b"n,,r=abc",
            b"n,,n=user",
            b"n,,n=user,r=",
            b"n,,m=ext,n=user,r=abc",
            b"n,,n=user,r=abc,bad",
            b"n,b=x,n=user,r=abc",
        ] {
            let err = SaslServer::start(users.clone(), b"SCRAM-SHA1", first).unwrap_err();
            assert!(
                matches!(err, AuthError::Malformed(_)),
                "{:?} gave {err:?}",
                String::from_utf8_lossy(first)
            );
            assert!(!err.is_auth_failure());
        }
        for fin in [
            &b""[..],
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j",
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=***",
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=AAAA",
            b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
            b"c=@@,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
        ] {
            let mut server = rfc5802_start();
            let err = server.step(fin).unwrap_err();
            assert!(
                matches!(err, AuthError::Malformed(_)),
                "{:?} gave {err:?}",
                String::from_utf8_lossy(fin)
            );
        }
    }

    #[test]
    fn client_nonce_is_opaque_up_to_the_next_comma() {
        // The Couchbase C++ client (Python SDK) sends nonces like this one.
        let users = rfc_store(ScramHash::Sha1, RFC5802_SALT);
        let nonce = "0xffffff95 0xffffff8e 0x5d \t\u{7f}\u{e9}";
        let first = format!("n,,n=user,r={nonce}");
        let (mut server, step) =
            SaslServer::start_with_nonce(users, b"SCRAM-SHA1", first.as_bytes(), "srv").unwrap();
        let SaslStep::Continue(c) = step else {
            panic!("expected a challenge")
        };
        assert!(c.starts_with(format!("r={nonce}srv,s=").as_bytes()));
        let proof = B64.encode([0_u8; 20]);
        must_fail(
            server.step(format!("c=biws,r={nonce}srv,p={proof}").as_bytes()),
            "user",
        );
    }

    #[test]
    fn unknown_mechanism_is_an_auth_failure_with_a_sanitised_name() {
        let users = Arc::new(UserStore::empty());
        let err = SaslServer::start(users.clone(), b"CRAM-MD5", b"").unwrap_err();
        assert!(matches!(&err, AuthError::UnknownMechanism(m) if m == "CRAM-MD5"));
        assert!(err.is_auth_failure());
        for odd in [&[b'\n'; 3][..], b"Password1", &[b'A'; 21]] {
            let err = SaslServer::start(users.clone(), odd, b"").unwrap_err();
            assert!(
                matches!(&err, AuthError::UnknownMechanism(m) if m == "(not a mechanism name)"),
                "{err:?}"
            );
        }
    }

    #[test]
    fn step_without_start_state_is_malformed() {
        let mut s = UserStore::empty().with_iterations(8);
        s.insert_with_password("u", "p", BucketAccess::All).unwrap();
        let (mut server, step) = SaslServer::start(Arc::new(s), b"PLAIN", b"\0u\0p").unwrap();
        assert!(matches!(step, SaslStep::Done { .. }));
        assert!(server.is_finished());
        assert_eq!(server.mechanism(), Mechanism::Plain);
        assert!(matches!(server.step(b"x"), Err(AuthError::Malformed(_))));
    }
}
