"""The Couchbase Python SDK against a three-node epkv cluster whose state is kept in etcd:
automatic failover of a killed node under a durable (Majority) write load loses no write
the SDK acknowledged, and the SDK carries on with the new map; the failover promotes the
replica that holds the most; auto-failover's ``maxCount`` is honoured.

Every test starts an etcd of its own (``etcd`` on PATH, else the tests are skipped, or
fail when ``EPKV_CI`` is set) and
three nodes sharing a cluster file that seeds the topology (vBucket ``v``'s chain is
``[v % 3, (v + 1) % 3, ...]``); the first node to reach etcd writes it. A node is killed with
SIGKILL; the orchestrator fails it over once its etcd lease has expired and it has been
unreachable for the auto-failover timeout."""

import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
import uuid
import zlib
from collections import Counter
from datetime import timedelta

import pytest

from conftest import (
    _free_ports,
    _start_server_with,
    _stop_server,
    alarm_after,
    mgmt_request,
    sdk_connect,
)

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="starts a cluster of its own",
)

from couchbase.diagnostics import ServiceType  # noqa: E402
from couchbase.durability import DurabilityLevel, ServerDurability  # noqa: E402
from couchbase.exceptions import CouchbaseException, DurabilityImpossibleException  # noqa: E402
from couchbase.options import GetOptions, UpsertOptions  # noqa: E402

ADMIN = ("Administrator", "password")
TEST_ALARM_SECS = 80
ETCD_START_SECS = 20
READY_SECS = 20
FAILOVER_WAIT_SECS = 20
REPLICA_WAIT_SECS = 20
POLL_SECS = 0.05
# Writes of the load: each one waits at most this long for its durability.
WRITE_TIMEOUT = timedelta(seconds=2)
LOAD_THREADS = 4
LOAD_BEFORE_KILL_SECS = 1.5
LOAD_AFTER_FAILOVER_SECS = 2.0
# Connections tried until the SDK bootstraps from a node that is to stay up (it picks one
# of the connection string's nodes at random).
CONNECT_ATTEMPTS = 10
MAJORITY = UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY),
                         timeout=WRITE_TIMEOUT)


@pytest.fixture(autouse=True)
def _bounded():
    with alarm_after(TEST_ALARM_SECS):
        yield


@pytest.fixture
def etcd(tmp_path_factory):
    """Starts an etcd of its own on free ports; yields its client address (HOST:PORT)."""
    binary = shutil.which("etcd")
    if binary is None:
        why = "`etcd` is not on PATH: the etcd-backed cluster tests need etcd >= 3.4"
        if os.environ.get("EPKV_CI"):
            pytest.fail(why + " (cargo xtask deps installs etcd-server)")
        pytest.skip(why)
    client_port, peer_port = _free_ports(2)
    base = tmp_path_factory.mktemp("etcd")
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    log_path = base / "etcd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [binary, "--name", "e0", "--data-dir", str(base / "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"e0={peer}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )
    try:
        deadline = time.monotonic() + ETCD_START_SECS
        while not _etcd_healthy(client):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"etcd did not become healthy within {ETCD_START_SECS}s "
                            f"(exit code {proc.poll()}); log:\n{_tail(log_path)}")
            time.sleep(0.1)
        yield f"127.0.0.1:{client_port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def _etcd_healthy(client):
    """Whether etcd at ``client`` (its URL) answers its health check as healthy."""
    try:
        with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
            return b'"true"' in r.read()
    except OSError:
        return False


def _tail(path, lines=40):
    """The last ``lines`` lines of the file at ``path``."""
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError:
        return ""


class Node:
    """One node of the cluster: its index in the cluster file, server and log."""

    def __init__(self, index, server, log):
        self.index = index
        self.server = server
        self.log = log

    @property
    def otp(self):
        """Its name in /pools/default and the failover requests."""
        return f"ns_1@{self.server.addr}"

    def kill(self):
        """SIGKILL, as a crash."""
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()


