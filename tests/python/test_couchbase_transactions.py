"""Couchbase distributed transactions (``cluster.transactions.run``) with the Python SDK
(``couchbase==4.6.3``, couchbase-cxx-client 1.3.2) against epkv, end to end, nothing but
what KV-Engine offers on the server side.

What a transaction does on the wire, and so what these tests exercise: an Active
Transaction Record (ATR, ``_txn:atr-N-#...``, an xattr ``attempts.ID`` written with
``${Mutation.CAS}``) per attempt; staged inserts written as tombstones
(CREATE_AS_DELETED) and staged replaces and removes as the ``txn`` xattr of the live
document (with ``${$document.CAS}`` and friends for the ``txn.restore`` fields); reads
with ACCESS_DELETED of ``txn``, ``$document`` and the body; commit by REVIVE plus
SUBDOC_REPLACE_BODY_WITH_XATTR (inserts), REPLACE_BODY_WITH_XATTR (replaces) or a
DELETE (removes); the lost-attempt cleanup's client record ``_txn:client-record`` and its
``$vbucket.HLC`` clock. Single-node tests share one server with a scope ``app`` of two
collections and a metadata collection; the last test runs a 2-node etcd cluster with one
replica at Majority.

Every SDK call is bounded by the SDK's timeouts, every wait by a count and a deadline,
and each test by an alarm; nothing asserts on timing."""

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from datetime import timedelta

import pytest

from conftest import admin_server, alarm_after, sdk_connect

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="needs a server of its own, with collections and an administrator",
)

import couchbase.subdocument as SD  # noqa: E402
from couchbase.durability import DurabilityLevel, ServerDurability  # noqa: E402
from couchbase.exceptions import (  # noqa: E402
    DocumentNotFoundException,
    TransactionExpired,
    TransactionFailed,
)
from couchbase.options import (  # noqa: E402
    LookupInOptions,
    TransactionConfig,
    TransactionOptions,
)
from couchbase.transactions import TransactionKeyspace  # noqa: E402
from test_couchbase_etcd import _vbucket, _vbucket_chains, etcd  # noqa: E402,F401 (a fixture)
from test_couchbase_rebalance import RebalanceCluster  # noqa: E402

ADMIN = ("Administrator", "password")
TEST_ALARM_SECS = 120
SCOPE = "app"
COLLECTIONS = ("users", "orders")
META = "txnmeta"
# A transaction gives up (and rolls back) after this long.
TXN_TIMEOUT = timedelta(seconds=15)
# Bounds of the waits for background work (cleanup): attempts and a deadline.
WAIT_SECS = 60
WAIT_POLL_SECS = 0.2
WAIT_POLLS = int(WAIT_SECS / WAIT_POLL_SECS)
# A lambda blocks at most this long for the test to let it go on.
BLOCK_SECS = 30


@pytest.fixture(autouse=True)
def _bounded():
    with alarm_after(TEST_ALARM_SECS):
        yield


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    colls = ",".join(f"default:{SCOPE}.{c}" for c in (*COLLECTIONS, META))
    yield from admin_server(
        tmp_path_factory, ADMIN, extra=("--memory-quota", "64MiB", "--collections", colls))


def _config(**kwargs):
    return TransactionConfig(timeout=TXN_TIMEOUT, **kwargs)


@pytest.fixture(scope="module")
def cluster(server):
    c = sdk_connect(server.addr, *ADMIN, transaction_config=_config())
    yield c
    c.close()


@pytest.fixture
def key(request):
    return f"txn-{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"


def _colls(cluster):
    scope = cluster.bucket("default").scope(SCOPE)
    return [scope.collection(c) for c in COLLECTIONS]


def _txn_xattr(coll, key, access_deleted=False):
    """The document's ``txn`` xattr (what a transaction staged), or None without one;
    raises DocumentNotFoundException when there is no document (nor a tombstone, with
    ``access_deleted``)."""
    r = coll.lookup_in(key, [SD.get("txn", xattr=True)],
                       LookupInOptions(access_deleted=access_deleted))
    return r.content_as[dict](0) if r.exists(0) else None


def _atr_entry(cluster, txn):
    """The ATR entry of the attempt that staged ``txn`` (a ``txn`` xattr), or None once
    it is gone."""
    atr = txn["atr"]
    coll = cluster.bucket(atr["bkt"]).scope(atr["scp"]).collection(atr["coll"])
    r = coll.lookup_in(atr["id"], [SD.get(f"attempts.{txn['id']['atmpt']}", xattr=True)])
    return r.content_as[dict](0) if r.exists(0) else None


