//! Sub-document operations (kv_engine `docs/SubDocument.md`): reading and changing parts
//! of a JSON document by path, without the client fetching the whole document.
//!
//! A path is N1QL-style: components separated by dots, array indices in brackets
//! immediately after the array (`a.b[0].c`), `[-1]` for an array's last element, and
//! backticks around a component holding `.`, `[` or `]` (two backticks for a literal
//! one). Limits: 1024 bytes and 32 components ([`MAX_PATH_LEN`], [`MAX_DEPTH`]).
//!
//! The document is parsed into a `serde_json::Value` (keys kept in document order),
//! changed, and serialised again (compact); an operation never leaves a partly changed
//! document: a multi-mutation applies every spec to a copy and stores the copy only if
//! all succeed. (KV-Engine edits the text in place and so also keeps the document's
//! whitespace; epkv does not.)

use serde_json::{Map, Value};

/// Longest path accepted.
pub(crate) const MAX_PATH_LEN: usize = 1024;
/// Most components a path may have; also the deepest a value may nest.
pub(crate) const MAX_DEPTH: usize = 32;

pub(crate) use epkv_engine_api::{SubdocError, SubdocOp};

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

/// Parses a document, refusing one that is not JSON or nests too deeply.
pub(crate) fn parse_doc(doc: &[u8]) -> Result<Value, SubdocError> {
    let v: Value = serde_json::from_slice(doc).map_err(|_| SubdocError::DocNotJson)?;
    if depth(&v) > MAX_DEPTH {
        return Err(SubdocError::DocTooDeep);
    }
    Ok(v)
}

/// Parses a value to insert: one JSON value, or (for the array operations) several
/// separated by commas.
fn parse_value(v: &[u8], multi: bool) -> Result<Vec<Value>, SubdocError> {
    let parsed: Vec<Value> = if multi {
        let mut wrapped = Vec::with_capacity(v.len() + 2);
        wrapped.push(b'[');
        wrapped.extend_from_slice(v);
        wrapped.push(b']');
        serde_json::from_slice(&wrapped).map_err(|_| SubdocError::ValueCantInsert)?
    } else {
        vec![serde_json::from_slice(v).map_err(|_| SubdocError::ValueCantInsert)?]
    };
    if parsed.is_empty() {
        return Err(SubdocError::ValueCantInsert);
    }
    if parsed.iter().any(|p| depth(p) > MAX_DEPTH) {
        return Err(SubdocError::ValueTooDeep);
    }
    Ok(parsed)
}

pub(crate) fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Resolves an index into an array of `len` elements.
fn index_of(i: i64, len: usize) -> Option<usize> {
    if i == -1 {
        len.checked_sub(1)
    } else {
        usize::try_from(i).ok().filter(|&i| i < len)
    }
}

/// Follows `path` from `root`.
fn find<'v>(root: &'v Value, path: &[Component]) -> Result<&'v Value, SubdocError> {
    let mut cur = root;
    for c in path {
        cur = match (c, cur) {
            (Component::Key(k), Value::Object(o)) => o.get(k).ok_or(SubdocError::PathNotFound)?,
            (Component::Index(i), Value::Array(a)) => index_of(*i, a.len())
                .and_then(|i| a.get(i))
                .ok_or(SubdocError::PathNotFound)?,
            _ => return Err(SubdocError::PathMismatch),
        };
    }
    Ok(cur)
}

/// Follows `path` from `root` for a change; with `mkdir`, missing objects on the way are
/// created (never array elements).
fn find_mut<'v>(
    root: &'v mut Value,
    path: &[Component],
    mkdir: bool,
) -> Result<&'v mut Value, SubdocError> {
    let mut cur = root;
    for c in path {
        cur = match (c, cur) {
            (Component::Key(k), Value::Object(o)) => {
                if mkdir && !o.contains_key(k) {
                    o.insert(k.clone(), Value::Object(Map::new()));
                }
                o.get_mut(k).ok_or(SubdocError::PathNotFound)?
            }
            (Component::Index(i), Value::Array(a)) => {
                let len = a.len();
                index_of(*i, len)
                    .and_then(|i| a.get_mut(i))
                    .ok_or(SubdocError::PathNotFound)?
            }
            _ => return Err(SubdocError::PathMismatch),
        };
    }
    Ok(cur)
}

