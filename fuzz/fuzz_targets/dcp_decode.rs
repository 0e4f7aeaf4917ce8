//! Runs arbitrary bytes through the DCP decoders: frame and parse each packet at the front
//! of the buffer as a connection would, then decode it both as a message a producer sends
//! (`DcpMessage::decode`) and as a request a client sends (`DcpRequest::decode`). Whatever
//! decodes must re-encode to the same value: a producer message through `DcpMessage::encode`,
//! a request's extras byte for byte, a failover log body byte for byte. The extras decoders
//! and the failover log decoder also get the raw input. A panic anywhere is a bug.
#![no_main]

use epkv_protocol::dcp::{
    BufferAck, DcpMessage, DcpOpen, DcpRequest, SeqnoAck, StreamReq, decode_failover_log_body,
    encode_failover_log_body,
};
use epkv_protocol::{HEADER_LEN, Limits, Request, frame_len};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

/// Checks that every extras decoder either rejects `extras` or gives back the same bytes.
fn extras_round_trip(extras: &[u8]) {
    if let Ok(open) = DcpOpen::decode(extras) {
        assert_eq!(open.to_extras(), extras);
        let _ = open.check_flags();
    }
    if let Ok(req) = StreamReq::decode(extras) {
        assert_eq!(req.to_extras(), extras);
    }
    if let Ok(ack) = BufferAck::decode(extras) {
        assert_eq!(ack.to_extras(), extras);
    }
    if let Ok(ack) = SeqnoAck::decode(extras) {
        assert_eq!(ack.to_extras(), extras);
    }
}

fn failover_log_round_trip(body: &[u8]) {
    match decode_failover_log_body(body) {
        Ok(entries) => assert_eq!(encode_failover_log_body(&entries), body),
        Err(_) => assert_ne!(body.len() % 16, 0),
    }
}

fuzz_target!(|data: &[u8]| {
    extras_round_trip(data);
    failover_log_round_trip(data);
    let limits = common::limits_for(data);
    let mut rest = data;
    let mut out = Vec::new();
    while let Ok(Some(n)) = frame_len(rest, &limits) {
        assert!(
            n >= HEADER_LEN && n <= rest.len(),
            "framed {n} of {}",
            rest.len()
        );
        let req = match Request::parse(&rest[..n], &limits) {
            Ok(req) => req,
            Err(e) => panic!("framed packet failed to parse: {e}"),
        };
        extras_round_trip(req.extras);
        failover_log_round_trip(req.value);
        if let Ok(msg) = DcpMessage::decode(&req) {
            assert_eq!(msg.opcode().as_u8(), req.header.opcode);
            out.clear();
            msg.encode(&mut out, req.header.opaque, req.header.vbucket)
                .unwrap_or_else(|e| panic!("decoded message does not re-encode: {e}"));
            let again = Request::parse(&out, &Limits::default())
                .unwrap_or_else(|e| panic!("re-encoded message does not parse: {e}"));
            assert_eq!(again.header.opaque, req.header.opaque);
            assert_eq!(DcpMessage::decode(&again), Ok(msg));
        }
        if let Ok(dcp) = DcpRequest::decode(&req) {
            assert_eq!(dcp.opcode().as_u8(), req.header.opcode);
            assert!(DcpMessage::decode(&req).is_err() || dcp == DcpRequest::Noop);
        }
        rest = &rest[n..];
    }
});
