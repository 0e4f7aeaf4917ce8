//! The users file on disk: atomic save, permissions, round trip, no password inside.

#![expect(clippy::unwrap_used, reason = "test code panics on failure")]

use std::sync::Arc;

use epkv_auth::{AuthError, BucketAccess, Roles, SaslServer, SaslStep, UserStore};

const PASSWORDS: [(&str, &str); 3] = [
    ("Administrator", "correct horse battery staple"),
    ("app", "hunter2hunter2"),
    ("reader", "Tr0ub4dor&3"),
];

fn store() -> UserStore {
    let mut s = UserStore::empty().with_iterations(256);
    s.insert_with_password(PASSWORDS[0].0, PASSWORDS[0].1, BucketAccess::All)
        .unwrap();
    s.insert_with_password(
        PASSWORDS[1].0,
        PASSWORDS[1].1,
        BucketAccess::only(["travel", "beer"]),
    )
    .unwrap();
    s.insert_with_password(
        PASSWORDS[2].0,
        PASSWORDS[2].1,
        BucketAccess::only(["travel"]),
    )
    .unwrap();
    s
}

#[test]
fn save_load_round_trip_authenticates_the_same_users() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    store().save(&path).unwrap();
    let loaded = Arc::new(UserStore::load(&path).unwrap());
    assert_eq!(loaded.len(), 3);
    assert!(loaded.may_access("app", "beer") && !loaded.may_access("app", "default"));
    assert!(loaded.may_access("Administrator", "anything"));
    assert_eq!(
        loaded.roles("reader"),
        Some(&Roles::from(BucketAccess::only(["travel"])))
    );
    for (user, password) in PASSWORDS {
        let (_, step) = SaslServer::start(
            loaded.clone(),
            b"PLAIN",
            format!("\0{user}\0{password}").as_bytes(),
        )
        .unwrap();
        assert_eq!(
            step,
            SaslStep::Done {
                user: user.into(),
                server_final: vec![]
            }
        );
    }
    // Saving the loaded store again gives the same file: nothing is re-salted on load.
    let again = dir.path().join("again.toml");
    loaded.save(&again).unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        std::fs::read_to_string(&again).unwrap()
    );
}

#[test]
fn file_contains_no_password() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    store().save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    for (_, password) in PASSWORDS {
        assert!(!text.contains(password), "password in the users file");
        assert!(
            !text.contains(&password[..6]),
            "password prefix in the users file"
        );
    }
    assert!(text.contains("stored_key") && text.contains("[[users]]"));
    assert!(!text.to_lowercase().contains("password ="));
}

#[cfg(unix)]
#[test]
fn save_writes_mode_0600_and_replaces_a_readable_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    std::fs::write(&path, "# old\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    store().save(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // No temporary file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("users.toml")]);
    assert_eq!(UserStore::load(&path).unwrap().len(), 3);
}

#[test]
fn save_into_a_missing_directory_fails_and_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("users.toml");
    let err = store().save(&path).unwrap_err();
    assert!(matches!(err, AuthError::Io { .. }));
    assert!(err.to_string().contains("no-such-dir"), "{err}");
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.toml");
    let err = UserStore::load(&missing).unwrap_err();
    assert!(matches!(err, AuthError::Io { .. }));
    assert!(err.to_string().contains("missing.toml"));

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[[users]]\nname = \"eve\"\nbuckets = [\"*\"]\npassword = \"x\"\n",
    )
    .unwrap();
    let err = UserStore::load(&bad).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("bad.toml") && text.contains("<ud>eve</ud>") && text.contains("password"),
        "{text}"
    );
    assert!(!err.is_auth_failure());
}

#[test]
fn removed_users_are_gone_after_a_save() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("users.toml");
    let mut s = store();
    assert!(s.remove("app"));
    s.save(&path).unwrap();
    let loaded = UserStore::load(&path).unwrap();
    assert!(!loaded.contains("app") && loaded.contains("reader"));
    assert_eq!(
        loaded.user_names().collect::<Vec<_>>(),
        vec!["Administrator", "reader"]
    );
}
