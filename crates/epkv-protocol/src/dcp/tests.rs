use super::*;
use crate::command::Command;
use crate::header_error::EncodeError;
use crate::limits::{HEADER_LEN, Limits};
use crate::opcode::Opcode;
use crate::request::Request;
use crate::request_builder::RequestBuilder;
use crate::status::Status;
use epkv_types::{Cas, Datatype, DurabilityLevel, VBucketState, Vbid};
use proptest::prelude::*;

fn parse(wire: &[u8]) -> Request<'_> {
    let req = Request::parse(wire, &Limits::default()).unwrap();
    assert_eq!(req.packet_len(), wire.len(), "one whole packet");
    req
}

fn message(wire: &[u8]) -> Result<DcpMessage<'_>, Status> {
    DcpMessage::decode(&parse(wire))
}

fn request(wire: &[u8]) -> Result<DcpRequest<'_>, Status> {
    DcpRequest::decode(&parse(wire))
}

/// Builds a magic 0x80 packet field by field, independently of the crate's encoders, to
/// compare with them.
#[expect(
    clippy::too_many_arguments,
    reason = "one argument per header field keeps the expected bytes readable"
)]
fn raw_packet(
    opcode: u8,
    datatype: u8,
    vbid: u16,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) -> Vec<u8> {
    let mut v = vec![0x80, opcode];
    v.extend_from_slice(&u16::try_from(key.len()).unwrap().to_be_bytes());
    v.push(u8::try_from(extras.len()).unwrap());
    v.push(datatype);
    v.extend_from_slice(&vbid.to_be_bytes());
    let body = extras.len() + key.len() + value.len();
    v.extend_from_slice(&u32::try_from(body).unwrap().to_be_bytes());
    v.extend_from_slice(&opaque.to_be_bytes());
    v.extend_from_slice(&cas.to_be_bytes());
    v.extend_from_slice(extras);
    v.extend_from_slice(key);
    v.extend_from_slice(value);
    v
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn sample_meta() -> DcpDocMeta {
    DcpDocMeta {
        by_seqno: 4,
        rev_seqno: 1,
        cas: Cas(0x1122_3344_5566_7788),
        flags: 0xdead_beef,
        expiration: 3600,
        lock_time: 0,
        datatype: Datatype::JSON,
        nru: 2,
    }
}

/// The meta a deletion or expiration decodes to: only the fields on its wire.
fn deletion_meta() -> DcpDocMeta {
    DcpDocMeta {
        flags: 0,
        expiration: 0,
        lock_time: 0,
        nru: 0,
        ..sample_meta()
    }
}

// --- Layouts checked against the examples in kv_engine's docs/dcp ---------------------

#[test]
fn open_matches_the_documented_example() {
    let mut out = Vec::new();
    encode_open(&mut out, 1, b"bucketstream vb[100-105]", 0).unwrap();
    let expected = raw_packet(0x50, 0, 0, 1, 0, &[0; 8], b"bucketstream vb[100-105]", b"");
    assert_eq!(out, expected);
    assert_eq!(out[2..4], [0x00, 0x18]);
    assert_eq!(out[8..12], [0, 0, 0, 0x20]);
    assert_eq!(
        request(&out),
        Ok(DcpRequest::Open {
            open: DcpOpen { seqno: 0, flags: 0 },
            name: b"bucketstream vb[100-105]",
            value: b"",
        })
    );
}

#[test]
fn stream_req_matches_the_documented_example() {
    let req = StreamReq {
        flags: 0,
        reserved: 0,
        start_seqno: 0x00ff_eedd,
        end_seqno: u64::MAX,
        vbucket_uuid: 0xfeed_deca,
        snap_start_seqno: 0,
        snap_end_seqno: 0x00ff_eeff,
    };
    let mut out = Vec::new();
    encode_stream_req(&mut out, 0x1000, Vbid(0), &req).unwrap();
    let extras = cat(&[
        &0u32.to_be_bytes(),
        &0u32.to_be_bytes(),
        &0x00ff_eeddu64.to_be_bytes(),
        &u64::MAX.to_be_bytes(),
        &0xfeed_decau64.to_be_bytes(),
        &0u64.to_be_bytes(),
        &0x00ff_eeffu64.to_be_bytes(),
    ]);
    assert_eq!(out, raw_packet(0x53, 0, 0, 0x1000, 0, &extras, b"", b""));
    assert_eq!(request(&out), Ok(DcpRequest::StreamReq { req, value: b"" }));
}

#[test]
fn snapshot_marker_v1_matches_the_documented_example() {
    let mut out = Vec::new();
    encode_snapshot_marker(&mut out, 0xdead_beef, Vbid(0), 0, 8, SNAPSHOT_MEMORY).unwrap();
    let extras = cat(&[
        &0u64.to_be_bytes(),
        &8u64.to_be_bytes(),
        &1u32.to_be_bytes(),
    ]);
    assert_eq!(
        out,
        raw_packet(0x56, 0, 0, 0xdead_beef, 0, &extras, b"", b"")
    );
    assert_eq!(
        message(&out),
        Ok(DcpMessage::SnapshotMarker(SnapshotMarker {
            start_seqno: 0,
            end_seqno: 8,
            flags: SNAPSHOT_MEMORY,
            ..SnapshotMarker::default()
        }))
    );
}

#[test]
fn snapshot_marker_v2_matches_the_documented_example() {
    let mut out = Vec::new();
    encode_snapshot_marker_v2(
        &mut out,
        0xdead_beef,
        Vbid(0),
        1,
        8,
        SNAPSHOT_DISK,
        8,
        Some(7),
    )
    .unwrap();
    let value = cat(&[
        &1u64.to_be_bytes(),
        &8u64.to_be_bytes(),
        &2u32.to_be_bytes(),
        &8u64.to_be_bytes(),
        &7u64.to_be_bytes(),
    ]);
    assert_eq!(
        out,
        raw_packet(0x56, 0, 0, 0xdead_beef, 0, &[0], b"", &value)
    );
    assert_eq!(out[8..12], [0, 0, 0, 0x25]);
    assert_eq!(
        message(&out),
        Ok(DcpMessage::SnapshotMarker(SnapshotMarker {
            start_seqno: 1,
            end_seqno: 8,
            flags: SNAPSHOT_DISK,
            max_visible_seqno: Some(8),
            high_completed_seqno: Some(7),
            timestamp: None,
        }))
    );
}

#[test]
fn mutation_matches_the_documented_example() {
    let meta = DcpDocMeta {
        by_seqno: 4,
        rev_seqno: 1,
        ..DcpDocMeta::default()
    };
    let mut out = Vec::new();
    encode_mutation(&mut out, 0x1210, Vbid(0x0210), &meta, b"hello", b"world").unwrap();
    let extras = cat(&[&4u64.to_be_bytes(), &1u64.to_be_bytes(), &[0; 15]]);
    assert_eq!(extras.len(), 31);
    assert_eq!(
        out,
        raw_packet(0x57, 0, 0x0210, 0x1210, 0, &extras, b"hello", b"world")
    );
    assert_eq!(out[8..12], [0, 0, 0, 0x29]);
    assert_eq!(
        message(&out),
        Ok(DcpMessage::Mutation {
            meta,
            key: b"hello",
            value: b"world"
        })
    );
}

#[test]
fn deletion_v1_matches_the_documented_example() {
    let meta = DcpDocMeta {
        by_seqno: 5,
        rev_seqno: 1,
        ..DcpDocMeta::default()
    };
    let mut out = Vec::new();
    encode_deletion(&mut out, 0x1210, Vbid(0x0210), &meta, b"hello", b"", None).unwrap();
    let extras = cat(&[&5u64.to_be_bytes(), &1u64.to_be_bytes(), &[0, 0]]);
    assert_eq!(
        out,
        raw_packet(0x58, 0, 0x0210, 0x1210, 0, &extras, b"hello", b"")
    );
    assert_eq!(out[8..12], [0, 0, 0, 0x17]);
}

#[test]
fn expiration_matches_the_documented_example() {
    let meta = DcpDocMeta {
        by_seqno: 5,
        rev_seqno: 1,
        ..DcpDocMeta::default()
    };
    let mut out = Vec::new();
    encode_expiration(&mut out, 0x1210, Vbid(0x0210), &meta, b"hello", b"", 0).unwrap();
    let extras = cat(&[
        &5u64.to_be_bytes(),
        &1u64.to_be_bytes(),
        &0u32.to_be_bytes(),
    ]);
    assert_eq!(extras.len(), 20);
    assert_eq!(
        out,
        raw_packet(0x59, 0, 0x0210, 0x1210, 0, &extras, b"hello", b"")
    );
}

#[test]
fn prepare_matches_the_documented_layout() {
    let meta = DcpDocMeta {
        by_seqno: 4,
        rev_seqno: 1,
        cas: Cas(9),
        ..DcpDocMeta::default()
    };
    let mut out = Vec::new();
    encode_prepare(
        &mut out,
        0x1210,
        Vbid(0x0210),
        &meta,
        b"hello",
        b"world",
        DocumentState::Alive,
        DurabilityLevel::Majority,
    )
    .unwrap();
    let extras = cat(&[
        &4u64.to_be_bytes(),
        &1u64.to_be_bytes(),
        &[0; 12],
        &[0, 0, 1],
    ]);
    assert_eq!(extras.len(), 31);
    assert_eq!(
        out,
        raw_packet(0x60, 0, 0x0210, 0x1210, 9, &extras, b"hello", b"world")
    );
    assert_eq!(out[8..12], [0, 0, 0, 0x29]);
}

#[test]
fn commit_and_abort_match_the_documented_examples() {
    let extras = cat(&[&4u64.to_be_bytes(), &5u64.to_be_bytes()]);
    let mut out = Vec::new();
    encode_commit(&mut out, 0x1210, Vbid(0x0210), b"hello", 4, 5).unwrap();
    assert_eq!(
        out,
        raw_packet(0x62, 0, 0x0210, 0x1210, 0, &extras, b"hello", b"")
    );
    assert_eq!(out[8..12], [0, 0, 0, 0x15]);
    out.clear();
    encode_abort(&mut out, 0x1210, Vbid(0x0210), b"hello", 4, 5).unwrap();
    assert_eq!(
        out,
        raw_packet(0x63, 0, 0x0210, 0x1210, 0, &extras, b"hello", b"")
    );
}

#[test]
fn small_messages_match_their_documented_layouts() {
    let mut out = Vec::new();
    encode_stream_end(&mut out, 0xdead_beef, Vbid(0), StreamEndReason::Ok).unwrap();
    assert_eq!(
        out,
        raw_packet(0x55, 0, 0, 0xdead_beef, 0, &[0; 4], b"", b"")
    );
    out.clear();
    encode_noop(&mut out, 5).unwrap();
    assert_eq!(out, raw_packet(0x5c, 0, 0, 5, 0, b"", b"", b""));
    out.clear();
    encode_buffer_ack(&mut out, 5, 0x1000).unwrap();
    assert_eq!(
        out,
        raw_packet(0x5d, 0, 0, 5, 0, &[0, 0, 0x10, 0], b"", b"")
    );
    out.clear();
    encode_seqno_ack(&mut out, 0x1210, Vbid(0x0210), 4).unwrap();
    assert_eq!(
        out,
        raw_packet(0x61, 0, 0x0210, 0x1210, 0, &4u64.to_be_bytes(), b"", b"")
    );
    out.clear();
    encode_close_stream(&mut out, 0xdead_beef, Vbid(5)).unwrap();
    assert_eq!(out, raw_packet(0x52, 0, 5, 0xdead_beef, 0, b"", b"", b""));
    out.clear();
    encode_get_failover_log(&mut out, 0xdead_beef, Vbid(0)).unwrap();
    assert_eq!(out, raw_packet(0x54, 0, 0, 0xdead_beef, 0, b"", b"", b""));
    out.clear();
    encode_seqno_advanced(&mut out, 0xdead_beef, Vbid(0), 4).unwrap();
    assert_eq!(
        out,
        raw_packet(0x64, 0, 0, 0xdead_beef, 0, &4u64.to_be_bytes(), b"", b"")
    );
    out.clear();
    encode_control(&mut out, 1, b"enable_noop", b"true").unwrap();
    assert_eq!(
        out,
        raw_packet(0x5e, 0, 0, 1, 0, b"", b"enable_noop", b"true")
    );
}

#[test]
fn system_event_matches_the_documented_example() {
    let value = cat(&[
        &2u64.to_be_bytes(),
        &8u32.to_be_bytes(),
        &0u32.to_be_bytes(),
        &72000u32.to_be_bytes(),
    ]);
    let mut out = Vec::new();
    encode_system_event(
        &mut out,
        0x1210,
        Vbid(0x0210),
        4,
        0,
        1,
        b"mycollection",
        &value,
    )
    .unwrap();
    let extras = cat(&[&4u64.to_be_bytes(), &0u32.to_be_bytes(), &[1]]);
    assert_eq!(
        out,
        raw_packet(0x5f, 0, 0x0210, 0x1210, 0, &extras, b"mycollection", &value)
    );
    assert_eq!(out[8..12], [0, 0, 0, 0x2d]);
    assert_eq!(out.len(), 69);
}

#[test]
fn failover_log_body_matches_the_documented_example() {
    let entries = [
        (0xfeed_deca, 0x5432),
        (0x00de_cafe, 0x0134_3214),
        (0xfeed_face, 4),
        (0xdead_beef, 0x6524),
    ];
    let body = encode_failover_log_body(&entries);
    assert_eq!(body.len(), 0x40);
    assert_eq!(
        body[..16],
        cat(&[&0xfeed_decau64.to_be_bytes(), &0x5432u64.to_be_bytes()])
    );
    assert_eq!(decode_failover_log_body(&body), Ok(entries.to_vec()));
    assert_eq!(decode_failover_log_body(&[]), Ok(vec![]));
    for len in [1, 8, 15, 17, 31, 33] {
        assert_eq!(
            decode_failover_log_body(&vec![0; len]),
            Err(Status::Einval),
            "{len}"
        );
    }
}

// --- Round trips ------------------------------------------------------------------------

fn round_trip(msg: DcpMessage<'_>) {
    let mut out = Vec::new();
    msg.encode(&mut out, 0xabcd, Vbid(77)).unwrap();
    let req = parse(&out);
    assert_eq!(req.header.opaque, 0xabcd);
    assert_eq!(
        req.header.vbucket,
        Vbid(if msg == DcpMessage::Noop { 0 } else { 77 })
    );
    assert_eq!(req.opcode(), Some(msg.opcode()));
    assert_eq!(DcpMessage::decode(&req), Ok(msg));
}

#[test]
fn every_producer_message_round_trips() {
    let meta = sample_meta();
    let del = deletion_meta();
    let messages = [
        DcpMessage::SnapshotMarker(SnapshotMarker {
            start_seqno: 1,
            end_seqno: 9,
            flags: SNAPSHOT_MEMORY | SNAPSHOT_CHECKPOINT,
            ..SnapshotMarker::default()
        }),
        DcpMessage::SnapshotMarker(SnapshotMarker {
            start_seqno: 1,
            end_seqno: 9,
            flags: SNAPSHOT_MEMORY,
            max_visible_seqno: Some(8),
            high_completed_seqno: None,
            timestamp: None,
        }),
        DcpMessage::SnapshotMarker(SnapshotMarker {
            start_seqno: 0,
            end_seqno: 9,
            flags: SNAPSHOT_DISK | SNAPSHOT_ACK,
            max_visible_seqno: Some(9),
            high_completed_seqno: Some(3),
            timestamp: None,
        }),
        DcpMessage::SnapshotMarker(SnapshotMarker {
            start_seqno: 0,
            end_seqno: 9,
            flags: SNAPSHOT_DISK,
            max_visible_seqno: Some(9),
            high_completed_seqno: Some(3),
            timestamp: Some(1_700_000_000),
        }),
        DcpMessage::Mutation {
            meta,
            key: b"\x00key",
            value: b"{\"a\":1}",
        },
        DcpMessage::Mutation {
            meta,
            key: b"k",
            value: b"",
        },
        DcpMessage::Deletion {
            meta: del,
            key: b"k",
            value: b"",
            delete_time: None,
        },
        DcpMessage::Deletion {
            meta: DcpDocMeta {
                datatype: Datatype::XATTR,
                ..del
            },
            key: b"k",
            value: b"\x00\x00\x00\x00",
            delete_time: Some(1_700_000_001),
        },
        DcpMessage::Expiration {
            meta: del,
            key: b"k",
            value: b"",
            delete_time: 42,
        },
        DcpMessage::StreamEnd {
            reason: StreamEndReason::Rollback.as_u32(),
        },
        DcpMessage::StreamEnd { reason: 999 },
        DcpMessage::Noop,
        DcpMessage::Prepare {
            meta,
            key: b"k",
            value: b"v",
            state: DocumentState::Alive,
            level: DurabilityLevel::PersistToMajority,
        },
        DcpMessage::Prepare {
            meta,
            key: b"k",
            value: b"",
            state: DocumentState::Deleted,
            level: DurabilityLevel::MajorityAndPersistOnMaster,
        },
        DcpMessage::Commit {
            key: b"k",
            prepared_seqno: 4,
            commit_seqno: 5,
        },
        DcpMessage::Abort {
            key: b"k",
            prepared_seqno: 4,
            abort_seqno: 6,
        },
        DcpMessage::SeqnoAdvanced { seqno: 12 },
        DcpMessage::SystemEvent {
            by_seqno: 3,
            event_id: 1,
            version: 0,
            key: b"",
            value: b"\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x08",
        },
        DcpMessage::SetVbucketState {
            state: VBucketState::Active,
        },
        DcpMessage::OsoSnapshot { flags: OSO_START },
        DcpMessage::OsoSnapshot { flags: OSO_END },
    ];
    for msg in messages {
        round_trip(msg);
    }
}

#[test]
fn snapshot_marker_v2_without_disk_flag_decodes_no_high_completed_seqno() {
    let mut out = Vec::new();
    encode_snapshot_marker_v2(&mut out, 1, Vbid(1), 1, 2, SNAPSHOT_MEMORY, 2, Some(1)).unwrap();
    let Ok(DcpMessage::SnapshotMarker(m)) = message(&out) else {
        panic!("not a marker");
    };
    assert_eq!(m.max_visible_seqno, Some(2));
    assert_eq!(m.high_completed_seqno, None);
    out.clear();
    encode_snapshot_marker_v2(&mut out, 1, Vbid(1), 1, 2, SNAPSHOT_DISK, 2, None).unwrap();
    assert_eq!(parse(&out).extras, [0], "version 2.0 even without an HCS");
    let Ok(DcpMessage::SnapshotMarker(m)) = message(&out) else {
        panic!("not a marker");
    };
    assert_eq!(m.high_completed_seqno, Some(0));
}

#[test]
fn every_consumer_request_round_trips() {
    let mut out = Vec::new();
    encode_open(
        &mut out,
        1,
        b"replication:n1:n2",
        OPEN_PRODUCER | OPEN_INCLUDE_XATTRS,
    )
    .unwrap();
    assert_eq!(
        request(&out),
        Ok(DcpRequest::Open {
            open: DcpOpen {
                seqno: 0,
                flags: OPEN_PRODUCER | OPEN_INCLUDE_XATTRS
            },
            name: b"replication:n1:n2",
            value: b"",
        })
    );
    let req = StreamReq {
        flags: STREAM_ACTIVE_VB_ONLY | STREAM_STRICT_VBUUID,
        reserved: 0,
        start_seqno: 10,
        end_seqno: u64::MAX,
        vbucket_uuid: 0x0123_4567_89ab_cdef,
        snap_start_seqno: 8,
        snap_end_seqno: 12,
    };
    let cases: Vec<(Vec<u8>, DcpRequest<'static>, Vbid)> = vec![
        (
            {
                let mut v = Vec::new();
                encode_stream_req(&mut v, 7, Vbid(3), &req).unwrap();
                v
            },
            DcpRequest::StreamReq { req, value: b"" },
            Vbid(3),
        ),
        (
            {
                let mut v = Vec::new();
                encode_close_stream(&mut v, 7, Vbid(3)).unwrap();
                v
            },
            DcpRequest::CloseStream,
            Vbid(3),
        ),
        (
            {
                let mut v = Vec::new();
                encode_get_failover_log(&mut v, 7, Vbid(4)).unwrap();
                v
            },
            DcpRequest::GetFailoverLog,
            Vbid(4),
        ),
        (
            {
                let mut v = Vec::new();
                encode_noop(&mut v, 7).unwrap();
                v
            },
            DcpRequest::Noop,
            Vbid(0),
        ),
        (
            {
                let mut v = Vec::new();
                encode_buffer_ack(&mut v, 7, 123_456).unwrap();
                v
            },
            DcpRequest::BufferAck(BufferAck { bytes: 123_456 }),
            Vbid(0),
        ),
        (
            {
                let mut v = Vec::new();
                encode_control(&mut v, 7, b"connection_buffer_size", b"1048576").unwrap();
                v
            },
            DcpRequest::Control {
                key: b"connection_buffer_size",
                value: b"1048576",
            },
            Vbid(0),
        ),
        (
            {
                let mut v = Vec::new();
                encode_seqno_ack(&mut v, 7, Vbid(5), 99).unwrap();
                v
            },
            DcpRequest::SeqnoAck(SeqnoAck { prepared_seqno: 99 }),
            Vbid(5),
        ),
    ];
    for (wire, expected, vbid) in cases {
        let req = parse(&wire);
        assert_eq!(req.header.opaque, 7);
        assert_eq!(req.header.vbucket, vbid);
        assert_eq!(req.opcode(), Some(expected.opcode()));
        assert_eq!(DcpRequest::decode(&req), Ok(expected));
    }
}

#[test]
fn extras_codecs_round_trip() {
    let open = DcpOpen {
        seqno: 7,
        flags: OPEN_PRODUCER | OPEN_INCLUDE_DELETE_TIMES,
    };
    assert_eq!(DcpOpen::decode(&open.to_extras()), Ok(open));
    assert!(open.is_producer());
    let req = StreamReq {
        flags: 1,
        reserved: 2,
        start_seqno: 3,
        end_seqno: 4,
        vbucket_uuid: 5,
        snap_start_seqno: 6,
        snap_end_seqno: 7,
    };
    assert_eq!(StreamReq::decode(&req.to_extras()), Ok(req));
    let ack = BufferAck { bytes: u32::MAX };
    assert_eq!(BufferAck::decode(&ack.to_extras()), Ok(ack));
    let sack = SeqnoAck {
        prepared_seqno: u64::MAX - 1,
    };
    assert_eq!(SeqnoAck::decode(&sack.to_extras()), Ok(sack));
}

#[test]
fn stream_end_reasons_round_trip_their_wire_values() {
    for v in 0..=8 {
        let reason = StreamEndReason::from_u32(v).unwrap();
        assert_eq!(reason.as_u32(), v);
    }
    assert_eq!(StreamEndReason::from_u32(9), None);
    assert_eq!(StreamEndReason::LostPrivileges.as_u32(), 8);
}

// --- Rejections -------------------------------------------------------------------------

#[test]
fn extras_decoders_reject_every_other_length() {
    let buf = [0u8; 64];
    for len in 0..=buf.len() {
        let extras = &buf[..len];
        assert_eq!(DcpOpen::decode(extras).is_ok(), len == 8, "{len}");
        assert_eq!(StreamReq::decode(extras).is_ok(), len == 48, "{len}");
        assert_eq!(BufferAck::decode(extras).is_ok(), len == 4, "{len}");
        assert_eq!(SeqnoAck::decode(extras).is_ok(), len == 8, "{len}");
        for r in [
            DcpOpen::decode(extras).map(|_| ()),
            StreamReq::decode(extras).map(|_| ()),
            BufferAck::decode(extras).map(|_| ()),
            SeqnoAck::decode(extras).map(|_| ()),
        ] {
            assert!(matches!(r, Ok(()) | Err(Status::Einval)));
        }
    }
}

/// Re-encodes a valid packet with `extras` of another length (the body follows).
fn with_extras(wire: &[u8], extras: &[u8]) -> Vec<u8> {
    let req = parse(wire);
    raw_packet(
        req.header.opcode,
        req.header.datatype.0,
        req.header.vbucket.0,
        req.header.opaque,
        req.header.cas.0,
        extras,
        req.key,
        req.value,
    )
}

/// Valid samples of every message a producer sends, on the wire.
fn producer_samples() -> Vec<Vec<u8>> {
    let meta = sample_meta();
    let mut all = Vec::new();
    let mut push = |f: &dyn Fn(&mut Vec<u8>) -> Result<(), EncodeError>| {
        let mut v = Vec::new();
        f(&mut v).unwrap();
        all.push(v);
    };
    push(&|o| encode_snapshot_marker(o, 1, Vbid(1), 1, 2, SNAPSHOT_MEMORY));
    push(&|o| encode_snapshot_marker_v2(o, 1, Vbid(1), 1, 2, SNAPSHOT_DISK, 2, Some(1)));
    push(&|o| encode_mutation(o, 1, Vbid(1), &meta, b"k", b"v"));
    push(&|o| encode_deletion(o, 1, Vbid(1), &meta, b"k", b"", None));
    push(&|o| encode_deletion(o, 1, Vbid(1), &meta, b"k", b"", Some(5)));
    push(&|o| encode_expiration(o, 1, Vbid(1), &meta, b"k", b"", 5));
    push(&|o| encode_stream_end(o, 1, Vbid(1), StreamEndReason::Closed));
    push(&|o| {
        encode_prepare(
            o,
            1,
            Vbid(1),
            &meta,
            b"k",
            b"v",
            DocumentState::Alive,
            DurabilityLevel::Majority,
        )
    });
    push(&|o| encode_commit(o, 1, Vbid(1), b"k", 1, 2));
    push(&|o| encode_abort(o, 1, Vbid(1), b"k", 1, 2));
    push(&|o| encode_seqno_advanced(o, 1, Vbid(1), 3));
    push(&|o| encode_system_event(o, 1, Vbid(1), 3, 0, 0, b"c", b"v"));
    push(&|o| encode_set_vbucket_state(o, 1, Vbid(1), VBucketState::Replica));
    push(&|o| encode_oso_snapshot(o, 1, Vbid(1), OSO_START));
    all
}

#[test]
fn message_decoder_rejects_short_and_long_extras() {
    for wire in producer_samples() {
        assert!(message(&wire).is_ok(), "sample {:#04x} decodes", wire[1]);
        let good = parse(&wire).extras.len();
        for len in 0..=64usize {
            // Deletions come in two versions. A marker's extras are 20 bytes (version 1)
            // or 1 (version 2.x), but each also needs its own value, so only the sample's
            // length fits the sample's value.
            let valid = len == good || (wire[1] == 0x58 && (len == 18 || len == 21));
            let bad = with_extras(&wire, &vec![0x01; len]);
            let got = message(&bad);
            if !valid {
                assert_eq!(
                    got,
                    Err(Status::Einval),
                    "opcode {:#04x} extras {len}",
                    wire[1]
                );
            }
        }
    }
}

#[test]
fn request_decoder_rejects_short_and_long_extras() {
    let mut samples = Vec::new();
    let mut push = |f: &dyn Fn(&mut Vec<u8>) -> Result<(), EncodeError>| {
        let mut v = Vec::new();
        f(&mut v).unwrap();
        samples.push(v);
    };
    push(&|o| encode_open(o, 1, b"name", 0));
    push(&|o| encode_stream_req(o, 1, Vbid(1), &StreamReq::default()));
    push(&|o| encode_close_stream(o, 1, Vbid(1)));
    push(&|o| encode_get_failover_log(o, 1, Vbid(1)));
    push(&|o| encode_noop(o, 1));
    push(&|o| encode_buffer_ack(o, 1, 1));
    push(&|o| encode_control(o, 1, b"k", b"v"));
    push(&|o| encode_seqno_ack(o, 1, Vbid(1), 1));
    for wire in samples {
        assert!(request(&wire).is_ok(), "sample {:#04x} decodes", wire[1]);
        let good = parse(&wire).extras.len();
        for len in (0..=64usize).filter(|&l| l != good) {
            let bad = with_extras(&wire, &vec![0; len]);
            assert_eq!(
                request(&bad),
                Err(Status::Einval),
                "opcode {:#04x} extras {len}",
                wire[1]
            );
        }
    }
}

#[test]
fn message_decoder_checks_keys_values_cas_and_datatype() {
    let meta = sample_meta();
    let encode = |f: &dyn Fn(&mut Vec<u8>) -> Result<(), EncodeError>| {
        let mut v = Vec::new();
        f(&mut v).unwrap();
        v
    };
    // Documents need a key.
    let w = encode(&|o| encode_mutation(o, 1, Vbid(1), &meta, b"", b"v"));
    assert_eq!(message(&w), Err(Status::Einval));
    let w = encode(&|o| encode_deletion(o, 1, Vbid(1), &meta, b"", b"", None));
    assert_eq!(message(&w), Err(Status::Einval));
    let w = encode(&|o| encode_commit(o, 1, Vbid(1), b"", 1, 2));
    assert_eq!(message(&w), Err(Status::Einval));
    // A by_seqno of 0 is no change.
    let zero = DcpDocMeta {
        by_seqno: 0,
        ..meta
    };
    let w = encode(&|o| encode_mutation(o, 1, Vbid(1), &zero, b"k", b"v"));
    assert_eq!(message(&w), Err(Status::Einval));
    // A prepare needs a CAS and a valid level.
    let no_cas = DcpDocMeta {
        cas: Cas::ANY,
        ..meta
    };
    let prepare = |m: &DcpDocMeta| {
        encode(&|o| {
            encode_prepare(
                o,
                1,
                Vbid(1),
                m,
                b"k",
                b"v",
                DocumentState::Alive,
                DurabilityLevel::Majority,
            )
        })
    };
    assert_eq!(message(&prepare(&no_cas)), Err(Status::Einval));
    let mut w = prepare(&meta);
    let level_at = HEADER_LEN + 30;
    for level in [0u8, 4, 0xff] {
        w[level_at] = level;
        assert_eq!(message(&w), Err(Status::Einval), "level {level}");
    }
    // Commits carry no value and no CAS.
    let commit = encode(&|o| encode_commit(o, 1, Vbid(1), b"k", 1, 2));
    let req = parse(&commit);
    let with_value = raw_packet(0x62, 0, 1, 1, 0, req.extras, b"k", b"v");
    assert_eq!(message(&with_value), Err(Status::Einval));
    let with_cas = raw_packet(0x62, 0, 1, 1, 5, req.extras, b"k", b"");
    assert_eq!(message(&with_cas), Err(Status::Einval));
    // Unknown datatype bits, and datatype bits on a message that is not a document.
    let mut w = encode(&|o| encode_mutation(o, 1, Vbid(1), &meta, b"k", b"v"));
    w[5] = 0x08;
    assert_eq!(message(&w), Err(Status::Einval));
    let mut w = encode(&|o| encode_stream_end(o, 1, Vbid(1), StreamEndReason::Ok));
    w[5] = Datatype::JSON.0;
    assert_eq!(message(&w), Err(Status::Einval));
    // A v1 marker has no value; a v2 marker's value has an exact length and version.
    let marker = encode(&|o| encode_snapshot_marker(o, 1, Vbid(1), 1, 2, 1));
    let req = parse(&marker);
    let w = raw_packet(0x56, 0, 1, 1, 0, req.extras, b"", b"x");
    assert_eq!(message(&w), Err(Status::Einval));
    for (version, len) in [
        (0u8, 35),
        (0, 37),
        (0, 44),
        (1, 36),
        (1, 43),
        (2, 36),
        (2, 44),
    ] {
        let w = raw_packet(0x56, 0, 1, 1, 0, &[version], b"", &vec![0; len]);
        assert_eq!(
            message(&w),
            Err(Status::Einval),
            "version {version} value {len}"
        );
    }
    // vBucket states are 1..=4.
    for state in [0u8, 5] {
        let w = raw_packet(0x5b, 0, 1, 1, 0, &[state], b"", b"");
        assert_eq!(message(&w), Err(Status::Einval));
    }
}

#[test]
fn message_decoder_leaves_client_requests_and_other_opcodes_unknown() {
    let mut w = Vec::new();
    encode_open(&mut w, 1, b"n", 0).unwrap();
    assert_eq!(message(&w), Err(Status::UnknownCommand));
    let w = raw_packet(0x00, 0, 0, 0, 0, b"", b"k", b"");
    assert_eq!(message(&w), Err(Status::UnknownCommand));
    let w = raw_packet(0xee, 0, 0, 0, 0, b"", b"", b"");
    assert_eq!(message(&w), Err(Status::UnknownCommand));
    let mut w = Vec::new();
    encode_mutation(&mut w, 1, Vbid(1), &sample_meta(), b"k", b"v").unwrap();
    assert_eq!(request(&w), Err(Status::UnknownCommand));
    let w = raw_packet(0x51, 0, 1, 1, 0, &[0; 4], b"", b"");
    assert_eq!(request(&w), Err(Status::UnknownCommand), "DCP_ADD_STREAM");
}

#[test]
fn open_checks_flags_and_the_value_datatype() {
    for flags in [
        OPEN_NOTIFIER,
        0x10,
        0x80,
        0x200,
        OPEN_NO_VALUE | OPEN_NO_VALUE_WITH_UNDERLYING_DATATYPE,
        OPEN_INCLUDE_DELETED_USER_XATTRS,
    ] {
        let mut w = Vec::new();
        encode_open(&mut w, 1, b"n", flags).unwrap();
        assert_eq!(request(&w), Err(Status::Einval), "flags {flags:#x}");
    }
    for flags in [0, OPEN_FLAGS & !OPEN_NO_VALUE] {
        let mut w = Vec::new();
        encode_open(&mut w, 1, b"n", flags).unwrap();
        assert!(request(&w).is_ok(), "flags {flags:#x}");
    }
    let extras = DcpOpen { seqno: 0, flags: 0 }.to_extras();
    let json = br#"{"consumer_name":"r"}"#;
    let w = raw_packet(0x50, Datatype::JSON.0, 0, 1, 0, &extras, b"n", json);
    assert_eq!(
        request(&w),
        Ok(DcpRequest::Open {
            open: DcpOpen::default(),
            name: b"n",
            value: json,
        })
    );
    let w = raw_packet(0x50, 0, 0, 1, 0, &extras, b"n", json);
    assert_eq!(
        request(&w),
        Err(Status::Einval),
        "a value needs datatype JSON"
    );
    let w = raw_packet(0x50, Datatype::JSON.0, 0, 1, 0, &extras, b"n", b"");
    assert_eq!(
        request(&w),
        Err(Status::Einval),
        "no value needs datatype RAW"
    );
    let w = raw_packet(0x50, 0, 0, 1, 0, &extras, b"", b"");
    assert_eq!(request(&w), Err(Status::Einval), "a name is required");
}

#[test]
fn request_decoder_checks_keys_values_cas_and_frames() {
    let w = raw_packet(0x5e, 0, 0, 1, 0, b"", b"k", b"");
    assert_eq!(request(&w), Err(Status::Einval), "control needs a value");
    let w = raw_packet(0x5e, 0, 0, 1, 0, b"", b"", b"v");
    assert_eq!(request(&w), Err(Status::Einval), "control needs a key");
    let w = raw_packet(0x52, 0, 1, 1, 0, b"", b"k", b"");
    assert_eq!(request(&w), Err(Status::Einval), "close stream has no key");
    let w = raw_packet(0x61, 0, 1, 1, 9, &1u64.to_be_bytes(), b"", b"");
    assert_eq!(request(&w), Err(Status::Einval), "seqno ack has no CAS");
    let w = raw_packet(0x5d, Datatype::JSON.0, 0, 1, 0, &[0; 4], b"", b"");
    assert_eq!(request(&w), Err(Status::Einval), "buffer ack is RAW");
    // A stream request may carry a JSON filter in its value (datatype RAW, as kv_engine).
    let extras = StreamReq::default().to_extras();
    let filter = br#"{"collections":["8"]}"#;
    let w = raw_packet(0x53, 0, 1, 1, 0, &extras, b"", filter);
    assert_eq!(
        request(&w),
        Ok(DcpRequest::StreamReq {
            req: StreamReq::default(),
            value: filter,
        })
    );
    // Frames: durability is invalid, PreserveTtl unsupported, stream ids not implemented.
    let framed = |frames: &[u8]| {
        let mut v = Vec::new();
        RequestBuilder::new(Opcode::DcpNoop)
            .raw_framing_extras(frames)
            .encode(&mut v)
            .unwrap();
        v
    };
    assert_eq!(request(&framed(&[0x11, 0x01])), Err(Status::Einval));
    assert_eq!(request(&framed(&[0x50])), Err(Status::NotSupported));
    assert_eq!(
        request(&framed(&[0x22, 0x00, 0x01])),
        Err(Status::NotSupported)
    );
    assert_eq!(
        request(&framed(&[0x00])),
        Ok(DcpRequest::Noop),
        "a barrier is harmless"
    );
}

#[test]
fn dcp_opcodes_are_not_commands() {
    for op in Opcode::ALL.iter().copied().filter(|op| op.is_dcp()) {
        let w = raw_packet(op.as_u8(), 0, 0, 0, 0, b"", b"", b"");
        assert_eq!(
            Command::decode(&parse(&w)),
            Err(Status::UnknownCommand),
            "{op:?}"
        );
    }
}

// --- Properties -------------------------------------------------------------------------

fn meta_strategy() -> impl Strategy<Value = DcpDocMeta> {
    (
        1..=u64::MAX,
        any::<u64>(),
        1..=u64::MAX,
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        0u8..=7,
        any::<u8>(),
    )
        .prop_map(
            |(by_seqno, rev_seqno, cas, flags, expiration, lock_time, datatype, nru)| DcpDocMeta {
                by_seqno,
                rev_seqno,
                cas: Cas(cas),
                flags,
                expiration,
                lock_time,
                datatype: Datatype(datatype),
                nru,
            },
        )
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_decoders(bytes in prop::collection::vec(any::<u8>(), 0..160)) {
        let _ = DcpOpen::decode(&bytes);
        let _ = StreamReq::decode(&bytes);
        let _ = BufferAck::decode(&bytes);
        let _ = SeqnoAck::decode(&bytes);
        if let Ok(log) = decode_failover_log_body(&bytes) {
            prop_assert_eq!(encode_failover_log_body(&log), bytes.clone());
        }
        if let Ok(req) = Request::parse(&bytes, &Limits::default()) {
            if let Ok(msg) = DcpMessage::decode(&req) {
                let mut again = Vec::new();
                msg.encode(&mut again, req.header.opaque, req.header.vbucket).unwrap();
                prop_assert_eq!(DcpMessage::decode(&parse(&again)), Ok(msg));
            }
            let _ = DcpRequest::decode(&req);
        }
    }

    #[test]
    fn arbitrary_dcp_packets_never_panic_the_decoders(
        opcode in 0x50u8..=0x65,
        datatype in 0u8..=8,
        cas in prop::sample::select(vec![0u64, 1, u64::MAX]),
        extras in prop::collection::vec(any::<u8>(), 0..64),
        key in prop::collection::vec(any::<u8>(), 0..8),
        value in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let wire = raw_packet(opcode, datatype, 1, 2, cas, &extras, &key, &value);
        let req = parse(&wire);
        if let Ok(msg) = DcpMessage::decode(&req) {
            let mut again = Vec::new();
            msg.encode(&mut again, 2, Vbid(1)).unwrap();
            prop_assert_eq!(DcpMessage::decode(&parse(&again)), Ok(msg));
        }
        let _ = DcpRequest::decode(&req);
    }

    #[test]
    fn documents_round_trip(
        meta in meta_strategy(),
        key in prop::collection::vec(any::<u8>(), 1..40),
        value in prop::collection::vec(any::<u8>(), 0..100),
        delete_time in prop::option::of(any::<u32>()),
        deleted in any::<bool>(),
        level in 1u8..=3,
        opaque in any::<u32>(),
        vbid in any::<u16>(),
    ) {
        let level = DurabilityLevel::from_u8(level).unwrap();
        let state = if deleted { DocumentState::Deleted } else { DocumentState::Alive };
        let del = DcpDocMeta { flags: 0, expiration: 0, lock_time: 0, nru: 0, ..meta };
        let messages = [
            DcpMessage::Mutation { meta, key: &key, value: &value },
            DcpMessage::Deletion { meta: del, key: &key, value: &value, delete_time },
            DcpMessage::Expiration {
                meta: del, key: &key, value: &value, delete_time: delete_time.unwrap_or(0),
            },
            DcpMessage::Prepare { meta, key: &key, value: &value, state, level },
        ];
        for msg in messages {
            let mut out = Vec::new();
            msg.encode(&mut out, opaque, Vbid(vbid)).unwrap();
            let req = parse(&out);
            prop_assert_eq!(req.header.opaque, opaque);
            prop_assert_eq!(req.header.vbucket, Vbid(vbid));
            prop_assert_eq!(DcpMessage::decode(&req), Ok(msg));
        }
    }

    #[test]
    fn stream_requests_round_trip(
        fields in (any::<u32>(), any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>(),
                   any::<u64>(), any::<u64>()),
        opaque in any::<u32>(),
        vbid in any::<u16>(),
    ) {
        let (flags, reserved, start_seqno, end_seqno, vbucket_uuid, snap_start_seqno,
             snap_end_seqno) = fields;
        let req = StreamReq {
            flags, reserved, start_seqno, end_seqno, vbucket_uuid, snap_start_seqno,
            snap_end_seqno,
        };
        let mut out = Vec::new();
        encode_stream_req(&mut out, opaque, Vbid(vbid), &req).unwrap();
        prop_assert_eq!(request(&out), Ok(DcpRequest::StreamReq { req, value: b"" }));
    }

    #[test]
    fn failover_logs_round_trip(entries in prop::collection::vec((any::<u64>(), any::<u64>()), 0..20)) {
        let body = encode_failover_log_body(&entries);
        prop_assert_eq!(body.len(), entries.len() * FAILOVER_ENTRY_LEN);
        prop_assert_eq!(decode_failover_log_body(&body), Ok(entries));
    }
}
