"""REST bulk-delivery sink on httpx: chunked upload, keyed submit, GET observation.

Receiver contract (the reference receiver in ``dpone.testing.rest_receiver`` follows it):
``PUT {base}/uploads/{upload_id}/chunks/{seq}``, ``POST {base}/jobs`` with
``Idempotency-Key``, ``GET {base}/jobs/{receipt}``, ``GET {base}/jobs?idempotency_key=K``.
A ``503`` or ``429`` answer to a submit must mean "nothing was recorded".

Credentials come from a reference resolved on every request in this process:
``env:NAME`` (an environment variable) or ``file:PATH`` (a file holding the token,
re-read so rotation works). The value is never stored, logged or put in an error.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Generator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from dpone.contracts.delivery import (
    JobObservation,
    KeyLookup,
    LookupAbsent,
    LookupFound,
    LookupUnsupported,
    PayloadRef,
    RemoteStatus,
    SubmitAccepted,
    SubmitInconclusive,
    SubmitOutcome,
    SubmitRefused,
)
from dpone.contracts.fence import FenceCapability
from dpone.errors import (
    ConfigInvalid,
    DeliveryCredentialRefused,
    DeliveryRejected,
    ReceiverUnavailable,
    SourceInvalid,
)

__all__ = ["KIND", "RestDeliverySink", "check_credential_ref", "normalize_receiver_url"]

KIND = "rest"
log = logging.getLogger("dpone.delivery")

_CRED_RE = re.compile(r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:.+)$")
_CODE_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_RECEIPT_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_TRANSIENT_STATUS = frozenset({429, 503})


def normalize_receiver_url(url: str) -> str:
    """Return ``scheme://host[:port]/path`` without user info, query or trailing slash.

    Raises:
        ConfigInvalid: not an http(s) URL, or it carries user info or a query.

    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigInvalid(
            "the receiver URL must be http(s)://host[:port][/path]", field="receiver.url"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigInvalid(
            "the receiver URL may not carry user info, a query or a fragment; name the "
            "credential with receiver.credential (env:NAME or file:PATH)",
            field="receiver.url",
        )
    netloc = parts.hostname.lower() + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def check_credential_ref(ref: str | None) -> str | None:
    """Return ``ref`` when it is ``env:NAME`` or ``file:PATH`` (or None).

    Raises:
        ConfigInvalid: anything else, e.g. a token pasted as the value.

    """
    if ref is None:
        return None
    if not _CRED_RE.match(ref):
        raise ConfigInvalid(
            "the receiver credential must be a reference, env:NAME or file:PATH, never "
            "the token itself",
            field="receiver.credential",
        )
    return ref


class _BearerFromRef(httpx.Auth):
    """Adds ``Authorization: Bearer <token>``, resolving the token for every request."""

    def __init__(self, ref: str) -> None:
        self._ref = ref

    def _token(self) -> str:
        kind, _, name = self._ref.partition(":")
        if kind == "env":
            value = os.environ.get(name)
            if not value:
                raise ConfigInvalid(
                    f"the receiver credential variable {name} is not set in this process",
                    field="receiver.credential",
                )
            return value.strip()
        try:
            return Path(name).read_text(encoding="utf-8").strip()
        except OSError:
            raise ConfigInvalid(
                "the receiver credential file cannot be read", field="receiver.credential"
            ) from None

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token()}"
        yield request


def _upload_id(operation_id: str, digest: str) -> str:
    """A stable upload id per (operation, payload): a re-upload replaces nothing."""
    return "u-" + hashlib.sha256(f"{operation_id}\n{digest}".encode()).hexdigest()[:40]


