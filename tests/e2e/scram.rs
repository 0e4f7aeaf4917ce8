//! A SCRAM client (RFC 5802) for the tests, checking the server's signature as
//! libcouchbase does.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use epkv_client::Client;
use epkv_protocol::Status;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha512};

type HmacSha512 = Hmac<Sha512>;

fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut m = HmacSha512::new_from_slice(key).unwrap();
    m.update(msg);
    m.finalize().into_bytes().to_vec()
}

fn attr(msg: &str, name: char) -> &str {
    msg.split(',')
        .find_map(|p| p.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {name}= in {msg:?}"))
}

/// How a SCRAM-SHA512 exchange ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ScramOutcome {
    /// Authenticated, and the server proved it knows the password.
    Authenticated,
    /// The server refused with this status.
    Refused(Option<Status>),
}

/// Runs SCRAM-SHA512 for `user`/`password` with a client nonce full of characters a
/// server must treat as opaque (the cxx client's nonces contain spaces).
pub(crate) async fn scram_sha512(c: &mut Client, user: &str, password: &str) -> ScramOutcome {
    let nonce = "0xffffff95 0xffffff8e 0x5d;=:";
    let client_first_bare = format!("n={user},r={nonce}");
    let first = c
        .sasl_auth("SCRAM-SHA512", format!("n,,{client_first_bare}").as_bytes())
        .await
        .unwrap();
    if first.status() != Some(Status::AuthContinue) {
        return ScramOutcome::Refused(first.status());
    }
    let server_first = String::from_utf8(first.value.to_vec()).unwrap();
    let r = attr(&server_first, 'r');
    assert!(r.starts_with(nonce), "the server nonce extends ours: {r:?}");
    let salt = B64.decode(attr(&server_first, 's')).unwrap();
    let iterations: u32 = attr(&server_first, 'i').parse().unwrap();
    let mut salted = [0u8; 64];
    pbkdf2::pbkdf2_hmac::<Sha512>(password.as_bytes(), &salt, iterations, &mut salted);
    let client_key = hmac(&salted, b"Client Key");
    let stored_key = Sha512::digest(&client_key);
    let without_proof = format!("c=biws,r={r}");
    let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
    let signature = hmac(&stored_key, auth_message.as_bytes());
    let proof: Vec<u8> = client_key
        .iter()
        .zip(&signature)
        .map(|(a, b)| a ^ b)
        .collect();
    let last = c
        .sasl_step(
            "SCRAM-SHA512",
            format!("{without_proof},p={}", B64.encode(proof)).as_bytes(),
        )
        .await
        .unwrap();
    if !last.is_success() {
        return ScramOutcome::Refused(last.status());
    }
    let server_key = hmac(&salted, b"Server Key");
    let expected = B64.encode(hmac(&server_key, auth_message.as_bytes()));
    assert_eq!(
        String::from_utf8(last.value.to_vec()).unwrap(),
        format!("v={expected}"),
        "the server signature proves the server knows the verifier"
    );
    ScramOutcome::Authenticated
}
