//! Runs arbitrary bytes through the client's read path: decode the header at the front of
//! the buffer, parse the whole response, check that its sections add up to the announced
//! packet length and lie inside the input, re-encode it and parse the encoding again, then
//! move to the next packet. A panic anywhere is a bug (epkv-client decodes what a server,
//! possibly a hostile one, sends with exactly these calls).
#![no_main]

use epkv_protocol::{HEADER_LEN, Limits, Response, ResponseHeader};
use libfuzzer_sys::fuzz_target;

#[path = "common.rs"]
mod common;

fuzz_target!(|data: &[u8]| {
    let limits = common::limits_for(data);
    let mut rest = data;
    while let Some(head) = rest.first_chunk::<HEADER_LEN>() {
        let Ok(header) = ResponseHeader::decode(head, &limits) else {
            break;
        };
        let n = header.packet_len();
        assert!(n >= HEADER_LEN);
        assert!(n as u64 <= u64::from(limits.max_packet_bytes));
        let resp = match Response::parse(rest, &limits) {
            Ok(r) => r,
            Err(_) => break,
        };
        assert!(n <= rest.len(), "parsed a packet of {n} from {} bytes", rest.len());
        let body = resp.framing_extras.len() + resp.extras.len() + resp.key.len() + resp.value.len();
        assert_eq!(HEADER_LEN + body, n, "sections add up to the packet");
        let mut again = Vec::new();
        if resp.encode(&mut again).is_ok() {
            assert_eq!(again.len(), n);
            let back = Response::parse(&again, &Limits::default()).expect("own encoding parses");
            assert_eq!(back.key, resp.key);
            assert_eq!(back.value, resp.value);
            assert_eq!(back.extras, resp.extras);
            assert_eq!(back.status, resp.status);
        }
        rest = &rest[n..];
    }
});
