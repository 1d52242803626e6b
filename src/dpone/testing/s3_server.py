"""A loopback S3-API server for tests: moto's server, one request at a time (ADR 0006).

moto checks ``If-None-Match`` / ``If-Match`` and then writes, without a lock of its own;
served by a single-threaded WSGI server, each request runs to its end before the next
starts, so a conditional put is one atomic step, as on S3 itself.

Run ``python -m dpone.testing.s3_server`` to serve on a free port; it prints
``PORT <n>`` once it accepts connections. Tests use :func:`start_s3_server`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field

__all__ = ["S3Server", "start_s3_server"]


@dataclass(slots=True)
class S3Server:
    """A running server process with its endpoint; ``stop()`` ends it."""

    endpoint: str
    process: subprocess.Popen[str] = field(repr=False)

    def create_bucket(self, name: str) -> None:
        """Create ``name`` (moto accepts an unsigned PUT)."""
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")  # noqa: S310
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            response.read()

    def stop(self) -> None:
        """End the server process (only this one, by its pid)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_s3_server() -> S3Server:
    """Start the server on 127.0.0.1 and a free port; return once it accepts connections."""
    env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dpone.testing.s3_server"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("PORT "):
        process.kill()
        process.wait()
        raise RuntimeError("the loopback S3 server did not start")
    return S3Server(endpoint=f"http://127.0.0.1:{int(line.split()[1])}", process=process)


def _serve() -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)
    # threaded=False: one request at a time, so moto's check-then-write is atomic
    server = make_server("127.0.0.1", 0, app, threaded=False, request_handler=MotoRequestHandler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.stdout.write(f"PORT {server.server_address[1]}\n")
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    _serve()
