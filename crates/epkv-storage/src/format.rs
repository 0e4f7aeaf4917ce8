//! The on-disk encoding of every record of a data file and of the journal, version 2.
//!
//! Version 2 (collections) stores each key as the engine's key with its collection
//! (`epkv_types::doc_key`): a default-collection key as it is, except one that starts with
//! a zero byte, which gets a second one. Version 1 (before collections) stored keys as
//! clients sent them, so the two differ only for keys starting with a zero byte; the store
//! rewrites a version-1 data file at open and escapes such keys in a version-1 journal's
//! batches ([`escape_v1_key`]).
//!
//! Every record is a *frame*: `kind u8 | body_len u32 | crc32c u32 | body`, little endian,
//! where the CRC32C covers the kind byte, the length and the body. The byte-level layout of
//! each body is documented in `docs/storage-format.md`; this module is the one place that
//! writes and reads it. Decoders never panic and never trust a length: every read is
//! bounds-checked, which the `storage_decode` fuzz target exercises.

use crate::types::{Document, FailoverEntry, VbState};
use epkv_types::VBucketState;

/// The format version written in file superblocks and headers.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest format version this build reads (and upgrades).
pub const OLDEST_FORMAT_VERSION: u16 = 1;

/// The version-2 key of a version-1 key: a key starting with a zero byte gets a second
/// one (see the module's documentation); any other key is the same.
#[must_use]
pub fn escape_v1_key(key: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if key.first() == Some(&0) {
        let mut k = Vec::with_capacity(key.len() + 2);
        k.extend_from_slice(&[0, 0]);
        k.extend_from_slice(key);
        std::borrow::Cow::Owned(k)
    } else {
        std::borrow::Cow::Borrowed(key)
    }
}

fn supported(version: u16) -> bool {
    (OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version)
}
/// Bytes of a frame before its body: kind, body length, CRC32C.
pub const FRAME_HEADER_LEN: usize = 9;
/// Largest body a frame may declare (256 MiB); longer lengths are treated as corruption.
pub const MAX_BODY_LEN: u32 = 256 << 20;
/// Magic at the start of a data file's superblock.
pub const DATA_MAGIC: &[u8; 8] = b"EPKVDATA";
/// Magic at the start of a journal's superblock.
pub const JOURNAL_MAGIC: &[u8; 8] = b"EPKVJRNL";
/// Magic of a log file's superblock ([`crate::LogStore`]).
pub const LOG_MAGIC: &[u8; 8] = b"EPKVLOGF";
/// Magic ending every header body (`EPKH` in ASCII, read as a little-endian u32).
pub const HEADER_TRAILER_MAGIC: u32 = u32::from_le_bytes(*b"EPKH");
/// Bytes of the trailer that ends a header body: total frame length u32, magic u32.
pub const HEADER_TRAILER_LEN: usize = 8;
/// Fixed bytes of a document body before its key and value.
pub const DOC_FIXED_LEN: usize = 40;

/// The kind byte of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A document (mutation or tombstone).
    Document = 1,
    /// A block of by-key index entries.
    KeyBlock = 2,
    /// A block of by-seqno index entries.
    SeqBlock = 3,
    /// An index segment: the directories of its key and seqno blocks.
    Segment = 4,
    /// A commit header: vBucket state and the live index segments.
    Header = 5,
    /// The superblock at offset 0 of a data file.
    DataSuperblock = 6,
    /// The superblock at offset 0 of a journal.
    JournalSuperblock = 7,
    /// One flush batch in the journal.
    JournalBatch = 8,
    /// The superblock at offset 0 of a log file ([`crate::LogStore`]).
    LogSuperblock = 9,
    /// The head of a batch in a log file: per vBucket its incarnation, state and how many
    /// [`RecordKind::Document`] frames follow ([`LogHead`]).
    LogHead = 10,
    /// A vBucket deleted from a log store ([`LogVbDelete`]).
    LogVbDelete = 11,
    /// Documents a log store's compaction purged, with the vBucket's new state
    /// ([`LogPurge`]).
    LogPurge = 12,
}

impl RecordKind {
    /// Returns the kind for its byte, or `None` for an unknown byte.
    #[must_use]
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Document,
            2 => Self::KeyBlock,
            3 => Self::SeqBlock,
            4 => Self::Segment,
            5 => Self::Header,
            6 => Self::DataSuperblock,
            7 => Self::JournalSuperblock,
            8 => Self::JournalBatch,
            9 => Self::LogSuperblock,
            10 => Self::LogHead,
            11 => Self::LogVbDelete,
            12 => Self::LogPurge,
            _ => return None,
        })
    }
}

