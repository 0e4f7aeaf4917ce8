"""DCP from a third-party client: gocbcore's DCPAgent (Couchbase's Go SDK core,
``github.com/couchbase/gocbcore/v10``) through ``tests/dcp-go``'s ``epkv-dcp-check``, against a
real epkv-server with users (SCRAM-SHA512 as ``Administrator``).

The Go program is built once per session into ``target/dcp-go/epkv-dcp-check`` (``go build``;
its modules come through the Go module proxy, pinned by ``tests/dcp-go/go.sum``). Without
``go`` on PATH the tests are skipped, unless ``EPKV_CI`` is set, where they fail.

The documents are written over the memcached binary protocol (SASL PLAIN, SELECT_BUCKET,
SET/DELETE to the key's vBucket); each vBucket's high seqno comes from ``STAT vbucket-seqno``
and is handed to the program as its ``--end-file``, so every stream it opens ends with
STREAM_END (reason ok). The first run streams every vBucket from 0; the second resumes from
the state file the first wrote and must see exactly what changed since.
"""

import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPO_ROOT, admin_server, mgmt_request

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="needs a server of its own, configured with users",
)

ADMIN = ("Administrator", "password")
NUM_VBUCKETS = 1024
GO_MODULE = REPO_ROOT / "tests" / "dcp-go"
# tests/dcp-go/go.mod's `go` line, from gocbcore v10.8.1's (which imports "slices").
MIN_GO = (1, 21)
# Bounds on the Go build (a first build downloads gocbcore through the module proxy) and on
# one run of the program, whose own --timeout-secs is RUN_TIMEOUT_SECS.
BUILD_TIMEOUT_SECS = 600
RUN_TIMEOUT_SECS = 60
SOCKET_TIMEOUT_SECS = 10

# The first phase: FIRST_DOCS keys, every fifth written twice (the second value longer, so
# the "latest value" is the one to check), then every tenth deleted.
FIRST_DOCS = 500
FIRST_DELETED = set(range(0, FIRST_DOCS, 10))
REWRITTEN = set(range(0, FIRST_DOCS, 5))
# The second phase: SECOND_DOCS new keys (see second_keys), and SECOND_DELETED keys of the
# first phase (live until now) deleted.
SECOND_DOCS = 100
SECOND_DELETED = set(range(5, 105, 10))


def vbucket_of(key: bytes) -> int:
    """The vBucket of a key, as Couchbase clients hash it (CRC32, then the top 15 bits)."""
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % NUM_VBUCKETS


def first_key(i):
    return f"dcp-k{i}"


def second_keys(live):
    """The second phase's new keys: the first SECOND_DOCS of ``dcp-second-J`` that land in a
    vBucket holding a live first-phase key, so that a resumed stream that resent older items
    would show them. (Keys of one shape, such as ``dcp-nI`` beside ``dcp-kI``, can land in
    disjoint vBucket sets: CRC32 is linear.)"""
    occupied = {vbucket_of(k.encode()) for k in live}
    keys = []
    j = 0
    while len(keys) < SECOND_DOCS:
        key = f"dcp-second-{j}"
        if vbucket_of(key.encode()) in occupied:
            keys.append(key)
        j += 1
    return keys


def first_value(i, rewritten=False):
    return b"v" * (1 + i % 97) + (b"-rewritten" * (1 + i % 7) if rewritten else b"")


def second_value(i):
    return b"n" * (3 + i % 41)


def _target_dir() -> Path:
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target"))
    return target if target.is_absolute() else REPO_ROOT / target


