"""Conformance suite for ObjectStorePort: subclass ObjectStoreConformance, give a ``store``.

Every adapter (local directory, S3 through obstore) must pass the same tests: read after
write, put-if-absent, conditional update by tag, list, delete, and racing conditional
writers of which exactly one wins.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from dpone.errors import ConfigInvalid
from dpone.ports.object_store import ObjectStorePort

__all__ = ["ObjectStoreConformance"]


class ObjectStoreConformance:
    """The object store contract of ARCHITECTURE section 13."""

    @pytest.fixture
    def store(self) -> Iterator[ObjectStorePort]:
        """Yield an empty store; subclasses must override this fixture."""
        raise NotImplementedError("override the store fixture")

    def test_read_after_put(self, store: ObjectStorePort) -> None:
        """A put object reads back byte for byte with its size and tag."""
        written = store.put("d/a.bin", b"\x00one\xff")
        got = store.read("d/a.bin")
        assert got is not None
        data, meta = got
        assert data == b"\x00one\xff"
        assert meta.size == 5 == written.size
        assert meta.etag == written.etag != ""
        head = store.head("d/a.bin")
        assert head is not None
        assert head.etag == written.etag

    def test_absent_reads_none(self, store: ObjectStorePort) -> None:
        """An absent key is None, never an exception."""
        assert store.read("nope/x") is None
        assert store.head("nope/x") is None

    def test_put_replaces_and_changes_the_tag(self, store: ObjectStorePort) -> None:
        """An unconditional put replaces the bytes and the tag."""
        first = store.put("k", b"one")
        second = store.put("k", b"two!")
        assert second.etag != first.etag
        got = store.read("k")
        assert got is not None
        assert got[0] == b"two!"

    def test_put_if_absent_creates_once(self, store: ObjectStorePort) -> None:
        """The second create of one key writes nothing and says so."""
        assert store.put_if_absent("p/once", b"first") is not None
        assert store.put_if_absent("p/once", b"second") is None
        got = store.read("p/once")
        assert got is not None
        assert got[0] == b"first"

    def test_put_if_match_updates_only_the_named_version(self, store: ObjectStorePort) -> None:
        """A conditional update with a stale tag writes nothing; with the fresh tag it wins."""
        v1 = store.put("ptr", b"v1")
        v2 = store.put_if_match("ptr", b"v2", etag=v1.etag)
        assert v2 is not None
        assert v2.etag != v1.etag
        assert store.put_if_match("ptr", b"v3", etag=v1.etag) is None
        got = store.read("ptr")
        assert got is not None
        assert got[0] == b"v2"

    def test_put_if_match_on_absent_writes_nothing(self, store: ObjectStorePort) -> None:
        """A conditional update of a missing key fails without creating it."""
        assert store.put_if_match("ghost", b"x", etag="whatever") is None
        assert store.head("ghost") is None

    def test_list_under_a_prefix(self, store: ObjectStorePort) -> None:
        """List returns every object under a directory prefix, sorted, and nothing else."""
        for key in ("ds/i/gen=a/p2", "ds/i/gen=a/p1", "ds/i/gen=b/p1", "other/x"):
            store.put(key, key.encode())
        assert [o.key for o in store.list("ds/i/gen=a")] == ["ds/i/gen=a/p1", "ds/i/gen=a/p2"]
        assert [o.key for o in store.list("ds")] == [
            "ds/i/gen=a/p1",
            "ds/i/gen=a/p2",
            "ds/i/gen=b/p1",
        ]
        assert store.list("missing") == []

    def test_delete_is_idempotent(self, store: ObjectStorePort) -> None:
        """Delete removes the object; deleting again is fine."""
        store.put("del/me", b"x")
        store.delete("del/me")
        store.delete("del/me")
        assert store.read("del/me") is None
        assert store.list("del") == []

    def test_unsafe_keys_are_refused(self, store: ObjectStorePort) -> None:
        """Keys that escape the store or are not relative are a config error."""
        for key in ("../x", "/abs", "a//b", "a/./b", ""):
            with pytest.raises(ConfigInvalid):
                store.put(key, b"x")

    def test_racing_creates_exactly_one_wins(self, store: ObjectStorePort) -> None:
        """Eight threads create one key at once: exactly one succeeds."""
        self._race(store, lambda i: store.put_if_absent("race/create", f"w{i}".encode()))

    def test_racing_updates_exactly_one_wins(self, store: ObjectStorePort) -> None:
        """Eight threads update from the same tag at once: exactly one succeeds."""
        base = store.put("race/update", b"base")
        self._race(
            store, lambda i: store.put_if_match("race/update", f"w{i}".encode(), etag=base.etag)
        )

    @staticmethod
    def _race(store: ObjectStorePort, attempt: object) -> None:
        barrier = threading.Barrier(8)
        results: list[object] = [None] * 8
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                barrier.wait()
                results[i] = attempt(i)  # type: ignore[operator]
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
