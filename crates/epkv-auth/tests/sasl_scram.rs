//! SCRAM and PLAIN through the public API, against a SCRAM client written here from
//! RFC 5802 (its own PBKDF2 over `hmac`, not the `pbkdf2` crate the server uses).

#![expect(clippy::unwrap_used, reason = "test code panics on failure")]

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use epkv_auth::{AuthError, BucketAccess, MECHANISMS, SaslServer, SaslStep, UserStore};
use hmac::{Hmac, Mac};
use sha2::Digest;

/// The hash primitives of one SCRAM variant, as plain functions.
#[derive(Clone, Copy)]
struct Suite {
    mechanism: &'static str,
    hash: fn(&[u8]) -> Vec<u8>,
    hmac: fn(&[u8], &[u8]) -> Vec<u8>,
}

fn hmac_with<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <M as hmac::digest::KeyInit>::new_from_slice(key).unwrap();
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

const SHA512: Suite = Suite {
    mechanism: "SCRAM-SHA512",
    hash: |d| sha2::Sha512::digest(d).to_vec(),
    hmac: hmac_with::<Hmac<sha2::Sha512>>,
};
const SHA256: Suite = Suite {
    mechanism: "SCRAM-SHA256",
    hash: |d| sha2::Sha256::digest(d).to_vec(),
    hmac: hmac_with::<Hmac<sha2::Sha256>>,
};
const SHA1: Suite = Suite {
    mechanism: "SCRAM-SHA1",
    hash: |d| sha1::Sha1::digest(d).to_vec(),
    hmac: hmac_with::<Hmac<sha1::Sha1>>,
};

/// RFC 5802 `Hi()`: PBKDF2 with one output block, written out.
fn hi(s: Suite, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
    let mut block = salt.to_vec();
    block.extend_from_slice(&1_u32.to_be_bytes());
    let mut u = (s.hmac)(password, &block);
    let mut out = u.clone();
    for _ in 1..iterations {
        u = (s.hmac)(password, &u);
        out.iter_mut().zip(&u).for_each(|(o, x)| *o ^= x);
    }
    out
}

fn escape(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

/// Runs a whole SCRAM exchange as a client would; returns the final server answer and
/// whether the client accepted the server's signature.
fn scram_login(
    users: &Arc<UserStore>,
    s: Suite,
    user: &str,
    password: &str,
    client_nonce: &str,
) -> Result<(String, bool), AuthError> {
    let gs2 = "n,,";
    let bare = format!("n={},r={client_nonce}", escape(user));
    let (mut server, step) = SaslServer::start(
        users.clone(),
        s.mechanism.as_bytes(),
        format!("{gs2}{bare}").as_bytes(),
    )?;
    let SaslStep::Continue(server_first) = step else {
        panic!("scram must continue after the first message")
    };
    let server_first = String::from_utf8(server_first).unwrap();
    let mut nonce = None;
    let mut salt = None;
    let mut iterations = None;
    for attr in server_first.split(',') {
        let (k, v) = attr.split_at(2);
        match k {
            "r=" => nonce = Some(v.to_owned()),
            "s=" => salt = Some(B64.decode(v).unwrap()),
            "i=" => iterations = Some(v.parse::<u32>().unwrap()),
            _ => panic!("unexpected attribute {attr}"),
        }
    }
    let (nonce, salt, iterations) = (nonce.unwrap(), salt.unwrap(), iterations.unwrap());
    assert!(nonce.starts_with(client_nonce) && nonce.len() > client_nonce.len());

    let salted = hi(s, password.as_bytes(), &salt, iterations);
    let client_key = (s.hmac)(&salted, b"Client Key");
    let stored_key = (s.hash)(&client_key);
    let without_proof = format!("c={},r={nonce}", B64.encode(gs2));
    let auth_message = format!("{bare},{server_first},{without_proof}");
    let signature = (s.hmac)(&stored_key, auth_message.as_bytes());
    let proof: Vec<u8> = client_key
        .iter()
        .zip(&signature)
        .map(|(a, b)| a ^ b)
        .collect();
    let step = server.step(format!("{without_proof},p={}", B64.encode(proof)).as_bytes())?;
    let SaslStep::Done {
        user: who,
        server_final,
    } = step
    else {
        panic!("scram must be done after the final message")
    };
    assert_eq!(who, user);
    let server_key = (s.hmac)(&salted, b"Server Key");
    let expected = format!(
        "v={}",
        B64.encode((s.hmac)(&server_key, auth_message.as_bytes()))
    );
    let server_final = String::from_utf8(server_final).unwrap();
    let verified = server_final == expected;
    Ok((server_final, verified))
}

fn store() -> Arc<UserStore> {
    let mut s = UserStore::empty().with_iterations(500);
    s.insert_with_password("Administrator", "password", BucketAccess::All)
        .unwrap();
    s.insert_with_password("we,ird=name", "päss wörd", BucketAccess::only(["b"]))
        .unwrap();
    Arc::new(s)
}

#[test]
fn shared_types_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<UserStore>();
    check::<SaslServer>();
    check::<AuthError>();
    check::<SaslStep>();
}

#[test]
fn list_mechs_names_every_mechanism_strongest_first() {
    assert_eq!(MECHANISMS, "SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1 PLAIN");
}

#[test]
fn scram_round_trips_with_an_independent_client_for_every_hash() {
    let users = store();
    for suite in [SHA512, SHA256, SHA1] {
        let (_, verified) = scram_login(
            &users,
            suite,
            "Administrator",
            "password",
            "fyko+d2lbbFgONRv9qkxdawL",
        )
        .unwrap();
        assert!(
            verified,
            "{}: server signature must verify",
            suite.mechanism
        );
    }
}

