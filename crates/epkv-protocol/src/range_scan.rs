//! Range scan payloads (RANGE_SCAN_CREATE 0xda, RANGE_SCAN_CONTINUE 0xdb,
//! RANGE_SCAN_CANCEL 0xdc), as kv_engine's `docs/range_scans/` define them.
//!
//! - **Create**: the value is a JSON object ([`CreateRequest::parse`]): `collection` (hex
//!   id, default 0), `key_only`, `include_xattrs`, one of `range` (`start` or
//!   `excl_start`, and `end` or `excl_end`, base64 keys of at most 250 bytes) and
//!   `sampling` (`samples`, optional `seed`), optional `snapshot_requirements`
//!   (`vb_uuid` as a decimal string, `seqno`, optional `seqno_exists` and `timeout_ms`)
//!   and an optional `name` (at most 50 bytes). Unknown keys are ignored. The reply's
//!   value is the scan's 16-byte id.
//! - **Continue**: 28 bytes of extras ([`ContinueRequest::decode`]): the id, then the
//!   item, time (ms) and byte limits (0 = none), big-endian. The reply is one or more
//!   responses, each with 4 bytes of extras ([`FLAGS_KEYS`] or [`FLAGS_DOCUMENTS`]) and a
//!   value packing many keys ([`put_key`]: LEB128 length, key) or documents
//!   ([`put_document`]: 25 bytes of metadata, then key and value each LEB128
//!   length-prefixed). The last response's status says how the continue ended:
//!   [`Status::RangeScanMore`](crate::Status::RangeScanMore) or
//!   [`Status::RangeScanComplete`](crate::Status::RangeScanComplete); the ones before it
//!   are Success.
//! - **Cancel**: 16 bytes of extras, the id.
//!
//! Unlike the rest of this crate, [`CreateRequest::parse`] allocates (it parses JSON and
//! decodes base64): the front end calls it from the create handler, after
//! [`crate::Command::decode`] has checked the packet's shape.

use epkv_types::MAX_KEY_LEN;
use epkv_types::doc_key::{MAX_LEB128_LEN, leb128_decode, leb128_encode};

/// Bytes of a scan id.
pub const SCAN_ID_LEN: usize = 16;
/// Bytes of RANGE_SCAN_CONTINUE's extras.
pub const CONTINUE_EXTRAS_LEN: usize = 28;
/// Longest `name` a create may give (kv_engine `cb::rangescan::MaximumNameSize`).
pub const MAX_NAME_LEN: usize = 50;
/// Continue response flags: the value holds keys only.
pub const FLAGS_KEYS: u32 = 0;
/// Continue response flags: the value holds documents (metadata, key and value).
pub const FLAGS_DOCUMENTS: u32 = 1;
/// Bytes of a document's fixed metadata in a continue response: flags (4), expiry (4),
/// seqno (8), CAS (8), datatype (1).
pub const DOCUMENT_META_LEN: usize = 25;

/// One end of a key range: the key (raw, without its collection) and whether the range
/// includes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyBound {
    /// The range includes the key (`start`, `end`).
    Inclusive(Vec<u8>),
    /// The range excludes the key (`excl_start`, `excl_end`).
    Exclusive(Vec<u8>),
}

impl KeyBound {
    /// The key.
    #[must_use]
    pub fn key(&self) -> &[u8] {
        match self {
            Self::Inclusive(k) | Self::Exclusive(k) => k,
        }
    }
}

/// What a create asks for: a key range or a random sample of the collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanKind {
    /// Every key from `start` to `end`.
    Range {
        /// The first key.
        start: KeyBound,
        /// The last key.
        end: KeyBound,
    },
    /// `samples` keys drawn at random (all of them when the collection has fewer), with
    /// a seeded generator.
    Sampling {
        /// How many keys.
        samples: u64,
        /// The generator's seed (0 when the client gave none).
        seed: u32,
    },
}

/// The `snapshot_requirements` of a create: what the vBucket must have before the scan
/// opens (the SDKs' `consistent_with`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotRequirements {
    /// The vBucket uuid the client's mutation tokens name; another one answers
    /// VbUuidNotEqual.
    pub vb_uuid: u64,
    /// The seqno that must be persisted.
    pub seqno: u64,
    /// The document written at `seqno` must still be stored (NotStored otherwise).
    pub seqno_exists: bool,
    /// How long the create waits for `seqno`; `None` fails at once (TempFail).
    pub timeout_ms: Option<u32>,
}

