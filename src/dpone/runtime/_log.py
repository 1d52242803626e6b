"""The runtime's loggers: :mod:`logging` is imported only when a record can be emitted.

Until something imports ``logging`` no handler, level or filter can exist, so the root
logger's default level (WARNING) drops every INFO record. A :class:`LazyLogger` drops
those without importing logging (about 3 ms of a one-file load's start-up, with
``traceback``, ``tokenize`` and ``string``); a WARNING or worse, and any record once
logging is loaded, goes to the real logger as usual. A quiet ``dpone run`` therefore
never loads logging unless something warns. The CLI configures its handlers then, not
before: :func:`defer_setup` runs its setup just before the first record is passed on.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import logging

__all__ = ["LazyLogger", "defer_setup"]

_pending: list[Callable[[], None]] = []
_lock = threading.Lock()


def defer_setup(setup: Callable[[], None]) -> None:
    """Run ``setup`` (configuring logging) just before the first record is passed on."""
    with _lock:
        _pending.append(setup)


def _run_pending() -> None:
    with _lock:
        while _pending:
            _pending.pop(0)()


class LazyLogger:
    """A ``logging.Logger`` stand-in for ``debug``/``info``/``warning``/``error``."""

    __slots__ = ("_logger", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: logging.Logger | None = None

    def _real(self) -> logging.Logger:
        import logging

        if _pending:
            _run_pending()
        if self._logger is None:
            self._logger = logging.getLogger(self.name)
        return self._logger

    @staticmethod
    def _caller(kwargs: dict[str, Any]) -> dict[str, Any]:
        # The record names the runtime's line, not this proxy's.
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
        return kwargs

    def info_enabled(self) -> bool:
        """Whether an INFO record would be passed on (False while logging is not loaded)."""
        if "logging" not in sys.modules:
            return False
        import logging

        return self._real().isEnabledFor(logging.INFO)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self._real().debug(msg, *args, **self._caller(kwargs))

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        if "logging" in sys.modules:
            self._real().info(msg, *args, **self._caller(kwargs))

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._real().warning(msg, *args, **self._caller(kwargs))

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._real().error(msg, *args, **self._caller(kwargs))
