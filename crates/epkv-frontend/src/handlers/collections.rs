//! The collections family: the bucket's manifest, and the ids of collections and scopes
//! by path.

use crate::dispatch::{DataCall, unexpected};
use crate::response::put_success;
use crate::session::Session;
use epkv_protocol::{Command, Status};
use epkv_types::{Cas, Datatype};

/// GET_COLLECTIONS_MANIFEST: the bucket's manifest (JSON).
pub(crate) fn manifest(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        out,
        to,
        ..
    } = c;
    let Command::GetCollectionsManifest = cmd else {
        return unexpected(out, to);
    };
    match engine.collections_manifest() {
        Ok(json) => put_success(
            out,
            to,
            Cas::ANY,
            s.datatype_out(Datatype::JSON),
            &[],
            &[],
            json.as_bytes(),
        ),
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}

/// GET_COLLECTION_ID, GET_SCOPE_ID: the manifest uid and the id of a path.
pub(crate) fn id(s: &Session, c: DataCall<'_>, cmd: Command<'_>) {
    let DataCall {
        shared,
        engine,
        out,
        to,
        ..
    } = c;
    let (Command::GetCollectionId { path } | Command::GetScopeId { path }) = cmd else {
        return unexpected(out, to);
    };
    let Ok(path) = std::str::from_utf8(path) else {
        return s.fail_wire(out, to, Status::Einval, &[]);
    };
    let found = if matches!(cmd, Command::GetCollectionId { .. }) {
        engine.collection_id(path)
    } else {
        engine.scope_id(path)
    };
    match found {
        // Extras: manifest uid (u64), then the id (u32).
        Ok((uid, id)) => {
            let mut extras = [0u8; 12];
            extras[..8].copy_from_slice(&uid.to_be_bytes());
            extras[8..].copy_from_slice(&id.to_be_bytes());
            put_success(out, to, Cas::ANY, Datatype::RAW, &extras, &[], &[]);
        }
        Err(e) => s.fail(shared, out, to, e, &[]),
    }
}
