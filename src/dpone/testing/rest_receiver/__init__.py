"""The reference REST bulk receiver: an ASGI app with idempotency keys, state in SQLite.

Started on loopback by tests (:class:`ReceiverProcess`); see ``app`` for its API and
``_store.FAULT_DEFAULTS`` for its fault switches. Needs the ``receiver`` extra
(starlette, uvicorn, httpx).
"""

from __future__ import annotations

__all__ = ["ReceiverProcess"]

from dpone.testing.rest_receiver.process import ReceiverProcess
