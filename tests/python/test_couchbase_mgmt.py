"""The Couchbase Python SDK's management APIs against a real epkv-server: the SDK
bootstraps over the KV port, finds the management REST port as ``mgmt`` in the cluster
map's ``nodesExt`` and sends cluster info, bucket and user management there
(docs/rest.md). Plain HTTP checks cover what the SDK does not send: bad forms, unknown
resources and requests without credentials.
"""

import os
import time
import uuid
from datetime import timedelta

import pytest

from conftest import admin_server, alarm_after, mgmt_request, sdk_connect

couchbase = pytest.importorskip("couchbase")

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("EPKV_PYTEST_ADDR")),
    reason="needs a server of its own, with an administrator",
)

from couchbase.exceptions import (  # noqa: E402
    BucketAlreadyExistsException,
    BucketNotFoundException,
    CollectionAlreadyExistsException,
    CouchbaseException,
    DocumentNotFoundException,
    ScopeAlreadyExistsException,
    ScopeNotFoundException,
    UserNotFoundException,
)
from couchbase.management.buckets import CreateBucketSettings  # noqa: E402
from couchbase.management.users import Role, User  # noqa: E402

ADMIN = ("Administrator", "password")
TEST_ALARM_SECS = 60


@pytest.fixture(autouse=True)
def _bounded():
    with alarm_after(TEST_ALARM_SECS):
        yield


@pytest.fixture(scope="module")
def mgmt_server(tmp_path_factory):
    for server in admin_server(tmp_path_factory, ADMIN):
        assert server.mgmt_addr, "the startup line names the management address"
        yield server


@pytest.fixture(scope="module")
def cluster(mgmt_server):
    c = sdk_connect(mgmt_server.addr, *ADMIN)
    yield c
    c.close()


def _http(server, method, path, body=None, auth=ADMIN):
    """One request to the management port, as the admin unless told otherwise."""
    return mgmt_request(server, method, path, body, auth)


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_cluster_info_reports_this_node(cluster):
    info = cluster.cluster_info()
    nodes = info.nodes
    assert len(nodes) == 1
    assert nodes[0]["status"] == "healthy"
    assert nodes[0]["services"] == ["kv"]


def test_get_bucket_reports_no_replicas(cluster):
    settings = cluster.buckets().get_bucket("default")
    assert settings.name == "default"
    assert settings.num_replicas == 0
    assert settings.ram_quota_mb == 64
    with pytest.raises(BucketNotFoundException):
        cluster.buckets().get_bucket("no-such-bucket")


def test_create_use_and_drop_a_bucket(mgmt_server, cluster):
    name = _name("sdk")
    mgr = cluster.buckets()
    mgr.create_bucket(CreateBucketSettings(
        name=name, ram_quota_mb=32, num_replicas=0, flush_enabled=True))
    with pytest.raises(BucketAlreadyExistsException):
        mgr.create_bucket(CreateBucketSettings(name=name, ram_quota_mb=32, num_replicas=0))
    got = mgr.get_bucket(name)
    assert (got.ram_quota_mb, got.num_replicas, got.flush_enabled) == (32, 0, True)
    assert name in [b.name for b in mgr.get_all_buckets()]
    coll = cluster.bucket(name).default_collection()
    coll.upsert("k", {"v": 1})
    assert coll.get("k").content_as[dict] == {"v": 1}
    mgr.flush_bucket(name)
    assert _http(mgmt_server, "GET", f"/pools/default/buckets/{name}")[1]["basicStats"][
        "itemCount"] == 0
    mgr.drop_bucket(name)
    with pytest.raises(BucketNotFoundException):
        mgr.get_bucket(name)
    with pytest.raises(BucketNotFoundException):
        mgr.drop_bucket(name)
    assert not (mgmt_server.data_dir / name).exists(), "a dropped bucket's data is removed"


def test_a_minimum_durability_level_set_through_the_sdk(cluster):
    from couchbase.durability import DurabilityLevel
    name = _name("dur")
    mgr = cluster.buckets()
    mgr.create_bucket(CreateBucketSettings(
        name=name, ram_quota_mb=32, num_replicas=0,
        minimum_durability_level=DurabilityLevel.PERSIST_TO_MAJORITY))
    try:
        got = mgr.get_bucket(name)
        assert got.minimum_durability_level == DurabilityLevel.PERSIST_TO_MAJORITY
        # Plain writes work (each is answered once persisted).
        coll = cluster.bucket(name).default_collection()
        for i in range(5):
            coll.upsert(f"k{i}", {"v": i})
        assert coll.get("k4").content_as[dict] == {"v": 4}
    finally:
        mgr.drop_bucket(name)


def test_replicas_are_refused(cluster):
    with pytest.raises(CouchbaseException):
        cluster.buckets().create_bucket(
            CreateBucketSettings(name=_name("rep"), ram_quota_mb=32, num_replicas=1))


def test_users_upsert_get_and_drop(mgmt_server, cluster):
    users = cluster.users()
    name = _name("user")
    users.upsert_user(User(username=name, password="s3cret-pw",
                           roles=[Role(name="data_reader", bucket="default")]))
    got = users.get_user(name)
    assert got.user.username == name
    assert [(r.name, r.bucket) for r in got.user.roles] == [("data_reader", "default")]
    assert name in [u.user.username for u in users.get_all_users()]
    # The new user works on the KV port at once, as a reader.
    c = sdk_connect(mgmt_server.addr, name, "s3cret-pw")
    try:
        with pytest.raises(DocumentNotFoundException):
            c.bucket("default").default_collection().get(f"by-{name}")
    finally:
        c.close()
    users.drop_user(name)
    with pytest.raises(UserNotFoundException):
        users.get_user(name)
    with pytest.raises(UserNotFoundException):
        users.drop_user(name)
    text = (mgmt_server.data_dir / "users.toml").read_text()
    assert name not in text


