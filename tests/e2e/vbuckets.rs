//! vBucket routing and NOT_MY_VBUCKET.

use crate::harness::{Server, key, skip_if_external};
use epkv_client::StoreOptions;
use epkv_protocol::{Opcode, RequestBuilder, Status};
use epkv_types::{NUM_VBUCKETS, VBucketState, Vbid, vbucket_for_key};

#[tokio::test]
async fn a_hello_client_naming_the_wrong_vbucket_gets_not_my_vbucket() {
    let server = Server::start();
    let k = key("nmvb");
    let right = vbucket_for_key(&k, NUM_VBUCKETS);
    let wrong = Vbid((right.0 + 1) % NUM_VBUCKETS);
    let mut c = server.client().await;
    c.hello("e2e", &[]).await.unwrap();
    let r = c
        .set(&k, b"v", StoreOptions::new().vbucket(wrong))
        .await
        .unwrap();
    assert_eq!(r.status(), Some(Status::NotMyVbucket));
    assert!(
        c.set(&k, b"v", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    c.set_vbucket_override(Some(wrong));
    assert_eq!(
        c.get(&k).await.unwrap().status(),
        Some(Status::NotMyVbucket)
    );
    let out_of_range = c
        .request(
            RequestBuilder::new(Opcode::Get)
                .vbucket(Vbid(NUM_VBUCKETS))
                .key(&k),
        )
        .await
        .unwrap();
    assert_eq!(out_of_range.status(), Some(Status::NotMyVbucket));
    c.set_vbucket_override(None);
    assert_eq!(c.get(&k).await.unwrap().value.as_ref(), b"v");
}

#[tokio::test]
async fn classic_clients_sending_vbucket_zero_reach_the_same_documents() {
    let server = Server::start();
    let k = key("classic");
    let mut classic = server.client().await;
    // python-binary-memcached, pylibmc and memcapable always send vbid 0.
    classic.set_vbucket_override(Some(Vbid(0)));
    assert!(
        classic
            .set(&k, b"from-classic", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    let mut sdk = server.client().await;
    sdk.hello("e2e", &[]).await.unwrap();
    let r = sdk.get(&k).await.unwrap();
    assert_eq!(
        r.value.as_ref(),
        b"from-classic",
        "the SDK finds it in the key's vBucket"
    );
}

#[tokio::test]
async fn replica_and_dead_vbuckets_refuse_client_operations() {
    if skip_if_external("replica_dead") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = server.client().await;
    let k = key("states");
    let vb = vbucket_for_key(&k, NUM_VBUCKETS);
    assert!(
        c.set(&k, b"v", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    for state in [VBucketState::Replica, VBucketState::Dead] {
        assert!(c.set_vbucket(vb, state).await.unwrap().is_success());
        assert_eq!(
            c.get_vbucket(vb).await.unwrap().vbucket_state(),
            Some(state)
        );
        assert_eq!(
            c.get(&k).await.unwrap().status(),
            Some(Status::NotMyVbucket)
        );
        let w = c.set(&k, b"w", StoreOptions::new()).await.unwrap();
        assert_eq!(w.status(), Some(Status::NotMyVbucket));
    }
    assert!(
        c.set_vbucket(vb, VBucketState::Active)
            .await
            .unwrap()
            .is_success()
    );
    assert_eq!(c.get(&k).await.unwrap().value.as_ref(), b"v");
    // Other vBuckets were never affected.
    assert_eq!(
        c.get_vbucket(Vbid((vb.0 + 1) % NUM_VBUCKETS))
            .await
            .unwrap()
            .vbucket_state(),
        Some(VBucketState::Active)
    );
}