/// Why bytes could not be decoded. Callers wrap it with the file and offset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes end before the record does.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The checksum does not match.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// CRC32C in the frame.
        stored: u32,
        /// CRC32C of the bytes.
        computed: u32,
    },
    /// An unknown kind byte or a kind other than the one expected.
    #[error("unexpected record kind {0}")]
    Kind(u8),
    /// A length field larger than allowed.
    #[error("length {0} out of range")]
    Length(u64),
    /// A field holds an invalid value.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// A format version this build does not read.
    #[error("unsupported format version {0}")]
    Version(u16),
}

/// Appends a frame holding `body` to `out`.
pub fn put_frame(out: &mut Vec<u8>, kind: RecordKind, body: &[u8]) {
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut head = [0u8; 5];
    head[0] = kind as u8;
    head[1..5].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head), body);
    out.extend_from_slice(&head);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(body);
}

/// Appends a frame whose body `encode` writes straight into `out` (no copy of the body):
/// the header is reserved first and filled in, with the CRC, afterwards.
pub fn put_frame_with(out: &mut Vec<u8>, kind: RecordKind, encode: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    encode(out);
    let body_len = out.len() - start - FRAME_HEADER_LEN;
    let len = u32::try_from(body_len).unwrap_or(u32::MAX);
    let mut head = [0u8; 5];
    head[0] = kind as u8;
    head[1..5].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&head), &out[start + FRAME_HEADER_LEN..]);
    out[start..start + 5].copy_from_slice(&head);
    out[start + 5..start + FRAME_HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// Parses a frame header: returns the kind byte, the body length and the stored CRC.
///
/// # Errors
/// [`DecodeError::Truncated`] if fewer than [`FRAME_HEADER_LEN`] bytes are given,
/// [`DecodeError::Length`] if the body length exceeds [`MAX_BODY_LEN`].
pub fn parse_frame_header(buf: &[u8]) -> Result<(u8, u32, u32), DecodeError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Err(DecodeError::Truncated {
            need: FRAME_HEADER_LEN,
            have: buf.len(),
        });
    }
    let kind = buf[0];
    let len = u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]);
    let crc = u32::from_le_bytes([buf[5], buf[6], buf[7], buf[8]]);
    if len > MAX_BODY_LEN {
        return Err(DecodeError::Length(u64::from(len)));
    }
    Ok((kind, len, crc))
}

/// The frame at the start of `buf`, unchecked: its kind byte, its stored CRC, its body
/// and its total length.
fn frame_parts(buf: &[u8]) -> Result<(u8, u32, &[u8], usize), DecodeError> {
    let (kind, len, stored) = parse_frame_header(buf)?;
    let total = FRAME_HEADER_LEN + len as usize;
    if buf.len() < total {
        return Err(DecodeError::Truncated {
            need: total,
            have: buf.len(),
        });
    }
    Ok((kind, stored, &buf[FRAME_HEADER_LEN..total], total))
}

/// Decodes the frame at the start of `buf`: returns its kind, its body and its total length.
///
/// # Errors
/// A truncated frame, a bad length, an unknown kind or a checksum mismatch.
pub fn decode_frame(buf: &[u8]) -> Result<(RecordKind, &[u8], usize), DecodeError> {
    let (kind, stored, body, total) = frame_parts(buf)?;
    let computed = crc32c::crc32c_append(crc32c::crc32c(&buf[..5]), body);
    if computed != stored {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let kind = RecordKind::from_u8(kind).ok_or(DecodeError::Kind(kind))?;
    Ok((kind, body, total))
}

/// Splits off the frame at the start of `buf` without checking its CRC: returns its kind,
/// its body and its total length. For a reader that will verify only some frames
/// ([`verify_frame`]): log cleaning checks only the records it copies.
///
/// # Errors
/// A truncated frame, a bad length or an unknown kind.
pub fn split_frame(buf: &[u8]) -> Result<(RecordKind, &[u8], usize), DecodeError> {
    let (kind, _, body, total) = frame_parts(buf)?;
    let kind = RecordKind::from_u8(kind).ok_or(DecodeError::Kind(kind))?;
    Ok((kind, body, total))
}

/// Checks the CRC of `frame`, one whole frame as [`split_frame`] measured it.
///
/// # Errors
/// As [`decode_frame`].
pub fn verify_frame(frame: &[u8]) -> Result<(), DecodeError> {
    decode_frame(frame).map(|_| ())
}

/// Decodes a frame that must be of kind `want`.
///
/// # Errors
/// As [`decode_frame`], plus [`DecodeError::Kind`] for another kind.
pub fn decode_frame_of(buf: &[u8], want: RecordKind) -> Result<&[u8], DecodeError> {
    let (kind, body, _) = decode_frame(buf)?;
    if kind != want {
        return Err(DecodeError::Kind(kind as u8));
    }
    Ok(body)
}

/// A bounds-checked little-endian reader over a body.
#[derive(Debug)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(DecodeError::Length(n as u64))?;
        if end > self.buf.len() {
            return Err(DecodeError::Truncated {
                need: end,
                have: self.buf.len(),
            });
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// Checks that a count of items of at least `min_item` bytes each can fit.
    pub(crate) fn count(&mut self, n: u64, min_item: usize) -> Result<usize, DecodeError> {
        let n_us = usize::try_from(n).map_err(|_| DecodeError::Length(n))?;
        if n_us.saturating_mul(min_item.max(1)) > self.remaining() {
            return Err(DecodeError::Length(n));
        }
        Ok(n_us)
    }
    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(DecodeError::Invalid("trailing bytes"))
        }
    }
}

fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}
fn len_u16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Encodes a document body (without its frame).
pub fn encode_document(out: &mut Vec<u8>, doc: &Document) {
    put_u64(out, doc.seqno);
    put_u64(out, doc.cas);
    put_u64(out, doc.rev_seqno);
    put_u32(out, doc.flags);
    put_u32(out, doc.expiry);
    out.push(doc.datatype);
    out.push(u8::from(doc.deleted));
    put_u16(out, len_u16(doc.key.len()));
    put_u32(out, len_u32(doc.value.len()));
    out.extend_from_slice(&doc.key);
    out.extend_from_slice(&doc.value);
}

/// Decodes a document body.
///
/// # Errors
/// If the body is truncated, has trailing bytes or an invalid deleted flag.
pub fn decode_document(body: &[u8]) -> Result<Document, DecodeError> {
    let mut c = Cursor::new(body);
    let doc = read_document(&mut c)?;
    c.finish()?;
    Ok(doc)
}

fn read_document(c: &mut Cursor<'_>) -> Result<Document, DecodeError> {
    let seqno = c.u64()?;
    let cas = c.u64()?;
    let rev_seqno = c.u64()?;
    let flags = c.u32()?;
    let expiry = c.u32()?;
    let datatype = c.u8()?;
    let deleted = match c.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError::Invalid("deleted flag")),
    };
    let klen = c.u16()? as usize;
    let vlen = c.u32()? as usize;
    let key = c.bytes(klen)?.to_vec();
    let value = bytes::Bytes::copy_from_slice(c.bytes(vlen)?);
    Ok(Document {
        key,
        value,
        seqno,
        cas,
        rev_seqno,
        flags,
        expiry,
        datatype,
        deleted,
    })
}

/// Encodes the vBucket-state part shared by headers and journal batches.
pub(crate) fn encode_vbstate(out: &mut Vec<u8>, s: &VbState) {
    out.push(s.state as u8);
    put_u64(out, s.high_seqno);
    put_u64(out, s.persisted_seqno);
    put_u64(out, s.purge_seqno);
    put_u64(out, s.max_cas);
    put_u64(out, s.high_prepared_seqno);
    put_u64(out, s.high_completed_seqno);
    put_u16(out, len_u16(s.failover_log.len()));
    for e in s.failover_log.iter().take(usize::from(u16::MAX)) {
        put_u64(out, e.uuid);
        put_u64(out, e.seqno);
    }
}

pub(crate) fn read_vbstate(c: &mut Cursor<'_>) -> Result<VbState, DecodeError> {
    let state = VBucketState::from_u8(c.u8()?).ok_or(DecodeError::Invalid("vbucket state"))?;
    let high_seqno = c.u64()?;
    let persisted_seqno = c.u64()?;
    let purge_seqno = c.u64()?;
    let max_cas = c.u64()?;
    let high_prepared_seqno = c.u64()?;
    let high_completed_seqno = c.u64()?;
    let n = c.u16()?;
    let n = c.count(u64::from(n), 16)?;
    let mut failover_log = Vec::with_capacity(n);
    for _ in 0..n {
        failover_log.push(FailoverEntry {
            uuid: c.u64()?,
            seqno: c.u64()?,
        });
    }
    Ok(VbState {
        state,
        high_seqno,
        persisted_seqno,
        purge_seqno,
        max_cas,
        high_prepared_seqno,
        high_completed_seqno,
        failover_log,
    })
}

/// One by-key index entry: where the newest version of a key (in its segment) lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// The document key.
    pub key: Vec<u8>,
    /// The document's seqno.
    pub seqno: u64,
    /// Offset of the document's frame in the data file.
    pub offset: u64,
    /// Total length of the document's frame.
    pub len: u32,
    /// True for a tombstone.
    pub deleted: bool,
}

/// One by-seqno index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqEntry {
    /// The document's seqno.
    pub seqno: u64,
    /// Offset of the document's frame in the data file.
    pub offset: u64,
    /// Total length of the document's frame.
    pub len: u32,
}

