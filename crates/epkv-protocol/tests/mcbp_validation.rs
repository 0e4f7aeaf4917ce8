//! Every validation rule of `Command::decode` and the framing functions, one test per rule,
//! through the public API only.
#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers panic on failure by design"
)]

use epkv_protocol::{
    ArithmeticOp, Command, DurabilityRequirement, Feature, HeaderError, HelloFeatures, Limits,
    Opcode, Request, RequestBuilder, Status, StoreOp, encode_frame_info, frame_len,
    is_durability_supported, is_preserve_ttl_supported,
};
use epkv_types::{Cas, Datatype, DurabilityLevel, VBucketState, Vbid};
use std::time::Duration;

fn decode_bytes(wire: &[u8]) -> Result<Command<'_>, Status> {
    let limits = Limits::default();
    let n = frame_len(wire, &limits).unwrap().expect("whole packet");
    assert_eq!(n, wire.len());
    let req = Request::parse(wire, &limits).unwrap();
    Command::decode(&req)
}

fn decode_with(b: RequestBuilder<'_>, check: impl FnOnce(Result<Command<'_>, Status>)) {
    let wire = b.to_vec().unwrap();
    check(decode_bytes(&wire));
}

fn status_of(b: RequestBuilder<'_>) -> Result<(), Status> {
    let wire = b.to_vec().unwrap();
    decode_bytes(&wire).map(|_| ())
}

const MAJORITY: DurabilityRequirement = DurabilityRequirement {
    level: DurabilityLevel::Majority,
    timeout: None,
};

