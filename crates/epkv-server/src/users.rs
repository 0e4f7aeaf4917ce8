//! Users: the ones the server starts with (`--users-file`, `--admin-user`) and the
//! `epkv-server user` subcommands that write the users file.

use crate::settings::Settings;
use anyhow::{Context, Result, bail};
use epkv_auth::{BucketAccess, Roles, UserStore};
use std::path::PathBuf;

/// `epkv-server user ...`: edit a users file.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum UserCommand {
    /// Add a user, or replace one of the same name (the file is created if missing)
    Add {
        /// The users file to edit
        #[arg(long, value_name = "FILE")]
        users_file: PathBuf,
        /// The user name
        #[arg(long)]
        name: String,
        /// The password (stored only as salted SCRAM verifiers); also EPKV_USER_PASSWORD
        #[arg(long, env = "EPKV_USER_PASSWORD", hide_env_values = true)]
        password: String,
        /// The user's roles, as Couchbase writes them (docs/auth.md), comma separated:
        /// `admin`, `data_reader[travel]`, `data_writer[travel:inventory]`, ...
        #[arg(
            long,
            value_name = "LIST",
            required_unless_present = "buckets",
            conflicts_with = "buckets"
        )]
        roles: Option<String>,
        /// The older form: buckets the user has full access to (`bucket_full_access` on
        /// each), comma separated, or `*` for the `admin` role
        #[arg(long, value_name = "LIST")]
        buckets: Option<String>,
    },
    /// Remove a user
    Remove {
        /// The users file to edit
        #[arg(long, value_name = "FILE")]
        users_file: PathBuf,
        /// The user name
        #[arg(long)]
        name: String,
    },
}

/// Parses `*` or `a,b,c`.
fn parse_access(list: &str) -> BucketAccess {
    if list.trim() == "*" {
        BucketAccess::All
    } else {
        BucketAccess::only(
            list.split(',')
                .map(str::trim)
                .filter(|b| !b.is_empty())
                .map(str::to_owned),
        )
    }
}

/// Runs a `user` subcommand.
pub(crate) fn run(cmd: UserCommand) -> Result<()> {
    match cmd {
        UserCommand::Add {
            users_file,
            name,
            password,
            roles,
            buckets,
        } => {
            // clap takes exactly one of the two.
            let roles = match (roles, buckets) {
                (Some(r), None) => Roles::parse_list(&r).context("invalid --roles")?,
                (None, Some(b)) => Roles::from(parse_access(&b)),
                _ => bail!("give either --roles or the older --buckets"),
            };
            let mut store = if users_file.exists() {
                UserStore::load(&users_file)?
            } else {
                UserStore::empty()
            };
            if password.is_empty() {
                bail!("the password must not be empty");
            }
            let granted = roles.to_string();
            store.insert_with_password(&name, &password, roles)?;
            store.save(&users_file)?;
            println!(
                "user {name:?} saved in {} with roles {granted}",
                users_file.display()
            );
        }
        UserCommand::Remove { users_file, name } => {
            let mut store = UserStore::load(&users_file)?;
            if !store.remove(&name) {
                bail!("no user {name:?} in {}", users_file.display());
            }
            store.save(&users_file)?;
            println!("user {name:?} removed from {}", users_file.display());
        }
    }
    Ok(())
}

/// The users the server starts with.
pub(crate) struct StartUsers {
    /// The users file's users (without the admin user): what the REST API edits and saves.
    pub(crate) saved: UserStore,
    /// Every user: the file's plus the admin user.
    pub(crate) live: UserStore,
    /// Where REST changes are saved: `--users-file` if set, else `DATA_DIR/users.toml`
    /// when the server persists, else nowhere (they last until exit).
    pub(crate) path: Option<PathBuf>,
    /// The admin user's name, if one is set.
    pub(crate) admin: Option<String>,
}

/// The users file name in the data directory, used when `--users-file` is not set.
pub(crate) const DATA_DIR_USERS_FILE: &str = "users.toml";

