//! RFC 4616 PLAIN: `[authzid] NUL authcid NUL passwd`, checked against the user's
//! strongest stored SCRAM credential (PBKDF2 of the password, `StoredKey` compared in
//! constant time), so no plain-text password is ever stored.

use crate::error::{AuthError, Result};
use crate::mechanism::ScramHash;
use crate::user_store::UserStore;

/// Verifies a PLAIN message and returns the authenticated user name.
pub(crate) fn authenticate(users: &UserStore, message: &[u8]) -> Result<String> {
    let mut parts = message.splitn(3, |&b| b == 0);
    let (Some(authzid), Some(authcid), Some(password)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::Malformed(
            "plain message needs two NUL separators",
        ));
    };
    if password.contains(&0) {
        return Err(AuthError::Malformed("plain message has more than two NULs"));
    }
    let user = std::str::from_utf8(authcid)
        .map_err(|_| AuthError::Malformed("plain user name is not utf-8"))?;
    if user.is_empty() {
        return Err(AuthError::Malformed("plain user name is empty"));
    }
    if !authzid.is_empty() && authzid != authcid {
        return Err(AuthError::failed(user));
    }
    match users.strongest_credential(user) {
        Some((hash, cred)) if cred.verify_password(hash, password) => Ok(user.to_owned()),
        Some(_) => Err(AuthError::failed(user)),
        None => {
            // Spend the same PBKDF2 work as for a real user, so the answer time does not
            // tell whether the user exists.
            let (salt, iterations) = users.fake_salt(user, ScramHash::Sha512);
            let _ = ScramHash::Sha512.salted_password(password, &salt, iterations);
            Err(AuthError::failed(user))
        }
    }
}