/// A valid command for every implemented opcode.
fn sample(op: Opcode) -> Command<'static> {
    let key: &'static [u8] = b"key";
    let quiet = op.is_quiet();
    let store = |op| Command::Store {
        op,
        key,
        value: b"value",
        flags: 0xdead_beef,
        expiry: 3600,
        datatype: Datatype::RAW,
        cas: Cas::ANY,
        durability: None,
        preserve_ttl: false,
        quiet,
    };
    let concat = |op| Command::Store {
        op,
        key,
        value: b"tail",
        flags: 0,
        expiry: 0,
        datatype: Datatype::RAW,
        cas: Cas(42),
        durability: None,
        preserve_ttl: false,
        quiet,
    };
    let arith = |op| Command::Arithmetic {
        op,
        key,
        delta: 5,
        initial: 100,
        expiry: 0,
        durability: None,
        preserve_ttl: false,
        quiet,
    };
    match op {
        Opcode::GetReplica => Command::GetReplica { key: b"k" },
        Opcode::Get | Opcode::GetQ => Command::Get {
            key,
            with_key: false,
            quiet,
        },
        Opcode::GetK | Opcode::GetKQ => Command::Get {
            key,
            with_key: true,
            quiet,
        },
        Opcode::Set | Opcode::SetQ => store(StoreOp::Set),
        Opcode::Add | Opcode::AddQ => store(StoreOp::Add),
        Opcode::Replace | Opcode::ReplaceQ => store(StoreOp::Replace),
        Opcode::Append | Opcode::AppendQ => concat(StoreOp::Append),
        Opcode::Prepend | Opcode::PrependQ => concat(StoreOp::Prepend),
        Opcode::Delete | Opcode::DeleteQ => Command::Delete {
            key,
            cas: Cas(7),
            durability: None,
            quiet,
        },
        Opcode::Increment | Opcode::IncrementQ => arith(ArithmeticOp::Increment),
        Opcode::Decrement | Opcode::DecrementQ => arith(ArithmeticOp::Decrement),
        Opcode::Quit | Opcode::QuitQ => Command::Quit { quiet },
        Opcode::Flush | Opcode::FlushQ => Command::Flush { quiet },
        Opcode::Noop => Command::Noop,
        Opcode::Version => Command::Version,
        Opcode::Stat => Command::Stat { group: b"vbucket" },
        Opcode::Verbosity => Command::Verbosity { level: 2 },
        Opcode::Touch => Command::Touch {
            key,
            expiry: 10,
            durability: None,
        },
        Opcode::Gat | Opcode::GatQ => Command::Gat {
            key,
            expiry: 10,
            durability: None,
            quiet,
        },
        Opcode::Hello => Command::Hello {
            agent: b"{\"a\":\"test\"}",
            features: HelloFeatures::new(&[0, 3, 0, 0x0b, 0x12, 0x34]),
        },
        Opcode::GetLocked => Command::GetLocked {
            key,
            lock_timeout_secs: 15,
        },
        Opcode::UnlockKey => Command::UnlockKey { key, cas: Cas(99) },
        Opcode::EvictKey => Command::EvictKey { key },
        Opcode::GetMeta | Opcode::GetqMeta => Command::GetMeta {
            key,
            version: 2,
            quiet,
        },
        op if epkv_protocol::is_subdoc_lookup(op) => Command::Subdoc {
            op,
            key,
            body: b"a.b",
            path_len: 3,
            path_flags: 0,
            doc_flags: 0,
            expiry: 0,
            user_flags: None,
            cas: Cas::ANY,
            durability: None,
            preserve_ttl: false,
        },
        op if epkv_protocol::is_subdoc_mutation(op) => Command::Subdoc {
            op,
            key,
            body: b"a.b1",
            path_len: 3,
            path_flags: 0,
            doc_flags: 0,
            expiry: 0,
            user_flags: None,
            cas: Cas::ANY,
            durability: None,
            preserve_ttl: false,
        },
        Opcode::SubdocMultiLookup => Command::SubdocMultiLookup {
            key,
            doc_flags: 0,
            specs: &[0xc5, 0, 0, 1, b'a'],
        },
        Opcode::SubdocMultiMutation => Command::SubdocMultiMutation {
            key,
            doc_flags: 0,
            expiry: 0,
            user_flags: None,
            specs: &[0xc8, 0, 0, 1, 0, 0, 0, 1, b'a', b'1'],
            cas: Cas::ANY,
            durability: None,
            preserve_ttl: false,
        },
        Opcode::Observe => Command::Observe {
            keys: b"\x00\x05\x00\x03abc",
        },
        Opcode::SetVbucket => Command::SetVbucket {
            state: VBucketState::Replica,
        },
        Opcode::GetVbucket => Command::GetVbucket,
        Opcode::AdjustTimeofday => Command::AdjustTimeofday {
            offset_secs: -86_400,
        },
        Opcode::SaslListMechs => Command::SaslListMechs,
        Opcode::SaslAuth => Command::SaslAuth {
            mechanism: b"PLAIN",
            data: b"\0user\0pw",
        },
        Opcode::SaslStep => Command::SaslStep {
            mechanism: b"SCRAM-SHA512",
            data: b"c=biws,r=x,p=y",
        },
        Opcode::SelectBucket => Command::SelectBucket { name: b"travel" },
        Opcode::ObserveSeqno => Command::ObserveSeqno {
            vbucket_uuid: 0x0102_0304_0506_0708,
        },
        Opcode::GetClusterConfig => Command::GetClusterConfig {
            known_version: Some((1, 42)),
        },
        Opcode::GetErrorMap => Command::GetErrorMap { version: 2 },
        Opcode::GetCollectionsManifest => Command::GetCollectionsManifest,
        Opcode::GetRandomKey => Command::GetRandomKey {
            collection: 8,
            xattrs: true,
        },
        Opcode::GetCollectionId => Command::GetCollectionId { path: b"s.c" },
        Opcode::GetScopeId => Command::GetScopeId { path: b"s" },
        Opcode::RangeScanCreate => Command::RangeScanCreate {
            spec: br#"{"range":{"start":"YQ==","end":"eg=="}}"#,
        },
        Opcode::RangeScanContinue => {
            Command::RangeScanContinue(epkv_protocol::range_scan::ContinueRequest {
                id: [5; 16],
                item_limit: 100,
                time_limit_ms: 0,
                byte_limit: 4096,
            })
        }
        Opcode::RangeScanCancel => Command::RangeScanCancel { id: [6; 16] },
        other => panic!("no sample for implemented opcode {other:?}"),
    }
}

/// The implemented opcodes that are commands (DCP opcodes are decoded by `dcp` instead).
fn implemented() -> impl Iterator<Item = Opcode> {
    Opcode::ALL
        .iter()
        .copied()
        .filter(|op| op.is_implemented() && !op.is_dcp())
}

#[test]
fn every_implemented_opcode_decodes_its_sample() {
    for op in implemented() {
        let cmd = sample(op);
        assert_eq!(cmd.opcode(), op);
        let wire = RequestBuilder::from_command(&cmd)
            .vbucket(Vbid(9))
            .opaque(0x1234)
            .to_vec()
            .unwrap();
        let req = Request::parse(&wire, &Limits::default()).unwrap();
        assert_eq!(req.header.vbucket, Vbid(9));
        assert_eq!(req.header.opaque, 0x1234);
        assert_eq!(Command::decode(&req), Ok(cmd), "{op:?}");
    }
}

