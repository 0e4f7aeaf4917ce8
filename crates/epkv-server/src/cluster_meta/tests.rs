//! The cluster-wide metadata: pure parts, then two simulated nodes (each with its own
//! buckets and users) against a real etcd (`etcd` on the PATH; the tests that need it
//! say so and pass when it is missing).

use super::*;
use crate::bucket_manager::{BucketType, DurabilityMin, EvictionMode};
use crate::settings::Settings;
use epkv_auth::UserDirectory;
use epkv_cluster::etcd::EtcdSettings;
use epkv_engine::EngineClock;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicUsize;

fn ephemeral(name: &str) -> BucketParams {
    BucketParams {
        name: name.into(),
        bucket_type: BucketType::Ephemeral,
        quota_bytes: 64 << 20,
        eviction_policy: EvictionMode::NoEviction,
        flush_enabled: false,
        durability_min_level: DurabilityMin::None,
    }
}

#[test]
fn the_state_follows_puts_and_deletes_and_skips_malformed_values() {
    let kv = |key: &str, value: &[u8], rev| Versioned {
        key: key.into(),
        value: value.to_vec(),
        mod_revision: rev,
    };
    let m = Manifest {
        dropped: vec![12],
        ..Manifest::default()
    };
    let stored = manifest_value(&m);
    assert!(
        !String::from_utf8_lossy(&stored).contains("dropped"),
        "what a node still purges is its own"
    );
    let mut s = MetaState::from_kvs(&[
        kv(INITIALIZED, b"{}", 1),
        kv(
            &bucket_key("travel"),
            &bucket_value(&ephemeral("travel")),
            2,
        ),
        kv(&manifest_key("travel"), &stored, 2),
        kv(&user_key("app"), b"version = 1", 3),
        kv(&bucket_key("bad"), b"not json", 4),
        kv("meta/unknown", b"", 5),
    ]);
    assert!(s.initialized);
    assert_eq!(s.buckets["travel"], (ephemeral("travel"), 2));
    assert!(!s.buckets.contains_key("bad"));
    assert_eq!(s.manifests["travel"].0.uid, 0);
    assert!(s.manifests["travel"].0.dropped.is_empty());
    assert_eq!(s.users["app"].1, 3);
    s.apply(&Change::Delete {
        key: bucket_key("travel"),
        revision: 6,
    });
    s.apply(&Change::Delete {
        key: user_key("app"),
        revision: 6,
    });
    assert!(s.buckets.is_empty() && s.users.is_empty());
    assert!(s.manifests.contains_key("travel"));
}

#[test]
fn errors_say_what_happened_and_to_whom() {
    let e: MetaError<()> = MetaError::Unreachable("etcd: connection refused".into());
    assert_eq!(
        e.describe(),
        "the cluster's metadata store (etcd) is unreachable: etcd: connection refused"
    );
    let e: MetaError<()> = MetaError::Unconfirmed {
        revision: 42,
        nodes: vec!["10.0.0.2:11210".into(), "10.0.0.3:11210".into()],
        waited: Duration::from_secs(10),
    };
    let text = e.describe();
    assert!(text.contains("committed (etcd revision 42)"), "{text}");
    assert!(text.contains("10.0.0.2:11210, 10.0.0.3:11210"), "{text}");
    let e: MetaError<()> = MetaError::FailedOn {
        revision: 7,
        nodes: vec![("n:1".into(), "cannot create bucket".into())],
    };
    assert!(e.describe().ends_with("n:1: cannot create bucket"));
}

