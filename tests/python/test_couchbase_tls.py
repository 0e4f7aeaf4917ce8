"""The Couchbase Python SDK over ``couchbases://`` (TLS) against epkv-server (issue 19).

Each test makes a CA and a server certificate for 127.0.0.1 with the ``openssl`` command
(Debian's ``openssl`` package; ``cargo xtask deps`` installs it), starts a server with
``--tls-cert``/``--tls-key`` on free ports, and connects the SDK to the TLS port with the CA
as its trust store. The SDK bootstraps from the TLS port, reads ``kvSSL`` from the cluster
map for its data connections, and authenticates with SASL PLAIN (what couchbase-cxx-client
uses over TLS) or with a client certificate.
"""

import os
import subprocess
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import _start_server_with, _stop_server

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="needs a TLS server of its own",
)

from couchbase.auth import CertificateAuthenticator, PasswordAuthenticator  # noqa: E402
from couchbase.cluster import Cluster  # noqa: E402
from couchbase.exceptions import DocumentNotFoundException  # noqa: E402
from couchbase.options import ClusterOptions, ClusterTimeoutOptions  # noqa: E402

ADMIN = ("Administrator", "password")
TIMEOUT = timedelta(seconds=10)

CA_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = epkv test CA
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
"""


def _openssl(cwd, *args):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _issue(d, name, cn, extensions):
    """A P-256 key ``name.key`` and a certificate ``name.pem`` for ``cn`` signed by the CA."""
    (d / f"{name}.ext").write_text(extensions)
    _openssl(d, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}")
    _openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate for
    the admin user (CN=Administrator); returns their directory."""
    d = tmp_path_factory.mktemp("epkv-tls")
    (d / "ca.cnf").write_text(CA_CONFIG)
    _openssl(d, "req", "-x509", "-config", "ca.cnf", "-extensions", "v3_ca", "-newkey", "ec",
             "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2")
    _issue(d, "server", "epkv", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
           "extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n")
    _issue(d, "client", ADMIN[0], "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    return d


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory, pki):
    server, log = _start_server_with(tmp_path_factory, [
        "--log-level", "info",
        "--admin-user", ADMIN[0], "--admin-password", ADMIN[1],
        "--tls-port", "0",
        "--tls-cert", str(pki / "server.pem"),
        "--tls-key", str(pki / "server.key"),
        "--tls-client-auth", "optional",
        "--tls-ca", str(pki / "ca.pem"),
    ])
    try:
        assert server.tls_addr, "the startup line names the TLS address"
        yield server
    finally:
        alive = server.proc.poll() is None
        _stop_server(server, log)
        if not alive:
            pytest.fail(f"epkv-server died during the tests; log:\n{server.log_tail()}")


def _timeouts():
    return ClusterTimeoutOptions(kv_timeout=TIMEOUT, connect_timeout=TIMEOUT,
                                 bootstrap_timeout=TIMEOUT, resolve_timeout=TIMEOUT)


def _crud(cluster):
    coll = cluster.bucket("default").default_collection()
    doc_id = f"tls-{uuid.uuid4().hex[:8]}"
    coll.upsert(doc_id, {"over": "tls"})
    assert coll.get(doc_id).content_as[dict] == {"over": "tls"}
    coll.remove(doc_id)
    with pytest.raises(DocumentNotFoundException):
        coll.get(doc_id)


def test_couchbases_upsert_and_get_with_the_test_ca(tls_server, pki):
    opts = ClusterOptions(PasswordAuthenticator(*ADMIN), timeout_options=_timeouts(),
                          enable_app_telemetry=False, trust_store_path=str(pki / "ca.pem"))
    cluster = Cluster(f"couchbases://{tls_server.tls_addr}", opts)
    try:
        _crud(cluster)
    finally:
        cluster.close()
    log = Path(tls_server.log_path).read_text(errors="replace")
    # Over TLS the SDK authenticates with PLAIN.
    assert "mechanism=PLAIN" in log, log[-2000:]


def test_couchbases_with_a_client_certificate_needs_no_password(tls_server, pki):
    auth = CertificateAuthenticator(cert_path=str(pki / "client.pem"),
                                    key_path=str(pki / "client.key"),
                                    trust_store_path=str(pki / "ca.pem"))
    # The trust store rides in the authenticator (the SDK refuses it twice).
    opts = ClusterOptions(auth, timeout_options=_timeouts(), enable_app_telemetry=False)
    cluster = Cluster(f"couchbases://{tls_server.tls_addr}", opts)
    try:
        _crud(cluster)
    finally:
        cluster.close()
    log = Path(tls_server.log_path).read_text(errors="replace")
    assert "mechanism=client-certificate" in log, log[-2000:]
