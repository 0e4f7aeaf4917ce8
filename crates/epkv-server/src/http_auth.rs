//! Who may use the HTTP endpoints (Prometheus metrics, the management REST API): the KV
//! port's users and rules over HTTP Basic auth.
//!
//! - The open zero-configuration mode (no users and a loopback address) needs no
//!   credentials, as the KV port.
//! - Otherwise a request must carry `Authorization: Basic` with a configured user's name
//!   and password. Anything else is answered 401 with `WWW-Authenticate: Basic
//!   realm="epkv"` (and, when credentials were presented, an `auth_failure` audit event).
//! - What an authenticated request may do is a privilege of the user's roles
//!   ([`Access::grants`] resolves them once per request; [`Grants::allows`] is built on
//!   `Roles::allows`); the open mode allows everything.
//!
//! Checking a password derives its PBKDF2 hash (15,000 rounds, a few milliseconds), so:
//! - the derivation runs on Tokio's blocking pool, never on the thread serving
//!   connections, and at most one runs at a time (a flood of bad passwords costs one
//!   core at most, and queues);
//! - a successful check is remembered for [`CACHE_TTL`] under an HMAC-SHA256 of the
//!   name and password with a key drawn at start, so a scrape every 15 s derives once a
//!   minute. The password itself is never stored, and the key makes the cached digests
//!   useless for guessing passwords offline. Failures are not remembered, and a change
//!   of users through the management API forgets everything ([`Access::forget`]), so a
//!   removed user or an old password stops working at once.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use epkv_auth::{
    AuditEvent, AuditKind, AuditLog, Interface, Privilege, Roles, SaslServer, UserDirectory,
};
use epkv_executor::Clock;
use hmac::{Hmac, Mac};
use parking_lot::Mutex;
use rand::RngCore;
use sha2::Sha256;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a verified name and password are accepted without deriving again.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(60);

/// Most verified credentials remembered at once (expired ones are dropped first).
const CACHE_MAX: usize = 256;

/// The outcome of checking a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The open mode: every bucket, no credentials needed.
    Open,
    /// Authenticated as this user.
    User(String),
    /// No valid credentials: answer 401.
    Denied,
}

impl Verdict {
    /// The authenticated user, if any.
    pub(crate) fn user(&self) -> Option<&str> {
        match self {
            Self::User(u) => Some(u),
            Self::Open | Self::Denied => None,
        }
    }

    /// An audit event of `kind` about a request through `interface` from `peer` with
    /// this verdict (naming the user when there is one).
    pub(crate) fn audit_event(
        &self,
        kind: AuditKind,
        interface: Interface,
        peer: SocketAddr,
    ) -> AuditEvent<'_> {
        AuditEvent::new(kind, interface)
            .user_opt(self.user())
            .source(peer)
    }
}

/// What one request's caller may do ([`Access::grants`]): resolved once per request, so a
/// check per bucket reads no shared state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Grants {
    /// The open mode: every privilege.
    All,
    /// An authenticated user's roles.
    Roles(Roles),
}

impl Grants {
    /// Whether these grants hold `privilege` on `bucket` (`None` for a global privilege;
    /// a collection-level one asked on a bucket must hold on all of its collections): the
    /// one check of every REST endpoint and of `/metrics`.
    pub(crate) fn allows(&self, privilege: Privilege, bucket: Option<&str>) -> bool {
        match self {
            Self::All => true,
            Self::Roles(r) => r.allows(privilege, bucket, None, None),
        }
    }

    /// Whether these are a full administrator's: the open mode, or a user with the
    /// `admin` role (as `--admin-user`). Only they may grant `admin` or `security_admin`.
    pub(crate) fn is_admin(&self) -> bool {
        match self {
            Self::All => true,
            Self::Roles(r) => r.roles().iter().any(|r| r.name() == "admin"),
        }
    }
}

/// The access rules and the cache of verified credentials.
pub(crate) struct Access {
    users: UserDirectory,
    open: bool,
    clock: Arc<dyn Clock>,
    key: [u8; 32],
    verified: Mutex<HashMap<[u8; 32], (String, Instant)>>,
    derivations: tokio::sync::Semaphore,
    audit: AuditLog,
}

impl Access {
    /// The rules for `users`; `open` is the zero-configuration mode (no users, loopback).
    pub(crate) fn new(
        users: UserDirectory,
        open: bool,
        clock: Arc<dyn Clock>,
        audit: AuditLog,
    ) -> Self {
        let mut key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        Self {
            users,
            open,
            clock,
            key,
            verified: Mutex::new(HashMap::new()),
            derivations: tokio::sync::Semaphore::new(1),
            audit,
        }
    }