/// Encodes a key block body.
pub fn encode_key_block(out: &mut Vec<u8>, entries: &[KeyEntry]) {
    put_u32(out, len_u32(entries.len()));
    for e in entries {
        put_u16(out, len_u16(e.key.len()));
        out.extend_from_slice(&e.key);
        put_u64(out, e.seqno);
        put_u64(out, e.offset);
        put_u32(out, e.len);
        out.push(u8::from(e.deleted));
    }
}

/// Decodes a key block body.
///
/// # Errors
/// On any truncation, bad count or bad flag.
pub fn decode_key_block(body: &[u8]) -> Result<Vec<KeyEntry>, DecodeError> {
    let mut c = Cursor::new(body);
    let n = c.u32()?;
    let n = c.count(u64::from(n), 23)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let klen = c.u16()? as usize;
        let key = c.bytes(klen)?.to_vec();
        let seqno = c.u64()?;
        let offset = c.u64()?;
        let len = c.u32()?;
        let deleted = match c.u8()? {
            0 => false,
            1 => true,
            _ => return Err(DecodeError::Invalid("deleted flag")),
        };
        v.push(KeyEntry {
            key,
            seqno,
            offset,
            len,
            deleted,
        });
    }
    c.finish()?;
    Ok(v)
}

/// Encodes a seqno block body.
pub fn encode_seq_block(out: &mut Vec<u8>, entries: &[SeqEntry]) {
    put_u32(out, len_u32(entries.len()));
    for e in entries {
        put_u64(out, e.seqno);
        put_u64(out, e.offset);
        put_u32(out, e.len);
    }
}

/// Decodes a seqno block body.
///
/// # Errors
/// On any truncation or bad count.
pub fn decode_seq_block(body: &[u8]) -> Result<Vec<SeqEntry>, DecodeError> {
    let mut c = Cursor::new(body);
    let n = c.u32()?;
    let n = c.count(u64::from(n), 20)?;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(SeqEntry {
            seqno: c.u64()?,
            offset: c.u64()?,
            len: c.u32()?,
        });
    }
    c.finish()?;
    Ok(v)
}

/// Where a block lives and what it starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRef {
    /// For key blocks, the first key; empty for seqno blocks.
    pub first_key: Vec<u8>,
    /// For seqno blocks, the first seqno; 0 for key blocks.
    pub first_seqno: u64,
    /// Offset of the block's frame.
    pub offset: u64,
    /// Total length of the block's frame.
    pub len: u32,
    /// Entries in the block.
    pub count: u32,
}

/// An index segment's directory: the part of the index kept in memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SegmentDir {
    /// Distinct keys in the segment.
    pub items: u64,
    /// Smallest seqno in the segment.
    pub min_seqno: u64,
    /// Largest seqno in the segment.
    pub max_seqno: u64,
    /// Key blocks in key order.
    pub key_blocks: Vec<BlockRef>,
    /// Seqno blocks in seqno order.
    pub seq_blocks: Vec<BlockRef>,
}

/// Encodes a segment body.
pub fn encode_segment(out: &mut Vec<u8>, s: &SegmentDir) {
    put_u64(out, s.items);
    put_u64(out, s.min_seqno);
    put_u64(out, s.max_seqno);
    put_u32(out, len_u32(s.key_blocks.len()));
    for b in &s.key_blocks {
        put_u16(out, len_u16(b.first_key.len()));
        out.extend_from_slice(&b.first_key);
        put_u64(out, b.offset);
        put_u32(out, b.len);
        put_u32(out, b.count);
    }
    put_u32(out, len_u32(s.seq_blocks.len()));
    for b in &s.seq_blocks {
        put_u64(out, b.first_seqno);
        put_u64(out, b.offset);
        put_u32(out, b.len);
        put_u32(out, b.count);
    }
}

/// Decodes a segment body.
///
/// # Errors
/// On any truncation or bad count.
pub fn decode_segment(body: &[u8]) -> Result<SegmentDir, DecodeError> {
    let mut c = Cursor::new(body);
    let items = c.u64()?;
    let min_seqno = c.u64()?;
    let max_seqno = c.u64()?;
    let nk = c.u32()?;
    let nk = c.count(u64::from(nk), 18)?;
    let mut key_blocks = Vec::with_capacity(nk);
    for _ in 0..nk {
        let klen = c.u16()? as usize;
        let first_key = c.bytes(klen)?.to_vec();
        key_blocks.push(BlockRef {
            first_key,
            first_seqno: 0,
            offset: c.u64()?,
            len: c.u32()?,
            count: c.u32()?,
        });
    }
    let ns = c.u32()?;
    let ns = c.count(u64::from(ns), 24)?;
    let mut seq_blocks = Vec::with_capacity(ns);
    for _ in 0..ns {
        seq_blocks.push(BlockRef {
            first_key: Vec::new(),
            first_seqno: c.u64()?,
            offset: c.u64()?,
            len: c.u32()?,
            count: c.u32()?,
        });
    }
    c.finish()?;
    Ok(SegmentDir {
        items,
        min_seqno,
        max_seqno,
        key_blocks,
        seq_blocks,
    })
}