@pytest.fixture
def start_cluster(etcd, tmp_path_factory, request):
    """``start_cluster(replicas)`` starts three nodes of one etcd-backed cluster (node 0
    first, so that it seeds the topology) and waits until every node lists all three as
    active and healthy; returns the nodes. Teardown stops them all, and prints their logs'
    tails when the test failed."""
    nodes = []
    failed_before = request.session.testsfailed

    def start(replicas):
        ports = _free_ports(6)
        kv, mgmt = ports[:3], ports[3:]
        path = tmp_path_factory.mktemp("epkv-cluster") / "cluster.toml"
        lines = [f'replicas = {replicas}\nuser = "{ADMIN[0]}"\npassword = "{ADMIN[1]}"\n']
        for p, m in zip(kv, mgmt):
            lines.append(f'[[nodes]]\nhost = "127.0.0.1"\nport = {p}\nmgmt_port = {m}\n')
        path.write_text("".join(lines))
        name = f"etcd-test-{uuid.uuid4().hex[:8]}"
        for i, (p, m) in enumerate(zip(kv, mgmt)):
            server, log = _start_server_with(
                tmp_path_factory,
                ["--testing", "--admin-user", ADMIN[0], "--admin-password", ADMIN[1],
                 "--mgmt-port", str(m), "--cluster", str(path), "--cluster-node", str(i),
                 "--etcd", etcd, "--cluster-name", name],
                port=p,
            )
            nodes.append(Node(i, server, log))
        for n in nodes:
            _wait_for(lambda n=n: _all_active_and_healthy(n, len(nodes)), READY_SECS,
                      f"node {n.index} lists every node as active and healthy")
        return nodes

    try:
        yield start
    finally:
        errors = []
        failed = request.session.testsfailed > failed_before
        for n in nodes:
            if failed:
                print(f"--- node {n.index} ({n.server.addr}), exit code "
                      f"{n.server.proc.poll()}, log:\n{n.server.log_tail(40)}")
            try:
                _stop_server(n.server, n.log)
            except BaseException as e:  # pytest.fail's too: stop the others first
                errors.append(e)
        if errors:
            raise errors[0]


def _wait_for(check, secs, what):
    """Polls ``check`` (bounded by ``secs``) until it returns a true value; returns it."""
    deadline = time.monotonic() + secs
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"waited {secs}s for: {what}")
        time.sleep(POLL_SECS)


def _members(node):
    """``/pools/default``'s nodes by otpNode as ``node`` sees them."""
    status, reply, _ = mgmt_request(node.server, "GET", "/pools/default", auth=ADMIN)
    assert status == 200, reply
    return {n["otpNode"]: n for n in reply["nodes"]}


def _all_active_and_healthy(node, count):
    """Whether ``node`` lists ``count`` nodes, all active and healthy, and an
    orchestrator."""
    status, reply, _ = mgmt_request(node.server, "GET", "/pools/default", auth=ADMIN)
    if status != 200:
        return False
    members = reply["nodes"]
    return (len(members) == count
            and all(m["clusterMembership"] == "active" and m["status"] == "healthy"
                    for m in members)
            and any(m["epkvOrchestrator"] for m in members))


def _orchestrator(nodes):
    """The node that is the orchestrator, as node 0 sees it."""
    members = _members(nodes[0])
    return next(n for n in nodes if members[n.otp]["epkvOrchestrator"])


def _set_auto_failover(node, max_count=1):
    """Turns automatic failover on, with a timeout of 1 s and ``max_count``."""
    status, reply, _ = mgmt_request(node.server, "POST", "/settings/autoFailover",
                                    f"enabled=true&timeout=1&maxCount={max_count}", ADMIN)
    assert status == 200, reply


def _auto_failover(node):
    """``GET /settings/autoFailover`` on ``node``."""
    status, reply, _ = mgmt_request(node.server, "GET", "/settings/autoFailover", auth=ADMIN)
    assert status == 200, reply
    return reply


def _wait_failed_over(survivor, dead):
    """Waits (bounded) until ``survivor`` lists ``dead`` as failed over."""
    _wait_for(lambda: _members(survivor)[dead.otp]["clusterMembership"] == "inactiveFailed",
              FAILOVER_WAIT_SECS, f"node {dead.index} failed over")


def _vbucket_chains(node, nodes):
    """Each vBucket's chain, as node indexes (None for no node), from ``node``'s map of
    the default bucket."""
    status, reply, _ = mgmt_request(node.server, "GET", "/pools/default/b/default",
                                    auth=ADMIN)
    assert status == 200, reply
    smap = reply["vBucketServerMap"]
    by_addr = {n.server.addr: n.index for n in nodes}
    servers = [by_addr[s] for s in smap["serverList"]]
    return [[servers[i] if i >= 0 else None for i in row] for row in smap["vBucketMap"]]


