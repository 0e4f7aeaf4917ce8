"""The Couchbase Python SDK through rebalances of an etcd-backed epkv cluster (issue 15):
2 -> 3 nodes, then 3 -> 2 ejecting node 0 (the node the SDK bootstrapped from), then a
swap (node 3 added, node 1 ejected), each under a load of gets, upserts and Majority
upserts from several threads.

After each step: every write the SDK acknowledged reads back with its value (or with a
later write's that failed ambiguously); no read during the load saw anything else; the
only operations that failed are timeouts (the SDK retries what a rebalance answers, such
as NOT_MY_VBUCKET, until the operation's timeout); every remaining node agrees on a
balanced map: each vBucket has an active and a replica on two distinct members, the
actives and the replicas are each spread within one vBucket across the members, the
ejected nodes are out of ``serverList`` and ``/pools/default``.

The harness (etcd, nodes, helpers) is test_couchbase_etcd.py's; the two first nodes are
seeded from a cluster file, the added ones start with the same ``--etcd`` and
``--cluster-name`` and no file, and register until ``/controller/addNode`` adds them."""

import itertools
import os
import random
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from datetime import timedelta
from urllib.parse import urlencode

import pytest

from conftest import _free_ports, _start_server_with, _stop_server, alarm_after, mgmt_request

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="starts a cluster of its own",
)

from couchbase.durability import DurabilityLevel, ServerDurability  # noqa: E402
from couchbase.exceptions import (  # noqa: E402
    AmbiguousTimeoutException,
    CouchbaseException,
    DocumentNotFoundException,
    UnAmbiguousTimeoutException,
)
from couchbase.options import GetOptions, UpsertOptions  # noqa: E402
from test_couchbase_etcd import (  # noqa: E402,F401 (etcd is a fixture)
    ADMIN,
    READY_SECS,
    Node,
    _all_active_and_healthy,
    _connect,
    _members,
    _vbucket,
    _vbucket_chains,
    _wait_for,
    etcd,
)

TEST_ALARM_SECS = 360
REPLICAS = 1
MOVES_PER_NODE = 16
ADD_NODE_SECS = 10
REBALANCE_SECS = 90
SETTLE_SECS = 20
POLL_SECS = 0.1
LOAD_THREADS = 4
KEYS_PER_THREAD = 250
# The load runs this long before each rebalance starts and after it ends.
LOAD_AROUND_SECS = 1.0
GET = GetOptions(timeout=timedelta(seconds=3))
UPSERT = UpsertOptions(timeout=timedelta(seconds=3))
MAJORITY = UpsertOptions(durability=ServerDurability(DurabilityLevel.MAJORITY),
                         timeout=timedelta(seconds=5))
# (operation, its options, its share of the load)
OPS = [("get", GET, 4), ("upsert", UPSERT, 3), ("majority", MAJORITY, 3)]
# The only failures allowed: timeouts (ambiguous or not) and a SyncWrite the server could
# not tell the outcome of.
ALLOWED_FAILURES = {"AmbiguousTimeoutException", "UnAmbiguousTimeoutException",
                    "DurabilitySyncWriteAmbiguousException"}
READ_BACK_ATTEMPTS = 3


class RebalanceCluster:
    """The nodes of one etcd-backed cluster, in the order they were started (a node's
    index is its place in that order); each is stopped when ``stops`` closes."""

    def __init__(self, etcd, tmp_path_factory, stops):
        self.etcd = etcd
        self.tmp = tmp_path_factory
        self.stops = stops
        self.name = f"rebalance-test-{uuid.uuid4().hex[:8]}"
        self.nodes = []

    def _start(self, kv, mgmt, args):
        server, log = _start_server_with(
            self.tmp,
            ["--admin-user", ADMIN[0], "--admin-password", ADMIN[1], "--mgmt-port", str(mgmt),
             "--etcd", self.etcd, "--cluster-name", self.name, *args],
            port=kv,
        )
        self.stops.callback(_stop_server, server, log)
        node = Node(len(self.nodes), server, log)
        self.nodes.append(node)
        return node

    def start_seeded(self, count):
        """Starts ``count`` nodes sharing a cluster file (``REPLICAS`` replicas); waits
        until each lists them all active and healthy."""
        ports = _free_ports(2 * count)
        pairs = list(zip(ports[:count], ports[count:]))
        seed = self.tmp.mktemp("epkv-cluster") / "cluster.toml"
        seed.write_text(
            f'replicas = {REPLICAS}\nuser = "{ADMIN[0]}"\npassword = "{ADMIN[1]}"\n'
            + "".join(f'[[nodes]]\nhost = "127.0.0.1"\nport = {kv}\nmgmt_port = {mgmt}\n'
                      for kv, mgmt in pairs))
        started = [self._start(kv, mgmt, ["--cluster", str(seed), "--cluster-node", str(i)])
                   for i, (kv, mgmt) in enumerate(pairs)]
        for n in started:
            _wait_for(lambda n=n: _all_active_and_healthy(n, count), READY_SECS,
                      f"node {n.index} lists {count} nodes active and healthy")
        return started

    def start_unadded(self):
        """Starts a node on the cluster's etcd without a cluster file: it registers and
        waits to be added."""
        return self._start(*_free_ports(2), [])

    def print_logs(self):
        for n in self.nodes:
            print(f"--- node {n.index} ({n.server.addr}), exit code {n.server.proc.poll()}, "
                  f"log {n.server.log_path}:\n{n.server.log_tail(60)}")


