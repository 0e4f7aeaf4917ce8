//! Runs arbitrary bytes through epkv-storage's record decoders, as recovery and reads do
//! with whatever a damaged disk returns: walk the frames from the front, decode each body
//! by its kind, and re-encode what decodes. A decoder must never panic or over-allocate,
//! never accept a frame whose CRC32C does not match, and whatever decodes must re-encode
//! to the same bytes. Splitting a frame without its CRC (log cleaning) must agree with
//! decoding it.
#![no_main]

use epkv_storage::format::{
    self, FRAME_HEADER_LEN, RecordKind, decode_document, decode_document_meta, decode_frame,
    decode_header, decode_journal_batch, decode_key_block, decode_log_head, decode_log_purge,
    decode_log_vb_delete, decode_segment, decode_seq_block,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while !rest.is_empty() {
        // Log cleaning splits frames without their CRC and checks only the ones it copies:
        // the split must agree with the full decode, and the check with its CRC test.
        let split = format::split_frame(rest);
        match (decode_frame(rest), &split) {
            (Ok(full), Ok(s)) => {
                assert_eq!(full, *s);
                assert!(format::verify_frame(&rest[..s.2]).is_ok());
            }
            (Ok(_), Err(e)) => panic!("a frame that decodes does not split: {e:?}"),
            (Err(_), Ok(s)) => assert!(format::verify_frame(&rest[..s.2]).is_err()),
            (Err(_), Err(_)) => {}
        }
        let Ok((kind, body, total)) = decode_frame(rest) else {
            // Also try the body decoders directly on raw bytes (no CRC in the way).
            let _ = decode_document(rest);
            let _ = decode_header(rest);
            let _ = decode_key_block(rest);
            let _ = decode_seq_block(rest);
            let _ = decode_segment(rest);
            let _ = decode_journal_batch(rest);
            let _ = decode_log_head(rest);
            let _ = decode_log_vb_delete(rest);
            let _ = decode_log_purge(rest);
            let _ = decode_document_meta(rest);
            break;
        };
        assert_eq!(total, FRAME_HEADER_LEN + body.len());
        assert!(total <= rest.len());
        let mut again = Vec::new();
        match kind {
            RecordKind::Document => {
                let meta = decode_document_meta(body);
                if let Ok(d) = decode_document(body) {
                    // The log's index reads only the metadata: it must agree.
                    let m = meta.expect("a document that decodes has metadata");
                    assert_eq!(
                        (m.key, m.seqno, m.expiry, m.deleted),
                        (d.key.as_slice(), d.seqno, d.expiry, d.deleted)
                    );
                    format::encode_document(&mut again, &d);
                    assert_eq!(again, body);
                } else {
                    assert!(meta.is_err(), "metadata of a document that does not decode");
                }
            }
            RecordKind::LogHead => {
                if let Ok(h) = decode_log_head(body) {
                    format::encode_log_head(&mut again, &h);
                    assert_eq!(again, body);
                }
            }
            RecordKind::LogVbDelete => {
                if let Ok(d) = decode_log_vb_delete(body) {
                    format::encode_log_vb_delete(&mut again, &d);
                    assert_eq!(again, body);
                }
            }
            RecordKind::LogPurge => {
                if let Ok(p) = decode_log_purge(body) {
                    format::encode_log_purge(&mut again, &p);
                    assert_eq!(again, body);
                }
            }
            RecordKind::KeyBlock => {
                if let Ok(v) = decode_key_block(body) {
                    format::encode_key_block(&mut again, &v);
                    assert_eq!(again, body);
                }
            }
            RecordKind::SeqBlock => {
                if let Ok(v) = decode_seq_block(body) {
                    format::encode_seq_block(&mut again, &v);
                    assert_eq!(again, body);
                }
            }
            RecordKind::Segment => {
                if let Ok(v) = decode_segment(body) {
                    format::encode_segment(&mut again, &v);
                    assert_eq!(again, body);
                }
            }
            RecordKind::Header => {
                if let Ok(h) = decode_header(body) {
                    format::put_header(&mut again, &h);
                    assert_eq!(again, &rest[..total]);
                }
            }
            RecordKind::JournalBatch => {
                if let Ok((generation, v)) = decode_journal_batch(body) {
                    format::encode_journal_batch(&mut again, generation, &v);
                    assert_eq!(again, body);
                }
            }
            RecordKind::DataSuperblock
            | RecordKind::JournalSuperblock
            | RecordKind::LogSuperblock => {
                let _ = format::decode_superblock(body, kind);
            }
        }
        rest = &rest[total..];
    }
});