def _vbucket(key):
    """The SDK's vBucket of ``key`` (1024 vBuckets)."""
    return (zlib.crc32(key.encode()) >> 16) & 0x3FF


def _connect(nodes, avoid):
    """An SDK Cluster whose connection string names every node, bootstrapped from one
    that is not ``avoid`` (the node to be killed), and its default collection. The SDK
    picks the node it bootstraps from at random: connects again (bounded) until it is not
    ``avoid``."""
    hosts = ",".join(n.server.addr for n in nodes)
    for _ in range(CONNECT_ATTEMPTS):
        c = sdk_connect(hosts, *ADMIN, kv_timeout=timedelta(seconds=5),
                        management_timeout=None, ready=timedelta(seconds=READY_SECS))
        coll = c.bucket("default").default_collection()
        if _bootstrap_addr(c) != avoid.server.addr:
            return c, coll
        c.close()
    pytest.fail(f"the SDK bootstrapped from {avoid.server.addr} {CONNECT_ATTEMPTS} times")


def _bootstrap_addr(c):
    """The KV address of the SDK's cluster-level session (the one it bootstrapped
    through): diagnostics list it without a bucket."""
    for e in c.diagnostics().endpoints.get(ServiceType.KeyValue, []):
        if e.namespace is None:
            return e.remote
    return None


class DurableLoad:
    """Threads upserting unique keys at Majority; ``acked`` holds each write the SDK
    acknowledged (key: value, when), ``failed`` counts the others by error (ambiguous
    ones included: they are not acknowledged) and ``refused`` holds the keys refused as
    DurabilityImpossible (never prepared, so never to be found)."""

    def __init__(self, coll, prefix):
        self.coll = coll
        self.prefix = prefix
        self.acked = {}
        self.failed = Counter()
        self.refused = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True)
                        for w in range(LOAD_THREADS)]

    def start(self):
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(WRITE_TIMEOUT.total_seconds() + 10)
        assert not any(t.is_alive() for t in self.threads), "a load thread did not stop"

    def acked_since(self, t):
        with self.lock:
            return sum(1 for _, at in self.acked.values() if at >= t)

    def _run(self, worker):
        n = 0
        while not self.stopping.is_set():
            n += 1
            key = f"{self.prefix}-{worker}-{n}"
            value = {"w": worker, "n": n, "r": uuid.uuid4().hex[:8]}
            try:
                self.coll.upsert(key, value, MAJORITY)
            except CouchbaseException as e:
                with self.lock:
                    self.failed[type(e).__name__] += 1
                    if isinstance(e, DurabilityImpossibleException):
                        self.refused.append(key)
                # Failures may come at once (durability impossible): do not spin.
                time.sleep(0.01)
                continue
            with self.lock:
                self.acked[key] = (value, time.monotonic())


def _read_back(coll, written, chains):
    """Reads every document of ``written`` (key: value) through the SDK; returns the ones
    that do not read back as written, described."""
    wrong = []
    for key, want in sorted(written.items()):
        try:
            got = coll.get(key).content_as[dict]
        except CouchbaseException as e:
            got = f"{type(e).__name__}"
        if got != want:
            vb = _vbucket(key)
            wrong.append(f"{key} (vBucket {vb}, chain before {chains[vb]}): "
                         f"wrote {want}, read {got}")
    return wrong


