//! Runs arbitrary client messages through the server side of SASL: the first byte picks
//! the mechanism name (PLAIN, the three SCRAMs, or raw bytes as the name), the rest is
//! split at the first 0xff into SASL_AUTH's and SASL_STEP's data. A panic anywhere is a
//! bug; so is a success for anything but the one user's own password.
#![no_main]

use epkv_auth::{BucketAccess, SaslServer, SaslStep, UserStore};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

const PASSWORD: &str = "pencil";

fn users() -> Arc<UserStore> {
    static USERS: OnceLock<Arc<UserStore>> = OnceLock::new();
    Arc::clone(USERS.get_or_init(|| {
        let mut u = UserStore::empty().with_iterations(2);
        u.insert_with_password("user", PASSWORD, BucketAccess::All).expect("valid user");
        Arc::new(u)
    }))
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let (auth, step) = match rest.iter().position(|&b| b == 0xff) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let (mechanism, auth): (&[u8], &[u8]) = match pick % 5 {
        0 => (b"PLAIN", auth),
        1 => (b"SCRAM-SHA1", auth),
        2 => (b"SCRAM-SHA256", auth),
        3 => (b"SCRAM-SHA512", auth),
        _ => (auth, step.unwrap_or_default()),
    };
    let Ok((mut server, first)) = SaslServer::start(users(), mechanism, auth) else {
        return;
    };
    match first {
        SaslStep::Done { user, .. } => {
            // Only PLAIN finishes in one step, and only with the right password.
            assert_eq!(user, "user");
            assert!(auth.ends_with(PASSWORD.as_bytes()), "PLAIN accepted a wrong password");
        }
        SaslStep::Continue(_) => {
            if let Some(step) = step {
                // The fuzzer cannot know the server's random nonce, so a final message
                // that verifies would mean the proof check is broken.
                assert!(server.step(step).is_err(), "SCRAM accepted a forged proof");
                assert!(server.is_finished());
            }
        }
    }
});