/// A parsed RANGE_SCAN_CREATE value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// The collection scanned.
    pub collection: u32,
    /// Return keys only (`key_only: true`), not documents.
    pub key_only: bool,
    /// The client asked for extended attributes with each document.
    pub include_xattrs: bool,
    /// The range or the sample.
    pub kind: ScanKind,
    /// What the vBucket must have first.
    pub snapshot: Option<SnapshotRequirements>,
    /// A name for logs.
    pub name: Option<String>,
}

/// Why a create value was refused (answered Einval with this text as its error context).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CreateRequestError(pub String);

fn invalid(msg: impl Into<String>) -> CreateRequestError {
    CreateRequestError(msg.into())
}

type Object = serde_json::Map<String, serde_json::Value>;

/// An optional field of `obj`, which must have the type `check` accepts if present.
fn field<'a, T>(
    obj: &'a Object,
    name: &str,
    check: impl FnOnce(&'a serde_json::Value) -> Option<T>,
) -> Result<Option<T>, CreateRequestError> {
    match obj.get(name) {
        None => Ok(None),
        Some(v) => check(v)
            .map(Some)
            .ok_or_else(|| invalid(format!("{name} has the wrong type"))),
    }
}

fn base64_key(name: &str, v: &str) -> Result<Vec<u8>, CreateRequestError> {
    use base64::Engine as _;
    let key = base64::engine::general_purpose::STANDARD
        .decode(v)
        .map_err(|_| invalid(format!("{name} is not base64")))?;
    if key.len() > MAX_KEY_LEN {
        return Err(invalid(format!(
            "{name} is longer than {MAX_KEY_LEN} bytes"
        )));
    }
    Ok(key)
}

fn bound(range: &Object, incl: &str, excl: &str) -> Result<KeyBound, CreateRequestError> {
    let a = field(range, incl, serde_json::Value::as_str)?;
    let b = field(range, excl, serde_json::Value::as_str)?;
    match (a, b) {
        (Some(_), Some(_)) => Err(invalid(format!("range included both {incl} and {excl}"))),
        (None, None) => Err(invalid(format!("range did not include {incl} or {excl}"))),
        (Some(k), None) => Ok(KeyBound::Inclusive(base64_key(incl, k)?)),
        (None, Some(k)) => Ok(KeyBound::Exclusive(base64_key(excl, k)?)),
    }
}

impl CreateRequest {
    /// Parses a RANGE_SCAN_CREATE value.
    ///
    /// # Errors
    /// A [`CreateRequestError`] naming the first rule broken: not a JSON object; a field
    /// of the wrong type; both or neither of `range` and `sampling`; a range end given
    /// twice or not at all; a key that is not base64 or longer than 250 bytes; a
    /// collection id that is not hex; `samples` missing or 0; a `vb_uuid` that is not a
    /// decimal u64; `include_xattrs` with `key_only`; a `name` over 50 bytes.
    pub fn parse(json: &[u8]) -> Result<Self, CreateRequestError> {
        let root: serde_json::Value =
            serde_json::from_slice(json).map_err(|e| invalid(format!("invalid JSON: {e}")))?;
        let root = root
            .as_object()
            .ok_or_else(|| invalid("the value is not a JSON object"))?;
        let collection = match field(root, "collection", serde_json::Value::as_str)? {
            None => 0,
            Some(hex) => u32::from_str_radix(hex.trim_start_matches("0x"), 16)
                .map_err(|_| invalid("Invalid formatting of the collection field"))?,
        };
        let key_only = field(root, "key_only", serde_json::Value::as_bool)?.unwrap_or(false);
        let include_xattrs =
            field(root, "include_xattrs", serde_json::Value::as_bool)?.unwrap_or(false);
        if key_only && include_xattrs {
            return Err(invalid("include_xattrs cannot be set with key_only"));
        }
        let range = field(root, "range", serde_json::Value::as_object)?;
        let sampling = field(root, "sampling", serde_json::Value::as_object)?;
        let kind = match (range, sampling) {
            (Some(_), Some(_)) => return Err(invalid("both range and sampling were given")),
            (None, None) => return Err(invalid("neither range nor sampling was given")),
            (Some(r), None) => ScanKind::Range {
                start: bound(r, "start", "excl_start")?,
                end: bound(r, "end", "excl_end")?,
            },
            (None, Some(s)) => {
                let samples = field(s, "samples", serde_json::Value::as_u64)?
                    .ok_or_else(|| invalid("sampling did not include samples"))?;
                if samples == 0 {
                    return Err(invalid("samples must be at least 1"));
                }
                let seed = field(s, "seed", serde_json::Value::as_u64)?.unwrap_or(0);
                let seed = u32::try_from(seed).map_err(|_| invalid("seed is not a u32"))?;
                ScanKind::Sampling { samples, seed }
            }
        };
        let snapshot = match field(root, "snapshot_requirements", serde_json::Value::as_object)? {
            None => None,
            Some(s) => Some(snapshot_requirements(s)?),
        };
        let name = field(root, "name", serde_json::Value::as_str)?.map(str::to_owned);
        if name.as_ref().is_some_and(|n| n.len() > MAX_NAME_LEN) {
            return Err(invalid(format!("name exceeds {MAX_NAME_LEN} bytes")));
        }
        Ok(Self {
            collection,
            key_only,
            include_xattrs,
            kind,
            snapshot,
            name,
        })
    }
}