@pytest.mark.parametrize("victim", ["replica-holder", "orchestrator"])
def test_auto_failover_under_durable_sdk_load_loses_no_acknowledged_write(
        start_cluster, victim):
    """A node (the orchestrator, or another; never the one the SDK bootstrapped from) is
    killed under a Majority write load: it is failed over automatically, the same SDK
    Cluster learns the new map and the load carries on, every acknowledged write reads
    back, and no write refused as DurabilityImpossible exists."""
    nodes = start_cluster(replicas=1)
    _set_auto_failover(nodes[0])
    leader = _orchestrator(nodes)
    dead = leader if victim == "orchestrator" else next(n for n in nodes if n is not leader)
    survivor = next(n for n in nodes if n is not dead)
    chains = _vbucket_chains(nodes[0], nodes)
    c, coll = _connect(nodes, avoid=dead)
    # A document of a vBucket the dead node holds active: read once the SDK has the new
    # map (its replica on a survivor has it: a Majority write of two copies).
    probe = next(k for k in (f"probe-{i}-{uuid.uuid4().hex[:6]}" for i in range(5000))
                 if chains[_vbucket(k)][0] == dead.index)
    coll.upsert(probe, {"probe": True}, MAJORITY)
    load = DurableLoad(coll, f"afo-{uuid.uuid4().hex[:6]}")
    try:
        load.start()
        time.sleep(LOAD_BEFORE_KILL_SECS)
        before_kill = len(load.acked)
        assert before_kill > 0, f"no write acknowledged before the kill: {dict(load.failed)}"
        killed_at = time.monotonic()
        dead.kill()
        _wait_failed_over(survivor, dead)
        failed_over_at = time.monotonic()
        _wait_for(lambda: _reads(coll, probe) == {"probe": True}, FAILOVER_WAIT_SECS,
                  f"the SDK reads {probe} from the dead node's vBucket's new active")
        print(f"killed node {dead.index} ({victim}; orchestrator: node {leader.index}): "
              f"inactiveFailed after {failed_over_at - killed_at:.2f}s; the SDK read from "
              f"its vBuckets' new active {time.monotonic() - failed_over_at:.2f}s later")
        time.sleep(LOAD_AFTER_FAILOVER_SECS)
        load.stop()
        after = load.acked_since(failed_over_at)
        print(f"acknowledged: {len(load.acked)} ({before_kill} before the kill, {after} after "
              f"the failover); not acknowledged: {dict(load.failed)}")
        assert after > 0, f"no write acknowledged after the failover: {dict(load.failed)}"
        auto = _auto_failover(survivor)
        assert auto["count"] == 1, auto
        new_chains = _vbucket_chains(survivor, nodes)
        assert all(row[0] not in (None, dead.index) for row in new_chains), \
            "a vBucket has no live active after the failover"
        wrong = _read_back(coll, {k: v for k, (v, _) in load.acked.items()}, chains)
        assert not wrong, (f"{len(wrong)} of {len(load.acked)} acknowledged writes lost:\n"
                           + "\n".join(wrong[:20]))
        found = [k for k in load.refused if coll.exists(k).exists]
        assert not found, f"writes refused as DurabilityImpossible exist: {found[:20]}"
    finally:
        load.stopping.set()
        for t in load.threads:
            t.join(WRITE_TIMEOUT.total_seconds() + 10)
        c.close()


def _reads(coll, key):
    """The document's content, or None when the SDK cannot read it now."""
    try:
        return coll.get(key, GetOptions(timeout=timedelta(milliseconds=500))).content_as[dict]
    except CouchbaseException:
        return None


def test_durability_aware_failover_promotes_the_replica_that_holds_the_most(start_cluster):
    """With replication into node 1 paused, Majority writes to vBuckets whose chain is
    [0, 1, 2] commit on nodes 0 and 2; when node 0 dies, node 2 (second replica, but
    holding them) becomes their active rather than node 1 (first replica, behind), and
    every write reads back; once node 1 replicates again it holds them too."""
    nodes = start_cluster(replicas=2)
    _set_auto_failover(nodes[0])
    chains = _vbucket_chains(nodes[0], nodes)
    status, reply, _ = mgmt_request(nodes[1].server, "POST", "/diag/replication",
                                    "paused=true", ADMIN)
    assert status == 200, reply
    c, coll = _connect(nodes, avoid=nodes[0])
    try:
        prefix = f"dur-{uuid.uuid4().hex[:6]}"
        keys = [k for k in (f"{prefix}-{i}" for i in range(2000))
                if chains[_vbucket(k)] == [0, 1, 2]][:40]
        assert len(keys) >= 20, "too few keys of vBuckets whose chain is [0, 1, 2]"
        written = {}
        for i, k in enumerate(keys):
            written[k] = {"i": i, "r": uuid.uuid4().hex[:8]}
            coll.upsert(k, written[k], MAJORITY)
        vbs = sorted({_vbucket(k) for k in keys})
        print("before:", {vb: chains[vb] for vb in vbs})
        # Node 1 is behind: no replica read finds a write on two replicas.
        copies = {k: len(_replica_values(coll, k)) for k in keys}
        assert max(copies.values()) <= 1, f"node 1 replicated while paused: {copies}"
        killed_at = time.monotonic()
        nodes[0].kill()
        _wait_failed_over(nodes[2], nodes[0])
        print(f"node 0 inactiveFailed after {time.monotonic() - killed_at:.2f}s")
        after = _vbucket_chains(nodes[2], nodes)
        print("after:", {vb: after[vb] for vb in vbs})
        wrong = {vb: after[vb] for vb in vbs if after[vb][:2] != [2, 1]}
        assert not wrong, f"node 2 (the replica holding the writes) not promoted: {wrong}"
        wrong = _read_back(coll, written, chains)
        assert not wrong, "acknowledged writes lost:\n" + "\n".join(wrong)

        status, reply, _ = mgmt_request(nodes[1].server, "POST", "/diag/replication",
                                        "paused=false", ADMIN)
        assert status == 200, reply
        for k, want in written.items():
            _wait_for(lambda k=k, want=want: want in _replica_values(coll, k),
                      REPLICA_WAIT_SECS, f"{k} on node 1 (the replica) as {want}")
    finally:
        c.close()


