"""Work ``dpone run`` can start before the rest of dpone is imported.

Importing the CLI, msgspec and the runtime holds the interpreter for about 0.15 s;
hashing a large source file for its identity does not (``hashlib`` and file reads
release the GIL). So before those imports, ``dpone run`` peeks at the workload file
with a bare YAML read and, for a file source with a fixed path, starts hashing it beside
the imports (:func:`dpone.adapters.sources._prefetch.prefetch_identity`: a background
thread, or for a CSV file bound for DuckDB a forked child that also checks it). The real
run validates the workload as always and asks for the identity as always; it gets the
prefetched digest only if the file has not changed since. A workload this peek cannot
read, or one whose path depends on the interval or partition, is left alone.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["prefetch_run_source"]

#: ``dpone run`` options that take a value (the workload is the first other argument).
_VALUE_OPTIONS = frozenset(
    {"--interval", "--partition", "--log-format", "--idempotency-key", "--poll-budget"}
)
#: Smaller files hash in a few milliseconds: not worth a thread.
_MIN_BYTES = 1 << 20
_started = False
#: ``dpone.ports.source.RAW_CSV_DELIMITERS``
_PASS_THROUGH_DELIMITERS = frozenset(",;|\t")


def _workload_argument(args: list[str]) -> str | None:
    """The WORKLOAD argument of ``run ...`` arguments, or None."""
    if not args or args[0] != "run":
        return None
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            return next(rest, None)
        if arg in _VALUE_OPTIONS:
            next(rest, None)
        elif not arg.startswith("-"):
            return arg
    return None


def _checked_ahead_delimiter(source: dict[object, object], target: object) -> str | None:
    """The delimiter to check a CSV file ahead with, for a target that reads it itself.

    DuckDB scans the file with its own reader beside a Python read that checks it; the
    check can run ahead, beside start-up, instead (``_prefetch.checked_ahead``). The
    delimiters are ``dpone.ports.source.RAW_CSV_DELIMITERS`` (not imported here: it
    pulls in the contracts; a test keeps the two equal).
    """
    if source.get("kind") != "csv" or not isinstance(target, dict):
        return None
    delimiter = source.get("delimiter", ",")
    if target.get("kind") != "duckdb" or delimiter not in _PASS_THROUGH_DELIMITERS:
        return None
    return str(delimiter)


def prefetch_run_source(args: list[str]) -> None:
    """Start hashing the source file of ``dpone run WORKLOAD ...`` (``args`` after ``dpone``).

    Never raises: anything unexpected means no prefetch, and the run does its usual work.
    Only the first call in a process looks (``dpone.cli.entry`` calls it before
    importing the rest of dpone; the typer app's ``main`` calls it again).
    """
    global _started  # noqa: PLW0603 - once per process
    if _started:
        return
    _started = True
    try:
        name = _workload_argument(args)
        if name is None:
            return
        from dpone.config import _parsed

        file = Path(name)
        content = file.read_bytes()
        data = _parsed.cached(content)  # a file run before: no PyYAML (ADR 0015)
        if data is _parsed.MISS:
            import yaml

            text = content.decode("utf-8")
            if hasattr(yaml, "CSafeLoader"):  # libyaml: a safe loader, in C
                data = yaml.load(text, Loader=yaml.CSafeLoader)
            else:
                data = yaml.safe_load(text)
        if not isinstance(data, dict) or "publication" in data:
            return
        source = data.get("source")
        if not isinstance(source, dict) or source.get("kind") not in ("csv", "jsonl"):
            return
        raw = source.get("path")
        if not isinstance(raw, str) or not raw.strip() or "{" in raw:
            return
        path = Path(raw.strip()).expanduser()
        if not path.is_absolute():
            path = file.resolve().parent / path
        if os.stat(path).st_size <= _MIN_BYTES:  # read whole when it is loaded
            return
        from dpone.adapters.sources._prefetch import prefetch_identity

        prefetch_identity(path, check_csv=_checked_ahead_delimiter(source, data.get("target")))
    except Exception:  # noqa: BLE001 - a peek only: the run reports every problem
        return