def _wait_for(check, what):
    """Polls ``check`` until it returns a true value (at most WAIT_POLLS times and
    WAIT_SECS); returns it."""
    deadline = time.monotonic() + WAIT_SECS
    for _ in range(WAIT_POLLS):
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            break
        time.sleep(WAIT_POLL_SECS)
    pytest.fail(f"timed out waiting until {what}")


def _gone(coll, key):
    try:
        coll.get(key)
    except DocumentNotFoundException:
        return True
    return False


def _commit(cluster, colls, key):
    """One transaction inserts into ``colls[0]`` and ``colls[2]``, replaces in
    ``colls[0]`` and removes from ``colls[1]``; checks what is visible while it is staged
    (the replace's ``txn`` xattr, with the old CAS from a document macro), then that
    everything committed, nothing stays staged and the ATR entry goes."""
    first, second, third = colls
    first.upsert(f"{key}-r", {"name": "ann", "n": 1})
    second.upsert(f"{key}-d", {"order": 7})
    old_cas = first.get(f"{key}-r").cas
    seen = {}

    def logic(ctx):
        ctx.insert(first, f"{key}-i", {"name": "bob"})
        ctx.insert(third, f"{key}-i2", {"in": "third"})
        doc = ctx.get(first, f"{key}-r")
        ctx.replace(doc, {"name": "ann", "n": doc.content_as[dict]["n"] + 1})
        ctx.remove(ctx.get(second, f"{key}-d"))
        # Staged, not yet visible outside.
        seen["txn"] = _txn_xattr(first, f"{key}-r")
        seen["outside"] = first.get(f"{key}-r").content_as[dict]
        seen["insert"] = _gone(first, f"{key}-i")

    result = cluster.transactions.run(logic)
    assert result.unstaging_complete
    staged = seen["txn"]
    assert staged["op"]["type"] == "replace"
    assert staged["op"]["stgd"] == {"name": "ann", "n": 2}
    assert staged["restore"]["CAS"] == f"0x{old_cas:016x}", "${$document.CAS} expanded"
    assert seen["outside"] == {"name": "ann", "n": 1}
    assert seen["insert"], "a staged insert is a tombstone"

    assert first.get(f"{key}-i").content_as[dict] == {"name": "bob"}
    assert third.get(f"{key}-i2").content_as[dict] == {"in": "third"}
    assert first.get(f"{key}-r").content_as[dict] == {"name": "ann", "n": 2}
    assert _gone(second, f"{key}-d")
    for coll, k in ((first, f"{key}-i"), (third, f"{key}-i2"), (first, f"{key}-r")):
        assert _txn_xattr(coll, k) is None, f"{k} keeps no staged state"
    _wait_for(lambda: _atr_entry(cluster, staged) is None, "the attempt's ATR entry is removed")


def test_a_transaction_commits_inserts_replaces_and_removes_across_collections(cluster, key):
    users, orders = _colls(cluster)
    _commit(cluster, [users, orders, cluster.bucket("default").default_collection()], key)


class Rollback(Exception):
    pass


def test_a_lambda_that_raises_rolls_back_and_leaves_nothing_staged(cluster, key):
    users, orders = _colls(cluster)
    users.upsert(f"{key}-r", {"v": "before"})
    orders.upsert(f"{key}-d", {"v": "kept"})
    seen = {}

    def logic(ctx):
        ctx.replace(ctx.get(users, f"{key}-r"), {"v": "after"})
        ctx.insert(users, f"{key}-i", {"v": "new"})
        ctx.remove(ctx.get(orders, f"{key}-d"))
        seen["txn"] = _txn_xattr(users, f"{key}-r")
        seen["insert"] = _txn_xattr(users, f"{key}-i", access_deleted=True)
        raise Rollback("the application changed its mind")

    with pytest.raises(TransactionFailed) as failed:
        cluster.transactions.run(logic)
    assert "changed its mind" in str(failed.value)
    assert seen["insert"]["op"]["type"] == "insert"

    assert users.get(f"{key}-r").content_as[dict] == {"v": "before"}
    assert orders.get(f"{key}-d").content_as[dict] == {"v": "kept"}
    assert _gone(users, f"{key}-i")
    assert _txn_xattr(users, f"{key}-r") is None
    assert _txn_xattr(orders, f"{key}-d") is None
    try:
        assert _txn_xattr(users, f"{key}-i", access_deleted=True) is None
    except DocumentNotFoundException:
        pass  # the tombstone itself went
    _wait_for(lambda: _atr_entry(cluster, seen["txn"]) is None,
              "the rolled-back attempt's ATR entry is removed")


