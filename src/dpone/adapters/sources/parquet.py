"""Parquet file source: columns from the file's schema, rows streamed by record batch.

The snapshot identity is the SHA-256 of the file's bytes, like CSV. The file is opened
once; pyarrow reads the record batches from that handle, and after the last batch the
same handle is hashed again: a file changed in place, or replaced before it was opened,
fails with ``SourceInvalid`` before the target commits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from dpone.adapters.sources._common import CHUNK_SIZE, changed_error, declared_columns
from dpone.adapters.sources.sql import portable_columns
from dpone.contracts.load import Column, ColumnType
from dpone.errors import ConfigInvalid, SourceInvalid

__all__ = ["ParquetSource"]

Batch = list[tuple[object, ...]]


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigInvalid(
            "the parquet source needs the parquet extra",
            field="source.kind",
            hint="pip install 'dpone[parquet]'",
        ) from None
    return pa, pq


def _column_type(pa: Any, arrow_type: Any) -> ColumnType:
    types = pa.types
    if types.is_boolean(arrow_type):
        return ColumnType.BOOLEAN
    if types.is_integer(arrow_type):
        return ColumnType.INTEGER
    if types.is_floating(arrow_type) or types.is_decimal(arrow_type):
        return ColumnType.REAL
    if types.is_timestamp(arrow_type):
        return ColumnType.TIMESTAMP
    return ColumnType.TEXT


def _hash(handle: BinaryIO) -> str:
    handle.seek(0)
    digest = hashlib.sha256()
    while chunk := handle.read(CHUNK_SIZE):
        digest.update(chunk)
    return "sha256:" + digest.hexdigest()


class ParquetSource:
    """A Parquet file; nested values are refused, timestamps become UTC text.

    Args:
        path: the file.
        columns: declared ``name -> type`` (a subset of the file's columns, in this
            order); without it every column of the file, typed from its schema.
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
        return "parquet"

    def _open(self) -> BinaryIO:
        try:
            return self._path.open("rb")
        except OSError as exc:
            raise SourceInvalid(
                f"source file {str(self._path)!r} does not exist or cannot be opened",
                hint="check the workload's source.path (relative paths start at the workload file)",
            ) from exc

    def _file(self, handle: BinaryIO) -> Any:
        pa, pq = _pyarrow()
        try:
            return pq.ParquetFile(handle)
        except (pa.ArrowException, OSError) as exc:
            raise SourceInvalid(
                f"{str(self._path)!r} is not a readable Parquet file ({type(exc).__name__})"
            ) from exc

    def snapshot_identity(self) -> str:
        """Return ``sha256:<hex>`` of the file's bytes."""
        with self._open() as handle:
            return _hash(handle)

    def columns(self) -> tuple[Column, ...]:
        """Return the declared columns, or the file's with types from its schema."""
        if self._columns is None:
            pa, _ = _pyarrow()
            with self._open() as handle:
                schema = self._file(handle).schema_arrow
            found = {f.name: _column_type(pa, f.type) for f in schema}
            for name, arrow_type in ((f.name, f.type) for f in schema):
                if pa.types.is_nested(arrow_type) and (
                    self._declared is None or name in self._declared
                ):
                    raise SourceInvalid(
                        f"{str(self._path)!r}: column {name!r} is nested "
                        f"({arrow_type}); only scalar columns can be loaded",
                        hint="declare source.columns without it, or flatten the file",
                    )
            if self._declared is not None:
                missing = [n for n in self._declared if n not in found]
                if missing:
                    raise SourceInvalid(
                        f"{str(self._path)!r} has no column(s) {', '.join(map(repr, missing))}",
                        hint="declare only columns the file has",
                    )
                self._columns = tuple(Column(name=n, type=t) for n, t in self._declared.items())
            else:
                self._columns = tuple(Column(name=n, type=t) for n, t in found.items())
        return self._columns

    def batches(self, *, batch_size: int, expected_identity: str) -> Iterator[Batch]:
        """Yield rows record batch by record batch; check the file's hash at the end.

        Raises:
            SourceInvalid: the file is not Parquet, or its bytes are not ``expected_identity``.
        """
        if batch_size < 1:
            raise ConfigInvalid("batch_size must be at least 1", field="load.batch_size")
        pa, _ = _pyarrow()
        names = [c.name for c in self.columns()]
        with self._open() as handle:
            parquet = self._file(handle)
            try:
                for record_batch in parquet.iter_batches(batch_size=batch_size, columns=names):
                    columns = portable_columns(
                        [record_batch.column(i).to_pylist() for i in range(len(names))]
                    )
                    yield list(zip(*columns, strict=True))
            except (pa.ArrowException, OSError) as exc:
                raise SourceInvalid(
                    f"{str(self._path)!r} could not be read ({type(exc).__name__})"
                ) from exc
            if _hash(handle) != expected_identity:
                raise changed_error(self._path)
