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
        user_flags: None,
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
        user_flags: None,
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
    // 0xd1; virtual attributes cannot be written (0xd2).
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
        &single(Opcode::SubdocDictUpsert, k, b"$document.x1", 12, 0x04),
        k,
    )
    .await;
    assert_eq!(write.status(), Some(Status::SubdocXattrCantModifyVattr));
    assert!(c.get(k).await.unwrap().is_success());

    // ReplicaRead (doc flag 0x20, HELLO 0x1c): a single node's vBuckets are active, so a
    // replica read is NOT_MY_VBUCKET, as GET_REPLICA; on a mutation the flag is EINVAL.
    let agreed = c
        .hello("e2e-subdoc", &[Feature::Xerror, Feature::SubdocReplicaRead])
        .await
        .unwrap();
    assert!(agreed.contains(&Feature::SubdocReplicaRead.as_u16()));
    let mut specs = Vec::new();
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0, b"s");
    let replica = run(&mut c, &multi_lookup(k, 0x20, &specs), k).await;
    assert_eq!(replica.status(), Some(Status::NotMyVbucket));
    let mut specs = Vec::new();
    put_mutation_spec(&mut specs, Opcode::SubdocDictUpsert, 0, b"s", b"1");
    let refused = run(&mut c, &multi_mutation(k, 0x20, &specs, Cas::ANY), k).await;
    assert_eq!(refused.status(), Some(Status::Einval));

    // User flags in the extras (KV-Engine 7.6: 8 or 9 bytes on MULTI_MUTATION, 11 or 12
    // on a single path): the document's new flags; without them the flags are kept.
    let mut flagged = multi_mutation(k, 0x01, &specs, Cas::ANY);
    if let Command::SubdocMultiMutation { user_flags, .. } = &mut flagged {
        *user_flags = Some(0x0200_0000);
    }
    assert!(run(&mut c, &flagged, k).await.is_success());
    assert_eq!(c.get(k).await.unwrap().flags(), Some(0x0200_0000));
    let mut single = single(Opcode::SubdocDictUpsert, k, b"s2", 1, 0);
    if let Command::Subdoc { user_flags, .. } = &mut single {
        *user_flags = Some(7);
    }
    assert!(run(&mut c, &single, k).await.is_success());
    assert_eq!(c.get(k).await.unwrap().flags(), Some(7));
    assert!(
        run(&mut c, &multi_mutation(k, 0, &specs, Cas::ANY), k)
            .await
            .is_success()
    );
    assert_eq!(
        c.get(k).await.unwrap().flags(),
        Some(7),
        "kept without user flags"
    );
}

fn multi_mutation<'a>(key: &'a [u8], doc_flags: u8, specs: &'a [u8], cas: Cas) -> Command<'a> {
    Command::SubdocMultiMutation {
        key,
        doc_flags,
        expiry: 0,
        user_flags: None,
        specs,
        cas,
        durability: None,
        preserve_ttl: false,
    }
}

fn multi_lookup<'a>(key: &'a [u8], doc_flags: u8, specs: &'a [u8]) -> Command<'a> {
    Command::SubdocMultiLookup {
        key,
        doc_flags,
        specs,
    }
}

/// The values of a MULTI_LOOKUP body: `(status, value)` per spec.
fn lookup_results(body: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    let mut rest = body;
    while rest.len() >= 6 {
        let status = u16::from_be_bytes([rest[0], rest[1]]);
        let len = u32::from_be_bytes([rest[2], rest[3], rest[4], rest[5]]) as usize;
        out.push((status, rest[6..6 + len].to_vec()));
        rest = &rest[6 + len..];
    }
    out
}

