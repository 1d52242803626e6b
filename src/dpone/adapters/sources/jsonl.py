"""JSON Lines file source: one object per line, scalar values, streamed in batches."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NoReturn

from dpone.adapters.sources._common import (
    SAMPLE_ROWS,
    check_identity,
    columns_of,
    declared_columns,
    decode_error,
    file_identity,
    infer_type,
    open_hashed_text,
    open_text,
)
from dpone.contracts.load import Column, ColumnType
from dpone.errors import ConfigInvalid, SourceInvalid

__all__ = ["JsonlSource"]

Batch = list[tuple[object, ...]]


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


# One decoder for the whole file: json.loads(..., parse_constant=...) would build one per line.
_DECODE = json.JSONDecoder(parse_constant=_reject_constant).decode


class JsonlSource:
    """A JSON Lines file: each non-blank line is an object of scalar values.

    Args:
        path: the file.
        columns: declared ``name -> type``. Without it the columns are the keys of the
            first 1000 objects, in the order first seen, with inferred types.

    A missing key reads as ``None``; a key outside the columns, a nested value, or a line
    that is not a JSON object raises ``SourceInvalid`` naming the line.
    """

    def __init__(
        self, path: str | Path, *, columns: Mapping[str, ColumnType | str] | None = None
    ) -> None:
        self._path = Path(path)
        self._declared = declared_columns(columns) if columns is not None else None
        self._columns: tuple[Column, ...] | None = None

    @property
    def kind(self) -> str:
        """Source kind."""
        return "jsonl"

    @property
    def path(self) -> Path:
        """The file."""
        return self._path

    def snapshot_identity(self) -> str:
        """Return ``sha256:<hex>`` of the file's bytes."""
        return file_identity(self._path)

    def columns(self) -> tuple[Column, ...]:
        """Return the declared columns, or the sample's keys with inferred types."""
        if self._columns is not None:
            return self._columns
        if self._declared is not None:
            self._columns = columns_of(self._declared, self._declared)
            return self._columns
        sample: list[dict[str, object]] = []
        with open_text(self._path) as text:
            for lineno, line in self._lines(text):
                obj = self._object(line, lineno)
                self._check_scalars(obj, lineno)
                sample.append(obj)
                if len(sample) >= SAMPLE_ROWS:
                    break
        names: dict[str, None] = {}  # insertion-ordered set
        for obj in sample:
            names.update(dict.fromkeys(obj))
        if not names:
            raise SourceInvalid(
                f"{str(self._path)!r} has no objects with keys to take columns from",
                hint="declare source.columns or add rows",
            )
        types = {n: infer_type(obj.get(n) for obj in sample) for n in names}
        self._columns = columns_of(names, types)
        return self._columns

    def _lines(self, text: Iterator[str]) -> Iterator[tuple[int, str]]:
        lineno = 0
        try:
            for lineno, line in enumerate(text, start=1):
                if line.strip():
                    yield lineno, line
        except UnicodeDecodeError as exc:
            raise decode_error(self._path, lineno + 1) from exc

    def _object(self, line: str, lineno: int) -> dict[str, object]:
        try:
            obj = _DECODE(line)
        except ValueError as exc:
            raise SourceInvalid(
                f"{str(self._path)!r}: line {lineno} is not valid JSON", hint="one object per line"
            ) from exc
        if type(obj) is not dict:
            raise SourceInvalid(f"{str(self._path)!r}: line {lineno} is not a JSON object")
        return obj

    def _check_scalars(self, obj: dict[str, object], lineno: int) -> None:
        for key, value in obj.items():
            if isinstance(value, dict | list):
                raise SourceInvalid(
                    f"{str(self._path)!r}: line {lineno}: key {key!r} holds a nested value; "
                    "only strings, numbers, booleans and null can be loaded",
                    hint="flatten the value before loading",
                )

    def batches(self, *, batch_size: int, expected_identity: str) -> Iterator[Batch]:
        """Yield rows in column order; check the bytes read against the snapshot at the end.

        Raises:
            SourceInvalid: a line is not a JSON object of scalars, has a key outside the
                columns, or the file's content is not ``expected_identity``.
        """
        if batch_size < 1:
            raise ConfigInvalid("batch_size must be at least 1", field="load.batch_size")
        names = [c.name for c in self.columns()]
        known = frozenset(names)
        decode = _DECODE
        batch: Batch = []
        with open_hashed_text(self._path) as (text, hashing):
            for lineno, line in self._lines(text):
                try:
                    obj = decode(line)
                except ValueError:
                    obj = self._object(line, lineno)  # raises with the line number
                if type(obj) is not dict:
                    self._object(line, lineno)
                if not known.issuperset(obj):
                    extra = sorted(set(obj) - known)
                    raise SourceInvalid(
                        f"{str(self._path)!r}: line {lineno} has key(s) "
                        f"{', '.join(map(repr, extra))} that are not among the columns",
                        hint="declare source.columns with every key, or remove the key",
                    )
                # Only a line with a second brace or a bracket can hold a nested value.
                if line.find("{", 1) != -1 or "[" in line:
                    self._check_scalars(obj, lineno)
                batch.append(tuple(map(obj.get, names)))
                if len(batch) >= batch_size:
                    yield batch
                    batch = []
            if batch:
                yield batch
            check_identity(hashing, expected_identity, self._path)