    /// The audit log (disabled unless `--audit-log` is set).
    pub(crate) fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// Whether requests need no credentials.
    pub(crate) fn is_open(&self) -> bool {
        self.open
    }

    /// What `verdict` may do, resolved once for a request: the open mode holds every
    /// privilege, a user their roles (none once removed), a denied request nothing.
    pub(crate) fn grants(&self, verdict: &Verdict) -> Grants {
        match verdict {
            Verdict::Open => Grants::All,
            Verdict::User(u) => {
                Grants::Roles(self.users.current().roles(u).cloned().unwrap_or_default())
            }
            Verdict::Denied => Grants::Roles(Roles::none()),
        }
    }

    /// Drops every remembered credential, so a changed or removed user must present a
    /// valid password again.
    pub(crate) fn forget(&self) {
        self.verified.lock().clear();
    }

    /// Checks a request's `Authorization` header value, from `peer` through
    /// `interface`; a presented but wrong or malformed credential is audited.
    pub(crate) async fn check(
        &self,
        authorization: Option<&[u8]>,
        peer: SocketAddr,
        interface: Interface,
    ) -> Verdict {
        if self.open {
            return Verdict::Open;
        }
        let Some(authorization) = authorization else {
            return Verdict::Denied;
        };
        let Some((user, password)) = parse_basic(authorization) else {
            self.audit.record(
                &AuditEvent::new(AuditKind::AuthFailure, interface)
                    .source(peer)
                    .detail("malformed Basic credentials"),
            );
            return Verdict::Denied;
        };
        let digest = self.digest(&user, &password);
        if let Some(user) = self.cached(&digest) {
            return Verdict::User(user);
        }
        let Ok(_permit) = self.derivations.acquire().await else {
            return Verdict::Denied;
        };
        // A request queued behind a derivation of the same credentials finds it cached.
        if let Some(user) = self.cached(&digest) {
            return Verdict::User(user);
        }
        let users = self.users.current();
        let name = user.clone();
        let ok = tokio::task::spawn_blocking(move || {
            let mut message = Vec::with_capacity(name.len() + password.len() + 2);
            message.push(0);
            message.extend_from_slice(name.as_bytes());
            message.push(0);
            message.extend_from_slice(&password);
            SaslServer::start(users, b"PLAIN", &message).is_ok()
        })
        .await
        .unwrap_or(false);
        if !ok {
            tracing::info!(user, "HTTP request with a wrong user or password");
            self.audit.record(
                &AuditEvent::new(AuditKind::AuthFailure, interface)
                    .user(&user)
                    .source(peer)
                    .detail("wrong user or password (HTTP Basic)"),
            );
            return Verdict::Denied;
        }
        self.remember(digest, &user);
        Verdict::User(user)
    }

    fn digest(&self, user: &str, password: &[u8]) -> [u8; 32] {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.key) else {
            // HMAC takes keys of any length.
            return [0; 32];
        };
        mac.update(&(user.len() as u64).to_be_bytes());
        mac.update(user.as_bytes());
        mac.update(password);
        mac.finalize().into_bytes().into()
    }

    fn cached(&self, digest: &[u8; 32]) -> Option<String> {
        let now = self.clock.now();
        let map = self.verified.lock();
        map.get(digest)
            .filter(|(_, at)| now.saturating_duration_since(*at) < CACHE_TTL)
            .map(|(u, _)| u.clone())
    }

    fn remember(&self, digest: [u8; 32], user: &str) {
        let now = self.clock.now();
        let mut map = self.verified.lock();
        if map.len() >= CACHE_MAX {
            map.retain(|_, (_, at)| now.saturating_duration_since(*at) < CACHE_TTL);
        }
        if map.len() >= CACHE_MAX {
            map.clear();
        }
        map.insert(digest, (user.to_owned(), now));
    }

    #[cfg(test)]
    fn cached_entries(&self) -> usize {
        self.verified.lock().len()
    }
}