fn snapshot_requirements(s: &Object) -> Result<SnapshotRequirements, CreateRequestError> {
    let uuid = field(s, "vb_uuid", serde_json::Value::as_str)?
        .ok_or_else(|| invalid("snapshot_requirements did not include vb_uuid"))?;
    let vb_uuid = uuid
        .parse::<u64>()
        .map_err(|_| invalid("vb_uuid is not a decimal u64"))?;
    let seqno = field(s, "seqno", serde_json::Value::as_u64)?
        .ok_or_else(|| invalid("snapshot_requirements did not include seqno"))?;
    let seqno_exists = field(s, "seqno_exists", serde_json::Value::as_bool)?.unwrap_or(false);
    let timeout_ms = match field(s, "timeout_ms", serde_json::Value::as_u64)? {
        None => None,
        Some(t) => Some(u32::try_from(t).map_err(|_| invalid("timeout_ms is not a u32"))?),
    };
    Ok(SnapshotRequirements {
        vb_uuid,
        seqno,
        seqno_exists,
        timeout_ms,
    })
}

/// RANGE_SCAN_CONTINUE's extras.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContinueRequest {
    /// The scan.
    pub id: [u8; SCAN_ID_LEN],
    /// Most keys or documents to return (0 = no limit).
    pub item_limit: u32,
    /// Most milliseconds to spend (0 = no limit).
    pub time_limit_ms: u32,
    /// Bytes after which no further key or document is added (0 = no limit; the last one
    /// added may pass it).
    pub byte_limit: u32,
}

impl ContinueRequest {
    /// Decodes the extras.
    ///
    /// # Errors
    /// `None` unless `extras` is exactly [`CONTINUE_EXTRAS_LEN`] bytes.
    #[must_use]
    pub fn decode(extras: &[u8]) -> Option<Self> {
        let e: &[u8; CONTINUE_EXTRAS_LEN] = extras.try_into().ok()?;
        let (id, rest) = e.split_first_chunk::<SCAN_ID_LEN>()?;
        let (items, rest) = rest.split_first_chunk::<4>()?;
        let (time, rest) = rest.split_first_chunk::<4>()?;
        let bytes = rest.first_chunk::<4>()?;
        Some(Self {
            id: *id,
            item_limit: u32::from_be_bytes(*items),
            time_limit_ms: u32::from_be_bytes(*time),
            byte_limit: u32::from_be_bytes(*bytes),
        })
    }

    /// Encodes the extras (for clients and tests).
    #[must_use]
    pub fn encode(&self) -> [u8; CONTINUE_EXTRAS_LEN] {
        let mut e = [0u8; CONTINUE_EXTRAS_LEN];
        e[..SCAN_ID_LEN].copy_from_slice(&self.id);
        e[16..20].copy_from_slice(&self.item_limit.to_be_bytes());
        e[20..24].copy_from_slice(&self.time_limit_ms.to_be_bytes());
        e[24..28].copy_from_slice(&self.byte_limit.to_be_bytes());
        e
    }
}

/// A document's metadata in a continue response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DocumentMeta {
    /// Client flags.
    pub flags: u32,
    /// Absolute expiry (Unix seconds, 0 = never).
    pub expiry: u32,
    /// The seqno of the version returned.
    pub seqno: u64,
    /// Its CAS.
    pub cas: u64,
    /// Datatype bits of the value as sent (Snappy means the value is compressed).
    pub datatype: u8,
}