#[test]
fn unknown_and_unimplemented_opcodes_are_unknown_command() {
    assert_eq!(
        status_of(RequestBuilder::raw(0xee)),
        Err(Status::UnknownCommand)
    );
    assert_eq!(
        status_of(RequestBuilder::raw(0x23)),
        Err(Status::UnknownCommand)
    );
    for op in Opcode::ALL.iter().filter(|op| !op.is_implemented()) {
        assert_eq!(
            status_of(RequestBuilder::new(*op)),
            Err(Status::UnknownCommand),
            "{op:?}"
        );
    }
}

#[test]
fn datatype_with_unknown_bits_is_einval() {
    for op in implemented() {
        let b = RequestBuilder::from_command(&sample(op)).datatype(Datatype(0x08));
        assert_eq!(status_of(b), Err(Status::Einval), "{op:?}");
    }
}

#[test]
fn json_datatype_is_accepted_on_stores_only() {
    for op in implemented() {
        let b = RequestBuilder::from_command(&sample(op)).datatype(Datatype::JSON);
        let is_store = matches!(sample(op), Command::Store { .. });
        if op == Opcode::RangeScanCreate {
            // Its value must be JSON (checked below).
            assert_eq!(status_of(b), Ok(()), "{op:?}");
        } else if is_store || op == Opcode::SetVbucket {
            // SET_VBUCKET with JSON needs the one-byte form; checked separately.
            if is_store {
                assert_eq!(status_of(b), Ok(()), "{op:?}");
            }
        } else {
            assert_eq!(status_of(b), Err(Status::Einval), "{op:?}");
        }
    }
}

#[test]
fn snappy_is_accepted_on_stores_and_xattr_on_set_and_add_only() {
    // Snappy and XATTR are checked further by the front end (negotiated; a valid stream;
    // a valid attribute section).
    for op in [Opcode::Set, Opcode::Add, Opcode::Append] {
        let b = RequestBuilder::from_command(&sample(op)).datatype(Datatype::SNAPPY);
        assert_eq!(status_of(b), Ok(()), "{op:?}");
    }
    let get = RequestBuilder::from_command(&sample(Opcode::Get)).datatype(Datatype::SNAPPY);
    assert_eq!(status_of(get), Err(Status::Einval));
    for op in [Opcode::Set, Opcode::Add, Opcode::Replace] {
        for dt in [Datatype::XATTR, Datatype::ALL] {
            let b = RequestBuilder::from_command(&sample(op)).datatype(dt);
            assert_eq!(status_of(b), Ok(()), "{op:?} {dt:?}");
        }
    }
    for op in [Opcode::Append, Opcode::Prepend] {
        let b = RequestBuilder::from_command(&sample(op)).datatype(Datatype::XATTR);
        assert_eq!(status_of(b), Err(Status::Einval), "{op:?}");
    }
}

#[test]
fn wrong_extras_lengths_are_einval() {
    let junk = [0u8; 32];
    for op in implemented() {
        let wire = RequestBuilder::from_command(&sample(op)).to_vec().unwrap();
        let good = Request::parse(&wire, &Limits::default())
            .unwrap()
            .extras
            .len();
        for len in [1usize, 2, 3, 5, 7, 9, 19, 21, 32] {
            if len == good {
                continue;
            }
            if op == Opcode::SetVbucket && len == 1 {
                continue; // the one-byte form is valid
            }
            // Sub-document commands take several lengths (optional expiry and doc flags).
            let subdoc_ok: &[usize] = match op {
                Opcode::SubdocMultiLookup => &[0, 1],
                Opcode::SubdocMultiMutation => &[0, 1, 4, 5, 8, 9],
                op if epkv_protocol::is_subdoc_lookup(op) => &[3, 4],
                op if epkv_protocol::is_subdoc_mutation(op) => &[3, 4, 7, 8, 11, 12],
                _ => &[],
            };
            if subdoc_ok.contains(&len) {
                continue;
            }
            let b = RequestBuilder::from_command(&sample(op)).extras(&junk[..len]);
            assert_eq!(
                status_of(b),
                Err(Status::Einval),
                "{op:?} with {len} bytes of extras"
            );
        }
    }
}

