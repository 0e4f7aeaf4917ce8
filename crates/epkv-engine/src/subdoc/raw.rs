//! Reading a path straight out of a document's text, without building its tree: a
//! streaming scan (serde visitors that stop at the component wanted) and a byte-level
//! fast path for the common lookups; both agree with the tree's answers.

use super::path::{Component, parse_path};
use super::{SubdocError, SubdocOp};

/// What [`find_raw`] met at a step of the path.
enum Step<'de> {
    /// The component's value, as it is written in the document.
    Found(&'de serde_json::value::RawValue),
    /// The container has no such key or index.
    Missing,
    /// The value is not the kind of container the component needs.
    Mismatch,
}

/// Finds one component in a container without building it: the other members are
/// skipped (checked, not kept). With `stop`, the scan ends at the component: the value
/// is left in `found` and the visitor fails with [`STOPPED`] (for a document already
/// known to be JSON, so the rest need not be checked).
struct FindIn<'c, 'de> {
    want: &'c Component,
    stop: bool,
    found: &'c std::cell::Cell<Option<&'de serde_json::value::RawValue>>,
}

/// The error a stopped [`FindIn`] ends the scan with.
const STOPPED: &str = "epkv: found";

impl<'de> serde::de::Visitor<'de> for FindIn<'_, 'de> {
    type Value = Step<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Step<'de>, A::Error> {
        let Component::Key(want) = self.want else {
            while map
                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                .is_some()
            {}
            return Ok(Step::Mismatch);
        };
        let mut found = None;
        while let Some(k) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if found.is_none() && k == want.as_str() {
                let v = map.next_value::<&'de serde_json::value::RawValue>()?;
                if self.stop {
                    self.found.set(Some(v));
                    return Err(serde::de::Error::custom(STOPPED));
                }
                found = Some(v);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(found.map_or(Step::Missing, Step::Found))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Step<'de>, A::Error> {
        let Component::Index(want) = *self.want else {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            return Ok(Step::Mismatch);
        };
        let mut found = None;
        let mut i = 0i64;
        while let Some(v) = seq.next_element::<&'de serde_json::value::RawValue>()? {
            if want == -1 || i == want {
                if self.stop && want != -1 {
                    self.found.set(Some(v));
                    return Err(serde::de::Error::custom(STOPPED));
                }
                found = Some(v);
            }
            i += 1;
        }
        Ok(found.map_or(Step::Missing, Step::Found))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Step<'de>, E> {
        Ok(Step::Mismatch)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Step<'de>, E> {
        Ok(Step::Mismatch)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Step<'de>, E> {
        Ok(Step::Mismatch)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Step<'de>, E> {
        Ok(Step::Mismatch)
    }
    fn visit_str<E>(self, _: &str) -> Result<Step<'de>, E> {
        Ok(Step::Mismatch)
    }
    fn visit_unit<E>(self) -> Result<Step<'de>, E> {
        Ok(Step::Mismatch)
    }
}

/// Counts the members of a container without building it.
struct CountIn;

impl<'de> serde::de::Visitor<'de> for CountIn {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> Result<Option<usize>, A::Error> {
        let mut n = 0;
        while map
            .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
            .is_some()
        {
            n += 1;
        }
        Ok(Some(n))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<Option<usize>, A::Error> {
        let mut n = 0;
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            n += 1;
        }
        Ok(Some(n))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Option<usize>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<usize>, E> {
        Ok(None)
    }
}

/// Runs `visitor` over the whole of `text` (one JSON value, nothing after it).
fn scan<'de, V: serde::de::Visitor<'de>>(
    text: &'de str,
    visitor: V,
) -> Result<V::Value, SubdocError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let v = serde::Deserializer::deserialize_any(&mut de, visitor)
        .map_err(|_| SubdocError::DocNotJson)?;
    de.end().map_err(|_| SubdocError::DocNotJson)?;
    Ok(v)
}

