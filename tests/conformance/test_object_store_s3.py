"""The object store conformance suite on S3 (obstore) against a loopback S3-API server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dpone.adapters.objectstores.s3 import S3ObjectStore
from dpone.errors import ObjectStoreUnavailable
from dpone.testing.object_store_conformance import ObjectStoreConformance
from dpone.testing.s3_server import S3Server


def _store(server: S3Server, bucket: str, prefix: str = "") -> S3ObjectStore:
    return S3ObjectStore(
        bucket=bucket,
        prefix=prefix,
        endpoint=server.endpoint,
        access_key_id="testing",
        secret_access_key="testing",  # noqa: S106 - moto's dummy credentials
    )


class TestS3ObjectStore(ObjectStoreConformance):
    @pytest.fixture
    def store(self, s3_server: S3Server, s3_bucket: str) -> Iterator[S3ObjectStore]:
        store = _store(s3_server, s3_bucket, prefix="under/a/prefix")
        yield store
        store.close()

    def test_location_names_no_credentials(self, store: S3ObjectStore) -> None:
        """The location names endpoint, bucket and prefix, never the keys."""
        assert store.location().startswith("s3:http://127.0.0.1:")
        assert "testing" not in store.location()
        assert store.location().endswith("/under/a/prefix")


def test_missing_bucket_is_a_dpone_error(s3_server: S3Server) -> None:
    """A write into a bucket that does not exist is a typed error, not a driver traceback."""
    store = _store(s3_server, "no-such-bucket-dpone")
    with pytest.raises(ObjectStoreUnavailable):
        store.put("x", b"1")
