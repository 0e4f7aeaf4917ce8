//! Users through `/settings/rbac/users`: Couchbase roles mapped onto epkv's bucket-level
//! access, and the users file that keeps users created this way across restarts.
//!
//! epkv's access model is per bucket (see docs/auth.md): a user may use every bucket
//! (`*`, which also makes them an administrator of the REST API) or a list of buckets.
//! Couchbase roles map onto it:
//! - `admin` is every bucket;
//! - a data role on one bucket (`bucket_full_access[travel]`, `data_reader[travel]`, ...
//!   see [`BUCKET_ROLES`]) grants that bucket; scope and collection qualifiers are
//!   refused (there are no collections yet), and so is `[*]` (it would make the user an
//!   administrator);
//! - any other role is refused with 400.
//!
//! Reading a user back gives `admin`, or `bucket_full_access[B]` for each bucket it may
//! use: what it can do, not the words it was created with.

use epkv_auth::{BucketAccess, UserDirectory, UserStore};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::path::PathBuf;

/// Couchbase roles on one bucket that epkv grants as access to that bucket.
pub(crate) const BUCKET_ROLES: &[&str] = &[
    "bucket_admin",
    "bucket_full_access",
    "data_reader",
    "data_writer",
    "data_dcp_reader",
    "data_backup",
    "data_monitoring",
];

/// Shortest password accepted (Couchbase's rule).
pub(crate) const MIN_PASSWORD_LEN: usize = 6;

/// Parses a `roles` field (`admin,data_reader[travel]`).
///
/// # Errors
/// A message naming the first role that cannot be granted.
pub(crate) fn parse_roles(roles: &str) -> Result<BucketAccess, String> {
    let mut buckets = std::collections::BTreeSet::new();
    for role in roles.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let (name, target) = match role.split_once('[') {
            Some((n, rest)) => {
                let t = rest
                    .strip_suffix(']')
                    .ok_or_else(|| format!("malformed role {role:?}"))?;
                (n, Some(t))
            }
            None => (role, None),
        };
        match (name, target) {
            ("admin", None) => return Ok(BucketAccess::All),
            (n, Some(t)) if BUCKET_ROLES.contains(&n) => {
                if t == "*" {
                    return Err(format!(
                        "role {role:?} is not supported: epkv grants every bucket only with \
                         the admin role"
                    ));
                }
                if t.contains(':') {
                    return Err(format!(
                        "role {role:?} is not supported: scopes and collections do not exist yet"
                    ));
                }
                if !epkv_frontend::is_valid_bucket_name(t) {
                    return Err(format!("malformed role {role:?}: invalid bucket name"));
                }
                buckets.insert(t.to_owned());
            }
            _ => {
                return Err(format!(
                    "role {role:?} is not supported: use admin or one of {} on a bucket",
                    BUCKET_ROLES.join(", ")
                ));
            }
        }
    }
    Ok(BucketAccess::Only(buckets))
}

/// The roles a user's access is reported as.
fn roles_json(access: &BucketAccess) -> Value {
    let origins = json!([{ "type": "user" }]);
    match access {
        BucketAccess::All => json!([{ "role": "admin", "origins": origins }]),
        BucketAccess::Only(set) => set
            .iter()
            .map(|b| json!({ "role": "bucket_full_access", "bucket_name": b, "origins": origins }))
            .collect(),
    }
}

/// One user as `GET /settings/rbac/users/local/NAME` reports it.
pub(crate) fn user_json(name: &str, access: &BucketAccess) -> Value {
    json!({
        "id": name,
        "domain": "local",
        "name": "",
        "roles": roles_json(access),
        "groups": [],
        "external_groups": [],
    })
}

/// Why a user change was refused.
#[derive(Debug)]
pub(crate) enum UserChangeError {
    /// No such user.
    NotFound,
    /// A field is not acceptable: (field, message).
    Invalid(&'static str, String),
    /// The users file cannot be written (nothing changed).
    Failed(String),
}

/// Users changed through the REST API, and where they are kept.
pub(crate) struct UserAdmin {
    /// The live users (shared with the KV and HTTP ports).
    directory: UserDirectory,
    /// The users file's users (without the settings' admin user), as saved; the lock
    /// serialises changes.
    saved: Mutex<UserStore>,
    /// The users file, or `None` when changes last only until exit.
    path: Option<PathBuf>,
    /// The `--admin-user` name, which the REST API may not change.
    admin: Option<String>,
}

impl UserAdmin {
    /// An admin over `directory` whose file users are `saved`, written to `path`.
    pub(crate) fn new(
        directory: UserDirectory,
        saved: UserStore,
        path: Option<PathBuf>,
        admin: Option<String>,
    ) -> Self {
        Self {
            directory,
            saved: Mutex::new(saved),
            path,
            admin,
        }
    }

    /// The live users.
    pub(crate) fn current(&self) -> std::sync::Arc<UserStore> {
        self.directory.current()
    }

    fn refuse_admin(&self, name: &str) -> Result<(), UserChangeError> {
        if self.admin.as_deref() == Some(name) {
            return Err(UserChangeError::Invalid(
                "name",
                format!(
                    "user {name:?} is the server's admin-user and is changed only in its settings"
                ),
            ));
        }
        Ok(())
    }

