//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong while authenticating a client or handling the users file.
///
/// No variant ever carries a password, a proof, a salted password or a key: `Display` is
/// safe to log. User names appear wrapped in `<ud>..</ud>` (KV-Engine's user-data tag) so a
/// log redactor can find them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// The client asked for a mechanism that is not in [`crate::MECHANISMS`].
    ///
    /// Holds the requested name when it has the shape of a SASL mechanism name (RFC 4422:
    /// up to 20 of `A-Z 0-9 - _`), else a placeholder.
    #[error("unknown sasl mechanism {0:?}")]
    UnknownMechanism(String),
    /// The client's message does not follow the mechanism's grammar, or arrived in the
    /// wrong state (a step after the exchange ended). The reason is a fixed string and never
    /// echoes client data.
    #[error("malformed sasl message: {0}")]
    Malformed(&'static str),
    /// The credentials are wrong: unknown user, wrong password or proof, mismatched nonce,
    /// an authorisation identity other than the user, or a user with no credential for the
    /// mechanism. `user` is the name the client claimed, when it got that far.
    #[error("authentication failed for {}", UserTag(.user.as_deref()))]
    Failed {
        /// The user name the client presented, if the message was parsed that far.
        user: Option<String>,
    },
    /// The client asked for SCRAM channel binding (`p=` gs2 flag), which epkv does not
    /// offer (there is no TLS channel to bind to).
    #[error("scram channel binding is not supported")]
    ChannelBindingNotSupported,
    /// A user name or bucket name given to [`crate::UserStore`] is not acceptable.
    #[error("invalid user definition: {0}")]
    InvalidUser(&'static str),
    /// Reading or writing the users file failed.
    #[error("users file {}: {source}", .path.display())]
    Io {
        /// The file (or its temporary sibling) being read or written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The users file is not valid: bad TOML, a missing or malformed field.
    #[error("users file {file}{}{}: {message}", UserPart(.user.as_deref()), FieldPart(.field.as_deref()))]
    Parse {
        /// The file name (`<string>` when parsed from text).
        file: String,
        /// The user whose entry is broken, if known.
        user: Option<String>,
        /// The field that is broken, if known (`hashes.SCRAM-SHA512.salt`).
        field: Option<String>,
        /// What is wrong with it.
        message: String,
    },
    /// Serialising the users file failed (should not happen for a valid store).
    #[error("cannot serialise the users file: {0}")]
    Serialize(String),
}

impl AuthError {
    /// Returns true when the front end must answer `0x20` (Auth error): the client's
    /// credentials were refused, or it asked for something epkv will not authenticate
    /// with. [`AuthError::Malformed`] returns false (answer `0x04` Invalid arguments), as
    /// do the file errors, which never come from a client.
    #[must_use]
    pub fn is_auth_failure(&self) -> bool {
        matches!(
            self,
            Self::Failed { .. } | Self::ChannelBindingNotSupported | Self::UnknownMechanism(_)
        )
    }

    /// Returns the user name a failed attempt claimed, for logging (`None` for other
    /// errors or when the message did not get that far).
    #[must_use]
    pub fn user(&self) -> Option<&str> {
        match self {
            Self::Failed { user } => user.as_deref(),
            _ => None,
        }
    }

    /// Returns a failure for `user` (convenience for the mechanisms).
    pub(crate) fn failed(user: &str) -> Self {
        Self::Failed {
            user: Some(user.to_owned()),
        }
    }
}

/// Displays an optional user name in `<ud>` tags, or `an unnamed user`.
struct UserTag<'a>(Option<&'a str>);

impl std::fmt::Display for UserTag<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(u) => write!(f, "user <ud>{u}</ud>"),
            None => f.write_str("an unnamed user"),
        }
    }
}

/// Displays `, user <ud>NAME</ud>` or nothing.
struct UserPart<'a>(Option<&'a str>);

impl std::fmt::Display for UserPart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(u) => write!(f, ", user <ud>{u}</ud>"),
            None => Ok(()),
        }
    }
}

/// Displays `, field NAME` or nothing.
struct FieldPart<'a>(Option<&'a str>);

impl std::fmt::Display for FieldPart<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(x) => write!(f, ", field {x}"),
            None => Ok(()),
        }
    }
}

/// The crate's result alias.
pub type Result<T, E = AuthError> = std::result::Result<T, E>;