#[test]
fn key_rules() {
    let long = [b'k'; 251];
    let max = [b'k'; 250];
    for op in implemented() {
        let cmd = sample(op);
        let needs_key = cmd.document_key().is_some()
            || matches!(
                op,
                Opcode::SaslAuth | Opcode::SaslStep | Opcode::SelectBucket
            );
        // GET_COLLECTION_ID and GET_SCOPE_ID take their path as the key or the value.
        let takes_key = needs_key
            || matches!(
                op,
                Opcode::Stat | Opcode::Hello | Opcode::GetCollectionId | Opcode::GetScopeId
            );
        let b = RequestBuilder::from_command(&cmd).key(&[]);
        if needs_key {
            assert_eq!(status_of(b), Err(Status::Einval), "{op:?} without key");
        } else {
            assert_eq!(status_of(b), Ok(()), "{op:?} without key");
        }
        let b = RequestBuilder::from_command(&cmd).key(b"k");
        if takes_key {
            assert_eq!(status_of(b), Ok(()), "{op:?} with key");
        } else {
            assert_eq!(status_of(b), Err(Status::Einval), "{op:?} with key");
        }
        if takes_key {
            assert_eq!(
                status_of(RequestBuilder::from_command(&cmd).key(&max)),
                Ok(()),
                "{op:?}"
            );
            assert_eq!(
                status_of(RequestBuilder::from_command(&cmd).key(&long)),
                Err(Status::Einval),
                "{op:?} with a 251-byte key"
            );
        }
    }
}

#[test]
fn value_rules() {
    for op in implemented() {
        let cmd = sample(op);
        // Three bytes: also wrong for the fixed-size values (OBSERVE_SEQNO's 8-byte UUID,
        // GET_ERROR_MAP's 2-byte version).
        let takes_value = matches!(
            cmd,
            Command::Store { .. }
                | Command::Hello { .. }
                | Command::SaslAuth { .. }
                | Command::SaslStep { .. }
                // The value is the path (then the value): "vvv" is a path.
                | Command::Subdoc { .. }
                | Command::GetCollectionId { .. }
                | Command::GetScopeId { .. }
                // Decoding checks the datatype only; the front end parses the JSON.
                | Command::RangeScanCreate { .. }
        );
        let value: &[u8] = if op == Opcode::Hello { b"vv" } else { b"vvv" };
        let b = RequestBuilder::from_command(&cmd).value(value);
        if takes_value {
            assert_eq!(status_of(b), Ok(()), "{op:?} with a value");
        } else {
            assert_eq!(status_of(b), Err(Status::Einval), "{op:?} with a value");
        }
    }
    // The fixed-size values must be there.
    for op in [Opcode::ObserveSeqno, Opcode::GetErrorMap] {
        let b = RequestBuilder::from_command(&sample(op)).value(&[]);
        assert_eq!(status_of(b), Err(Status::Einval), "{op:?} without a value");
    }
    let b = RequestBuilder::from_command(&Command::GetErrorMap { version: 2 }).value(&[0, 0]);
    assert_eq!(status_of(b), Err(Status::Einval), "error map version 0");
    // An empty value is a valid document.
    let b = RequestBuilder::from_command(&sample(Opcode::Set)).value(&[]);
    assert_eq!(status_of(b), Ok(()));
}

#[test]
fn cas_rules() {
    for op in implemented() {
        let cmd = sample(op);
        let b = RequestBuilder::from_command(&cmd).cas(Cas(1));
        let cas_allowed = matches!(
            op,
            Opcode::Set
                | Opcode::SetQ
                | Opcode::Replace
                | Opcode::ReplaceQ
                | Opcode::Append
                | Opcode::AppendQ
                | Opcode::Prepend
                | Opcode::PrependQ
                | Opcode::Delete
                | Opcode::DeleteQ
                | Opcode::UnlockKey
                | Opcode::SetVbucket
                | Opcode::SubdocMultiMutation
        ) || epkv_protocol::is_subdoc_mutation(op);
        if cas_allowed {
            assert_eq!(status_of(b), Ok(()), "{op:?} with CAS");
        } else {
            assert_eq!(status_of(b), Err(Status::Einval), "{op:?} with CAS");
        }
    }
    let b = RequestBuilder::from_command(&sample(Opcode::UnlockKey)).cas(Cas::ANY);
    assert_eq!(status_of(b), Err(Status::Einval), "UNLOCK_KEY needs a CAS");
}