def _error_code(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"http_{response.status_code}"
    code = body.get("error") if isinstance(body, dict) else None
    return (
        code if isinstance(code, str) and _CODE_RE.match(code) else f"http_{response.status_code}"
    )


def _retry_after(response: httpx.Response) -> float | None:
    raw = response.headers.get("retry-after", "")
    try:
        return max(float(raw), 0.0)
    except ValueError:
        return None


def _observation(body: Any) -> JobObservation:
    """Parse a job view; raise ValueError when it is not one."""
    if not isinstance(body, dict):
        raise TypeError("job view is not an object")
    receipt = body.get("receipt")
    if not isinstance(receipt, str) or not _RECEIPT_RE.match(receipt):
        raise ValueError("job view has no valid receipt")
    status = RemoteStatus(body.get("status"))

    def count(name: str) -> int | None:
        value = body.get(name)
        return value if isinstance(value, int) and value >= 0 else None

    digest = body.get("payload_digest")
    return JobObservation(
        receipt=receipt,
        status=status,
        payload_digest=digest if isinstance(digest, str) else None,
        rows_total=count("rows_total"),
        rows_processed=count("rows_processed"),
        rows_failed=count("rows_failed"),
    )


class RestDeliverySink:
    """A DeliverySinkPort for a receiver speaking the contract in this module's docstring.

    Args:
        base_url: the receiver's base URL (no credentials in it).
        credential_ref: ``env:NAME`` or ``file:PATH`` naming a bearer token, or None.
        timeout_s: connect/read/write timeout of one request.
        transport: an httpx transport (tests only).

    """

    def __init__(
        self,
        base_url: str,
        *,
        credential_ref: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._base = normalize_receiver_url(base_url)
        self._cred = check_credential_ref(credential_ref)
        self._client = httpx.Client(
            base_url=self._base,
            timeout=httpx.Timeout(timeout_s),
            auth=_BearerFromRef(self._cred) if self._cred else None,
            transport=transport,
            follow_redirects=False,
            trust_env=False,
        )

    # ------------------------------------------------------------------ identity
    @property
    def capability(self) -> FenceCapability:
        """Receivers of this contract dedupe by key and answer key lookups."""
        return FenceCapability.IDEMPOTENCY_KEY

    def receiver_identity(self) -> str:
        """``rest:`` + the normalized base URL."""
        return f"{KIND}:{self._base}"

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    # ------------------------------------------------------------------ calls
    def _unavailable(self, what: str, exc: Exception | None = None) -> ReceiverUnavailable:
        detail = f" ({type(exc).__name__})" if exc is not None else ""
        return ReceiverUnavailable(
            f"the receiver {self.receiver_identity()} did not answer the {what}{detail}; "
            "nothing was decided, try again later"
        )

    def upload(self, *, operation_id: str, payload: PayloadRef) -> None:
        """PUT the staged file chunk by chunk; chunks the receiver has are accepted again."""
        upload_id = _upload_id(operation_id, payload.digest)
        try:
            handle = Path(payload.path).open("rb")  # noqa: SIM115 - closed below
        except OSError:
            raise SourceInvalid(
                "the staged delivery payload cannot be read", field="payload"
            ) from None
        with handle:
            for seq in range(payload.chunk_count):
                data = handle.read(payload.chunk_bytes)
                try:
                    response = self._client.put(f"/uploads/{upload_id}/chunks/{seq}", content=data)
                except httpx.HTTPError as exc:
                    raise self._unavailable("chunk upload", exc) from None
                if response.status_code in (200, 201):
                    continue
                if response.status_code in _TRANSIENT_STATUS or response.status_code >= 500:
                    raise self._unavailable("chunk upload")
                raise DeliveryRejected(
                    f"the receiver refused chunk {seq} with HTTP {response.status_code} "
                    f"({_error_code(response)})",
                    operation_id=operation_id,
                )
        log.info(
            "payload uploaded",
            extra={"dpone": {"operation_id": operation_id, "chunks": payload.chunk_count}},
        )

    def submit(self, *, operation_id: str, payload: PayloadRef) -> SubmitOutcome:
        """POST the job with ``Idempotency-Key: <operation_id>`` and classify the answer."""
        body = {
            "upload_id": _upload_id(operation_id, payload.digest),
            "chunk_count": payload.chunk_count,
            "payload_digest": payload.digest,
        }
        try:
            response = self._client.post(
                "/jobs", json=body, headers={"Idempotency-Key": operation_id}
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
            # no connection was made, so no request reached the receiver
            return SubmitRefused(transient=True, http_status=None, reason="connect_failed")
        except ConfigInvalid:
            # the credential could not be resolved: the request was never sent
            return SubmitRefused(transient=True, http_status=None, reason="credential_unavailable")
        except httpx.HTTPError as exc:
            return SubmitInconclusive(reason=type(exc).__name__)
        status = response.status_code
        if status in (200, 201, 202):
            try:
                observation = _observation(response.json())
            except (ValueError, TypeError):
                return SubmitInconclusive(reason=f"http_{status}_unreadable")
            return SubmitAccepted(
                observation=observation,
                replayed=response.headers.get("idempotent-replayed", "").lower() == "true",
                http_status=status,
            )
        if status in _TRANSIENT_STATUS:
            return SubmitRefused(
                transient=True,
                http_status=status,
                reason=_error_code(response),
                retry_after_s=_retry_after(response),
            )
        if 400 <= status < 500:
            return SubmitRefused(transient=False, http_status=status, reason=_error_code(response))
        return SubmitInconclusive(reason=f"http_{status}")

    def observe(self, *, receipt: str) -> JobObservation:
        """GET the job by receipt."""
        if not _RECEIPT_RE.match(receipt):
            raise DeliveryRejected("the recorded receipt is malformed")
        try:
            response = self._client.get(f"/jobs/{receipt}")
        except httpx.HTTPError as exc:
            raise self._unavailable("status request", exc) from None
        if response.status_code == 200:
            try:
                return _observation(response.json())
            except (ValueError, TypeError):
                raise self._unavailable("status request (unreadable answer)") from None
        if response.status_code == 404:
            raise DeliveryRejected(f"the receiver does not know the receipt {receipt}")
        if response.status_code in (401, 403):
            # a status GET decides nothing: a stale or rotating credential is retryable
            raise DeliveryCredentialRefused(
                f"the receiver refused the credential {self._cred or '(none)'} on a "
                f"status request (HTTP {response.status_code}); the delivery keeps its "
                "receipt, fix the credential and run it again"
            )
        raise self._unavailable(f"status request (HTTP {response.status_code})")

    def lookup(self, *, operation_id: str) -> KeyLookup:
        """GET the jobs recorded under the key ``operation_id``."""
        try:
            response = self._client.get("/jobs", params={"idempotency_key": operation_id})
        except httpx.HTTPError as exc:
            raise self._unavailable("key lookup", exc) from None
        status = response.status_code
        if status in (404, 405, 501):
            return LookupUnsupported(http_status=status)
        if status != 200:
            raise self._unavailable(f"key lookup (HTTP {status})")
        try:
            body = response.json()
            jobs = tuple(_observation(job) for job in body["jobs"])
        except (ValueError, KeyError, TypeError):
            raise self._unavailable("key lookup (unreadable answer)") from None
        return LookupFound(jobs=jobs) if jobs else LookupAbsent()