/// Runs one lookup on a parsed document; `Ok` holds the value to return (empty for
/// EXISTS).
pub(crate) fn lookup(doc: &Value, op: SubdocOp, path: &[u8]) -> Result<Vec<u8>, SubdocError> {
    let path = parse_path(path)?;
    let v = find(doc, &path)?;
    match op {
        SubdocOp::Get => serde_json::to_vec(v).map_err(|_| SubdocError::DocNotJson),
        SubdocOp::Exists => Ok(Vec::new()),
        SubdocOp::GetCount => match v {
            Value::Array(a) => Ok(a.len().to_string().into_bytes()),
            Value::Object(o) => Ok(o.len().to_string().into_bytes()),
            _ => Err(SubdocError::PathMismatch),
        },
        // Not a lookup.
        _ => Err(SubdocError::PathInvalid),
    }
}

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

/// The virtual extended attributes of a document (kv_engine `docs/Document.md`):
/// `$document` (its metadata; `body` is its body, without attributes) and `$XTOC` (the
/// keys of its stored attributes).
pub(crate) fn virtual_attributes(
    m: &epkv_hashtable::ItemMeta,
    body: &[u8],
    deleted: bool,
    xtoc: Vec<String>,
) -> Value {
    let mut datatype = Vec::new();
    if m.datatype.contains(epkv_types::Datatype::JSON) {
        datatype.push("json");
    }
    if m.datatype.contains(epkv_types::Datatype::SNAPPY) {
        datatype.push("snappy");
    }
    if m.datatype.contains(epkv_types::Datatype::XATTR) {
        datatype.push("xattr");
    }
    if datatype.is_empty() {
        datatype.push("raw");
    }
    serde_json::json!({
        "$document": {
            "CAS": format!("0x{:016x}", m.cas.0),
            "seqno": format!("0x{:016x}", m.by_seqno.0),
            "revid": m.rev_seqno.to_string(),
            "exptime": m.expiry,
            "value_bytes": body.len(),
            "datatype": datatype,
            "deleted": deleted,
            "flags": m.flags,
            // The CAS is a hybrid logical clock in nanoseconds.
            "last_modified": (m.cas.0 / 1_000_000_000).to_string(),
            "value_crc32c": format!("0x{:08x}", crc32c::crc32c(body)),
        },
        "$XTOC": xtoc,
    })
}

/// A lookup of an extended-attribute path: the virtual ones are answered from `vattrs`,
/// another `$` name is unknown, and the stored ones are read from `attrs` (an object
/// of the document's attributes).
pub(crate) fn lookup_xattr(
    vattrs: &Value,
    attrs: &Value,
    op: SubdocOp,
    path: &[u8],
) -> Result<Vec<u8>, SubdocError> {
    match first_key(path)? {
        k if k == "$document" || k == "$XTOC" => lookup(vattrs, op, path),
        k if k.starts_with('$') => Err(SubdocError::UnknownVattr),
        _ => lookup(attrs, op, path),
    }
}

/// The first component of an extended-attribute path: the attribute's key.
pub(crate) fn first_key(path: &[u8]) -> Result<String, SubdocError> {
    match parse_path(path)?.into_iter().next() {
        Some(Component::Key(k)) => Ok(k),
        _ => Err(SubdocError::PathInvalid),
    }
}

/// The root a document created by MKDOC/ADD starts from for `op` at `path`.
pub(crate) fn empty_root(op: SubdocOp, path: &[u8]) -> Value {
    let array_op = matches!(
        op,
        SubdocOp::ArrayPushLast | SubdocOp::ArrayPushFirst | SubdocOp::ArrayAddUnique
    );
    if array_op && path.is_empty() {
        Value::Array(Vec::new())
    } else {
        Value::Object(Map::new())
    }
}