/// A commit header, the commit point of a data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Commits applied to this vBucket so far (1 for the first); the journal uses it to
    /// tell which batches a data file already holds.
    pub commit_id: u64,
    /// The vBucket state as of this commit.
    pub state: VbState,
    /// Live index segments, oldest first: (frame offset, frame length).
    pub segments: Vec<(u64, u32)>,
}

/// Encodes a whole header frame (frame, body and trailer) into `out`.
pub fn put_header(out: &mut Vec<u8>, h: &Header) {
    let mut body = Vec::with_capacity(128 + h.segments.len() * 12);
    put_u16(&mut body, FORMAT_VERSION);
    put_u64(&mut body, h.commit_id);
    encode_vbstate(&mut body, &h.state);
    put_u16(&mut body, len_u16(h.segments.len()));
    for (off, len) in h.segments.iter().take(usize::from(u16::MAX)) {
        put_u64(&mut body, *off);
        put_u32(&mut body, *len);
    }
    let total = FRAME_HEADER_LEN + body.len() + HEADER_TRAILER_LEN;
    put_u32(&mut body, len_u32(total));
    put_u32(&mut body, HEADER_TRAILER_MAGIC);
    put_frame(out, RecordKind::Header, &body);
}

/// Decodes a header body (including its trailer).
///
/// # Errors
/// On truncation, an unknown version, a bad state or a bad trailer.
pub fn decode_header(body: &[u8]) -> Result<Header, DecodeError> {
    let mut c = Cursor::new(body);
    let version = c.u16()?;
    if !supported(version) {
        return Err(DecodeError::Version(version));
    }
    let commit_id = c.u64()?;
    let state = read_vbstate(&mut c)?;
    let n = c.u16()?;
    let n = c.count(u64::from(n), 12)?;
    let mut segments = Vec::with_capacity(n);
    for _ in 0..n {
        segments.push((c.u64()?, c.u32()?));
    }
    let total = c.u32()?;
    let magic = c.u32()?;
    c.finish()?;
    if magic != HEADER_TRAILER_MAGIC {
        return Err(DecodeError::Invalid("header trailer magic"));
    }
    if total as usize != FRAME_HEADER_LEN + body.len() {
        return Err(DecodeError::Invalid("header trailer length"));
    }
    Ok(Header {
        commit_id,
        state,
        segments,
    })
}

/// Encodes a superblock frame (data file or journal) of this format version.
pub fn put_superblock(out: &mut Vec<u8>, kind: RecordKind, id: u16, rev: u64) {
    put_superblock_version(out, kind, id, rev, FORMAT_VERSION);
}

/// Encodes a superblock frame of format `version` (a data file created while a format-1
/// journal is replayed is format 1 until upgraded).
pub fn put_superblock_version(
    out: &mut Vec<u8>,
    kind: RecordKind,
    id: u16,
    rev: u64,
    version: u16,
) {
    let mut body = Vec::with_capacity(20);
    let magic = superblock_magic(kind);
    body.extend_from_slice(magic);
    put_u16(&mut body, version);
    put_u16(&mut body, id);
    put_u64(&mut body, rev);
    put_frame(out, kind, &body);
}

fn superblock_magic(kind: RecordKind) -> &'static [u8; 8] {
    match kind {
        RecordKind::JournalSuperblock => JOURNAL_MAGIC,
        RecordKind::LogSuperblock => LOG_MAGIC,
        _ => DATA_MAGIC,
    }
}

/// Length of a superblock frame.
pub const SUPERBLOCK_LEN: usize = FRAME_HEADER_LEN + 20;

/// Decodes a superblock body: returns (id, rev, format version).
///
/// # Errors
/// On a bad magic, an unknown version or truncation.
pub fn decode_superblock(body: &[u8], kind: RecordKind) -> Result<(u16, u64, u16), DecodeError> {
    let mut c = Cursor::new(body);
    let magic = c.bytes(8)?;
    if magic != superblock_magic(kind) {
        return Err(DecodeError::Invalid("superblock magic"));
    }
    let version = c.u16()?;
    if !supported(version) {
        return Err(DecodeError::Version(version));
    }
    let id = c.u16()?;
    let rev = c.u64()?;
    c.finish()?;
    Ok((id, rev, version))
}

/// One vBucket's part of a journal batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    /// The vBucket.
    pub vbid: u16,
    /// The commit id this entry becomes in the data file.
    pub commit_id: u64,
    /// The vBucket state committed with it.
    pub state: VbState,
    /// The documents, de-duplicated by key, in seqno order (shared with the commit that
    /// gave them, see [`crate::VbCommit::docs`]).
    pub docs: std::sync::Arc<Vec<Document>>,
}

