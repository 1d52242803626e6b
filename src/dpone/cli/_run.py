"""``dpone run`` without typer, and the output helpers every command shares.

``dpone run WORKLOAD ...`` (``dpone.cli.entry``: the script and ``python -m dpone``) tries
:func:`fast_run`: for the documented ``run`` options it parses the arguments itself
and runs, so a short load does not pay for importing and running the CLI framework
(typer's import and parse are about 30 ms of a 1M-row PostgreSQL load's start-up).
Anything else (``--help``, an unknown or repeated option, a publication workload)
returns None and the typer command handles it; both paths run :func:`run_loaded`, so
their output, logging and exit codes are the same. Nothing here imports typer.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpone.errors import (
    CommittedIncomplete,
    CommitUnknown,
    ConfigInvalid,
    DponeError,
    IntentConflict,
    LeaseHeld,
    UnsafeValue,
)
from dpone.runtime._log import defer_setup
from dpone.runtime.retry import silence_stamina_hooks

if TYPE_CHECKING:
    from rich.console import Console

    from dpone.config.workload import Workload

__all__ = [
    "EXIT_COMMITTED_INCOMPLETE",
    "EXIT_COMMIT_UNKNOWN",
    "EXIT_FAILED",
    "EXIT_INTENT_CONFLICT",
    "EXIT_LEASE_HELD",
    "EXIT_OK",
    "EXIT_RETRYABLE",
    "EXIT_USAGE",
    "LogFormat",
    "err",
    "exit_code_for",
    "fast_run",
    "out",
    "print_error",
    "run_loaded",
]


class _LazyConsole:
    """A rich ``Console`` built on first use.

    rich's console, tables and progress bars are imported only by the commands that
    print through them: a quiet ``dpone run`` in a pipeline never loads them.
    """

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        """The real console."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


out = _LazyConsole(highlight=False, soft_wrap=True)
err = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)

#: Documented exit codes (README "Exit codes").
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_COMMIT_UNKNOWN = 3
EXIT_INTENT_CONFLICT = 4
EXIT_LEASE_HELD = 5
EXIT_COMMITTED_INCOMPLETE = 6
EXIT_RETRYABLE = 75


def exit_code_for(exc: DponeError) -> int:
    """Map an error family to its documented exit code."""
    if isinstance(exc, ConfigInvalid | UnsafeValue):
        return EXIT_USAGE
    if isinstance(exc, CommitUnknown):
        return EXIT_COMMIT_UNKNOWN
    if isinstance(exc, IntentConflict):
        return EXIT_INTENT_CONFLICT
    if isinstance(exc, LeaseHeld):
        return EXIT_LEASE_HELD
    if isinstance(exc, CommittedIncomplete):
        return EXIT_COMMITTED_INCOMPLETE
    if exc.retryable:
        return EXIT_RETRYABLE
    return EXIT_FAILED


class LogFormat(str, Enum):
    text = "text"
    json = "json"


# ------------------------------------------------------------------ logging
def _setup_logging(fmt: LogFormat, quiet: bool, *, lazy: bool = False) -> None:
    """Send dpone's records to stderr (text or JSON); WARNING and up only when ``quiet``.

    ``lazy``: for a quiet run whose only loggers are the runtime's (``dpone.runtime._log``)
    and whose process has not loaded ``logging``, the setup waits for the first record
    they pass on; without a warning, logging is never loaded.
    """
    silence_stamina_hooks()  # dpone logs each retry itself
    if lazy and quiet and "logging" not in sys.modules:
        defer_setup(lambda: _configure_logging(fmt, quiet))
        return
    _configure_logging(fmt, quiet)


