"""The Couchbase Python SDK (``couchbase==4.6.3``, couchbase-cxx-client 1.3.2) against a real
epkv-server, unmodified: KV-only bootstrap (``couchbase://127.0.0.1:PORT``), SASL, buckets,
CRUD, binary operations, bulk operations, locks, expiry and reconnection.

The server runs with users (``Administrator`` with access to every bucket from
``--admin-user``, ``app`` with access to ``travel`` only from a users file written by
``epkv-server user add``) and the buckets ``default``, ``travel`` and ``beer``. Every SDK
call is bounded by the SDK's own timeouts (set short below) and each test by an alarm, so a
broken server fails the test instead of hanging it.
"""

import os
import re
import socket
import struct
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import (
    _server_bin,
    _start_server_with,
    _stop_server,
    alarm_after,
    own_server,
    sdk_connect,
)

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="needs a server of its own, configured with users and buckets",
)

from couchbase.durability import (  # noqa: E402
    ClientDurability,
    DurabilityLevel,
    PersistToExtended,
    ServerDurability,
)
from couchbase.exceptions import (  # noqa: E402
    AuthenticationException,
    CasMismatchException,
    CouchbaseException,
    DocumentExistsException,
    DurabilitySyncWriteAmbiguousException,
    DocumentNotFoundException,
    DocumentNotJsonException,
    PathExistsException,
    PathInvalidException,
    PathMismatchException,
    PathNotFoundException,
    PathTooBigException,
    ValueTooDeepException,
)
from couchbase.options import (  # noqa: E402
    DecrementOptions,
    DeltaValue,
    GetOptions,
    IncrementOptions,
    InsertOptions,
    MutateInOptions,
    RemoveOptions,
    ReplaceOptions,
    SignedInt64,
    UpsertOptions,
)
from couchbase.transcoder import RawBinaryTranscoder  # noqa: E402

ADMIN = ("Administrator", "password")
APP = ("app", "app-password")
# Each test (setup included) must finish within this many seconds.
TEST_ALARM_SECS = 60
KV_TIMEOUT = timedelta(seconds=5)
CONNECT_TIMEOUT = timedelta(seconds=10)
# How long a write may take to be reported persisted by OBSERVE_SEQNO, and the pause
# between two polls.
PERSIST_WAIT_SECS = 20
PERSIST_POLL_SECS = 0.005


def _connect(addr, user, password, mechanisms=None):
    return sdk_connect(addr, user, password, kv_timeout=KV_TIMEOUT,
                       connect_timeout=CONNECT_TIMEOUT, resolve_timeout=CONNECT_TIMEOUT,
                       management_timeout=None, mechanisms=mechanisms, ready=None)


@pytest.fixture(autouse=True)
def _bounded():
    """Fails a test that runs longer than TEST_ALARM_SECS instead of letting it hang."""
    with alarm_after(TEST_ALARM_SECS):
        yield


def _server_args(users_file):
    return [
        "--testing",
        # The tests read the "authenticated ... mechanism=" lines (info) from the log.
        "--log-level",
        "info",
        "--buckets",
        "travel,beer=64MiB",
        "--users-file",
        str(users_file),
        "--admin-user",
        ADMIN[0],
        "--admin-password",
        ADMIN[1],
    ]


@pytest.fixture(scope="module")
def users_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("epkv-users") / "users.toml"
    subprocess.run(
        [str(_server_bin()), "user", "add", "--users-file", str(path), "--name", APP[0],
         "--password", APP[1], "--buckets", "travel"],
        check=True, capture_output=True, timeout=60,
    )
    assert APP[1] not in path.read_text(), "the users file never holds a password"
    return path


@pytest.fixture(scope="module")
def sdk_server(tmp_path_factory, users_file):
    """A server with users and three buckets, for this module."""
    yield from own_server(tmp_path_factory, _server_args(users_file))


@pytest.fixture(scope="module")
def cluster(sdk_server):
    c = _connect(sdk_server.addr, *ADMIN)
    yield c
    c.close()


@pytest.fixture(scope="module")
def coll(cluster):
    return cluster.bucket("default").default_collection()


@pytest.fixture
def doc_id(request):
    return f"sdk-{request.node.name}-{uuid.uuid4().hex[:8]}"


