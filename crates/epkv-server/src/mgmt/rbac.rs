//! Users through `/settings/rbac/users`: Couchbase roles mapped onto epkv's bucket-level
//! access, and the users file that keeps users created this way across restarts.
//!
//! Roles are Couchbase's (`epkv_auth::rbac`, docs/auth.md): `admin`,
//! `bucket_full_access[travel]`, `data_reader[travel:inventory:airline]`, ...; an unknown
//! or malformed role is refused with 400. Reading a user back gives the roles it was
//! given, each with the bucket, scope and collection it names.

use epkv_auth::rbac::{Qualifier, Target};
use epkv_auth::{Roles, UserDirectory, UserStore};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::path::PathBuf;

/// Shortest password accepted (Couchbase's rule).
pub(crate) const MIN_PASSWORD_LEN: usize = 6;

/// Parses a `roles` field (`admin,data_reader[travel]`): Couchbase's roles and
/// qualifiers ([`Roles::parse_list`]).
///
/// # Errors
/// A message naming the first role that cannot be granted.
pub(crate) fn parse_roles(roles: &str) -> Result<Roles, String> {
    let roles = Roles::parse_list(roles).map_err(|e| e.to_string())?;
    for r in roles.roles() {
        if let Target::Name(b) = &r.bucket
            && !epkv_frontend::is_valid_bucket_name(b)
        {
            return Err(format!("malformed role {r}: invalid bucket name"));
        }
    }
    Ok(roles)
}

/// The roles a user has, as Couchbase reports them: each with its bucket, scope and
/// collection where it names them (`*` where it names any).
fn roles_json(roles: &Roles) -> Value {
    let origins = json!([{ "type": "user" }]);
    roles
        .roles()
        .iter()
        .map(|r| {
            let mut o = json!({ "role": r.name(), "origins": origins });
            match r.def().qualifier {
                Qualifier::None => {}
                Qualifier::Bucket => o["bucket_name"] = json!(r.bucket.to_string()),
                Qualifier::Collection => {
                    o["bucket_name"] = json!(r.bucket.to_string());
                    o["scope_name"] = json!(r.scope.to_string());
                    o["collection_name"] = json!(r.collection.to_string());
                }
            }
            o
        })
        .collect()
}

