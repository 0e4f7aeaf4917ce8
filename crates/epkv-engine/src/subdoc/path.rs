//! Sub-document paths: parsing a path into its components, and the helpers that take
//! one apart.

use super::{MAX_DEPTH, MAX_PATH_LEN, SubdocError};

/// One component of a parsed path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Component {
    /// An object key (unescaped).
    Key(String),
    /// An array index; -1 is the last element.
    Index(i64),
}

/// Parses a path. The empty path is the document's root (no components).
pub(crate) fn parse_path(path: &[u8]) -> Result<Vec<Component>, SubdocError> {
    if path.len() > MAX_PATH_LEN {
        return Err(SubdocError::PathTooBig);
    }
    let text = std::str::from_utf8(path).map_err(|_| SubdocError::PathInvalid)?;
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    if chars.peek().is_none() {
        return Ok(out);
    }
    // Whether a key component must come next (start of path or after a dot).
    let mut want_key = true;
    while let Some(&c) = chars.peek() {
        match c {
            '[' => {
                // An index follows a key or an index (`a[0]`, `a[0][1]`), starts the path
                // on a root array (`[0]`), or follows a dot (`a.[0]`): KV-Engine's parser
                // takes that form too, and SDK code uses it (`array_insert("a.[2]", ..)`).
                chars.next();
                let mut digits = String::new();
                loop {
                    match chars.next() {
                        Some(']') => break,
                        Some(d) if d.is_ascii_digit() || (d == '-' && digits.is_empty()) => {
                            digits.push(d);
                        }
                        _ => return Err(SubdocError::PathInvalid),
                    }
                }
                let index: i64 = digits.parse().map_err(|_| SubdocError::PathInvalid)?;
                if index < -1 {
                    return Err(SubdocError::PathInvalid);
                }
                out.push(Component::Index(index));
                want_key = false;
            }
            '.' => {
                if want_key {
                    return Err(SubdocError::PathInvalid);
                }
                chars.next();
                want_key = true;
            }
            ']' => return Err(SubdocError::PathInvalid),
            _ => {
                if !want_key {
                    return Err(SubdocError::PathInvalid);
                }
                let mut key = String::new();
                while let Some(&k) = chars.peek() {
                    match k {
                        '.' | '[' => break,
                        ']' => return Err(SubdocError::PathInvalid),
                        '`' => {
                            chars.next();
                            // Escaped until the closing backtick; `` is a literal one.
                            loop {
                                match chars.next() {
                                    Some('`') if chars.peek() == Some(&'`') => {
                                        chars.next();
                                        key.push('`');
                                    }
                                    Some('`') => break,
                                    Some(e) => key.push(e),
                                    None => return Err(SubdocError::PathInvalid),
                                }
                            }
                        }
                        other => {
                            chars.next();
                            key.push(other);
                        }
                    }
                }
                if key.is_empty() {
                    return Err(SubdocError::PathInvalid);
                }
                out.push(Component::Key(key));
                want_key = false;
            }
        }
        if out.len() > MAX_DEPTH {
            return Err(SubdocError::PathTooBig);
        }
    }
    if want_key {
        // A trailing dot.
        return Err(SubdocError::PathInvalid);
    }
    Ok(out)
}

/// The first component of an extended-attribute path: the attribute's key.
pub(crate) fn first_key(path: &[u8]) -> Result<String, SubdocError> {
    match parse_path(path)?.into_iter().next() {
        Some(Component::Key(k)) => Ok(k),
        _ => Err(SubdocError::PathInvalid),
    }
}

/// Splits a path into its parent and last component.
pub(super) fn split_last(path: &[Component]) -> Result<(&[Component], &Component), SubdocError> {
    path.split_last()
        .map(|(last, parent)| (parent, last))
        .ok_or(SubdocError::PathInvalid)
}
