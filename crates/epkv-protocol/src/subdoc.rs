//! Sub-document request bodies (kv_engine `docs/SubDocument.md`, `docs/BinaryProtocol.md`):
//! the specs of MULTI_LOOKUP and MULTI_MUTATION, and the flag bits.
//!
//! - MULTI_LOOKUP value: specs of `opcode (u8) | path flags (u8) | path length (u16) |
//!   path`.
//! - MULTI_MUTATION value: specs of `opcode (u8) | path flags (u8) | path length (u16) |
//!   value length (u32) | path | value`.
//!
//! At most [`MAX_SUBDOC_SPECS`] specs; all big-endian.

use crate::opcode::Opcode;
use crate::status::Status;

/// Most specs one multi-path command may carry.
pub const MAX_SUBDOC_SPECS: usize = 16;

/// Path flag: create missing intermediate objects.
pub const PATH_FLAG_MKDIR_P: u8 = 0x01;
/// Path flag: the path is an extended attribute.
pub const PATH_FLAG_XATTR: u8 = 0x04;
/// Path flag: expand macros in an extended attribute's value (with `XATTR` only).
pub const PATH_FLAG_EXPAND_MACROS: u8 = 0x10;
/// Path flag: the extended attribute's value is binary (KV-Engine 7.6): stored base64
/// encoded in a JSON string, read back decoded (with `XATTR` only, not with
/// `EXPAND_MACROS`; on SUBDOC_GET, DICT_ADD, DICT_UPSERT, REPLACE and
/// REPLACE_BODY_WITH_XATTR).
pub const PATH_FLAG_BINARY_VALUE: u8 = 0x20;
/// Doc flag: create the document if missing (upsert semantics).
pub const DOC_FLAG_MKDOC: u8 = 0x01;
/// Doc flag: create the document, which must not exist (insert semantics).
pub const DOC_FLAG_ADD: u8 = 0x02;
/// Doc flag: operate on the document's tombstone when it is deleted.
pub const DOC_FLAG_ACCESS_DELETED: u8 = 0x04;
/// Doc flag: with MKDOC or ADD, create the document deleted (attributes only).
pub const DOC_FLAG_CREATE_AS_DELETED: u8 = 0x08;
/// Doc flag: with ACCESS_DELETED, make a deleted document live again.
pub const DOC_FLAG_REVIVE: u8 = 0x10;
/// Doc flag: a lookup reads a replica vBucket's copy (KV-Engine 7.6; lookups only).
pub const DOC_FLAG_REPLICA_READ: u8 = 0x20;
/// Every doc flag.
pub const DOC_FLAGS: u8 = DOC_FLAG_MKDOC
    | DOC_FLAG_ADD
    | DOC_FLAG_ACCESS_DELETED
    | DOC_FLAG_CREATE_AS_DELETED
    | DOC_FLAG_REVIVE
    | DOC_FLAG_REPLICA_READ;

/// One path of a sub-document command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubdocSpec<'a> {
    /// The path's operation (a single-path sub-document opcode).
    pub opcode: Opcode,
    /// Path flags.
    pub flags: u8,
    /// The path.
    pub path: &'a [u8],
    /// The value (always empty for lookups).
    pub value: &'a [u8],
}

/// Whether `op` is a sub-document lookup.
#[must_use]
pub fn is_subdoc_lookup(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::SubdocGet | Opcode::SubdocExists | Opcode::SubdocGetCount
    )
}

/// Whether `op` is a single-path sub-document mutation.
#[must_use]
pub fn is_subdoc_mutation(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::SubdocDictAdd
            | Opcode::SubdocDictUpsert
            | Opcode::SubdocDelete
            | Opcode::SubdocReplace
            | Opcode::SubdocArrayPushLast
            | Opcode::SubdocArrayPushFirst
            | Opcode::SubdocArrayInsert
            | Opcode::SubdocArrayAddUnique
            | Opcode::SubdocCounter
    )
}

/// Checks one spec's flags: unknown bits, and MKDIR_P or EXPAND_MACROS on a lookup, are
/// EINVAL; EXPAND_MACROS without XATTR is SubdocXattrInvalidFlagCombo.
pub(crate) fn check_path_flags(op: Opcode, flags: u8, lookup: bool) -> Result<(), Status> {
    let known =
        PATH_FLAG_MKDIR_P | PATH_FLAG_XATTR | PATH_FLAG_EXPAND_MACROS | PATH_FLAG_BINARY_VALUE;
    if flags & !known != 0 {
        return Err(Status::Einval);
    }
    if lookup && flags & PATH_FLAG_EXPAND_MACROS != 0 {
        return Err(Status::Einval);
    }
    let xattr = flags & PATH_FLAG_XATTR != 0;
    let binary = flags & PATH_FLAG_BINARY_VALUE != 0;
    if flags & PATH_FLAG_EXPAND_MACROS != 0 && (!xattr || binary) || binary && !xattr {
        return Err(Status::SubdocXattrInvalidFlagCombo);
    }
    let binary_ops = [
        Opcode::SubdocGet,
        Opcode::SubdocDictAdd,
        Opcode::SubdocDictUpsert,
        Opcode::SubdocReplace,
        Opcode::SubdocReplaceBodyWithXattr,
    ];
    if binary && !binary_ops.contains(&op) {
        return Err(Status::Einval);
    }
    Ok(())
}

