//! One vBucket's append-only data file: appending a commit (documents, an index segment,
//! a header), reading by key and by seqno through the on-disk index, and recovery of the
//! last valid header.
//!
//! The index is a small log-structured merge of immutable *segments* (O'Neil et al., "The
//! Log-Structured Merge-Tree", 1996, in its simplest tiered form): each commit writes one
//! segment holding its keys in key order and in seqno order, split into blocks of
//! [`BLOCK_ENTRIES`]. Only a segment's directory (first key / first seqno and position of
//! each block) is kept in memory. When a new segment is at least half the size of the one
//! before it, the two are merged (newest version of each key wins), so a vBucket has
//! O(log n) segments; compaction rewrites the file with one.

use crate::error::{Error, Result};
use crate::format::{
    self, BlockRef, DecodeError, FRAME_HEADER_LEN, HEADER_TRAILER_LEN, HEADER_TRAILER_MAGIC,
    Header, KeyEntry, RecordKind, SUPERBLOCK_LEN, SegmentDir, SeqEntry,
};
use crate::types::{Document, KeyMeta, ScanControl};
use crate::vfs::VFile;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Index entries per key or seqno block.
pub(crate) const BLOCK_ENTRIES: usize = 128;
/// A vBucket never has more segments than this; beyond it the newest two are merged.
pub(crate) const MAX_SEGMENTS: usize = 24;
/// Read-ahead window of sequential scans.
const READ_AHEAD: usize = 256 * 1024;

/// An index segment: where it is and its in-memory directory.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) offset: u64,
    pub(crate) len: u32,
    pub(crate) dir: SegmentDir,
}

/// What a reader needs, cloned out of the vBucket's lock.
#[derive(Debug, Clone)]
pub(crate) struct ReadView {
    pub(crate) path: PathBuf,
    pub(crate) segments: Arc<Vec<Arc<Segment>>>,
}

pub(crate) fn corrupt(path: &Path, offset: u64, reason: DecodeError) -> Error {
    Error::Corrupt {
        path: path.to_owned(),
        offset,
        reason,
    }
}

/// Reads the frame at `offset` of `len` bytes and returns its body, checking the CRC and
/// the kind.
pub(crate) fn read_frame(
    f: &dyn VFile,
    path: &Path,
    offset: u64,
    len: u32,
    kind: RecordKind,
) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, offset)
        .map_err(|e| read_err(path, offset, e))?;
    let body = format::decode_frame_of(&buf, kind).map_err(|r| corrupt(path, offset, r))?;
    Ok(body.to_vec())
}

fn read_err(path: &Path, offset: u64, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        corrupt(
            path,
            offset,
            DecodeError::Invalid("record points past the end of the file"),
        )
    } else {
        Error::io("read", path, e)
    }
}

/// Reads a segment directory.
pub(crate) fn load_segment(f: &dyn VFile, path: &Path, offset: u64, len: u32) -> Result<Segment> {
    let body = read_frame(f, path, offset, len, RecordKind::Segment)?;
    let dir = format::decode_segment(&body).map_err(|r| corrupt(path, offset, r))?;
    Ok(Segment { offset, len, dir })
}

fn read_key_block(f: &dyn VFile, path: &Path, b: &BlockRef) -> Result<Vec<KeyEntry>> {
    let body = read_frame(f, path, b.offset, b.len, RecordKind::KeyBlock)?;
    format::decode_key_block(&body).map_err(|r| corrupt(path, b.offset, r))
}

fn read_seq_block(f: &dyn VFile, path: &Path, b: &BlockRef) -> Result<Vec<SeqEntry>> {
    let body = read_frame(f, path, b.offset, b.len, RecordKind::SeqBlock)?;
    format::decode_seq_block(&body).map_err(|r| corrupt(path, b.offset, r))
}

/// Reads every key entry of a segment, in key order.
pub(crate) fn read_all_keys(f: &dyn VFile, path: &Path, s: &Segment) -> Result<Vec<KeyEntry>> {
    let mut out = Vec::with_capacity(usize::try_from(s.dir.items).unwrap_or(0));
    for b in &s.dir.key_blocks {
        out.extend(read_key_block(f, path, b)?);
    }
    Ok(out)
}

