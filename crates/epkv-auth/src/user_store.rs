//! The user database: names, SCRAM verifiers and bucket access, and its TOML file.
//!
//! File format (see docs/auth.md): an optional `version = 1` and one `[[users]]` table per
//! user with `name`, `buckets` (`["*"]` or a list of bucket names) and a `hashes` table
//! keyed by mechanism name (`SCRAM-SHA512`...) whose entries hold `salt`, `iterations`,
//! `stored_key` and `server_key`, binary values in standard base64. Saving writes a
//! temporary file (mode 0600), fsyncs it, renames it over the old one and fsyncs the
//! directory, so a crash leaves either the old or the new file.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use rand::RngCore;
use serde::Serialize;

use crate::credential::ScramCredential;
use crate::error::{AuthError, Result};
use crate::mechanism::ScramHash;
use crate::rbac::{Roles, Target};

/// PBKDF2 iterations for new credentials unless [`UserStore::with_iterations`] says
/// otherwise. 15000 is the SCRAM iteration count Couchbase Server uses by default.
pub const DEFAULT_ITERATIONS: u32 = 15_000;

/// Highest iteration count accepted from a users file: a hostile or corrupt file must not
/// turn every login into minutes of PBKDF2 (PLAIN and the server both pay it per attempt).
pub const MAX_ITERATIONS: u32 = 10_000_000;

/// Longest user name accepted, in bytes.
pub const MAX_USER_NAME_LEN: usize = 128;

/// Longest bucket name accepted, in bytes (Couchbase's bucket-name limit).
pub const MAX_BUCKET_NAME_LEN: usize = 100;

/// The users-file format version written by [`UserStore::save`].
const FILE_VERSION: i64 = 1;

/// Which buckets a user may select.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketAccess {
    /// Every bucket, present and future (`buckets = ["*"]` in the file).
    All,
    /// Exactly these buckets (possibly none).
    Only(BTreeSet<String>),
}

impl BucketAccess {
    /// Returns access to exactly the named buckets.
    pub fn only<I, S>(buckets: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::Only(buckets.into_iter().map(Into::into).collect())
    }
}

impl From<BucketAccess> for Roles {
    /// Every bucket is `admin`; a list of buckets is `bucket_full_access` on each: what a
    /// bucket list granted before roles existed.
    fn from(access: BucketAccess) -> Roles {
        match access {
            BucketAccess::All => Roles::admin(),
            BucketAccess::Only(set) => Roles::full_access(set),
        }
    }
}

/// One user: a SCRAM verifier per hash function and their roles.
#[derive(Debug, Clone, PartialEq, Eq)]
struct User {
    /// At least one entry for a user loaded or inserted through the public API.
    credentials: BTreeMap<ScramHash, ScramCredential>,
    roles: Roles,
}

/// Checks the bucket names of `roles` as [`validate_bucket_name`] does.
fn validate_roles(roles: &Roles) -> std::result::Result<(), &'static str> {
    roles.roles().iter().try_for_each(|r| match &r.bucket {
        Target::Any => Ok(()),
        Target::Name(b) => validate_bucket_name(b),
    })
}

/// The set of users epkv authenticates, with their salted and hashed credentials and
/// bucket access. Never holds a password.
///
/// Cheap to share behind an `Arc`; it is immutable while shared (mutation needs `&mut`,
/// so a reload builds a new store and swaps the `Arc`).
#[derive(Clone)]
pub struct UserStore {
    users: BTreeMap<String, User>,
    /// PBKDF2 iterations for credentials created by [`UserStore::insert_with_password`].
    iterations: u32,
    /// Random per-store key for the fake salts shown for unknown users, so a SCRAM
    /// exchange does not reveal whether a user exists (the salt is stable per name).
    fake_salt_key: [u8; 32],
}

impl std::fmt::Debug for UserStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserStore")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl Default for UserStore {
    fn default() -> Self {
        Self::empty()
    }
}