/// One user as `GET /settings/rbac/users/local/NAME` reports it.
pub(crate) fn user_json(name: &str, roles: &Roles) -> Value {
    json!({
        "id": name,
        "domain": "local",
        "name": "",
        "roles": roles_json(roles),
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
        roles: Roles,
    ) -> Result<(), UserChangeError> {
        let mut saved = self.saved.lock();
        let one = self.prepare_with(saved.iterations(), name, password, roles, Some(&saved))?;
        let mut next = saved.clone();
        next.copy_user_from(&one, name);
        self.save(&next)?;
        *saved = next;
        let _ = self.directory.update(|live| -> Result<(), ()> {
            live.copy_user_from(&saved, name);
            Ok(())
        });
        tracing::info!(user = %format_args!("<ud>{name}</ud>"), "user saved through the management API");
        Ok(())
    }

    /// Checks a PUT of user `name` and derives the user it makes, as [`Self::upsert`]
    /// would, against `existing` (a store holding the user as it is now, if it is
    /// anywhere): returns a store holding only the new user. Derives the password's
    /// verifiers: call it off the serving thread.
    ///
    /// # Errors
    /// [`UserChangeError::Invalid`].
    pub(crate) fn prepare_upsert(
        &self,
        name: &str,
        password: Option<&str>,
        roles: Roles,
        existing: Option<&UserStore>,
    ) -> Result<UserStore, UserChangeError> {
        let iterations = self.saved.lock().iterations();
        self.prepare_with(iterations, name, password, roles, existing)
    }

    fn prepare_with(
        &self,
        iterations: u32,
        name: &str,
        password: Option<&str>,
        roles: Roles,
        existing: Option<&UserStore>,
    ) -> Result<UserStore, UserChangeError> {
        self.refuse_admin(name)?;
        if let Some(p) = password
            && p.chars().count() < MIN_PASSWORD_LEN
        {
            return Err(UserChangeError::Invalid(
                "password",
                format!("The password must be at least {MIN_PASSWORD_LEN} characters long."),
            ));
        }
        let mut one = UserStore::empty().with_iterations(iterations);
        if let Some(e) = existing {
            one.copy_user_from(e, name);
        }
        match password {
            Some(p) => one.insert_with_password(name, p, roles),
            None => match one.set_roles(name, roles) {
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
        Ok(one)
    }

    /// Checks a DELETE of user `name` (the admin user cannot be removed).
    ///
    /// # Errors
    /// [`UserChangeError::Invalid`].
    pub(crate) fn check_remove(&self, name: &str) -> Result<(), UserChangeError> {
        self.refuse_admin(name)
    }

    /// The users file's users (without the admin user).
    pub(crate) fn saved(&self) -> UserStore {
        self.saved.lock().clone()
    }

    /// Applies user `name` as decided elsewhere (the cluster's metadata store): copied
    /// from `from`, saved, and live unless it is this server's admin user (whose
    /// settings win on this server).
    ///
    /// # Errors
    /// [`UserChangeError::Failed`] when the users file cannot be written.
    pub(crate) fn apply_put(&self, name: &str, from: &UserStore) -> Result<(), UserChangeError> {
        let mut saved = self.saved.lock();
        let mut next = saved.clone();
        next.copy_user_from(from, name);
        self.save(&next)?;
        *saved = next;
        if self.admin.as_deref() != Some(name) {
            let _ = self.directory.update(|live| -> Result<(), ()> {
                live.copy_user_from(&saved, name);
                Ok(())
            });
        }
        Ok(())
    }

    /// Removes user `name` as decided elsewhere; returns whether it was here.
    ///
    /// # Errors
    /// [`UserChangeError::Failed`] when the users file cannot be written.
    pub(crate) fn apply_remove(&self, name: &str) -> Result<bool, UserChangeError> {
        let mut saved = self.saved.lock();
        let mut next = saved.clone();
        if !next.remove(name) {
            return Ok(false);
        }
        self.save(&next)?;
        *saved = next;
        if self.admin.as_deref() != Some(name) {
            let _ = self.directory.update(|live| -> Result<(), ()> {
                live.remove(name);
                Ok(())
            });
        }
        Ok(true)
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

    fn roles(list: &str) -> Roles {
        Roles::parse_list(list).unwrap()
    }

    #[test]
    fn roles_parse_as_couchbase_writes_them() {
        assert_eq!(parse_roles("admin").unwrap(), Roles::admin());
        assert_eq!(
            parse_roles("data_reader[a], bucket_full_access[b]")
                .unwrap()
                .to_strings(),
            ["bucket_full_access[b]", "data_reader[a]"]
        );
        assert!(parse_roles("").unwrap().is_empty());
        for ok in [
            "ro_admin",
            "data_reader[*]",
            "data_reader[a:s:c]",
            "data_reader[a:s]",
        ] {
            assert!(parse_roles(ok).is_ok(), "{ok}");
        }
        assert!(parse_roles("data_reader[a").is_err());
        assert!(
            parse_roles("data_reader").is_err(),
            "a bucket role needs a bucket"
        );
        assert!(parse_roles("data_reader[a/b]").is_err());
        assert!(parse_roles("root").is_err());
    }

    #[test]
    fn users_read_back_with_the_roles_they_were_given() {
        let u = user_json("app", &roles("bucket_full_access[t]"));
        assert_eq!(u["id"], "app");
        assert_eq!(u["domain"], "local");
        assert_eq!(u["roles"][0]["role"], "bucket_full_access");
        assert_eq!(u["roles"][0]["bucket_name"], "t");
        assert_eq!(user_json("a", &Roles::admin())["roles"][0]["role"], "admin");
        let r = user_json("r", &roles("data_reader[t:s:c]"));
        assert_eq!(r["roles"][0]["role"], "data_reader");
        assert_eq!(r["roles"][0]["scope_name"], "s");
        assert_eq!(r["roles"][0]["collection_name"], "c");
        let any = user_json("r", &roles("data_reader[t]"));
        assert_eq!(any["roles"][0]["scope_name"], "*");
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
            .upsert("app", Some("secret1"), roles("bucket_full_access[t]"))
            .unwrap();
        assert!(live.current().may_access("app", "t"));
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("app") && !text.contains("secret1"));
        admin.upsert("app", None, Roles::admin()).unwrap();
        assert!(
            live.current().may_access("app", "x"),
            "access changed, password kept"
        );
        assert!(matches!(
            admin.upsert("new", None, Roles::admin()),
            Err(UserChangeError::Invalid("password", _))
        ));
        assert!(matches!(
            admin.upsert("x", Some("short"), Roles::admin()),
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
