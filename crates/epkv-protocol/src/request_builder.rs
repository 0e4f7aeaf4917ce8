//! Encoding requests: a builder used by `epkv-client`, tests and tools.

use crate::command::{Command, StoreOp};
use crate::durability::DurabilityRequirement;
use crate::frame_info::RequestFrameInfo;
use crate::header::{RequestHeader, check_encodable};
use crate::header_error::EncodeError;
use crate::limits::HEADER_LEN;
use crate::magic::Magic;
use crate::opcode::Opcode;
use bytes::BufMut;
use epkv_types::{Cas, Datatype, Vbid};

/// The largest typed extras section (RANGE_SCAN_CONTINUE: 28 bytes); typed values held
/// inline (OBSERVE_SEQNO's UUID, GET_ERROR_MAP's version) are smaller.
const INLINE_EXTRAS: usize = 28;

/// A short section owned inline (typed commands) or borrowed (raw requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extras<'a> {
    Inline([u8; INLINE_EXTRAS], u8),
    Borrowed(&'a [u8]),
}

impl Extras<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Extras::Inline(buf, len) => &buf[..usize::from(*len)],
            Extras::Borrowed(s) => s,
        }
    }

    fn from_parts(parts: &[&[u8]]) -> Extras<'static> {
        let mut buf = [0u8; INLINE_EXTRAS];
        let mut len = 0;
        for p in parts {
            buf[len..len + p.len()].copy_from_slice(p);
            len += p.len();
        }
        // `len <= INLINE_EXTRAS` (28) by construction of every caller.
        Extras::Inline(buf, len as u8)
    }
}

/// Builds one request packet. Framing extras (durability, PreserveTtl, or raw frames)
/// select magic 0x08; otherwise the packet uses 0x80.
///
/// ```
/// use epkv_protocol::{Opcode, RequestBuilder};
/// use epkv_types::Vbid;
/// let bytes = RequestBuilder::new(Opcode::Get).vbucket(Vbid(526)).key(b"k1").opaque(7).to_vec()?;
/// assert_eq!(bytes.len(), 24 + 2);
/// assert_eq!(bytes[0], 0x80);
/// # Ok::<(), epkv_protocol::EncodeError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBuilder<'a> {
    opcode: u8,
    vbucket: Vbid,
    opaque: u32,
    cas: Cas,
    datatype: Datatype,
    frame_info: RequestFrameInfo,
    raw_frames: &'a [u8],
    force_alt: bool,
    extras: Extras<'a>,
    key: &'a [u8],
    value: Extras<'a>,
}