/// Finds one component in `text`; with `stop`, stops scanning once it is found.
fn find_in<'d>(text: &'d str, want: &Component, stop: bool) -> Result<Step<'d>, SubdocError> {
    let found = std::cell::Cell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let visitor = FindIn {
        want,
        stop,
        found: &found,
    };
    match serde::Deserializer::deserialize_any(&mut de, visitor) {
        Ok(step) => {
            de.end().map_err(|_| SubdocError::DocNotJson)?;
            Ok(step)
        }
        Err(_) => found.get().map(Step::Found).ok_or(SubdocError::DocNotJson),
    }
}

/// Follows `path` through the document text, skipping what is not on the path, and
/// returns the value's text as it is written in the document. With `trusted` (a document
/// stored as JSON) each level's scan stops at the component; otherwise the whole text is
/// checked.
fn find_raw<'d>(doc: &'d str, path: &[Component], trusted: bool) -> Result<&'d str, SubdocError> {
    let mut cur = doc;
    for c in path {
        cur = match find_in(cur, c, trusted)? {
            Step::Found(raw) => raw.get(),
            Step::Missing => return Err(SubdocError::PathNotFound),
            Step::Mismatch => return Err(SubdocError::PathMismatch),
        };
    }
    Ok(cur)
}

/// A byte-level reader of JSON text already known to be valid (a document stored as
/// JSON): it skips values by their brackets and quotes instead of parsing them, which is
/// several times faster than a parser. Anything it does not expect makes it give up
/// (`None`), and the caller falls back to the checking scanner. Written by hand because
/// it is the core of SUBDOC_GET's speed.
mod fast {
    use super::Component;

    fn ws(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
            i += 1;
        }
        i
    }

    /// The index after the string starting at `i` (which is `"`).
    fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
        None
    }

    /// The index after the value starting at `i` (no leading whitespace).
    pub(super) fn value_end(b: &[u8], i: usize) -> Option<usize> {
        match *b.get(i)? {
            b'"' => string_end(b, i),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut j = i;
                while j < b.len() {
                    match b[j] {
                        b'"' => {
                            j = string_end(b, j)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(j + 1);
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                None
            }
            _ => {
                let mut j = i;
                while j < b.len()
                    && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    j += 1;
                }
                (j > i).then_some(j)
            }
        }
    }

    /// What a step found.
    pub(super) enum Found {
        Value(usize, usize),
        Missing,
        Mismatch,
    }

    /// Finds `want` in the container at `b[i..]`; the value's span on success.
    pub(super) fn find(b: &[u8], want: &Component) -> Option<Found> {
        let mut i = ws(b, 0);
        match (want, *b.get(i)?) {
            (Component::Key(k), b'{') => {
                i = ws(b, i + 1);
                if b.get(i) == Some(&b'}') {
                    return Some(Found::Missing);
                }
                loop {
                    if b.get(i) != Some(&b'"') {
                        return None;
                    }
                    let key_end = string_end(b, i)?;
                    let raw = &b[i + 1..key_end - 1];
                    let matches = if raw.contains(&b'\\') {
                        serde_json::from_slice::<String>(&b[i..key_end]).ok()? == *k
                    } else {
                        raw == k.as_bytes()
                    };
                    i = ws(b, key_end);
                    if b.get(i) != Some(&b':') {
                        return None;
                    }
                    let start = ws(b, i + 1);
                    let end = value_end(b, start)?;
                    if matches {
                        return Some(Found::Value(start, end));
                    }
                    i = ws(b, end);
                    match b.get(i)? {
                        b',' => i = ws(b, i + 1),
                        b'}' => return Some(Found::Missing),
                        _ => return None,
                    }
                }
            }
            (Component::Index(want), b'[') => {
                i = ws(b, i + 1);
                if b.get(i) == Some(&b']') {
                    return Some(Found::Missing);
                }
                let mut n = 0i64;
                loop {
                    let start = i;
                    let end = value_end(b, i)?;
                    if n == *want {
                        return Some(Found::Value(start, end));
                    }
                    n += 1;
                    i = ws(b, end);
                    match b.get(i)? {
                        b',' => i = ws(b, i + 1),
                        // The last element: what [-1] names.
                        b']' if *want == -1 => return Some(Found::Value(start, end)),
                        b']' => return Some(Found::Missing),
                        _ => return None,
                    }
                }
            }
            (_, b'{' | b'[') => Some(Found::Mismatch),
            // A primitive: nothing to look into.
            _ => Some(Found::Mismatch),
        }
    }

    /// The number of members of the container at `b`, or `None` to fall back.
    pub(super) fn count(b: &[u8]) -> Option<Option<usize>> {
        let mut i = ws(b, 0);
        let (open, close) = match *b.get(i)? {
            b'{' => (b'{', b'}'),
            b'[' => (b'[', b']'),
            _ => return Some(None),
        };
        debug_assert!(b[i] == open);
        i = ws(b, i + 1);
        if b.get(i) == Some(&close) {
            return Some(Some(0));
        }
        let mut n = 0;
        loop {
            let mut end = value_end(b, i)?;
            if open == b'{' {
                // A key, then its value.
                end = ws(b, end);
                if b.get(end) != Some(&b':') {
                    return None;
                }
                end = value_end(b, ws(b, end + 1))?;
            }
            n += 1;
            i = ws(b, end);
            match b.get(i)? {
                b',' => i = ws(b, i + 1),
                c if *c == close => return Some(Some(n)),
                _ => return None,
            }
        }
    }
}