/// Encodes a journal batch body for journal generation `generation`.
pub fn encode_journal_batch(out: &mut Vec<u8>, generation: u64, entries: &[JournalEntry]) {
    put_u64(out, generation);
    put_u16(out, len_u16(entries.len()));
    for e in entries {
        put_u16(out, e.vbid);
        put_u64(out, e.commit_id);
        encode_vbstate(out, &e.state);
        put_u32(out, len_u32(e.docs.len()));
        for d in e.docs.iter() {
            encode_document(out, d);
        }
    }
}

/// Decodes a journal batch body: its generation and entries.
///
/// # Errors
/// On any truncation or invalid field.
pub fn decode_journal_batch(body: &[u8]) -> Result<(u64, Vec<JournalEntry>), DecodeError> {
    let mut c = Cursor::new(body);
    let generation = c.u64()?;
    let n = c.u16()?;
    let n = c.count(u64::from(n), 10)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let vbid = c.u16()?;
        let commit_id = c.u64()?;
        let state = read_vbstate(&mut c)?;
        let nd = c.u32()?;
        let nd = c.count(u64::from(nd), DOC_FIXED_LEN)?;
        let mut docs = Vec::with_capacity(nd);
        for _ in 0..nd {
            docs.push(read_document(&mut c)?);
        }
        out.push(JournalEntry {
            vbid,
            commit_id,
            state,
            docs: std::sync::Arc::new(docs),
        });
    }
    c.finish()?;
    Ok((generation, out))
}

/// One vBucket's part of a [`LogHead`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHeadEntry {
    /// The vBucket.
    pub vbid: u16,
    /// Which life of the vBucket this belongs to: a [`LogVbDelete`] ends every incarnation
    /// up to its own, and a vBucket created again gets a higher one.
    pub incarnation: u64,
    /// The vBucket's state, with the sequence number of the commit that set it (a
    /// compaction copying it keeps that number), or `None`.
    pub state: Option<(u64, VbState)>,
    /// How many [`RecordKind::Document`] frames of this vBucket follow (after those of the
    /// entries before it).
    pub docs: u32,
}

/// The head of one batch in a log file; the documents follow as frames of their own, each
/// with its own CRC, so that one can be read alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogHead {
    /// The store's commit sequence number (one per batch, increasing in file order).
    pub seq: u64,
    /// The vBuckets of the batch.
    pub entries: Vec<LogHeadEntry>,
}

/// Encodes a [`LogHead`] body.
pub fn encode_log_head(out: &mut Vec<u8>, h: &LogHead) {
    put_u64(out, h.seq);
    put_u16(out, len_u16(h.entries.len()));
    for e in &h.entries {
        put_u16(out, e.vbid);
        put_u64(out, e.incarnation);
        match &e.state {
            Some((seq, st)) => {
                out.push(1);
                put_u64(out, *seq);
                encode_vbstate(out, st);
            }
            None => out.push(0),
        }
        put_u32(out, e.docs);
    }
}

/// Decodes a [`LogHead`] body.
///
/// # Errors
/// On any truncation or invalid field.
pub fn decode_log_head(body: &[u8]) -> Result<LogHead, DecodeError> {
    let mut c = Cursor::new(body);
    let seq = c.u64()?;
    let n = c.u16()?;
    let n = c.count(u64::from(n), 15)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let vbid = c.u16()?;
        let incarnation = c.u64()?;
        let state = match c.u8()? {
            0 => None,
            1 => Some((c.u64()?, read_vbstate(&mut c)?)),
            _ => return Err(DecodeError::Invalid("log head state flag")),
        };
        let docs = c.u32()?;
        entries.push(LogHeadEntry {
            vbid,
            incarnation,
            state,
            docs,
        });
    }
    c.finish()?;
    Ok(LogHead { seq, entries })
}

/// A vBucket deleted from a log store: every record of it with an incarnation at or below
/// `incarnation` is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogVbDelete {
    /// The vBucket.
    pub vbid: u16,
    /// The last incarnation it ends.
    pub incarnation: u64,
}

/// Encodes a [`LogVbDelete`] body.
pub fn encode_log_vb_delete(out: &mut Vec<u8>, d: &LogVbDelete) {
    put_u16(out, d.vbid);
    put_u64(out, d.incarnation);
}

/// Decodes a [`LogVbDelete`] body.
///
/// # Errors
/// On truncation or trailing bytes.
pub fn decode_log_vb_delete(body: &[u8]) -> Result<LogVbDelete, DecodeError> {
    let mut c = Cursor::new(body);
    let d = LogVbDelete {
        vbid: c.u16()?,
        incarnation: c.u64()?,
    };
    c.finish()?;
    Ok(d)
}