#[test]
fn range_scan_create_needs_a_json_value() {
    let cmd = sample(Opcode::RangeScanCreate);
    let raw = RequestBuilder::from_command(&cmd).datatype(Datatype::RAW);
    assert_eq!(status_of(raw), Err(Status::Einval), "not JSON");
    let empty = RequestBuilder::from_command(&cmd).value(&[]);
    assert_eq!(status_of(empty), Err(Status::Einval), "no value");
    let snappy = RequestBuilder::from_command(&cmd).datatype(Datatype(0x03));
    assert_eq!(status_of(snappy), Err(Status::Einval), "compressed");
}

#[test]
fn hello_rules() {
    let b = RequestBuilder::new(Opcode::Hello)
        .key(b"agent")
        .value(&[0, 3, 0]);
    assert_eq!(status_of(b), Err(Status::Einval), "odd feature list");
    let unknown = [0xff, 0xff, 0, 0x0b, 0x7f, 0x00];
    decode_with(
        RequestBuilder::new(Opcode::Hello).value(&unknown),
        |r| match r {
            Ok(Command::Hello { agent, features }) => {
                assert!(agent.is_empty());
                assert_eq!(features.len(), 3);
                assert_eq!(
                    features.codes().collect::<Vec<_>>(),
                    vec![0xffff, 0x0b, 0x7f00]
                );
                assert_eq!(features.known().collect::<Vec<_>>(), vec![Feature::Json]);
            }
            other => panic!("{other:?}"),
        },
    );
    decode_with(RequestBuilder::new(Opcode::Hello), |r| match r {
        Ok(Command::Hello { features, .. }) => assert!(features.is_empty()),
        other => panic!("{other:?}"),
    });
}

#[test]
fn flush_extras_and_delay() {
    assert_eq!(status_of(RequestBuilder::new(Opcode::Flush)), Ok(()));
    assert_eq!(
        status_of(RequestBuilder::new(Opcode::Flush).extras(&[0; 4])),
        Ok(())
    );
    assert_eq!(
        status_of(RequestBuilder::new(Opcode::Flush).extras(&[0, 0, 0, 5])),
        Err(Status::NotSupported),
        "delayed flush"
    );
    assert_eq!(
        status_of(RequestBuilder::new(Opcode::FlushQ).extras(&[0; 2])),
        Err(Status::Einval)
    );
}

#[test]
fn get_locked_extras_are_optional() {
    decode_with(RequestBuilder::new(Opcode::GetLocked).key(b"k"), |r| {
        assert_eq!(
            r,
            Ok(Command::GetLocked {
                key: b"k",
                lock_timeout_secs: 0
            })
        );
    });
    decode_with(
        RequestBuilder::new(Opcode::GetLocked)
            .key(b"k")
            .extras(&[0, 0, 0, 30]),
        |r| {
            assert_eq!(
                r,
                Ok(Command::GetLocked {
                    key: b"k",
                    lock_timeout_secs: 30
                })
            );
        },
    );
}

#[test]
fn set_vbucket_accepts_kv_engine_encodings() {
    let ok = |b: RequestBuilder<'_>, state| {
        decode_with(b, |r| assert_eq!(r, Ok(Command::SetVbucket { state })));
    };
    ok(
        RequestBuilder::new(Opcode::SetVbucket).extras(&[0, 0, 0, 1]),
        VBucketState::Active,
    );
    ok(
        RequestBuilder::new(Opcode::SetVbucket).value(&[0, 0, 0, 4]),
        VBucketState::Dead,
    );
    ok(
        RequestBuilder::new(Opcode::SetVbucket).extras(&[3]),
        VBucketState::Pending,
    );
    ok(
        RequestBuilder::new(Opcode::SetVbucket)
            .extras(&[2])
            .value(b"{\"topology\":[[\"a\"]]}")
            .datatype(Datatype::JSON),
        VBucketState::Replica,
    );
    let bad = |b: RequestBuilder<'_>| assert_eq!(status_of(b), Err(Status::Einval));
    bad(RequestBuilder::new(Opcode::SetVbucket).extras(&[0, 0, 0, 0]));
    bad(RequestBuilder::new(Opcode::SetVbucket).extras(&[0, 0, 0, 5]));
    bad(RequestBuilder::new(Opcode::SetVbucket).extras(&[1, 0, 0, 1]));
    bad(RequestBuilder::new(Opcode::SetVbucket)
        .extras(&[0, 0, 0, 1])
        .value(&[0, 0, 0, 1]));
    bad(RequestBuilder::new(Opcode::SetVbucket));
    bad(RequestBuilder::new(Opcode::SetVbucket).value(&[0, 0, 1]));
    bad(RequestBuilder::new(Opcode::SetVbucket)
        .extras(&[1])
        .value(b"{}"));
    bad(RequestBuilder::new(Opcode::SetVbucket)
        .extras(&[0, 0, 0, 1])
        .datatype(Datatype::JSON));
}

