"""The object store port: keyed immutable-ish blobs with conditional writes (section 13)."""

from __future__ import annotations

from typing import Protocol

from dpone.contracts.objects import StoredObject

__all__ = ["ObjectStorePort"]


class ObjectStorePort(Protocol):
    """A flat namespace of keys (``a/b/c.parquet``) holding bytes.

    Keys are relative, ``/``-separated, without ``..`` or a leading ``/``. Every write of
    one object is atomic: a reader sees the old bytes or the new bytes, never a mix.
    Adapters translate their driver's errors in one place into ``ObjectStoreUnavailable``
    (transient) or ``ConfigInvalid`` (a bad location or credentials); nothing raw escapes.
    Expected outcomes (absent object, lost condition) are return values, not exceptions.
    """

    @property
    def kind(self) -> str:
        """Adapter name, e.g. ``local`` or ``s3``."""
        ...

    def location(self) -> str:
        """Return kind + normalized location (directory, bucket and prefix), never credentials."""
        ...

    def read(self, key: str) -> tuple[bytes, StoredObject] | None:
        """Return the object's bytes and description, or None when it does not exist."""
        ...

    def head(self, key: str) -> StoredObject | None:
        """Return the object's description without its bytes, or None when absent."""
        ...

    def put(self, key: str, data: bytes) -> StoredObject:
        """Create or replace ``key`` unconditionally and durably; return the new description."""
        ...

    def put_if_absent(self, key: str, data: bytes) -> StoredObject | None:
        """Create ``key`` only if no object has it (If-None-Match: *).

        Returns the new description, or None when the key already existed (nothing written).
        Of two racing callers exactly one gets a description.
        """
        ...

    def put_if_match(self, key: str, data: bytes, *, etag: str) -> StoredObject | None:
        """Replace ``key`` only while it still carries ``etag`` (If-Match).

        Returns the new description, or None when the object is absent or carries another
        tag (nothing written). Of two racing callers holding the same tag exactly one wins.
        """
        ...

    def list(self, prefix: str) -> list[StoredObject]:
        """Return every object whose key starts with ``prefix``, sorted by key."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key``; removing an absent key is not an error."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent."""
        ...