/// Splits a path into its parent and last component.
fn split_last(path: &[Component]) -> Result<(&[Component], &Component), SubdocError> {
    path.split_last()
        .map(|(last, parent)| (parent, last))
        .ok_or(SubdocError::PathInvalid)
}

/// Applies one mutation to `doc`; returns the value to send back (COUNTER's result,
/// else empty).
pub(crate) fn mutate(
    doc: &mut Value,
    op: SubdocOp,
    path: &[u8],
    value: &[u8],
    mkdir: bool,
) -> Result<Vec<u8>, SubdocError> {
    let parsed = parse_path(path)?;
    match op {
        // Not a mutation of a path (the whole-document ones are the caller's).
        SubdocOp::Get
        | SubdocOp::Exists
        | SubdocOp::GetCount
        | SubdocOp::SetDoc
        | SubdocOp::DeleteDoc
        | SubdocOp::ReplaceBodyWithXattr => {
            return Err(SubdocError::PathInvalid);
        }
        SubdocOp::DictAdd | SubdocOp::DictUpsert => {
            let v = parse_value(value, false)?.remove(0);
            let (parent, last) = split_last(&parsed)?;
            let Component::Key(k) = last else {
                return Err(SubdocError::PathInvalid);
            };
            let Value::Object(o) = find_mut(doc, parent, mkdir)? else {
                return Err(SubdocError::PathMismatch);
            };
            if op == SubdocOp::DictAdd && o.contains_key(k) {
                return Err(SubdocError::PathExists);
            }
            o.insert(k.clone(), v);
        }
        SubdocOp::Replace => {
            let v = parse_value(value, false)?.remove(0);
            if parsed.is_empty() {
                // The empty path replaces the whole document.
                *doc = v;
            } else {
                *find_mut(doc, &parsed, false)? = v;
            }
        }
        SubdocOp::Delete => {
            let (parent, last) = split_last(&parsed)?;
            match (last, find_mut(doc, parent, false)?) {
                (Component::Key(k), Value::Object(o)) => {
                    o.shift_remove(k).ok_or(SubdocError::PathNotFound)?;
                }
                (Component::Index(i), Value::Array(a)) => {
                    let i = index_of(*i, a.len()).ok_or(SubdocError::PathNotFound)?;
                    a.remove(i);
                }
                _ => return Err(SubdocError::PathMismatch),
            }
        }
        SubdocOp::ArrayPushLast | SubdocOp::ArrayPushFirst => {
            let values = parse_value(value, true)?;
            let target = find_mut_array(doc, &parsed, mkdir)?;
            if op == SubdocOp::ArrayPushLast {
                target.extend(values);
            } else {
                target.splice(0..0, values);
            }
        }
        SubdocOp::ArrayInsert => {
            let values = parse_value(value, true)?;
            let (parent, last) = split_last(&parsed)?;
            let Component::Index(i) = last else {
                return Err(SubdocError::PathMismatch);
            };
            let Value::Array(a) = find_mut(doc, parent, false)? else {
                return Err(SubdocError::PathMismatch);
            };
            // Insert positions run 0..=len; -1 is not a position.
            let at = usize::try_from(*i)
                .ok()
                .filter(|&at| at <= a.len())
                .ok_or(SubdocError::PathNotFound)?;
            a.splice(at..at, values);
        }
        SubdocOp::ArrayAddUnique => {
            let v = parse_value(value, false)?.remove(0);
            if v.is_array() || v.is_object() {
                return Err(SubdocError::ValueCantInsert);
            }
            let target = find_mut_array(doc, &parsed, mkdir)?;
            if target.iter().any(|e| e.is_array() || e.is_object()) {
                return Err(SubdocError::PathMismatch);
            }
            if target.contains(&v) {
                return Err(SubdocError::PathExists);
            }
            target.push(v);
        }
        SubdocOp::Counter => {
            let text = std::str::from_utf8(value).map_err(|_| SubdocError::DeltaInvalid)?;
            let delta: i64 = text.trim().parse().map_err(|_| SubdocError::DeltaInvalid)?;
            if delta == 0 || text.trim() != text {
                return Err(SubdocError::DeltaInvalid);
            }
            let (parent, last) = split_last(&parsed)?;
            let slot: &mut Value = match (last, find_mut(doc, parent, mkdir)?) {
                (Component::Key(k), Value::Object(o)) => {
                    o.entry(k.clone()).or_insert_with(|| Value::from(0))
                }
                (Component::Index(i), Value::Array(a)) => {
                    let len = a.len();
                    index_of(*i, len)
                        .and_then(|i| a.get_mut(i))
                        .ok_or(SubdocError::PathNotFound)?
                }
                _ => return Err(SubdocError::PathMismatch),
            };
            let current = slot.as_i64().ok_or(if slot.is_number() {
                SubdocError::NumRange
            } else {
                SubdocError::PathMismatch
            })?;
            let next = current.checked_add(delta).ok_or(SubdocError::NumRange)?;
            *slot = Value::from(next);
            return Ok(next.to_string().into_bytes());
        }
    }
    if depth(doc) > MAX_DEPTH {
        return Err(SubdocError::ValueTooDeep);
    }
    Ok(Vec::new())
}