def test_bad_forms_name_the_field(mgmt_server):
    status, body, _ = _http(mgmt_server, "POST", "/pools/default/buckets",
                            "name=x&ramQuotaMB=lots&flushEnabled=maybe&maxTTL=-")
    assert status == 400
    assert {"ramQuota", "flushEnabled", "maxTTL"} <= set(body["errors"])
    status, body, _ = _http(mgmt_server, "PUT", "/settings/rbac/users/local/u1",
                            "password=long-enough&roles=root")
    assert status == 400 and "roles" in body["errors"]


def test_unknown_paths_and_buckets_are_json_404s(mgmt_server):
    for path in ["/nothing/here", "/pools/default/buckets/nope", "/pools/default/b/nope",
                 "/pools/default/buckets/nope/scopes",
                 "/pools/default/buckets/default/scopes/x/y/z"]:
        status, body, headers = _http(mgmt_server, "GET", path)
        assert status == 404, path
        assert headers["Content-Type"] == "application/json"
        assert "error" in body


def test_requests_without_credentials_get_401(mgmt_server):
    status, _, headers = _http(mgmt_server, "GET", "/pools", auth=None)
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic")
    status, _, _ = _http(mgmt_server, "GET", "/pools", auth=("Administrator", "wrong"))
    assert status == 401


def test_scopes_and_collections_hold_their_own_documents(cluster):
    """`bucket.collections()` creates a scope and collections; CRUD, sub-document and
    counters work in them, apart from the default collection's documents; maxTTL gives
    documents written without an expiry one; dropping a collection leaves the others
    alone and a new collection of the same name starts empty."""
    import couchbase.subdocument as SD
    from couchbase.management.logic.collection_mgmt_req_types import CreateCollectionSettings
    from couchbase.options import GetOptions, IncrementOptions, SignedInt64
    bucket = cluster.bucket("default")
    mgr = bucket.collections()
    scope = "inv" + uuid.uuid4().hex[:8]
    mgr.create_scope(scope)
    with pytest.raises(ScopeAlreadyExistsException):
        mgr.create_scope(scope)
    mgr.create_collection(scope, "airline")
    mgr.create_collection(scope, "hotel")
    mgr.create_collection(scope, "ttl", CreateCollectionSettings(max_expiry=timedelta(seconds=600)))
    with pytest.raises(CollectionAlreadyExistsException):
        mgr.create_collection(scope, "airline")
    names = {s.name: sorted(c.name for c in s.collections) for s in mgr.get_all_scopes()}
    assert names[scope] == ["airline", "hotel", "ttl"]
    assert "_default" in names["_default"]

    airline = bucket.scope(scope).collection("airline")
    hotel = bucket.scope(scope).collection("hotel")
    default = bucket.default_collection()
    default.upsert("k1", {"where": "default"})
    airline.upsert("k1", {"where": "airline"})
    hotel.upsert("k1", {"where": "hotel"})
    assert airline.get("k1").content_as[dict] == {"where": "airline"}
    assert hotel.get("k1").content_as[dict] == {"where": "hotel"}
    assert default.get("k1").content_as[dict] == {"where": "default"}
    airline.mutate_in("k1", [SD.upsert("n", 1), SD.upsert("meta.by", "ann", xattr=True,
                                                           create_parents=True)])
    got = airline.lookup_in("k1", [SD.get("n"), SD.get("meta.by", xattr=True)])
    assert got.content_as[int](0) == 1 and got.content_as[str](1) == "ann"
    first = airline.binary().increment("ctr", IncrementOptions(initial=SignedInt64(5)))
    assert first.content == 5
    assert airline.binary().increment("ctr").content == 6
    assert not hotel.exists("ctr").exists
    airline.remove("k1")
    assert not airline.exists("k1").exists
    assert hotel.exists("k1").exists

    ttl = bucket.scope(scope).collection("ttl")
    ttl.upsert("t1", {"t": 1})
    expiry = ttl.get("t1", GetOptions(with_expiry=True)).expiry_time
    assert expiry is not None
    left = expiry.timestamp() - time.time()
    assert 0 < left <= 601

    hotel.upsert("k2", {"h": 2})
    mgr.drop_collection(scope, "hotel")
    names = {s.name: sorted(c.name for c in s.collections) for s in mgr.get_all_scopes()}
    assert names[scope] == ["airline", "ttl"]
    with pytest.raises(CouchbaseException):
        hotel.get("k2", GetOptions(timeout=timedelta(seconds=2)))
    assert default.get("k1").content_as[dict] == {"where": "default"}
    assert airline.binary().increment("ctr").content == 7
    # Created again, the collection has a new id and none of the old documents.
    mgr.create_collection(scope, "hotel")
    again = bucket.scope(scope).collection("hotel")
    assert not again.exists("k2").exists
    mgr.drop_scope(scope)
    with pytest.raises(ScopeNotFoundException):
        mgr.drop_scope(scope)
    with pytest.raises(CouchbaseException):
        airline.get("ctr", GetOptions(timeout=timedelta(seconds=2)))