#[test]
fn adjust_timeofday_is_signed_seconds() {
    decode_with(
        RequestBuilder::new(Opcode::AdjustTimeofday).extras(&(-5i64).to_be_bytes()),
        |r| {
            assert_eq!(r, Ok(Command::AdjustTimeofday { offset_secs: -5 }));
        },
    );
}

#[test]
fn durability_is_allowed_exactly_where_kv_engine_allows_it() {
    for op in implemented() {
        let b = RequestBuilder::from_command(&sample(op)).durability(MAJORITY);
        if is_durability_supported(op) {
            assert!(!op.is_quiet(), "{op:?}");
            assert_eq!(status_of(b), Ok(()), "{op:?}");
        } else {
            assert_eq!(status_of(b), Err(Status::Einval), "{op:?}");
        }
    }
    let durable: Vec<_> = implemented()
        .filter(|op| is_durability_supported(*op))
        .collect();
    assert_eq!(
        durable,
        vec![
            Opcode::Set,
            Opcode::Add,
            Opcode::Replace,
            Opcode::Delete,
            Opcode::Increment,
            Opcode::Decrement,
            Opcode::Append,
            Opcode::Prepend,
            Opcode::Touch,
            Opcode::Gat,
            Opcode::SubdocDictAdd,
            Opcode::SubdocDictUpsert,
            Opcode::SubdocDelete,
            Opcode::SubdocReplace,
            Opcode::SubdocArrayPushLast,
            Opcode::SubdocArrayPushFirst,
            Opcode::SubdocArrayInsert,
            Opcode::SubdocArrayAddUnique,
            Opcode::SubdocCounter,
            Opcode::SubdocMultiMutation,
        ]
    );
}