impl UserStore {
    /// Returns a store with no users, creating credentials with [`DEFAULT_ITERATIONS`].
    #[must_use]
    pub fn empty() -> Self {
        let mut fake_salt_key = [0_u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut fake_salt_key);
        Self {
            users: BTreeMap::new(),
            iterations: DEFAULT_ITERATIONS,
            fake_salt_key,
        }
    }

    /// Returns this store set to create new credentials with `iterations` PBKDF2 rounds
    /// (at least 1, at most [`MAX_ITERATIONS`]). Existing credentials keep their count.
    #[must_use]
    pub fn with_iterations(mut self, iterations: u32) -> Self {
        self.iterations = iterations.clamp(1, MAX_ITERATIONS);
        self
    }

    /// Returns the PBKDF2 iteration count used for new credentials.
    #[must_use]
    pub fn iterations(&self) -> u32 {
        self.iterations
    }

    /// Reads a users file.
    ///
    /// # Errors
    /// [`AuthError::Io`] if it cannot be read, [`AuthError::Parse`] (naming the file, user
    /// and field) if it is not a valid users file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::parse_named(&text, &path.display().to_string())
    }

    /// Parses the text of a users file.
    ///
    /// # Errors
    /// [`AuthError::Parse`] (file `<string>`) if it is not a valid users file.
    pub fn parse_toml(text: &str) -> Result<Self> {
        Self::parse_named(text, "<string>")
    }

    fn parse_named(text: &str, file: &str) -> Result<Self> {
        let mut store = Self::empty();
        parse::parse_into(&mut store, text, file)?;
        Ok(store)
    }

    /// Adds a user, or replaces one of the same name, with fresh random salts and a
    /// credential for every SCRAM hash derived from `password`.
    ///
    /// # Errors
    /// [`AuthError::InvalidUser`] if the name is empty, too long or holds control
    /// characters, or a bucket name is not acceptable.
    pub fn insert_with_password(
        &mut self,
        name: &str,
        password: &str,
        roles: impl Into<Roles>,
    ) -> Result<()> {
        validate_user_name(name).map_err(AuthError::InvalidUser)?;
        let roles = roles.into();
        validate_roles(&roles).map_err(AuthError::InvalidUser)?;
        let credentials = ScramHash::STRONGEST_FIRST
            .iter()
            .map(|&h| {
                (
                    h,
                    ScramCredential::from_password(h, password.as_bytes(), self.iterations),
                )
            })
            .collect();
        self.users
            .insert(name.to_owned(), User { credentials, roles });
        Ok(())
    }

    /// Adds or replaces a user with one credential for `hash` derived with a given salt.
    /// Tests use it to reproduce the RFC example exchanges.
    #[cfg(test)]
    pub(crate) fn insert_with_salt(
        &mut self,
        name: &str,
        password: &str,
        access: impl Into<Roles>,
        hash: ScramHash,
        salt: Vec<u8>,
        iterations: u32,
    ) {
        let cred = ScramCredential::with_salt(hash, password.as_bytes(), salt, iterations);
        self.users.insert(
            name.to_owned(),
            User {
                credentials: BTreeMap::from([(hash, cred)]),
                roles: access.into(),
            },
        );
    }

    /// Copies user `name` (credentials and access) from `other`, replacing one of the same
    /// name here; returns whether `other` had the user. Nothing is derived again.
    pub fn copy_user_from(&mut self, other: &UserStore, name: &str) -> bool {
        match other.users.get(name) {
            Some(u) => {
                self.users.insert(name.to_owned(), u.clone());
                true
            }
            None => false,
        }
    }

    /// Changes the roles of an existing user, keeping their credentials; returns whether
    /// the user exists.
    ///
    /// # Errors
    /// [`AuthError::InvalidUser`] if a bucket name is not acceptable.
    pub fn set_roles(&mut self, name: &str, roles: impl Into<Roles>) -> Result<bool> {
        let roles = roles.into();
        validate_roles(&roles).map_err(AuthError::InvalidUser)?;
        Ok(match self.users.get_mut(name) {
            Some(u) => {
                u.roles = roles;
                true
            }
            None => false,
        })
    }

    /// Removes a user; returns whether it existed.
    pub fn remove(&mut self, name: &str) -> bool {
        self.users.remove(name).is_some()
    }

    /// Returns true when `user` exists and may use `bucket`.
    #[must_use]
    pub fn may_access(&self, user: &str, bucket: &str) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.roles.may_use_bucket(bucket))
    }

    /// Returns the roles of `user`, if the user exists.
    #[must_use]
    pub fn roles(&self, user: &str) -> Option<&Roles> {
        self.users.get(user).map(|u| &u.roles)
    }

    /// Returns whether `user` exists.
    #[must_use]
    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// Returns true when there are no users.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Returns the number of users.
    #[must_use]
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Returns the user names in sorted order.
    pub fn user_names(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    /// Returns the user's credential for `hash`, if any.
    pub(crate) fn credential(&self, user: &str, hash: ScramHash) -> Option<&ScramCredential> {
        self.users.get(user)?.credentials.get(&hash)
    }

    /// Returns the user's credential with the strongest hash.
    pub(crate) fn strongest_credential(&self, user: &str) -> Option<(ScramHash, &ScramCredential)> {
        let u = self.users.get(user)?;
        ScramHash::STRONGEST_FIRST
            .iter()
            .find_map(|h| u.credentials.get(h).map(|c| (*h, c)))
    }

    /// Returns the salt and iteration count shown to a client that names an unknown user:
    /// stable for a name within this store, indistinguishable from a real random salt.
    pub(crate) fn fake_salt(&self, user: &str, hash: ScramHash) -> (Vec<u8>, u32) {
        (
            hash.hmac(&self.fake_salt_key, user.as_bytes()),
            self.iterations,
        )
    }

    /// Returns the users file text for this store.
    ///
    /// # Errors
    /// [`AuthError::Serialize`] if TOML serialisation fails.
    pub fn to_toml(&self) -> Result<String> {
        #[derive(Serialize)]
        struct FileHash {
            salt: String,
            iterations: u32,
            stored_key: String,
            server_key: String,
        }
        #[derive(Serialize)]
        struct FileUser<'a> {
            name: &'a str,
            roles: Vec<String>,
            hashes: BTreeMap<&'static str, FileHash>,
        }
        #[derive(Serialize)]
        struct FileDoc<'a> {
            version: i64,
            users: Vec<FileUser<'a>>,
        }
        let doc = FileDoc {
            version: FILE_VERSION,
            users: self
                .users
                .iter()
                .map(|(name, u)| FileUser {
                    name,
                    roles: u.roles.to_strings(),
                    hashes: u
                        .credentials
                        .iter()
                        .map(|(h, c)| {
                            (
                                h.mechanism_name(),
                                FileHash {
                                    salt: B64.encode(&c.salt),
                                    iterations: c.iterations,
                                    stored_key: B64.encode(&c.stored_key),
                                    server_key: B64.encode(&c.server_key),
                                },
                            )
                        })
                        .collect(),
                })
                .collect(),
        };
        let body = toml::to_string(&doc).map_err(|e| AuthError::Serialize(e.to_string()))?;
        Ok(format!(
            "# epkv users file: salted SCRAM verifiers (RFC 5802), never passwords.\n\
             # Managed by epkv; see docs/auth.md.\n\n{body}"
        ))
    }

    /// Writes the users file atomically: a temporary file in the same directory created
    /// with mode 0600, fsynced, renamed over `path`, then the directory fsynced.
    ///
    /// # Errors
    /// [`AuthError::Io`] naming the file that could not be written.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_file_atomically(path, self.to_toml()?.as_bytes())
    }
}