@pytest.fixture(scope="session")
def dcp_check_bin():
    """Builds tests/dcp-go into target/dcp-go/epkv-dcp-check (go's build cache keeps it
    quick after the first time) and returns its path."""
    go = shutil.which("go")
    if go is None:
        message = ("`go` is not on PATH: the gocbcore DCP client tests need Go >= 1.21 "
                   "(`cargo xtask deps` installs Debian's golang-go when go is missing)")
        if os.environ.get("EPKV_CI"):
            pytest.fail(message)
        pytest.skip(message)
    version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True,
                             timeout=60).stdout.strip()
    found = re.match(r"go(\d+)\.(\d+)", version)
    if found is None or (int(found.group(1)), int(found.group(2))) < MIN_GO:
        message = (f"{go} is {version or 'of unknown version'}; tests/dcp-go (gocbcore "
                   f"v10.8.1) needs Go >= {MIN_GO[0]}.{MIN_GO[1]} (Debian bookworm's golang-go "
                   "is 1.19: use trixie's, bookworm-backports' golang-1.2x-go, or go.dev's)")
        if os.environ.get("EPKV_CI"):
            pytest.fail(message)
        pytest.skip(message)
    out = _target_dir() / "dcp-go" / "epkv-dcp-check"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        built = subprocess.run(
            [go, "build", "-o", str(out), "."],
            cwd=GO_MODULE, capture_output=True, text=True, timeout=BUILD_TIMEOUT_SECS,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`go build` of {GO_MODULE} did not finish within {BUILD_TIMEOUT_SECS}s")
    if built.returncode != 0:
        pytest.fail(f"`go build` of {GO_MODULE} failed ({built.returncode}):\n"
                    f"{built.stdout}\n{built.stderr}")
    return out


@pytest.fixture(scope="module")
def dcp_server(tmp_path_factory):
    """A server of its own (so that its vBuckets hold only this module's documents), with
    an admin user."""
    yield from admin_server(tmp_path_factory, ADMIN, extra=())


class Memcached:
    """A minimal memcached binary protocol client: SASL PLAIN, SELECT_BUCKET, SET and
    DELETE to a key's vBucket, STAT groups."""

    def __init__(self, addr, user, password, bucket="default"):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_SECS)
        status, _ = self.request(0x21, key=b"PLAIN",
                                 value=b"\0" + user.encode() + b"\0" + password.encode())
        assert status == 0, f"SASL PLAIN answered {status:#x}"
        status, _ = self.request(0x89, key=bucket.encode())
        assert status == 0, f"SELECT_BUCKET {bucket} answered {status:#x}"

    def close(self):
        self.sock.close()

    def _recv_exact(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "server closed the connection"
            data += chunk
        return data

    def _send(self, opcode, key=b"", extras=b"", value=b"", vbucket=0):
        body = len(extras) + len(key) + len(value)
        header = struct.pack(">BBHBBHIIQ", 0x80, opcode, len(key), len(extras), 0, vbucket,
                             body, 0xD0C0, 0)
        self.sock.sendall(header + extras + key + value)

    def _reply(self):
        header = self._recv_exact(24)
        magic, opcode, key_len, extras_len, _, status, body_len, _, cas = struct.unpack(
            ">BBHBBHIIQ", header)
        assert magic == 0x81, f"reply magic {magic:#x}"
        payload = self._recv_exact(body_len)
        key = payload[extras_len:extras_len + key_len]
        return status, key, payload[extras_len + key_len:], cas

    def request(self, opcode, key=b"", extras=b"", value=b"", vbucket=0):
        self._send(opcode, key, extras, value, vbucket)
        status, _, value, _ = self._reply()
        return status, value

    def must_set(self, key, value):
        k = key.encode()
        status, body = self.request(0x01, key=k, extras=struct.pack(">II", 0, 0), value=value,
                                    vbucket=vbucket_of(k))
        assert status == 0, f"SET {key} answered {status:#x} {body!r}"

    def must_set_with_ttl(self, key, value, ttl):
        k = key.encode()
        status, body = self.request(0x01, key=k, extras=struct.pack(">II", 0, ttl), value=value,
                                    vbucket=vbucket_of(k))
        assert status == 0, f"SET {key} answered {status:#x} {body!r}"

    def get_status(self, key):
        k = key.encode()
        status, _ = self.request(0x00, key=k, vbucket=vbucket_of(k))
        return status

    def must_delete(self, key):
        k = key.encode()
        status, body = self.request(0x04, key=k, vbucket=vbucket_of(k))
        assert status == 0, f"DELETE {key} answered {status:#x} {body!r}"

    def stats(self, group):
        self._send(0x10, key=group.encode())
        out = {}
        while True:
            status, key, value, _ = self._reply()
            assert status == 0, f"STAT {group} answered {status:#x}"
            if not key:
                return out
            out[key.decode()] = value.decode()


def vbucket_seqnos(client):
    """Returns {vb: (high_seqno, uuid)} from STAT vbucket-seqno."""
    stats = client.stats("vbucket-seqno")
    out = {}
    for vb in range(NUM_VBUCKETS):
        out[vb] = (int(stats[f"vb_{vb}:high_seqno"]), int(stats[f"vb_{vb}:uuid"]))
    return out


@dataclass
class Run:
    """One run of epkv-dcp-check: its exit code, its events and the state it wrote."""

    returncode: int
    events: list
    stderr: str
    state: dict = field(default_factory=dict)

    def of(self, kind):
        return [e for e in self.events if e["event"] == kind]

    def data(self):
        return [e for e in self.events if e["event"] in ("mutation", "deletion", "expiration")]

    def describe(self, server):
        lines = [json.dumps(e) for e in self.events if e["event"] not in
                 ("mutation", "deletion", "snapshot", "stream_open", "end")]
        return (f"exit code {self.returncode}; notable events:\n" + "\n".join(lines[-30:]) +
                f"\nstderr (tail):\n{self.stderr[-3000:]}\nserver log (tail):\n"
                f"{server.log_tail()}")


def run_dcp_check(binary, server, workdir, highs, name, extra=(), state="state.json",
                  creds=ADMIN):
    """Runs the program over every vBucket, each to its high seqno in ``highs``, resuming
    from (and updating) workdir/``state``, with the ``extra`` arguments, as ``creds``."""
    end_file = workdir / f"end-{name}.json"
    end_file.write_text(json.dumps({str(vb): seqno for vb, seqno in highs.items()}))
    state_file = workdir / state
    args = [str(binary), "--addr", server.addr, "--user", creds[0], "--password", creds[1],
            "--bucket", "default", "--name", f"epkv-dcp-check-{name}-{uuid.uuid4().hex[:8]}",
            "--vbuckets", str(NUM_VBUCKETS), "--buffer-size", str(1 << 20),
            "--state", str(state_file), "--end", "high", "--end-file", str(end_file),
            "--timeout-secs", str(RUN_TIMEOUT_SECS), *extra]
    try:
        done = subprocess.run(args, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_SECS + 30)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"epkv-dcp-check outlived its own --timeout-secs: {e.stderr!r}; "
                    f"server log:\n{server.log_tail()}")
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    return Run(done.returncode, events, done.stderr, state)


