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
//!
//! Files: `path.rs` parses paths; `raw.rs` reads a path out of a document's text without
//! building its tree; `mutate.rs` changes a parsed tree; this file holds the tree
//! lookups, the virtual attributes and the limits.

mod mutate;
mod path;
mod raw;

pub(crate) use mutate::mutate;
pub(crate) use path::{Component, first_key, parse_path};
pub(crate) use raw::lookup_raw;

use serde_json::{Map, Value};

/// Longest path accepted.
pub(crate) const MAX_PATH_LEN: usize = 1024;
/// Most components a path may have; also the deepest a value may nest.
pub(crate) const MAX_DEPTH: usize = 32;

pub(crate) use epkv_engine_api::{SubdocError, SubdocOp};

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

/// The `$vbucket` virtual attribute (kv_engine `docs/SubDocument.md`): the vBucket's
/// hybrid logical clock, `{"HLC":{"now":"SECONDS","mode":"real"|"logical"}}`, read at
/// `now_nanos` with `max_cas` the vBucket's highest CAS. The clock runs ahead of the wall
/// clock (logical mode) while a CAS was handed out past it. Transactions take their
/// notion of time (expiry of attempts, client records) from it.
pub(crate) fn vbucket_attribute(now_nanos: u64, max_cas: u64) -> Value {
    let (hlc, mode) = if max_cas > now_nanos {
        (max_cas, "logical")
    } else {
        (now_nanos, "real")
    };
    serde_json::json!({"HLC": {"now": (hlc / 1_000_000_000).to_string(), "mode": mode}})
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
        k if k == "$document" || k == "$XTOC" || k == "$vbucket" => lookup(vattrs, op, path),
        k if k.starts_with('$') => Err(SubdocError::UnknownVattr),
        _ => lookup(attrs, op, path),
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

#[cfg(test)]
mod tests;