/// [`lookup_raw`]'s fast path for a document stored as JSON: `None` when the text held a
/// surprise (the checking scanner then answers).
fn lookup_fast(b: &[u8], op: SubdocOp, path: &[Component]) -> Option<Result<Vec<u8>, SubdocError>> {
    let (mut start, mut end) = (0, b.len());
    for c in path {
        match fast::find(&b[start..end], c)? {
            fast::Found::Value(s, e) => {
                let base = start;
                start = base + s;
                end = base + e;
            }
            fast::Found::Missing => return Some(Err(SubdocError::PathNotFound)),
            fast::Found::Mismatch => return Some(Err(SubdocError::PathMismatch)),
        }
    }
    let v = &b[start..end];
    Some(match op {
        SubdocOp::Get => Ok(v.trim_ascii().to_vec()),
        SubdocOp::Exists => Ok(Vec::new()),
        SubdocOp::GetCount => match fast::count(v)? {
            Some(n) => Ok(n.to_string().into_bytes()),
            None => Err(SubdocError::PathMismatch),
        },
        _ => Err(SubdocError::PathInvalid),
    })
}

/// Runs one lookup on the document's text without parsing what is not on the path. A
/// document not marked JSON is checked all the way through (one that is not JSON is
/// refused); one stored as JSON (`trusted`) is read only up to the path.
pub(crate) fn lookup_raw(
    doc: &[u8],
    op: SubdocOp,
    path: &[u8],
    trusted: bool,
) -> Result<Vec<u8>, SubdocError> {
    let path = parse_path(path)?;
    // A document stored as JSON was checked when it was stored: its bytes are scanned
    // without checking them as UTF-8 again.
    if trusted
        && !path.is_empty()
        && let Some(answer) = lookup_fast(doc, op, &path)
    {
        return answer;
    }
    let text = std::str::from_utf8(doc).map_err(|_| SubdocError::DocNotJson)?;
    if path.is_empty() {
        // The whole document: check it, and hand it back as it is.
        scan(text, serde::de::IgnoredAny)?;
    }
    let v = find_raw(text, &path, trusted)?;
    match op {
        SubdocOp::Get => Ok(v.trim().as_bytes().to_vec()),
        SubdocOp::Exists => Ok(Vec::new()),
        SubdocOp::GetCount => match scan(v, CountIn)? {
            Some(n) => Ok(n.to_string().into_bytes()),
            None => Err(SubdocError::PathMismatch),
        },
        _ => Err(SubdocError::PathInvalid),
    }
}