def _replica_values(coll, key):
    """The document's contents on its replicas that the SDK reads now."""
    try:
        return [r.content_as[dict] for r in coll.get_all_replicas(key) if r.is_replica]
    except CouchbaseException:
        return []


def test_max_count_is_honoured(start_cluster):
    """With maxCount=1 a second dead node is not failed over (count stays 1) until the
    count is reset. Two replicas, so that failing over the second node would lose no
    vBucket's last copy: only maxCount holds it back."""
    nodes = start_cluster(replicas=2)
    _set_auto_failover(nodes[0], max_count=1)
    leader = _orchestrator(nodes)
    first, second = [n for n in nodes if n is not leader]
    first.kill()
    _wait_failed_over(leader, first)
    assert _auto_failover(leader)["count"] == 1

    second.kill()
    _wait_for(lambda: _members(leader)[second.otp]["status"] == "unhealthy",
              FAILOVER_WAIT_SECS, f"node {second.index} unhealthy")
    # Its lease has expired; well past the 1 s timeout it is still a member.
    time.sleep(5)
    assert _members(leader)[second.otp]["clusterMembership"] == "active"
    auto = _auto_failover(leader)
    assert (auto["count"], auto["maxCount"]) == (1, 1), auto

    status, reply, _ = mgmt_request(leader.server, "POST", "/settings/autoFailover/resetCount",
                                    "", ADMIN)
    assert status == 200, reply
    _wait_failed_over(leader, second)
    assert _auto_failover(leader)["count"] == 1


def test_metadata_made_on_one_node_is_usable_through_another_at_once(start_cluster):
    """A bucket, a scope and collection, and a user created through node 0's REST API are
    usable by the SDK through node 2 as soon as the calls return: the user, bootstrapped
    from node 2 alone, writes to and reads from the new collection."""
    nodes = start_cluster(1)
    steps = [
        ("POST", "/pools/default/buckets", "name=travel&ramQuotaMB=32"),
        ("POST", "/pools/default/buckets/travel/scopes", "name=inventory"),
        ("POST", "/pools/default/buckets/travel/scopes/inventory/collections", "name=airline"),
        ("PUT", "/settings/rbac/users/local/app",
         "password=app-secret&roles=data_writer%5Btravel%5D%2Cdata_reader%5Btravel%5D"),
    ]
    for method, path, body in steps:
        status, reply, _ = mgmt_request(nodes[0].server, method, path, body, ADMIN)
        assert status in (200, 202), (path, status, reply)
    c = sdk_connect(nodes[2].server.addr, "app", "app-secret", kv_timeout=timedelta(seconds=5),
                    management_timeout=None, ready=None)
    try:
        coll = c.bucket("travel").scope("inventory").collection("airline")
        for i in range(20):
            coll.upsert(f"airline-{i}", {"n": i})
        for i in range(20):
            assert coll.get(f"airline-{i}").content_as[dict] == {"n": i}
    finally:
        c.close()