impl<'a> RequestBuilder<'a> {
    /// Starts a request with `opcode` and every other field empty or zero.
    #[must_use]
    pub fn new(opcode: Opcode) -> RequestBuilder<'a> {
        RequestBuilder::raw(opcode.as_u8())
    }

    /// Starts a request with a raw opcode byte (for testing unknown opcodes).
    #[must_use]
    pub fn raw(opcode: u8) -> RequestBuilder<'a> {
        RequestBuilder {
            opcode,
            vbucket: Vbid(0),
            opaque: 0,
            cas: Cas::ANY,
            datatype: Datatype::RAW,
            frame_info: RequestFrameInfo::default(),
            raw_frames: &[],
            force_alt: false,
            extras: Extras::Borrowed(&[]),
            key: &[],
            value: Extras::Borrowed(&[]),
        }
    }

    /// Starts the request that encodes `cmd` (vbucket and opaque still zero). Decoding
    /// the result with [`Command::decode`] gives back `cmd`.
    #[must_use]
    pub fn from_command(cmd: &Command<'a>) -> RequestBuilder<'a> {
        let b = RequestBuilder::new(cmd.opcode());
        match *cmd {
            Command::Get { key, .. } | Command::GetReplica { key } => b.key(key),
            Command::Store {
                op,
                key,
                value,
                flags,
                expiry,
                datatype,
                cas,
                durability,
                preserve_ttl,
                ..
            } => {
                let b = b.key(key).value(value).datatype(datatype).cas(cas);
                let b = match op {
                    StoreOp::Set | StoreOp::Add | StoreOp::Replace => {
                        b.inline_extras(Extras::from_parts(&[
                            &flags.to_be_bytes(),
                            &expiry.to_be_bytes(),
                        ]))
                    }
                    StoreOp::Append | StoreOp::Prepend => b,
                };
                b.frames(durability, preserve_ttl)
            }
            Command::Delete {
                key,
                cas,
                durability,
                ..
            } => b.key(key).cas(cas).frames(durability, false),
            Command::Arithmetic {
                key,
                delta,
                initial,
                expiry,
                durability,
                preserve_ttl,
                ..
            } => b
                .key(key)
                .inline_extras(Extras::from_parts(&[
                    &delta.to_be_bytes(),
                    &initial.to_be_bytes(),
                    &expiry.to_be_bytes(),
                ]))
                .frames(durability, preserve_ttl),
            Command::Quit { .. }
            | Command::Flush { .. }
            | Command::Noop
            | Command::Version
            | Command::GetVbucket => b,
            Command::Stat { group } => b.key(group),
            Command::Verbosity { level } => {
                b.inline_extras(Extras::from_parts(&[&level.to_be_bytes()]))
            }
            Command::Touch {
                key,
                expiry,
                durability,
            }
            | Command::Gat {
                key,
                expiry,
                durability,
                ..
            } => b
                .key(key)
                .inline_extras(Extras::from_parts(&[&expiry.to_be_bytes()]))
                .frames(durability, false),
            Command::Hello { agent, features } => b.key(agent).value(features.as_bytes()),
            Command::GetLocked {
                key,
                lock_timeout_secs,
            } => {
                let b = b.key(key);
                if lock_timeout_secs == 0 {
                    b
                } else {
                    b.inline_extras(Extras::from_parts(&[&lock_timeout_secs.to_be_bytes()]))
                }
            }
            Command::UnlockKey { key, cas } => b.key(key).cas(cas),
            Command::EvictKey { key } => b.key(key),
            Command::GetMeta { key, version, .. } => {
                let b = b.key(key);
                if version == 0 {
                    b
                } else {
                    b.inline_extras(Extras::from_parts(&[&[version]]))
                }
            }
            Command::Observe { keys } => b.value(keys),
            Command::Subdoc {
                key,
                body,
                path_len,
                path_flags,
                doc_flags,
                expiry,
                user_flags,
                cas,
                durability,
                preserve_ttl,
                ..
            } => {
                let len = u16::try_from(path_len).unwrap_or(u16::MAX).to_be_bytes();
                let exp = expiry.to_be_bytes();
                let flags = [path_flags];
                let doc = [doc_flags];
                let user = user_flags.unwrap_or(0).to_be_bytes();
                let mut parts: Vec<&[u8]> = vec![&len, &flags];
                if expiry != 0 || user_flags.is_some() {
                    parts.push(&exp);
                }
                if user_flags.is_some() {
                    parts.push(&user);
                }
                if doc_flags != 0 {
                    parts.push(&doc);
                }
                b.key(key)
                    .inline_extras(Extras::from_parts(&parts))
                    .value(body)
                    .cas(cas)
                    .frames(durability, preserve_ttl)
            }
            Command::SubdocMultiLookup {
                key,
                doc_flags,
                specs,
            } => {
                let b = b.key(key).value(specs);
                if doc_flags == 0 {
                    b
                } else {
                    b.inline_extras(Extras::from_parts(&[&[doc_flags]]))
                }
            }
            Command::SubdocMultiMutation {
                key,
                doc_flags,
                expiry,
                user_flags,
                specs,
                cas,
                durability,
                preserve_ttl,
            } => {
                let exp = expiry.to_be_bytes();
                let doc = [doc_flags];
                let user = user_flags.unwrap_or(0).to_be_bytes();
                let mut parts: Vec<&[u8]> = Vec::new();
                if expiry != 0 || user_flags.is_some() {
                    parts.push(&exp);
                }
                if user_flags.is_some() {
                    parts.push(&user);
                }
                if doc_flags != 0 {
                    parts.push(&doc);
                }
                b.key(key)
                    .inline_extras(Extras::from_parts(&parts))
                    .value(specs)
                    .cas(cas)
                    .frames(durability, preserve_ttl)
            }
            Command::SetVbucket { state } => {
                b.inline_extras(Extras::from_parts(&[&u32::from(state as u8).to_be_bytes()]))
            }
            Command::AdjustTimeofday { offset_secs } => {
                b.inline_extras(Extras::from_parts(&[&offset_secs.to_be_bytes()]))
            }
            Command::SaslListMechs => b,
            Command::SaslAuth { mechanism, data } | Command::SaslStep { mechanism, data } => {
                b.key(mechanism).value(data)
            }
            Command::SelectBucket { name } => b.key(name),
            Command::ObserveSeqno { vbucket_uuid } => {
                b.inline_value(Extras::from_parts(&[&vbucket_uuid.to_be_bytes()]))
            }
            Command::GetClusterConfig { known_version } => match known_version {
                None => b,
                Some((epoch, rev)) => b.inline_extras(Extras::from_parts(&[
                    &epoch.to_be_bytes(),
                    &rev.to_be_bytes(),
                ])),
            },
            Command::GetErrorMap { version } => {
                b.inline_value(Extras::from_parts(&[&version.to_be_bytes()]))
            }
            Command::GetCollectionsManifest => b,
            Command::GetRandomKey { collection, xattrs } => match (collection, xattrs) {
                (0, false) => b,
                (cid, false) => b.inline_extras(Extras::from_parts(&[&cid.to_be_bytes()])),
                (cid, true) => b.inline_extras(Extras::from_parts(&[&cid.to_be_bytes(), &[0xff]])),
            },
            Command::GetCollectionId { path } | Command::GetScopeId { path } => b.value(path),
            Command::RangeScanCreate { spec } => b.datatype(Datatype::JSON).value(spec),
            Command::RangeScanContinue(c) => b.inline_extras(Extras::from_parts(&[&c.encode()])),
            Command::RangeScanCancel { id } => b.inline_extras(Extras::from_parts(&[&id])),
        }
    }

    fn frames(mut self, durability: Option<DurabilityRequirement>, preserve_ttl: bool) -> Self {
        self.frame_info = RequestFrameInfo {
            durability,
            preserve_ttl,
        };
        self
    }

    fn inline_value(mut self, value: Extras<'static>) -> Self {
        self.value = value;
        self
    }

    fn inline_extras(mut self, extras: Extras<'static>) -> Self {
        self.extras = extras;
        self
    }

    /// Sets the vBucket id.
    #[must_use]
    pub fn vbucket(mut self, vbucket: Vbid) -> Self {
        self.vbucket = vbucket;
        self
    }

    /// Sets the opaque.
    #[must_use]
    pub fn opaque(mut self, opaque: u32) -> Self {
        self.opaque = opaque;
        self
    }

    /// Sets the CAS.
    #[must_use]
    pub fn cas(mut self, cas: Cas) -> Self {
        self.cas = cas;
        self
    }

    /// Sets the datatype bits.
    #[must_use]
    pub fn datatype(mut self, datatype: Datatype) -> Self {
        self.datatype = datatype;
        self
    }

    /// Sets the extras to raw bytes.
    #[must_use]
    pub fn extras(mut self, extras: &'a [u8]) -> Self {
        self.extras = Extras::Borrowed(extras);
        self
    }

    /// Sets the key.
    #[must_use]
    pub fn key(mut self, key: &'a [u8]) -> Self {
        self.key = key;
        self
    }

    /// Sets the value.
    #[must_use]
    pub fn value(mut self, value: &'a [u8]) -> Self {
        self.value = Extras::Borrowed(value);
        self
    }

    /// Adds a durability frame (magic 0x08).
    #[must_use]
    pub fn durability(mut self, durability: DurabilityRequirement) -> Self {
        self.frame_info.durability = Some(durability);
        self
    }

    /// Adds a PreserveTtl frame (magic 0x08).
    #[must_use]
    pub fn preserve_ttl(mut self) -> Self {
        self.frame_info.preserve_ttl = true;
        self
    }

    /// Appends raw framing-extras bytes after the typed frames (magic 0x08); see
    /// [`crate::encode_frame_info`] to build them.
    #[must_use]
    pub fn raw_framing_extras(mut self, frames: &'a [u8]) -> Self {
        self.raw_frames = frames;
        self
    }

    /// Uses magic 0x08 even when there are no framing extras.
    #[must_use]
    pub fn alt_magic(mut self) -> Self {
        self.force_alt = true;
        self
    }

    fn framing_len(&self) -> usize {
        self.frame_info.encoded_len() + self.raw_frames.len()
    }

    /// Returns the header the request encodes with.
    ///
    /// # Errors
    /// [`EncodeError`] when a section does not fit its length field.
    pub fn header(&self) -> Result<RequestHeader, EncodeError> {
        let framing = self.framing_len();
        let extras = self.extras.as_slice();
        let alt = self.force_alt || framing > 0;
        if alt && self.key.len() > usize::from(u8::MAX) {
            return Err(EncodeError::KeyTooLong {
                len: self.key.len(),
                max: usize::from(u8::MAX),
            });
        }
        let (framing_extras_len, extras_len, key_len, body_len) = check_encodable(
            framing,
            extras.len(),
            self.key.len(),
            self.value.as_slice().len(),
        )?;
        Ok(RequestHeader {
            magic: if alt {
                Magic::AltClientRequest
            } else {
                Magic::ClientRequest
            },
            opcode: self.opcode,
            framing_extras_len,
            key_len,
            extras_len,
            datatype: self.datatype,
            vbucket: self.vbucket,
            body_len,
            opaque: self.opaque,
            cas: self.cas,
        })
    }

    /// Returns the encoded length in bytes.
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN
            + self.framing_len()
            + self.extras.as_slice().len()
            + self.key.len()
            + self.value.as_slice().len()
    }

    /// Appends the encoded packet to `out` (a `BytesMut` or `Vec<u8>`). Nothing is
    /// written on error.
    ///
    /// # Errors
    /// [`EncodeError`] when a section does not fit its length field.
    pub fn encode(&self, out: &mut impl BufMut) -> Result<(), EncodeError> {
        let header = self.header()?;
        out.put_slice(&header.encode());
        self.frame_info.encode(out);
        out.put_slice(self.raw_frames);
        out.put_slice(self.extras.as_slice());
        out.put_slice(self.key);
        out.put_slice(self.value.as_slice());
        Ok(())
    }

    /// Returns the encoded packet as a new vector.
    ///
    /// # Errors
    /// [`EncodeError`] when a section does not fit its length field.
    pub fn to_vec(&self) -> Result<Vec<u8>, EncodeError> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode(&mut v)?;
        Ok(v)
    }
}