def _recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "server closed the connection"
        data += chunk
    return data


def _raw_request(sock, opcode, key=b"", extras=b"", value=b"", vbucket=0):
    """Sends one binary-protocol request; returns (status, value) of its reply.

    For what the SDK cannot send (ADJUST_TIMEOFDAY) or does not expose (OBSERVE_SEQNO)."""
    body = len(extras) + len(key) + len(value)
    header = struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), 0, vbucket, body,
                         0xE9, 0)
    sock.sendall(header + extras + key + value)
    reply = _recv_exact(sock, 24)
    status, body_len = struct.unpack(">H", reply[6:8])[0], struct.unpack(">I", reply[8:12])[0]
    extras_len, key_len = reply[4], struct.unpack(">H", reply[2:4])[0]
    payload = _recv_exact(sock, body_len)
    return status, payload[extras_len + key_len:]


def _adjust_timeofday(addr, offset_secs):
    """Sets the server clock's offset (ADJUST_TIMEOFDAY 0xfc, --testing servers only), as
    the admin: it needs the NodeManagement privilege."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        plain = b"\0" + ADMIN[0].encode() + b"\0" + ADMIN[1].encode()
        assert _raw_request(s, 0x21, key=b"PLAIN", value=plain)[0] == 0
        status, _ = _raw_request(s, 0xFC, extras=struct.pack(">q", offset_secs))
    assert status == 0, f"ADJUST_TIMEOFDAY answered {status:#x}"


def _observe_seqno(addr, bucket, vbucket, vbucket_uuid):
    """OBSERVE_SEQNO as the admin: returns (uuid, persisted seqno, current seqno)."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        plain = b"\0" + ADMIN[0].encode() + b"\0" + ADMIN[1].encode()
        assert _raw_request(s, 0x21, key=b"PLAIN", value=plain)[0] == 0
        assert _raw_request(s, 0x89, key=bucket.encode())[0] == 0
        status, value = _raw_request(s, 0x91, value=struct.pack(">Q", vbucket_uuid),
                                     vbucket=vbucket)
    assert status == 0, f"OBSERVE_SEQNO answered {status:#x}"
    assert value[0] == 0 and len(value) == 27, "format 0: the UUID is current"
    return struct.unpack(">QQQ", value[3:27])


def _authenticated_with(server, user):
    """The mechanisms the server logged successful authentications of ``user`` with."""
    text = Path(server.log_path).read_text(errors="replace")
    return {
        m.group(1)
        for m in re.finditer(r"authenticated user=<ud>" + re.escape(user) + r"</ud> mechanism=(\S+)",
                             text)
    }


def test_scram_sha512_connect_and_crud(sdk_server, coll, doc_id):
    assert _authenticated_with(sdk_server, ADMIN[0]) == {"SCRAM-SHA512"}
    res = coll.upsert(doc_id, {"a": 1})
    assert res.cas != 0
    assert coll.get(doc_id).content_as[dict] == {"a": 1}
    with pytest.raises(DocumentExistsException):
        coll.insert(doc_id, {"a": 2})
    coll.insert(doc_id + "-new", {"n": True})
    assert coll.get(doc_id + "-new").content_as[dict] == {"n": True}
    coll.replace(doc_id, {"a": 3})
    assert coll.get(doc_id).content_as[dict] == {"a": 3}
    with pytest.raises(DocumentNotFoundException):
        coll.replace(doc_id + "-missing", {"x": 1})
    coll.remove(doc_id)
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)
    with pytest.raises(DocumentNotFoundException):
        coll.remove(doc_id)


def test_plain_connect(sdk_server, doc_id):
    c = _connect(sdk_server.addr, *APP, mechanisms=["PLAIN"])
    try:
        travel = c.bucket("travel").default_collection()
        travel.upsert(doc_id, "via PLAIN")
        assert travel.get(doc_id).content_as[str] == "via PLAIN"
        assert _authenticated_with(sdk_server, APP[0]) == {"PLAIN"}
    finally:
        c.close()


