"""Fixtures that start a real epkv-server process for the Python client tests.

The server binary is ``$EPKV_SERVER_BIN`` or ``target/debug/epkv-server`` under the
repository root. It is started with ``--port 0`` and a data directory of its own (the server
persists by default; nothing is ever written to ./epkv-data), removed when the server is
stopped; the port is read from its ``epkv listening on HOST:PORT ...`` line on stdout. At the
end of the session it gets SIGTERM (and SIGKILL if it does not exit within 10 s).

Set ``EPKV_PYTEST_ADDR=HOST:PORT`` to run the same tests against a server that is already
running instead (for example ``memcached -p 11311 -U 0``, to check parity).
"""

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import bmemcached
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"listening on (\S+?):(\d+)")
# The end of the same line when TLS is on: ``..., tls HOST:PORT)``.
TLS_LISTENING = re.compile(r", tls (\S+?):(\d+)\)")
# The management port on the same line: ``..., mgmt http://HOST:PORT``.
MGMT_LISTENING = re.compile(r", mgmt http://(\S+?):(\d+)")
START_TIMEOUT_SECS = 30
STOP_TIMEOUT_SECS = 10


def _server_bin() -> Path:
    env = os.environ.get("EPKV_SERVER_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO_ROOT / "target"))
    if not target.is_absolute():
        target = REPO_ROOT / target
    return target / "debug" / "epkv-server"


class Server:
    """A running epkv-server process and the address it listens on."""

    def __init__(self, proc, addr, log_path, data_dir, tls_addr=None, mgmt_addr=None):
        self.proc = proc
        self.addr = addr
        # HOST:PORT of the management REST API, when it is on.
        self.mgmt_addr = mgmt_addr
        # HOST:PORT of the TLS listener, for a server started with --tls-cert/--tls-key.
        self.tls_addr = tls_addr
        self.log_path = log_path
        self.data_dir = data_dir

    def log_tail(self, lines=40):
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _start_server(tmp_path_factory):
    return _start_server_with(tmp_path_factory, [])


def _start_server_with(tmp_path_factory, args, port=0, data_dir=None):
    """Starts the server on 127.0.0.1:``port`` with extra ``args`` and ``data_dir`` (a fresh
    one unless given, to restart a server on its data); returns it and its log."""
    binary = _server_bin()
    if not binary.is_file():
        pytest.fail(f"{binary} does not exist; run `cargo build -p epkv-server` first")
    if data_dir is None:
        data_dir = tmp_path_factory.mktemp("epkv-data")
    log_path = tmp_path_factory.mktemp("epkv-log") / "epkv-server.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        # --mgmt-port 0: every server gets a free management port (8091 may be taken, and
        # tests run servers side by side); a test may override it in ``args``.
        [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--data-dir", str(data_dir),
         "--mgmt-port", "0", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    found = {}
    ready = threading.Event()
    seen = []

    def read_stdout():
        # Keeps draining stdout after the listening line so the server never blocks on it.
        for line in proc.stdout:
            if not ready.is_set():
                match = LISTENING.search(line)
                if match:
                    found["addr"] = f"{match.group(1)}:{match.group(2)}"
                    tls = TLS_LISTENING.search(line)
                    if tls:
                        found["tls_addr"] = f"{tls.group(1)}:{tls.group(2)}"
                    mgmt = MGMT_LISTENING.search(line)
                    if mgmt:
                        found["mgmt_addr"] = f"{mgmt.group(1)}:{mgmt.group(2)}"
                    ready.set()
                else:
                    seen.append(line.rstrip())
        ready.set()

    threading.Thread(target=read_stdout, daemon=True).start()
    ready.wait(START_TIMEOUT_SECS)
    if "addr" not in found:
        proc.kill()
        proc.wait()
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)
        tail = Path(log_path).read_text(errors="replace")[-4000:]
        pytest.fail(
            f"epkv-server did not print its listening line within {START_TIMEOUT_SECS}s "
            f"(exit code {proc.returncode}); stdout: {seen}; log:\n{tail}"
        )
    _wait_accepting(found["addr"])
    return Server(proc, found["addr"], log_path, data_dir, found.get("tls_addr"),
                  found.get("mgmt_addr")), log


def mgmt_request(server, method, path, body=None, auth=None):
    """One request to ``server``'s management port, with HTTP basic ``auth`` (user,
    password) and ``body`` as a form; returns (status, parsed JSON body or text,
    headers)."""
    req = urllib.request.Request(f"http://{server.mgmt_addr}{path}", method=method)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    data = None
    if body is not None:
        data = body.encode()
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(req, data=data, timeout=10) as r:
            status, raw, headers = r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        status, raw, headers = e.code, e.read(), e.headers
    text = raw.decode()
    try:
        return status, json.loads(text) if text else None, headers
    except ValueError:
        return status, text, headers


def _free_ports(n):
    """``n`` distinct ports free on 127.0.0.1 now (for servers that must know each other's
    ports before they start, as a cluster's nodes)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _wait_accepting(addr):
    """Waits (bounded) until HOST:PORT accepts a TCP connection."""
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + START_TIMEOUT_SECS
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"{addr} printed as listening but does not accept connections")
            time.sleep(0.02)


def _stop_server(server, log, keep_data=False):
    """SIGTERM (SIGKILL after 10 s); then removes the data directory unless ``keep_data``
    (to start another server on it)."""
    try:
        _stop_process(server, log)
    finally:
        if not keep_data:
            shutil.rmtree(server.data_dir, ignore_errors=True)


def _stop_process(server, log):
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_SECS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            log.close()
            pytest.fail(f"epkv-server did not exit within {STOP_TIMEOUT_SECS}s of SIGTERM")
        log.close()
        if proc.returncode != 0:
            pytest.fail(f"epkv-server exited with {proc.returncode} after SIGTERM, not 0")
        return
    log.close()


@pytest.fixture(scope="session")
def server_addr(tmp_path_factory):
    """Yields HOST:PORT of the server under test, started for this session."""
    external = os.environ.get("EPKV_PYTEST_ADDR")
    if external:
        yield external
        return
    server, log = _start_server(tmp_path_factory)
    try:
        yield server.addr
    finally:
        alive = server.proc.poll() is None
        _stop_server(server, log)
        if not alive:
            pytest.fail(
                f"epkv-server exited during the tests with code {server.proc.returncode}; "
                f"log:\n{server.log_tail()}"
            )


@pytest.fixture
def client(server_addr):
    """Returns a python-binary-memcached client connected to the server under test."""
    c = bmemcached.Client([server_addr], socket_timeout=10)
    yield c
    c.disconnect_all()


@pytest.fixture
def key(request):
    """Returns a key prefix unique to this test, so tests never see each other's data."""
    return f"py-{request.node.name}-{uuid.uuid4().hex[:8]}"


@contextmanager
def alarm_after(secs):
    """Bounds a test: SIGALRM raises TimeoutError after ``secs`` seconds."""
    def expired(_signum, _frame):
        raise TimeoutError(f"test exceeded {secs}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(secs)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def own_server(tmp_path_factory, args):
    """A server of its own started with ``args``, for a module fixture to ``yield from``;
    stops it afterwards and fails the test if it died meanwhile."""
    server, log = _start_server_with(tmp_path_factory, args)
    try:
        yield server
    finally:
        alive = server.proc.poll() is None
        _stop_server(server, log)
        if not alive:
            pytest.fail(f"epkv-server died during the tests; log:\n{server.log_tail()}")


def admin_server(tmp_path_factory, admin, extra=("--memory-quota", "64MiB")):
    """A server of its own with administrator ``admin`` (user, password), for a module
    fixture to ``yield from``; fails the test if the server died meanwhile."""
    yield from own_server(
        tmp_path_factory,
        ["--admin-user", admin[0], "--admin-password", admin[1], *extra],
    )


def sdk_connect(addr, user, password, *, kv_timeout=timedelta(seconds=10),
                connect_timeout=timedelta(seconds=10), management_timeout=timedelta(seconds=10),
                resolve_timeout=None, mechanisms=None, ready=timedelta(seconds=10),
                transaction_config=None):
    """A Couchbase SDK ``Cluster`` bootstrapped from ``couchbase://addr`` as ``user``.

    ``connect_timeout`` also bounds the bootstrap; a ``None`` timeout keeps the SDK's
    default. ``mechanisms`` limits the SASL mechanisms offered. With ``ready``, waits up to
    that long until the cluster is ready (``None``: returns at once, as when a node of the
    map is down). ``transaction_config`` (a ``TransactionConfig``) configures
    ``cluster.transactions``."""
    from couchbase.auth import PasswordAuthenticator
    from couchbase.cluster import Cluster
    from couchbase.options import ClusterOptions, ClusterTimeoutOptions

    timeouts = {"kv_timeout": kv_timeout, "connect_timeout": connect_timeout,
                "bootstrap_timeout": connect_timeout, "management_timeout": management_timeout,
                "resolve_timeout": resolve_timeout}
    timeouts = ClusterTimeoutOptions(**{k: v for k, v in timeouts.items() if v is not None})
    if mechanisms is None:
        auth = PasswordAuthenticator(user, password)
    else:
        auth = PasswordAuthenticator(user, password, allowed_sasl_mechanisms=mechanisms)
    extra = {} if transaction_config is None else {"transaction_config": transaction_config}
    opts = ClusterOptions(auth, timeout_options=timeouts, enable_app_telemetry=False, **extra)
    c = Cluster(f"couchbase://{addr}", opts)
    if ready is not None:
        c.wait_until_ready(ready)
    return c
