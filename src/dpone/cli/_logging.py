"""The CLI's log formats and console handler (imported when a record is to be written).

``dpone.cli._run`` configures them (``_setup_logging``); a quiet run that never warns
never imports this module, nor :mod:`logging` itself (``dpone.runtime._log``).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from dpone.cli._run import err

__all__ = ["ConsoleHandler", "JsonFormatter", "TextFormatter"]


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update(getattr(record, "dpone", {}) or {})
        return json.dumps(payload, sort_keys=True, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "dpone", {}) or {}
        op = str(fields.get("operation_id", ""))
        short = op[:19] + "…" if len(op) > 20 else op
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        if "state" in fields and "version" in fields:
            text = (
                f"{fields.get('event', ''):<10} {fields['state']} v{fields['version']} "
                f"epoch {fields.get('lease_epoch', '-')}"
            )
        else:
            text = record.getMessage()
        return f"dpone {short} {level}{text}"


class ConsoleHandler(logging.Handler):
    """Writes through the shared stderr console so logs and the progress bar don't tear."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            err.print(self.format(record), markup=False, highlight=False)
        except Exception:  # noqa: BLE001 - logging must never break the run
            self.handleError(record)