def test_zero_configuration_accepts_any_credentials_on_loopback(tmp_path_factory, doc_id):
    """No users configured and a loopback listener: the SDK's SCRAM-SHA512 (its default)
    and PLAIN logins succeed with any name and password, and every bucket may be used."""
    server, log = _start_server_with(tmp_path_factory, ["--buckets", "default,second"])
    try:
        for user, password, mechanisms in [("anyone", "anything", None),
                                           ("someone-else", "", ["PLAIN"])]:
            c = sdk_connect(server.addr, user, password, mechanisms=mechanisms)
            try:
                for bucket in ("default", "second"):
                    coll = c.bucket(bucket).default_collection()
                    coll.upsert(doc_id, {"by": user, "bucket": bucket})
                    assert coll.get(doc_id).content_as[dict] == {"by": user, "bucket": bucket}
            finally:
                c.close()
        text = Path(server.log_path).read_text(errors="replace")
        assert "authenticated: open mode" in text
        assert re.search(r"open mode .*user=<ud>anyone</ud> mechanism=SCRAM-SHA512", text)
        assert re.search(r"open mode .*user=<ud>someone-else</ud> mechanism=PLAIN", text)
    finally:
        _stop_server(server, log)


def test_lookup_in_replicas_on_a_single_node_reads_the_active(coll, doc_id):
    """With no replicas the SDK's replica lookups read the active alone."""
    import couchbase.subdocument as SD

    coll.upsert(doc_id, {"a": {"b": [1, 2, 3]}})
    results = list(coll.lookup_in_all_replicas(doc_id, [SD.get("a.b[2]")]))
    assert [(r.is_replica, r.content_as[int](0)) for r in results] == [(False, 3)]
    assert coll.lookup_in_any_replica(doc_id, [SD.count("a.b")]).content_as[int](0) == 3


def test_buckets_are_separate(cluster, coll, doc_id):
    travel = cluster.bucket("travel").default_collection()
    travel.upsert(doc_id, "travel doc")
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)
    assert travel.get(doc_id).content_as[str] == "travel doc"


def test_cas_mismatch(coll, doc_id):
    res = coll.upsert(doc_id, {"v": 1})
    with pytest.raises(CasMismatchException):
        coll.replace(doc_id, {"v": 2}, ReplaceOptions(cas=res.cas + 1))
    with pytest.raises(CasMismatchException):
        coll.remove(doc_id, RemoveOptions(cas=res.cas + 1))
    coll.replace(doc_id, {"v": 3}, ReplaceOptions(cas=res.cas))
    assert coll.get(doc_id).content_as[dict] == {"v": 3}


def test_exists_on_present_absent_and_deleted_keys(coll, doc_id):
    """`exists` sends GET_META: a live document exists, a key never written and a deleted
    document (whose tombstone the server still keeps) do not."""
    res = coll.upsert(doc_id, {"e": 1})
    got = coll.exists(doc_id)
    assert got.exists and got.cas == res.cas
    assert not coll.exists(doc_id + "-never").exists
    coll.remove(doc_id)
    assert not coll.exists(doc_id).exists
    coll.upsert(doc_id, {"e": 2})
    assert coll.exists(doc_id).exists


def test_lookup_in_reads_paths_and_reports_each_path(coll, doc_id):
    import couchbase.subdocument as SD
    coll.upsert(doc_id, {"name": "toy", "tags": ["a", "b"], "stats": {"n": 1}, "`q`.x": 2})
    res = coll.lookup_in(
        doc_id,
        [SD.get("name"), SD.exists("stats.n"), SD.count("tags"), SD.exists("missing"),
         SD.get("tags[-1]")],
    )
    assert res.content_as[str](0) == "toy"
    assert res.exists(1)
    assert res.content_as[int](2) == 2
    assert not res.exists(3)
    assert res.content_as[str](4) == "b"
    with pytest.raises(PathNotFoundException):
        coll.lookup_in(doc_id, [SD.get("stats.missing")]).content_as[str](0)
    with pytest.raises(PathMismatchException):
        coll.lookup_in(doc_id, [SD.get("name.first")]).content_as[str](0)
    with pytest.raises(DocumentNotFoundException):
        coll.lookup_in(doc_id + "-missing", [SD.get("name")])