@dataclass
class FirstPhase:
    """The documents of the first phase and the first run over them."""

    live: dict  # key -> length of its latest value
    deleted: set
    highs: dict  # vb -> (high seqno, uuid)
    run: Run
    workdir: Path


@pytest.fixture(scope="module")
def first_phase(dcp_check_bin, dcp_server, tmp_path_factory):
    client = Memcached(dcp_server.addr, *ADMIN)
    try:
        live = {}
        for i in range(FIRST_DOCS):
            client.must_set(first_key(i), first_value(i))
            live[first_key(i)] = len(first_value(i))
        for i in sorted(REWRITTEN):
            client.must_set(first_key(i), first_value(i, rewritten=True))
            live[first_key(i)] = len(first_value(i, rewritten=True))
        deleted = set()
        for i in sorted(FIRST_DELETED):
            client.must_delete(first_key(i))
            del live[first_key(i)]
            deleted.add(first_key(i))
        highs = vbucket_seqnos(client)
    finally:
        client.close()
    workdir = tmp_path_factory.mktemp("dcp-gocbcore")
    run = run_dcp_check(dcp_check_bin, dcp_server, workdir,
                        {vb: h for vb, (h, _) in highs.items()}, "first")
    return FirstPhase(live, deleted, highs, run, workdir)