#[test]
fn durable_set_decodes_level_and_timeout() {
    let d = DurabilityRequirement {
        level: DurabilityLevel::PersistToMajority,
        timeout: Some(Duration::from_millis(9000)),
    };
    let wire = RequestBuilder::from_command(&sample(Opcode::Set))
        .durability(d)
        .to_vec()
        .unwrap();
    assert_eq!(wire[0], 0x08, "alt magic");
    assert_eq!(wire[2], 4, "framing extras length");
    assert_eq!(wire[3], 3, "one-byte key length");
    match decode_bytes(&wire) {
        Ok(Command::Store { durability, .. }) => assert_eq!(durability, Some(d)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn preserve_ttl_is_allowed_exactly_where_kv_engine_allows_it() {
    for op in implemented() {
        let b = RequestBuilder::from_command(&sample(op)).preserve_ttl();
        if is_preserve_ttl_supported(op) {
            assert_eq!(status_of(b), Ok(()), "{op:?}");
        } else {
            assert_eq!(status_of(b), Err(Status::NotSupported), "{op:?}");
        }
    }
    for op in [
        Opcode::Add,
        Opcode::AddQ,
        Opcode::Touch,
        Opcode::Gat,
        Opcode::Get,
        Opcode::Delete,
    ] {
        assert!(!is_preserve_ttl_supported(op), "{op:?}");
    }
    for op in [
        Opcode::Set,
        Opcode::SetQ,
        Opcode::Replace,
        Opcode::Increment,
        Opcode::AppendQ,
    ] {
        assert!(is_preserve_ttl_supported(op), "{op:?}");
    }
}

#[test]
fn frame_info_errors_reach_the_client() {
    let frames = |id: u16, data: &[u8]| {
        let mut v = Vec::new();
        encode_frame_info(&mut v, id, data).unwrap();
        v
    };
    let set = sample(Opcode::Set);
    let cases: Vec<(Vec<u8>, Status)> = vec![
        (frames(1, &[1, 0, 0]), Status::Einval),
        (frames(1, &[1, 0xff, 0xff]), Status::Einval),
        (frames(1, &[1, 2]), Status::Einval),
        (frames(1, &[0]), Status::DurabilityInvalidLevel),
        (frames(1, &[4]), Status::DurabilityInvalidLevel),
        (frames(5, &[1]), Status::Einval),
        (frames(0, &[1]), Status::Einval),
        (frames(4, b"user"), Status::NotSupported),
        (frames(9, &[]), Status::UnknownFrameInfo),
        (frames(200, &[1, 2, 3]), Status::UnknownFrameInfo),
        (vec![0x13, 1], Status::Einval),
        (vec![0xf0], Status::Einval),
    ];
    for (raw, want) in cases {
        let b = RequestBuilder::from_command(&set).raw_framing_extras(&raw);
        assert_eq!(status_of(b), Err(want), "frames {raw:02x?}");
    }
    // A barrier is harmless; alt magic without frames is fine.
    let barrier = frames(0, &[]);
    assert_eq!(
        status_of(RequestBuilder::from_command(&set).raw_framing_extras(&barrier)),
        Ok(())
    );
    assert_eq!(
        status_of(RequestBuilder::from_command(&set).alt_magic()),
        Ok(())
    );
}

#[test]
fn header_errors_close_the_connection() {
    let limits = Limits::default();
    let get = RequestBuilder::new(Opcode::Get).key(b"k").to_vec().unwrap();
    // Truncated header and truncated body: need more bytes.
    for n in 0..get.len() {
        assert_eq!(frame_len(&get[..n], &limits), Ok(None), "prefix {n}");
        assert!(matches!(
            Request::parse(&get[..n], &limits),
            Err(HeaderError::Incomplete { .. })
        ));
    }
    assert_eq!(frame_len(&get, &limits), Ok(Some(get.len())));

    let mut bad = get.clone();
    bad[0] = 0x42;
    assert_eq!(
        frame_len(&bad, &limits),
        Err(HeaderError::UnknownMagic(0x42))
    );
    for magic in [0x81u8, 0x18, 0x82, 0x83] {
        bad[0] = magic;
        assert_eq!(
            frame_len(&bad, &limits),
            Err(HeaderError::UnexpectedMagic(magic))
        );
    }

    // A 4 GiB body length is refused from the header alone.
    let mut huge = get.clone();
    huge[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        frame_len(&huge[..24], &limits),
        Err(HeaderError::PacketTooLarge { .. })
    ));

    // Exactly at the limit is accepted, one more byte is not.
    let small = Limits {
        max_packet_bytes: 30,
    };
    let mut at = get.clone();
    at[8..12].copy_from_slice(&6u32.to_be_bytes());
    assert_eq!(frame_len(&at[..24], &small), Ok(None));
    at[8..12].copy_from_slice(&7u32.to_be_bytes());
    assert!(matches!(
        frame_len(&at[..24], &small),
        Err(HeaderError::PacketTooLarge { .. })
    ));

    // Key length larger than the body.
    let mut lying = get.clone();
    lying[2..4].copy_from_slice(&2u16.to_be_bytes());
    assert!(matches!(
        frame_len(&lying, &limits),
        Err(HeaderError::LengthsExceedBody { .. })
    ));
    // Extras plus key larger than the body.
    let mut lying = get.clone();
    lying[4] = 1;
    assert!(matches!(
        frame_len(&lying, &limits),
        Err(HeaderError::LengthsExceedBody { .. })
    ));
    // Framing extras larger than the body (alt magic).
    let mut lying = RequestBuilder::new(Opcode::Get)
        .key(b"k")
        .alt_magic()
        .to_vec()
        .unwrap();
    lying[2] = 5;
    assert!(matches!(
        frame_len(&lying, &limits),
        Err(HeaderError::LengthsExceedBody { .. })
    ));
}

#[test]
fn alt_magic_reads_one_byte_key_length() {
    let wire = RequestBuilder::new(Opcode::Get)
        .key(b"abc")
        .alt_magic()
        .to_vec()
        .unwrap();
    assert_eq!(&wire[..4], &[0x08, 0x00, 0x00, 0x03]);
    assert_eq!(
        decode_bytes(&wire),
        Ok(Command::Get {
            key: b"abc",
            with_key: false,
            quiet: false
        })
    );
    let long = [b'x'; 256];
    assert!(
        RequestBuilder::new(Opcode::Get)
            .key(&long)
            .alt_magic()
            .to_vec()
            .is_err()
    );
}