/// Documents purged from a vBucket of a log store by its compaction: each key's versions at
/// or below the seqno given are dead. Carries the state the compaction leaves (its purge
/// seqno raised).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPurge {
    /// The vBucket.
    pub vbid: u16,
    /// Its incarnation.
    pub incarnation: u64,
    /// The commit sequence number of `state`.
    pub seq: u64,
    /// The vBucket's state after the compaction.
    pub state: VbState,
    /// (key, seqno) of each purged document.
    pub keys: Vec<(Vec<u8>, u64)>,
}

/// Encodes a [`LogPurge`] body.
pub fn encode_log_purge(out: &mut Vec<u8>, p: &LogPurge) {
    put_u16(out, p.vbid);
    put_u64(out, p.incarnation);
    put_u64(out, p.seq);
    encode_vbstate(out, &p.state);
    put_u32(out, len_u32(p.keys.len()));
    for (k, s) in &p.keys {
        put_u16(out, len_u16(k.len()));
        out.extend_from_slice(k);
        put_u64(out, *s);
    }
}

/// Decodes a [`LogPurge`] body.
///
/// # Errors
/// On any truncation or invalid field.
pub fn decode_log_purge(body: &[u8]) -> Result<LogPurge, DecodeError> {
    let mut c = Cursor::new(body);
    let vbid = c.u16()?;
    let incarnation = c.u64()?;
    let seq = c.u64()?;
    let state = read_vbstate(&mut c)?;
    let n = c.u32()?;
    let n = c.count(u64::from(n), 10)?;
    let mut keys = Vec::with_capacity(n);
    for _ in 0..n {
        let kl = usize::from(c.u16()?);
        let k = c.bytes(kl)?.to_vec();
        keys.push((k, c.u64()?));
    }
    c.finish()?;
    Ok(LogPurge {
        vbid,
        incarnation,
        seq,
        state,
        keys,
    })
}

/// What a log store's index keeps of a document: read from its body without copying the
/// value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocMeta<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The seqno.
    pub seqno: u64,
    /// Absolute expiry (0 = never).
    pub expiry: u32,
    /// A tombstone.
    pub deleted: bool,
}

/// Reads a document body's key, seqno, expiry and deleted flag, checking that the body is
/// exactly one document.
///
/// # Errors
/// As [`decode_document`].
pub fn decode_document_meta(body: &[u8]) -> Result<DocMeta<'_>, DecodeError> {
    let mut c = Cursor::new(body);
    let seqno = c.u64()?;
    let _cas = c.u64()?;
    let _rev = c.u64()?;
    let _flags = c.u32()?;
    let expiry = c.u32()?;
    let _datatype = c.u8()?;
    let deleted = match c.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError::Invalid("deleted flag")),
    };
    let kl = usize::from(c.u16()?);
    let vl = c.u32()?;
    let key = c.bytes(kl)?;
    c.bytes(usize::try_from(vl).map_err(|_| DecodeError::Length(u64::from(vl)))?)?;
    c.finish()?;
    Ok(DocMeta {
        key,
        seqno,
        expiry,
        deleted,
    })
}

