"""KV range scans and sampling scans (RANGE_SCAN_CREATE/CONTINUE/CANCEL) through the
Couchbase Python SDK (``couchbase==4.6.3``), which scans every vBucket: ``RangeScan``,
``PrefixScan`` and ``SamplingScan``, ids only and with documents, over evicted documents
(a small full-eviction bucket), cancelled half-way, with ``consistent_with``, refused to a
user without the RangeScan privilege; and, over the raw protocol, an idle scan that
expires (the server runs with a short ``--range-scan-idle-timeout``).

Every SDK call is bounded by the SDK's timeouts and each test by an alarm.
"""

import base64
import json
import os
import socket
import struct
import subprocess
import time
import uuid
from datetime import timedelta

import pytest

from conftest import _server_bin, alarm_after, own_server, sdk_connect

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="needs a server of its own, configured with users and buckets",
)

from couchbase.exceptions import CouchbaseException  # noqa: E402
from couchbase.kv_range_scan import PrefixScan, RangeScan, SamplingScan, ScanTerm  # noqa: E402
from couchbase.mutation_state import MutationState  # noqa: E402
from couchbase.options import ScanOptions  # noqa: E402

ADMIN = ("Administrator", "password")
READER = ("reader", "reader-password")
TEST_ALARM_SECS = 120
KV_TIMEOUT = timedelta(seconds=10)
# The server closes a scan nobody continued for this long.
IDLE_TIMEOUT_MS = 1500
# Documents of the evicted bucket: enough 4 KiB values to pass its 8 MiB quota twice.
EVICTED_DOCS = 4000


@pytest.fixture(autouse=True)
def _bounded():
    with alarm_after(TEST_ALARM_SECS):
        yield


@pytest.fixture(scope="module")
def users_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("epkv-users") / "users.toml"
    subprocess.run(
        [str(_server_bin()), "user", "add", "--users-file", str(path), "--name", READER[0],
         "--password", READER[1], "--roles", "data_reader[default]"],
        check=True, capture_output=True, timeout=60,
    )
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, users_file):
    yield from own_server(tmp_path_factory, [
        "--buckets", "small=8MiB/full",
        "--users-file", str(users_file),
        "--admin-user", ADMIN[0], "--admin-password", ADMIN[1],
        "--range-scan-idle-timeout", str(IDLE_TIMEOUT_MS),
    ])


@pytest.fixture(scope="module")
def cluster(server):
    c = sdk_connect(server.addr, *ADMIN, kv_timeout=KV_TIMEOUT)
    yield c
    c.close()


@pytest.fixture(scope="module")
def coll(cluster):
    return cluster.bucket("default").default_collection()


@pytest.fixture
def prefix():
    return f"rs-{uuid.uuid4().hex[:8]}-"


def _load(coll, prefix, n, value=None):
    docs = {f"{prefix}{i:04d}": value or {"i": i} for i in range(n)}
    res = coll.upsert_multi(docs)
    assert res.all_ok, res.exceptions
    return docs, res


def _ids(result):
    return sorted(r.id for r in result)


def test_range_scan_ids_only_and_with_documents(coll, prefix):
    docs, _ = _load(coll, prefix, 300)
    scan = RangeScan(ScanTerm(f"{prefix}0100"), ScanTerm(f"{prefix}0199"))
    ids = _ids(coll.scan(scan, ScanOptions(ids_only=True)))
    assert ids == [f"{prefix}{i:04d}" for i in range(100, 200)]
    rows = {r.id: r.content_as[dict] for r in coll.scan(scan)}
    assert rows == {k: v for k, v in docs.items() if k in set(ids)}
    # Exclusive ends.
    scan = RangeScan(ScanTerm(f"{prefix}0100", exclusive=True),
                     ScanTerm(f"{prefix}0199", exclusive=True))
    assert len(_ids(coll.scan(scan, ScanOptions(ids_only=True)))) == 98


