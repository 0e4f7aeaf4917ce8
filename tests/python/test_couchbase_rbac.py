"""Couchbase RBAC on the KV port, through the Couchbase Python SDK against a real
epkv-server: users created over REST (``PUT /settings/rbac/users/local/NAME``) with
Couchbase's roles get exactly what the roles grant. A refused request answers 0x24
EACCESS, which the SDK raises (as ``AuthenticationException``, the SDK's class for the
no-access status); the connection and the bucket stay usable for what the user holds.
Statistics, which the SDK does not read, go through a small raw-protocol client.
"""

import os
import re
import socket
import struct
import time
import uuid

import pytest

from conftest import admin_server, alarm_after, mgmt_request, sdk_connect

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="needs a server of its own, with an administrator",
)

import couchbase.subdocument as SD  # noqa: E402
from couchbase.exceptions import (  # noqa: E402
    AuthenticationException,
    DocumentNotFoundException,
)

ADMIN = ("Administrator", "password")
PASSWORD = "secret-pw"
TEST_ALARM_SECS = 90
EACCESS = 0x24


@pytest.fixture(autouse=True)
def _bounded():
    with alarm_after(TEST_ALARM_SECS):
        yield


@pytest.fixture(scope="module")
def rbac_server(tmp_path_factory):
    yield from admin_server(tmp_path_factory, ADMIN)


@pytest.fixture(scope="module")
def admin(rbac_server):
    c = sdk_connect(rbac_server.addr, *ADMIN)
    yield c
    c.close()


def _user(server, roles):
    """Creates a user with ``roles`` over REST; returns its name."""
    name = "u" + uuid.uuid4().hex[:8]
    status, body, _ = mgmt_request(
        server, "PUT", f"/settings/rbac/users/local/{name}",
        f"password={PASSWORD}&roles={roles}", ADMIN)
    assert status == 200, body
    return name


def _refused(call):
    """Asserts that ``call`` is refused for lack of a privilege: the SDK raises
    ``AuthenticationException`` with the server's status, EACCESS, in its error context."""
    with pytest.raises(AuthenticationException) as e:
        call()
    status = re.search(r"'status_code': (\d+)", str(e.value))
    assert status is not None and int(status.group(1)) == EACCESS, str(e.value)


class Raw:
    """A minimal blocking memcached binary-protocol client (HELLO XERROR, SASL PLAIN,
    SELECT_BUCKET, STAT, GET), for what the SDK does not send."""

    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.opaque = 0

    def _send(self, opcode, key=b"", value=b"", extras=b"", vbucket=0):
        self.opaque += 1
        body = len(extras) + len(key) + len(value)
        header = struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), 0,
                             vbucket, body, self.opaque, 0)
        self.sock.sendall(header + extras + key + value)

    def _recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def recv(self):
        h = self._recv_exact(24)
        _, _, keylen, extlen, _, status, body, _, _ = struct.unpack(">BBHBBHIIQ", h)
        payload = self._recv_exact(body)
        return status, payload[extlen:extlen + keylen], payload[extlen + keylen:]

    def request(self, opcode, key=b"", value=b"", extras=b""):
        self._send(opcode, key, value, extras)
        return self.recv()

    def login(self, user, password, bucket):
        assert self.request(0x1f, b"rbac-raw", struct.pack(">H", 0x07))[0] == 0  # HELLO XERROR
        assert self.request(0x21, b"PLAIN", f"\0{user}\0{password}".encode())[0] == 0
        return self.request(0x89, bucket.encode())[0]  # SELECT_BUCKET

    def stat(self, group=b""):
        self._send(0x10, group)
        stats = {}
        while True:
            status, key, value = self.recv()
            if status != 0:
                return status, stats
            if not key:
                return 0, stats
            stats[key.decode()] = value.decode()


def test_data_reader_reads_and_cannot_write(rbac_server, admin):
    coll = admin.bucket("default").default_collection()
    coll.upsert("rbac-doc", {"n": 1, "name": "r"})
    coll.upsert("rbac-counter-doc", {"n": 1})
    user = _user(rbac_server, "data_reader%5Bdefault%5D")
    c = sdk_connect(rbac_server.addr, user, PASSWORD)
    try:
        reader = c.bucket("default").default_collection()
        assert reader.get("rbac-doc").content_as[dict] == {"n": 1, "name": "r"}
        assert reader.lookup_in("rbac-doc", [SD.get("name")]).content_as[str](0) == "r"
        assert reader.exists("rbac-doc").exists
        assert not reader.exists("rbac-missing").exists
        with pytest.raises(DocumentNotFoundException):
            reader.get("rbac-missing")
        _refused(lambda: reader.upsert("rbac-doc", {"n": 2}))
        _refused(lambda: reader.insert("rbac-new", {"n": 2}))
        _refused(lambda: reader.remove("rbac-doc"))
        _refused(lambda: reader.mutate_in("rbac-doc", [SD.upsert("n", 3)]))
        _refused(lambda: reader.binary().increment("rbac-counter"))
        # Still usable, and nothing changed.
        assert reader.get("rbac-doc").content_as[dict] == {"n": 1, "name": "r"}
    finally:
        c.close()


