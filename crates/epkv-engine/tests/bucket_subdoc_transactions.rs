//! The sub-document primitives Couchbase transactions are built from, through the Engine
//! API on a manual clock: document macros (`${$document.CAS}` and the rest, the staged
//! document's old CAS, revision and expiry) and the `$vbucket` virtual attribute (the
//! vBucket's hybrid logical clock, the SDK's notion of time for attempts and client
//! records).

mod support;

use epkv_engine_api::{
    Engine, EngineResult, EngineStatus, LookupFlags, SubdocError, SubdocLookup, SubdocMutated,
    SubdocMutation, SubdocOp, SubdocSpec,
};
use epkv_types::Cas;
use serde_json::Value;
use support::*;

/// A lookup that reads a tombstone (ACCESS_DELETED).
const DELETED: LookupFlags = LookupFlags {
    access_deleted: true,
    replica_read: false,
};

fn attr<'a>(op: SubdocOp, path: &'a str, value: &'a str) -> SubdocSpec<'a> {
    SubdocSpec {
        op,
        mkdir_p: true,
        path: path.as_bytes(),
        value: value.as_bytes(),
        xattr: true,
        expand_macros: true,
        binary: false,
    }
}

fn mutation<'a>(key: &'a str, specs: &'a [SubdocSpec<'a>]) -> SubdocMutation<'a> {
    SubdocMutation {
        vbid: vb(key.as_bytes()),
        key: key.as_bytes(),
        specs,
        cas: Cas::ANY,
        expiry_raw: 0,
        preserve_ttl: false,
        flags: None,
        mkdoc: false,
        add: false,
        access_deleted: false,
        create_as_deleted: false,
        revive: false,
        durability: None,
    }
}

fn lookup(f: &Fixture, key: &str, paths: &[&str]) -> EngineResult<SubdocLookup> {
    let specs: Vec<SubdocSpec<'_>> = paths
        .iter()
        .map(|p| SubdocSpec {
            expand_macros: false,
            binary: false,
            mkdir_p: false,
            ..attr(SubdocOp::Get, p, "")
        })
        .collect();
    f.bucket.subdoc_lookup(
        vb(key.as_bytes()),
        key.as_bytes(),
        &specs,
        LookupFlags::default(),
    )
}

/// A lookup result's JSON; panics on a failed path or a value that is not JSON.
fn json(r: &Result<Vec<u8>, SubdocError>) -> Value {
    match r {
        Ok(v) => serde_json::from_slice(v).unwrap_or_else(|e| panic!("not JSON ({e}): {v:?}")),
        Err(e) => panic!("the path failed: {e:?}"),
    }
}

