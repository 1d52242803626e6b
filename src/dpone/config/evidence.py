"""Route certification evidence on disk: where it lives and when it is valid."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["EVIDENCE_DIR", "VERIFIED", "evidence_path", "load_valid_evidence"]

VERIFIED = "VERIFIED"
#: Where evidence lives, relative to the workload file, unless told otherwise.
EVIDENCE_DIR = Path(".dpone") / "certifications"


def evidence_path(directory: Path, connector: str, database: str) -> Path:
    """The evidence file for one connector on one database (no secret in the name)."""
    digest = hashlib.sha256(f"{connector}|{database}".encode()).hexdigest()[:16]
    return directory / f"{connector}-{digest}.json"


def load_valid_evidence(
    directory: Path, *, connector: str, capability: str, database: str
) -> dict[str, Any] | None:
    """Return the evidence for this route if it exists, matches it and is VERIFIED."""
    path = evidence_path(directory, connector, database)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    matches = (
        data.get("verdict") == VERIFIED
        and data.get("connector") == connector
        and data.get("capability") == capability
        and data.get("database") == database
    )
    return data if matches else None