    /// Creates or replaces a user (PUT). A new user needs a password; an existing one
    /// keeps theirs when none is given. Derives the password's verifiers (milliseconds
    /// of PBKDF2): call it off the serving thread.
    ///
    /// # Errors
    /// [`UserChangeError`].
    pub(crate) fn upsert(
        &self,
        name: &str,
        password: Option<&str>,
        access: BucketAccess,
    ) -> Result<(), UserChangeError> {
        self.refuse_admin(name)?;
        if let Some(p) = password
            && p.chars().count() < MIN_PASSWORD_LEN
        {
            return Err(UserChangeError::Invalid(
                "password",
                format!("The password must be at least {MIN_PASSWORD_LEN} characters long."),
            ));
        }
        let mut saved = self.saved.lock();
        let mut next = saved.clone();
        match password {
            Some(p) => next.insert_with_password(name, p, access),
            None => match next.set_access(name, access) {
                Ok(true) => Ok(()),
                Ok(false) => {
                    return Err(UserChangeError::Invalid(
                        "password",
                        "a password is required to create a user".into(),
                    ));
                }
                Err(e) => Err(e),
            },
        }
        .map_err(|e| UserChangeError::Invalid("name", e.to_string()))?;
        self.save(&next)?;
        *saved = next;
        let _ = self.directory.update(|live| -> Result<(), ()> {
            live.copy_user_from(&saved, name);
            Ok(())
        });
        tracing::info!(user = %format_args!("<ud>{name}</ud>"), "user saved through the management API");
        Ok(())
    }

    /// Removes a user (DELETE).
    ///
    /// # Errors
    /// [`UserChangeError`].
    pub(crate) fn remove(&self, name: &str) -> Result<(), UserChangeError> {
        self.refuse_admin(name)?;
        let mut saved = self.saved.lock();
        let mut next = saved.clone();
        if !next.remove(name) {
            return Err(UserChangeError::NotFound);
        }
        self.save(&next)?;
        *saved = next;
        let _ = self.directory.update(|live| -> Result<(), ()> {
            live.remove(name);
            Ok(())
        });
        tracing::info!(user = %format_args!("<ud>{name}</ud>"), "user removed through the management API");
        Ok(())
    }

    fn save(&self, store: &UserStore) -> Result<(), UserChangeError> {
        match &self.path {
            None => Ok(()),
            Some(p) => store
                .save(p)
                .map_err(|e| UserChangeError::Failed(format!("cannot save the users: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_map_onto_bucket_access() {
        assert_eq!(parse_roles("admin").unwrap(), BucketAccess::All);
        assert_eq!(
            parse_roles("data_reader[a], bucket_full_access[b]").unwrap(),
            BucketAccess::only(["a", "b"])
        );
        assert_eq!(
            parse_roles("").unwrap(),
            BucketAccess::only::<_, String>([])
        );
        assert!(parse_roles("ro_admin").is_err());
        assert!(parse_roles("data_reader[*]").is_err());
        assert!(parse_roles("data_reader[a:s:c]").is_err());
        assert!(parse_roles("data_reader[a").is_err());
        assert!(
            parse_roles("data_reader").is_err(),
            "a bucket role needs a bucket"
        );
        assert!(parse_roles("data_reader[a/b]").is_err());
    }

    #[test]
    fn users_read_back_as_admin_or_full_access_per_bucket() {
        let u = user_json("app", &BucketAccess::only(["t"]));
        assert_eq!(u["id"], "app");
        assert_eq!(u["domain"], "local");
        assert_eq!(u["roles"][0]["role"], "bucket_full_access");
        assert_eq!(u["roles"][0]["bucket_name"], "t");
        assert_eq!(
            user_json("a", &BucketAccess::All)["roles"][0]["role"],
            "admin"
        );
    }

    #[test]
    fn changes_reach_the_live_users_and_the_file_but_never_the_admin() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users.toml");
        let live = UserDirectory::new(UserStore::empty().with_iterations(1));
        let admin = UserAdmin::new(
            live.clone(),
            UserStore::empty().with_iterations(1),
            Some(path.clone()),
            Some("Administrator".into()),
        );
        admin
            .upsert("app", Some("secret1"), BucketAccess::only(["t"]))
            .unwrap();
        assert!(live.current().may_access("app", "t"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("app") && !text.contains("secret1"));
        admin.upsert("app", None, BucketAccess::All).unwrap();
        assert!(
            live.current().may_access("app", "x"),
            "access changed, password kept"
        );
        assert!(matches!(
            admin.upsert("new", None, BucketAccess::All),
            Err(UserChangeError::Invalid("password", _))
        ));
        assert!(matches!(
            admin.upsert("x", Some("short"), BucketAccess::All),
            Err(UserChangeError::Invalid("password", _))
        ));
        assert!(matches!(
            admin.remove("Administrator"),
            Err(UserChangeError::Invalid("name", _))
        ));
        admin.remove("app").unwrap();
        assert!(!live.current().contains("app"));
        assert!(matches!(
            admin.remove("app"),
            Err(UserChangeError::NotFound)
        ));
        assert!(UserStore::load(&path).unwrap().is_empty());
    }
}