def test_mutate_in_changes_paths_atomically(coll, doc_id):
    import couchbase.subdocument as SD
    from couchbase.options import MutateInOptions
    from couchbase.subdocument import StoreSemantics
    coll.upsert(doc_id, {"name": "toy", "tags": ["a"], "stats": {"n": 1}})
    res = coll.mutate_in(
        doc_id,
        [SD.upsert("name", "car"), SD.array_append("tags", "b"), SD.array_prepend("tags", "z"),
         SD.increment("stats.n", 5), SD.insert("new.deep", True, create_parents=True),
         SD.array_addunique("tags", "u")],
    )
    assert res.content_as[int](3) == 6
    assert coll.get(doc_id).content_as[dict] == {
        "name": "car", "tags": ["z", "a", "b", "u"], "stats": {"n": 6}, "new": {"deep": True}}
    # A failing path changes nothing.
    with pytest.raises(PathExistsException):
        coll.mutate_in(doc_id, [SD.upsert("name", "bus"), SD.insert("new", 1)])
    assert coll.get(doc_id).content_as[dict]["name"] == "car"
    coll.mutate_in(doc_id, [SD.remove("new"), SD.replace("tags[0]", "y")])
    assert coll.get(doc_id).content_as[dict]["tags"][0] == "y"
    # A dot before an index, as KV-Engine takes it (SDK code in the wild writes it).
    coll.mutate_in(doc_id, [SD.array_insert("tags.[2]", "w")])
    assert coll.get(doc_id).content_as[dict]["tags"] == ["y", "a", "w", "b", "u"]
    # Creating the document (upsert and insert semantics).
    coll.mutate_in(doc_id + "-new", [SD.upsert("a.b", 1)],
                   MutateInOptions(store_semantics=StoreSemantics.UPSERT))
    assert coll.get(doc_id + "-new").content_as[dict] == {"a": {"b": 1}}
    with pytest.raises(DocumentExistsException):
        coll.mutate_in(doc_id + "-new", [SD.upsert("c", 1)],
                       MutateInOptions(store_semantics=StoreSemantics.INSERT))
    # CAS.
    cas = coll.get(doc_id).cas
    with pytest.raises(CasMismatchException):
        coll.mutate_in(doc_id, [SD.upsert("name", "x")], MutateInOptions(cas=cas + 1))
    coll.mutate_in(doc_id, [SD.upsert("name", "x")], MutateInOptions(cas=cas))


def test_get_with_expiry_reads_the_document_virtual_attribute(coll, doc_id):
    """`get(with_expiry=True)` and `$document` lookups read the virtual extended
    attribute that carries the document's metadata."""
    import couchbase.subdocument as SD
    coll.upsert(doc_id, {"e": 1}, UpsertOptions(expiry=timedelta(seconds=3600)))
    got = coll.get(doc_id, GetOptions(with_expiry=True))
    assert got.content_as[dict] == {"e": 1}
    assert got.expiry_time is not None
    res = coll.lookup_in(doc_id, [SD.get("$document.exptime", xattr=True),
                                  SD.get("$document.CAS", xattr=True), SD.get("e")])
    assert res.content_as[int](0) > 0
    assert res.content_as[str](1).startswith("0x")
    assert res.content_as[int](2) == 1
    with pytest.raises(PathNotFoundException):
        coll.lookup_in(doc_id, [SD.get("user_attr", xattr=True)]).content_as[str](0)


def _le_hex(n):
    """A CAS or seqno as the server's macros write it: its 8 network-order bytes, read as a
    little-endian number, in hex."""
    return "0x" + struct.pack(">Q", n)[::-1].hex()