/// Finds `key` in one segment.
fn find_in_segment(
    f: &dyn VFile,
    path: &Path,
    s: &Segment,
    key: &[u8],
) -> Result<Option<KeyEntry>> {
    let blocks = &s.dir.key_blocks;
    let idx = blocks.partition_point(|b| b.first_key.as_slice() <= key);
    if idx == 0 {
        return Ok(None);
    }
    let entries = read_key_block(f, path, &blocks[idx - 1])?;
    Ok(entries
        .binary_search_by(|e| e.key.as_slice().cmp(key))
        .ok()
        .map(|i| entries[i].clone()))
}

/// Decoded key blocks kept during one scan, so that checking whether a newer segment
/// supersedes a document reads each block once, not once per document.
#[derive(Debug, Default)]
pub(crate) struct BlockCache {
    blocks: std::collections::HashMap<(usize, usize), Arc<Vec<KeyEntry>>>,
}

/// Blocks a [`BlockCache`] holds before it starts over (128 entries each: ~8k keys).
const BLOCK_CACHE_MAX: usize = 64;

impl BlockCache {
    /// Finds the newest entry of `key` in `segments[from..]`.
    fn find(
        &mut self,
        f: &dyn VFile,
        path: &Path,
        segments: &[Arc<Segment>],
        from: usize,
        key: &[u8],
    ) -> Result<Option<KeyEntry>> {
        for si in (from..segments.len()).rev() {
            let blocks = &segments[si].dir.key_blocks;
            let idx = blocks.partition_point(|b| b.first_key.as_slice() <= key);
            if idx == 0 {
                continue;
            }
            let entries = match self.blocks.get(&(si, idx - 1)) {
                Some(e) => Arc::clone(e),
                None => {
                    if self.blocks.len() >= BLOCK_CACHE_MAX {
                        self.blocks.clear();
                    }
                    let e = Arc::new(read_key_block(f, path, &blocks[idx - 1])?);
                    self.blocks.insert((si, idx - 1), Arc::clone(&e));
                    e
                }
            };
            if let Ok(i) = entries.binary_search_by(|e| e.key.as_slice().cmp(key)) {
                return Ok(Some(entries[i].clone()));
            }
        }
        Ok(None)
    }
}