/// Writes `contents` to `path` atomically: a temporary file in the same directory created
/// with mode 0600, fsynced, renamed over `path`, then the directory fsynced, so a crash
/// leaves either the old file or the new one. The users file and the server's other
/// small state files are written this way.
///
/// # Errors
/// [`AuthError::Io`] naming the file that could not be written.
pub fn write_file_atomically(path: &Path, contents: &[u8]) -> Result<()> {
    let io_err = |p: &Path| {
        let p = p.to_owned();
        move |source| AuthError::Io { path: p, source }
    };
    let file_name = path.file_name().ok_or_else(|| AuthError::Io {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"),
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);

    // A leftover from a crash may have other permissions; start from nothing so the
    // mode below applies.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&tmp)(e)),
        _ => {}
    }
    let write = || -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(&tmp)(e));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err(path)(e));
    }
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))?;
    Ok(())
}

/// Checks a user name: 1..=[`MAX_USER_NAME_LEN`] bytes, no control characters.
fn validate_user_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        return Err("user name is empty");
    }
    if name.len() > MAX_USER_NAME_LEN {
        return Err("user name is longer than 128 bytes");
    }
    if name.chars().any(char::is_control) {
        return Err("user name contains a control character");
    }
    Ok(())
}

/// Checks a bucket name: 1..=[`MAX_BUCKET_NAME_LEN`] bytes, no control characters, not `*`.
fn validate_bucket_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        return Err("bucket name is empty");
    }
    if name.len() > MAX_BUCKET_NAME_LEN {
        return Err("bucket name is longer than 100 bytes");
    }
    if name == "*" {
        return Err("\"*\" (every bucket) must be the only entry of buckets");
    }
    if name.chars().any(char::is_control) {
        return Err("bucket name contains a control character");
    }
    Ok(())
}

