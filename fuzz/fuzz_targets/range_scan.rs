//! Runs arbitrary bytes through the range scan payload decoders: the create JSON
//! (`CreateRequest::parse`), the continue extras, and the packed keys and documents of a
//! continue response. Checks what a parsed create promises (keys of at most 250 bytes,
//! at least one sample, a name of at most 50 bytes), that continue extras round-trip,
//! and that the keys and documents decoded from a value encode back to the bytes they
//! came from. A panic anywhere is a bug.
#![no_main]

use epkv_protocol::range_scan::{
    self as rs, CONTINUE_EXTRAS_LEN, ContinueRequest, CreateRequest, ScanKind,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = CreateRequest::parse(data) {
        match &req.kind {
            ScanKind::Range { start, end } => {
                assert!(start.key().len() <= 250 && end.key().len() <= 250);
            }
            ScanKind::Sampling { samples, .. } => assert!(*samples >= 1),
        }
        assert!(req.name.as_ref().is_none_or(|n| n.len() <= rs::MAX_NAME_LEN));
        assert!(!(req.key_only && req.include_xattrs));
    }
    match ContinueRequest::decode(data) {
        Some(c) => {
            assert_eq!(data.len(), CONTINUE_EXTRAS_LEN);
            assert_eq!(&c.encode()[..], data);
        }
        None => assert_ne!(data.len(), CONTINUE_EXTRAS_LEN),
    }
    // Keys: what decodes re-encodes to the prefix it was read from.
    let mut again = Vec::new();
    for k in rs::keys(data) {
        match k {
            Ok(k) => rs::put_key(&mut again, k),
            Err(()) => break,
        }
    }
    assert!(data.starts_with(&again), "keys re-encode to what they were read from");
    let mut again = Vec::new();
    for d in rs::documents(data) {
        match d {
            Ok(d) => rs::put_document(&mut again, &d.meta, d.key, d.value),
            Err(()) => break,
        }
    }
    assert!(data.starts_with(&again), "documents re-encode to what they were read from");
});
