//! The layout of a value with extended attributes (kv_engine `docs/Document.md`,
//! `docs/ExtendedAttributes.md`): when the datatype has the XATTR bit, the value starts
//! with the attributes and the body follows.
//!
//! ```text
//! total length (u32, big-endian; bytes of the pairs that follow)
//! pair*: pair length (u32, big-endian) | key | 0x00 | value | 0x00
//! body
//! ```
//!
//! Keys are 1 to [`MAX_KEY_LEN`] bytes of UTF-8; one starting with `_` is a system
//! attribute (kept by a deletion), `$` names a virtual attribute (never stored), and other
//! punctuation or control characters may not start a key. Values are JSON; the engine
//! checks that. Both parts live in the front end and the engine, so the layout is here.
//!
//! ```
//! use epkv_engine_api::xattr;
//! let section = xattr::encode([(&b"_sync"[..], &b"{\"rev\":1}"[..])]);
//! let mut value = section.clone();
//! value.extend_from_slice(b"{\"a\":1}");
//! let (attrs, body) = xattr::split(&value).unwrap();
//! assert_eq!(attrs, &section[..]);
//! assert_eq!(body, b"{\"a\":1}");
//! let pairs: Vec<_> = xattr::pairs(attrs).collect::<Result<_, _>>().unwrap();
//! assert_eq!(pairs, vec![(&b"_sync"[..], &b"{\"rev\":1}"[..])]);
//! ```

use epkv_types::Datatype;

/// Longest attribute key, in bytes.
pub const MAX_KEY_LEN: usize = 16;

/// A malformed attribute section: a length that overruns, a pair without its two
/// terminating zero bytes, or a bad key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

fn be32(b: &[u8]) -> Option<usize> {
    let b: [u8; 4] = b.get(..4)?.try_into().ok()?;
    usize::try_from(u32::from_be_bytes(b)).ok()
}

/// Splits a value whose datatype has the XATTR bit into its attribute section (with its
/// 4-byte length) and its body.
///
/// # Errors
/// [`Malformed`] when the length prefix is missing or overruns the value.
pub fn split(value: &[u8]) -> Result<(&[u8], &[u8]), Malformed> {
    let len = be32(value).ok_or(Malformed)?;
    let end = len.checked_add(4).ok_or(Malformed)?;
    if end > value.len() {
        return Err(Malformed);
    }
    Ok(value.split_at(end))
}

/// The body of a value with datatype `datatype` (the whole value without the XATTR bit;
/// empty when the section is malformed, which the engine never stores).
#[must_use]
pub fn body(value: &[u8], datatype: Datatype) -> &[u8] {
    if datatype.contains(Datatype::XATTR) {
        split(value).map_or(&[][..], |(_, b)| b)
    } else {
        value
    }
}

/// The attribute section of a value with datatype `datatype` (empty without the bit).
#[must_use]
pub fn section(value: &[u8], datatype: Datatype) -> &[u8] {
    if datatype.contains(Datatype::XATTR) {
        split(value).map_or(&[][..], |(s, _)| s)
    } else {
        &[]
    }
}

/// The `(key, value)` pairs of an attribute section (as [`split`] returns it; an empty
/// section has none).
pub fn pairs(section: &[u8]) -> impl Iterator<Item = Result<(&[u8], &[u8]), Malformed>> {
    let mut rest = section.get(4..).unwrap_or_default();
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let pair = (|| {
            let len = be32(rest).ok_or(Malformed)?;
            let end = len.checked_add(4).ok_or(Malformed)?;
            let body = rest.get(4..end).ok_or(Malformed)?;
            rest = &rest[end..];
            let (key, value) = match body {
                [kv @ .., 0] => {
                    let nul = kv.iter().position(|&b| b == 0).ok_or(Malformed)?;
                    (&kv[..nul], &kv[nul + 1..])
                }
                _ => return Err(Malformed),
            };
            if !valid_key(key) || value.contains(&0) {
                return Err(Malformed);
            }
            Ok((key, value))
        })();
        if pair.is_err() {
            rest = &[];
        }
        Some(pair)
    })
}

