//! The server side of SCRAM (RFC 5802; SHA-256 as in RFC 7677, SHA-512 likewise), as
//! Couchbase clients speak it: no channel binding, `n,,` or `y,,` gs2 headers, the client
//! nonce an opaque string up to the next `,` (not only RFC 5802 `printable`: the C++ client
//! sends spaces).
//!
//! Message grammar handled (RFC 5802 §7), all attributes as `letter=value`:
//! - client-first: `gs2-cbind-flag "," [ "a=" saslname ] "," ["m=" ext ","] "n=" saslname
//!   "," "r=" c-nonce ["," extensions]`;
//! - server-first: `"r=" c-nonce s-nonce ",s=" base64(salt) ",i=" iterations`;
//! - client-final: `"c=" base64(gs2-header) ",r=" nonce ["," extensions] ",p=" base64(proof)`;
//! - server-final: `"v=" base64(ServerSignature)`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::credential::ScramCredential;
use crate::error::{AuthError, Result};
use crate::mechanism::ScramHash;
use crate::user_store::UserStore;

/// Random bytes in the server's part of the nonce (base64 makes it 32 characters).
const SERVER_NONCE_BYTES: usize = 24;

/// Returns a fresh server nonce part from the operating system's CSPRNG.
pub(crate) fn random_server_nonce() -> String {
    let mut raw = [0_u8; SERVER_NONCE_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    B64.encode(raw)
}

/// A SCRAM exchange after the server-first message, waiting for the client-final one.
pub(crate) struct ScramExchange {
    hash: ScramHash,
    user: String,
    /// The gs2 header exactly as the client sent it (`n,,`), which `c=` must repeat.
    gs2_header: Vec<u8>,
    client_first_bare: Vec<u8>,
    server_first: Vec<u8>,
    /// Client nonce followed by server nonce.
    nonce: Vec<u8>,
    /// `None` for an unknown user (or one without a credential for this hash): the
    /// exchange runs on a fake salt and always fails at the final message.
    credential: Option<ScramCredential>,
}

impl ScramExchange {
    /// Parses the client-first message and returns the exchange with the server-first
    /// message to send. `server_nonce` is appended to the client's nonce; it must be
    /// printable and hold no comma.
    pub(crate) fn start(
        users: &UserStore,
        hash: ScramHash,
        client_first: &[u8],
        server_nonce: &str,
    ) -> Result<(Self, Vec<u8>)> {
        let (flag, rest) = split_once(client_first, b',')
            .ok_or(AuthError::Malformed("scram client-first has no gs2 header"))?;
        match flag {
            b"n" | b"y" => {}
            f if f.starts_with(b"p=") => return Err(AuthError::ChannelBindingNotSupported),
            _ => {
                return Err(AuthError::Malformed(
                    "scram gs2 channel-binding flag is invalid",
                ));
            }
        }
        let (authzid, bare) = split_once(rest, b',')
            .ok_or(AuthError::Malformed("scram gs2 header is not terminated"))?;
        let authzid = match authzid {
            b"" => None,
            a => match a.strip_prefix(b"a=") {
                Some(name) => Some(decode_saslname(name)?),
                None => return Err(AuthError::Malformed("scram authzid must start with a=")),
            },
        };
        let gs2_len = client_first.len() - bare.len();
        let gs2_header = client_first[..gs2_len].to_vec();

        let mut attrs = bare.split(|&b| b == b',');
        let first = attrs.next().unwrap_or_default();
        if first.starts_with(b"m=") {
            return Err(AuthError::Malformed(
                "scram mandatory extension (m=) is not supported",
            ));
        }
        let user = match first.strip_prefix(b"n=") {
            Some(name) => decode_saslname(name)?,
            None => return Err(AuthError::Malformed("scram client-first has no n= user")),
        };
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix(b"r="))
            .ok_or(AuthError::Malformed("scram client-first has no r= nonce"))?;
        // Opaque up to the next ',' (the split guarantees there is none): the Couchbase C++
        // client (Python SDK) sends spaces and other characters RFC 5802's `printable`
        // excludes, so nothing else is checked.
        if client_nonce.is_empty() {
            return Err(AuthError::Malformed("scram client nonce is empty"));
        }
        for ext in attrs {
            check_extension(ext)?;
        }
        if authzid.as_deref().is_some_and(|a| a != user) {
            return Err(AuthError::Failed { user: Some(user) });
        }

        let credential = users.credential(&user, hash).cloned();
        let (salt, iterations) = match &credential {
            Some(c) => (c.salt.clone(), c.iterations),
            None => users.fake_salt(&user, hash),
        };
        let mut nonce = client_nonce.to_vec();
        nonce.extend_from_slice(server_nonce.as_bytes());

        let mut server_first = b"r=".to_vec();
        server_first.extend_from_slice(&nonce);
        server_first.extend_from_slice(b",s=");
        server_first.extend_from_slice(B64.encode(&salt).as_bytes());
        server_first.extend_from_slice(format!(",i={iterations}").as_bytes());

        let exchange = Self {
            hash,
            user,
            gs2_header,
            client_first_bare: bare.to_vec(),
            server_first: server_first.clone(),
            nonce,
            credential,
        };
        Ok((exchange, server_first))
    }

    /// Returns the user name the client presented.
    pub(crate) fn user(&self) -> &str {
        &self.user
    }

    /// Verifies the client-final message and returns the server-final one (`v=...`).
    pub(crate) fn finish(self, client_final: &[u8]) -> Result<Vec<u8>> {
        let proof_at = find_last(client_final, b",p=")
            .ok_or(AuthError::Malformed("scram client-final has no p= proof"))?;
        let without_proof = &client_final[..proof_at];
        let proof_b64 = &client_final[proof_at + 3..];
        let proof = B64
            .decode(proof_b64)
            .map_err(|_| AuthError::Malformed("scram proof is not base64"))?;

        let mut attrs = without_proof.split(|&b| b == b',');
        let cbind = attrs
            .next()
            .and_then(|a| a.strip_prefix(b"c="))
            .ok_or(AuthError::Malformed("scram client-final has no c= binding"))?;
        let cbind = B64
            .decode(cbind)
            .map_err(|_| AuthError::Malformed("scram channel binding is not base64"))?;
        let nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix(b"r="))
            .ok_or(AuthError::Malformed("scram client-final has no r= nonce"))?;
        for ext in attrs {
            check_extension(ext)?;
        }
        if proof.len() != self.hash.output_len() {
            return Err(AuthError::Malformed("scram proof has the wrong length"));
        }
        let failed = || AuthError::failed(&self.user);
        if cbind != self.gs2_header || !bool::from(nonce.ct_eq(&self.nonce)) {
            return Err(failed());
        }
        let Some(cred) = &self.credential else {
            return Err(failed());
        };

        let mut auth_message = self.client_first_bare.clone();
        auth_message.push(b',');
        auth_message.extend_from_slice(&self.server_first);
        auth_message.push(b',');
        auth_message.extend_from_slice(without_proof);

        let client_signature = self.hash.hmac(&cred.stored_key, &auth_message);
        let client_key: Vec<u8> = proof
            .iter()
            .zip(&client_signature)
            .map(|(p, s)| p ^ s)
            .collect();
        let stored_key = self.hash.hash(&client_key);
        if !bool::from(stored_key.ct_eq(&cred.stored_key)) {
            return Err(failed());
        }
        let server_signature = self.hash.hmac(&cred.server_key, &auth_message);
        let mut server_final = b"v=".to_vec();
        server_final.extend_from_slice(B64.encode(server_signature).as_bytes());
        Ok(server_final)
    }
}

