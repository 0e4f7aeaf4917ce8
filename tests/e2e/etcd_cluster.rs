//! An elastic cluster on etcd: real `etcd` processes (Debian's `etcd-server`) and
//! epkv-server nodes on loopback, each with its own data directory. The nodes share a
//! cluster file that seeds the topology the first node writes to etcd; from then on etcd
//! holds the state, the orchestrator fails dead nodes over, and every node follows.
//!
//! Skipped (with a message) when `etcd` is not installed; `.ci/run` installs it.

use crate::harness::{Server, TestDir, free_ports, http_request, key};
use epkv_client::{Client, StoreOptions};
use epkv_protocol::{DurabilityRequirement, Status};
use epkv_types::DurabilityLevel;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::time::Instant;

const ADMIN: (&str, &str) = ("Administrator", "password");

/// The `etcd` binary, if installed.
fn etcd_binary() -> Option<&'static str> {
    ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

/// Whether to skip: no etcd here.
pub(crate) fn no_etcd(test: &str) -> bool {
    if etcd_binary().is_some() {
        return false;
    }
    assert!(
        std::env::var_os("EPKV_CI").is_none(),
        "{test}: etcd is not installed (apt-get install etcd-server)"
    );
    eprintln!("{test}: skipped, etcd is not installed (apt-get install etcd-server)");
    true
}

/// An etcd cluster of a few members on loopback.
pub(crate) struct Etcd {
    members: Vec<Option<Child>>,
    client_ports: Vec<u16>,
    peer_ports: Vec<u16>,
    dir: TestDir,
}

impl Etcd {
    pub(crate) fn start(n: usize) -> Etcd {
        let ports = free_ports(2 * n);
        let mut e = Etcd {
            members: Vec::new(),
            client_ports: ports[..n].to_vec(),
            peer_ports: ports[n..].to_vec(),
            dir: TestDir::new(),
        };
        std::fs::create_dir_all(e.dir.path()).unwrap();
        for i in 0..n {
            let child = e.spawn(i, "new");
            e.members.push(Some(child));
        }
        e.wait_healthy();
        e
    }

