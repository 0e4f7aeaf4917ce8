//! Extended attributes in the engine: a document's attribute section parsed for change
//! ([`Attrs`]), validation of a section a client sends, and macro expansion
//! (`${Mutation.CAS}`, `${Mutation.seqno}`, `${Mutation.value_crc32c}`, and the document
//! macros `${$document}` and `${$document.PATH}`).
//!
//! A document macro is the value of that path of the `$document` virtual attribute of
//! the version being changed (KV-Engine's input macros, MB-40980, HELLO
//! SubdocDocumentMacroSupport): `"${$document.CAS}"` becomes its CAS as `"0x..."`,
//! `"${$document.exptime}"` a number, `"${$document}"` the whole object. Transactions
//! keep a staged document's old CAS, revision and expiry this way. They are known
//! before the write, so they are written at once.
//!
//! A macro's CAS and seqno are not known until the write's ordering point, after the
//! new version is built and stored. So an expanded macro is first written as a
//! placeholder of the final width (`"0x"` and 16 zeros), its offset in the value is kept
//! in [`Patches`], and the digits are written in place at the ordering point, before the
//! flusher's copy is taken (as KV-Engine expands them in the stored item).
//!
//! CAS and seqno are written as KV-Engine writes them: the 8 bytes in network order read
//! as a little-endian number, in hex (what Sync Gateway's `HexCasToUint64` decodes). The
//! CRC32C is the body's, in hex.

use crate::vbucket::Assigned;
use epkv_engine_api::{EngineStatus, SubdocError, xattr};
use serde_json::{Map, Value};

/// Attribute values nest at most this deep (as document bodies).
const MAX_DEPTH: usize = crate::subdoc::MAX_DEPTH;

/// Marks where a macro goes while the section is built; `NUL` cannot appear unescaped
/// in serialized JSON, and [`Attrs::expand_macros`] refuses input that holds the marker.
const MARK: &str = "\u{0}epkv-macro:";
/// The marker as serde_json writes it.
const MARK_ESCAPED: &[u8] = b"\"\\u0000epkv-macro:";

/// A macro a mutation expands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Macro {
    /// `${Mutation.CAS}`: the mutation's CAS.
    Cas,
    /// `${Mutation.seqno}`: the mutation's seqno.
    Seqno,
    /// `${Mutation.value_crc32c}`: the CRC32C of the new body.
    ValueCrc32c,
}

impl Macro {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "${Mutation.CAS}" => Self::Cas,
            "${Mutation.seqno}" => Self::Seqno,
            "${Mutation.value_crc32c}" => Self::ValueCrc32c,
            _ => return None,
        })
    }

    fn tag(self) -> char {
        match self {
            Self::Cas => 'c',
            Self::Seqno => 's',
            Self::ValueCrc32c => 'v',
        }
    }

    fn from_tag(b: u8) -> Option<Self> {
        Some(match b {
            b'c' => Self::Cas,
            b's' => Self::Seqno,
            b'v' => Self::ValueCrc32c,
            _ => return None,
        })
    }
}

/// Where the CAS and seqno macros of a new value go: offsets of 16 hex digits.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Patches(Vec<(usize, Macro)>);

impl Patches {
    /// Whether there is nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Writes the mutation's CAS and seqno into `value`.
    pub(crate) fn apply(&self, value: &mut [u8], a: &Assigned) {
        for &(at, m) in &self.0 {
            let n = match m {
                Macro::Cas => a.cas.0,
                Macro::Seqno => a.seqno.0,
                Macro::ValueCrc32c => continue,
            };
            let digits = format!("{:016x}", u64::from_le_bytes(n.to_be_bytes()));
            if let Some(dst) = value.get_mut(at..at + 16) {
                dst.copy_from_slice(digits.as_bytes());
            }
        }
    }
}

/// A document's extended attributes, parsed, in their stored order.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Attrs(pub(crate) Map<String, Value>);

impl Attrs {
    /// Parses an attribute section (empty for none).
    ///
    /// # Errors
    /// `Internal` for a malformed section (a stored one never is).
    pub(crate) fn parse(section: &[u8]) -> Result<Self, EngineStatus> {
        let mut map = Map::new();
        for pair in xattr::pairs(section) {
            let (k, v) = pair.map_err(|_| EngineStatus::Internal)?;
            let k = std::str::from_utf8(k).map_err(|_| EngineStatus::Internal)?;
            let v: Value = serde_json::from_slice(v).map_err(|_| EngineStatus::Internal)?;
            map.insert(k.to_owned(), v);
        }
        Ok(Self(map))
    }