/// Checks a multi-path command's specs as a whole: extended attribute paths come before
/// body paths (SubdocInvalidXattrOrder), and a whole-document SET or DELETE has no other
/// body path beside it (SubdocInvalidCombo).
///
/// # Errors
/// The command's status.
pub fn check_spec_order(specs: &[SubdocSpec<'_>]) -> Result<(), Status> {
    let mut seen_body = false;
    for s in specs {
        let xattr = s.flags & PATH_FLAG_XATTR != 0;
        if xattr && seen_body {
            return Err(Status::SubdocInvalidXattrOrder);
        }
        seen_body |= !xattr;
    }
    let whole = specs
        .iter()
        .filter(|s| matches!(s.opcode, Opcode::Set | Opcode::Delete))
        .count();
    let body = specs
        .iter()
        .filter(|s| s.flags & PATH_FLAG_XATTR == 0)
        .count();
    if whole > 1 || (whole == 1 && body > 1) {
        return Err(Status::SubdocInvalidCombo);
    }
    Ok(())
}

/// Parses the specs of a MULTI_LOOKUP (`mutations` false) or MULTI_MUTATION value.
///
/// # Errors
/// EINVAL for a truncated spec or bad flags; SubdocInvalidCombo for no specs, more than
/// [`MAX_SUBDOC_SPECS`], or an opcode of the wrong kind; NotSupported for extended
/// attribute paths.
pub fn parse_specs(mut v: &[u8], mutations: bool) -> Result<Vec<SubdocSpec<'_>>, Status> {
    let mut out = Vec::new();
    while !v.is_empty() {
        let head = if mutations { 8 } else { 4 };
        let h = v.get(..head).ok_or(Status::Einval)?;
        let opcode = Opcode::from_u8(h[0]).ok_or(Status::SubdocInvalidCombo)?;
        // GET (0x00) in a lookup reads the whole document (its path is empty); SET
        // (0x01) and DELETE (0x04) in a mutation replace or delete the whole document.
        let kind_ok = if mutations {
            is_subdoc_mutation(opcode)
                || matches!(
                    opcode,
                    Opcode::Set | Opcode::Delete | Opcode::SubdocReplaceBodyWithXattr
                )
        } else {
            is_subdoc_lookup(opcode) || opcode == Opcode::Get
        };
        if !kind_ok {
            return Err(Status::SubdocInvalidCombo);
        }
        let flags = h[1];
        let path_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
        let value_len = if mutations {
            usize::try_from(u32::from_be_bytes([h[4], h[5], h[6], h[7]]))
                .map_err(|_| Status::Einval)?
        } else {
            0
        };
        let end = head
            .checked_add(path_len)
            .and_then(|n| n.checked_add(value_len))
            .ok_or(Status::Einval)?;
        let body = v.get(head..end).ok_or(Status::Einval)?;
        check_path_flags(opcode, flags, !mutations)?;
        let whole_doc = matches!(opcode, Opcode::Get | Opcode::Set | Opcode::Delete);
        if whole_doc && (path_len != 0 || flags & PATH_FLAG_XATTR != 0) {
            return Err(Status::Einval);
        }
        if opcode == Opcode::SubdocReplaceBodyWithXattr && flags & PATH_FLAG_XATTR == 0 {
            return Err(Status::Einval);
        }
        out.push(SubdocSpec {
            opcode,
            flags,
            path: &body[..path_len],
            value: &body[path_len..],
        });
        if out.len() > MAX_SUBDOC_SPECS {
            return Err(Status::SubdocInvalidCombo);
        }
        v = &v[end..];
    }
    if out.is_empty() {
        return Err(Status::SubdocInvalidCombo);
    }
    check_spec_order(&out)?;
    Ok(out)
}

