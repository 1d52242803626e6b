"""What an object store reports about one stored object (ARCHITECTURE section 13)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StoredObject"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredObject:
    """One object's key, size, version tag and modification time (seconds since the epoch).

    ``etag`` is the store's version tag: a conditional update names it, and the update
    succeeds only while the object still carries it.
    """

    key: str
    size: int
    etag: str
    modified_at: float