    fn spawn(&self, i: usize, state: &str) -> Child {
        let initial: Vec<String> = self
            .peer_ports
            .iter()
            .enumerate()
            .map(|(j, p)| format!("e{j}=http://127.0.0.1:{p}"))
            .collect();
        let client = format!("http://127.0.0.1:{}", self.client_ports[i]);
        let peer = format!("http://127.0.0.1:{}", self.peer_ports[i]);
        let log = std::fs::File::create(self.dir.path().join(format!("etcd{i}.log"))).unwrap();
        Command::new(etcd_binary().expect("etcd"))
            .args(["--name", &format!("e{i}")])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("e{i}")))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "epkv-test"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd")
    }

    /// The client URLs, comma separated, as `--etcd` takes them.
    pub(crate) fn endpoints(&self) -> String {
        self.client_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for p in &self.client_ports {
            let addr: SocketAddr = format!("127.0.0.1:{p}").parse().unwrap();
            loop {
                if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    break;
                }
                assert!(Instant::now() < deadline, "etcd did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Stops member `i` (SIGKILL: its data directory stays for a restart).
    pub(crate) fn stop(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub(crate) fn restart(&mut self, i: usize) {
        assert!(self.members[i].is_none());
        self.members[i] = Some(self.spawn(i, "existing"));
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
    }
}

/// A TCP proxy (its own threads) that can be cut: every connection through it closed and
/// new ones refused, until it is restored.
pub(crate) struct Proxy {
    addr: SocketAddr,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Proxy {
    fn start(target: SocketAddr) -> Proxy {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let p = Proxy {
            addr: listener.local_addr().unwrap(),
            cut: std::sync::Arc::default(),
            open: std::sync::Arc::default(),
            stop: std::sync::Arc::default(),
        };
        let (cut, open, stop) = (p.cut.clone(), p.open.clone(), p.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                if cut.load(SeqCst) {
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(target) else {
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let mut held = open.lock().unwrap();
                held.push(client.try_clone().unwrap());
                held.push(server.try_clone().unwrap());
                drop(held);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        p
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub(crate) fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Lets connections through again.
    pub(crate) fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut();
    }
}

/// epkv nodes on one etcd, seeded by one cluster file.
pub(crate) struct EtcdCluster {
    pub(crate) etcd: Etcd,
    pub(crate) nodes: Vec<Option<Server>>,
    kv: Vec<u16>,
    mgmt: Vec<u16>,
    dir: TestDir,
    /// Per node, a proxy its etcd traffic goes through (to cut it off), if any.
    proxies: Vec<Option<Proxy>>,
}

impl EtcdCluster {
    pub(crate) fn start(n: usize, replicas: usize, etcd_members: usize) -> EtcdCluster {
        EtcdCluster::start_with_proxies(n, replicas, etcd_members, &[])
    }

    /// As [`EtcdCluster::start`], nodes `proxied` reaching etcd's first member through a
    /// [`Proxy`] the test can cut.
    pub(crate) fn start_with_proxies(
        n: usize,
        replicas: usize,
        etcd_members: usize,
        proxied: &[usize],
    ) -> EtcdCluster {
        let etcd = Etcd::start(etcd_members);
        let target: SocketAddr = format!("127.0.0.1:{}", etcd.client_ports[0])
            .parse()
            .unwrap();
        let proxies = (0..n)
            .map(|i| proxied.contains(&i).then(|| Proxy::start(target)))
            .collect();
        let ports = free_ports(2 * n);
        let dir = TestDir::new();
        std::fs::create_dir_all(dir.path()).unwrap();
        let mut file = format!(
            "replicas = {replicas}\nuser = \"{}\"\npassword = \"{}\"\n",
            ADMIN.0, ADMIN.1
        );
        for i in 0..n {
            file.push_str(&format!(
                "[[nodes]]\nhost = \"127.0.0.1\"\nport = {}\nmgmt_port = {}\n",
                ports[i],
                ports[n + i]
            ));
        }
        std::fs::write(dir.path().join("cluster.toml"), file).unwrap();
        let mut c = EtcdCluster {
            etcd,
            nodes: Vec::new(),
            kv: ports[..n].to_vec(),
            mgmt: ports[n..].to_vec(),
            dir,
            proxies,
        };
        for i in 0..n {
            let s = c.spawn(i);
            c.nodes.push(Some(s));
        }
        // Every node has joined (its cluster calls answer) and one leads.
        for i in 0..n {
            wait_until("the node to join", Duration::from_secs(20), || {
                (c.rest(i, "GET", "/settings/autoFailover", None).0 == 200
                    && c.membership(i, i) == "active")
                    .then_some(())
            });
        }
        c.orchestrator(0);
        c
    }

    /// Starts one more node that registers in etcd (no cluster file), adds it with
    /// `/controller/addNode` through node `via`, and returns its index.
    pub(crate) fn add_new_node(&mut self, via: usize) -> usize {
        let i = self.nodes.len();
        let ports = free_ports(2);
        self.kv.push(ports[0]);
        self.mgmt.push(ports[1]);
        self.proxies.push(None);
        let mgmt = ports[1];
        let s = self.spawn_with(i, false);
        self.nodes.push(Some(s));
        let form = format!(
            "hostname=127.0.0.1:{mgmt}&user={}&password={}",
            ADMIN.0, ADMIN.1
        );
        wait_until(
            "the new node's registration",
            Duration::from_secs(20),
            || (self.rest(via, "POST", "/controller/addNode", Some(&form)).0 == 200).then_some(()),
        );
        i
    }

    /// ns_server's name of node `i`.
    pub(crate) fn otp(&self, i: usize) -> String {
        format!("ns_1@127.0.0.1:{}", self.kv[i])
    }

    /// Starts node `i`, seeded from the cluster file.
    fn spawn(&self, i: usize) -> Server {
        self.spawn_with(i, true)
    }

    /// Starts node `i` on its ports and data directory, reaching etcd directly or through
    /// its proxy; `seeded` gives it the cluster file and its index there (else it only
    /// registers, to be added).
    fn spawn_with(&self, i: usize, seeded: bool) -> Server {
        let data = self.dir.path().join(format!("node{i}"));
        let file = self.dir.path().join("cluster.toml");
        let endpoints = match &self.proxies[i] {
            Some(p) => format!("http://{}", p.addr),
            None => self.etcd.endpoints(),
        };
        let mut args: Vec<String> = [
            "--port",
            &self.kv[i].to_string(),
            "--mgmt-port",
            &self.mgmt[i].to_string(),
            "--testing",
            "--metrics-port",
            "0",
            "--admin-user",
            ADMIN.0,
            "--admin-password",
            ADMIN.1,
            "--etcd",
            &endpoints,
            "--cluster-name",
            "test",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        if seeded {
            args.extend([
                "--cluster".to_owned(),
                file.to_str().unwrap().to_owned(),
                "--cluster-node".to_owned(),
                i.to_string(),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::spawn_in_exact(&data, &args)
    }

    pub(crate) fn node(&self, i: usize) -> &Server {
        self.nodes[i].as_ref().expect("a live node")
    }

    /// `METHOD path` on node `i`'s management port as the administrator.
    pub(crate) fn rest(
        &self,
        i: usize,
        method: &str,
        path: &str,
        form: Option<&str>,
    ) -> (u16, String) {
        let r = http_request(self.node(i).mgmt_addr(), method, path, Some(ADMIN), form);
        (r.status, r.body)
    }

    pub(crate) fn json(&self, i: usize, path: &str) -> serde_json::Value {
        let (status, body) = self.rest(i, "GET", path, None);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// `clusterMembership` of node `of` as node `via` sees it.
    pub(crate) fn membership(&self, via: usize, of: usize) -> String {
        let doc = self.json(via, "/pools/default");
        let otp = format!("ns_1@127.0.0.1:{}", self.kv[of]);
        doc["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["otpNode"] == otp.as_str())
            .map(|n| n["clusterMembership"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    }

    /// The orchestrator's index, as node `via` sees it (waits for one to be elected).
    pub(crate) fn orchestrator(&self, via: usize) -> usize {
        wait_until("an orchestrator", Duration::from_secs(15), || {
            let doc = self.json(via, "/pools/default");
            doc["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["epkvOrchestrator"] == true)
                .and_then(|n| n["otpNode"].as_str())
                .and_then(|o| o.rsplit(':').next())
                .and_then(|p| p.parse::<u16>().ok())
                .and_then(|p| self.kv.iter().position(|k| *k == p))
        })
    }

    /// Kills node `i` (SIGKILL).
    pub(crate) fn kill(&mut self, i: usize) {
        let _ = self.nodes[i].take().expect("a live node").kill();
    }

    /// An authenticated client of node `i` with the `default` bucket selected.
    pub(crate) async fn client(&self, i: usize) -> Client {
        let mut c = self.node(i).client().await;
        c.hello("etcd-cluster-test", &[epkv_protocol::Feature::Xerror])
            .await
            .unwrap();
        c.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
        assert!(c.select_bucket("default").await.unwrap().is_success());
        c
    }

    /// Per vBucket, the node holding its active copy, by node `via`'s map of `default`
    /// (one request; index it with [`active`]).
    pub(crate) fn actives(&self, via: usize) -> Vec<usize> {
        self.chains(via)
            .iter()
            .map(|chain| chain[0].expect("an active copy"))
            .collect()
    }

    /// Per vBucket, the nodes (indexes here) holding its copies, active first, by node
    /// `via`'s map of `default` (`None`: a copy without a node).
    pub(crate) fn chains(&self, via: usize) -> Vec<Vec<Option<usize>>> {
        let map = self.json(via, "/pools/default/b/default");
        let servers: Vec<usize> = map["vBucketServerMap"]["serverList"]
            .as_array()
            .unwrap()
            .iter()
            .map(|name| {
                let port: u16 = name
                    .as_str()
                    .unwrap()
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                self.kv.iter().position(|k| *k == port).unwrap()
            })
            .collect();
        map["vBucketServerMap"]["vBucketMap"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|n| {
                        usize::try_from(n.as_i64().unwrap())
                            .ok()
                            .map(|n| servers[n])
                    })
                    .collect()
            })
            .collect()
    }
}

/// The node holding `k`'s active copy in `actives` ([`EtcdCluster::actives`]).
fn active(actives: &[usize], k: &[u8]) -> usize {
    actives[usize::from(vbucket_of(k).0)]
}

/// Authenticated clients of a cluster's nodes, opened on first use.
struct Clients<'a> {
    cluster: &'a EtcdCluster,
    open: Vec<Option<Client>>,
}

impl<'a> Clients<'a> {
    fn new(cluster: &'a EtcdCluster) -> Self {
        Clients {
            cluster,
            open: (0..cluster.nodes.len()).map(|_| None).collect(),
        }
    }

    async fn of(&mut self, n: usize) -> &mut Client {
        if self.open[n].is_none() {
            self.open[n] = Some(self.cluster.client(n).await);
        }
        self.open[n].as_mut().unwrap()
    }
}

pub(crate) fn vbucket_of(k: &[u8]) -> epkv_types::Vbid {
    epkv_types::vbucket_for_key(k, epkv_types::NUM_VBUCKETS)
}

/// Polls `check` (every 50 ms) until it gives a value; fails the test after `limit`.
pub(crate) fn wait_until<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn majority() -> StoreOptions {
    StoreOptions::new().durability(DurabilityRequirement {
        level: DurabilityLevel::Majority,
        timeout: Some(Duration::from_secs(5)),
    })
}

/// Writes `keys` with `opts` through the node holding each key's active copy (by node
/// `via`'s map); every write must be acknowledged.
async fn write(c: &EtcdCluster, via: usize, keys: &[Vec<u8>], value: &[u8], opts: StoreOptions) {
    let actives = c.actives(via);
    let mut clients = Clients::new(c);
    for k in keys {
        let r = clients
            .of(active(&actives, k))
            .await
            .set(k, value, opts)
            .await
            .unwrap();
        assert!(r.is_success(), "a write answered {:#x}", r.status_raw);
    }
}

async fn write_majority(c: &EtcdCluster, via: usize, keys: &[Vec<u8>], value: &[u8]) {
    write(c, via, keys, value, majority()).await;
}

async fn write_plain(c: &EtcdCluster, via: usize, keys: &[Vec<u8>], value: &[u8]) {
    write(c, via, keys, value, StoreOptions::new()).await;
}

/// Reads every key back from the node holding its active copy now (by node `via`'s
/// map); each must have `value`.
async fn read_back(c: &EtcdCluster, via: usize, keys: &[Vec<u8>], value: &[u8]) {
    let actives = c.actives(via);
    let mut clients = Clients::new(c);
    for k in keys {
        let n = active(&actives, k);
        let r = clients.of(n).await.get(k).await.unwrap();
        assert_eq!(
            r.status_raw,
            Status::Success as u16,
            "an acknowledged write of {} is missing on node {n}",
            vbucket_of(k)
        );
        assert_eq!(r.value.as_ref(), value);
    }
}

/// Kill -9 of the orchestrator: another node takes over, fails it over after its lease
/// expired and the timeout passed, promotes the replicas, and every Majority write the
/// clients saw acknowledged is read back from the new actives.
#[tokio::test]
async fn a_killed_orchestrator_is_failed_over_by_the_next_and_no_majority_write_is_lost() {
    if no_etcd("orchestrator failover") {
        return;
    }
    let mut c = EtcdCluster::start(3, 1, 1);
    let (status, body) = c.rest(
        1,
        "POST",
        "/settings/autoFailover",
        Some("enabled=true&timeout=1&maxCount=1"),
    );
    assert_eq!(status, 200, "{body}");
    // Every node sees the setting at once (one document in etcd).
    for i in 0..3 {
        let a = c.json(i, "/settings/autoFailover");
        assert_eq!(
            (a["timeout"].as_u64(), a["count"].as_u64()),
            (Some(1), Some(0))
        );
    }
    let keys: Vec<Vec<u8>> = (0..300).map(|i| key(&format!("etcd-fo-{i}"))).collect();
    write_majority(&c, 0, &keys, b"kept").await;
    let leader = c.orchestrator(0);
    let survivor = (leader + 1) % 3;
    let killed_at = Instant::now();
    c.kill(leader);
    wait_until(
        "the orchestrator's failover",
        Duration::from_secs(20),
        || (c.membership(survivor, leader) == "inactiveFailed").then_some(()),
    );
    eprintln!(
        "kill -9 of the orchestrator to its failover: {:?}",
        killed_at.elapsed()
    );
    for i in (0..3).filter(|i| *i != leader) {
        assert_eq!(c.membership(i, leader), "inactiveFailed");
        assert_eq!(c.json(i, "/settings/autoFailover")["count"], 1);
        let map = c.json(i, "/pools/default/b/default");
        assert_eq!(
            map["vBucketServerMap"]["serverList"]
                .as_array()
                .unwrap()
                .len(),
            2,
            "the failed node leaves the map"
        );
    }
    assert_ne!(c.orchestrator(survivor), leader);
    read_back(&c, survivor, &keys, b"kept").await;
    // Writes go on to the promoted copies; with its one replica gone, a vBucket answers
    // Majority writes DurabilityImpossible at once (as Couchbase until a rebalance).
    let actives = c.actives(survivor);
    for k in &keys[..50] {
        let n = active(&actives, k);
        let mut client = c.client(n).await;
        assert!(
            client
                .set(k, b"after", StoreOptions::new())
                .await
                .unwrap()
                .is_success()
        );
        let r = client.set(k, b"after", majority()).await.unwrap();
        assert!(
            r.is_success() || r.status_raw == Status::DurabilityImpossible as u16,
            "{:#x}",
            r.status_raw
        );
    }
    read_back(&c, survivor, &keys[..50], b"after").await;
}

/// `maxCount` stops automatic failover after that many nodes until the count is reset,
/// and no failover (automatic, or manual without `allowUnsafe`) loses the last copy of a
/// vBucket.
#[tokio::test]
async fn max_count_and_the_last_copy_hold_failovers_back() {
    if no_etcd("maxCount") {
        return;
    }
    let mut c = EtcdCluster::start(3, 1, 1);
    let (status, body) = c.rest(
        0,
        "POST",
        "/settings/autoFailover",
        Some("timeout=1&maxCount=1"),
    );
    assert_eq!(status, 200, "{body}");
    let leader = c.orchestrator(0);
    let first = (leader + 1) % 3;
    let second = (leader + 2) % 3;
    c.kill(first);
    wait_until("the first failover", Duration::from_secs(20), || {
        (c.membership(leader, first) == "inactiveFailed").then_some(())
    });
    c.kill(second);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        c.membership(leader, second),
        "active",
        "maxCount=1 was reached"
    );
    assert_eq!(c.json(leader, "/settings/autoFailover")["count"], 1);
    let (status, _) = c.rest(leader, "POST", "/settings/autoFailover/resetCount", None);
    assert_eq!(status, 200);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(
        c.membership(leader, second),
        "active",
        "the survivor holds only one copy of some vBuckets: failing the second over would lose them"
    );
    let otp = format!("otpNode=ns_1@127.0.0.1:{}", c.kv[second]);
    let (status, body) = c.rest(leader, "POST", "/controller/failOver", Some(&otp));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("last copy"), "{body}");
    let (status, body) = c.rest(
        leader,
        "POST",
        "/controller/failOver",
        Some(&format!("{otp}&allowUnsafe=true")),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(c.membership(leader, second), "inactiveFailed");
}

/// etcd loses its quorum (2 of 3 members stopped): data is still served, cluster changes
/// answer 503, a dead node is not failed over; once etcd is back, changes work again and
/// the dead node is failed over.
#[tokio::test]
async fn without_an_etcd_quorum_data_is_served_changes_are_refused_and_nothing_fails_over() {
    if no_etcd("etcd quorum") {
        return;
    }
    let mut c = EtcdCluster::start(3, 1, 3);
    let (status, body) = c.rest(
        0,
        "POST",
        "/settings/autoFailover",
        Some("timeout=1&maxCount=1"),
    );
    assert_eq!(status, 200, "{body}");
    let keys: Vec<Vec<u8>> = (0..60).map(|i| key(&format!("etcd-q-{i}"))).collect();
    write_majority(&c, 0, &keys, b"before").await;
    c.etcd.stop(1);
    c.etcd.stop(2);
    let leader = c.orchestrator(0);
    let dead = (leader + 1) % 3;
    let alive = (leader + 2) % 3;
    c.kill(dead);
    let refused = wait_until("a change to be refused", Duration::from_secs(15), || {
        let (status, body) = c.rest(alive, "POST", "/settings/autoFailover", Some("timeout=2"));
        (status == 503).then_some(body)
    });
    assert!(refused.contains("etcd"), "{refused}");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        c.membership(alive, dead),
        "active",
        "no failover without etcd"
    );
    // The survivors still serve their active vBuckets.
    let mut served = 0;
    let actives = c.actives(alive);
    for k in &keys {
        let n = active(&actives, k);
        if n == dead {
            continue;
        }
        let r = c.client(n).await.get(k).await.unwrap();
        assert_eq!(r.value.as_ref(), b"before");
        served += 1;
    }
    assert!(served > 0);
    c.etcd.restart(1);
    c.etcd.restart(2);
    wait_until(
        "etcd to accept changes again",
        Duration::from_secs(30),
        || {
            (c.rest(alive, "POST", "/settings/autoFailover", Some("timeout=1"))
                .0
                == 200)
                .then_some(())
        },
    );
    wait_until("the dead node's failover", Duration::from_secs(30), || {
        (c.membership(alive, dead) == "inactiveFailed").then_some(())
    });
    read_back(&c, alive, &keys, b"before").await;
}

/// A node started with only `--etcd` registers and, added by an operator on another
/// node, is listed as `inactiveAdded` everywhere, holding no vBuckets.
#[tokio::test]
async fn a_registered_node_is_added_and_holds_nothing_until_a_rebalance() {
    if no_etcd("addNode") {
        return;
    }
    let c = EtcdCluster::start(2, 1, 1);
    let dir = TestDir::new();
    std::fs::create_dir_all(dir.path()).unwrap();
    let endpoints = c.etcd.endpoints();
    let extra = Server::spawn_in_exact(
        &dir.path().join("extra"),
        &[
            "--port",
            "0",
            "--testing",
            "--admin-user",
            ADMIN.0,
            "--admin-password",
            ADMIN.1,
            "--etcd",
            &endpoints,
            "--cluster-name",
            "test",
        ],
    );
    let mgmt = extra.mgmt_addr();
    let (status, body) = c.rest(
        0,
        "POST",
        "/controller/addNode",
        Some("hostname=127.0.0.1:1&user=Administrator&password=password"),
    );
    assert_eq!(status, 400, "{body}");
    let hostname = format!("hostname={mgmt}&user=Administrator&password=password");
    let (status, body) = wait_until(
        "the new node's registration",
        Duration::from_secs(10),
        || {
            let r = c.rest(0, "POST", "/controller/addNode", Some(&hostname));
            (r.0 == 200).then_some(r)
        },
    );
    assert_eq!(status, 200, "{body}");
    let otp = format!("ns_1@127.0.0.1:{}", extra.addr.port());
    assert!(body.contains(&otp), "{body}");
    let listed = |i: usize| -> serde_json::Value {
        let doc = c.json(i, "/pools/default");
        doc["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["otpNode"] == otp.as_str())
            .cloned()
            .unwrap_or_default()
    };
    for i in 0..2 {
        let n = listed(i);
        assert_eq!(n["clusterMembership"], "inactiveAdded", "{n}");
        assert_eq!(n["status"], "healthy", "{n}");
    }
    assert_eq!(c.json(0, "/pools/default")["balanced"], false);
    // It holds nothing: its keys are NotMyVbucket there.
    let mut x = extra.client().await;
    x.auth_plain(ADMIN.0, ADMIN.1).await.unwrap();
    assert!(x.select_bucket("default").await.unwrap().is_success());
    let r = x.get(&key("anything")).await.unwrap();
    assert_eq!(r.status_raw, Status::NotMyVbucket as u16);
}

/// `vb_N:high_seqno` and `vb_N:high_prepared_seqno` of node `i`'s copy of `vb`.
async fn seqnos(c: &EtcdCluster, i: usize, vb: epkv_types::Vbid) -> (u64, u64) {
    let stats = c
        .client(i)
        .await
        .stat(&format!("vbucket-details {}", vb.0))
        .await
        .unwrap();
    let get = |field: &str| -> u64 {
        let name = format!("vb_{}:{field}", vb.0);
        stats
            .iter()
            .find(|(k, _)| *k == name)
            .map_or(0, |(_, v)| v.parse().unwrap())
    };
    (get("high_seqno"), get("high_prepared_seqno"))
}

/// Durability-aware failover: with the first replica of node 0's vBuckets held back (its
/// replication paused), Majority writes are acknowledged with the second replica's
/// copy; when node 0 dies, the second replica is promoted, not the first, and no
/// acknowledged write is lost.
#[tokio::test]
async fn failover_promotes_the_replica_holding_the_most_not_the_first_in_the_chain() {
    if no_etcd("durability-aware failover") {
        return;
    }
    let mut c = EtcdCluster::start(3, 2, 1);
    let (status, body) = c.rest(1, "POST", "/settings/autoFailover", Some("timeout=1"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.rest(1, "POST", "/diag/replication", Some("paused=true"));
    assert_eq!(status, 200, "{body}");
    // Keys whose vBucket's chain is [0, 1, 2] (v mod 3 == 0 in the file's map).
    let keys: Vec<Vec<u8>> = (0..2000)
        .map(|i| key(&format!("etcd-da-{i}")))
        .filter(|k| vbucket_of(k).0.is_multiple_of(3))
        .take(120)
        .collect();
    write_majority(&c, 0, &keys, b"durable").await;
    let vb = vbucket_of(&keys[0]);
    let before = [seqnos(&c, 1, vb).await, seqnos(&c, 2, vb).await];
    eprintln!(
        "{vb} before the failover: node 1 (high, prepared) {:?}, node 2 {:?}",
        before[0], before[1]
    );
    assert!(
        before[1].0.max(before[1].1) > before[0].0.max(before[0].1),
        "the second replica holds more: {before:?}"
    );
    c.kill(0);
    wait_until("the failover", Duration::from_secs(20), || {
        (c.membership(1, 0) == "inactiveFailed").then_some(())
    });
    let actives = c.actives(1);
    for k in &keys {
        assert_eq!(
            active(&actives, k),
            2,
            "the replica holding the most is promoted"
        );
    }
    read_back(&c, 1, &keys, b"durable").await;
    // The held-back replica catches up from the new active once it streams again.
    let (status, _) = c.rest(1, "POST", "/diag/replication", Some("paused=false"));
    assert_eq!(status, 200);
    let want = seqnos(&c, 2, vb).await.0;
    let mut caught_up = false;
    for _ in 0..200 {
        if seqnos(&c, 1, vb).await.0 >= want {
            caught_up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(caught_up, "node 1 did not catch up to seqno {want} of {vb}");
}

/// Node 0 loses etcd only (its proxy is cut): its lease expires, but the orchestrator
/// still reaches it, so it is not failed over, and it still reaches its peers, so it
/// keeps taking writes. Then its peers die too: cut off from etcd and every peer, it
/// fences itself (its actives refuse writes, so two actives never take writes for one
/// vBucket) until etcd is back.
#[tokio::test]
async fn a_node_cut_off_from_etcd_is_not_failed_over_and_fences_only_when_alone() {
    if no_etcd("fencing") {
        return;
    }
    let mut c = EtcdCluster::start_with_proxies(3, 1, 1, &[0]);
    let (status, body) = c.rest(
        1,
        "POST",
        "/settings/autoFailover",
        Some("timeout=1&maxCount=2"),
    );
    assert_eq!(status, 200, "{body}");
    // A key node 0 holds active.
    let actives = c.actives(1);
    let k = (0..1000)
        .map(|i| key(&format!("etcd-fence-{i}")))
        .find(|k| active(&actives, k) == 0)
        .unwrap();
    let mut n0 = c.client(0).await;
    assert!(
        n0.set(&k, b"one", StoreOptions::new())
            .await
            .unwrap()
            .is_success()
    );
    c.proxies[0].as_ref().unwrap().cut();
    // Its lease ends (about 2 s); the orchestrator reaches it: no failover.
    std::thread::sleep(Duration::from_secs(5));
    let other = if c.orchestrator(1) == 1 { 1 } else { 2 };
    assert_eq!(
        c.membership(other, 0),
        "active",
        "reachable: not failed over"
    );
    assert!(
        n0.set(&k, b"two", StoreOptions::new())
            .await
            .unwrap()
            .is_success(),
        "it still reaches its peers: not fenced"
    );
    // Now its peers go too: alone and without etcd, it fences itself.
    c.kill(1);
    c.kill(2);
    let mut fenced = false;
    let mut last_acknowledged = b"two".to_vec();
    for i in 0..200 {
        let value = format!("three-{i}").into_bytes();
        let r = n0.set(&k, &value, StoreOptions::new()).await.unwrap();
        if r.status_raw == Status::NotMyVbucket as u16 {
            fenced = true;
            break;
        }
        assert!(r.is_success(), "{:#x}", r.status_raw);
        last_acknowledged = value;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        fenced,
        "a node cut off from etcd and its peers kept taking writes"
    );
    assert_eq!(
        n0.get(&k).await.unwrap().status_raw,
        Status::NotMyVbucket as u16
    );
    // etcd back: it unfences and serves its data: the last write it acknowledged.
    c.proxies[0].as_ref().unwrap().restore();
    let mut back = None;
    for _ in 0..200 {
        let r = n0.get(&k).await.unwrap();
        if r.is_success() {
            back = Some(r.value.to_vec());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if back.is_none() {
        let log = c.nodes[0].take().unwrap().kill();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "node 0 did not serve again after etcd came back; its log ends:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    assert_eq!(back, Some(last_acknowledged));
}

/// A stat of node `i` (0 when absent).
async fn stat_of(c: &EtcdCluster, i: usize, group: &str, name: &str) -> u64 {
    c.client(i)
        .await
        .stat(group)
        .await
        .unwrap()
        .iter()
        .find(|(k, _)| k == name)
        .map_or(0, |(_, v)| v.parse().unwrap_or(0))
}

/// Waits until the live nodes' replicas hold everything their actives do (one replica:
/// the sums of the active and of the replica high seqnos over the nodes are equal).
async fn wait_replicated(c: &EtcdCluster) {
    let live: Vec<usize> = (0..c.nodes.len())
        .filter(|i| c.nodes[*i].is_some())
        .collect();
    for _ in 0..400 {
        let (mut active, mut replica) = (0, 0);
        for &i in &live {
            active += stat_of(c, i, "replication", "vb_active_high_seqno_sum").await;
            replica += stat_of(c, i, "replication", "vb_replica_high_seqno_sum").await;
        }
        if active == replica {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the replicas did not catch up");
}

/// Kills a node of a fresh cluster, lets the orchestrator fail it over, writes
/// `written_while_out` keys, restarts it and adds it back with `recovery` (`delta` or
/// `full`). Returns the changes replication applied to it, what its replicas hold (the
/// sum of their high seqnos), the cluster and its index.
async fn add_back(recovery: &str, written_while_out: usize) -> (u64, u64, EtcdCluster, usize) {
    let mut c = EtcdCluster::start(3, 1, 1);
    let (status, body) = c.rest(0, "POST", "/settings/autoFailover", Some("timeout=1"));
    assert_eq!(status, 200, "{body}");
    let old: Vec<Vec<u8>> = (0..600).map(|i| key(&format!("etcd-back-{i}"))).collect();
    write_plain(&c, 0, &old, b"old").await;
    wait_replicated(&c).await;
    let leader = c.orchestrator(0);
    let out = (leader + 1) % 3;
    c.kill(out);
    wait_until("the failover", Duration::from_secs(20), || {
        (c.membership(leader, out) == "inactiveFailed").then_some(())
    });
    let new: Vec<Vec<u8>> = (0..written_while_out)
        .map(|i| key(&format!("etcd-back-new-{i}")))
        .collect();
    write_plain(&c, leader, &new, b"new").await;
    // Back on its data directory: it learns it was failed over and holds nothing.
    c.nodes[out] = Some(c.spawn(out));
    wait_until(
        "the restarted node to join",
        Duration::from_secs(20),
        || (c.rest(out, "GET", "/settings/autoFailover", None).0 == 200).then_some(()),
    );
    assert_eq!(c.membership(out, out), "inactiveFailed");
    let otp = format!("otpNode=ns_1@127.0.0.1:{}", c.kv[out]);
    let form = format!("{otp}&recoveryType={recovery}");
    let (status, body) = c.rest(leader, "POST", "/controller/setRecoveryType", Some(&form));
    assert_eq!(status, 200, "{body}");
    wait_until(
        "the node to learn it is back",
        Duration::from_secs(10),
        || (c.membership(out, out) == "active").then_some(()),
    );
    wait_replicated(&c).await;
    read_back(&c, leader, &old, b"old").await;
    let received = stat_of(&c, out, "", "ep_dcp_replica_items_received").await;
    let held = stat_of(&c, out, "replication", "vb_replica_high_seqno_sum").await;
    eprintln!(
        "{recovery} recovery: the re-added node streamed {received} changes; its replicas hold seqnos summing to {held}"
    );
    (received, held, c, out)
}

/// A failed-over node restarted and added back with delta recovery becomes a replica
/// again and streams only what changed while it was out, not everything.
#[tokio::test]
async fn a_node_added_back_streams_only_the_difference() {
    if no_etcd("delta recovery") {
        return;
    }
    let written = 30;
    let (received, held, mut c, out) = add_back("delta", written).await;
    assert!(held > 0, "it holds replicas again");
    if received > written as u64 {
        let log = c.nodes[out].take().unwrap().kill();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| !l.contains("vbucket state changed"))
            .collect();
        panic!(
            "it streamed {received} changes, more than the {written} written while it was out; its log:\n{}",
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
    }
}

/// With full recovery the node drops what it held and streams all of it again.
#[tokio::test]
async fn a_node_added_back_with_full_recovery_streams_everything_again() {
    if no_etcd("full recovery") {
        return;
    }
    let (received, held, _c, _) = add_back("full", 30).await;
    assert!(held > 0, "it holds replicas again");
    assert!(
        received >= held,
        "full recovery streamed {received} changes for replicas holding {held}"
    );
}

/// A bucket, a scope and collection, and a user created through node 0's REST API are in
/// place on every node when each call returns: node 2 serves the new collection to the
/// new user with the same collection id, and the bucket replicates by the cluster's map.
#[tokio::test]
async fn buckets_collections_and_users_made_on_one_node_are_on_every_node_when_the_call_returns() {
    if no_etcd("cluster-wide metadata") {
        return;
    }
    let c = EtcdCluster::start(3, 1, 1);
    let (status, body) = c.rest(
        0,
        "POST",
        "/pools/default/buckets",
        Some("name=travel&ramQuotaMB=32"),
    );
    assert!(status == 200 || status == 202, "{status} {body}");
    let (status, body) = c.rest(
        0,
        "POST",
        "/pools/default/buckets/travel/scopes",
        Some("name=inventory"),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.rest(
        0,
        "POST",
        "/pools/default/buckets/travel/scopes/inventory/collections",
        Some("name=airline"),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.rest(
        0,
        "PUT",
        "/settings/rbac/users/local/app",
        Some("password=app-secret&roles=data_writer%5Btravel%5D%2Cdata_reader%5Btravel%5D"),
    );
    assert_eq!(status, 200, "{body}");
    // The same manifest (ids and uid) on every node, at once.
    let manifests: Vec<serde_json::Value> = (0..3)
        .map(|i| c.json(i, "/pools/default/buckets/travel/scopes"))
        .collect();
    assert!(
        manifests.iter().all(|m| *m == manifests[0]),
        "{manifests:?}"
    );
    let cid = manifests[0]["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "inventory")
        .and_then(|s| {
            s["collections"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == "airline")
        })
        .and_then(|c| c["uid"].as_str())
        .map(|uid| u32::from_str_radix(uid, 16).unwrap())
        .expect("the collection");
    // A second create of the same name, on another node, is refused as on one node.
    let (status, body) = c.rest(
        2,
        "POST",
        "/pools/default/buckets/travel/scopes/inventory/collections",
        Some("name=airline"),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("already exists"), "{body}");
    // The new user writes to the new collection through whichever node holds the key.
    let k = key("meta-doc");
    let n = active(&c.actives(2), &k);
    let mut u = c.node(n).client().await;
    u.hello(
        "meta",
        &[
            epkv_protocol::Feature::Xerror,
            epkv_protocol::Feature::Collections,
        ],
    )
    .await
    .unwrap();
    u.auth_plain("app", "app-secret").await.unwrap();
    assert!(u.select_bucket("travel").await.unwrap().is_success());
    let mut wire = Vec::new();
    let mut v = cid;
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            wire.push(byte);
            break;
        }
        wire.push(byte | 0x80);
    }
    wire.extend_from_slice(&k);
    let r = u
        .set(
            &wire,
            b"{\"name\":\"epkv air\"}",
            StoreOptions::new().vbucket(vbucket_of(&k)),
        )
        .await
        .unwrap();
    assert!(r.is_success(), "{:#x}", r.status_raw);
    // Dropped on node 1: gone everywhere when the call returns.
    let (status, body) = c.rest(1, "DELETE", "/settings/rbac/users/local/app", None);
    assert_eq!(status, 200, "{body}");
    for i in 0..3 {
        let (status, _) = c.rest(i, "GET", "/settings/rbac/users/local/app", None);
        assert_eq!(status, 404, "node {i} still has the user");
    }
    let (status, body) = c.rest(2, "DELETE", "/pools/default/buckets/travel", None);
    assert_eq!(status, 200, "{body}");
    for i in 0..3 {
        let (status, _) = c.rest(i, "GET", "/pools/default/buckets/travel", None);
        assert_eq!(status, 404, "node {i} still has the bucket");
    }
}

/// A graceful failover loses nothing, durable writes or not: with replication into the
/// replica held back, plain writes acknowledged by the node are on it alone; the node
/// refuses writes (NOT_MY_VBUCKET) until its replica has them all, then the replica is
/// promoted and every write is read back.
#[tokio::test]
async fn a_graceful_failover_hands_over_every_acknowledged_write() {
    if no_etcd("graceful failover") {
        return;
    }
    let c = EtcdCluster::start(3, 1, 1);
    let leader = c.orchestrator(0);
    let out = (leader + 1) % 3;
    let replica = (out + 1) % 3;
    let (status, body) = c.rest(replica, "POST", "/diag/replication", Some("paused=true"));
    assert_eq!(status, 200, "{body}");
    let actives = c.actives(leader);
    let keys: Vec<Vec<u8>> = (0..3000)
        .map(|i| key(&format!("etcd-graceful-{i}")))
        .filter(|k| active(&actives, k) == out)
        .take(300)
        .collect();
    write_plain(&c, leader, &keys, b"handed over").await;
    let otp = format!("otpNode=ns_1@127.0.0.1:{}", c.kv[out]);
    let mgmt = c.node(leader).mgmt_addr();
    let graceful = {
        let otp = otp.clone();
        std::thread::spawn(move || {
            http_request(
                mgmt,
                "POST",
                "/controller/startGracefulFailover",
                Some(ADMIN),
                Some(&otp),
            )
        })
    };
    // While the replica is held back the node refuses writes.
    let mut x = c.client(out).await;
    let mut refused = false;
    for _ in 0..100 {
        let k = &keys[0];
        let r = x
            .set(k, b"late", StoreOptions::new().vbucket(vbucket_of(k)))
            .await
            .unwrap();
        if r.status_raw == Status::NotMyVbucket as u16 {
            refused = true;
            break;
        }
        assert!(r.is_success());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "the draining node kept taking writes");
    assert_eq!(
        c.membership(leader, out),
        "active",
        "not failed over before its replica caught up"
    );
    let (status, _) = c.rest(replica, "POST", "/diag/replication", Some("paused=false"));
    assert_eq!(status, 200);
    let r = graceful.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(c.membership(leader, out), "inactiveFailed");
    // Every write it acknowledged is on the promoted replica (the value of keys[0] is
    // whichever write was acknowledged last).
    read_back(&c, leader, &keys[1..], b"handed over").await;
    let n = active(&c.actives(leader), &keys[0]);
    let v = c.client(n).await.get(&keys[0]).await.unwrap();
    assert!(v.is_success());
    // Twice: nothing more to do.
    let (status, body) = c.rest(
        leader,
        "POST",
        "/controller/startGracefulFailover",
        Some(&otp),
    );
    assert_eq!(status, 200, "{body}");
}