/// Finds the newest index entry of `key` in `segments` (newest segment last).
pub(crate) fn find_key(
    f: &dyn VFile,
    path: &Path,
    segments: &[Arc<Segment>],
    key: &[u8],
) -> Result<Option<KeyEntry>> {
    for s in segments.iter().rev() {
        if let Some(e) = find_in_segment(f, path, s, key)? {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// Reads and decodes the document frame at (offset, len).
pub(crate) fn read_doc(f: &dyn VFile, path: &Path, offset: u64, len: u32) -> Result<Document> {
    let body = read_frame(f, path, offset, len, RecordKind::Document)?;
    format::decode_document(&body).map_err(|r| corrupt(path, offset, r))
}

/// A read-ahead buffer for scans that read documents mostly in file order.
#[derive(Debug, Default)]
struct ReadAhead {
    start: u64,
    buf: Vec<u8>,
}

impl ReadAhead {
    fn doc(
        &mut self,
        f: &dyn VFile,
        path: &Path,
        file_len: u64,
        offset: u64,
        len: u32,
    ) -> Result<Document> {
        let end = offset + u64::from(len);
        let have_end = self.start + self.buf.len() as u64;
        if offset < self.start || end > have_end {
            let want = (len as usize).max(READ_AHEAD) as u64;
            let read_end = (offset + want).min(file_len).max(end);
            self.buf
                .resize(usize::try_from(read_end - offset).unwrap_or(0), 0);
            f.read_exact_at(&mut self.buf, offset)
                .map_err(|e| read_err(path, offset, e))?;
            self.start = offset;
        }
        let lo = usize::try_from(offset - self.start).unwrap_or(0);
        let frame = &self.buf[lo..lo + len as usize];
        let body = format::decode_frame_of(frame, RecordKind::Document)
            .map_err(|r| corrupt(path, offset, r))?;
        format::decode_document(body).map_err(|r| corrupt(path, offset, r))
    }
}

/// Streams the newest version of every document with `start <= seqno <= end`, in seqno
/// order. Returns how many were delivered.
pub(crate) fn scan_by_seqno(
    f: &dyn VFile,
    view: &ReadView,
    start: u64,
    end: u64,
    visit: &mut dyn FnMut(Document) -> ScanControl,
) -> Result<u64> {
    struct Cur {
        block: usize,
        entries: Vec<SeqEntry>,
        pos: usize,
    }
    let path = &view.path;
    let segs = &view.segments;
    let file_len = f.len().map_err(|e| Error::io("stat", path, e))?;
    let mut curs: Vec<Cur> = Vec::with_capacity(segs.len());
    for s in segs.iter() {
        let b = &s.dir.seq_blocks;
        // The first block that can hold `start`.
        let block = b
            .partition_point(|r| r.first_seqno <= start)
            .saturating_sub(1);
        curs.push(Cur {
            block,
            entries: Vec::new(),
            pos: 0,
        });
    }
    let mut ra = ReadAhead::default();
    let mut cache = BlockCache::default();
    let mut delivered = 0u64;
    loop {
        // Refill and pick the segment with the smallest next seqno (few segments: linear).
        let mut best: Option<(usize, SeqEntry)> = None;
        for (i, c) in curs.iter_mut().enumerate() {
            loop {
                if c.pos < c.entries.len() {
                    if c.entries[c.pos].seqno < start {
                        c.pos += 1;
                        continue;
                    }
                    break;
                }
                let blocks = &segs[i].dir.seq_blocks;
                if c.block >= blocks.len() || blocks[c.block].first_seqno > end {
                    break;
                }
                c.entries = read_seq_block(f, path, &blocks[c.block])?;
                c.block += 1;
                c.pos = 0;
            }
            if let Some(e) = c.entries.get(c.pos)
                && e.seqno <= end
                && best.is_none_or(|(_, b)| e.seqno < b.seqno)
            {
                best = Some((i, *e));
            }
        }
        let Some((i, e)) = best else {
            return Ok(delivered);
        };
        curs[i].pos += 1;
        let doc = ra.doc(f, path, file_len, e.offset, e.len)?;
        // Skip a version that a newer segment supersedes.
        if i + 1 < segs.len()
            && let Some(newer) = cache.find(f, path, segs, i + 1, &doc.key)?
            && newer.offset != e.offset
        {
            continue;
        }
        delivered += 1;
        if visit(doc) == ScanControl::Stop {
            return Ok(delivered);
        }
    }
}

/// Streams every key's newest index entry in key order.
pub(crate) fn scan_keys(
    f: &dyn VFile,
    view: &ReadView,
    visit: &mut dyn FnMut(KeyMeta) -> ScanControl,
) -> Result<u64> {
    struct Cur {
        block: usize,
        entries: Vec<KeyEntry>,
        pos: usize,
    }
    let path = &view.path;
    let segs = &view.segments;
    let mut curs: Vec<Cur> = segs
        .iter()
        .map(|_| Cur {
            block: 0,
            entries: Vec::new(),
            pos: 0,
        })
        .collect();
    let mut delivered = 0u64;
    loop {
        let mut best: Option<(usize, Vec<u8>)> = None;
        for (i, c) in curs.iter_mut().enumerate() {
            if c.pos >= c.entries.len() {
                let blocks = &segs[i].dir.key_blocks;
                if c.block < blocks.len() {
                    c.entries = read_key_block(f, path, &blocks[c.block])?;
                    c.block += 1;
                    c.pos = 0;
                }
            }
            if let Some(e) = c.entries.get(c.pos) {
                // `>=` so that on equal keys the newest (later) segment wins.
                if best.as_ref().is_none_or(|(_, k)| e.key <= *k) {
                    best = Some((i, e.key.clone()));
                }
            }
        }
        let Some((i, key)) = best else {
            return Ok(delivered);
        };
        let e = curs[i].entries[curs[i].pos].clone();
        for c in &mut curs {
            if c.entries.get(c.pos).is_some_and(|x| x.key == key) {
                c.pos += 1;
            }
        }
        delivered += 1;
        let meta = KeyMeta {
            key,
            seqno: e.seqno,
            deleted: e.deleted,
        };
        if visit(meta) == ScanControl::Stop {
            return Ok(delivered);
        }
    }
}

/// Encodes blocks of `entries` at `base + buf.len()` into `buf`.
fn put_key_blocks(buf: &mut Vec<u8>, base: u64, entries: &[KeyEntry]) -> Vec<BlockRef> {
    let mut refs = Vec::new();
    for chunk in entries.chunks(BLOCK_ENTRIES) {
        let offset = base + buf.len() as u64;
        let mut body = Vec::new();
        format::encode_key_block(&mut body, chunk);
        format::put_frame(buf, RecordKind::KeyBlock, &body);
        refs.push(BlockRef {
            first_key: chunk[0].key.clone(),
            first_seqno: 0,
            offset,
            len: u32::try_from(base + buf.len() as u64 - offset).unwrap_or(u32::MAX),
            count: u32::try_from(chunk.len()).unwrap_or(u32::MAX),
        });
    }
    refs
}

fn put_seq_blocks(buf: &mut Vec<u8>, base: u64, entries: &[SeqEntry]) -> Vec<BlockRef> {
    let mut refs = Vec::new();
    for chunk in entries.chunks(BLOCK_ENTRIES) {
        let offset = base + buf.len() as u64;
        let mut body = Vec::new();
        format::encode_seq_block(&mut body, chunk);
        format::put_frame(buf, RecordKind::SeqBlock, &body);
        refs.push(BlockRef {
            first_key: Vec::new(),
            first_seqno: chunk[0].seqno,
            offset,
            len: u32::try_from(base + buf.len() as u64 - offset).unwrap_or(u32::MAX),
            count: u32::try_from(chunk.len()).unwrap_or(u32::MAX),
        });
    }
    refs
}

/// Writes a segment for `keys` (sorted by key, unique) into `buf` at file offset
/// `base + buf.len()`; returns it.
pub(crate) fn put_segment(buf: &mut Vec<u8>, base: u64, keys: &[KeyEntry]) -> Segment {
    let key_blocks = put_key_blocks(buf, base, keys);
    let mut seqs: Vec<SeqEntry> = keys
        .iter()
        .map(|k| SeqEntry {
            seqno: k.seqno,
            offset: k.offset,
            len: k.len,
        })
        .collect();
    seqs.sort_by_key(|s| (s.seqno, s.offset));
    let seq_blocks = put_seq_blocks(buf, base, &seqs);
    let dir = SegmentDir {
        items: keys.len() as u64,
        min_seqno: seqs.first().map_or(0, |s| s.seqno),
        max_seqno: seqs.last().map_or(0, |s| s.seqno),
        key_blocks,
        seq_blocks,
    };
    let offset = base + buf.len() as u64;
    let mut body = Vec::new();
    format::encode_segment(&mut body, &dir);
    format::put_frame(buf, RecordKind::Segment, &body);
    let len = u32::try_from(base + buf.len() as u64 - offset).unwrap_or(u32::MAX);
    Segment { offset, len, dir }
}

/// Merges two key-sorted, key-unique lists; on equal keys `newer` wins.
pub(crate) fn merge_keys(older: Vec<KeyEntry>, newer: Vec<KeyEntry>) -> Vec<KeyEntry> {
    let mut out = Vec::with_capacity(older.len() + newer.len());
    let mut a = older.into_iter().peekable();
    let mut b = newer.into_iter().peekable();
    loop {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => match x.key.cmp(&y.key) {
                std::cmp::Ordering::Less => out.extend(a.next()),
                std::cmp::Ordering::Greater => out.extend(b.next()),
                std::cmp::Ordering::Equal => {
                    a.next();
                    out.extend(b.next());
                }
            },
            (Some(_), None) => out.extend(a.next()),
            (None, Some(_)) => out.extend(b.next()),
            (None, None) => return out,
        }
    }
}

/// What recovery found in a data file.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// The last valid header and where its frame ends (the append position).
    pub(crate) header: Option<(Header, u64)>,
    /// Bytes after the last valid header that were cut off (a torn tail), if any.
    pub(crate) torn_bytes: u64,
    /// The file's format version (its superblock's); 0 for a file without one.
    pub(crate) format_version: u16,
}

/// Reads the superblock; returns its format version, or `None` if the file is too short
/// or torn to hold one.
fn check_superblock(f: &dyn VFile, path: &Path, len: u64, vbid: u16) -> Result<Option<u16>> {
    if len < SUPERBLOCK_LEN as u64 {
        return Ok(None);
    }
    let mut buf = vec![0u8; SUPERBLOCK_LEN];
    f.read_exact_at(&mut buf, 0)
        .map_err(|e| Error::io("read", path, e))?;
    let body = match format::decode_frame_of(&buf, RecordKind::DataSuperblock) {
        Ok(b) => b,
        // A superblock only ever fails to verify when the file's very first write was torn
        // (nothing could have been committed after it): treat as empty.
        Err(DecodeError::Checksum { .. } | DecodeError::Truncated { .. }) if len <= 4096 => {
            return Ok(None);
        }
        Err(r) => return Err(corrupt(path, 0, r)),
    };
    let (id, _, version) = format::decode_superblock(body, RecordKind::DataSuperblock)
        .map_err(|r| corrupt(path, 0, r))?;
    if id != vbid {
        return Err(corrupt(path, 0, DecodeError::Invalid("superblock vbid")));
    }
    Ok(Some(version))
}

fn try_header_ending_at(f: &dyn VFile, end: u64) -> Option<Header> {
    if end < (SUPERBLOCK_LEN + FRAME_HEADER_LEN + HEADER_TRAILER_LEN) as u64 {
        return None;
    }
    let mut t = [0u8; HEADER_TRAILER_LEN];
    f.read_exact_at(&mut t, end - HEADER_TRAILER_LEN as u64)
        .ok()?;
    let total = u64::from(u32::from_le_bytes([t[0], t[1], t[2], t[3]]));
    let magic = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
    if magic != HEADER_TRAILER_MAGIC || total > end - SUPERBLOCK_LEN as u64 || total > 1 << 24 {
        return None;
    }
    let mut buf = vec![0u8; usize::try_from(total).ok()?];
    f.read_exact_at(&mut buf, end - total).ok()?;
    let body = format::decode_frame_of(&buf, RecordKind::Header).ok()?;
    format::decode_header(body).ok()
}

/// Finds the last valid header of a data file.
///
/// Fast path: the file ends with a valid header. Otherwise the records are walked from the
/// start; the walk stops at the first record that does not verify. If a valid header exists
/// beyond that point the damage is in the middle of the file and is reported as
/// [`Error::Corrupt`]; otherwise it is a torn tail and everything after the last valid
/// header is cut off.
pub(crate) fn recover(f: &dyn VFile, path: &Path, vbid: u16) -> Result<Recovered> {
    let len = f.len().map_err(|e| Error::io("stat", path, e))?;
    let Some(format_version) = check_superblock(f, path, len, vbid)? else {
        return Ok(Recovered {
            header: None,
            torn_bytes: len,
            format_version: 0,
        });
    };
    if let Some(h) = try_header_ending_at(f, len) {
        return Ok(Recovered {
            header: Some((h, len)),
            torn_bytes: 0,
            format_version,
        });
    }
    // Slow path: walk the records.
    let mut pos = SUPERBLOCK_LEN as u64;
    let mut last: Option<(Header, u64)> = None;
    let mut head = [0u8; FRAME_HEADER_LEN];
    let bad_at = loop {
        if pos == len {
            break None;
        }
        if pos + FRAME_HEADER_LEN as u64 > len {
            break Some(pos);
        }
        f.read_exact_at(&mut head, pos)
            .map_err(|e| Error::io("read", path, e))?;
        let Ok((_, blen, _)) = format::parse_frame_header(&head) else {
            break Some(pos);
        };
        let total = FRAME_HEADER_LEN as u64 + u64::from(blen);
        if pos + total > len {
            break Some(pos);
        }
        let mut buf = vec![0u8; usize::try_from(total).unwrap_or(0)];
        f.read_exact_at(&mut buf, pos)
            .map_err(|e| Error::io("read", path, e))?;
        match format::decode_frame(&buf) {
            Ok((RecordKind::Header, body, _)) => match format::decode_header(body) {
                Ok(h) => last = Some((h, pos + total)),
                Err(_) => break Some(pos),
            },
            Ok(_) => {}
            Err(_) => break Some(pos),
        }
        pos += total;
    };
    let Some(bad) = bad_at else {
        // Every record verified but the file does not end in a header: an uncommitted tail.
        let end = last.as_ref().map_or(SUPERBLOCK_LEN as u64, |(_, e)| *e);
        return Ok(Recovered {
            header: last,
            torn_bytes: len - end,
            format_version,
        });
    };
    if find_later_header(f, bad, len)?.is_some() {
        return Err(corrupt(
            path,
            bad,
            DecodeError::Invalid(
                "record fails verification but a valid header follows (damage in the middle of the file)",
            ),
        ));
    }
    let end = last.as_ref().map_or(SUPERBLOCK_LEN as u64, |(_, e)| *e);
    Ok(Recovered {
        header: last,
        torn_bytes: len - end,
        format_version,
    })
}

/// Looks for a valid header frame ending after `from`: returns where it ends.
fn find_later_header(f: &dyn VFile, from: u64, len: u64) -> Result<Option<u64>> {
    const CHUNK: u64 = 1 << 20;
    let magic = HEADER_TRAILER_MAGIC.to_le_bytes();
    let mut pos = from;
    while pos < len {
        let n = (len - pos).min(CHUNK + 3);
        let mut buf = vec![0u8; usize::try_from(n).unwrap_or(0)];
        if f.read_exact_at(&mut buf, pos).is_err() {
            return Ok(None);
        }
        for (i, w) in buf.windows(4).enumerate() {
            if w == magic {
                let end = pos + i as u64 + 4;
                if try_header_ending_at(f, end).is_some() {
                    return Ok(Some(end));
                }
            }
        }
        pos += CHUNK;
    }
    Ok(None)
}

/// Writes a fresh superblock for `vbid` at offset 0.
pub(crate) fn superblock(vbid: u16, rev: u64, version: u16) -> Vec<u8> {
    let mut b = Vec::with_capacity(SUPERBLOCK_LEN);
    format::put_superblock_version(&mut b, RecordKind::DataSuperblock, vbid, rev, version);
    b
}

/// The file name of a vBucket's data file revision.
pub(crate) fn file_name(vbid: u16, rev: u64) -> String {
    format!("vb_{vbid}.{rev}.data")
}

/// Parses `vb_<vbid>.<rev>.data` (or `.compact`): (vbid, rev, is_compact).
pub(crate) fn parse_file_name(name: &str) -> Option<(u16, u64, bool)> {
    let rest = name.strip_prefix("vb_")?;
    let (stem, compact) = if let Some(s) = rest.strip_suffix(".data") {
        (s, false)
    } else {
        (rest.strip_suffix(".compact")?, true)
    };
    let (v, r) = stem.split_once('.')?;
    Some((v.parse().ok()?, r.parse().ok()?, compact))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ke(k: &str, s: u64) -> KeyEntry {
        KeyEntry {
            key: k.as_bytes().to_vec(),
            seqno: s,
            offset: s * 10,
            len: 1,
            deleted: false,
        }
    }

    #[test]
    fn merge_prefers_newer_and_keeps_order() {
        let m = merge_keys(
            vec![ke("a", 1), ke("c", 2), ke("d", 3)],
            vec![ke("b", 4), ke("c", 5)],
        );
        let got: Vec<(String, u64)> = m
            .iter()
            .map(|e| (String::from_utf8(e.key.clone()).unwrap(), e.seqno))
            .collect();
        assert_eq!(
            got,
            [("a", 1), ("b", 4), ("c", 5), ("d", 3)].map(|(k, s)| (k.to_owned(), s))
        );
    }

    #[test]
    fn file_names_round_trip() {
        assert_eq!(parse_file_name(&file_name(7, 3)), Some((7, 3, false)));
        assert_eq!(parse_file_name("vb_1.2.compact"), Some((1, 2, true)));
        assert_eq!(parse_file_name("journal.log"), None);
    }
}