@pytest.fixture
def cluster(etcd, tmp_path_factory, request):  # noqa: F811 (the fixture imported)
    """A :class:`RebalanceCluster` on a fresh etcd; teardown prints the tails of the
    nodes' logs when the test failed, and stops them all (every one, even when stopping
    another fails)."""
    failed_before = request.session.testsfailed
    with ExitStack() as stops:
        c = RebalanceCluster(etcd, tmp_path_factory, stops)
        yield c
        if request.session.testsfailed > failed_before:
            c.print_logs()


def _post(node, path, form):
    """POSTs ``form`` (a dict) to ``node``'s management port as the administrator."""
    return mgmt_request(node.server, "POST", path, urlencode(form), ADMIN)


def _add_node(via, node):
    """``/controller/addNode`` through ``via``, again until ``node`` has registered
    (bounded); it is then ``inactiveAdded``."""
    form = {"hostname": node.server.mgmt_addr, "user": ADMIN[0], "password": ADMIN[1]}
    deadline = time.monotonic() + ADD_NODE_SECS
    while True:
        status, reply, _ = _post(via, "/controller/addNode", form)
        if status == 200:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"addNode of node {node.index} answered {status} {reply} for "
                        f"{ADD_NODE_SECS}s")
        time.sleep(POLL_SECS)
    assert reply == {"otpNode": node.otp}, reply
    assert _members(via)[node.otp]["clusterMembership"] == "inactiveAdded"


# Times a rebalance stopped by a lost lease or a slow etcd is started again.
RESTARTS = 3


def _rebalance(via, eject):
    """Starts a rebalance through ``via`` with every node ``/pools/default`` lists as
    known, ejecting ``eject``; waits (bounded) until it is over and checks it completed.
    Returns the most vBuckets left it reported."""
    known = sorted(_members(via))
    form = {"knownNodes": ",".join(known), "ejectedNodes": ",".join(n.otp for n in eject)}
    status, reply, _ = _post(via, "/controller/rebalance", form)
    assert status == 200, (status, reply)
    deadline = time.monotonic() + REBALANCE_SECS
    most_left = 0
    restarts = 0
    while True:
        # ``via`` installed the document that started it: it never reports the last one.
        status, progress, _ = mgmt_request(via.server, "GET", "/pools/default/rebalanceProgress",
                                           auth=ADMIN)
        assert status == 200, progress
        if progress["status"] == "none":
            last = progress.get("lastRebalance", "")
            # Stopped by something the test did not do (the orchestrator lost its etcd
            # lease, or etcd stayed too slow, as a loaded CI machine can make it): an
            # operator starts it again, and so does the test, a few times at most.
            if (last.startswith("stopped: the orchestrator changed")
                    or last.startswith("failed")) and restarts < RESTARTS:
                restarts += 1
                print(f"the rebalance ended as {last!r}; starting it again")
                status, reply, _ = _post(via, "/controller/rebalance", form)
                assert status == 200, (status, reply)
                continue
            break
        most_left = max(most_left, progress.get("vbucketsLeft", 0))
        if time.monotonic() > deadline:
            pytest.fail(f"the rebalance still runs after {REBALANCE_SECS}s: {progress}")
        time.sleep(POLL_SECS)
    assert progress.get("lastRebalance", "").startswith("completed"), progress
    return most_left


