//! Helpers shared by the DCP codecs: reading and writing fixed-size extras, the
//! per-opcode header rules, and the start of every DCP packet.

use crate::opcode::Opcode;
use crate::request::Request;
use crate::request_builder::RequestBuilder;
use crate::status::Status;
use epkv_types::{Datatype, Vbid};

/// Reads big-endian integers from the front of a slice whose length the caller checked.
/// Reading past the end gives zeros instead of panicking.
pub(super) struct Cursor<'a>(pub(super) &'a [u8]);

impl Cursor<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        match self.0.split_first_chunk::<N>() {
            Some((head, rest)) => {
                self.0 = rest;
                *head
            }
            None => {
                self.0 = &[];
                [0; N]
            }
        }
    }

    pub(super) fn u8(&mut self) -> u8 {
        u8::from_be_bytes(self.take())
    }

    pub(super) fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }

    pub(super) fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }

    pub(super) fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
}

/// Builds a fixed-size extras section field by field. Callers put exactly `N` bytes.
pub(super) struct ExtrasWriter<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> ExtrasWriter<N> {
    pub(super) fn new() -> Self {
        ExtrasWriter {
            buf: [0; N],
            len: 0,
        }
    }

    pub(super) fn put(mut self, bytes: &[u8]) -> Self {
        let end = self.len + bytes.len();
        if let Some(dst) = self.buf.get_mut(self.len..end) {
            dst.copy_from_slice(bytes);
        }
        self.len = end;
        self
    }

    pub(super) fn finish(self) -> [u8; N] {
        debug_assert_eq!(
            self.len, N,
            "extras writer filled {} of {N} bytes",
            self.len
        );
        self.buf
    }
}

/// Returns `extras` as a cursor when it is exactly `len` bytes long.
pub(super) fn exact(extras: &[u8], len: usize) -> Result<Cursor<'_>, Status> {
    if extras.len() == len {
        Ok(Cursor(extras))
    } else {
        Err(Status::Einval)
    }
}

/// Whether a section must be empty, must not be, or may be either.
#[derive(Debug, Clone, Copy)]
pub(super) enum Presence {
    Zero,
    NonZero,
    Any,
}

/// What the header's CAS must be.
#[derive(Debug, Clone, Copy)]
pub(super) enum CasRule {
    Any,
    Zero,
    Set,
}

/// Datatype bits a message may carry: none, or any known bit.
pub(super) const RAW_ONLY: u8 = 0;
pub(super) const ANY_DATATYPE: u8 = Datatype::ALL.0;

/// The per-opcode header rules of kv_engine's `verify_header`: extras length, key and
/// value presence, CAS and the datatype bits accepted.
pub(super) fn check_shape(
    req: &Request<'_>,
    extras_len: usize,
    key: Presence,
    value: Presence,
    cas: CasRule,
    datatype_mask: u8,
) -> Result<(), Status> {
    let present = |rule: Presence, len: usize| match rule {
        Presence::Zero => len == 0,
        Presence::NonZero => len != 0,
        Presence::Any => true,
    };
    let cas_ok = match cas {
        CasRule::Any => true,
        CasRule::Zero => req.header.cas.is_any(),
        CasRule::Set => !req.header.cas.is_any(),
    };
    let datatype = req.header.datatype;
    if req.extras.len() != extras_len
        || !present(key, req.key.len())
        || !present(value, req.value.len())
        || !cas_ok
        || !datatype.is_valid()
        || datatype.0 & !datatype_mask != 0
    {
        return Err(Status::Einval);
    }
    Ok(())
}

/// Starts a DCP request packet with the header fields every DCP message sets.
pub(super) fn builder<'a>(op: Opcode, opaque: u32, vbid: Vbid) -> RequestBuilder<'a> {
    RequestBuilder::new(op).opaque(opaque).vbucket(vbid)
}
