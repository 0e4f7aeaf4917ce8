//! Sub-document commands on the wire (issue 20): single-path lookups and mutations with
//! their status codes, MULTI_LOOKUP's per-path results, and MULTI_MUTATION's all-or-none
//! failure body (`index | status` of the first failed spec). The SDK's `lookup_in` and
//! `mutate_in` are tested in tests/python.

use crate::harness::{Server, skip_if_external};
use epkv_client::{Client, Response, StoreOptions};
use epkv_protocol::{
    Command, Feature, Opcode, RequestBuilder, Status, put_lookup_spec, put_mutation_spec,
};
use epkv_types::{Cas, Datatype, NUM_VBUCKETS, vbucket_for_key};

fn single<'a>(
    op: Opcode,
    key: &'a [u8],
    body: &'a [u8],
    path_len: usize,
    flags: u8,
) -> Command<'a> {
    Command::Subdoc {
        op,
        key,
        body,
        path_len,
        path_flags: flags,
        doc_flags: 0,
        expiry: 0,
        cas: Cas::ANY,
        durability: None,
        preserve_ttl: false,
    }
}

async fn run(c: &mut Client, cmd: &Command<'_>, key: &[u8]) -> Response {
    let req = RequestBuilder::from_command(cmd).vbucket(vbucket_for_key(key, NUM_VBUCKETS));
    c.request(req).await.unwrap()
}

#[tokio::test]
async fn subdoc_commands_answer_in_kv_engines_formats() {
    if skip_if_external("subdoc") {
        return;
    }
    let server = Server::spawn(&[]);
    server.wait_warmed_up().await;
    let mut c = server.client().await;
    c.hello("e2e-subdoc", &[Feature::Xerror, Feature::Json])
        .await
        .unwrap();
    let k = b"sd-doc";
    let doc = br#"{"a":{"b":[1,2,3]},"s":"x"}"#;
    let set = c
        .set(k, doc, StoreOptions::new().datatype(Datatype::JSON))
        .await
        .unwrap();
    assert!(set.is_success());

    let got = run(&mut c, &single(Opcode::SubdocGet, k, b"a.b[1]", 6, 0), k).await;
    assert_eq!(
        (got.status(), got.value.as_ref()),
        (Some(Status::Success), &b"2"[..])
    );
    assert_eq!(got.cas, set.cas);
    let count = run(&mut c, &single(Opcode::SubdocGetCount, k, b"a.b", 3, 0), k).await;
    assert_eq!(count.value.as_ref(), b"3");
    let missing = run(&mut c, &single(Opcode::SubdocExists, k, b"a.c", 3, 0), k).await;
    assert_eq!(missing.status(), Some(Status::SubdocPathEnoent));
    let mismatch = run(&mut c, &single(Opcode::SubdocGet, k, b"s.t", 3, 0), k).await;
    assert_eq!(mismatch.status(), Some(Status::SubdocPathMismatch));
    let invalid = run(&mut c, &single(Opcode::SubdocGet, k, b"a..b", 4, 0), k).await;
    assert_eq!(invalid.status(), Some(Status::SubdocPathEinval));
    let absent = run(
        &mut c,
        &single(Opcode::SubdocGet, b"sd-none", b"a", 1, 0),
        b"sd-none",
    )
    .await;
    assert_eq!(absent.status(), Some(Status::KeyEnoent));

    // COUNTER returns the new value; a mutation gives a new CAS.
    let ctr = run(&mut c, &single(Opcode::SubdocCounter, k, b"n10", 1, 0), k).await;
    assert_eq!(
        (ctr.status(), ctr.value.as_ref()),
        (Some(Status::Success), &b"10"[..])
    );
    assert!(ctr.cas > set.cas);
    let bad_delta = run(&mut c, &single(Opcode::SubdocCounter, k, b"nx", 1, 0), k).await;
    assert_eq!(bad_delta.status(), Some(Status::SubdocDeltaEinval));
    let nested = run(
        &mut c,
        &single(Opcode::SubdocDictUpsert, k, b"p.q1", 3, 0),
        k,
    )
    .await;
    assert_eq!(nested.status(), Some(Status::SubdocPathEnoent));
    let mkdir = run(
        &mut c,
        &single(Opcode::SubdocDictUpsert, k, b"p.q1", 3, 0x01),
        k,
    )
    .await;
    assert_eq!(mkdir.status(), Some(Status::Success));

    // MULTI_LOOKUP: per-path status and value.
    let mut specs = Vec::new();
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0, b"s");
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0, b"zz");
    let multi = run(
        &mut c,
        &Command::SubdocMultiLookup {
            key: k,
            doc_flags: 0,
            specs: &specs,
        },
        k,
    )
    .await;
    assert_eq!(multi.status(), Some(Status::SubdocMultiPathFailure));
    let v = multi.value.as_ref();
    assert_eq!(&v[..6], &[0, 0, 0, 0, 0, 3]);
    assert_eq!(&v[6..9], b"\"x\"");
    assert_eq!(&v[9..15], &[0, 0xc0, 0, 0, 0, 0]);

    // MULTI_MUTATION: the second spec fails, so the first is not applied either.
    let mut specs = Vec::new();
    put_mutation_spec(
        &mut specs,
        Opcode::SubdocDictUpsert,
        0,
        b"s",
        b"\"changed\"",
    );
    put_mutation_spec(&mut specs, Opcode::SubdocDictAdd, 0, b"a", b"1");
    let cmd = Command::SubdocMultiMutation {
        key: k,
        doc_flags: 0,
        expiry: 0,
        specs: &specs,
        cas: Cas::ANY,
        durability: None,
        preserve_ttl: false,
    };
    let failed = run(&mut c, &cmd, k).await;
    assert_eq!(failed.status(), Some(Status::SubdocMultiPathFailure));
    assert_eq!(failed.value.as_ref(), &[1, 0, 0xc9]);
    let s = run(&mut c, &single(Opcode::SubdocGet, k, b"s", 1, 0), k).await;
    assert_eq!(s.value.as_ref(), b"\"x\"", "nothing applied");

    // The virtual extended attribute `$document` can be read; an unknown `$` name is
    // 0xd1; writing extended attributes is not supported yet.
    let vattr = run(
        &mut c,
        &single(Opcode::SubdocGet, k, b"$document.revid", 15, 0x04),
        k,
    )
    .await;
    assert_eq!(vattr.status(), Some(Status::Success), "{vattr:?}");
    let unknown = run(&mut c, &single(Opcode::SubdocGet, k, b"$nope", 5, 0x04), k).await;
    assert_eq!(unknown.status(), Some(Status::SubdocXattrUnknownVattr));
    let write = run(
        &mut c,
        &single(Opcode::SubdocDictUpsert, k, b"ux1", 2, 0x04),
        k,
    )
    .await;
    assert_eq!(write.status(), Some(Status::NotSupported));
    assert!(c.get(k).await.unwrap().is_success());
}