#[test]
fn scram_accepts_opaque_nonces_and_escaped_names() {
    let users = store();
    for nonce in [
        "x",
        "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
        "!~\"#$&'()*+-./:;<=>?@[\\]^_`{|}",
        "0xffffff95 0xffffff8e 0x5d 0x7f",
        &"n".repeat(300),
    ] {
        let (_, verified) = scram_login(&users, SHA512, "we,ird=name", "päss wörd", nonce).unwrap();
        assert!(verified, "nonce {nonce:?}");
    }
}

#[test]
fn scram_wrong_password_fails_with_the_user_named() {
    let users = store();
    let err = scram_login(&users, SHA512, "Administrator", "Password", "abc").unwrap_err();
    assert!(matches!(&err, AuthError::Failed { user: Some(u) } if u == "Administrator"));
    assert_eq!(err.user(), Some("Administrator"));
    assert_eq!(
        err.to_string(),
        "authentication failed for user <ud>Administrator</ud>"
    );
    assert!(err.is_auth_failure());
    let err = scram_login(&users, SHA256, "nobody", "password", "abc").unwrap_err();
    assert!(matches!(&err, AuthError::Failed { user: Some(u) } if u == "nobody"));
}

#[test]
fn server_nonces_differ_between_attempts() {
    let users = store();
    let first = |u: &Arc<UserStore>| match SaslServer::start(
        u.clone(),
        b"SCRAM-SHA512",
        b"n,,n=Administrator,r=abc",
    )
    .unwrap()
    .1
    {
        SaslStep::Continue(c) => c,
        SaslStep::Done { .. } => panic!("expected a challenge"),
    };
    assert_ne!(first(&users), first(&users));
}

#[test]
fn plain_succeeds_and_fails() {
    let users = store();
    let ok = |data: &[u8]| SaslServer::start(users.clone(), b"PLAIN", data);
    assert_eq!(
        ok(b"\0Administrator\0password").unwrap().1,
        SaslStep::Done {
            user: "Administrator".into(),
            server_final: Vec::new()
        }
    );
    assert!(ok(b"Administrator\0Administrator\0password").is_ok());
    assert!(ok("\0we,ird=name\0päss wörd".as_bytes()).is_ok());
    for bad in [
        &b"\0Administrator\0passwor"[..],
        b"\0Administrator\0",
        b"\0ghost\0password",
        b"other\0Administrator\0password",
    ] {
        let err = ok(bad).unwrap_err();
        assert!(err.is_auth_failure(), "{err:?}");
        assert!(matches!(err, AuthError::Failed { user: Some(_) }));
    }
    for malformed in [
        &b""[..],
        b"\0Administrator",
        b"\0\0password",
        b"\0Adm\0pw\0x",
    ] {
        let err = ok(malformed).unwrap_err();
        assert!(matches!(err, AuthError::Malformed(_)), "{err:?}");
        assert!(!err.is_auth_failure());
    }
}

#[test]
fn errors_never_contain_the_password() {
    const SECRET: &str = "Sup3rS3cr3tPa55";
    let mut s = UserStore::empty().with_iterations(64);
    s.insert_with_password("alice", SECRET, BucketAccess::All)
        .unwrap();
    let users = Arc::new(s);
    let mut errors = Vec::new();
    let plain = |d: String| SaslServer::start(users.clone(), b"PLAIN", d.as_bytes());
    errors.push(plain(format!("\0alice\0{SECRET}x")).unwrap_err());
    errors.push(plain(format!("\0bob\0{SECRET}")).unwrap_err());
    errors.push(plain(format!("x\0alice\0{SECRET}")).unwrap_err());
    errors.push(plain(format!("\0alice\0{SECRET}\0{SECRET}")).unwrap_err());
    errors.push(plain(SECRET.to_owned()).unwrap_err());
    errors
        .push(SaslServer::start(users.clone(), SECRET.as_bytes(), SECRET.as_bytes()).unwrap_err());
    errors.push(scram_login(&users, SHA512, "alice", &format!("{SECRET}!"), "n").unwrap_err());
    assert!(errors.iter().any(|e| matches!(e, AuthError::Failed { .. })));
    for e in &errors {
        for text in [e.to_string(), format!("{e:?}")] {
            assert!(!text.contains(SECRET), "secret leaked in {text}");
            assert!(!text.contains("Sup3r"), "secret leaked in {text}");
        }
    }
    // The store's and server's Debug output show no key material either.
    let dbg = format!("{users:?}");
    assert!(dbg.contains("alice") && !dbg.contains("stored_key"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: 64,
        ..proptest::prelude::ProptestConfig::default()
    })]

    /// Any acceptable user name, any password and any comma-free nonce authenticate with
    /// every mechanism, and the server signature always verifies.
    #[test]
    fn any_user_password_and_nonce_round_trip(
        name in "[a-zA-Z0-9,=@. _-]{1,24}",
        password in "\\PC{0,24}",
        nonce in "[^,]{1,40}",
        wrong in "\\PC{1,8}",
    ) {
        let mut s = UserStore::empty().with_iterations(2);
        s.insert_with_password(&name, &password, BucketAccess::All).unwrap();
        let users = Arc::new(s);
        for suite in [SHA512, SHA256, SHA1] {
            let (_, verified) = scram_login(&users, suite, &name, &password, &nonce).unwrap();
            proptest::prop_assert!(verified);
            let bad = format!("{password}{wrong}");
            let failed = matches!(
                scram_login(&users, suite, &name, &bad, &nonce),
                Err(AuthError::Failed { .. })
            );
            proptest::prop_assert!(failed);
        }
        let plain = format!("\0{name}\0{password}");
        proptest::prop_assert!(SaslServer::start(users, b"PLAIN", plain.as_bytes()).is_ok());
    }
}