def check_stream_order(run, highs, server):
    """Every data event's seqno is above the previous one of its vBucket and at most its
    end; every stream that was opened ended with reason ok. Returns {vb: last seqno}."""
    last = {}
    for e in run.data():
        vb = e["vb"]
        assert vb == vbucket_of(e["key"].encode()), f"{e} arrived on the wrong vBucket"
        assert e["seqno"] > last.get(vb, 0), \
            f"vb {vb}: seqno {e['seqno']} after {last.get(vb)}: {run.describe(server)}"
        assert e["seqno"] <= highs[vb], f"vb {vb}: {e} past its end {highs[vb]}"
        last[vb] = e["seqno"]
    opened = {e["vb"] for e in run.of("stream_open")}
    ended = {e["vb"]: e for e in run.of("end")}
    assert set(ended) == opened, \
        f"streams opened but not ended: {sorted(opened - set(ended))}: {run.describe(server)}"
    bad = {vb: e for vb, e in ended.items() if e.get("reason") != "ok"}
    assert not bad, f"streams ended other than ok: {bad}"
    return last


def last_event_per_key(run):
    out = {}
    for e in run.data():
        out[e["key"]] = e
    return out


def test_gocbcore_dcp_streams_every_vbucket_to_its_high_seqno(first_phase, dcp_server):
    phase = first_phase
    run = phase.run
    assert run.returncode == 0, run.describe(dcp_server)
    assert not run.of("violation") and not run.of("error") and not run.of("rollback"), \
        run.describe(dcp_server)
    highs = {vb: h for vb, (h, _) in phase.highs.items()}

    # One stream per vBucket holding anything, from 0 to its high seqno; none for the others.
    opened = {e["vb"]: e for e in run.of("stream_open")}
    assert set(opened) == {vb for vb, h in highs.items() if h > 0}
    for vb, e in opened.items():
        assert (e["start"], e["end"]) == (0, highs[vb]), e
        assert e["vbuuid"] == phase.highs[vb][1], \
            f"vb {vb}: failover log's newest UUID {e['vbuuid']} is not STAT's {phase.highs[vb][1]}"

    last = check_stream_order(run, highs, dcp_server)
    # The item at the high seqno is the newest of its key, so no deduplication drops it.
    for vb in opened:
        assert last.get(vb) == highs[vb], f"vb {vb}: last seqno {last.get(vb)}, high {highs[vb]}"

    latest = last_event_per_key(run)
    for key, length in phase.live.items():
        e = latest.get(key)
        assert e is not None, f"live key {key} never arrived"
        assert e["event"] == "mutation", f"live key {key} ended as {e}"
        assert e["value_len"] == length, f"{key}: value_len {e['value_len']}, wrote {length}"
    for key in phase.deleted:
        e = latest.get(key)
        # From seqno 0 a deleted key may be left out altogether; if it comes, its last
        # event is the deletion.
        assert e is None or e["event"] == "deletion", f"deleted key {key} ended as {e}"
    unknown = set(latest) - set(phase.live) - phase.deleted
    assert not unknown, f"keys never written: {sorted(unknown)[:10]}"

    # The state file holds each streamed vBucket's resume point.
    for vb in opened:
        s = run.state[str(vb)]
        assert s["seqno"] == highs[vb], (vb, s)
        assert s["snap_start"] <= s["seqno"] <= s["snap_end"], (vb, s)
        assert s["vbuuid"] == phase.highs[vb][1], (vb, s)