def test_extended_attributes_with_macros_survive_body_writes_and_system_ones_deletion(
        coll, doc_id):
    """User and system extended attributes through `mutate_in(xattr=True)`, the mutation
    macros, `$XTOC`, GET returning the body only, and `access_deleted` reads of a deleted
    document's system attributes."""
    import couchbase.subdocument as SD
    from couchbase.options import LookupInOptions
    coll.upsert(doc_id, {"v": 1})
    res = coll.mutate_in(doc_id, [
        SD.upsert("meta.by", "ann", xattr=True, create_parents=True),
        SD.upsert("_sys.cas", SD.MutationMacro.cas(), xattr=True, create_parents=True),
        SD.upsert("_sys.seq", SD.MutationMacro.seq_no(), xattr=True),
        SD.upsert("_sys.crc", SD.MutationMacro.value_crc32c(), xattr=True),
        SD.array_append("meta.tags", "t1", xattr=True, create_parents=True),
        SD.upsert("w", 2),
    ])
    got = coll.lookup_in(doc_id, [
        SD.get("meta", xattr=True), SD.get("_sys", xattr=True),
        SD.get("$document.value_crc32c", xattr=True), SD.get("$document.seqno", xattr=True),
        SD.get("$XTOC", xattr=True), SD.exists("meta.nope", xattr=True), SD.get("w"),
    ])
    assert got.content_as[dict](0) == {"by": "ann", "tags": ["t1"]}
    sys_attrs = got.content_as[dict](1)
    assert sys_attrs["cas"] == _le_hex(res.cas)
    assert sys_attrs["crc"] == got.content_as[str](2)
    seqno = int(got.content_as[str](3), 16)
    assert sys_attrs["seq"] == _le_hex(seqno)
    assert sorted(got.content_as[list](4)) == ["_sys", "meta"]
    assert not got.exists(5)
    assert got.content_as[int](6) == 2
    # GET returns the body only; a body write keeps the attributes.
    assert coll.get(doc_id).content_as[dict] == {"v": 1, "w": 2}
    coll.upsert(doc_id, {"v": 3})
    again = coll.lookup_in(doc_id, [SD.get("meta.by", xattr=True)])
    assert again.content_as[str](0) == "ann"
    # Removing attributes, and a virtual one cannot be written.
    coll.mutate_in(doc_id, [SD.remove("meta.tags", xattr=True)])
    assert coll.lookup_in(doc_id, [SD.get("meta", xattr=True)]).content_as[dict](0) == {
        "by": "ann"}
    with pytest.raises(CouchbaseException):
        coll.mutate_in(doc_id, [SD.upsert("$document.x", 1, xattr=True)])
    # Deletion: the document is gone, its system attribute stays in the tombstone.
    coll.remove(doc_id)
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)
    with pytest.raises(DocumentNotFoundException):
        coll.lookup_in(doc_id, [SD.get("_sys.cas", xattr=True)])
    dead = coll.lookup_in(doc_id, [SD.get("_sys.cas", xattr=True),
                                   SD.get("$document.deleted", xattr=True)],
                          LookupInOptions(access_deleted=True))
    assert dead.content_as[str](0) == _le_hex(res.cas)
    assert dead.content_as[bool](1) is True
    gone = coll.lookup_in(doc_id, [SD.get("meta", xattr=True)],
                          LookupInOptions(access_deleted=True))
    assert not gone.exists(0)
    # A tombstone's attributes can change with access_deleted; it stays deleted.
    coll.mutate_in(doc_id, [SD.upsert("_sys.note", "kept", xattr=True)],
                   MutateInOptions(access_deleted=True))
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)
    note = coll.lookup_in(doc_id, [SD.get("_sys.note", xattr=True)],
                          LookupInOptions(access_deleted=True))
    assert note.content_as[str](0) == "kept"


def test_mutate_in_creates_a_document_deleted(coll, doc_id):
    """`create_as_deleted` (transactions' staged inserts): the document exists only as a
    tombstone with its attributes."""
    import couchbase.subdocument as SD
    from couchbase.options import LookupInOptions
    from couchbase.subdocument import StoreSemantics
    coll.mutate_in(doc_id, [SD.upsert("txn", {"id": 7}, xattr=True)],
                   MutateInOptions(store_semantics=StoreSemantics.INSERT, access_deleted=True,
                                   create_as_deleted=True))
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)
    assert not coll.exists(doc_id).exists
    staged = coll.lookup_in(doc_id, [SD.get("txn.id", xattr=True)],
                            LookupInOptions(access_deleted=True))
    assert staged.content_as[int](0) == 7


def test_sub_document_errors_are_typed(coll, doc_id):
    import couchbase.subdocument as SD
    coll.upsert(doc_id, {"a": {"b": 1}})
    with pytest.raises(PathInvalidException):
        coll.lookup_in(doc_id, [SD.get("a..b")]).content_as[int](0)
    with pytest.raises(PathMismatchException):
        coll.mutate_in(doc_id, [SD.upsert("a.b.c", 1)])
    deep = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ValueTooDeepException):
        coll.mutate_in(doc_id, [SD.upsert("d", deep)])
    with pytest.raises(PathTooBigException):
        coll.lookup_in(doc_id, [SD.get(".".join(["p"] * 40))]).content_as[int](0)
    coll.upsert(doc_id + "-raw", b"not json", UpsertOptions(transcoder=RawBinaryTranscoder()))
    with pytest.raises(DocumentNotJsonException):
        coll.mutate_in(doc_id + "-raw", [SD.upsert("a", 1)])


