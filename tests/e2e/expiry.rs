//! Expiry and lock timeouts, driven by ADJUST_TIMEOFDAY on a `--testing` server (no
//! sleeps: the server's clock is moved instead).

use crate::harness::{Server, key, skip_if_external};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::Status;

async fn shift(c: &mut Client, secs: i64) {
    let r = c.adjust_timeofday(secs).await.unwrap();
    assert!(r.is_success(), "ADJUST_TIMEOFDAY failed: {r:?}");
}

#[tokio::test]
async fn relative_expiry_hides_the_item_after_its_time() {
    if skip_if_external("relative_expiry") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = server.client().await;
    let k = key("exp-rel");
    let never = key("exp-never");
    c.set(&k, b"v", StoreOptions::new().expiry(10))
        .await
        .unwrap();
    c.set(&never, b"v", StoreOptions::new()).await.unwrap();
    shift(&mut c, 5).await;
    assert!(
        c.get(&k).await.unwrap().is_success(),
        "not expired after 5 s"
    );
    shift(&mut c, 11).await;
    assert_eq!(c.get(&k).await.unwrap().status(), Some(Status::KeyEnoent));
    assert!(
        c.get(&never).await.unwrap().is_success(),
        "expiry 0 never expires"
    );
    // An expired key can be added again.
    assert!(
        c.add(&k, b"again", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
}

#[tokio::test]
async fn absolute_expiry_and_touch() {
    if skip_if_external("absolute_expiry") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = server.client().await;
    let stats: std::collections::HashMap<String, String> =
        c.stat("").await.unwrap().into_iter().collect();
    let now: u32 = stats["time"].parse().unwrap();
    let k = key("exp-abs");
    // More than 30 days is an absolute Unix time.
    c.set(&k, b"v", StoreOptions::new().expiry(now + 100))
        .await
        .unwrap();
    shift(&mut c, 50).await;
    assert!(c.get(&k).await.unwrap().is_success());
    shift(&mut c, 150).await;
    assert_eq!(c.get(&k).await.unwrap().status(), Some(Status::KeyEnoent));

    // TOUCH moves the expiry; GAT too.
    let t = key("exp-touch");
    c.set(&t, b"v", StoreOptions::new().expiry(10))
        .await
        .unwrap();
    assert!(c.touch(&t, 1000).await.unwrap().is_success());
    shift(&mut c, 150 + 100).await;
    assert!(
        c.get(&t).await.unwrap().is_success(),
        "touch extended the expiry"
    );
    assert!(c.gat(&t, 5).await.unwrap().is_success());
    shift(&mut c, 250 + 10).await;
    assert_eq!(c.get(&t).await.unwrap().status(), Some(Status::KeyEnoent));
    assert_eq!(
        c.touch(&t, 10).await.unwrap().status(),
        Some(Status::KeyEnoent)
    );
}

#[tokio::test]
async fn a_lock_times_out() {
    if skip_if_external("lock_timeout") {
        return;
    }
    let server = Server::spawn(&[]);
    let mut c = server.client().await;
    let k = key("lock-timeout");
    c.set(&k, b"v", StoreOptions::new()).await.unwrap();
    assert!(c.get_locked(&k, 5).await.unwrap().is_success());
    assert_eq!(
        c.set(&k, b"w", StoreOptions::new()).await.unwrap().status(),
        Some(Status::KeyEexists),
        "a classic client (no XERROR) is told KeyEexists for a locked key, as by kv_engine"
    );
    shift(&mut c, 6).await;
    assert!(
        c.set(&k, b"w", StoreOptions::new())
            .await
            .unwrap()
            .is_success(),
        "lock expired"
    );
}

#[tokio::test]
async fn adjust_timeofday_is_refused_without_testing_mode() {
    if skip_if_external("adjust_timeofday_refused") {
        return;
    }
    let server = Server::spawn_exact(&["--port", "0"]);
    let mut c = server.client().await;
    let r = c.adjust_timeofday(100).await.unwrap();
    assert_eq!(r.status(), Some(Status::NotSupported));
    c.noop().await.unwrap();
}
