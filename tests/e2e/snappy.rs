//! Snappy (issue 20): a client that negotiated Snappy stores compressed values, which
//! stay compressed in memory (and on disk), and reads them as they are; a client that did
//! not gets them decompressed, and is refused (0x04) when it sends the Snappy bit. A
//! corrupt compressed value is refused and never stored. APPEND and INCREMENT work on the
//! plain bytes.

use crate::harness::{Server, skip_if_external};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{Feature, Status};
use epkv_types::{Cas, Datatype};

fn compress(v: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(v).unwrap()
}

async fn client(server: &Server, snappy: bool) -> Client {
    let mut c = server.client().await;
    let mut features = vec![Feature::Xerror, Feature::Json];
    if snappy {
        features.push(Feature::Snappy);
    }
    let agreed = c.hello("e2e-snappy", &features).await.unwrap();
    assert_eq!(
        agreed.contains(&Feature::Snappy.as_u16()),
        snappy,
        "the server agrees to Snappy when asked"
    );
    c
}

#[tokio::test]
async fn snappy_and_plain_clients_read_each_others_documents() {
    if skip_if_external("snappy") {
        return;
    }
    let server = Server::spawn(&[]);
    server.wait_warmed_up().await;
    let mut zipped = client(&server, true).await;
    let mut plain = client(&server, false).await;
    let doc = format!("{{\"text\":\"{}\"}}", "compressible ".repeat(80));
    let snappy_json = Datatype(Datatype::JSON.0 | Datatype::SNAPPY.0);
    let set = zipped
        .set(
            b"sn-doc",
            &compress(doc.as_bytes()),
            StoreOptions::new().datatype(snappy_json),
        )
        .await
        .unwrap();
    assert!(set.is_success(), "{set:?}");
    // The plain client gets the document decompressed, without the Snappy bit.
    let got = plain.get(b"sn-doc").await.unwrap();
    assert_eq!(got.value.as_ref(), doc.as_bytes());
    assert_eq!(got.datatype.0 & Datatype::SNAPPY.0, 0);
    // The Snappy client gets it as stored.
    let got = zipped.get(b"sn-doc").await.unwrap();
    assert_ne!(got.datatype.0 & Datatype::SNAPPY.0, 0);
    assert_eq!(
        snap::raw::Decoder::new()
            .decompress_vec(&got.value)
            .unwrap(),
        doc.as_bytes()
    );
    assert!(got.value.len() < doc.len() / 4, "kept compressed");
    // A plain document reads back plain for both.
    assert!(
        plain
            .set(b"sn-plain", b"plain text", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let got = zipped.get(b"sn-plain").await.unwrap();
    assert_eq!(
        (got.value.as_ref(), got.datatype.0 & 2),
        (&b"plain text"[..], 0)
    );

    // The Snappy bit from a client that did not negotiate it: refused.
    let refused = plain
        .set(
            b"sn-bad",
            &compress(b"x"),
            StoreOptions::new().datatype(Datatype::SNAPPY),
        )
        .await
        .unwrap();
    assert_eq!(refused.status(), Some(Status::Einval));
    // A corrupt compressed value: refused, never stored.
    let mut corrupt = compress(doc.as_bytes());
    corrupt.truncate(corrupt.len() / 2);
    let refused = zipped
        .set(
            b"sn-bad",
            &corrupt,
            StoreOptions::new().datatype(Datatype::SNAPPY),
        )
        .await
        .unwrap();
    assert_eq!(refused.status(), Some(Status::Einval));
    assert_eq!(
        plain.get(b"sn-bad").await.unwrap().status(),
        Some(Status::KeyEnoent)
    );

    // APPEND of a compressed tail to a compressed value, and INCREMENT of a compressed
    // counter, work on the plain bytes.
    let head = zipped
        .set(
            b"sn-cat",
            &compress(b"head-"),
            StoreOptions::new().datatype(Datatype::SNAPPY),
        )
        .await
        .unwrap();
    assert!(head.is_success());
    let tail = zipped
        .append(
            b"sn-cat",
            &compress(b"tail"),
            StoreOptions::new().datatype(Datatype::SNAPPY),
        )
        .await
        .unwrap();
    assert!(tail.is_success(), "{tail:?}");
    assert_eq!(
        plain.get(b"sn-cat").await.unwrap().value.as_ref(),
        b"head-tail"
    );
    let ctr = zipped
        .set(
            b"sn-ctr",
            &compress(b"41"),
            StoreOptions::new().datatype(Datatype::SNAPPY),
        )
        .await
        .unwrap();
    assert!(ctr.is_success());
    let incr = plain.incr(b"sn-ctr", 1, 0, 0xffff_ffff).await.unwrap();
    assert_eq!(incr.counter(), Some(42), "{incr:?}");
    assert!(
        plain
            .delete(b"sn-ctr", Cas::ANY)
            .await
            .unwrap()
            .is_success()
    );
}