def test_a_counter_driven_through_mutate_in_from_several_threads_ends_exact(coll, doc_id):
    import couchbase.subdocument as SD
    from concurrent.futures import ThreadPoolExecutor
    coll.upsert(doc_id, {"n": 0})

    def bump(_):
        for _ in range(50):
            coll.mutate_in(doc_id, [SD.increment("n", 1)])

    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(bump, range(4)))
    assert coll.get(doc_id).content_as[dict] == {"n": 200}


def test_touch_and_get_and_touch(coll, doc_id):
    coll.upsert(doc_id, {"t": 1})
    res = coll.touch(doc_id, timedelta(seconds=100))
    assert res.cas != 0
    got = coll.get_and_touch(doc_id, timedelta(seconds=200))
    assert got.content_as[dict] == {"t": 1}
    with pytest.raises(DocumentNotFoundException):
        coll.touch(doc_id + "-missing", timedelta(seconds=10))


def test_get_and_lock_then_unlock(coll, doc_id):
    coll.upsert(doc_id, {"l": 1})
    locked = coll.get_and_lock(doc_id, timedelta(seconds=10))
    assert locked.content_as[dict] == {"l": 1}
    plain = coll.get(doc_id)
    assert plain.cas != locked.cas, "readers do not see the lock's CAS"
    coll.unlock(doc_id, locked.cas)
    coll.upsert(doc_id, {"l": 2})
    assert coll.get(doc_id).content_as[dict] == {"l": 2}


def test_binary_append_prepend_increment_decrement(coll, doc_id):
    raw = RawBinaryTranscoder()
    coll.upsert(doc_id, b"mid", UpsertOptions(transcoder=raw))
    coll.binary().append(doc_id, b"-end")
    coll.binary().prepend(doc_id, b"start-")
    assert coll.get(doc_id, GetOptions(transcoder=raw)).value == b"start-mid-end"

    counter = doc_id + "-counter"
    first = coll.binary().increment(
        counter, IncrementOptions(initial=SignedInt64(10), delta=DeltaValue(5)))
    assert first.content == 10
    assert coll.binary().increment(counter, IncrementOptions(delta=DeltaValue(5))).content == 15
    assert coll.binary().decrement(counter, DecrementOptions(delta=DeltaValue(3))).content == 12
    coll.upsert(doc_id + "-text", "not a number")
    with pytest.raises(CouchbaseException):
        coll.binary().increment(doc_id + "-text", IncrementOptions(delta=DeltaValue(1)))


def test_upsert_multi_and_get_multi_1000_keys(coll, doc_id):
    docs = {f"{doc_id}-{i}": {"i": i} for i in range(1000)}
    res = coll.upsert_multi(docs)
    assert res.all_ok, res.exceptions
    got = coll.get_multi(list(docs))
    assert got.all_ok, got.exceptions
    assert {k: r.content_as[dict] for k, r in got.results.items()} == docs


def test_expiry_via_the_server_clock(sdk_server, coll, doc_id):
    coll.upsert(doc_id, {"e": 1}, UpsertOptions(expiry=timedelta(seconds=30)))
    coll.upsert(doc_id + "-kept", {"e": 2})
    assert coll.get(doc_id).content_as[dict] == {"e": 1}
    _adjust_timeofday(sdk_server.addr, 60)
    try:
        with pytest.raises(DocumentNotFoundException):
            coll.get(doc_id)
        assert coll.get(doc_id + "-kept").content_as[dict] == {"e": 2}
    finally:
        _adjust_timeofday(sdk_server.addr, 0)


def test_wrong_password_is_an_authentication_failure(sdk_server):
    with pytest.raises(AuthenticationException):
        c = _connect(sdk_server.addr, ADMIN[0], "not-the-password")
        c.bucket("default").default_collection().get("x", GetOptions(timeout=KV_TIMEOUT))