#[test]
fn document_macros_write_the_version_being_replaced() {
    let f = Fixture::new();
    let old = must_set(&f.bucket, "doc", r#"{"v":1}"#);
    let before = lookup(&f, "doc", &["$document"]).unwrap();
    let before = json(&before.results[0]);
    assert_eq!(before["CAS"], format!("0x{:016x}", old.cas.0));

    let specs = [
        attr(
            SubdocOp::DictUpsert,
            "txn.restore.CAS",
            r#""${$document.CAS}""#,
        ),
        attr(
            SubdocOp::DictUpsert,
            "txn.restore.revid",
            r#""${$document.revid}""#,
        ),
        attr(
            SubdocOp::DictUpsert,
            "txn.restore.exptime",
            r#""${$document.exptime}""#,
        ),
        attr(SubdocOp::DictUpsert, "txn.doc", r#"{"d":"${$document}"}"#),
    ];
    let done = f.bucket.subdoc_mutate(mutation("doc", &specs)).unwrap();
    let SubdocMutated::Done { info, .. } = done else {
        panic!("{done:?}")
    };
    assert_ne!(info.cas, old.cas);
    let got = lookup(&f, "doc", &["txn", "$document.CAS"]).unwrap();
    let txn = json(&got.results[0]);
    assert_eq!(txn["restore"]["CAS"], before["CAS"]);
    assert_eq!(txn["restore"]["revid"], before["revid"]);
    assert_eq!(txn["restore"]["exptime"], 0);
    assert_eq!(txn["doc"]["d"], before, "the whole $document");
    assert_eq!(json(&got.results[1]), format!("0x{:016x}", info.cas.0));

    // A path $document does not have, and the other `$` names, are refused; nothing
    // changes.
    for (value, error) in [
        (r#""${$document.nope}""#, SubdocError::UnknownVattrMacro),
        (r#""${$XTOC}""#, SubdocError::UnknownMacro),
        (r#""${$vbucket.HLC}""#, SubdocError::UnknownMacro),
    ] {
        let bad = [attr(SubdocOp::DictUpsert, "x", value)];
        assert_eq!(
            f.bucket.subdoc_mutate(mutation("doc", &bad)),
            Ok(SubdocMutated::Failed { index: 0, error })
        );
    }
    assert_eq!(lookup(&f, "doc", &["$document.CAS"]).unwrap().cas, info.cas);
}

#[test]
fn document_macros_on_a_tombstone_and_on_a_new_document() {
    let f = Fixture::new();
    // A staged insert: created as deleted; the macro sees a blank document.
    let specs = [attr(
        SubdocOp::DictUpsert,
        "txn.old",
        r#""${$document.CAS}""#,
    )];
    let req = SubdocMutation {
        add: true,
        create_as_deleted: true,
        ..mutation("new", &specs)
    };
    let done = f.bucket.subdoc_mutate(req).unwrap();
    assert!(
        matches!(done, SubdocMutated::Done { deleted: true, .. }),
        "{done:?}"
    );
    let specs = [SubdocSpec {
        expand_macros: false,
        binary: false,
        ..attr(SubdocOp::Get, "txn.old", "")
    }];
    let got = f
        .bucket
        .subdoc_lookup(vb(b"new"), b"new", &specs, DELETED)
        .unwrap();
    assert!(got.deleted);
    assert_eq!(json(&got.results[0]), "0x0000000000000000");

    // On a tombstone (ACCESS_DELETED) the macro is the tombstone's own.
    let cas = got.cas;
    let specs = [attr(
        SubdocOp::DictUpsert,
        "txn.old",
        r#""${$document.deleted}""#,
    )];
    let req = SubdocMutation {
        access_deleted: true,
        ..mutation("new", &specs)
    };
    assert!(matches!(
        f.bucket.subdoc_mutate(req),
        Ok(SubdocMutated::Done { deleted: true, .. })
    ));
    let got = f
        .bucket
        .subdoc_lookup(
            vb(b"new"),
            b"new",
            &[SubdocSpec {
                expand_macros: false,
                binary: false,
                ..attr(SubdocOp::Get, "txn.old", "")
            }],
            DELETED,
        )
        .unwrap();
    assert_eq!(json(&got.results[0]), true);
    assert_ne!(got.cas, cas);
}

#[test]
fn the_vbucket_attribute_is_the_hybrid_logical_clock_in_seconds() {
    let f = Fixture::new();
    must_set(&f.bucket, "doc", "{}");
    let got = lookup(
        &f,
        "doc",
        &["$vbucket", "$vbucket.HLC.now", "$document.deleted"],
    )
    .unwrap();
    let v = json(&got.results[0]);
    assert_eq!(v["HLC"]["mode"], "real");
    assert_eq!(v["HLC"]["now"], START_UNIX_SECS.to_string());
    assert_eq!(json(&got.results[1]), START_UNIX_SECS.to_string());
    assert_eq!(json(&got.results[2]), false);
    f.advance(5);
    let got = lookup(&f, "doc", &["$vbucket.HLC.now"]).unwrap();
    assert_eq!(json(&got.results[0]), (START_UNIX_SECS + 5).to_string());
    // It cannot be written, and it is no document's.
    let bad = [attr(SubdocOp::DictUpsert, "$vbucket.x", "1")];
    assert_eq!(
        f.bucket.subdoc_mutate(mutation("doc", &bad)),
        Ok(SubdocMutated::Failed {
            index: 0,
            error: SubdocError::CantModifyVattr
        })
    );
    assert_eq!(
        lookup(&f, "missing", &["$vbucket"]).map(|_| ()),
        Err(EngineStatus::KeyNotFound)
    );
}