    /// Keeps only the system attributes (what a deletion leaves in the tombstone).
    pub(crate) fn retain_system(&mut self) {
        self.0.retain(|k, _| xattr::is_system_key(k.as_bytes()));
    }

    /// The attribute section (empty when there are no attributes), with the CRC32C
    /// macro written (`body_crc`) and the offsets of the CAS and seqno macros, counted
    /// from the start of the section, added to `patches`.
    pub(crate) fn to_section(&self, body_crc: u32, patches: &mut Patches) -> Vec<u8> {
        let mut values = Vec::with_capacity(self.0.len());
        for v in self.0.values() {
            values.push(serde_json::to_vec(v).unwrap_or_else(|_| b"null".to_vec()));
        }
        let section = xattr::encode(
            self.0
                .keys()
                .zip(&values)
                .map(|(k, v)| (k.as_bytes(), v.as_slice())),
        );
        if memchr::memmem::find(&section, MARK_ESCAPED).is_none() {
            return section;
        }
        // Rebuild with each marker replaced by its final text, pair by pair (the pair
        // lengths change).
        let mut pairs: Vec<(&[u8], Vec<u8>)> = Vec::with_capacity(values.len());
        for (k, v) in self.0.keys().zip(&values) {
            pairs.push((k.as_bytes(), expand_markers(v, body_crc)));
        }
        let mut section = xattr::encode(pairs.iter().map(|(k, v)| (*k, v.as_slice())));
        find_placeholders(&mut section, patches);
        section
    }

    /// Replaces, in a value about to be written at an attribute path, every string that
    /// is exactly a macro: a document macro with its value read from `vattrs` (the
    /// virtual attributes of the version being changed, built only when one is used),
    /// a mutation macro with its marker. Returns the value to write.
    ///
    /// # Errors
    /// UnknownMacro for a `${...}` string that is no macro (or that holds the marker);
    /// UnknownVattrMacro for a document macro naming a path `$document` does not have.
    pub(crate) fn expand_macros(
        value: &[u8],
        vattrs: &mut dyn FnMut() -> Value,
    ) -> Result<Vec<u8>, SubdocError> {
        let mut v: Value =
            serde_json::from_slice(value).map_err(|_| SubdocError::ValueCantInsert)?;
        let mut doc = None;
        mark(&mut v, &mut |path| {
            let root = doc.get_or_insert_with(&mut *vattrs);
            let found = crate::subdoc::lookup(root, epkv_engine_api::SubdocOp::Get, path)
                .map_err(|_| SubdocError::UnknownVattrMacro)?;
            serde_json::from_slice(&found).map_err(|_| SubdocError::UnknownVattrMacro)
        })?;
        serde_json::to_vec(&v).map_err(|_| SubdocError::ValueCantInsert)
    }
}

/// The `$document` path a document macro (`${$document}`, `${$document.PATH}`) names.
fn document_macro_path(s: &str) -> Option<&str> {
    let path = s.strip_prefix("${")?.strip_suffix('}')?;
    (path == "$document" || path.starts_with("$document.") || path.starts_with("$document["))
        .then_some(path)
}

fn mark(
    v: &mut Value,
    document: &mut dyn FnMut(&[u8]) -> Result<Value, SubdocError>,
) -> Result<(), SubdocError> {
    match v {
        Value::String(s) => {
            if s.contains(MARK) {
                return Err(SubdocError::UnknownMacro);
            }
            if let Some(path) = document_macro_path(s) {
                *v = document(path.as_bytes())?;
            } else if s.starts_with("${") {
                let m = Macro::parse(s).ok_or(SubdocError::UnknownMacro)?;
                *s = format!("{MARK}{}\u{0}", m.tag());
            }
            Ok(())
        }
        Value::Array(a) => a.iter_mut().try_for_each(|v| mark(v, document)),
        Value::Object(o) => o.values_mut().try_for_each(|v| mark(v, document)),
        _ => Ok(()),
    }
}

/// The placeholder a CAS or seqno macro is written as, then patched.
const PLACEHOLDER: &[u8] = b"\"0x0000000000000000\"";