# An application runs a transaction that failed (this SDK does not rerun a lambda whose
# operation failed; it rolls back and raises TransactionFailed) at most this many times.
APP_RETRIES = 5


def _conflict(cluster, coll, key, options=None):
    """Two transactions read the same version of ``key``, then both replace it: one
    commits, the other fails cleanly (TransactionFailed, its staging refused by the CAS)
    and is run again by the application on the new version. Checks that no update is
    lost and nothing stays staged."""
    coll.upsert(key, {"n": 0})
    both_read = threading.Barrier(2, timeout=BLOCK_SECS)
    runs = Counter()
    outcomes = {"a": [], "b": []}

    def worker(name):
        def logic(ctx):
            runs[name] += 1
            doc = ctx.get(coll, key)
            n = doc.content_as[dict]["n"]
            if runs[name] == 1:
                # Both read the same version before either writes: one must lose.
                both_read.wait()
            ctx.replace(doc, {"n": n + 1, "last": name})

        for _ in range(APP_RETRIES):
            try:
                if options is None:
                    cluster.transactions.run(logic)
                else:
                    cluster.transactions.run(logic, options)
                outcomes[name].append("committed")
                return
            except (TransactionFailed, TransactionExpired) as e:
                outcomes[name].append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TEST_ALARM_SECS)
    assert not any(t.is_alive() for t in threads)
    assert all(o and o[-1] == "committed" for o in outcomes.values()), outcomes
    failures = [e for o in outcomes.values() for e in o if e != "committed"]
    assert failures, f"both read one version, so one failed first: {outcomes}"
    assert all(isinstance(e, TransactionFailed) for e in failures), failures
    assert sum(runs.values()) == 2 + len(failures)
    final = coll.get(key).content_as[dict]
    assert final["n"] == 2, f"no lost update: {final}, {outcomes}"
    assert _txn_xattr(coll, key) is None


def test_two_transactions_on_one_key_lose_no_update(cluster, key):
    users, _ = _colls(cluster)
    _conflict(cluster, users, key)


def test_a_transaction_reads_its_own_writes_and_the_committed_version_of_others(cluster, key):
    users, _ = _colls(cluster)
    users.upsert(key, {"v": "committed"})
    staged = threading.Event()
    release = threading.Event()
    own = {}
    errors = []

    def first(ctx):
        ctx.replace(ctx.get(users, key), {"v": "staged"})
        ctx.insert(users, f"{key}-i", {"v": "new"})
        own["replaced"] = ctx.get(users, key).content_as[dict]
        own["inserted"] = ctx.get(users, f"{key}-i").content_as[dict]
        staged.set()
        assert release.wait(BLOCK_SECS), "the test let the first transaction go on"

    def run_first():
        try:
            cluster.transactions.run(first)
        except Exception as e:  # noqa: BLE001 (reported by the main thread)
            errors.append(e)
            staged.set()

    t = threading.Thread(target=run_first)
    t.start()
    try:
        assert staged.wait(BLOCK_SECS) and not errors, errors
        assert own == {"replaced": {"v": "staged"}, "inserted": {"v": "new"}}
        other = {}

        def second(ctx):
            other["replaced"] = ctx.get(users, key).content_as[dict]
            try:
                other["inserted"] = ctx.get(users, f"{key}-i").content_as[dict]
            except DocumentNotFoundException:
                other["inserted"] = None

        cluster.transactions.run(second)
        assert other == {"replaced": {"v": "committed"}, "inserted": None}
        assert users.get(key).content_as[dict] == {"v": "committed"}
    finally:
        release.set()
        t.join(TEST_ALARM_SECS)
    assert not errors, errors
    assert users.get(key).content_as[dict] == {"v": "staged"}
    assert users.get(f"{key}-i").content_as[dict] == {"v": "new"}


def _raw_request(sock, opcode, key=b"", value=b""):
    """One binary-protocol request; returns the replies' (status, key, value) until one
    with an empty key (STAT's end) or the first for other opcodes."""
    header = struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), 0, 0, 0, len(key) + len(value),
                         0x7E, 0)
    sock.sendall(header + key + value)
    replies = []
    while True:
        head = _recv_exact(sock, 24)
        key_len, extras_len = struct.unpack(">H", head[2:4])[0], head[4]
        status, body_len = struct.unpack(">H", head[6:8])[0], struct.unpack(">I", head[8:12])[0]
        body = _recv_exact(sock, body_len)
        k = body[extras_len:extras_len + key_len]
        replies.append((status, k, body[extras_len + key_len:]))
        if opcode != 0x10 or not k or status != 0:
            return replies


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "server closed the connection"
        data += chunk
    return data


