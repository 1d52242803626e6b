"""A private, throwaway PostgreSQL server for tests that stop or restart the database.

``initdb`` + ``pg_ctl`` under a temporary directory on a free port; never the shared
server. PostgreSQL refuses to run as root, so as root the server runs as the
``postgres`` OS user (``runuser``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["PrivatePostgres", "find_pg_bin"]


def find_pg_bin() -> Path:
    """Return the directory holding initdb and pg_ctl."""
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    if not candidates:
        raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    return Path(candidates[0]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """One private PostgreSQL cluster; ``start``/``stop``/``restart`` as the test needs."""

    def __init__(self, *, base: Path | None = None) -> None:
        self.bin = find_pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="dpone-pg-", dir=base))
        self.data = self.root / "data"
        self.sockets = self.root / "run"
        self.port = _free_port()
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self.sockets.mkdir()
        if self._as_root:
            shutil.chown(self.sockets, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.sockets}'\nfsync = on\n"
                "max_connections = 60\nshared_buffers = 32MB\n"
            )

    @property
    def dsn(self) -> str:
        """DSN of the ``postgres`` database on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bin / tool), *args]
        if self._as_root:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "start")

    def stop(self, *, mode: str = "fast") -> None:
        """Stop the server (``fast`` rolls back open transactions; ``immediate`` crashes it)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Stop and start again."""
        self.stop()
        self.start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until a TCP connection succeeds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise TimeoutError("private PostgreSQL did not come up")

    def destroy(self) -> None:
        """Stop the server if it runs and remove its files."""
        try:
            self.stop(mode="immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()
