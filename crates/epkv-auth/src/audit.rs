//! [`AuditLog`]: an optional file of security events, one JSON object per line
//! (`--audit-log`, docs/auth.md).
//!
//! Each line is one [`AuditEvent`]: when (RFC 3339, UTC, milliseconds), what
//! ([`AuditKind`]), through which interface ([`Interface`]), who, from where, on which
//! bucket, and a free-form detail. The KV port records authentications and refused
//! privileges; the REST API records its own and every change of users and buckets.
//!
//! Writing is a mutex around a buffered file, flushed after every line: a request holds
//! the lock for one short `write` system call, and a line is in the file (not yet synced)
//! when [`AuditLog::record`] returns. A failed write is counted
//! ([`AuditLog::write_errors`]), never returned: auditing never fails a request. A
//! disabled log ([`AuditLog::disabled`]) records nothing and costs one branch.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditKind {
    /// A user authenticated (SASL on the KV port).
    AuthSuccess,
    /// Authentication failed: a wrong password, an unknown user, malformed credentials.
    AuthFailure,
    /// An authenticated user was refused for lack of a privilege (REST 403, KV EACCESS).
    AccessDenied,
    /// A user was created.
    UserCreated,
    /// A user's roles or password changed.
    UserChanged,
    /// A user was deleted.
    UserDeleted,
    /// A bucket was created.
    BucketCreated,
    /// A bucket was dropped.
    BucketDropped,
    /// A bucket was flushed.
    BucketFlushed,
}

impl AuditKind {
    /// Every kind, in declaration order.
    pub const ALL: [AuditKind; 9] = [
        AuditKind::AuthSuccess,
        AuditKind::AuthFailure,
        AuditKind::AccessDenied,
        AuditKind::UserCreated,
        AuditKind::UserChanged,
        AuditKind::UserDeleted,
        AuditKind::BucketCreated,
        AuditKind::BucketDropped,
        AuditKind::BucketFlushed,
    ];

    /// The kind as written in the log (`auth_failure`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            AuditKind::AuthSuccess => "auth_success",
            AuditKind::AuthFailure => "auth_failure",
            AuditKind::AccessDenied => "access_denied",
            AuditKind::UserCreated => "user_created",
            AuditKind::UserChanged => "user_changed",
            AuditKind::UserDeleted => "user_deleted",
            AuditKind::BucketCreated => "bucket_created",
            AuditKind::BucketDropped => "bucket_dropped",
            AuditKind::BucketFlushed => "bucket_flushed",
        }
    }
}

/// Where a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interface {
    /// The memcached binary protocol port (plain or TLS).
    Kv,
    /// The management REST API.
    Rest,
    /// The Prometheus endpoint.
    Metrics,
}

impl Interface {
    /// The interface as written in the log (`kv`, `rest`, `metrics`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Interface::Kv => "kv",
            Interface::Rest => "rest",
            Interface::Metrics => "metrics",
        }
    }
}

/// One event. Build it with [`AuditEvent::new`] and the setters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent<'a> {
    /// What happened.
    pub kind: AuditKind,
    /// Where the request came in.
    pub interface: Interface,
    /// The user who acted (or tried to), if known.
    pub user: Option<&'a str>,
    /// The client's address, if known.
    pub source: Option<SocketAddr>,
    /// The bucket concerned, if any.
    pub bucket: Option<&'a str>,
    /// What was asked or refused: the missing privilege, the mechanism, the user changed.
    pub detail: &'a str,
}

impl<'a> AuditEvent<'a> {
    /// An event of `kind` through `interface`, with nothing else known yet.
    #[must_use]
    pub fn new(kind: AuditKind, interface: Interface) -> Self {
        Self {
            kind,
            interface,
            user: None,
            source: None,
            bucket: None,
            detail: "",
        }
    }

    /// Sets the user.
    #[must_use]
    pub fn user(mut self, user: &'a str) -> Self {
        self.user = Some(user);
        self
    }

    /// Sets the user when one is known (`None` leaves it unset).
    #[must_use]
    pub fn user_opt(mut self, user: Option<&'a str>) -> Self {
        self.user = user.or(self.user);
        self
    }

    /// Sets the client's address.
    #[must_use]
    pub fn source(mut self, source: SocketAddr) -> Self {
        self.source = Some(source);
        self
    }

    /// Sets the bucket.
    #[must_use]
    pub fn bucket(mut self, bucket: &'a str) -> Self {
        self.bucket = Some(bucket);
        self
    }

    /// Sets the bucket when there is one (`None` leaves it unset).
    #[must_use]
    pub fn bucket_opt(mut self, bucket: Option<&'a str>) -> Self {
        self.bucket = bucket.or(self.bucket);
        self
    }

    /// Sets the detail.
    #[must_use]
    pub fn detail(mut self, detail: &'a str) -> Self {
        self.detail = detail;
        self
    }

    /// The event as one JSON line (without the newline), stamped `unix_time`.
    #[must_use]
    pub fn to_json_line(&self, unix_time: Duration) -> String {
        serde_json::json!({
            "timestamp": rfc3339(unix_time),
            "kind": self.kind.name(),
            "interface": self.interface.name(),
            "user": self.user,
            "source": self.source.map(|s| s.to_string()),
            "bucket": self.bucket,
            "detail": self.detail,
        })
        .to_string()
    }
}