def test_prefix_scan_sees_no_deleted_documents(coll, prefix):
    docs, _ = _load(coll, prefix, 120)
    for i in range(0, 120, 3):
        coll.remove(f"{prefix}{i:04d}")
    want = sorted(k for i, k in enumerate(sorted(docs)) if i % 3)
    assert _ids(coll.scan(PrefixScan(prefix), ScanOptions(ids_only=True))) == want
    rows = list(coll.scan(PrefixScan(prefix)))
    assert sorted(r.id for r in rows) == want
    assert all(r.content_as[dict] == docs[r.id] for r in rows)


def test_sampling_scan_returns_the_sample_size_asked_for(cluster, prefix):
    # A bucket of its own, so the sample is of these documents only.
    coll = cluster.bucket("small").default_collection()
    _load(coll, prefix, 200)
    rows = list(coll.scan(SamplingScan(50, seed=42), ScanOptions(ids_only=True)))
    # The SDK asks every vBucket for 50 and keeps the first 50 it gets.
    assert len(rows) == 50
    assert len({r.id for r in rows}) == 50
    docs = list(coll.scan(SamplingScan(10, seed=7)))
    assert len(docs) == 10 and all(d.content_as[dict] for d in docs)


def _stat(server, bucket, name):
    """One STAT value of ``bucket``, over the raw protocol as the administrator."""
    with socket.create_connection(_addr(server), timeout=10) as s:
        _auth(s, bucket)
        _send(s, 0x10)
        while True:
            status, key, value, _ = _recv(s)
            assert status == 0
            if not key:
                break
            if key == name.encode():
                found = value.decode()
        return found


def test_a_scan_over_evicted_documents_reads_them_from_disk(cluster, server, prefix):
    coll = cluster.bucket("small").default_collection()
    # Random text: the SDK compresses values, and these must fill memory.
    value = {"pad": base64.b64encode(os.urandom(3000)).decode()}
    for start in range(0, EVICTED_DOCS, 500):
        docs = {f"{prefix}{i:05d}": value for i in range(start, start + 500)}
        res = coll.upsert_multi(docs)
        assert res.all_ok, res.exceptions
    # Full eviction took documents out of memory (the quota holds a fraction of them);
    # the item pager runs in the background (bounded poll).
    for _ in range(200):
        if int(_stat(server, "small", "ep_num_value_ejects")) > EVICTED_DOCS // 4:
            break
        time.sleep(0.05)
    assert int(_stat(server, "small", "ep_num_value_ejects")) > EVICTED_DOCS // 4, (
        _stat(server, "small", "mem_used"), _stat(server, "small", "curr_items"))
    fetched = int(_stat(server, "small", "ep_bg_fetched"))
    ids = _ids(coll.scan(PrefixScan(prefix), ScanOptions(ids_only=True)))
    assert ids == [f"{prefix}{i:05d}" for i in range(EVICTED_DOCS)]
    seen = 0
    for r in coll.scan(PrefixScan(prefix), ScanOptions(batch_item_limit=200)):
        assert r.content_as[dict] == value
        seen += 1
    assert seen == EVICTED_DOCS
    # Read for the scan, not made resident: no background fetch restored them.
    assert int(_stat(server, "small", "ep_bg_fetched")) == fetched


def test_a_scan_cancelled_half_way_closes_its_scans(coll, server, prefix):
    _load(coll, prefix, 400)
    result = coll.scan(PrefixScan(prefix), ScanOptions(ids_only=True, batch_item_limit=5))
    got = []
    for r in result:
        got.append(r.id)
        if len(got) == 20:
            result.cancel_scan()
            break
    assert len(got) == 20
    # The SDK cancels the scans it had open; none is left on the server (bounded poll).
    for _ in range(200):
        if _stat(server, "default", "ep_range_scans_open") == "0":
            break
        time.sleep(0.05)
    assert _stat(server, "default", "ep_range_scans_open") == "0"


