"""The reference REST bulk receiver as a Starlette (ASGI) application.

API (JSON unless noted; every non-admin call needs ``Authorization: Bearer <token>``
when the receiver was started with a token):

- ``PUT /uploads/{upload_id}/chunks/{seq}`` (raw bytes, at most ``max_chunk_bytes``):
  ``201`` new, ``200`` the same bytes again, ``409`` other bytes for that chunk.
- ``POST /jobs`` with ``Idempotency-Key`` and ``{"upload_id", "chunk_count",
  "payload_digest"}``: ``202 {"receipt", "status", ...}``; the same key and digest
  again: ``202`` with the same receipt and ``Idempotent-Replayed: true``; the same key
  with another digest: ``409``; chunks missing or not matching the digest: ``422``.
- ``GET|HEAD /jobs/{receipt}``: status ``accepted|running|succeeded|failed|cancelled``
  with ``rows_total``, ``rows_processed``, ``rows_failed``.
- ``GET /jobs?idempotency_key=K``: ``{"jobs": [...]}``; ``501`` when key lookup is off.
- Admin (tests only, no auth): ``GET|PUT /admin/faults``, ``POST
  /admin/jobs/{receipt}/cancel``, ``GET /admin/stats``, ``GET /health``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from dpone.testing.rest_receiver._store import ReceiverStore, UploadConflict, UploadInvalid

__all__ = ["create_app"]

_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class _DroppedResponse(Response):
    """Start a 202 answer and cut the connection: the job exists, the client never learns."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 202,
                "headers": [(b"content-length", b"4096"), (b"content-type", b"application/json")],
            }
        )
        raise ConnectionAbortedError("fault switch: answer dropped after accepting")


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def create_app(
    db_path: Path, *, token: str | None = None, max_chunk_bytes: int = 1 << 20
) -> Starlette:
    """Build the receiver app on the SQLite file ``db_path``."""
    store_box: dict[str, ReceiverStore] = {}

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        store_box["store"] = ReceiverStore(db_path)
        try:
            yield
        finally:
            store_box.pop("store").close()

    def store() -> ReceiverStore:
        return store_box["store"]

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        return request.headers.get("authorization", "") == f"Bearer {token}"

    def unauthorized() -> JSONResponse:
        return _error(401, "unauthorized", "a valid bearer token is required")

    async def health(_request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def put_chunk(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        upload_id = request.path_params["upload_id"]
        seq = request.path_params["seq"]
        if not _ID_RE.match(upload_id) or seq < 0:
            return _error(400, "bad_upload", "upload id or chunk number is malformed")
        data = await request.body()
        if len(data) > max_chunk_bytes:
            return _error(413, "chunk_too_large", f"a chunk may hold {max_chunk_bytes} bytes")
        try:
            created = store().put_chunk(upload_id, seq, data)
        except UploadConflict:
            return _error(409, "chunk_conflict", "this chunk was uploaded with other bytes")
        return JSONResponse(
            {"upload_id": upload_id, "seq": seq}, status_code=201 if created else 200
        )

    async def submit(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        st = store()
        st.bump("submits")
        if st.take_fault("unavailable_before_accept"):
            return JSONResponse(
                {"error": "unavailable", "message": "try again later"},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        faults = st.faults()
        if float(faults["submit_delay_s"]) > 0:
            await asyncio.sleep(float(faults["submit_delay_s"]))
        key = request.headers.get("idempotency-key", "")
        if not _ID_RE.match(key):
            return _error(400, "idempotency_key_required", "send an Idempotency-Key header")
        try:
            body: Any = await request.json()
        except ValueError:
            return _error(400, "bad_json", "the body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "bad_json", "the body must be a JSON object")
        upload_id = body.get("upload_id")
        chunk_count = body.get("chunk_count")
        digest = body.get("payload_digest")
        if (
            not isinstance(upload_id, str)
            or not _ID_RE.match(upload_id)
            or not isinstance(chunk_count, int)
            or chunk_count < 0
            or not isinstance(digest, str)
            or not _DIGEST_RE.match(digest)
        ):
            return _error(422, "bad_submission", "upload_id, chunk_count, payload_digest needed")
        try:
            job = st.submit(
                key=key, payload_digest=digest, upload_id=upload_id, chunk_count=chunk_count
            )
        except ValueError:
            return _error(
                409, "idempotency_key_reused", "this key was used with another payload digest"
            )
        except UploadInvalid as exc:
            return _error(422, "upload_invalid", str(exc))
        if not job.replayed and st.take_fault("drop_response_after_accept"):
            return _DroppedResponse()
        headers = {"Idempotent-Replayed": "true"} if job.replayed else {}
        return JSONResponse(job.view(time.time()), status_code=202, headers=headers)

    async def get_job(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        job = store().get(request.path_params["receipt"])
        if job is None:
            return _error(404, "unknown_receipt", "no job has this receipt")
        return JSONResponse(job.view(time.time()))

    async def find_jobs(request: Request) -> Response:
        if not authorized(request):
            return unauthorized()
        st = store()
        if not st.faults()["key_lookup"]:
            return _error(501, "key_lookup_unsupported", "this receiver cannot look up keys")
        key = request.query_params.get("idempotency_key", "")
        if not _ID_RE.match(key):
            return _error(400, "idempotency_key_required", "pass ?idempotency_key=K")
        st.bump("lookups")
        now = time.time()
        return JSONResponse({"jobs": [job.view(now) for job in st.find_by_key(key)]})

    async def get_faults(_request: Request) -> Response:
        return JSONResponse(store().faults())

    async def put_faults(request: Request) -> Response:
        changes = await request.json()
        try:
            return JSONResponse(store().set_faults(changes))
        except KeyError as exc:
            return _error(400, "unknown_fault", f"no fault switch {exc}")

    async def cancel(request: Request) -> Response:
        job = store().cancel(request.path_params["receipt"])
        if job is None:
            return _error(404, "unknown_receipt", "no job has this receipt")
        return JSONResponse(job.view(time.time()))

    async def stats(_request: Request) -> Response:
        return JSONResponse(store().stats())

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/uploads/{upload_id}/chunks/{seq:int}", put_chunk, methods=["PUT"]),
        Route("/jobs", submit, methods=["POST"]),
        Route("/jobs", find_jobs, methods=["GET"]),
        Route("/jobs/{receipt}", get_job, methods=["GET"]),
        Route("/admin/faults", get_faults, methods=["GET"]),
        Route("/admin/faults", put_faults, methods=["PUT"]),
        Route("/admin/jobs/{receipt}/cancel", cancel, methods=["POST"]),
        Route("/admin/stats", stats, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
