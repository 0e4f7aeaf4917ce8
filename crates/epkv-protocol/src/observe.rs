//! OBSERVE (0x92) bodies: the request's list of keys and the reply's entries.
//!
//! Request value: entries of `vbid (u16) | key length (u16) | key`. Reply value: for each
//! key, `vbid (u16) | key length (u16) | key | state (u8) | cas (u64)`, all big-endian.

use crate::status::Status;
use epkv_types::{MAX_KEY_LEN, Vbid};

/// The `(vbid, key)` entries of an OBSERVE request, in order. Yields
/// `Err(Status::Einval)` once, then stops, for a truncated entry, an empty key or a key
/// longer than 250 bytes.
#[derive(Debug, Clone)]
pub struct ObserveKeys<'a> {
    rest: &'a [u8],
    failed: bool,
}

impl<'a> ObserveKeys<'a> {
    /// The entries of `value`.
    #[must_use]
    pub fn new(value: &'a [u8]) -> Self {
        Self {
            rest: value,
            failed: false,
        }
    }
}

impl<'a> Iterator for ObserveKeys<'a> {
    type Item = Result<(Vbid, &'a [u8]), Status>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let entry = (|| {
            let head = self.rest.get(..4)?;
            let vbid = u16::from_be_bytes([head[0], head[1]]);
            let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
            if len == 0 || len > MAX_KEY_LEN {
                return None;
            }
            let key = self.rest.get(4..4 + len)?;
            self.rest = &self.rest[4 + len..];
            Some((Vbid(vbid), key))
        })();
        match entry {
            Some(e) => Some(Ok(e)),
            None => {
                self.failed = true;
                Some(Err(Status::Einval))
            }
        }
    }
}

/// A key's state in an OBSERVE reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ObserveState {
    /// In memory, not yet on disk.
    NotPersisted = 0x00,
    /// On disk.
    Persisted = 0x01,
    /// No such document.
    NotFound = 0x80,
    /// Deleted, the deletion not yet on disk.
    LogicallyDeleted = 0x81,
}

/// Appends one OBSERVE reply entry to `out`.
///
/// # Panics
/// Never for a key of at most 250 bytes (what [`ObserveKeys`] yields).
pub fn put_observe_entry(out: &mut Vec<u8>, vbid: Vbid, key: &[u8], state: ObserveState, cas: u64) {
    out.extend_from_slice(&vbid.0.to_be_bytes());
    let len = u16::try_from(key.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&key[..usize::from(len)]);
    out.push(state as u8);
    out.extend_from_slice(&cas.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(vb: u16, key: &[u8]) -> Vec<u8> {
        let mut v = vb.to_be_bytes().to_vec();
        v.extend_from_slice(&(key.len() as u16).to_be_bytes());
        v.extend_from_slice(key);
        v
    }

    #[test]
    fn entries_are_read_in_order_and_bad_ones_stop_the_list() {
        let mut body = entry(3, b"a");
        body.extend(entry(1023, b"bcd"));
        let got: Vec<_> = ObserveKeys::new(&body).collect();
        assert_eq!(
            got,
            vec![Ok((Vbid(3), &b"a"[..])), Ok((Vbid(1023), &b"bcd"[..]))]
        );
        // Truncated key, empty key, truncated header: one error, then nothing.
        for bad in [
            &body[..body.len() - 1],
            &entry(1, b"")[..],
            &[0u8, 1, 0][..],
        ] {
            let got: Vec<_> = ObserveKeys::new(bad).collect();
            assert_eq!(got.last(), Some(&Err(Status::Einval)), "{bad:?}");
            assert_eq!(got.iter().filter(|r| r.is_err()).count(), 1);
        }
        let long = entry(0, &[b'k'; 251]);
        assert_eq!(ObserveKeys::new(&long).next(), Some(Err(Status::Einval)));
    }

    #[test]
    fn reply_entries_carry_state_and_cas() {
        let mut out = Vec::new();
        put_observe_entry(
            &mut out,
            Vbid(2),
            b"k",
            ObserveState::LogicallyDeleted,
            0x0102,
        );
        assert_eq!(out, [0, 2, 0, 1, b'k', 0x81, 0, 0, 0, 0, 0, 0, 1, 2]);
    }
}