def test_a_forbidden_bucket_fails_instead_of_hanging(sdk_server):
    c = _connect(sdk_server.addr, *APP)
    try:
        with pytest.raises(CouchbaseException):
            b = c.bucket("beer")
            b.default_collection().get("x", GetOptions(timeout=timedelta(seconds=3)))
    finally:
        c.close()


def _wait_persisted(addr, bucket, token):
    """Polls OBSERVE_SEQNO (bounded by PERSIST_WAIT_SECS) until the vBucket of ``token``
    reports its seqno persisted; returns (uuid, persisted, current) of the last answer."""
    deadline = time.monotonic() + PERSIST_WAIT_SECS
    polls = 0
    while True:
        uuid_now, persisted, current = _observe_seqno(
            addr, bucket, token.partition_id, token.partition_uuid)
        polls += 1
        assert uuid_now == token.partition_uuid
        assert current >= token.sequence_number
        if persisted >= token.sequence_number:
            return uuid_now, persisted, current
        assert time.monotonic() < deadline, (
            f"seqno {token.sequence_number} not persisted within {PERSIST_WAIT_SECS}s "
            f"({polls} polls; last persisted seqno {persisted})")
        time.sleep(PERSIST_POLL_SECS)


def test_persist_to_active_waits_for_observe_seqno(sdk_server, coll, doc_id):
    res = coll.upsert(doc_id, {"p": 1}, UpsertOptions(
        durability=ClientDurability(persist_to=PersistToExtended.ACTIVE),
        timeout=timedelta(seconds=2)))
    assert coll.get(doc_id).content_as[dict] == {"p": 1}
    # couchbase-cxx-client 1.3.2 counts persist_to=ACTIVE as met without looking at the
    # persisted seqno (observe_poll.cxx: persisted_ >= 0 replicas), so whether the write
    # really reaches the disk is asked of the server directly, with the SDK's mutation
    # token: the flusher persists it shortly after the acknowledgement.
    _wait_persisted(sdk_server.addr, "default", res.mutation_token())


@pytest.mark.parametrize("level", [DurabilityLevel.MAJORITY_AND_PERSIST_TO_ACTIVE,
                                   DurabilityLevel.PERSIST_TO_MAJORITY])
def test_server_durability_persist_levels_ack_only_once_persisted(sdk_server, coll, doc_id,
                                                                  level):
    res = coll.upsert(doc_id, {"d": level.value}, UpsertOptions(
        durability=ServerDurability(level), timeout=timedelta(seconds=10)))
    # The server acknowledged the SyncWrite only once persisted: OBSERVE_SEQNO right after
    # already reports it, without waiting.
    token = res.mutation_token()
    _, persisted, _ = _observe_seqno(
        sdk_server.addr, "default", token.partition_id, token.partition_uuid)
    assert persisted >= token.sequence_number
    assert coll.get(doc_id).content_as[dict] == {"d": level.value}
    coll.remove(doc_id, RemoveOptions(durability=ServerDurability(level)))
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)


def test_durable_sub_document_mutations_commit_with_their_macros(coll, doc_id):
    """A `mutate_in` SyncWrite: its `${Mutation.CAS}` macro is written into the prepare,
    and the commit keeps the prepare's CAS, so the attribute names the document's CAS."""
    import couchbase.subdocument as SD
    coll.upsert(doc_id, {"v": 1})
    for level in (DurabilityLevel.MAJORITY, DurabilityLevel.PERSIST_TO_MAJORITY):
        res = coll.mutate_in(doc_id, [
            SD.upsert("_sys.cas", SD.MutationMacro.cas(), xattr=True, create_parents=True),
            SD.upsert("v", level.value),
        ], MutateInOptions(durability=ServerDurability(level),
                           timeout=timedelta(seconds=10)))
        got = coll.lookup_in(doc_id, [SD.get("_sys.cas", xattr=True), SD.get("v")])
        assert got.content_as[str](0) == _le_hex(res.cas)
        assert got.content_as[int](1) == level.value
        assert got.cas == res.cas
    coll.remove(doc_id, RemoveOptions(durability=ServerDurability(DurabilityLevel.MAJORITY)))
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)