/// Parsing of the users file, by hand over a `toml::Table` so every error can name the
/// user and field it is about.
mod parse {
    use super::*;

    /// Builds a parse error.
    struct Ctx<'a> {
        file: &'a str,
        user: Option<String>,
    }

    impl Ctx<'_> {
        fn err(&self, field: Option<&str>, message: impl Into<String>) -> AuthError {
            AuthError::Parse {
                file: self.file.to_owned(),
                user: self.user.clone(),
                field: field.map(str::to_owned),
                message: message.into(),
            }
        }
    }

    pub(super) fn parse_into(store: &mut UserStore, text: &str, file: &str) -> Result<()> {
        let mut ctx = Ctx { file, user: None };
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ctx.err(None, e.to_string().trim_end().to_owned()))?;
        for (key, value) in &table {
            match key.as_str() {
                "version" => {
                    if value.as_integer() != Some(FILE_VERSION) {
                        return Err(ctx.err(Some("version"), "unsupported version (expected 1)"));
                    }
                }
                "users" => {}
                other => {
                    return Err(ctx.err(Some(other), "unknown top-level key"));
                }
            }
        }
        let Some(users) = table.get("users") else {
            return Ok(());
        };
        let users = users
            .as_array()
            .ok_or_else(|| ctx.err(Some("users"), "expected an array of [[users]] tables"))?;
        for (index, entry) in users.iter().enumerate() {
            ctx.user = Some(format!("#{}", index + 1));
            let entry = entry
                .as_table()
                .ok_or_else(|| ctx.err(None, "expected a [[users]] table"))?;
            let name = entry
                .get("name")
                .ok_or_else(|| ctx.err(Some("name"), "missing"))?
                .as_str()
                .ok_or_else(|| ctx.err(Some("name"), "expected a string"))?;
            validate_user_name(name).map_err(|m| ctx.err(Some("name"), m))?;
            ctx.user = Some(name.to_owned());
            for key in entry.keys() {
                if !matches!(key.as_str(), "name" | "roles" | "buckets" | "hashes") {
                    return Err(ctx.err(Some(key), "unknown field"));
                }
            }
            let roles = match (entry.get("roles"), entry.get("buckets")) {
                (Some(_), Some(_)) => {
                    return Err(ctx.err(
                        Some("buckets"),
                        "give roles or (the older form) buckets, not both",
                    ));
                }
                (Some(roles), None) => parse_roles(&ctx, roles)?,
                (None, buckets) => Roles::from(parse_buckets(&ctx, buckets)?),
            };
            let credentials = parse_hashes(&ctx, entry.get("hashes"))?;
            if store.users.contains_key(name) {
                return Err(ctx.err(Some("name"), "duplicate user"));
            }
            store
                .users
                .insert(name.to_owned(), User { credentials, roles });
        }
        Ok(())
    }

    fn parse_roles(ctx: &Ctx<'_>, value: &toml::Value) -> Result<Roles> {
        let f = Some("roles");
        let list = value
            .as_array()
            .ok_or_else(|| ctx.err(f, "expected an array of roles"))?;
        let mut names = Vec::with_capacity(list.len());
        for v in list {
            names.push(
                v.as_str()
                    .ok_or_else(|| ctx.err(f, "expected an array of strings"))?,
            );
        }
        let roles = Roles::from_strings(names).map_err(|e| ctx.err(f, e.to_string()))?;
        validate_roles(&roles).map_err(|m| ctx.err(f, m))?;
        Ok(roles)
    }

    fn parse_buckets(ctx: &Ctx<'_>, value: Option<&toml::Value>) -> Result<BucketAccess> {
        let f = Some("buckets");
        let list = value
            .ok_or_else(|| ctx.err(f, "missing (use [\"*\"] for every bucket)"))?
            .as_array()
            .ok_or_else(|| ctx.err(f, "expected an array of bucket names"))?;
        let mut names = Vec::with_capacity(list.len());
        for v in list {
            names.push(
                v.as_str()
                    .ok_or_else(|| ctx.err(f, "expected an array of strings"))?,
            );
        }
        if names == ["*"] {
            return Ok(BucketAccess::All);
        }
        let mut set = BTreeSet::new();
        for n in names {
            validate_bucket_name(n).map_err(|m| ctx.err(f, m))?;
            set.insert(n.to_owned());
        }
        Ok(BucketAccess::Only(set))
    }

    fn parse_hashes(
        ctx: &Ctx<'_>,
        value: Option<&toml::Value>,
    ) -> Result<BTreeMap<ScramHash, ScramCredential>> {
        let hashes = value
            .ok_or_else(|| ctx.err(Some("hashes"), "missing"))?
            .as_table()
            .ok_or_else(|| ctx.err(Some("hashes"), "expected a table keyed by mechanism"))?;
        let mut out = BTreeMap::new();
        for (mech, entry) in hashes {
            let field = format!("hashes.{mech}");
            let hash = ScramHash::from_mechanism_name(mech).ok_or_else(|| {
                ctx.err(
                    Some(&field),
                    "unknown mechanism (expected SCRAM-SHA1, SCRAM-SHA256 or SCRAM-SHA512)",
                )
            })?;
            let entry = entry
                .as_table()
                .ok_or_else(|| ctx.err(Some(&field), "expected a table"))?;
            for key in entry.keys() {
                if !matches!(
                    key.as_str(),
                    "salt" | "iterations" | "stored_key" | "server_key"
                ) {
                    return Err(ctx.err(Some(&format!("{field}.{key}")), "unknown field"));
                }
            }
            let bytes = |k: &str, want_len: Option<usize>| -> Result<Vec<u8>> {
                let f = format!("{field}.{k}");
                let s = entry
                    .get(k)
                    .ok_or_else(|| ctx.err(Some(&f), "missing"))?
                    .as_str()
                    .ok_or_else(|| ctx.err(Some(&f), "expected a base64 string"))?;
                let b = B64
                    .decode(s)
                    .map_err(|_| ctx.err(Some(&f), "not valid base64"))?;
                match want_len {
                    Some(n) if b.len() != n => Err(ctx.err(
                        Some(&f),
                        format!("expected {n} bytes for {mech}, found {}", b.len()),
                    )),
                    None if b.is_empty() => Err(ctx.err(Some(&f), "empty")),
                    _ => Ok(b),
                }
            };
            let salt = bytes("salt", None)?;
            let stored_key = bytes("stored_key", Some(hash.output_len()))?;
            let server_key = bytes("server_key", Some(hash.output_len()))?;
            let it_field = format!("{field}.iterations");
            let iterations = entry
                .get("iterations")
                .ok_or_else(|| ctx.err(Some(&it_field), "missing"))?
                .as_integer()
                .ok_or_else(|| ctx.err(Some(&it_field), "expected an integer"))?;
            let iterations = u32::try_from(iterations)
                .ok()
                .filter(|i| (1..=MAX_ITERATIONS).contains(i))
                .ok_or_else(|| {
                    ctx.err(
                        Some(&it_field),
                        format!("must be between 1 and {MAX_ITERATIONS}"),
                    )
                })?;
            out.insert(
                hash,
                ScramCredential {
                    salt,
                    iterations,
                    stored_key,
                    server_key,
                },
            );
        }
        if out.is_empty() {
            return Err(ctx.err(
                Some("hashes"),
                "no credential (need at least one mechanism)",
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> UserStore {
        UserStore::empty().with_iterations(64)
    }

    #[test]
    fn access_rules_follow_bucket_lists() {
        let mut s = store();
        s.insert_with_password("admin", "pw", BucketAccess::All)
            .unwrap();
        s.insert_with_password("app", "pw", BucketAccess::only(["travel", "beer"]))
            .unwrap();
        s.insert_with_password("nobody", "pw", BucketAccess::only(Vec::<String>::new()))
            .unwrap();
        assert!(s.may_access("admin", "anything"));
        assert!(s.may_access("app", "travel"));
        assert!(s.may_access("app", "beer"));
        assert!(!s.may_access("app", "default"));
        assert!(!s.may_access("nobody", "default"));
        assert!(!s.may_access("ghost", "default"));
        assert!(s.contains("app") && !s.contains("ghost"));
        assert_eq!(s.len(), 3);
        assert!(s.remove("app"));
        assert!(!s.remove("app"));
        assert!(!s.may_access("app", "travel"));
    }

    #[test]
    fn insert_rejects_bad_names() {
        let mut s = store();
        assert!(matches!(
            s.insert_with_password("", "pw", BucketAccess::All),
            Err(AuthError::InvalidUser(_))
        ));
        assert!(matches!(
            s.insert_with_password("a\nb", "pw", BucketAccess::All),
            Err(AuthError::InvalidUser(_))
        ));
        assert!(matches!(
            s.insert_with_password("a", "pw", BucketAccess::only(["*"])),
            Err(AuthError::InvalidUser(_))
        ));
        assert!(s.is_empty());
    }

    #[test]
    fn insert_salts_every_hash_differently_and_replaces() {
        let mut s = store();
        s.insert_with_password("u", "pw", BucketAccess::All)
            .unwrap();
        let a = s.credential("u", ScramHash::Sha512).unwrap().clone();
        assert_eq!(a.salt.len(), 64);
        assert_eq!(a.iterations, 64);
        s.insert_with_password("u", "pw", BucketAccess::only(["b"]))
            .unwrap();
        let b = s.credential("u", ScramHash::Sha512).unwrap();
        assert_ne!(a.salt, b.salt, "a fresh salt on every insert");
        assert_ne!(a.stored_key, b.stored_key);
        assert!(!s.may_access("u", "x"));
        assert!(b.verify_password(ScramHash::Sha512, b"pw"));
        assert!(!b.verify_password(ScramHash::Sha512, b"pW"));
    }

    #[test]
    fn toml_round_trip_keeps_everything() {
        let mut s = store();
        s.insert_with_password("admin", "pw1", BucketAccess::All)
            .unwrap();
        s.insert_with_password("a,b=c", "pw2", BucketAccess::only(["x", "y"]))
            .unwrap();
        let text = s.to_toml().unwrap();
        let back = UserStore::parse_toml(&text).unwrap();
        assert_eq!(back.users, s.users);
        assert!(text.contains("SCRAM-SHA512") && text.contains("version = 1"));
    }

    fn err_of(text: &str) -> (Option<String>, Option<String>, String) {
        match UserStore::parse_toml(text) {
            Err(AuthError::Parse {
                user,
                field,
                message,
                ..
            }) => (user, field, message),
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    const GOOD_HASH: &str = r#"
[users.hashes.SCRAM-SHA1]
salt = "QSXCR+Q6sek8bf92"
iterations = 4096
stored_key = "6dlGYMOdZcOPutkcNY8U2g7vK9Y="
server_key = "D+CSWLOshSulAsxiupA+qs2/fTE="
"#;

    #[test]
    fn parse_accepts_a_hand_written_file() {
        let text = format!("[[users]]\nname = \"user\"\nbuckets = [\"*\"]\n{GOOD_HASH}");
        let s = UserStore::parse_toml(&text).unwrap();
        assert!(s.may_access("user", "default"));
        let c = s.credential("user", ScramHash::Sha1).unwrap();
        assert!(c.verify_password(ScramHash::Sha1, b"pencil"));
        assert!(UserStore::parse_toml("").unwrap().is_empty());
    }

    #[test]
    fn parse_errors_name_user_and_field() {
        let (u, f, m) = err_of("[[users]]\nbuckets = []\n");
        assert_eq!((u.as_deref(), f.as_deref()), (Some("#1"), Some("name")));
        assert_eq!(m, "missing");

        let (u, f, _) = err_of(&format!("[[users]]\nname = \"bob\"\n{GOOD_HASH}"));
        assert_eq!((u.as_deref(), f.as_deref()), (Some("bob"), Some("buckets")));

        let (u, f, _) = err_of("[[users]]\nname = \"bob\"\nbuckets = [\"*\"]\n");
        assert_eq!((u.as_deref(), f.as_deref()), (Some("bob"), Some("hashes")));

        let bad_iter = GOOD_HASH.replace("4096", "0");
        let (_, f, _) = err_of(&format!(
            "[[users]]\nname = \"bob\"\nbuckets = [\"*\"]\n{bad_iter}"
        ));
        assert_eq!(f.as_deref(), Some("hashes.SCRAM-SHA1.iterations"));

        let bad_key = GOOD_HASH.replace("6dlGYMOdZcOPutkcNY8U2g7vK9Y=", "AAAA");
        let (_, f, m) = err_of(&format!(
            "[[users]]\nname = \"bob\"\nbuckets = [\"*\"]\n{bad_key}"
        ));
        assert_eq!(f.as_deref(), Some("hashes.SCRAM-SHA1.stored_key"));
        assert!(m.contains("expected 20 bytes"), "{m}");

        let bad_b64 = GOOD_HASH.replace("QSXCR+Q6sek8bf92", "!!");
        let (_, f, _) = err_of(&format!(
            "[[users]]\nname = \"bob\"\nbuckets = [\"*\"]\n{bad_b64}"
        ));
        assert_eq!(f.as_deref(), Some("hashes.SCRAM-SHA1.salt"));

        let (_, f, _) = err_of(&format!(
            "[[users]]\nname = \"bob\"\nbuckets = [\"*\"]\npassword = \"x\"\n{GOOD_HASH}"
        ));
        assert_eq!(f.as_deref(), Some("password"));

        let (_, f, _) = err_of(&format!(
            "[[users]]\nname = \"bob\"\nbuckets = [\"*\", \"b\"]\n{GOOD_HASH}"
        ));
        assert_eq!(f.as_deref(), Some("buckets"));

        let two = format!(
            "[[users]]\nname = \"bob\"\nbuckets = []\n{GOOD_HASH}\n\
             [[users]]\nname = \"bob\"\nbuckets = []\n{GOOD_HASH}"
        );
        let (u, _, m) = err_of(&two);
        assert_eq!((u.as_deref(), m.as_str()), (Some("bob"), "duplicate user"));

        let (_, f, _) = err_of("version = 2\n");
        assert_eq!(f.as_deref(), Some("version"));
        let (_, _, m) = err_of("[[users]\n");
        assert!(!m.is_empty());
    }

    #[test]
    fn parse_error_display_names_file_user_and_field() {
        let e = UserStore::parse_toml("[[users]]\nname = \"bob\"\nbuckets = 3\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "users file <string>, user <ud>bob</ud>, field buckets: \
             expected an array of bucket names"
        );
        assert!(!e.is_auth_failure());
    }
}