/// Encodes `(key, value)` pairs as an attribute section (with its length prefix); no
/// pairs give an empty section (a value without the XATTR bit).
pub fn encode<'a>(pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut out = vec![0; 4];
    for (k, v) in pairs {
        let len = k.len() + v.len() + 2;
        out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    if out.len() == 4 {
        return Vec::new();
    }
    let total = u32::try_from(out.len() - 4).unwrap_or(u32::MAX);
    out[..4].copy_from_slice(&total.to_be_bytes());
    out
}

/// Whether `key` may name a stored attribute: 1 to [`MAX_KEY_LEN`] bytes of UTF-8, not
/// starting with a control character or punctuation other than `_` (so never `$`).
#[must_use]
pub fn valid_key(key: &[u8]) -> bool {
    let Some(&first) = key.first() else {
        return false;
    };
    key.len() <= MAX_KEY_LEN
        && std::str::from_utf8(key).is_ok()
        && !first.is_ascii_control()
        && (first == b'_' || !first.is_ascii_punctuation())
        && !key.contains(&0)
}

/// Whether `key` names a system attribute (one a deletion keeps).
#[must_use]
pub fn is_system_key(key: &[u8]) -> bool {
    key.first() == Some(&b'_')
}

/// Whether `key` names a virtual attribute (`$document`, `$XTOC`, ...).
#[must_use]
pub fn is_virtual_key(key: &[u8]) -> bool {
    key.first() == Some(&b'$')
}

/// The section with only the system attributes of `section` (empty when it has none).
///
/// # Errors
/// [`Malformed`] for a malformed section.
pub fn system_only(section: &[u8]) -> Result<Vec<u8>, Malformed> {
    let kept: Vec<_> = pairs(section)
        .filter(|p| p.as_ref().map_or(true, |(k, _)| is_system_key(k)))
        .collect::<Result<_, _>>()?;
    Ok(encode(kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_and_reads_back_pairs_and_body() {
        let section = encode([(&b"a"[..], &b"1"[..]), (b"_s", b"{\"x\":[1]}")]);
        // 4 + (4 + 1 + 1 + 1 + 1) + (4 + 2 + 1 + 9 + 1)
        assert_eq!(section.len(), 4 + 8 + 17);
        let mut v = section.clone();
        v.extend_from_slice(b"body");
        let (s, b) = split(&v).unwrap();
        assert_eq!((s, b), (&section[..], &b"body"[..]));
        assert_eq!(body(&v, Datatype::XATTR), b"body");
        assert_eq!(body(&v, Datatype::RAW), &v[..]);
        let p: Vec<_> = pairs(s).collect::<Result<_, _>>().unwrap();
        assert_eq!(p, vec![(&b"a"[..], &b"1"[..]), (b"_s", b"{\"x\":[1]}")]);
        let sys = system_only(s).unwrap();
        assert_eq!(sys, encode([(&b"_s"[..], &b"{\"x\":[1]}"[..])]));
        assert!(encode([]).is_empty());
        assert!(
            system_only(&encode([(&b"u"[..], &b"1"[..])]))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn refuses_malformed_sections() {
        assert_eq!(split(b"\0\0"), Err(Malformed));
        assert_eq!(split(b"\0\0\0\x09abc"), Err(Malformed));
        // A pair whose length overruns the section.
        let bad = [0, 0, 0, 6, 0, 0, 0, 9, b'a', 0];
        assert!(pairs(&bad).any(|p| p.is_err()));
        // A pair without its terminators.
        let bad = [0, 0, 0, 7, 0, 0, 0, 3, b'a', b'b', b'c'];
        assert!(pairs(&bad).any(|p| p.is_err()));
        // Bad keys.
        for k in [&b""[..], b"$doc", b".x", b"\x01a", b"abcdefghijklmnopq"] {
            let s = encode([(k, &b"1"[..])]);
            assert!(pairs(&s).any(|p| p.is_err()), "{k:?}");
        }
        assert!(valid_key(b"_sync") && valid_key(b"user") && valid_key(b"abcdefghijklmnop"));
    }

    #[test]
    fn pairs_never_panic_on_arbitrary_bytes() {
        let mut seed = 0x9e37_79b9_u32;
        for _ in 0..2000 {
            let n = (seed % 40) as usize;
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    (seed % 12) as u8
                })
                .collect();
            if let Ok((s, _)) = split(&bytes) {
                let _ = pairs(s).count();
                let _ = system_only(s);
            }
        }
    }
}
