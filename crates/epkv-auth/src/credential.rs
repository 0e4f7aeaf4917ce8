//! One stored SCRAM credential: what the server keeps instead of a password.

use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::mechanism::ScramHash;

/// The SCRAM verifier of one user for one hash function (RFC 5802 §3): the salt, the
/// PBKDF2 iteration count, `StoredKey` and `ServerKey`. The password cannot be recovered
/// from it; a stolen credential lets an attacker impersonate the *server*, and lets them
/// run a dictionary attack at `iterations` PBKDF2 rounds per guess.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ScramCredential {
    pub(crate) salt: Vec<u8>,
    pub(crate) iterations: u32,
    pub(crate) stored_key: Vec<u8>,
    pub(crate) server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The keys are password-equivalent for server impersonation: keep them out of logs.
        f.debug_struct("ScramCredential")
            .field("salt_len", &self.salt.len())
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl ScramCredential {
    /// Derives a credential from a password with a fresh random salt from the operating
    /// system's CSPRNG, one digest long.
    pub(crate) fn from_password(hash: ScramHash, password: &[u8], iterations: u32) -> Self {
        let mut salt = vec![0_u8; hash.output_len()];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        Self::with_salt(hash, password, salt, iterations)
    }

    /// Derives a credential from a password and a given salt (tests use the RFC salts).
    pub(crate) fn with_salt(
        hash: ScramHash,
        password: &[u8],
        salt: Vec<u8>,
        iterations: u32,
    ) -> Self {
        let (stored_key, server_key) = hash.derive_keys(password, &salt, iterations);
        Self {
            salt,
            iterations,
            stored_key,
            server_key,
        }
    }

    /// Returns true when `password` derives this credential's `StoredKey`. The comparison
    /// is constant time; the derivation costs `iterations` PBKDF2 rounds.
    pub(crate) fn verify_password(&self, hash: ScramHash, password: &[u8]) -> bool {
        let salted = hash.salted_password(password, &self.salt, self.iterations);
        let client_key = hash.hmac(&salted, b"Client Key");
        let stored_key = hash.hash(&client_key);
        bool::from(stored_key.ct_eq(&self.stored_key))
    }
}
