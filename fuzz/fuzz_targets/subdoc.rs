//! Runs arbitrary bytes through the sub-document path parser and operations, as a
//! client's MULTI_MUTATION would: the input is split at 0xff bytes into a document, a
//! path and a value, the first byte picking the operation. Nothing may panic, and a
//! mutation that succeeds must leave a document that is JSON again and parses as one.
#![no_main]

use epkv_engine::fuzzing::{subdoc_apply, subdoc_path_parses};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    let _ = subdoc_path_parses(rest);
    let mut parts = rest.splitn(3, |&b| b == 0xff);
    let doc = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    let value = parts.next().unwrap_or_default();
    let _ = subdoc_path_parses(path);
    if let Some(out) = subdoc_apply(doc, op, path, value, op & 0x80 != 0)
        && op % 12 >= 3
    {
        // A mutation's result is a document again.
        let again: serde_json::Value =
            serde_json::from_slice(&out).expect("a changed document is JSON");
        drop(again);
    }
});
