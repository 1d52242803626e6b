"""Serve the reference receiver with uvicorn on a listening socket handed down by the parent.

``python -m dpone.testing.rest_receiver --db FILE --fd N [--token-env NAME]``
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import uvicorn

from dpone.testing.rest_receiver.app import create_app


def main() -> None:
    parser = argparse.ArgumentParser(prog="dpone.testing.rest_receiver")
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--fd", required=True, type=int)
    parser.add_argument("--token-env", default=None)
    parser.add_argument("--max-chunk-bytes", type=int, default=1 << 20)
    args = parser.parse_args()
    token = os.environ.get(args.token_env) if args.token_env else None
    app = create_app(args.db, token=token, max_chunk_bytes=args.max_chunk_bytes)
    sock = socket.socket(fileno=args.fd)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