/// Extended attributes through their life: written with a body and a macro, kept by body
/// writes, hidden from GET, system ones kept by a deletion (readable with ACCESS_DELETED,
/// across a restart, so from disk), a document created deleted and revived, and the
/// errors for bad flags and order.
#[tokio::test]
async fn extended_attributes_live_beside_the_body_and_system_ones_survive_deletion() {
    if skip_if_external("subdoc") {
        return;
    }
    let dir = crate::harness::TestDir::new();
    let server = Server::spawn_in(dir.path(), &[]);
    server.wait_warmed_up().await;
    let mut c = server.client().await;
    c.hello(
        "e2e-xattr",
        &[Feature::Xerror, Feature::Json, Feature::Xattr],
    )
    .await
    .unwrap();
    let k = b"xa-doc";
    // A user and a system attribute (with the CAS macro) and the body, in one command.
    let mut specs = Vec::new();
    put_mutation_spec(
        &mut specs,
        Opcode::SubdocDictUpsert,
        0x04 | 0x01,
        b"meta.by",
        b"\"ann\"",
    );
    put_mutation_spec(
        &mut specs,
        Opcode::SubdocDictUpsert,
        0x04 | 0x10,
        b"_sys.cas",
        b"\"${Mutation.CAS}\"",
    );
    put_mutation_spec(&mut specs, Opcode::Set, 0, b"", br#"{"v":1}"#);
    let made = run(&mut c, &multi_mutation(k, 0x01, &specs, Cas::ANY), k).await;
    assert_eq!(made.status(), Some(Status::Success), "{made:?}");
    // The macro holds the mutation's CAS (its 8 network-order bytes read little-endian).
    let mut specs = Vec::new();
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0x04, b"_sys.cas");
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0x04, b"meta");
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0x04, b"$XTOC");
    put_lookup_spec(&mut specs, Opcode::Get, 0, b"");
    let got = run(&mut c, &multi_lookup(k, 0, &specs), k).await;
    assert_eq!(got.status(), Some(Status::Success), "{got:?}");
    let r = lookup_results(&got.value);
    let expected_cas = format!(
        "\"0x{:016x}\"",
        u64::from_le_bytes(made.cas.0.to_be_bytes())
    );
    assert_eq!(String::from_utf8_lossy(&r[0].1), expected_cas);
    assert_eq!(r[1].1, br#"{"by":"ann"}"#);
    assert_eq!(r[2].1, br#"["meta","_sys"]"#);
    assert_eq!(r[3].1, br#"{"v":1}"#);
    // GET returns the body only, without the XATTR bit.
    let g = c.get(k).await.unwrap();
    assert_eq!(g.value.as_ref(), br#"{"v":1}"#);
    assert_eq!(g.datatype, Datatype::JSON);
    // A body write keeps the attributes; so do APPEND-style writes of the body.
    assert!(
        c.set(
            k,
            br#"{"v":2}"#,
            StoreOptions::new().datatype(Datatype::JSON)
        )
        .await
        .unwrap()
        .is_success()
    );
    let a = run(
        &mut c,
        &single(Opcode::SubdocGet, k, b"meta.by", 7, 0x04),
        k,
    )
    .await;
    assert_eq!(a.value.as_ref(), b"\"ann\"");
    assert_eq!(c.get(k).await.unwrap().value.as_ref(), br#"{"v":2}"#);

    // DELETE keeps the system attribute only; the document reads as absent, and with
    // ACCESS_DELETED its tombstone's attributes are readable (0xcd / 0xd3).
    assert!(c.delete(k, Cas::ANY).await.unwrap().is_success());
    assert_eq!(c.get(k).await.unwrap().status(), Some(Status::KeyEnoent));
    let mut specs = Vec::new();
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0x04, b"_sys.cas");
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0x04, b"$document.deleted");
    let plain = run(&mut c, &multi_lookup(k, 0, &specs), k).await;
    assert_eq!(plain.status(), Some(Status::KeyEnoent));
    let dead = run(&mut c, &multi_lookup(k, 0x04, &specs), k).await;
    assert_eq!(
        dead.status(),
        Some(Status::SubdocSuccessDeleted),
        "{dead:?}"
    );
    let r = lookup_results(&dead.value);
    assert_eq!(String::from_utf8_lossy(&r[0].1), expected_cas);
    assert_eq!(r[1].1, b"true");
    let mut user = Vec::new();
    put_lookup_spec(&mut user, Opcode::SubdocGet, 0x04, b"meta");
    let gone = run(&mut c, &multi_lookup(k, 0x04, &user), k).await;
    assert_eq!(gone.status(), Some(Status::SubdocMultiPathFailureDeleted));

    // A document created deleted, with an attribute; REVIVE makes it live.
    let t = b"xa-txn";
    let mut specs = Vec::new();
    put_mutation_spec(
        &mut specs,
        Opcode::SubdocDictUpsert,
        0x04,
        b"txn",
        br#"{"id":7}"#,
    );
    let created = run(&mut c, &multi_mutation(t, 0x02 | 0x08, &specs, Cas::ANY), t).await;
    assert_eq!(
        created.status(),
        Some(Status::SubdocSuccessDeleted),
        "{created:?}"
    );
    assert_eq!(c.get(t).await.unwrap().status(), Some(Status::KeyEnoent));
    let mut body = Vec::new();
    put_mutation_spec(&mut body, Opcode::SubdocDictUpsert, 0, b"x", b"1");
    let refused = run(
        &mut c,
        &multi_mutation(b"xa-other", 0x02 | 0x08, &body, Cas::ANY),
        b"xa-other",
    )
    .await;
    assert_eq!(
        refused.status(),
        Some(Status::SubdocDeletedDocumentCantHaveValue)
    );
    let not_dead = run(
        &mut c,
        &multi_mutation(b"xa-doc2", 0x04 | 0x10, &body, Cas::ANY),
        b"xa-doc2",
    )
    .await;
    assert_eq!(not_dead.status(), Some(Status::KeyEnoent));
    let mut revive = Vec::new();
    put_mutation_spec(
        &mut revive,
        Opcode::SubdocReplaceBodyWithXattr,
        0x04,
        b"txn",
        b"",
    );
    let revived = run(
        &mut c,
        &multi_mutation(t, 0x04 | 0x10, &revive, Cas::ANY),
        t,
    )
    .await;
    assert_eq!(revived.status(), Some(Status::Success), "{revived:?}");
    assert_eq!(c.get(t).await.unwrap().value.as_ref(), br#"{"id":7}"#);
    let again = run(
        &mut c,
        &multi_mutation(t, 0x04 | 0x10, &revive, Cas::ANY),
        t,
    )
    .await;
    assert_eq!(
        again.status(),
        Some(Status::SubdocCanOnlyReviveDeletedDocuments)
    );

    // Bad requests: attributes after body paths, a macro on a body path, an unknown
    // macro, a bad attribute key, a value with attributes from a client that did not
    // negotiate them.
    let mut late = Vec::new();
    put_mutation_spec(&mut late, Opcode::SubdocDictUpsert, 0, b"a", b"1");
    put_mutation_spec(&mut late, Opcode::SubdocDictUpsert, 0x04, b"b", b"1");
    let r = run(&mut c, &multi_mutation(t, 0, &late, Cas::ANY), t).await;
    assert_eq!(r.status(), Some(Status::SubdocInvalidXattrOrder));
    let r = run(
        &mut c,
        &single(Opcode::SubdocDictUpsert, t, b"a${Mutation.CAS}", 1, 0x10),
        t,
    )
    .await;
    assert_eq!(r.status(), Some(Status::SubdocXattrInvalidFlagCombo));
    let r = run(
        &mut c,
        &single(
            Opcode::SubdocDictUpsert,
            t,
            b"a\"${Mutation.nope}\"",
            1,
            0x14,
        ),
        t,
    )
    .await;
    assert_eq!(r.status(), Some(Status::SubdocXattrUnknownMacro));
    let r = run(
        &mut c,
        &single(Opcode::SubdocDictUpsert, t, b"#a1", 2, 0x04),
        t,
    )
    .await;
    assert_eq!(r.status(), Some(Status::SubdocPathEinval));
    let mut plain_client = server.client().await;
    let with_attrs = [0u8, 0, 0, 8, 0, 0, 0, 4, b'a', 0, b'1', 0, b'{', b'}'];
    let r = plain_client
        .set(
            b"xa-raw",
            &with_attrs,
            StoreOptions::new().datatype(Datatype::XATTR),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Einval));
    // One that negotiated them may store a value with its attributes; a malformed
    // section is refused.
    let r = c
        .set(
            b"xa-raw",
            &with_attrs,
            StoreOptions::new().datatype(Datatype::XATTR),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Success));
    assert_eq!(c.get(b"xa-raw").await.unwrap().value.as_ref(), b"{}");
    let bad = [0u8, 0, 0, 9, 0, 0, 0, 4, b'a', 0, b'1', 0, b'{', b'}'];
    let r = c
        .set(
            b"xa-bad",
            &bad,
            StoreOptions::new().datatype(Datatype::XATTR),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::Einval));

    // After a restart (clean), the tombstone's system attribute is read back from disk.
    drop(c);
    drop(plain_client);
    let _ = server.terminate();
    let server = Server::spawn_in(dir.path(), &[]);
    server.wait_warmed_up().await;
    let mut c = server.client().await;
    c.hello(
        "e2e-xattr",
        &[Feature::Xerror, Feature::Json, Feature::Xattr],
    )
    .await
    .unwrap();
    let mut specs = Vec::new();
    put_lookup_spec(&mut specs, Opcode::SubdocGet, 0x04, b"_sys.cas");
    let dead = run(&mut c, &multi_lookup(k, 0x04, &specs), k).await;
    assert_eq!(
        dead.status(),
        Some(Status::SubdocSuccessDeleted),
        "{dead:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&lookup_results(&dead.value)[0].1),
        expected_cas
    );
    let a = run(&mut c, &single(Opcode::SubdocGet, t, b"txn.id", 6, 0x04), t).await;
    assert_eq!(a.value.as_ref(), b"7");
}