def test_a_sync_write_past_its_timeout_is_ambiguous_and_never_visible(tmp_path_factory,
                                                                       users_file, doc_id):
    # No flusher: a PersistToMajority write can never meet its level, so the server's
    # durability timeout aborts its prepare.
    args = _server_args(users_file) + ["--testing-manual-flush"]
    server, log = _start_server_with(tmp_path_factory, args)
    c = _connect(server.addr, *ADMIN)
    try:
        col = c.bucket("default").default_collection()
        col.upsert(doc_id, "before")
        durable = UpsertOptions(
            durability=ServerDurability(DurabilityLevel.PERSIST_TO_MAJORITY),
            timeout=timedelta(seconds=2))
        with pytest.raises(DurabilitySyncWriteAmbiguousException):
            col.upsert(doc_id, "after", durable)
        # The prepare was never visible and is gone: readers see the committed value,
        # and the key takes writes again.
        assert col.get(doc_id).content_as[str] == "before"
        col.upsert(doc_id, "plain")
        assert col.get(doc_id).content_as[str] == "plain"
        # Majority needs no disk on a single node: it commits at once.
        col.upsert(doc_id, "majority", UpsertOptions(
            durability=ServerDurability(DurabilityLevel.MAJORITY)))
        assert col.get(doc_id).content_as[str] == "majority"
    finally:
        c.close()
        _stop_server(server, log)


def test_the_sdk_reconnects_after_a_server_restart(tmp_path_factory, users_file, doc_id):
    args = _server_args(users_file)
    server, log = _start_server_with(tmp_path_factory, args)
    port = server.addr.rsplit(":", 1)[1]
    c = _connect(server.addr, *ADMIN)
    try:
        col = c.bucket("default").default_collection()
        col.upsert(doc_id, "before")
        _stop_server(server, log, keep_data=True)
        server, log = _start_server_with(tmp_path_factory, args, port=port,
                                         data_dir=server.data_dir)
        # The restarted server warmed up from the same data directory: the SDK reconnects
        # and reads what it wrote before the restart, then carries on writing.
        got = col.get(doc_id, GetOptions(timeout=timedelta(seconds=20)))
        assert got.content_as[str] == "before"
        col.upsert(doc_id, "after", UpsertOptions(timeout=timedelta(seconds=20)))
        assert col.get(doc_id).content_as[str] == "after"
    finally:
        c.close()
        _stop_server(server, log)


@pytest.mark.parametrize("eviction", ["value", "full"])
def test_writes_past_the_quota_are_all_read_back(tmp_path_factory, eviction):
    """A bucket of 4 MiB takes 16 MiB of 512-byte values through the SDK (which retries
    the TMPFAIL a write may get while the item pager makes room) and serves every value
    back, most of them read from disk by background fetches; with value eviction and with
    full eviction (whole documents out of memory, and `exists`/`insert` of keys out of
    memory looked up on disk)."""
    server, log = _start_server_with(
        tmp_path_factory,
        [
            "--admin-user", ADMIN[0], "--admin-password", ADMIN[1],
            "--memory-quota", "4MiB", "--eviction-policy", eviction,
        ],
    )
    try:
        c = _connect(server.addr, *ADMIN)
        try:
            coll = c.bucket("default").default_collection()
            raw = RawBinaryTranscoder()
            n = 4 * (4 << 20) // 512
            docs = {f"evict-{i:06d}": os.urandom(512) for i in range(n)}
            keys = list(docs)
            for start in range(0, n, 2000):
                chunk = {k: docs[k] for k in keys[start:start + 2000]}
                res = coll.upsert_multi(chunk, transcoder=raw)
                assert res.all_ok, list(res.exceptions.items())[:3]
            for start in range(0, n, 2000):
                got = coll.get_multi(keys[start:start + 2000], transcoder=raw)
                assert got.all_ok, list(got.exceptions.items())[:3]
                for k, r in got.results.items():
                    assert r.value == docs[k], k
            # Inserting an existing key out of memory fails; a new one succeeds.
            with pytest.raises(DocumentExistsException):
                coll.insert(keys[0], b"x", InsertOptions(transcoder=raw))
            coll.insert(f"evict-new-{eviction}", b"x", InsertOptions(transcoder=raw))
            coll.remove(keys[1])
            with pytest.raises(DocumentNotFoundException):
                coll.get(keys[1], transcoder=raw)
        finally:
            c.close()
    finally:
        _stop_server(server, log)
