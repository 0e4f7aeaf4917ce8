//! Runs arbitrary bytes through the server's read path as a connection would: frame the
//! packet at the front of the buffer, parse it, decode its frame infos and command, encode
//! a reply, then move to the next packet; stop at the first untrusted header or when more
//! bytes are needed. Checks that consumed lengths never exceed the input, that parsed
//! sections add up to the framed length, and that whatever decodes re-encodes to the same
//! command. A panic anywhere is a bug.
#![no_main]

use epkv_protocol::{
    Command, HEADER_LEN, Limits, Request, RequestBuilder, Response, Status, frame_hint, frame_len,
};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let limits = common::limits_for(data);
    let mut rest = data;
    let mut out = Vec::new();
    loop {
        let hint = frame_hint(rest, &limits);
        let framed = frame_len(rest, &limits);
        match (&hint, &framed) {
            (Ok(h), Ok(Some(n))) => assert_eq!(h, n),
            (Ok(h), Ok(None)) => assert!(*h > rest.len() || rest.len() < HEADER_LEN),
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("frame_hint and frame_len disagree: {hint:?} vs {framed:?}"),
        }
        let n = match framed {
            Ok(Some(n)) => n,
            Ok(None) | Err(_) => break,
        };
        assert!(n >= HEADER_LEN && n <= rest.len(), "framed {n} of {}", rest.len());
        assert!(n as u64 <= u64::from(limits.max_packet_bytes));
        let req = match Request::parse(&rest[..n], &limits) {
            Ok(req) => req,
            Err(e) => panic!("framed packet failed to parse: {e}"),
        };
        let sections =
            req.framing_extras.len() + req.extras.len() + req.key.len() + req.value.len();
        assert_eq!(HEADER_LEN + sections, n);
        let _ = req.frame_info();
        out.clear();
        match Command::decode(&req) {
            Ok(cmd) => {
                let again = RequestBuilder::from_command(&cmd)
                    .to_vec()
                    .unwrap_or_else(|e| panic!("decoded command does not re-encode: {e}"));
                let req2 = Request::parse(&again, &Limits::default())
                    .unwrap_or_else(|e| panic!("re-encoded command does not parse: {e}"));
                assert_eq!(Command::decode(&req2), Ok(cmd));
                let _ = Response::for_request(&req, Status::Success)
                    .with_key(req.key)
                    .with_value(req.value)
                    .encode(&mut out);
            }
            Err(status) => {
                let _ = Response::error(&req, status).encode(&mut out);
            }
        }
        rest = &rest[n..];
    }
});
