"""python-binary-memcached (module ``bmemcached``, from PyPI) against a real epkv-server.

The client never sends HELLO and always puts vbid 0 in its requests, so these tests also
check that the server routes a classic memcached client's keys to their vBuckets itself.
"""

import bmemcached
import pytest
from bmemcached.exceptions import MemcachedException

NON_NUMERIC = 0x06


def test_set_then_get_returns_the_value(client, key):
    assert client.set(key, "hello")
    assert client.get(key) == "hello"


def test_set_overwrites_and_types_round_trip(client, key):
    assert client.set(key, "first")
    assert client.set(key, "second")
    assert client.get(key) == "second"
    # bmemcached records the Python type in the item flags; the server must keep them.
    assert client.set(key + "-int", 42)
    assert client.get(key + "-int") == 42
    assert client.set(key + "-bytes", b"\x00\x01\xff")
    assert client.get(key + "-bytes") == b"\x00\x01\xff"
    assert client.set(key + "-dict", {"a": [1, 2]})
    assert client.get(key + "-dict") == {"a": [1, 2]}


def test_large_value_round_trips(client, key):
    value = "v" * (512 * 1024)
    assert client.set(key, value)
    assert client.get(key) == value


def test_get_of_a_missing_key_is_none(client, key):
    assert client.get(key) is None


def test_delete_removes_the_key(client, key):
    assert client.set(key, "x")
    assert client.delete(key)
    assert client.get(key) is None
    # Deleting again is not an error for this client (KEY_NOT_FOUND maps to True).
    client.delete(key)
    assert client.get(key) is None


def test_incr_and_decr_follow_memcached_rules(client, key):
    assert client.set(key, "10")
    assert client.incr(key, 5) == 15
    assert client.decr(key, 3) == 12
    # Decrement never goes below zero.
    assert client.decr(key, 100) == 0
    # memcached pads a shrunken number with spaces ("0 "); KV-Engine does not.
    assert int(str(client.get(key)).strip()) == 0


def test_incr_of_a_missing_key_creates_it_with_the_initial_value(client, key):
    assert client.incr(key, 5, default=7, time=0) == 7
    assert client.incr(key, 5, default=7, time=0) == 12
    assert client.decr(key, 2, default=7, time=0) == 10


def test_incr_of_a_non_numeric_value_fails_with_0x06(client, key):
    assert client.set(key, "abc")
    with pytest.raises(MemcachedException) as err:
        client.incr(key, 1)
    assert err.value.code == NON_NUMERIC
    assert client.get(key) == "abc"


def test_cas_succeeds_with_the_current_cas_and_fails_when_stale(client, key):
    assert client.set(key, "v1")
    value, cas = client.gets(key)
    assert value == "v1"
    assert cas
    assert client.cas(key, "v2", cas)
    # The successful CAS changed the item's CAS, so the old one is now stale.
    assert not client.cas(key, "v3", cas)
    assert client.get(key) == "v2"
    value, new_cas = client.gets(key)
    assert value == "v2"
    assert new_cas != cas
    assert client.cas(key, "v4", new_cas)
    assert client.get(key) == "v4"


def test_cas_on_a_missing_key_fails(client, key):
    assert not client.cas(key, "v", 12345)
    assert client.get(key) is None


def test_any_write_changes_the_cas(client, key):
    assert client.set(key, "a")
    _, cas1 = client.gets(key)
    assert client.set(key, "b")
    _, cas2 = client.gets(key)
    assert cas1 != cas2
    assert not client.cas(key, "c", cas1)


def test_get_multi_returns_only_present_keys(client, key):
    keys = [f"{key}-{i}" for i in range(20)]
    for i, k in enumerate(keys[:15]):
        assert client.set(k, f"value-{i}")
    got = client.get_multi(keys)
    assert got == {k: f"value-{i}" for i, k in enumerate(keys[:15])}


def test_set_multi_and_delete_multi(client, key):
    items = {f"{key}-{i}": str(i) for i in range(10)}
    assert client.set_multi(items) == []
    assert client.get_multi(list(items)) == items
    assert client.delete_multi(list(items))
    assert client.get_multi(list(items)) == {}


def test_add_only_stores_a_missing_key(client, key):
    assert client.add(key, "first")
    assert not client.add(key, "second")
    assert client.get(key) == "first"


def test_replace_only_stores_an_existing_key(client, key):
    assert not client.replace(key, "nothing")
    assert client.get(key) is None
    assert client.set(key, "old")
    assert client.replace(key, "new")
    assert client.get(key) == "new"


def test_a_second_connection_sees_the_writes(server_addr, client, key):
    other = bmemcached.Client([server_addr], socket_timeout=10)
    try:
        assert client.set(key, "shared")
        assert other.get(key) == "shared"
        assert other.delete(key)
        assert client.get(key) is None
    finally:
        other.disconnect_all()


def test_many_keys_spread_over_vbuckets_all_read_back(client, key):
    # 500 keys land in hundreds of the 1024 vBuckets; every one must be found again.
    items = {f"{key}-{i}": f"v{i}" for i in range(500)}
    assert client.set_multi(items) == []
    assert client.get_multi(list(items)) == items


def test_stats_answers(client):
    stats = client.stats()
    assert len(stats) == 1
    (server_stats,) = stats.values()
    assert server_stats, "STAT returned no statistics"