def _map_problems(node, members, everyone):
    """What is wrong with ``node``'s map of the default bucket for a cluster of
    ``members`` (see the module docs), and the map's chains."""
    status, reply, _ = mgmt_request(node.server, "GET", "/pools/default/b/default",
                                    auth=ADMIN)
    assert status == 200, reply
    problems = []
    servers = sorted(reply["vBucketServerMap"]["serverList"])
    if servers != sorted(n.server.addr for n in members):
        problems.append(f"serverList {servers}")
    chains = _vbucket_chains(node, everyone)
    ids = {n.index for n in members}
    bad = [v for v, c in enumerate(chains)
           if len(c) != REPLICAS + 1 or len(set(c)) != len(c) or not set(c) <= ids]
    if bad:
        problems.append(f"{len(bad)} vBuckets without {REPLICAS + 1} copies on distinct "
                        f"members, e.g. {bad[0]}: {chains[bad[0]]}")
    for rank in range(REPLICAS + 1):
        counts = Counter(c[rank] for c in chains if len(c) > rank)
        spread = {i: counts.get(i, 0) for i in sorted(ids)}
        if max(spread.values()) - min(spread.values()) > 1:
            problems.append(f"copies of rank {rank} per node: {spread}")
    return problems, chains


def _settle_problems(members, everyone):
    """What keeps the ``members`` from agreeing on a finished, balanced cluster of
    themselves."""
    problems = []
    maps = []
    for n in members:
        status, pools, _ = mgmt_request(n.server, "GET", "/pools/default", auth=ADMIN)
        assert status == 200, pools
        listed = {m["otpNode"]: m["clusterMembership"] for m in pools["nodes"]}
        if listed != {m.otp: "active" for m in members}:
            problems.append(f"node {n.index} lists {listed}")
        if (pools["rebalanceStatus"], pools["balanced"]) != ("none", True):
            problems.append(f"node {n.index}: rebalanceStatus {pools['rebalanceStatus']}, "
                            f"balanced {pools['balanced']}")
        wrong, chains = _map_problems(n, members, everyone)
        problems += [f"node {n.index}'s map: {w}" for w in wrong]
        maps.append(chains)
    if any(m != maps[0] for m in maps):
        problems.append("the members' maps differ")
    return problems


def _wait_settled(members, everyone):
    """Waits (bounded) until :func:`_settle_problems` finds none."""
    deadline = time.monotonic() + SETTLE_SECS
    while True:
        problems = _settle_problems(members, everyone)
        if not problems:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not settled after {SETTLE_SECS}s:\n" + "\n".join(problems))
        time.sleep(POLL_SECS)


class MixedLoad:
    """Threads doing gets, upserts and Majority upserts at random, each over keys of its
    own (so that its operations on a key are ordered). ``acked`` holds each key's last
    acknowledged value; ``maybe`` the values of the writes to it that failed since (they
    may have been applied). Per step (between :meth:`start` and :meth:`report`):
    ``failed`` counts failures by operation and error, ``retries`` the timeouts' retry
    reasons, ``bad_reads`` describes gets that read neither."""

    def __init__(self, coll, prefix):
        self.coll = coll
        self.prefix = prefix
        self.acked = {}
        self.maybe = {}
        self.seq = itertools.count()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = []
        self.step = 0
        self._reset()

    def _reset(self):
        self.ops = Counter()
        self.acks = 0
        self.failed = Counter()
        self.retries = Counter()
        self.bad_reads = []

    def start(self):
        self.step += 1
        self.stopping.clear()
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True)
                        for w in range(LOAD_THREADS)]
        for t in self.threads:
            t.start()

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(15)
        assert not any(t.is_alive() for t in self.threads), "a load thread did not stop"

    def report(self):
        """This step's counts (and a fresh start for the next)."""
        with self.lock:
            out = {"ops": dict(self.ops), "acked": self.acks, "failed": dict(self.failed),
                   "retry reasons": dict(self.retries), "bad reads": self.bad_reads}
            self._reset()
        return out

    def unexpected(self, key, got):
        """Why ``got`` (None: not found) is not a value ``key`` may have now, or None."""
        allowed = list(self.maybe.get(key, ()))
        if key in self.acked:
            allowed.append(self.acked[key])
        elif got is None:
            return None
        if got in allowed:
            return None
        return (f"{key} (vBucket {_vbucket(key)}): acknowledged {self.acked.get(key)}, "
                f"failed since {self.maybe.get(key, [])}, read {got}")

    def _run(self, worker):
        rng = random.Random(f"{self.prefix}-{worker}-{self.step}")
        names, options, weights = zip(*OPS)
        while not self.stopping.is_set():
            key = f"{self.prefix}-{worker}-{rng.randrange(KEYS_PER_THREAD)}"
            i = rng.choices(range(len(OPS)), weights)[0]
            op = names[i]
            value = {"w": worker, "n": next(self.seq)}
            try:
                if op == "get":
                    try:
                        value = self.coll.get(key, options[i]).content_as[dict]
                    except DocumentNotFoundException:
                        value = None
                else:
                    self.coll.upsert(key, value, options[i])
            except CouchbaseException as e:
                self._failed(op, e)
                if op != "get":
                    self.maybe.setdefault(key, []).append(value)
                time.sleep(0.01)
                continue
            with self.lock:
                self.ops[op] += 1
                if op == "get":
                    why = self.unexpected(key, value)
                    if why:
                        self.bad_reads.append(why)
                else:
                    self.acks += 1
                    self.acked[key] = value
                    self.maybe.pop(key, None)

    def _failed(self, op, e):
        ctx = e.error_context
        with self.lock:
            self.failed[f"{op}: {type(e).__name__}"] += 1
            for reason in getattr(ctx, "retry_reasons", None) or ():
                self.retries[reason] += 1
            if not getattr(ctx, "retry_attempts", None):
                self.retries["(not retried)"] += 1

    def read_back(self):
        """Reads every key written so far; returns the ones that read wrong, described,
        and the timeouts retried on the way."""
        wrong = []
        timeouts = Counter()
        for key in sorted(set(self.acked) | set(self.maybe)):
            got = "(timed out)"
            for _ in range(READ_BACK_ATTEMPTS):
                try:
                    got = self.coll.get(key, GET).content_as[dict]
                except DocumentNotFoundException:
                    got = None
                except (AmbiguousTimeoutException, UnAmbiguousTimeoutException) as e:
                    timeouts[type(e).__name__] += 1
                    continue
                break
            why = self.unexpected(key, got)
            if why:
                wrong.append(why)
        return wrong, timeouts


