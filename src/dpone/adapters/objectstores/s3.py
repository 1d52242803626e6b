"""S3-compatible object store through ``obstore`` (conditional puts: If-None-Match, If-Match)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, cast

import obstore
from obstore import exceptions as oe
from obstore.store import S3Store

from dpone.adapters.objectstores.local import check_key
from dpone.contracts.objects import StoredObject
from dpone.errors import ConfigInvalid, DponeError, ObjectStoreUnavailable

__all__ = ["S3ObjectStore"]


def _translate(exc: Exception, what: str) -> DponeError:
    """The one place obstore errors become dpone errors (no URL, no credentials echoed)."""
    if isinstance(exc, oe.PermissionDeniedError | oe.UnauthenticatedError):
        return ConfigInvalid(
            f"the S3 store refused to {what} (permission denied or bad credentials)",
            field="store",
            hint="check the bucket name and the credentials the *_env variables name",
        )
    if isinstance(exc, oe.UnknownConfigurationKeyError | oe.InvalidPathError):
        return ConfigInvalid(f"the S3 store configuration is invalid ({what})", field="store")
    return ObjectStoreUnavailable(f"could not {what} in the S3 store ({type(exc).__name__})")


def _stored(key: str, meta: Mapping[str, Any]) -> StoredObject:
    modified = meta.get("last_modified")
    at = modified.timestamp() if isinstance(modified, datetime) else time.time()
    return StoredObject(
        key=key, size=int(meta.get("size") or 0), etag=str(meta.get("e_tag") or ""), modified_at=at
    )


class S3ObjectStore:
    """Objects in ``bucket`` under ``prefix``; every write is one PUT (atomic per object).

    Args:
        bucket: the bucket name.
        prefix: a key prefix inside the bucket ("" for none).
        endpoint: the S3 API endpoint URL (omit for AWS); http is allowed for loopback tests.
        region: the signing region.
        access_key_id: credential (resolved by the composition root, never stored or shown).
        secret_access_key: credential (as above).
        timeout_s: per-request timeout.
    """

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint: str | None = None,
        region: str = "us-east-1",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        if not bucket:
            raise ConfigInvalid("the S3 store needs a bucket", field="store.bucket")
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self._endpoint = endpoint
        config: dict[str, Any] = {"region": region}
        if access_key_id is not None:
            config["access_key_id"] = access_key_id
        if secret_access_key is not None:
            config["secret_access_key"] = secret_access_key
        if endpoint is not None:
            config["endpoint"] = endpoint
            config["virtual_hosted_style_request"] = False
        try:
            self._store = S3Store(
                bucket,
                prefix=self._prefix or None,
                config=cast(Any, config),
                client_options={
                    "allow_http": bool(endpoint and endpoint.startswith("http://")),
                    "timeout": timedelta(seconds=timeout_s),
                },
                retry_config={
                    "max_retries": 3,
                    "retry_timeout": timedelta(seconds=timeout_s),
                    "backoff": {
                        "init_backoff": timedelta(milliseconds=100),
                        "max_backoff": timedelta(seconds=1),
                        "base": 2.0,
                    },
                },
            )
        except Exception as exc:  # noqa: BLE001 - driver errors are translated in one place
            raise _translate(exc, "open the bucket") from None

    @property
    def kind(self) -> str:
        """Adapter name."""
        return "s3"

    def location(self) -> str:
        """Return ``s3:<endpoint or aws>/<bucket>/<prefix>`` (never credentials)."""
        where = (self._endpoint or "aws").split("@")[-1]
        return f"s3:{where}/{self._bucket}/{self._prefix}".rstrip("/")

    def read(self, key: str) -> tuple[bytes, StoredObject] | None:
        """GET the object; None on 404."""
        try:
            result = obstore.get(self._store, check_key(key))
            data = bytes(result.bytes())
        except (oe.NotFoundError, FileNotFoundError):
            return None
        except DponeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, "read an object") from None
        return data, _stored(key, result.meta)

    def head(self, key: str) -> StoredObject | None:
        """HEAD the object; None on 404."""
        try:
            meta = obstore.head(self._store, check_key(key))
        except (oe.NotFoundError, FileNotFoundError):
            return None
        except DponeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, "describe an object") from None
        return _stored(key, meta)

    def list(self, prefix: str) -> list[StoredObject]:
        """LIST every object under the directory ``prefix``."""
        clean = prefix.strip("/")
        try:
            stream = obstore.list(self._store, prefix=check_key(clean) if clean else None)
            metas = stream.collect()
        except DponeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, "list objects") from None
        return sorted((_stored(str(m["path"]), m) for m in metas), key=lambda o: o.key)

    def put(self, key: str, data: bytes) -> StoredObject:
        """PUT unconditionally."""
        written = self._put(key, data, mode="overwrite", what="write an object")
        if written is None:  # pragma: no cover - an unconditional PUT has no precondition
            raise ObjectStoreUnavailable("an unconditional write was refused")
        return written

    def put_if_absent(self, key: str, data: bytes) -> StoredObject | None:
        """PUT with ``If-None-Match: *``; None when the key exists (412)."""
        return self._put(key, data, mode="create", what="create an object")

    def put_if_match(self, key: str, data: bytes, *, etag: str) -> StoredObject | None:
        """PUT with ``If-Match: etag``; None when the tag differs (412) or the key is gone."""
        return self._put(key, data, mode={"e_tag": etag}, what="update an object")

    def _put(self, key: str, data: bytes, *, mode: Any, what: str) -> StoredObject | None:
        try:
            result = obstore.put(self._store, check_key(key), data, mode=mode)
        except (oe.AlreadyExistsError, oe.PreconditionError):
            return None
        except (oe.NotFoundError, FileNotFoundError):
            if mode in ("overwrite", "create"):
                raise ObjectStoreUnavailable(f"could not {what}: the bucket is missing") from None
            return None
        except DponeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, what) from None
        return StoredObject(
            key=key, size=len(data), etag=str(result.get("e_tag") or ""), modified_at=time.time()
        )

    def delete(self, key: str) -> None:
        """DELETE (absent is fine)."""
        try:
            obstore.delete(self._store, check_key(key))
        except (oe.NotFoundError, FileNotFoundError):
            return
        except DponeError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _translate(exc, "delete an object") from None

    def close(self) -> None:
        """The client holds no resources that need closing. Idempotent."""