/// `Basic base64(user:password)` → (user, password); `None` if malformed.
fn parse_basic(header: &[u8]) -> Option<(String, Vec<u8>)> {
    let text = std::str::from_utf8(header).ok()?.trim();
    let (scheme, encoded) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = B64.decode(encoded.trim()).ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    if user.is_empty() {
        return None;
    }
    Some((user, decoded[colon + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use epkv_auth::UserStore;
    use epkv_executor::ManualClock;

    const PEER: SocketAddr =
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 1);

    impl Access {
        async fn check_test(&self, authorization: Option<&[u8]>) -> Verdict {
            self.check(authorization, PEER, Interface::Rest).await
        }
    }

    fn basic(user: &str, password: &str) -> Vec<u8> {
        format!("Basic {}", B64.encode(format!("{user}:{password}"))).into_bytes()
    }

    fn access(clock: Arc<ManualClock>) -> Access {
        let mut users = UserStore::empty().with_iterations(4096);
        users
            .insert_with_password("ops", "pw", epkv_auth::BucketAccess::only(["default"]))
            .unwrap();
        Access::new(
            UserDirectory::new(users),
            false,
            clock,
            AuditLog::disabled(),
        )
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn basic_headers_parse() {
        assert_eq!(
            parse_basic(&basic("ops", "p:w")),
            Some(("ops".to_owned(), b"p:w".to_vec()))
        );
        assert_eq!(
            parse_basic(b"bAsIc b3BzOnB3"),
            Some(("ops".into(), b"pw".to_vec()))
        );
        assert_eq!(parse_basic(b"Bearer abc"), None);
        assert_eq!(parse_basic(b"Basic !!!"), None);
        assert_eq!(parse_basic(&basic("", "pw")), None);
        assert_eq!(parse_basic(b"Basic b3Bz"), None, "no colon");
    }

    #[test]
    fn the_open_mode_needs_nothing() {
        let a = Access::new(
            UserDirectory::default(),
            true,
            Arc::new(ManualClock::new(Duration::ZERO)),
            AuditLog::disabled(),
        );
        assert!(a.is_open());
        assert_eq!(
            runtime().block_on(a.check(None, PEER, Interface::Rest)),
            Verdict::Open
        );
        let open = a.grants(&Verdict::Open);
        assert!(open.allows(Privilege::BucketCreate, None));
        assert!(open.allows(Privilege::Flush, Some("anything")));
    }

    #[test]
    fn users_need_the_right_password_and_see_their_buckets() {
        let clock = Arc::new(ManualClock::new(Duration::ZERO));
        let a = access(Arc::clone(&clock));
        let rt = runtime();
        assert_eq!(rt.block_on(a.check_test(None)), Verdict::Denied);
        assert_eq!(
            rt.block_on(a.check_test(Some(&basic("ops", "no")))),
            Verdict::Denied
        );
        assert_eq!(
            rt.block_on(a.check_test(Some(&basic("who", "pw")))),
            Verdict::Denied
        );
        assert_eq!(a.cached_entries(), 0, "failures are not remembered");
        let ok = rt.block_on(a.check_test(Some(&basic("ops", "pw"))));
        assert_eq!(ok, Verdict::User("ops".into()));
        let grants = a.grants(&ok);
        let read = |b| grants.allows(Privilege::SettingsRead, Some(b));
        assert!(read("default") && !read("travel"));
        assert!(grants.allows(Privilege::Flush, Some("default")));
        assert!(!grants.allows(Privilege::BucketCreate, None));
        assert!(!grants.is_admin() && !a.grants(&Verdict::Denied).is_admin());
        a.forget();
        assert_eq!(a.cached_entries(), 0);
        assert!(
            !a.grants(&Verdict::Denied)
                .allows(Privilege::SettingsRead, Some("default"))
        );
    }

    #[test]
    fn a_verified_password_is_remembered_for_a_minute_by_digest_only() {
        let clock = Arc::new(ManualClock::new(Duration::ZERO));
        let a = access(Arc::clone(&clock));
        let rt = runtime();
        let header = basic("ops", "pw");
        assert_eq!(
            rt.block_on(a.check_test(Some(&header))),
            Verdict::User("ops".into())
        );
        let digest = a.digest("ops", b"pw");
        assert_eq!(a.cached(&digest), Some("ops".into()));
        assert_ne!(digest, a.digest("ops", b"pW"));
        assert_ne!(
            a.digest("op", b"spw"),
            digest,
            "the name's length is hashed too"
        );
        clock.advance(CACHE_TTL - Duration::from_secs(1));
        assert_eq!(a.cached(&digest), Some("ops".into()));
        clock.advance(Duration::from_secs(1));
        assert_eq!(a.cached(&digest), None, "expired after {CACHE_TTL:?}");
        assert_eq!(
            rt.block_on(a.check_test(Some(&header))),
            Verdict::User("ops".into())
        );
        assert_eq!(
            a.cached(&digest),
            Some("ops".into()),
            "derived and remembered again"
        );
    }

    #[test]
    fn the_cache_stays_bounded() {
        let clock = Arc::new(ManualClock::new(Duration::ZERO));
        let a = access(clock);
        for i in 0..(CACHE_MAX * 2) {
            a.remember(a.digest(&format!("u{i}"), b"pw"), "ops");
        }
        assert!(a.cached_entries() <= CACHE_MAX);
    }
}
