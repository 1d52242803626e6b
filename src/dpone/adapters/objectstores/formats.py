"""Partition file formats: Parquet through pyarrow, CSV through the standard library."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

from dpone.contracts.load import Column, ColumnType
from dpone.errors import ConfigInvalid, PublicationRefused, TargetWriteFailed
from dpone.ports.table_format import PartitionStats, TableFormatPort

__all__ = ["CsvFormat", "ParquetFormat", "open_format"]


def _transpose(
    columns: Sequence[Column], batches: Iterable[Sequence[Sequence[object]]]
) -> tuple[list[list[object]], int]:
    values: list[list[object]] = [[] for _ in columns]
    rows = 0
    for batch in batches:
        if not batch:
            continue
        try:
            transposed = list(zip(*batch, strict=True))
        except ValueError:
            transposed = []
        if len(transposed) != len(columns):
            raise TargetWriteFailed(
                f"a row does not have {len(columns)} values; nothing was written"
            )
        for column_values, more in zip(values, transposed, strict=True):
            column_values.extend(more)
        rows += len(batch)
    return values, rows


class ParquetFormat:
    """Parquet files (pyarrow's defaults: snappy) written by pyarrow, deterministic bytes."""

    name = "parquet"

    def __init__(self) -> None:
        # import the heavy modules when the format is chosen, not in the middle of a write
        import pyarrow.compute
        import pyarrow.parquet  # noqa: F401

    def encode(
        self, columns: Sequence[Column], batches: Iterable[Sequence[Sequence[object]]]
    ) -> tuple[bytes, int]:
        """Build one table from the rows (text cast to the column types) and write it."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        values, rows = _transpose(columns, batches)
        arrays = []
        for column, raw in zip(columns, values, strict=True):
            try:
                array = pa.array(raw)
                if pa.types.is_string(array.type) or pa.types.is_null(array.type):
                    array = pa.array(raw, type=pa.string())
                    array = pc.if_else(pc.equal(array, ""), pa.scalar(None, pa.string()), array)
                arrays.append(array.cast(_arrow_type(column.type)))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                raise TargetWriteFailed(
                    f"column {column.name!r} has a value that is not {column.type.value}; "
                    "nothing was written"
                ) from None
        table = pa.Table.from_arrays(arrays, names=[c.name for c in columns])
        sink = io.BytesIO()
        pq.write_table(table, sink)
        return sink.getvalue(), rows

    def inspect(self, data: bytes) -> PartitionStats:
        """Row count and null counts from the footer (column statistics), no data pages."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(io.BytesIO(data)).metadata
            names = tuple(meta.schema.to_arrow_schema().names)
            nulls = dict.fromkeys(names, 0)
            unknown: set[str] = set()
            for g in range(meta.num_row_groups):
                group = meta.row_group(g)
                for i, name in enumerate(names):
                    stats = group.column(i).statistics
                    if stats is None or not stats.has_null_count:
                        unknown.add(name)
                    else:
                        nulls[name] += stats.null_count
            for name in unknown:  # no statistics written: count from the column itself
                column = pq.read_table(io.BytesIO(data), columns=[name]).column(0)
                nulls[name] = column.null_count
        except (pa.ArrowInvalid, OSError):
            raise PublicationRefused("a partition file is not readable Parquet") from None
        return PartitionStats(rows=meta.num_rows, columns=names, null_counts=nulls)

    def decode(self, data: bytes) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
        """All rows as tuples."""
        import pyarrow.parquet as pq

        table = pq.read_table(io.BytesIO(data))
        names = tuple(table.column_names)
        columns = [table.column(n).to_pylist() for n in names]
        return names, list(zip(*columns, strict=True)) if columns else []


def _arrow_type(kind: ColumnType) -> object:
    import pyarrow as pa

    return {
        ColumnType.INTEGER: pa.int64(),
        ColumnType.REAL: pa.float64(),
        ColumnType.TEXT: pa.string(),
        ColumnType.BOOLEAN: pa.bool_(),
        ColumnType.TIMESTAMP: pa.timestamp("us", tz="UTC"),
    }[kind]


class CsvFormat:
    """CSV with a header row; empty fields are nulls; LF line ends (deterministic)."""

    name = "csv"

    def encode(
        self, columns: Sequence[Column], batches: Iterable[Sequence[Sequence[object]]]
    ) -> tuple[bytes, int]:
        """Write the header and every row."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([c.name for c in columns])
        rows = 0
        for batch in batches:
            for row in batch:
                if len(row) != len(columns):
                    raise TargetWriteFailed("a row has the wrong number of values")
                writer.writerow(["" if v is None else v for v in row])
                rows += 1
        return buffer.getvalue().encode("utf-8"), rows

    def inspect(self, data: bytes) -> PartitionStats:
        """Count rows and empty fields."""
        names, rows = self.decode(data)
        nulls = {n: sum(1 for r in rows if r[i] in ("", None)) for i, n in enumerate(names)}
        return PartitionStats(rows=len(rows), columns=names, null_counts=nulls)

    def decode(self, data: bytes) -> tuple[tuple[str, ...], list[tuple[object, ...]]]:
        """Header and rows as strings."""
        try:
            reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
            header = next(reader, None)
            rows: list[tuple[object, ...]] = [tuple(r) for r in reader]
        except (UnicodeDecodeError, csv.Error):
            raise PublicationRefused("a partition file is not readable CSV") from None
        if header is None or any(len(r) != len(header) for r in rows):
            raise PublicationRefused("a partition file is not well-formed CSV")
        return tuple(header), rows


def open_format(name: str) -> TableFormatPort:
    """Return the format adapter for ``name`` (``parquet`` needs the parquet extra)."""
    if name == "csv":
        return CsvFormat()
    if name == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ConfigInvalid(
                "format parquet needs the parquet extra",
                field="publication.format",
                hint="pip install 'dpone[parquet]'",
            ) from None
        return ParquetFormat()
    raise ConfigInvalid(
        f"unknown format {name!r}", field="publication.format", hint="use parquet or csv"
    )