def test_gocbcore_dcp_resumes_from_its_state_file_with_only_new_changes(
        first_phase, dcp_check_bin, dcp_server):
    phase = first_phase
    if phase.run.returncode != 0:
        pytest.fail(f"the first run failed, so there is nothing to resume from: "
                    f"{phase.run.describe(dcp_server)}")
    previous = {int(vb): s for vb, s in phase.run.state.items()}

    client = Memcached(dcp_server.addr, *ADMIN)
    try:
        added = {}
        for i, key in enumerate(second_keys(phase.live)):
            client.must_set(key, second_value(i))
            added[key] = len(second_value(i))
        deleted = set()
        for i in sorted(SECOND_DELETED):
            assert first_key(i) in phase.live
            client.must_delete(first_key(i))
            deleted.add(first_key(i))
        highs_uuids = vbucket_seqnos(client)
    finally:
        client.close()
    highs = {vb: h for vb, (h, _) in highs_uuids.items()}

    run = run_dcp_check(dcp_check_bin, dcp_server, phase.workdir, highs, "second")
    assert run.returncode == 0, run.describe(dcp_server)
    assert not run.of("violation") and not run.of("error") and not run.of("rollback"), \
        run.describe(dcp_server)

    # Streams only where something changed, each from the previous run's resume point.
    changed = {vb for vb, h in highs.items() if h > previous.get(vb, {"seqno": 0})["seqno"]}
    opened = {e["vb"]: e for e in run.of("stream_open")}
    assert set(opened) == changed
    for vb, e in opened.items():
        before = previous.get(vb)
        if before is None:
            assert e["start"] == 0, e
        else:
            assert (e["vbuuid"], e["start"], e["snap_start"], e["snap_end"]) == (
                before["vbuuid"], before["seqno"], before["snap_start"], before["snap_end"]), \
                (e, before)
        assert e["end"] == highs[vb], e

    last = check_stream_order(run, highs, dcp_server)
    for e in run.data():
        floor = previous.get(e["vb"], {"seqno": 0})["seqno"]
        assert e["seqno"] > floor, f"{e} is not newer than the resume point {floor}"
    for vb in opened:
        assert last.get(vb) == highs[vb], f"vb {vb}: last seqno {last.get(vb)}, high {highs[vb]}"

    # Exactly the new changes: each key touched once since the first run, so nothing can
    # be deduplicated away.
    mutations = {e["key"]: e for e in run.of("mutation")}
    deletions = {e["key"]: e for e in run.of("deletion")}
    assert len(run.of("mutation")) == len(added), sorted(set(mutations) - set(added))[:10]
    assert len(run.of("deletion")) == len(deleted), sorted(set(deletions) - deleted)[:10]
    assert set(mutations) == set(added)
    assert set(deletions) == deleted
    for key, length in added.items():
        assert mutations[key]["value_len"] == length, mutations[key]
    assert not run.of("expiration")

    for vb in opened:
        s = run.state[str(vb)]
        assert s["seqno"] == highs[vb], (vb, s)
        assert s["vbuuid"] == highs_uuids[vb][1], (vb, s)
    # vBuckets without a stream keep their resume point.
    for vb, s in previous.items():
        if vb not in opened:
            assert run.state[str(vb)] == s, vb


def _rest(server, method, path, body):
    status, reply, _ = mgmt_request(server, method, path, body, ADMIN)
    assert status == 200, f"{method} {path}: {status} {reply}"
    return reply