// ---- Against a real etcd ----

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A one-member etcd on free ports, killed when dropped.
struct EtcdServer {
    dir: tempfile::TempDir,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

impl EtcdServer {
    /// `None` when there is no `etcd` to run.
    async fn start() -> Option<EtcdServer> {
        let found = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            eprintln!("etcd not found on the PATH: skipping");
            return None;
        }
        let mut e = EtcdServer {
            dir: tempfile::tempdir().unwrap(),
            client: free_port(),
            peer: free_port(),
            child: None,
        };
        e.run().await;
        Some(e)
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client)
    }

    /// Starts the process and waits (bounded) until it answers.
    async fn run(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &self.url()])
            .args(["--advertise-client-urls", &self.url()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let settings = self.settings("probe");
        for _ in 0..200 {
            if let Ok(c) = Etcd::connect(&settings).await
                && c.get("probe").await.is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd did not start");
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn settings(&self, cluster: &str) -> EtcdSettings {
        EtcdSettings {
            endpoints: vec![self.url()],
            cluster_name: cluster.into(),
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One simulated node: its own buckets and users, its own etcd connection and lease.
struct Node {
    id: String,
    buckets: Arc<BucketManager>,
    users: Arc<UserAdmin>,
    buckets_changed: Arc<AtomicUsize>,
    etcd: Etcd,
    meta: Option<Arc<ClusterMeta>>,
    lease: Option<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Node {
    async fn start(etcd: &EtcdServer, cluster: &str, id: &str, wait_for: Duration) -> Node {
        let mut node = Node::create(etcd, cluster, id).await;
        node.follow(wait_for).await;
        node
    }

    /// The node's local state, not following the cluster yet.
    async fn create(etcd: &EtcdServer, cluster: &str, id: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Settings::defaults().unwrap();
        s.persistence = false;
        s.data_dir = dir.path().to_owned();
        let buckets = Arc::new(BucketManager::start(&s, &EngineClock::System, false).unwrap());
        let store = UserStore::empty().with_iterations(1);
        let users = Arc::new(UserAdmin::new(
            UserDirectory::new(store.clone()),
            store,
            None,
            None,
        ));
        Node {
            id: id.into(),
            buckets,
            users,
            buckets_changed: Arc::new(AtomicUsize::new(0)),
            etcd: Etcd::connect(&etcd.settings(cluster)).await.unwrap(),
            meta: None,
            lease: None,
            _dir: dir,
        }
    }

    /// Starts (again) following the cluster, registered as live.
    async fn follow(&mut self, wait_for: Duration) {
        let counter = Arc::clone(&self.buckets_changed);
        let local = Local {
            buckets: Arc::clone(&self.buckets),
            users: Arc::clone(&self.users),
            buckets_changed: Box::new(move || {
                counter.fetch_add(1, Ordering::Relaxed);
            }),
            users_changed: Box::new(|| {}),
        };
        let meta = ClusterMeta::start(self.etcd.clone(), self.id.clone(), local, wait_for)
            .await
            .unwrap();
        let weak = Arc::downgrade(&meta);
        let id = self.id.clone();
        self.lease = Some(tokio::spawn(self.etcd.clone().run_lease(move |etcd| {
            let weak = weak.clone();
            let id = id.clone();
            async move {
                etcd.put_leased(&format!("{LIVE}{id}"), Vec::new()).await?;
                match weak.upgrade() {
                    Some(m) => m.register().await,
                    None => Ok(()),
                }
            }
        })));
        // The first registration is the lease task's; wait (bounded) for it.
        for _ in 0..100 {
            if self
                .etcd
                .get(&format!("{LIVE}{}", self.id))
                .await
                .unwrap()
                .is_some()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.meta = Some(meta);
    }

    /// Stops following and leaves the live nodes.
    async fn leave(&mut self) {
        if let Some(l) = self.lease.take() {
            l.abort();
        }
        self.meta = None;
        let live = format!("{LIVE}{}", self.id);
        if let Some(v) = self.etcd.get(&live).await.unwrap() {
            self.etcd
                .compare_and_delete(&live, v.mod_revision)
                .await
                .unwrap();
        }
    }

    fn meta(&self) -> &ClusterMeta {
        self.meta.as_deref().unwrap()
    }

    fn has_bucket(&self, name: &str) -> bool {
        self.buckets.get(name).is_some()
    }

    /// A bucket's manifest as every node must have it: uid, ids and next id (what is
    /// still to purge is each node's own).
    fn manifest(&self, bucket: &str) -> (u64, Vec<epkv_engine::collections::ScopeEntry>, u32) {
        let m = self.buckets.get(bucket).unwrap().1.manifest();
        (m.uid, m.scopes.clone(), m.next_id)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(l) = self.lease.take() {
            l.abort();
        }
    }
}

fn create_scope(name: &str) -> ManifestChange {
    ManifestChange::CreateScope { name: name.into() }
}

fn create_collection(scope: &str, name: &str) -> ManifestChange {
    ManifestChange::CreateCollection {
        scope: scope.into(),
        name: name.into(),
        max_ttl: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_node_is_on_every_node_when_it_returns() {
    let Some(etcd) = EtcdServer::start().await else {
        return;
    };
    // The first node seeds the cluster with its buckets, manifests and REST users.
    let mut a = Node::create(&etcd, "c1", "a:1").await;
    a.users
        .upsert("seeded", Some("secret1"), Roles::admin())
        .unwrap();
    a.buckets.create(ephemeral("local")).unwrap();
    a.buckets
        .get("local")
        .unwrap()
        .1
        .create_scope("early")
        .unwrap();
    a.follow(WAIT_FOR_NODES).await;
    let b = Node::start(&etcd, "c1", "b:1", WAIT_FOR_NODES).await;
    assert!(b.has_bucket("default") && b.has_bucket("local"));
    assert!(b.users.current().contains("seeded"));
    assert_eq!(a.manifest("local"), b.manifest("local"));

    // Buckets.
    a.meta().create_bucket(ephemeral("travel")).await.unwrap();
    assert!(b.has_bucket("travel"), "on B when A's call returns");
    assert!(b.buckets_changed.load(Ordering::Relaxed) > 0);
    assert!(matches!(
        b.meta().create_bucket(ephemeral("travel")).await,
        Err(MetaError::Refused(ChangeError::Exists))
    ));
    assert!(matches!(
        b.meta().drop_bucket("nope").await,
        Err(MetaError::Refused(ChangeError::NotFound))
    ));
    assert!(matches!(
        b.meta().drop_bucket("default").await,
        Err(MetaError::Refused(ChangeError::Invalid("name", _)))
    ));

    // Scopes and collections: the same ids and uid on both nodes.
    let m = a.meta();
    assert_eq!(
        m.change_manifest("travel", &create_scope("inventory"))
            .await
            .unwrap(),
        1
    );
    let uid = b
        .meta()
        .change_manifest("travel", &create_collection("inventory", "airline"))
        .await
        .unwrap();
    assert_eq!(uid, 2);
    assert_eq!(a.manifest("travel"), b.manifest("travel"));
    let id = b
        .buckets
        .get("travel")
        .unwrap()
        .1
        .collection_id("inventory.airline");
    assert_eq!(id, Ok((2, 9)));
    assert_eq!(
        a.buckets
            .get("travel")
            .unwrap()
            .1
            .collection_id("inventory.airline"),
        id
    );
    assert!(matches!(
        a.meta()
            .change_manifest("travel", &create_scope("inventory"))
            .await,
        Err(MetaError::Refused(ManifestRefusal::Status(
            EngineStatus::KeyExists
        )))
    ));
    assert!(matches!(
        a.meta()
            .change_manifest("travel", &create_collection("nope", "x"))
            .await,
        Err(MetaError::Refused(ManifestRefusal::Status(
            EngineStatus::UnknownScope
        )))
    ));
    assert!(matches!(
        a.meta().change_manifest("gone", &create_scope("s")).await,
        Err(MetaError::Refused(ManifestRefusal::NoBucket))
    ));
    let drop_it = ManifestChange::DropCollection {
        scope: "inventory".into(),
        name: "airline".into(),
    };
    assert_eq!(
        a.meta().change_manifest("travel", &drop_it).await.unwrap(),
        3
    );
    assert_eq!(
        b.buckets
            .get("travel")
            .unwrap()
            .1
            .collection_id("inventory.airline"),
        Err(EngineStatus::UnknownCollection)
    );
    assert_eq!(a.manifest("travel"), b.manifest("travel"));

    // Users: verifiers derived once, on the node that took the call.
    let roles = Roles::parse_list("bucket_full_access[travel]").unwrap();
    assert!(
        !a.meta()
            .upsert_user("app", Some("secret1"), &roles)
            .await
            .unwrap()
    );
    assert!(b.users.current().may_access("app", "travel"));
    assert!(
        b.meta()
            .upsert_user("app", None, &Roles::admin())
            .await
            .unwrap()
    );
    assert!(
        a.users.current().may_access("app", "other"),
        "roles changed, password kept"
    );
    assert!(matches!(
        a.meta().upsert_user("new", None, &Roles::admin()).await,
        Err(MetaError::Refused(UserChangeError::Invalid("password", _)))
    ));
    assert!(matches!(
        a.meta()
            .upsert_user("x", Some("short"), &Roles::admin())
            .await,
        Err(MetaError::Refused(UserChangeError::Invalid("password", _)))
    ));
    b.meta().remove_user("app").await.unwrap();
    assert!(!a.users.current().contains("app"));
    assert!(matches!(
        a.meta().remove_user("app").await,
        Err(MetaError::Refused(UserChangeError::NotFound))
    ));

    // A drop through B leaves A too.
    b.meta().drop_bucket("travel").await.unwrap();
    assert!(!a.has_bucket("travel"));
    assert!(a.meta().applied_revision() > 0 && a.meta().is_following());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_of_one_name_on_two_nodes_make_one_success() {
    let Some(etcd) = EtcdServer::start().await else {
        return;
    };
    let a = Node::start(&etcd, "c2", "a:1", WAIT_FOR_NODES).await;
    let b = Node::start(&etcd, "c2", "b:1", WAIT_FOR_NODES).await;
    for round in 0..3 {
        let name = format!("race{round}");
        let (ra, rb) = tokio::join!(
            a.meta().create_bucket(ephemeral(&name)),
            b.meta().create_bucket(ephemeral(&name))
        );
        let ok = [&ra, &rb].iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "{ra:?} {rb:?}");
        assert!(
            [&ra, &rb]
                .iter()
                .any(|r| matches!(r, Err(MetaError::Refused(ChangeError::Exists)))),
            "{ra:?} {rb:?}"
        );
        assert!(a.has_bucket(&name) && b.has_bucket(&name));
    }
    // Two collections at once in one bucket: both made, with different ids, the same
    // manifest everywhere; the same name twice: one.
    a.meta()
        .change_manifest("default", &create_scope("s"))
        .await
        .unwrap();
    let (x, y, z) = (
        create_collection("s", "x"),
        create_collection("s", "y"),
        create_collection("s", "z"),
    );
    let admin = Roles::admin();
    let (ra, rb) = tokio::join!(
        a.meta().change_manifest("default", &x),
        b.meta().change_manifest("default", &y)
    );
    assert_ne!(ra.unwrap(), rb.unwrap());
    assert_eq!(a.manifest("default"), b.manifest("default"));
    let default = a.buckets.get("default").unwrap().1;
    assert_ne!(
        default.collection_id("s.x").unwrap().1,
        default.collection_id("s.y").unwrap().1
    );
    let (ra, rb) = tokio::join!(
        a.meta().change_manifest("default", &z),
        b.meta().change_manifest("default", &z)
    );
    assert_eq!(
        [&ra, &rb].iter().filter(|r| r.is_ok()).count(),
        1,
        "{ra:?} {rb:?}"
    );
    assert_eq!(a.manifest("default"), b.manifest("default"));
    // Two users of one name: both succeed (a PUT replaces), one after the other.
    let (ra, rb) = tokio::join!(
        a.meta().upsert_user("u", Some("secret1"), &admin),
        b.meta().upsert_user("u", Some("secret2"), &admin)
    );
    assert_eq!(
        [ra.unwrap(), rb.unwrap()].iter().filter(|e| !**e).count(),
        1,
        "exactly one of them created the user"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_etcd_changes_are_refused_and_nodes_converge_after() {
    let Some(mut etcd) = EtcdServer::start().await else {
        return;
    };
    let a = Node::start(&etcd, "c3", "a:1", WAIT_FOR_NODES).await;
    let b = Node::start(&etcd, "c3", "b:1", WAIT_FOR_NODES).await;
    a.meta().create_bucket(ephemeral("before")).await.unwrap();
    etcd.stop();
    match a.meta().create_bucket(ephemeral("during")).await {
        Err(e @ MetaError::Unreachable(_)) => assert!(
            e.describe()
                .starts_with("the cluster's metadata store (etcd) is unreachable: "),
            "{}",
            e.describe()
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        b.meta()
            .upsert_user("u", Some("secret1"), &Roles::admin())
            .await,
        Err(MetaError::Unreachable(_))
    ));
    // Serving goes on with the last state.
    assert!(a.has_bucket("before") && b.has_bucket("before"));
    assert!(!a.has_bucket("during"));
    etcd.run().await;
    // Back: changes are taken again (the first attempts may still find the client
    // reconnecting) and reach both nodes.
    let mut done = None;
    for _ in 0..50 {
        match a.meta().create_bucket(ephemeral("after")).await {
            Err(MetaError::Unreachable(_)) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => {
                done = Some(other);
                break;
            }
        }
    }
    assert!(matches!(done, Some(Ok(()))), "{done:?}");
    assert!(b.has_bucket("after"));
    assert!(!a.has_bucket("during") && !b.has_bucket("during"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_was_away_reconciles_and_one_that_never_confirms_is_named() {
    let Some(etcd) = EtcdServer::start().await else {
        return;
    };
    let short = Duration::from_secs(2);
    let a = Node::start(&etcd, "c4", "a:1", short).await;
    let mut b = Node::start(&etcd, "c4", "b:1", short).await;
    a.meta().create_bucket(ephemeral("old")).await.unwrap();
    a.meta()
        .upsert_user("stale", Some("secret1"), &Roles::admin())
        .await
        .unwrap();
    assert!(b.has_bucket("old") && b.users.current().contains("stale"));
    b.leave().await;
    // Changes while B is away (and not live: nobody waits for it).
    a.meta().drop_bucket("old").await.unwrap();
    a.meta().create_bucket(ephemeral("new")).await.unwrap();
    a.meta().remove_user("stale").await.unwrap();
    a.meta()
        .upsert_user("fresh", Some("secret1"), &Roles::admin())
        .await
        .unwrap();
    a.meta()
        .change_manifest("new", &create_scope("s"))
        .await
        .unwrap();
    assert!(b.has_bucket("old") && !b.has_bucket("new"));
    b.follow(short).await;
    assert!(!b.has_bucket("old") && b.has_bucket("new"));
    assert!(!b.users.current().contains("stale") && b.users.current().contains("fresh"));
    assert_eq!(a.manifest("new"), b.manifest("new"));

    // A live node that never applies anything: the change is committed, the call says
    // which node did not confirm.
    a.etcd
        .put_leased(&format!("{LIVE}ghost:1"), Vec::new())
        .await
        .unwrap();
    match a.meta().create_bucket(ephemeral("late")).await {
        Err(MetaError::Unconfirmed { nodes, .. }) => {
            assert!(nodes.contains(&"ghost:1".to_owned()), "{nodes:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        a.etcd.get(&bucket_key("late")).await.unwrap().is_some(),
        "committed all the same"
    );
}