def test_data_writer_writes_and_cannot_read(rbac_server, admin):
    user = _user(rbac_server, "data_writer%5Bdefault%5D")
    c = sdk_connect(rbac_server.addr, user, PASSWORD)
    try:
        writer = c.bucket("default").default_collection()
        writer.upsert("rbac-written", {"by": "writer"})
        writer.insert("rbac-inserted-" + uuid.uuid4().hex[:6], {"by": "writer"})
        _refused(lambda: writer.get("rbac-written"))
        got = admin.bucket("default").default_collection().get("rbac-written")
        assert got.content_as[dict] == {"by": "writer"}
        writer.remove("rbac-written")
    finally:
        c.close()


def test_data_monitoring_reads_stats_only(rbac_server, admin):
    admin.bucket("default").default_collection().upsert("rbac-mon", {"n": 1})
    user = _user(rbac_server, "data_monitoring%5Bdefault%5D")
    raw = Raw(rbac_server.addr)
    assert raw.login(user, PASSWORD, "default") == 0
    status, stats = raw.stat()
    assert status == 0 and "curr_items" in stats, stats
    assert raw.request(0x00, b"rbac-mon")[0] == EACCESS  # GET
    status, _ = raw.stat(b"timings")
    assert status == EACCESS, "the node-wide group needs Stats"
    assert raw.request(0x0a)[0] == 0, "the connection stays"  # NOOP
    # A reader may not read statistics.
    reader = _user(rbac_server, "data_reader%5Bdefault%5D")
    raw = Raw(rbac_server.addr)
    assert raw.login(reader, PASSWORD, "default") == 0
    assert raw.stat()[0] == EACCESS


def test_a_user_without_a_role_on_the_bucket_finds_no_bucket(rbac_server):
    user = _user(rbac_server, "data_reader%5Bother%5D")
    raw = Raw(rbac_server.addr)
    assert raw.login(user, PASSWORD, "default") == 0x01, "the bucket looks absent"
    raw = Raw(rbac_server.addr)
    assert raw.login(user, PASSWORD, "no-such-bucket") == 0x01


def test_a_collection_qualified_reader_reads_its_collection_only(rbac_server, admin):
    bucket = admin.bucket("default")
    scope = "s" + uuid.uuid4().hex[:6]
    mgr = bucket.collections()
    mgr.create_scope(scope)
    mgr.create_collection(scope, "c1")
    mgr.create_collection(scope, "c2")
    time.sleep(0.2)
    for name in ("c1", "c2"):
        bucket.scope(scope).collection(name).upsert("k", {"in": name})
    bucket.default_collection().upsert("rbac-k", {"in": "default"})
    user = _user(rbac_server, f"data_reader%5Bdefault:{scope}:c1%5D")
    c = sdk_connect(rbac_server.addr, user, PASSWORD)
    try:
        b = c.bucket("default")
        c1 = b.scope(scope).collection("c1")
        assert c1.get("k").content_as[dict] == {"in": "c1"}
        _refused(lambda: b.scope(scope).collection("c2").get("k"))
        _refused(lambda: b.default_collection().get("rbac-k"))
        _refused(lambda: c1.upsert("k", {"in": "changed"}))
        assert c1.get("k").content_as[dict] == {"in": "c1"}
    finally:
        c.close()


def test_a_revoked_role_refuses_the_next_write_on_an_open_connection(rbac_server):
    name = "u" + uuid.uuid4().hex[:8]

    def put(roles):
        status, body, _ = mgmt_request(
            rbac_server, "PUT", f"/settings/rbac/users/local/{name}",
            f"password={PASSWORD}&roles={roles}", ADMIN)
        assert status == 200, body

    put("data_reader%5Bdefault%5D,data_writer%5Bdefault%5D")
    c = sdk_connect(rbac_server.addr, name, PASSWORD)
    try:
        coll = c.bucket("default").default_collection()
        coll.upsert("rbac-revoked", {"v": 1})
        put("data_reader%5Bdefault%5D")
        _refused(lambda: coll.upsert("rbac-revoked", {"v": 2}))
        assert coll.get("rbac-revoked").content_as[dict] == {"v": 1}
    finally:
        c.close()