fn put_leb128(out: &mut Vec<u8>, len: usize) {
    let mut buf = [0u8; MAX_LEB128_LEN];
    // Keys and values are far below 4 GiB (the packet limit is smaller still).
    let n = leb128_encode(u32::try_from(len).unwrap_or(u32::MAX), &mut buf);
    out.extend_from_slice(&buf[..n]);
}

/// Appends one key to a keys-only continue value: its LEB128 length, then the key.
pub fn put_key(out: &mut Vec<u8>, key: &[u8]) {
    put_leb128(out, key.len());
    out.extend_from_slice(key);
}

/// Appends one document to a documents continue value: the fixed metadata, then the key
/// and the value, each after its LEB128 length.
pub fn put_document(out: &mut Vec<u8>, meta: &DocumentMeta, key: &[u8], value: &[u8]) {
    out.extend_from_slice(&meta.flags.to_be_bytes());
    out.extend_from_slice(&meta.expiry.to_be_bytes());
    out.extend_from_slice(&meta.seqno.to_be_bytes());
    out.extend_from_slice(&meta.cas.to_be_bytes());
    out.push(meta.datatype);
    put_leb128(out, key.len());
    out.extend_from_slice(key);
    put_leb128(out, value.len());
    out.extend_from_slice(value);
}

/// The bytes [`put_document`] appends for a document.
#[must_use]
pub fn document_len(key: &[u8], value: &[u8]) -> usize {
    DOCUMENT_META_LEN + MAX_LEB128_LEN * 2 + key.len() + value.len()
}

fn take_prefixed(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, n) = leb128_decode(b)?;
    let rest = b.get(n..)?;
    let len = usize::try_from(len).ok()?;
    Some((rest.get(..len)?, rest.get(len..)?))
}

/// Iterates the keys of a keys-only continue value; an item that does not decode ends
/// the iteration with `Err(())`.
pub fn keys(mut value: &[u8]) -> impl Iterator<Item = Result<&[u8], ()>> {
    std::iter::from_fn(move || {
        if value.is_empty() {
            return None;
        }
        match take_prefixed(value) {
            Some((key, rest)) => {
                value = rest;
                Some(Ok(key))
            }
            None => {
                value = &[];
                Some(Err(()))
            }
        }
    })
}

/// One document of a continue value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanDocument<'a> {
    /// Its metadata.
    pub meta: DocumentMeta,
    /// The key.
    pub key: &'a [u8],
    /// The value.
    pub value: &'a [u8],
}

fn take_document(b: &[u8]) -> Option<(ScanDocument<'_>, &[u8])> {
    let (m, rest) = b.split_first_chunk::<DOCUMENT_META_LEN>()?;
    let meta = DocumentMeta {
        flags: u32::from_be_bytes(*m.first_chunk::<4>()?),
        expiry: u32::from_be_bytes(*m.get(4..)?.first_chunk::<4>()?),
        seqno: u64::from_be_bytes(*m.get(8..)?.first_chunk::<8>()?),
        cas: u64::from_be_bytes(*m.get(16..)?.first_chunk::<8>()?),
        datatype: m[24],
    };
    let (key, rest) = take_prefixed(rest)?;
    let (value, rest) = take_prefixed(rest)?;
    Some((ScanDocument { meta, key, value }, rest))
}