def _configure_logging(fmt: LogFormat, quiet: bool) -> None:
    import logging

    from dpone.cli._logging import ConsoleHandler, JsonFormatter, TextFormatter

    logger = logging.getLogger("dpone")
    logger.handlers.clear()
    handler: logging.Handler
    if fmt is LogFormat.json:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    else:
        handler = ConsoleHandler()
        handler.setFormatter(TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False


# ------------------------------------------------------------------ errors
def print_error(exc: DponeError, *, as_json: bool) -> int:
    """Print a typed error (text on stderr, or JSON on stdout); return its exit code."""
    code = exit_code_for(exc)
    if as_json:
        out.print_json(json.dumps({"error": exc.attrs(), "exit_code": code}))
    else:
        err.print("error", style="bold red", end=" ")
        err.print(f"{exc.code.value}: {exc.message}", markup=False, highlight=False)
        if exc.hint:
            err.print(f"  fix: {exc.hint}", markup=False)
        if exc.recovery_ref:
            err.print(f"  next: {exc.recovery_ref}", markup=False)
        if exc.operation_id:
            where = [f"state {exc.state}"] if exc.state else []
            if exc.journal_version is not None:
                where.append(f"version {exc.journal_version}")
            state = f" ({', '.join(where)})" if where else ""
            err.print(f"  operation: {exc.operation_id}{state}", markup=False)
    return code


INTERRUPTED = "interrupted; rerun the same command to resume safely"


def _cli_provenance() -> Any:
    """Who ran this command: OS user, host and the command line (checked for secrets)."""
    import socket

    from dpone.contracts.run import CliProvenance

    command = " ".join(["dpone", *sys.argv[1:]])[:500]
    return CliProvenance(user=_user(), host=socket.gethostname(), command=command)


def _user() -> str:
    """What ``getpass.getuser()`` answers, without importing getpass (and termios)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if user := os.environ.get(name):
            return user
    import pwd

    return pwd.getpwuid(os.getuid())[0]


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int], None] | None]:
    if not enabled:
        yield None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]loading[/] {task.completed:,.0f} rows"),
        TimeElapsedColumn(),
        console=err.console,
        transient=True,
    ) as bar:
        task = bar.add_task("rows", total=None)
        yield lambda n: bar.advance(task, n)


def _stderr_is_terminal() -> bool:
    """rich's answer for stderr, without importing rich when it can only be no.

    rich says yes only for a TTY or when ``TTY_COMPATIBLE`` / ``FORCE_COLOR`` says so; a
    run in a pipeline (the usual case) then never loads it.
    """
    try:
        tty = sys.stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty and "TTY_COMPATIBLE" not in os.environ and "FORCE_COLOR" not in os.environ:
        return False
    return bool(err.is_terminal)


# ------------------------------------------------------------------ run
def run_loaded(
    workload: Workload,
    *,
    interval: str | None,
    partition: str | None,
    as_json: bool,
    log_format: LogFormat,
    progress: bool | None,
    quiet: bool,
    idempotency_key: str | None,
) -> int:
    """Run one operation of a loaded (non-publication) workload; print; return the exit code."""
    from dpone.api import run_operation

    _setup_logging(log_format, quiet, lazy=True)  # a relational load logs through the runtime
    show = _stderr_is_terminal() if progress is None else progress
    try:
        with _progress(show and log_format is LogFormat.text) as on_rows:
            result = run_operation(
                workload,
                interval=interval,
                partition=partition,
                on_rows=on_rows,
                idempotency_key=idempotency_key,
                provenance=_cli_provenance(),
            )
    except DponeError as exc:
        return print_error(exc, as_json=as_json)
    except KeyboardInterrupt:
        err.print(INTERRUPTED)
        return 130
    if as_json:
        out.print_json(json.dumps(result.summary(), default=str))
        return EXIT_OK
    note = (
        " (already complete: recorded result returned, nothing written)" if result.replayed else ""
    )
    if result.resumed and not result.replayed:
        note = " (resumed an earlier attempt)"
    attempt = "-" if result.attempt is None else str(result.attempt)
    run_note = f" run={result.run_id} attempt={attempt}" if result.run_id else ""
    # One plain line (no markup, no wrapping): printed without loading rich.
    print(
        f"{result.state.value} {result.operation_id} "
        f"rows={'unknown' if result.rows_written is None else result.rows_written} "
        f"mode={result.mode.value} version={result.journal_version}{run_note}{note}",
        flush=True,
    )
    return EXIT_OK


#: The typer ``run`` command's options, as :func:`fast_run` reads them (a test keeps
#: the two in step): options that take a value, and flags with the value they set.
RUN_VALUE_OPTIONS = (
    "--interval",
    "--partition",
    "--log-format",
    "--idempotency-key",
    "--poll-budget",
)
RUN_FLAGS = {
    "--json": ("as_json", True),
    "--progress": ("progress", True),
    "--no-progress": ("progress", False),
    "--quiet": ("quiet", True),
    "-q": ("quiet", True),
}


def _parse_run(args: list[str]) -> dict[str, Any] | None:
    """The ``run`` command's arguments, or None for anything typer should handle."""
    if not args or args[0] != "run":
        return None
    values: dict[str, Any] = {}
    workload: str | None = None
    rest = iter(args[1:])
    for arg in rest:
        name, eq, inline = arg.partition("=")
        if name in RUN_VALUE_OPTIONS:
            value = inline if eq else next(rest, None)
            key = name[2:].replace("-", "_")
            if value is None or value.startswith("-") or key in values:
                return None
            values[key] = value
        elif arg in RUN_FLAGS:
            key, flag = RUN_FLAGS[arg]
            if key in values:
                return None
            values[key] = flag
        elif arg.startswith("-") or workload is not None or not arg:
            return None  # --help, an unknown option, a second argument: typer answers
        else:
            workload = arg
    if workload is None:
        return None
    try:
        values["log_format"] = LogFormat(values.get("log_format", "text"))
    except ValueError:
        return None
    return {
        "workload": Path(workload),
        "interval": values.get("interval"),
        "partition": values.get("partition"),
        "as_json": values.get("as_json", False),
        "log_format": values["log_format"],
        "progress": values.get("progress"),
        "quiet": values.get("quiet", False),
        "idempotency_key": values.get("idempotency_key"),
    }  # --poll-budget only concerns REST workloads, which typer runs


_tried = False


def fast_run(args: list[str]) -> int | None:
    """Run ``dpone run ...`` (``args`` after ``dpone``) without typer; None: not handled.

    Only the first call in a process tries (``dpone.cli.entry`` calls it first; the
    typer app's ``main`` calls it again, for callers that start there).
    """
    global _tried  # noqa: PLW0603 - once per process
    if _tried:
        return None
    _tried = True
    parsed = _parse_run(args)
    if parsed is None:
        return None
    from dpone.config.workload import load_workload

    try:
        workload = load_workload(parsed.pop("workload"))
    except DponeError as exc:
        return print_error(exc, as_json=parsed["as_json"])
    except KeyboardInterrupt:
        err.print(INTERRUPTED)
        return 130
    if workload.publication is not None or workload.target.kind == "rest":
        return None  # the typer command writes publications and delivers to receivers
    import dpone.api  # noqa: F401 - the rest of start-up, before the collector comes back

    # The caller turned the cyclic collector off for start-up: the modules and models it
    # builds live as long as the process, and collecting among them is wasted work (about
    # 20 ms of CPU). What exists now is frozen out of the collector's sight, as main()
    # does, so the full collections a large load triggers never re-walk it.
    gc.freeze()
    gc.enable()
    return run_loaded(workload, **parsed)