def _sync_writes_committed(addr):
    """The default bucket's count of committed SyncWrites (STAT, as the admin)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        plain = b"\0" + ADMIN[0].encode() + b"\0" + ADMIN[1].encode()
        assert _raw_request(s, 0x21, key=b"PLAIN", value=plain)[0][0] == 0
        assert _raw_request(s, 0x89, key=b"default")[0][0] == 0
        stats = {k: v for _, k, v in _raw_request(s, 0x10)}
    return int(stats[b"vb_active_sync_write_committed_count"])


@pytest.mark.parametrize("where", ["cluster config", "transaction options"])
def test_durability_none_and_majority(server, key, where):
    def run(level, suffix):
        durability = ServerDurability(level)
        # No background cleanup (its writes take the cluster's level); per transaction,
        # the cluster's level is the other one, which the options override.
        quiet = {"cleanup_lost_attempts": False, "cleanup_client_attempts": False}
        if where == "cluster config":
            config = _config(durability=durability, **quiet)
            opts = None
        else:
            other = (DurabilityLevel.MAJORITY if level == DurabilityLevel.NONE
                     else DurabilityLevel.NONE)
            config = _config(durability=ServerDurability(other), **quiet)
            opts = TransactionOptions(durability=durability, timeout=TXN_TIMEOUT)
        c = sdk_connect(server.addr, *ADMIN, transaction_config=config)
        try:
            coll = c.bucket("default").scope(SCOPE).collection(COLLECTIONS[0])
            coll.upsert(f"{key}-{suffix}", {"v": 0})
            before = _sync_writes_committed(server.addr)

            def logic(ctx):
                ctx.replace(ctx.get(coll, f"{key}-{suffix}"), {"v": 1})
                ctx.insert(coll, f"{key}-{suffix}-i", {"v": 1})

            if opts is None:
                c.transactions.run(logic)
            else:
                c.transactions.run(logic, opts)
            assert coll.get(f"{key}-{suffix}").content_as[dict] == {"v": 1}
            assert coll.get(f"{key}-{suffix}-i").content_as[dict] == {"v": 1}
            return _sync_writes_committed(server.addr) - before
        finally:
            c.close()

    # Majority: the ATR writes, the staging and the unstaging are SyncWrites (a pending
    # ATR entry, two staged documents, a committed entry, two unstaged documents at
    # least); None: none of them.
    assert run(DurabilityLevel.MAJORITY, "majority") >= 6
    assert run(DurabilityLevel.NONE, "none") == 0


LOST_CLIENT = r"""
import sys, time
from datetime import timedelta
from couchbase.auth import PasswordAuthenticator
from couchbase.cluster import Cluster
from couchbase.options import ClusterOptions, TransactionConfig
from couchbase.transactions import TransactionKeyspace

addr, user, password, scope, coll, meta, key = sys.argv[1:8]
meta = TransactionKeyspace(bucket="default", scope=scope, collection=meta)
config = TransactionConfig(timeout=timedelta(seconds=3), cleanup_window=timedelta(seconds=2),
                           metadata_collection=meta)
c = Cluster(f"couchbase://{addr}", ClusterOptions(PasswordAuthenticator(user, password),
            enable_app_telemetry=False, transaction_config=config))
c.wait_until_ready(timedelta(seconds=10))
users = c.bucket("default").scope(scope).collection(coll)

def logic(ctx):
    ctx.insert(users, key + "-i", {"v": "new"})
    ctx.replace(ctx.get(users, key + "-r"), {"v": "after"})
    print("STAGED", flush=True)
    time.sleep(60)  # killed here