/// Iterates the documents of a documents continue value; an item that does not decode
/// ends the iteration with `Err(())`.
pub fn documents(mut value: &[u8]) -> impl Iterator<Item = Result<ScanDocument<'_>, ()>> {
    std::iter::from_fn(move || {
        if value.is_empty() {
            return None;
        }
        match take_document(value) {
            Some((doc, rest)) => {
                value = rest;
                Some(Ok(doc))
            }
            None => {
                value = &[];
                Some(Err(()))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<CreateRequest, CreateRequestError> {
        CreateRequest::parse(s.as_bytes())
    }

    #[test]
    fn a_range_create_decodes_its_keys_and_collection() {
        let r = parse(
            r#"{"collection":"f2","key_only":true,"range":{"start":"dXNlcg==","excl_end":"dXNlcv8="},"name":"n"}"#,
        )
        .unwrap();
        assert_eq!(r.collection, 0xf2);
        assert!(r.key_only);
        assert_eq!(
            r.kind,
            ScanKind::Range {
                start: KeyBound::Inclusive(b"user".to_vec()),
                end: KeyBound::Exclusive(b"user\xff".to_vec()),
            }
        );
        assert_eq!(r.snapshot, None);
        assert_eq!(r.name.as_deref(), Some("n"));
    }

    #[test]
    fn sampling_and_snapshot_requirements_decode() {
        let r = parse(
            r#"{"sampling":{"samples":512,"seed":18111},"snapshot_requirements":{"vb_uuid":"16627788222","seqno":1000,"timeout_ms":2000,"seqno_exists":true}}"#,
        )
        .unwrap();
        assert_eq!(r.collection, 0);
        assert!(!r.key_only);
        assert_eq!(
            r.kind,
            ScanKind::Sampling {
                samples: 512,
                seed: 18111
            }
        );
        assert_eq!(
            r.snapshot,
            Some(SnapshotRequirements {
                vb_uuid: 16_627_788_222,
                seqno: 1000,
                seqno_exists: true,
                timeout_ms: Some(2000),
            })
        );
    }

    #[test]
    fn malformed_creates_are_refused() {
        for bad in [
            "",
            "[]",
            "{}",
            r#"{"range":{"start":"AA=="}}"#,
            r#"{"range":{"start":"AA==","excl_start":"AA==","end":"AA=="}}"#,
            r#"{"range":{"start":"!!","end":"AA=="}}"#,
            r#"{"range":{"start":1,"end":"AA=="}}"#,
            r#"{"range":{"start":"AA==","end":"AA=="},"sampling":{"samples":1}}"#,
            r#"{"sampling":{}}"#,
            r#"{"sampling":{"samples":0}}"#,
            r#"{"sampling":{"samples":1,"seed":-1}}"#,
            r#"{"sampling":{"samples":1},"collection":"xyz"}"#,
            r#"{"sampling":{"samples":1},"collection":8}"#,
            r#"{"sampling":{"samples":1},"key_only":true,"include_xattrs":true}"#,
            r#"{"sampling":{"samples":1},"snapshot_requirements":{"seqno":1}}"#,
            r#"{"sampling":{"samples":1},"snapshot_requirements":{"vb_uuid":"x1","seqno":1}}"#,
            r#"{"sampling":{"samples":1},"snapshot_requirements":{"vb_uuid":1,"seqno":1}}"#,
            r#"{"sampling":{"samples":1},"name":"012345678901234567890123456789012345678901234567890"}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let long = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [b'k'; 251]);
        let json = format!(r#"{{"range":{{"start":"AA==","end":"{long}"}}}}"#);
        assert!(parse(&json).is_err());
    }

    #[test]
    fn continue_extras_round_trip() {
        let c = ContinueRequest {
            id: [7; 16],
            item_limit: 500,
            time_limit_ms: 10,
            byte_limit: 1 << 20,
        };
        assert_eq!(ContinueRequest::decode(&c.encode()), Some(c));
        assert_eq!(ContinueRequest::decode(&c.encode()[..27]), None);
        assert_eq!(ContinueRequest::decode(&[0; 29]), None);
    }

    #[test]
    fn keys_pack_with_leb128_lengths() {
        let long = vec![b'x'; 128];
        let mut v = Vec::new();
        put_key(&mut v, b"key0");
        put_key(&mut v, &long);
        // The documented example: 128 encodes as 0x80 0x01.
        assert_eq!(&v[..5], b"\x04key0");
        assert_eq!(&v[5..7], &[0x80, 0x01]);
        let got: Vec<&[u8]> = keys(&v).map(Result::unwrap).collect();
        assert_eq!(got, vec![&b"key0"[..], &long[..]]);
        assert_eq!(keys(&v[..v.len() - 1]).last(), Some(Err(())));
    }

    #[test]
    fn documents_pack_their_metadata_first() {
        let meta = DocumentMeta {
            flags: 1,
            expiry: 2,
            seqno: 3,
            cas: 4,
            datatype: 1,
        };
        let mut v = Vec::new();
        put_document(&mut v, &meta, b"key0", b"value0");
        assert_eq!(v.len(), 25 + 1 + 4 + 1 + 6);
        assert!(v.len() <= document_len(b"key0", b"value0"));
        assert_eq!(&v[24..30], b"\x01\x04key0");
        put_document(&mut v, &DocumentMeta::default(), b"k", b"");
        let docs: Vec<ScanDocument<'_>> = documents(&v).map(Result::unwrap).collect();
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].meta, meta);
        assert_eq!((docs[0].key, docs[0].value), (&b"key0"[..], &b"value0"[..]));
        assert_eq!((docs[1].key, docs[1].value), (&b"k"[..], &b""[..]));
        assert_eq!(documents(&v[..20]).next(), Some(Err(())));
    }
}