def test_gocbcore_dcp_gets_collection_events_and_expirations(dcp_check_bin, dcp_server,
                                                             tmp_path):
    """A collection-aware agent with the expiry opcode, from every vBucket's high seqno:
    the creation of a scope and of a collection arrive in every vBucket as system events
    (names, ids and manifest uids as gocbcore decodes them), and a document that expired
    arrives as an expiration."""
    assert dcp_server.mgmt_addr, "the server names its management address"
    client = Memcached(dcp_server.addr, *ADMIN)
    try:
        before = vbucket_seqnos(client)
        (tmp_path / "state.json").write_text(json.dumps({
            str(vb): {"vbuuid": u, "seqno": h, "snap_start": h, "snap_end": h}
            for vb, (h, u) in before.items()}))
        scope_uid = int(_rest(dcp_server, "POST", "/pools/default/buckets/default/scopes",
                              "name=dcp_scope")["uid"], 16)
        collection_uid = int(_rest(
            dcp_server, "POST", "/pools/default/buckets/default/scopes/dcp_scope/collections",
            "name=dcp_collection")["uid"], 16)
        client.must_set_with_ttl("dcp-expiring", b"short-lived", 1)
        # Expired once the server's clock passes the next second; a GET then expires it.
        deadline = time.monotonic() + 10
        while client.get_status("dcp-expiring") == 0:
            assert time.monotonic() < deadline, "the document never expired"
            time.sleep(0.2)
        after = vbucket_seqnos(client)
    finally:
        client.close()
    highs = {vb: h for vb, (h, _) in after.items()}
    run = run_dcp_check(dcp_check_bin, dcp_server, tmp_path, highs, "collections",
                        extra=("--collections", "--expiry-opcode"))
    assert run.returncode == 0, run.describe(dcp_server)
    assert not run.of("violation") and not run.of("error") and not run.of("rollback"), \
        run.describe(dcp_server)
    check_stream_order(run, highs, dcp_server)

    system = run.of("system")
    scopes = {e["vb"]: e for e in system if e["type"] == "scope_create"}
    collections = {e["vb"]: e for e in system if e["type"] == "collection_create"}
    assert set(scopes) == set(range(NUM_VBUCKETS)), f"{len(scopes)} vBuckets saw the scope"
    assert set(collections) == set(range(NUM_VBUCKETS))
    assert len(system) == 2 * NUM_VBUCKETS, [e for e in system if e["type"] not in
                                             ("scope_create", "collection_create")][:5]
    for vb in range(NUM_VBUCKETS):
        s, c = scopes[vb], collections[vb]
        assert s["seqno"] == before[vb][0] + 1, (s, before[vb])
        assert c["seqno"] == s["seqno"] + 1, (s, c)
        assert (s["name"], s["manifest_uid"]) == ("dcp_scope", scope_uid), s
        assert (c["name"], c["manifest_uid"], c["scope_id"]) == (
            "dcp_collection", collection_uid, s["scope_id"]), (s, c)
    assert c["collection_id"] >= 8, c

    expirations = run.of("expiration")
    assert [(e["key"], e["collection_id"]) for e in expirations] == [("dcp-expiring", 0)], \
        run.describe(dcp_server)
    assert not [e for e in run.of("deletion") if e["key"] == "dcp-expiring"]
    # Its mutation may be left out: a backfill sends the newest version of each key.
    assert {e["key"] for e in run.of("mutation")} <= {"dcp-expiring"}


def test_gocbcore_dcp_needs_a_role_that_grants_dcp(dcp_check_bin, dcp_server, tmp_path):
    """Only a role with the DcpProducer and DcpStream privileges opens a DCP producer: a
    ``data_reader`` is refused at DCP_OPEN (gocbcore fails to start its agent), a
    ``data_dcp_reader`` of the same bucket streams every vBucket to its high seqno."""
    client = Memcached(dcp_server.addr, *ADMIN)
    try:
        client.must_set("dcp-rbac-doc", b"x")
        highs = {vb: h for vb, (h, _) in vbucket_seqnos(client).items()}
    finally:
        client.close()
    reader = ("dcp-rbac-reader", "reader-secret")
    streamer = ("dcp-rbac-streamer", "streamer-secret")
    for (user, password), role in [(reader, "data_reader"), (streamer, "data_dcp_reader")]:
        _rest(dcp_server, "PUT", f"/settings/rbac/users/local/{user}",
              f"password={password}&roles={role}%5Bdefault%5D")
    refused = run_dcp_check(dcp_check_bin, dcp_server, tmp_path, highs, "rbac-reader",
                            state="reader.json", creds=reader)
    assert refused.returncode != 0, refused.stderr
    assert not refused.of("mutation"), "nothing streamed to a data_reader"
    allowed = run_dcp_check(dcp_check_bin, dcp_server, tmp_path, highs, "rbac-streamer",
                            state="streamer.json", creds=streamer)
    assert allowed.returncode == 0, f"{allowed.stderr}\n{dcp_server.log_tail()}"
    assert any(e.get("key") == "dcp-rbac-doc" for e in allowed.of("mutation"))