/// The array at `path` (created empty under `mkdir` when its key is missing).
fn find_mut_array<'v>(
    doc: &'v mut Value,
    path: &[Component],
    mkdir: bool,
) -> Result<&'v mut Vec<Value>, SubdocError> {
    let target = match path.split_last() {
        Some((Component::Key(k), parent)) if mkdir => {
            let Value::Object(o) = find_mut(doc, parent, true)? else {
                return Err(SubdocError::PathMismatch);
            };
            o.entry(k.clone())
                .or_insert_with(|| Value::Array(Vec::new()))
        }
        _ => find_mut(doc, path, false)?,
    };
    match target {
        Value::Array(a) => Ok(a),
        _ => Err(SubdocError::PathMismatch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(k: &str) -> Component {
        Component::Key(k.to_owned())
    }

    #[test]
    fn paths_parse_with_indices_escapes_and_limits() {
        assert_eq!(parse_path(b"").unwrap(), vec![]);
        assert_eq!(
            parse_path(b"a.b[0].c[-1]").unwrap(),
            vec![
                key("a"),
                key("b"),
                Component::Index(0),
                key("c"),
                Component::Index(-1)
            ]
        );
        assert_eq!(
            parse_path(b"`dot.ted`.x").unwrap(),
            vec![key("dot.ted"), key("x")]
        );
        assert_eq!(parse_path(b"`back``tick`").unwrap(), vec![key("back`tick")]);
        assert_eq!(
            parse_path(b"[2][0]").unwrap(),
            vec![Component::Index(2), Component::Index(0)]
        );
        // A dot before an index, as KV-Engine accepts it.
        assert_eq!(
            parse_path(b"array.[2]").unwrap(),
            vec![key("array"), Component::Index(2)]
        );
        assert_eq!(
            parse_path(b"a[0].[1].b").unwrap(),
            vec![key("a"), Component::Index(0), Component::Index(1), key("b")]
        );
        for bad in [
            &b"a..b"[..],
            b".a",
            b"a.",
            b"a[",
            b"a[x]",
            b"a[-2]",
            b"a]",
            b"`open",
            b".[0]",
            b"a..[0]",
        ] {
            assert_eq!(
                parse_path(bad),
                Err(SubdocError::PathInvalid),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let deep = vec!["a"; MAX_DEPTH + 1].join(".");
        assert_eq!(parse_path(deep.as_bytes()), Err(SubdocError::PathTooBig));
        assert_eq!(
            parse_path(&[b'a'; MAX_PATH_LEN + 1]),
            Err(SubdocError::PathTooBig)
        );
    }

    fn doc() -> Value {
        json!({"name": "toy", "tags": ["a", "b"], "d": {"n": 1}, "list": [{"x": 1}, {"x": 2}]})
    }

    #[test]
    fn lookups_read_paths_count_and_report_errors() {
        let d = doc();
        assert_eq!(lookup(&d, SubdocOp::Get, b"name").unwrap(), b"\"toy\"");
        assert_eq!(lookup(&d, SubdocOp::Get, b"list[-1].x").unwrap(), b"2");
        assert_eq!(lookup(&d, SubdocOp::GetCount, b"tags").unwrap(), b"2");
        assert_eq!(lookup(&d, SubdocOp::GetCount, b"d").unwrap(), b"1");
        assert!(lookup(&d, SubdocOp::Exists, b"d.n").is_ok());
        assert_eq!(
            lookup(&d, SubdocOp::Exists, b"d.m"),
            Err(SubdocError::PathNotFound)
        );
        assert_eq!(
            lookup(&d, SubdocOp::Get, b"tags.x"),
            Err(SubdocError::PathMismatch)
        );
        assert_eq!(
            lookup(&d, SubdocOp::Get, b"name[0]"),
            Err(SubdocError::PathMismatch)
        );
        assert_eq!(
            lookup(&d, SubdocOp::GetCount, b"name"),
            Err(SubdocError::PathMismatch)
        );
        assert_eq!(
            lookup(&d, SubdocOp::Get, b"tags[5]"),
            Err(SubdocError::PathNotFound)
        );
        // The whole document, in its key order.
        assert_eq!(
            lookup(&d, SubdocOp::Get, b"").unwrap(),
            serde_json::to_vec(&d).unwrap()
        );
    }

    #[test]
    fn text_lookups_agree_with_parsed_lookups_and_keep_the_values_text() {
        let text = br#"{ "name" : "toy", "tags": ["a", "b"], "d": {"n": 1}, "list": [{"x": 1}, {"x": 2}] }"#;
        let d = parse_doc(text).unwrap();
        for path in [
            &b"name"[..],
            b"tags",
            b"tags[-1]",
            b"d",
            b"d.n",
            b"list[1].x",
            b"missing",
            b"name.x",
            b"tags[9]",
            b"d[0]",
            b"a..b",
        ] {
            for op in [SubdocOp::Get, SubdocOp::Exists, SubdocOp::GetCount] {
                let raw = lookup_raw(text, op, path, false);
                assert_eq!(lookup_raw(text, op, path, true), raw, "trusted");
                let parsed = lookup(&d, op, path);
                match (&raw, &parsed) {
                    (Ok(r), Ok(p)) if op == SubdocOp::Get => {
                        let rv: Value = serde_json::from_slice(r).unwrap();
                        let pv: Value = serde_json::from_slice(p).unwrap();
                        assert_eq!(rv, pv, "{op:?} {}", String::from_utf8_lossy(path));
                    }
                    _ => assert_eq!(raw, parsed, "{op:?} {}", String::from_utf8_lossy(path)),
                }
            }
        }
        // The value's text as written.
        assert_eq!(
            lookup_raw(text, SubdocOp::Get, b"tags", false).unwrap(),
            br#"["a", "b"]"#
        );
        assert_eq!(
            lookup_raw(b"{\"a\":1", SubdocOp::Get, b"a", false),
            Err(SubdocError::DocNotJson)
        );
        assert_eq!(
            lookup_raw(b"{\"a\":1} x", SubdocOp::Exists, b"a", false),
            Err(SubdocError::DocNotJson)
        );
        assert_eq!(
            lookup_raw(b"[1,2]", SubdocOp::Get, b"", false).unwrap(),
            b"[1,2]"
        );
    }

    #[test]
    fn mutations_change_only_their_path_and_keep_key_order() {
        let mut d = doc();
        mutate(&mut d, SubdocOp::DictUpsert, b"name", b"\"car\"", false).unwrap();
        mutate(&mut d, SubdocOp::DictAdd, b"new", b"{\"k\":true}", false).unwrap();
        assert_eq!(
            mutate(&mut d, SubdocOp::DictAdd, b"new", b"1", false),
            Err(SubdocError::PathExists)
        );
        assert_eq!(
            mutate(&mut d, SubdocOp::DictUpsert, b"x.y.z", b"1", false),
            Err(SubdocError::PathNotFound)
        );
        mutate(&mut d, SubdocOp::DictUpsert, b"x.y.z", b"1", true).unwrap();
        mutate(
            &mut d,
            SubdocOp::ArrayPushLast,
            b"tags",
            b"\"c\",\"d\"",
            false,
        )
        .unwrap();
        mutate(&mut d, SubdocOp::ArrayPushFirst, b"tags", b"\"z\"", false).unwrap();
        mutate(&mut d, SubdocOp::ArrayInsert, b"tags[1]", b"\"i\"", false).unwrap();
        assert_eq!(
            mutate(&mut d, SubdocOp::ArrayAddUnique, b"tags", b"\"a\"", false),
            Err(SubdocError::PathExists)
        );
        mutate(&mut d, SubdocOp::ArrayAddUnique, b"tags", b"\"u\"", false).unwrap();
        mutate(&mut d, SubdocOp::Delete, b"list[0]", b"", false).unwrap();
        mutate(&mut d, SubdocOp::Replace, b"d.n", b"[1,2]", false).unwrap();
        assert_eq!(
            mutate(&mut d, SubdocOp::Replace, b"d.missing", b"1", false),
            Err(SubdocError::PathNotFound)
        );
        assert_eq!(
            mutate(&mut d, SubdocOp::DictUpsert, b"name", b"not json", false),
            Err(SubdocError::ValueCantInsert)
        );
        assert_eq!(
            mutate(&mut d, SubdocOp::Counter, b"hits", b"5", false).unwrap(),
            b"5"
        );
        assert_eq!(
            mutate(&mut d, SubdocOp::Counter, b"hits", b"-7", false).unwrap(),
            b"-2"
        );
        assert_eq!(
            mutate(&mut d, SubdocOp::Counter, b"hits", b"0", false),
            Err(SubdocError::DeltaInvalid)
        );
        assert_eq!(
            mutate(&mut d, SubdocOp::Counter, b"name", b"1", false),
            Err(SubdocError::PathMismatch)
        );
        mutate(
            &mut d,
            SubdocOp::DictUpsert,
            b"big",
            b"9223372036854775807",
            false,
        )
        .unwrap();
        assert_eq!(
            mutate(&mut d, SubdocOp::Counter, b"big", b"1", false),
            Err(SubdocError::NumRange)
        );
        let text = String::from_utf8(serde_json::to_vec(&d).unwrap()).unwrap();
        assert_eq!(
            text,
            r#"{"name":"car","tags":["z","i","a","b","c","d","u"],"d":{"n":[1,2]},"list":[{"x":2}],"new":{"k":true},"x":{"y":{"z":1}},"hits":-2,"big":9223372036854775807}"#
        );
    }

    #[test]
    fn created_documents_start_from_the_root_their_first_operation_needs() {
        assert_eq!(empty_root(SubdocOp::ArrayPushLast, b""), json!([]));
        assert_eq!(empty_root(SubdocOp::ArrayPushLast, b"a"), json!({}));
        assert_eq!(empty_root(SubdocOp::DictUpsert, b"a"), json!({}));
        let mut d = empty_root(SubdocOp::ArrayPushFirst, b"");
        mutate(&mut d, SubdocOp::ArrayPushFirst, b"", b"1", false).unwrap();
        assert_eq!(d, json!([1]));
    }

    #[test]
    fn documents_and_values_too_deep_are_refused() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(parse_doc(deep.as_bytes()), Err(SubdocError::DocTooDeep));
        assert_eq!(parse_doc(b"{not json"), Err(SubdocError::DocNotJson));
        let mut d = json!({});
        assert_eq!(
            mutate(&mut d, SubdocOp::DictUpsert, b"a", deep.as_bytes(), false),
            Err(SubdocError::ValueTooDeep)
        );
    }

    mod model {
        //! Property tests against models: the text scanner against the parsed document,
        //! and the mutations against plain `serde_json` edits by JSON pointer.
        use super::super::*;
        use proptest::prelude::*;
        use serde_json::json;

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                any::<i32>().prop_map(Value::from),
                "[a-z ]{0,6}".prop_map(Value::from),
                any::<bool>().prop_map(Value::from),
                Just(Value::Null),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(4, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    prop::collection::btree_map("[a-c]", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        fn component() -> impl Strategy<Value = String> {
            prop_oneof!["[a-d]", (-1i64..4).prop_map(|i| format!("[{i}]"))]
        }

        fn path() -> impl Strategy<Value = String> {
            prop::collection::vec(component(), 0..4).prop_map(|cs| {
                let mut p = String::new();
                for c in cs {
                    if !c.starts_with('[') && !p.is_empty() {
                        p.push('.');
                    }
                    p.push_str(&c);
                }
                p
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

            /// The text scanner (checking or trusting the document) answers every lookup
            /// as a search of the parsed document does, on any document and path, with
            /// any spacing.
            #[test]
            fn text_lookups_match_the_parsed_document(doc in value(), p in path(), pretty in any::<bool>()) {
                let text = if pretty { serde_json::to_vec_pretty(&doc) } else { serde_json::to_vec(&doc) }.unwrap();
                for op in [SubdocOp::Get, SubdocOp::Exists, SubdocOp::GetCount] {
                    let parsed = lookup(&doc, op, p.as_bytes());
                    for trusted in [false, true] {
                        let raw = lookup_raw(&text, op, p.as_bytes(), trusted);
                        match (&raw, &parsed) {
                            (Ok(r), Ok(q)) if op == SubdocOp::Get => {
                                let rv: Value = serde_json::from_slice(r).unwrap();
                                let qv: Value = serde_json::from_slice(q).unwrap();
                                prop_assert_eq!(rv, qv);
                            }
                            _ => prop_assert_eq!(&raw, &parsed, "{:?} {} trusted {}", op, p, trusted),
                        }
                    }
                }
            }

            /// DICT_UPSERT, DELETE and COUNTER on object keys do what the same edit by JSON
            /// pointer does, and leave the document unchanged when they fail.
            #[test]
            fn mutations_match_pointer_edits(
                doc in value(),
                keys in prop::collection::vec("[a-c]", 1..3),
                op in 0u8..3,
                n in -5i64..5,
            ) {
                let path = keys.join(".");
                let parent = format!("/{}", keys[..keys.len() - 1].join("/"));
                let parent = if keys.len() == 1 { String::new() } else { parent };
                let last = keys.last().unwrap().clone();
                let mut mine = doc.clone();
                let result = match op {
                    0 => mutate(&mut mine, SubdocOp::DictUpsert, path.as_bytes(), n.to_string().as_bytes(), false),
                    1 => mutate(&mut mine, SubdocOp::Delete, path.as_bytes(), b"", false),
                    _ => mutate(&mut mine, SubdocOp::Counter, path.as_bytes(), n.to_string().as_bytes(), false),
                };
                let mut model = doc.clone();
                let expect_ok = match (op, model.pointer_mut(&parent)) {
                    (_, Some(Value::Object(o))) => match op {
                        0 => { o.insert(last, json!(n)); true }
                        1 => o.shift_remove(&last).is_some(),
                        _ => {
                            let cur = o.get(&last).cloned().unwrap_or(json!(0));
                            match (n != 0, cur.as_i64().and_then(|c| c.checked_add(n))) {
                                (true, Some(next)) => { o.insert(last, json!(next)); true }
                                _ => false,
                            }
                        }
                    },
                    _ => false,
                };
                prop_assert_eq!(result.is_ok(), expect_ok, "{:?} {} on {}", op, path, doc);
                if result.is_ok() {
                    prop_assert_eq!(&mine, &model);
                } else {
                    prop_assert_eq!(&mine, &doc, "a failed mutation changed the document");
                }
            }
        }
    }
}
