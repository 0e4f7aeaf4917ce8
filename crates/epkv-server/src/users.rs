//! Users: the ones the server starts with (`--users-file`, `--admin-user`) and the
//! `epkv-server user` subcommands that write the users file.

use crate::settings::Settings;
use anyhow::{Context, Result, bail};
use epkv_auth::{BucketAccess, UserStore};
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
        /// The buckets the user may use: comma-separated names, or `*` for every bucket
        #[arg(long, value_name = "LIST")]
        buckets: String,
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
            buckets,
        } => {
            let mut store = if users_file.exists() {
                UserStore::load(&users_file)?
            } else {
                UserStore::empty()
            };
            if password.is_empty() {
                bail!("the password must not be empty");
            }
            store.insert_with_password(&name, &password, parse_access(&buckets))?;
            store.save(&users_file)?;
            println!("user {name:?} saved in {}", users_file.display());
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
    Ok(StartUsers {
        saved,
        live,
        path,
        admin,
    })
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
        assert!(!parse_access("a").allows("default"));
    }
}
