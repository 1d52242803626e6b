"""Run the reference receiver in its own process on loopback, and drive its fault switches.

The parent binds the listening socket and hands its file descriptor to the child, so
the port is known before the child starts and a restart reuses the same port.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

__all__ = ["ReceiverProcess"]

_TOKEN_ENV = "DPONE_TEST_RECEIVER_TOKEN"  # noqa: S105 - the name of a variable, not a value


class ReceiverProcess:
    """A reference receiver served by uvicorn in a child process.

    Args:
        workdir: where the receiver keeps its SQLite file and its log.
        token: when given, every non-admin request needs ``Authorization: Bearer <token>``.
        max_chunk_bytes: the largest chunk the receiver takes (413 above).

    """

    def __init__(
        self, workdir: Path, *, token: str | None = None, max_chunk_bytes: int = 1 << 20
    ) -> None:
        self.workdir = workdir
        self.db_path = workdir / "receiver.sqlite"
        self.log_path = workdir / "receiver.log"
        self._token = token
        self._max_chunk_bytes = max_chunk_bytes
        self._proc: subprocess.Popen[bytes] | None = None
        self._client: httpx.Client | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def url(self) -> str:
        """Base URL of the receiver, e.g. ``http://127.0.0.1:41234``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._proc.pid if self._proc is not None else None

    @property
    def client(self) -> httpx.Client:
        """A plain HTTP client for tests and admin calls (one per receiver, reused)."""
        if self._client is None:
            self._client = httpx.Client(timeout=10.0)
        return self._client

    def start(self, *, timeout: float = 15.0) -> ReceiverProcess:
        """Start the child and wait until it answers ``/health``."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        env = dict(os.environ)
        argv = [
            sys.executable,
            "-m",
            "dpone.testing.rest_receiver",
            "--db",
            str(self.db_path),
            "--fd",
            str(sock.fileno()),
            "--max-chunk-bytes",
            str(self._max_chunk_bytes),
        ]
        if self._token is not None:
            env[_TOKEN_ENV] = self._token
            argv += ["--token-env", _TOKEN_ENV]
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=log, pass_fds=(sock.fileno(),)
            )
        sock.close()  # the child owns the listening socket now
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"receiver exited early; see {self.log_path}")
            try:
                if self.client.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"receiver did not answer within {timeout}s")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the child (a receiver crash); its SQLite state stays."""
        self._drop_client()
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=10)
            self._proc = None

    def stop(self) -> None:
        """Stop the child gracefully (SIGTERM, then SIGKILL after 5 s)."""
        self._drop_client()
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=5)
            self._proc = None

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def restart(self, *, hard: bool = True) -> None:
        """Kill (or stop) the child and start a new one on the same port and file."""
        if hard:
            self.kill()
        else:
            self.stop()
        self.start()

    def __enter__(self) -> ReceiverProcess:
        return self.start() if self._proc is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ admin
    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change fault switches (see ``_store.FAULT_DEFAULTS``); return all of them."""
        response = self.client.put(self.url + "/admin/faults", json=changes)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def cancel(self, receipt: str) -> dict[str, Any]:
        """Cancel a job from outside, as an operator at the receiver would."""
        response = self.client.post(self.url + f"/admin/jobs/{receipt}/cancel")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def stats(self) -> dict[str, Any]:
        """Return the receiver's counters and jobs per key."""
        response = self.client.get(self.url + "/admin/stats")
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def jobs_created(self, key: str) -> int:
        """Return how many remote jobs exist for the idempotency key ``key``."""
        return int(self.stats()["jobs_by_key"].get(key, 0))