/// The users the server starts with: the users file (`--users-file`, or the one the REST
/// API keeps in the data directory), if there is one, plus the admin user, if one is set
/// (it replaces a file user of the same name).
pub(crate) fn configured_users(s: &Settings) -> Result<StartUsers> {
    let path = if !s.users_file.as_os_str().is_empty() {
        Some(s.users_file.clone())
    } else if s.persistence {
        Some(s.data_dir.join(DATA_DIR_USERS_FILE))
    } else {
        None
    };
    let saved = match &path {
        Some(p) if !s.users_file.as_os_str().is_empty() || p.exists() => {
            UserStore::load(p).context("cannot load the users file")?
        }
        _ => UserStore::empty(),
    };
    let mut live = saved.clone();
    let password = s.admin_password.expose();
    let admin = match (s.admin_user.is_empty(), password.is_empty()) {
        (true, true) => None,
        (false, false) => {
            live.insert_with_password(&s.admin_user, password, BucketAccess::All)
                .context("invalid admin-user")?;
            Some(s.admin_user.clone())
        }
        (false, true) => bail!("admin-user is set but admin-password is not"),
        (true, false) => bail!("admin-password is set but admin-user is not"),
    };
    warn_narrower_roles(&saved);
    Ok(StartUsers {
        saved,
        live,
        path,
        admin,
    })
}

/// The users whose roles grant less than the older model gave them (every role on a
/// bucket was full access to it), with their roles.
pub(crate) fn narrower_users(store: &UserStore) -> Vec<(String, String)> {
    store
        .user_names()
        .filter_map(|n| {
            store
                .roles(n)
                .filter(|r| r.narrower_than_bucket_lists())
                .map(|r| (n.to_owned(), r.to_string()))
        })
        .collect()
}

/// Logs once, at start, each user of the users file whose roles now grant less than
/// before privileges were checked, so operators notice.
fn warn_narrower_roles(store: &UserStore) {
    for (name, roles) in narrower_users(store) {
        tracing::warn!(
            user = %format_args!("<ud>{name}</ud>"),
            %roles,
            "this user's roles now grant only their privileges (docs/auth.md); before, any \
             role on a bucket gave full access to it. Grant bucket_full_access[BUCKET] or \
             data_backup[BUCKET] where full access is meant"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_lists_parse() {
        assert_eq!(parse_access("*"), BucketAccess::All);
        assert_eq!(
            parse_access("a, b,"),
            BucketAccess::only(["a".to_owned(), "b".to_owned()])
        );
        assert!(!Roles::from(parse_access("a")).may_use_bucket("default"));
    }

    #[test]
    fn users_whose_roles_are_narrower_than_full_access_are_found() {
        let mut store = UserStore::empty().with_iterations(1);
        let roles = |l| Roles::parse_list(l).unwrap();
        store
            .insert_with_password("old", "pw", BucketAccess::only(["a"]))
            .unwrap();
        store
            .insert_with_password("boss", "pw", BucketAccess::All)
            .unwrap();
        store
            .insert_with_password("reader", "pw", roles("data_reader[a]"))
            .unwrap();
        store
            .insert_with_password("ops", "pw", roles("bucket_admin[a],ro_admin"))
            .unwrap();
        let found = narrower_users(&store);
        assert_eq!(
            found,
            [
                ("ops".to_owned(), "ro_admin,bucket_admin[a]".to_owned()),
                ("reader".to_owned(), "data_reader[a]".to_owned())
            ]
        );
    }

    #[test]
    fn user_add_takes_roles_or_the_older_buckets() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: UserCommand,
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("users.toml");
        let f = file.to_str().unwrap();
        let add = |extra: &[&str]| {
            let mut args = vec!["x", "add", "--users-file", f, "--password", "pw"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args).map(|c| c.cmd)
        };
        run(add(&[
            "--name",
            "r",
            "--roles",
            "data_reader[travel],data_writer[travel:inventory]",
        ])
        .unwrap())
        .unwrap();
        run(add(&["--name", "b", "--buckets", "travel"]).unwrap()).unwrap();
        run(add(&["--name", "a", "--buckets", "*"]).unwrap()).unwrap();
        let store = UserStore::load(&file).unwrap();
        assert_eq!(
            store.roles("r").unwrap().to_string(),
            "data_reader[travel],data_writer[travel:inventory]"
        );
        assert_eq!(
            store.roles("b").unwrap().to_string(),
            "bucket_full_access[travel]"
        );
        assert_eq!(store.roles("a").unwrap(), &Roles::admin());
        assert!(add(&["--name", "x"]).is_err(), "roles or buckets needed");
        assert!(add(&["--name", "x", "--roles", "admin", "--buckets", "*"]).is_err());
        assert!(run(add(&["--name", "x", "--roles", "root"]).unwrap()).is_err());
    }
}