/// Accepts an optional extension attribute (`x=...`, a letter then `=`) and ignores it.
fn check_extension(attr: &[u8]) -> Result<()> {
    match attr {
        [letter, b'=', ..] if letter.is_ascii_alphabetic() => Ok(()),
        _ => Err(AuthError::Malformed(
            "scram attribute is not of the form x=value",
        )),
    }
}

/// Decodes an RFC 5802 `saslname`: UTF-8 where `,` and `=` travel as `=2C` and `=3D`.
/// Any other `=` is an error. This is the "SASLprep-lite" Couchbase clients rely on; no
/// Unicode normalisation is done.
pub(crate) fn decode_saslname(raw: &[u8]) -> Result<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'=' => {
                match raw.get(i + 1..i + 3) {
                    Some(b"2C") => out.push(b','),
                    Some(b"3D") => out.push(b'='),
                    _ => return Err(AuthError::Malformed("scram user name has a bad = escape")),
                }
                i += 3;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    let name =
        String::from_utf8(out).map_err(|_| AuthError::Malformed("scram user name is not utf-8"))?;
    if name.is_empty() {
        return Err(AuthError::Malformed("scram user name is empty"));
    }
    Ok(name)
}

/// Encodes a user name as an RFC 5802 `saslname` (the inverse of [`decode_saslname`]).
#[cfg(test)]
pub(crate) fn encode_saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

/// Splits at the first `sep`, without it.
fn split_once(data: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let at = data.iter().position(|&b| b == sep)?;
    Some((&data[..at], &data[at + 1..]))
}

/// Returns the position of the last occurrence of `needle`.
fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saslname_decodes_escapes() {
        assert_eq!(decode_saslname(b"a=2Cb=3Dc").unwrap(), "a,b=c");
        assert_eq!(decode_saslname(b"plain").unwrap(), "plain");
        assert!(decode_saslname(b"a=2").is_err());
        assert!(decode_saslname(b"a=41").is_err());
        assert!(decode_saslname(b"").is_err());
        assert!(decode_saslname(&[0xff]).is_err());
        assert_eq!(
            decode_saslname(encode_saslname("x,=y").as_bytes()).unwrap(),
            "x,=y"
        );
    }

    #[test]
    fn random_server_nonces_are_printable_and_differ() {
        let a = random_server_nonce();
        let b = random_server_nonce();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_graphic() && b != b','));
    }
}
