//! Changing a document's tree at a path: every mutation opcode (dict and array
//! changes, counters, deletes), applied to a parsed `Value`.

use super::path::{Component, parse_path, split_last};
use super::{MAX_DEPTH, SubdocError, SubdocOp, depth, find_mut, index_of, parse_value};
use serde_json::Value;

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