/// `v` (serialized JSON) with each marker replaced: the CRC32C by its value, the CAS and
/// seqno by a placeholder tagged with a trailing marker byte that
/// [`find_placeholders`] removes.
fn expand_markers(v: &[u8], body_crc: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    let mut rest = v;
    while let Some(at) = memchr::memmem::find(rest, MARK_ESCAPED) {
        out.extend_from_slice(&rest[..at]);
        let after = &rest[at + MARK_ESCAPED.len()..];
        // after: tag, `\u0000`, `"`.
        let tag = after.first().copied().and_then(Macro::from_tag);
        let tail = b"\\u0000\"";
        match tag {
            Some(m) if after.get(1..1 + tail.len()) == Some(&tail[..]) => {
                match m {
                    Macro::ValueCrc32c => {
                        out.extend_from_slice(format!("\"0x{body_crc:08x}\"").as_bytes());
                    }
                    Macro::Cas | Macro::Seqno => {
                        // Recorded by position after encoding: a NUL cannot occur in
                        // serialized JSON, so it tags the placeholder unambiguously.
                        out.push(0);
                        out.push(m.tag() as u8);
                        out.extend_from_slice(PLACEHOLDER);
                    }
                }
                rest = &after[1 + tail.len()..];
            }
            _ => {
                out.extend_from_slice(&rest[..at + MARK_ESCAPED.len()]);
                rest = after;
            }
        }
    }
    out.extend_from_slice(rest);
    out
}

/// Removes the tags [`expand_markers`] left in `section` and records each placeholder's
/// digits in `patches`. The tags are two bytes each, so the section shrinks and pair
/// lengths must be fixed: done by re-encoding.
fn find_placeholders(section: &mut Vec<u8>, patches: &mut Patches) {
    // Values hold NUL tags, which `xattr::pairs` refuses: split by hand.
    let mut out = vec![0u8; 4];
    let mut rest = section.get(4..).unwrap_or_default();
    let mut found = Vec::new();
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let Some(body) = rest.get(4..4 + len) else {
            break;
        };
        let Some(nul) = body.iter().position(|&b| b == 0) else {
            break;
        };
        let (key, value) = (&body[..nul], &body[nul + 1..body.len().saturating_sub(1)]);
        let pair_start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(key);
        out.push(0);
        let mut v = value;
        while let Some(at) = v.iter().position(|&b| b == 0) {
            out.extend_from_slice(&v[..at]);
            if let Some(m) = v.get(at + 1).copied().and_then(Macro::from_tag) {
                // The digits start after `"0x`.
                found.push((out.len() + 3, m));
            }
            v = v.get(at + 2..).unwrap_or_default();
        }
        out.extend_from_slice(v);
        out.push(0);
        let pair_len = u32::try_from(out.len() - pair_start - 4).unwrap_or(u32::MAX);
        out[pair_start..pair_start + 4].copy_from_slice(&pair_len.to_be_bytes());
        rest = &rest[4 + len..];
    }
    let total = u32::try_from(out.len() - 4).unwrap_or(u32::MAX);
    out[..4].copy_from_slice(&total.to_be_bytes());
    *section = out;
    patches.0.extend(found);
}

/// Checks an attribute section a client sent with its value (datatype XATTR): well
/// formed, keys valid and distinct, values JSON no deeper than documents may be.
#[must_use]
pub(crate) fn valid_section(section: &[u8]) -> bool {
    let mut keys: Vec<&[u8]> = Vec::new();
    for pair in xattr::pairs(section) {
        let Ok((k, v)) = pair else { return false };
        if xattr::is_virtual_key(k) || keys.contains(&k) {
            return false;
        }
        match serde_json::from_slice::<Value>(v) {
            Ok(v) if crate::subdoc::depth(&v) <= MAX_DEPTH => {}
            _ => return false,
        }
        keys.push(k);
    }
    true
}

/// The prefix of a binary attribute value's JSON string (KV-Engine's encoding: a client
/// reading the value without BINARY_VALUE sees this string).
const BINARY_PREFIX: &str = "cb-content-base64-encoded:";

/// A binary attribute value as it is stored: a JSON string of [`BINARY_PREFIX`] and the
/// value in base64.
pub(crate) fn encode_binary(value: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let text = format!(
        "{BINARY_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(value)
    );
    // A JSON string of ASCII needs no escapes.
    format!("\"{text}\"").into_bytes()
}

/// The bytes of a stored binary attribute value (`json`, the JSON text at the path).
///
/// # Errors
/// `NotBinaryValue` for anything but a JSON string of [`BINARY_PREFIX`] and base64.
pub(crate) fn decode_binary(json: &[u8]) -> Result<Vec<u8>, SubdocError> {
    use base64::Engine as _;
    let text: String = serde_json::from_slice(json).map_err(|_| SubdocError::NotBinaryValue)?;
    let encoded = text
        .strip_prefix(BINARY_PREFIX)
        .ok_or(SubdocError::NotBinaryValue)?;
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| SubdocError::NotBinaryValue)
}

#[cfg(test)]
mod tests {