def _step(what, load, via, members, everyone, eject=()):
    """One rebalance through ``via`` (ejecting ``eject``) under the load, and the checks
    of the module docs once it is over."""
    load.start()
    try:
        time.sleep(LOAD_AROUND_SECS)
        started = time.monotonic()
        most_left = _rebalance(via, eject)
        print(f"{what}: rebalanced in {time.monotonic() - started:.1f}s (at most "
              f"{most_left} vBuckets left seen)")
        time.sleep(LOAD_AROUND_SECS)
    finally:
        load.stop()
        report = load.report()
        print(f"{what}: load {report}")
    _wait_settled(members, everyone)
    wrong, timeouts = load.read_back()
    print(f"{what}: read back {len(set(load.acked) | set(load.maybe))} keys "
          f"({len(load.acked)} acknowledged), timeouts retried: {dict(timeouts)}")
    assert report["acked"] > 0, f"{what}: no write acknowledged: {report}"
    assert not report["bad reads"], (f"{what}: {len(report['bad reads'])} gets read a value "
                                     "never written last:\n" + "\n".join(report["bad reads"][:20]))
    assert not wrong, (f"{what}: {len(wrong)} of {len(load.acked)} acknowledged writes do not "
                       "read back:\n" + "\n".join(wrong[:20]))
    other = {f: n for f, n in report["failed"].items()
             if f.split(": ")[1] not in ALLOWED_FAILURES}
    assert not other, f"{what}: operations failed with more than timeouts: {other}"


def test_rebalance_in_out_and_swap_under_sdk_load(cluster):
    """2 -> 3 nodes, 3 -> 2 ejecting node 0, then node 3 in and node 1 out, under the
    SDK's load: see the module docs."""
    with alarm_after(TEST_ALARM_SECS):
        begun = time.monotonic()
        n0, n1 = cluster.start_seeded(2)
        status, reply, _ = _post(n0, "/internalSettings",
                                 {"rebalanceMovesPerNode": MOVES_PER_NODE})
        assert status == 200 and reply["rebalanceMovesPerNode"] == MOVES_PER_NODE, reply
        # Bootstrapped from node 0 (the one ejected in the second step), every node of the
        # cluster in the connection string.
        c, coll = _connect([n0, n1], avoid=n1)
        load = MixedLoad(coll, f"reb-{uuid.uuid4().hex[:6]}")
        try:
            n2 = cluster.start_unadded()
            _add_node(n0, n2)
            _step("2 -> 3 nodes", load, n0, [n0, n1, n2], cluster.nodes)
            _step("3 -> 2 nodes (node 0 ejected)", load, n1, [n1, n2], cluster.nodes,
                  eject=[n0])
            n3 = cluster.start_unadded()
            _add_node(n1, n3)
            _step("swap (node 3 in, node 1 out)", load, n2, [n2, n3], cluster.nodes,
                  eject=[n1])
        finally:
            load.stop()
            c.close()
        print(f"the test took {time.monotonic() - begun:.1f}s")