/// Decodes any single frame and its body, for the fuzz target: must never panic.
///
/// # Errors
/// Whatever the frame or body decoder reports.
pub fn decode_any(buf: &[u8]) -> Result<RecordKind, DecodeError> {
    let (kind, body, _) = decode_frame(buf)?;
    match kind {
        RecordKind::Document => decode_document(body).map(drop),
        RecordKind::KeyBlock => decode_key_block(body).map(drop),
        RecordKind::SeqBlock => decode_seq_block(body).map(drop),
        RecordKind::Segment => decode_segment(body).map(drop),
        RecordKind::Header => decode_header(body).map(drop),
        RecordKind::DataSuperblock | RecordKind::JournalSuperblock | RecordKind::LogSuperblock => {
            decode_superblock(body, kind).map(drop)
        }
        RecordKind::JournalBatch => decode_journal_batch(body).map(drop),
        RecordKind::LogHead => decode_log_head(body).map(drop),
        RecordKind::LogVbDelete => decode_log_vb_delete(body).map(drop),
        RecordKind::LogPurge => decode_log_purge(body).map(drop),
    }?;
    Ok(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(key: &str, seqno: u64) -> Document {
        Document {
            key: key.as_bytes().to_vec(),
            value: (vec![7; 5]).into(),
            seqno,
            cas: 99,
            rev_seqno: 3,
            flags: 0xdead_beef,
            expiry: 12,
            datatype: 1,
            deleted: false,
        }
    }

    #[test]
    fn frames_round_trip_and_detect_bit_flips() {
        let mut body = Vec::new();
        encode_document(&mut body, &doc("k", 4));
        let mut f = Vec::new();
        put_frame(&mut f, RecordKind::Document, &body);
        let (k, b, n) = decode_frame(&f).unwrap();
        assert_eq!((k, n), (RecordKind::Document, f.len()));
        assert_eq!(decode_document(b).unwrap(), doc("k", 4));
        for i in 0..f.len() {
            let mut g = f.clone();
            g[i] ^= 0x10;
            assert!(decode_frame(&g).is_err(), "flip at {i} undetected");
        }
        assert!(matches!(
            decode_frame(&f[..f.len() - 1]),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn split_frame_skips_the_crc_and_verify_frame_checks_it() {
        let mut body = Vec::new();
        encode_document(&mut body, &doc("k", 4));
        let mut f = Vec::new();
        put_frame(&mut f, RecordKind::Document, &body);
        f.extend_from_slice(b"next");
        let (k, b, n) = split_frame(&f).unwrap();
        assert_eq!((k, b, n), (RecordKind::Document, &body[..], f.len() - 4));
        verify_frame(&f[..n]).unwrap();
        // A flipped body bit passes the split and fails the check.
        let mut g = f.clone();
        g[FRAME_HEADER_LEN + 2] ^= 1;
        assert_eq!(split_frame(&g).unwrap().2, n);
        assert!(matches!(
            verify_frame(&g[..n]),
            Err(DecodeError::Checksum { .. })
        ));
        // Lengths and kinds are still checked.
        assert!(matches!(
            split_frame(&f[..n - 1]),
            Err(DecodeError::Truncated { .. })
        ));
        g[0] = 0xee;
        assert!(matches!(split_frame(&g), Err(DecodeError::Kind(0xee))));
    }

    #[test]
    fn a_frame_encoded_in_place_is_the_same_bytes() {
        let mut body = Vec::new();
        encode_document(&mut body, &doc("key", 9));
        let mut a = vec![1, 2, 3];
        put_frame(&mut a, RecordKind::Document, &body);
        let mut b = vec![1, 2, 3];
        put_frame_with(&mut b, RecordKind::Document, |out| {
            encode_document(out, &doc("key", 9));
        });
        assert_eq!(a, b);
        assert_eq!(decode_frame(&b[3..]).unwrap().0, RecordKind::Document);
    }

    #[test]
    fn header_round_trips_with_trailer() {
        let h = Header {
            commit_id: 7,
            state: VbState {
                state: VBucketState::Replica,
                high_seqno: 10,
                persisted_seqno: 10,
                purge_seqno: 2,
                max_cas: 1234,
                high_prepared_seqno: 9,
                high_completed_seqno: 8,
                failover_log: vec![FailoverEntry { uuid: 5, seqno: 0 }],
            },
            segments: vec![(100, 50), (300, 60)],
        };
        let mut f = Vec::new();
        put_header(&mut f, &h);
        let tail = &f[f.len() - 8..];
        assert_eq!(
            u32::from_le_bytes(tail[..4].try_into().unwrap()) as usize,
            f.len()
        );
        let body = decode_frame_of(&f, RecordKind::Header).unwrap();
        assert_eq!(decode_header(body).unwrap(), h);
    }

    #[test]
    fn blocks_segments_and_journal_round_trip() {
        let ke = vec![KeyEntry {
            key: b"a".to_vec(),
            seqno: 1,
            offset: 2,
            len: 3,
            deleted: true,
        }];
        let mut b = Vec::new();
        encode_key_block(&mut b, &ke);
        assert_eq!(decode_key_block(&b).unwrap(), ke);
        let se = vec![SeqEntry {
            seqno: 1,
            offset: 2,
            len: 3,
        }];
        let mut b = Vec::new();
        encode_seq_block(&mut b, &se);
        assert_eq!(decode_seq_block(&b).unwrap(), se);
        let s = SegmentDir {
            items: 1,
            min_seqno: 1,
            max_seqno: 1,
            key_blocks: vec![BlockRef {
                first_key: b"a".to_vec(),
                first_seqno: 0,
                offset: 9,
                len: 10,
                count: 1,
            }],
            seq_blocks: vec![BlockRef {
                first_key: Vec::new(),
                first_seqno: 1,
                offset: 30,
                len: 10,
                count: 1,
            }],
        };
        let mut b = Vec::new();
        encode_segment(&mut b, &s);
        assert_eq!(decode_segment(&b).unwrap(), s);
        let j = vec![JournalEntry {
            vbid: 3,
            commit_id: 2,
            state: VbState::new(VBucketState::Active),
            docs: vec![doc("x", 1), doc("y", 2)].into(),
        }];
        let mut b = Vec::new();
        encode_journal_batch(&mut b, 9, &j);
        assert_eq!(decode_journal_batch(&b).unwrap(), (9, j));
    }

    #[test]
    fn huge_counts_are_rejected_without_allocating() {
        let mut b = Vec::new();
        put_u32(&mut b, u32::MAX);
        assert!(matches!(decode_seq_block(&b), Err(DecodeError::Length(_))));
        assert!(decode_any(&[5, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0]).is_err());
    }
}