/// A source of wall-clock time since the Unix epoch (the server passes its `Clock`).
pub type WallClock = Arc<dyn Fn() -> Duration + Send + Sync>;

struct Sink {
    /// The file; the mutex serialises lines.
    out: Mutex<BufWriter<File>>,
    /// Stamps each event.
    clock: WallClock,
    /// Lines that could not be written (counted, never returned).
    errors: AtomicU64,
}

/// The audit log: cheap to clone (an `Arc`), shared by every thread that records.
#[derive(Clone, Default)]
pub struct AuditLog {
    sink: Option<Arc<Sink>>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("enabled", &self.is_enabled())
            .finish_non_exhaustive()
    }
}

impl AuditLog {
    /// A log that records nothing (the default: auditing is off).
    #[must_use]
    pub fn disabled() -> Self {
        Self { sink: None }
    }

    /// Opens `path` for appending (created with mode 0600 if missing); events are
    /// stamped with `clock`.
    ///
    /// # Errors
    /// The file cannot be opened.
    pub fn open(path: &Path, clock: WallClock) -> std::io::Result<Self> {
        let mut options = OpenOptions::new();
        options.create(true).append(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let file = options.open(path)?;
        Ok(Self {
            sink: Some(Arc::new(Sink {
                out: Mutex::new(BufWriter::new(file)),
                clock,
                errors: AtomicU64::new(0),
            })),
        })
    }

    /// Whether events are recorded (callers may skip building an event when not).
    #[must_use]
    #[inline]
    pub fn is_enabled(&self) -> bool {
        self.sink.is_some()
    }

    /// Appends `event` as one line and flushes it to the file. A write error is counted,
    /// not returned.
    pub fn record(&self, event: &AuditEvent<'_>) {
        let Some(sink) = &self.sink else {
            return;
        };
        let mut line = event.to_json_line((sink.clock)());
        line.push('\n');
        let mut out = sink.out.lock().unwrap_or_else(PoisonError::into_inner);
        if out
            .write_all(line.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            sink.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How many events could not be written.
    #[must_use]
    pub fn write_errors(&self) -> u64 {
        self.sink
            .as_ref()
            .map_or(0, |s| s.errors.load(Ordering::Relaxed))
    }
}

/// `unix_time` as RFC 3339 in UTC with milliseconds: `2026-11-28T00:19:41.123Z`.
#[must_use]
pub fn rfc3339(unix_time: Duration) -> String {
    let secs = unix_time.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut s = String::with_capacity(24);
    let _ = write!(
        s,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        unix_time.subsec_millis()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(Duration::from_millis(951_782_400_123)),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            rfc3339(Duration::from_secs(1_795_220_381)),
            "2026-11-21T00:19:41.000Z"
        );
    }

    #[test]
    fn events_are_json_lines_appended_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, "earlier\n").unwrap();
        let log = AuditLog::open(&path, Arc::new(|| Duration::from_secs(86_400))).unwrap();
        assert!(log.is_enabled());
        let from: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let clone = log.clone();
        clone.record(
            &AuditEvent::new(AuditKind::AccessDenied, Interface::Rest)
                .user("reader")
                .source(from)
                .bucket("travel")
                .detail("cluster.bucket[travel]!flush"),
        );
        log.record(&AuditEvent::new(AuditKind::AuthFailure, Interface::Kv).detail("PLAIN"));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "earlier", "appended, not truncated");
        let v: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(v["timestamp"], "1970-01-02T00:00:00.000Z");
        assert_eq!(v["kind"], "access_denied");
        assert_eq!(v["interface"], "rest");
        assert_eq!(v["user"], "reader");
        assert_eq!(v["source"], "127.0.0.1:4242");
        assert_eq!(v["bucket"], "travel");
        assert_eq!(v["detail"], "cluster.bucket[travel]!flush");
        let v: serde_json::Value = serde_json::from_str(lines[2]).unwrap();
        assert_eq!(v["kind"], "auth_failure");
        assert!(v["user"].is_null() && v["bucket"].is_null());
        assert_eq!(log.write_errors(), 0);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let fresh = dir.path().join("new.log");
            let _ = AuditLog::open(&fresh, Arc::new(|| Duration::ZERO)).unwrap();
            let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn the_optional_setters_set_only_what_is_known() {
        let e = AuditEvent::new(AuditKind::AccessDenied, Interface::Rest)
            .user_opt(Some("reader"))
            .bucket_opt(None);
        assert_eq!((e.user, e.bucket), (Some("reader"), None));
        let e = e.user_opt(None).bucket_opt(Some("travel"));
        assert_eq!((e.user, e.bucket), (Some("reader"), Some("travel")));
    }

    #[test]
    fn a_disabled_log_records_nothing() {
        let log = AuditLog::disabled();
        assert!(!log.is_enabled());
        log.record(&AuditEvent::new(AuditKind::UserDeleted, Interface::Rest));
        assert_eq!(log.write_errors(), 0);
        assert!(AuditKind::ALL.iter().all(|k| !k.name().is_empty()));
    }
}