    #[test]
    fn binary_values_round_trip_through_kv_engines_string_and_nothing_else_decodes() {
        for bytes in [&b""[..], b"\x00\xff\"\\", b"plain text"] {
            let stored = encode_binary(bytes);
            let text: String = serde_json::from_slice(&stored).unwrap();
            assert!(text.starts_with("cb-content-base64-encoded:"));
            assert_eq!(decode_binary(&stored).unwrap(), bytes);
        }
        for not_binary in [
            &b"1"[..],
            b"\"text\"",
            b"\"cb-content-base64-encoded:***\"",
            b"{}",
        ] {
            assert_eq!(decode_binary(not_binary), Err(SubdocError::NotBinaryValue));
        }
    }

    use super::*;
    use epkv_types::{Cas, Seqno};

    #[test]
    fn parse_and_encode_round_trip_and_system_attributes_survive() {
        let section = xattr::encode([(&b"_sync"[..], &b"{\"rev\":\"1-a\"}"[..]), (b"u", b"[1,2]")]);
        let mut a = Attrs::parse(&section).unwrap();
        assert_eq!(a.to_section(0, &mut Patches::default()), section);
        a.retain_system();
        assert_eq!(
            a.to_section(0, &mut Patches::default()),
            xattr::encode([(&b"_sync"[..], &b"{\"rev\":\"1-a\"}"[..])])
        );
        assert!(valid_section(&section));
        assert!(!valid_section(&xattr::encode([(&b"a"[..], &b"{"[..])])));
        assert!(!valid_section(&xattr::encode([
            (&b"a"[..], &b"1"[..]),
            (b"a", b"2")
        ])));
    }

    #[test]
    fn macros_are_written_at_the_ordering_point() {
        let v = Attrs::expand_macros(
            br#"{"cas":"${Mutation.CAS}","s":["${Mutation.seqno}"],"c":"${Mutation.value_crc32c}","x":"$x"}"#,
            &mut no_document,
        )
        .unwrap();
        let mut a = Attrs::default();
        a.0.insert("_t".into(), serde_json::from_slice(&v).unwrap());
        let mut patches = Patches::default();
        let mut section = a.to_section(0xdead_beef, &mut patches);
        assert_eq!(patches.0.len(), 2);
        let assigned = Assigned {
            seqno: Seqno(0x0102),
            cas: Cas(0x1122_3344_5566_7788),
            new_key_rev: 1,
        };
        patches.apply(&mut section, &assigned);
        let back = Attrs::parse(&section).unwrap();
        assert_eq!(
            back.0["_t"],
            serde_json::json!({
                "cas": "0x8877665544332211",
                "s": ["0x0201000000000000"],
                "c": "0xdeadbeef",
                "x": "$x"
            })
        );
        assert_eq!(
            Attrs::expand_macros(br#""${Mutation.nope}""#, &mut no_document),
            Err(SubdocError::UnknownMacro)
        );
        assert_eq!(
            Attrs::expand_macros(
                "\"\\u0000epkv-macro:c\\u0000\"".as_bytes(),
                &mut no_document
            ),
            Err(SubdocError::UnknownMacro)
        );
    }

    fn no_document() -> Value {
        panic!("no document macro was asked for")
    }

    #[test]
    fn document_macros_are_the_old_versions_virtual_attributes() {
        let built = std::cell::Cell::new(0);
        let mut vattrs = || {
            built.set(built.get() + 1);
            serde_json::json!({"$document": {"CAS": "0x00000000000000ff", "exptime": 7,
                                             "revid": "3"}, "$XTOC": []})
        };
        let v = Attrs::expand_macros(
            br#"{"c":"${$document.CAS}","e":"${$document.exptime}","r":"${$document.revid}",
                "d":"${$document}","m":"${Mutation.CAS}"}"#,
            &mut vattrs,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&v).unwrap();
        assert_eq!(v["c"], "0x00000000000000ff");
        assert_eq!(v["e"], 7);
        assert_eq!(v["r"], "3");
        assert_eq!(v["d"]["revid"], "3");
        assert!(
            v["m"].as_str().unwrap().contains(MARK),
            "a mutation macro waits"
        );
        assert_eq!(built.get(), 1, "the virtual attributes are built once");
        assert_eq!(
            Attrs::expand_macros(br#""${$document.nope}""#, &mut vattrs),
            Err(SubdocError::UnknownVattrMacro)
        );
        for bad in [&br#""${$documents}""#[..], br#""${$XTOC}""#] {
            assert_eq!(
                Attrs::expand_macros(bad, &mut vattrs),
                Err(SubdocError::UnknownMacro),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