def test_consistent_with_waits_for_the_mutation(coll, prefix):
    _load(coll, prefix, 10)
    res = coll.upsert(f"{prefix}late", {"late": True})
    state = MutationState(res)
    ids = _ids(coll.scan(PrefixScan(prefix), ScanOptions(ids_only=True, consistent_with=state)))
    assert f"{prefix}late" in ids and len(ids) == 11


def test_a_user_without_range_scan_is_refused(server, coll, prefix):
    _load(coll, prefix, 5)
    reader = sdk_connect(server.addr, *READER, kv_timeout=KV_TIMEOUT)
    try:
        rcoll = reader.bucket("default").default_collection()
        assert rcoll.get(f"{prefix}0001").content_as[dict] == {"i": 1}
        with pytest.raises(CouchbaseException):
            list(rcoll.scan(PrefixScan(prefix), ScanOptions(ids_only=True)))
    finally:
        reader.close()


# The raw protocol, for what the SDK does not show: statuses and the idle expiry.

def _addr(server):
    host, port = server.addr.rsplit(":", 1)
    return host, int(port)


def _send(sock, opcode, key=b"", extras=b"", value=b"", vbucket=0, datatype=0):
    header = struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), datatype,
                         vbucket, len(extras) + len(key) + len(value), 0, 0)
    sock.sendall(header + extras + key + value)


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


def _recv(sock):
    """One response: (status, key, value, extras)."""
    h = _recv_exact(sock, 24)
    _, _, keylen, extlen, _, status, bodylen, _, _ = struct.unpack(">BBHBBHIIQ", h)
    body = _recv_exact(sock, bodylen)
    return status, body[extlen:extlen + keylen], body[extlen + keylen:], body[:extlen]


def _auth(sock, bucket):
    # HELLO with XERROR (0x07), JSON (0x0b).
    _send(sock, 0x1f, key=b"rs-test", value=struct.pack(">HH", 0x07, 0x0b))
    assert _recv(sock)[0] == 0
    _send(sock, 0x21, key=b"PLAIN", value=b"\0" + ADMIN[0].encode() + b"\0" + ADMIN[1].encode())
    assert _recv(sock)[0] == 0
    _send(sock, 0x89, key=bucket.encode())
    assert _recv(sock)[0] == 0


def _leb128_keys(value):
    keys, i = [], 0
    while i < len(value):
        n, shift = 0, 0
        while True:
            b = value[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        keys.append(value[i:i + n])
        i += n
    return keys


def _vbucket_of(key):
    import zlib
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % 1024


def test_an_idle_scan_expires_and_then_is_unknown(server, coll, prefix):
    key = f"{prefix}only".encode()
    coll.upsert(key.decode(), {"a": 1})
    vb = _vbucket_of(key)
    with socket.create_connection(_addr(server), timeout=10) as s:
        _auth(s, "default")
        spec = {"key_only": True, "range": {
            "start": base64.b64encode(key).decode(), "end": base64.b64encode(key).decode()}}
        _send(s, 0xDA, value=json.dumps(spec).encode(), vbucket=vb, datatype=0x01)
        status, _, scan_id, _ = _recv(s)
        assert (status, len(scan_id)) == (0, 16)
        # Unused for twice the idle timeout: the reaper closed it.
        time.sleep(2 * IDLE_TIMEOUT_MS / 1000)
        _send(s, 0xDB, extras=scan_id + struct.pack(">III", 0, 0, 0), vbucket=vb)
        assert _recv(s)[0] == 0x01
        # A fresh scan completes in one continue: 0xa7 with the key.
        _send(s, 0xDA, value=json.dumps(spec).encode(), vbucket=vb, datatype=0x01)
        status, _, scan_id, _ = _recv(s)
        assert status == 0
        _send(s, 0xDB, extras=scan_id + struct.pack(">III", 0, 0, 0), vbucket=vb)
        status, _, value, extras = _recv(s)
        assert (status, extras, _leb128_keys(value)) == (0xA7, b"\0\0\0\0", [key])
        # Cancelled or completed: unknown.
        _send(s, 0xDC, extras=scan_id, vbucket=vb)
        assert _recv(s)[0] == 0x01
