"""The object store conformance suite on the local directory adapter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.adapters.objectstores.local import LocalObjectStore
from dpone.testing.object_store_conformance import ObjectStoreConformance


class TestLocalObjectStore(ObjectStoreConformance):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[LocalObjectStore]:
        store = LocalObjectStore(tmp_path / "lake")
        yield store
        store.close()

    def test_no_temp_files_are_left_or_listed(self, store: LocalObjectStore) -> None:
        """Writes leave no temp files, and a failed create cleans its temp file up."""
        store.put("a/b", b"1")
        store.put_if_absent("a/b", b"2")
        store.put_if_match("a/b", b"3", etag="stale")
        names = sorted(p.name for p in (store.root / "a").iterdir())
        assert names == ["b"]