/// A body write keeps the attributes of a document whose value (value eviction) or whole
/// self (full eviction) left memory, and of one loaded by warmup after a restart: the
/// write reads the old version back first.
#[tokio::test]
async fn attributes_survive_body_writes_after_eviction_and_restart() {
    if skip_if_external("xattr_eviction") {
        return;
    }
    for policy in ["value", "full"] {
        let dir = crate::harness::TestDir::new();
        let args = ["--eviction-policy", policy];
        let server = Server::spawn_in(dir.path(), &args);
        server.wait_warmed_up().await;
        let mut c = server.client().await;
        c.hello(
            "e2e-xattr-evict",
            &[Feature::Xerror, Feature::Json, Feature::Xattr],
        )
        .await
        .unwrap();
        let persisted = StoreOptions::new().durability(epkv_protocol::DurabilityRequirement {
            level: epkv_types::DurabilityLevel::PersistToMajority,
            timeout: Some(std::time::Duration::from_secs(20)),
        });
        let k = b"xe-doc";
        assert!(
            c.set(k, br#"{"v":1}"#, persisted)
                .await
                .unwrap()
                .is_success()
        );
        let r = run(
            &mut c,
            &single(Opcode::SubdocDictUpsert, k, b"_s\"kept\"", 2, 0x04),
            k,
        )
        .await;
        assert_eq!(r.status(), Some(Status::Success), "{policy}: {r:?}");
        // Persist the attribute, then evict the document.
        assert!(
            c.set(k, br#"{"v":2}"#, persisted)
                .await
                .unwrap()
                .is_success()
        );
        let vb = vbucket_for_key(k, NUM_VBUCKETS);
        // The SyncWrite's commit is persisted by the next flush (retry, bounded).
        let mut r = None;
        for _ in 0..500 {
            let got = c
                .request(RequestBuilder::new(Opcode::EvictKey).key(k).vbucket(vb))
                .await
                .unwrap();
            r = got.status();
            if r == Some(Status::Success) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(r, Some(Status::Success), "{policy}: evict");
        // A blind SET of the body.
        assert!(
            c.set(k, br#"{"v":3}"#, StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
        let a = run(&mut c, &single(Opcode::SubdocGet, k, b"_s", 2, 0x04), k).await;
        assert_eq!(a.value.as_ref(), b"\"kept\"", "{policy}: after eviction");
        assert!(
            c.set(k, br#"{"v":4}"#, persisted)
                .await
                .unwrap()
                .is_success()
        );
        drop(c);
        let _ = server.terminate();
        // After a restart (the vBucket learns at warmup that it holds attributes).
        let server = Server::spawn_in(dir.path(), &args);
        server.wait_warmed_up().await;
        let mut c = server.client().await;
        c.hello(
            "e2e-xattr-evict",
            &[Feature::Xerror, Feature::Json, Feature::Xattr],
        )
        .await
        .unwrap();
        let r = c
            .request(RequestBuilder::new(Opcode::EvictKey).key(k).vbucket(vb))
            .await
            .unwrap();
        assert!(
            r.status() == Some(Status::Success),
            "{policy}: evict after restart"
        );
        assert!(
            c.set(k, br#"{"v":5}"#, StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
        let a = run(&mut c, &single(Opcode::SubdocGet, k, b"_s", 2, 0x04), k).await;
        assert_eq!(a.value.as_ref(), b"\"kept\"", "{policy}: after the restart");
        assert_eq!(c.get(k).await.unwrap().value.as_ref(), br#"{"v":5}"#);
    }
}