/// Appends one lookup spec to `out` (for clients and tests).
pub fn put_lookup_spec(out: &mut Vec<u8>, opcode: Opcode, flags: u8, path: &[u8]) {
    out.push(opcode.as_u8());
    out.push(flags);
    out.extend_from_slice(&u16::try_from(path.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(path);
}

/// Appends one mutation spec to `out` (for clients and tests).
pub fn put_mutation_spec(out: &mut Vec<u8>, opcode: Opcode, flags: u8, path: &[u8], value: &[u8]) {
    out.push(opcode.as_u8());
    out.push(flags);
    out.extend_from_slice(&u16::try_from(path.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(&u32::try_from(value.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(path);
    out.extend_from_slice(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_value_goes_with_xattr_on_the_five_opcodes_kv_engine_allows() {
        let binary = PATH_FLAG_XATTR | PATH_FLAG_BINARY_VALUE;
        assert_eq!(check_path_flags(Opcode::SubdocGet, binary, true), Ok(()));
        for op in [
            Opcode::SubdocDictAdd,
            Opcode::SubdocDictUpsert,
            Opcode::SubdocReplace,
            Opcode::SubdocReplaceBodyWithXattr,
        ] {
            assert_eq!(check_path_flags(op, binary, false), Ok(()));
        }
        assert_eq!(
            check_path_flags(Opcode::SubdocGet, PATH_FLAG_BINARY_VALUE, true),
            Err(Status::SubdocXattrInvalidFlagCombo)
        );
        assert_eq!(
            check_path_flags(
                Opcode::SubdocDictUpsert,
                binary | PATH_FLAG_EXPAND_MACROS,
                false
            ),
            Err(Status::SubdocXattrInvalidFlagCombo)
        );
        for (op, lookup) in [
            (Opcode::SubdocExists, true),
            (Opcode::SubdocArrayPushLast, false),
            (Opcode::SubdocCounter, false),
        ] {
            assert_eq!(check_path_flags(op, binary, lookup), Err(Status::Einval));
        }
    }

    #[test]
    fn multi_specs_round_trip_and_bad_ones_are_refused() {
        let mut v = Vec::new();
        put_lookup_spec(&mut v, Opcode::SubdocGet, 0, b"a.b");
        put_lookup_spec(&mut v, Opcode::SubdocExists, 0, b"c");
        let specs = parse_specs(&v, false).unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(
            (specs[0].opcode, specs[0].path),
            (Opcode::SubdocGet, &b"a.b"[..])
        );
        assert_eq!(parse_specs(&v[..v.len() - 1], false), Err(Status::Einval));
        assert_eq!(parse_specs(&v, true), Err(Status::SubdocInvalidCombo));
        assert_eq!(parse_specs(b"", false), Err(Status::SubdocInvalidCombo));

        let mut m = Vec::new();
        put_mutation_spec(
            &mut m,
            Opcode::SubdocDictUpsert,
            PATH_FLAG_MKDIR_P,
            b"x.y",
            b"1",
        );
        put_mutation_spec(&mut m, Opcode::SubdocCounter, 0, b"n", b"5");
        let specs = parse_specs(&m, true).unwrap();
        assert_eq!(specs[1].value, b"5");
        assert_eq!(specs[0].flags, PATH_FLAG_MKDIR_P);

        let mut xattr = Vec::new();
        put_lookup_spec(&mut xattr, Opcode::SubdocGet, PATH_FLAG_XATTR, b"$document");
        put_lookup_spec(&mut xattr, Opcode::Get, 0, b"");
        assert_eq!(parse_specs(&xattr, false).unwrap().len(), 2);
        let mut xm = Vec::new();
        put_mutation_spec(
            &mut xm,
            Opcode::SubdocDictUpsert,
            PATH_FLAG_XATTR,
            b"a",
            b"1",
        );
        assert_eq!(parse_specs(&xm, true).unwrap()[0].flags, PATH_FLAG_XATTR);
        // Extended attribute paths come first.
        let mut late = Vec::new();
        put_mutation_spec(&mut late, Opcode::SubdocDictUpsert, 0, b"b", b"1");
        put_mutation_spec(
            &mut late,
            Opcode::SubdocDictUpsert,
            PATH_FLAG_XATTR,
            b"a",
            b"1",
        );
        assert_eq!(
            parse_specs(&late, true),
            Err(Status::SubdocInvalidXattrOrder)
        );
        // Macros only in extended attributes; whole-document specs have no path.
        let mut mac = Vec::new();
        put_mutation_spec(
            &mut mac,
            Opcode::SubdocDictUpsert,
            PATH_FLAG_EXPAND_MACROS,
            b"a",
            b"1",
        );
        assert_eq!(
            parse_specs(&mac, true),
            Err(Status::SubdocXattrInvalidFlagCombo)
        );
        let mut whole = Vec::new();
        put_mutation_spec(
            &mut whole,
            Opcode::SubdocDictUpsert,
            PATH_FLAG_XATTR,
            b"a",
            b"1",
        );
        put_mutation_spec(&mut whole, Opcode::Set, 0, b"", b"{}");
        assert_eq!(parse_specs(&whole, true).unwrap().len(), 2);
        put_mutation_spec(&mut whole, Opcode::SubdocDictUpsert, 0, b"b", b"1");
        assert_eq!(parse_specs(&whole, true), Err(Status::SubdocInvalidCombo));
        let mut pathed = Vec::new();
        put_mutation_spec(&mut pathed, Opcode::Delete, 0, b"a", b"");
        assert_eq!(parse_specs(&pathed, true), Err(Status::Einval));
        let mut odd = Vec::new();
        put_lookup_spec(&mut odd, Opcode::SubdocGet, 0x80, b"a");
        assert_eq!(parse_specs(&odd, false), Err(Status::Einval));

        let mut many = Vec::new();
        for _ in 0..=MAX_SUBDOC_SPECS {
            put_lookup_spec(&mut many, Opcode::SubdocGet, 0, b"a");
        }
        assert_eq!(parse_specs(&many, false), Err(Status::SubdocInvalidCombo));
    }
}