c.transactions.run(logic)
print("NOT KILLED", flush=True)
"""


def test_lost_attempt_cleanup_finishes_an_abandoned_attempt(server, tmp_path, key):
    """A client stages an insert and a replace, then dies (SIGKILL) before its commit
    point; another client's lost-attempt cleanup (the metadata collection registered, a
    short cleanup window) finds the expired PENDING attempt and removes its ATR entry.
    Nothing was committed: the replaced document keeps its body, the inserted one never
    appears, and the leftover staged state (which a PENDING attempt's cleanup leaves, as
    Couchbase Server's clients do) blocks no later transaction: reads see the committed
    body, and a new transaction writes both keys and leaves nothing staged."""
    admin = sdk_connect(server.addr, *ADMIN, transaction_config=_config(
        cleanup_lost_attempts=False, cleanup_client_attempts=False))
    users, _ = _colls(admin)
    try:
        users.upsert(f"{key}-r", {"v": "before"})
        script = tmp_path / "lost_client.py"
        script.write_text(LOST_CLIENT)
        proc = subprocess.Popen(
            [sys.executable, str(script), server.addr, *ADMIN, SCOPE, COLLECTIONS[0], META, key],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("STAGED") or len(lines) > 200:
                    break
            assert lines and lines[-1].startswith("STAGED"), "".join(lines[-20:])
            staged = _txn_xattr(users, f"{key}-r")
            assert staged["atr"]["coll"] == META
            assert _atr_entry(admin, staged)["st"] == "PENDING"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert _txn_xattr(users, f"{key}-i", access_deleted=True)["op"]["type"] == "insert"

        config = _config(cleanup_window=timedelta(seconds=2), cleanup_lost_attempts=True,
                         metadata_collection=TransactionKeyspace(bucket="default", scope=SCOPE,
                                                                 collection=META))
        cleaner = sdk_connect(server.addr, *ADMIN, transaction_config=config)
        try:
            _ = cleaner.transactions  # starts the cleanup of the metadata collection
            _wait_for(lambda: _atr_entry(admin, staged) is None,
                      "the lost attempt's ATR entry is cleaned up")
            # The cleaner took its share of the ATRs through the client record.
            meta = admin.bucket("default").scope(SCOPE).collection(META)
            record = meta.lookup_in("_txn:client-record",
                                    [SD.get("records.clients", xattr=True)])
            assert record.content_as[dict](0), "a client is registered"
        finally:
            cleaner.close()
        assert users.get(f"{key}-r").content_as[dict] == {"v": "before"}
        assert _gone(users, f"{key}-i")

        seen = {}

        def logic(ctx):
            doc = ctx.get(users, f"{key}-r")
            seen["r"] = doc.content_as[dict]
            ctx.replace(doc, {"v": "later"})
            ctx.insert(users, f"{key}-i", {"v": "later"})

        admin.transactions.run(logic)
        assert seen["r"] == {"v": "before"}, "the abandoned staged body is not read"
        assert users.get(f"{key}-r").content_as[dict] == {"v": "later"}
        assert users.get(f"{key}-i").content_as[dict] == {"v": "later"}
        assert _txn_xattr(users, f"{key}-r") is None
        assert _txn_xattr(users, f"{key}-i") is None
    finally:
        admin.close()


# ------------------------------------------------------------------ 2-node etcd cluster

# Key prefixes tried until the scenario's documents are active on both nodes.
SPREAD_ATTEMPTS = 100


@pytest.fixture
def two_nodes(etcd, tmp_path_factory, request):  # noqa: F811 (the fixture imported)
    """Two nodes of an etcd-backed cluster with one replica; teardown prints their logs'
    tails when the test failed, and stops them."""
    failed_before = request.session.testsfailed
    with ExitStack() as stops:
        c = RebalanceCluster(etcd, tmp_path_factory, stops)
        yield c.start_seeded(2)
        if request.session.testsfailed > failed_before:
            c.print_logs()


def test_commit_and_conflict_on_a_two_node_cluster_at_majority(two_nodes, key):
    """The commit and conflict scenarios on two nodes with one replica, every
    transactional write a Majority SyncWrite (so acknowledged by the replica); the
    documents are spread over both nodes' vBuckets, and the committed ones reach the
    replicas."""
    chains = _vbucket_chains(two_nodes[0], two_nodes)
    for i in range(SPREAD_ATTEMPTS):
        prefix = f"{key}-{i}"
        docs = [f"{prefix}-{s}" for s in ("r", "d", "i", "i2")]
        if {chains[_vbucket(d)][0] for d in docs} == {0, 1}:
            break
    else:
        pytest.fail("no key prefix spreads the documents over both nodes")
    key = prefix
    hosts = ",".join(n.server.addr for n in two_nodes)
    majority = ServerDurability(DurabilityLevel.MAJORITY)
    c = sdk_connect(hosts, *ADMIN, management_timeout=None, ready=timedelta(seconds=20),
                    transaction_config=_config(durability=majority))
    try:
        coll = c.bucket("default").default_collection()
        _commit(c, [coll, coll, coll], key)
        _conflict(c, coll, f"{key}-c", TransactionOptions(durability=majority,
                                                          timeout=TXN_TIMEOUT))
        for k, want in ((f"{key}-r", {"name": "ann", "n": 2}), (f"{key}-i", {"name": "bob"})):
            _wait_for(lambda k=k, want=want: _replicas_have(coll, k, want),
                      f"the replica of {k} has the committed body")
    finally:
        c.close()


def _replicas_have(coll, key, want):
    try:
        found = [r.content_as[dict] for r in coll.get_all_replicas(key)]
    except DocumentNotFoundException:
        return False
    return len(found) == 2 and all(f == want for f in found)
