"""CSV and JSONL sources: parsing, inference, snapshot checks, line numbers, flat memory."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc
from pathlib import Path

import pytest

from dpone.adapters.sources import _common, _prefetch
from dpone.adapters.sources import csv as csv_source
from dpone.adapters.sources.csv import CsvSource
from dpone.adapters.sources.jsonl import JsonlSource
from dpone.contracts.load import Column, ColumnType
from dpone.errors import ConfigInvalid, SourceInvalid

INT, REAL, TEXT, BOOL = ColumnType.INTEGER, ColumnType.REAL, ColumnType.TEXT, ColumnType.BOOLEAN


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def _all(source: CsvSource | JsonlSource, batch_size: int = 1000) -> list[list[tuple[object, ...]]]:
    return list(source.batches(batch_size=batch_size, expected_identity=source.snapshot_identity()))


def _rows(source: CsvSource | JsonlSource) -> list[tuple[object, ...]]:
    return [row for batch in _all(source) for row in batch]


# ----------------------------------------------------------------- CSV


def test_csv_header_gives_columns_and_values_stay_strings(tmp_path: Path) -> None:
    """The header names the columns; values come back as read, empty ones as ''."""
    source = CsvSource(_write(tmp_path / "a.csv", "id,name,amount\n1,ann,2.5\n2,,\n"))
    assert source.kind == "csv"
    assert [c.name for c in source.columns()] == ["id", "name", "amount"]
    assert _rows(source) == [("1", "ann", "2.5"), ("2", "", "")]


def test_csv_batches_have_the_requested_size(tmp_path: Path) -> None:
    """Rows arrive in batches of batch_size, the last one shorter."""
    body = "".join(f"{i},x\n" for i in range(7))
    source = CsvSource(_write(tmp_path / "a.csv", "id,v\n" + body))
    assert [len(b) for b in _all(source, batch_size=3)] == [3, 3, 1]


def test_csv_type_inference(tmp_path: Path) -> None:
    """integer if every non-empty value is an int, real if a number, else text."""
    text = "i,r,t,e,mixed,under,spaced\n1,1.5,a,,1,1_000,1\n-2,2,b,,x,2, 2\n,1e3,,,3,3,3\n"
    source = CsvSource(_write(tmp_path / "a.csv", text))
    assert [c.type for c in source.columns()] == [INT, REAL, TEXT, TEXT, TEXT, TEXT, TEXT]


def test_csv_inference_uses_only_the_first_1000_rows(tmp_path: Path) -> None:
    """A text value after the sample does not change an inferred integer column."""
    body = "".join(f"{i}\n" for i in range(1000)) + "oops\n"
    source = CsvSource(_write(tmp_path / "a.csv", "n\n" + body))
    assert source.columns() == (Column(name="n", type=INT),)


def test_csv_declared_columns_take_the_header_order(tmp_path: Path) -> None:
    """Declared types apply by name; rows keep the header's order."""
    source = CsvSource(
        _write(tmp_path / "a.csv", "b,a\n1,2\n"), columns={"a": "integer", "b": ColumnType.TEXT}
    )
    assert source.columns() == (Column(name="b", type=TEXT), Column(name="a", type=INT))
    assert _rows(source) == [("1", "2")]


def test_csv_declared_columns_must_match_the_header(tmp_path: Path) -> None:
    """A declared name missing from the header, or an undeclared header name, is refused."""
    path = _write(tmp_path / "a.csv", "id,name\n1,x\n")
    with pytest.raises(SourceInvalid, match=r"declared but not in the header: 'amount'") as caught:
        CsvSource(path, columns={"id": "integer", "name": "text", "amount": "real"}).columns()
    assert "source.columns" in (caught.value.hint or "")
    with pytest.raises(SourceInvalid, match=r"in the header but not declared: 'name'"):
        CsvSource(path, columns={"id": "integer"}).columns()


def test_csv_a_header_checked_once_vouches_only_for_itself(tmp_path: Path) -> None:
    """Many sources, one declaration: each header is checked, a known good one included."""
    declared = {"id": "integer", "name": "text"}
    good = _write(tmp_path / "good.csv", "id,name\n1,x\n")
    swapped = _write(tmp_path / "swapped.csv", "name,id\nx,1\n")
    bad = _write(tmp_path / "bad.csv", "id,nom\n1,x\n")
    twice = _write(tmp_path / "twice.csv", "id,name,ID\n1,x,2\n")
    first = CsvSource(good, columns=declared).columns()
    assert CsvSource(good, columns=dict(declared)).columns() is first  # checked once
    assert [c.name for c in CsvSource(swapped, columns=declared).columns()] == ["name", "id"]
    for path, message in ((bad, "declared but not in the header"), (twice, "more than once")):
        for _again in range(2):
            with pytest.raises(SourceInvalid, match=message):
                CsvSource(path, columns=declared).columns()
    with pytest.raises(SourceInvalid, match="in the header but not declared: 'name'"):
        CsvSource(good, columns={"id": "integer"}).columns()
    retyped = CsvSource(good, columns={"id": "text", "name": "text"}).columns()
    assert [c.type for c in retyped] == [TEXT, TEXT]


def test_csv_declared_unknown_type_is_config_invalid(tmp_path: Path) -> None:
    """A declared type that is not a ColumnType is a configuration error."""
    with pytest.raises(ConfigInvalid):
        CsvSource(tmp_path / "a.csv", columns={"id": "bigint"})


def test_csv_wrong_field_count_names_the_line(tmp_path: Path) -> None:
    """A row with too many or too few fields raises SourceInvalid with its line number."""
    rows = "".join(f"{i},x\n" for i in range(10))
    path = _write(tmp_path / "a.csv", "id,v\n" + rows + "10,x,extra\n11,x\n")
    with pytest.raises(SourceInvalid, match=r"line 12 has 3 fields, the header has 2"):
        _all(CsvSource(path), batch_size=4)


def test_csv_line_numbers_count_multiline_fields(tmp_path: Path) -> None:
    """Lines inside a quoted field count, so the reported line is the file's line."""
    path = _write(tmp_path / "a.csv", 'id,v\n1,"two\nlines"\n2,ok\n3\n')
    with pytest.raises(SourceInvalid, match=r"line 5 has 1 fields"):
        _all(CsvSource(path), batch_size=2)


_TRICKY = '\ufeffid,v\r\n1,"two\r\nlines"\r\n\r\n2,a\x0bb\u2028c\x1cd\r\n3,"q""uote"\r4,last'


@pytest.mark.parametrize(
    "text",
    [_TRICKY, "id,v\n1,a\n2,b,c\n", 'id,v\n1,"x\ny"\n2\n'],
)
def test_csv_small_file_read_whole_parses_as_the_stream_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    """Read whole or streamed: the same columns, rows, and errors with the same lines."""
    path = tmp_path / "a.csv"
    path.write_bytes(text.encode("utf-8"))

    def outcome(limit: int) -> object:
        monkeypatch.setattr(csv_source, "SMALL_FILE_BYTES", limit)
        try:
            source = CsvSource(path)
            return (source.columns(), _all(source, batch_size=2))
        except SourceInvalid as exc:
            return exc.message

    whole = outcome(1 << 20)
    assert whole == outcome(0)
    assert isinstance(whole, tuple) is (text == _TRICKY)


def test_csv_small_file_not_utf8_names_its_line(tmp_path: Path) -> None:
    """Decoded whole, a small file's bad byte is reported on its own line."""
    path = tmp_path / "a.csv"
    path.write_bytes(b"id,v\n1,ok\n2,\xff\n")
    with pytest.raises(SourceInvalid, match="line 3 is not valid UTF-8"):
        CsvSource(path).columns()


def test_csv_small_file_is_opened_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns, identity and rows of a small file come from one open of the file."""
    path = _write(tmp_path / "a.csv", "id,v\n1,a\n2,b\n")
    opened: list[Path] = []
    real = csv_source.read_small

    def counting(at: Path, *, limit: int) -> object:
        opened.append(at)
        return real(at, limit=limit)

    monkeypatch.setattr(csv_source, "read_small", counting)
    monkeypatch.setattr(csv_source, "open_text", None)  # the streaming reads are not used
    monkeypatch.setattr(csv_source, "open_hashed_text", None)
    monkeypatch.setattr(csv_source, "file_identity", None)
    source = CsvSource(path, columns={"id": "integer", "v": "text"})
    assert [c.name for c in source.columns()] == ["id", "v"]
    assert _rows(source) == [("1", "a"), ("2", "b")]
    assert opened == [path]


def test_csv_small_file_costs_one_stat_and_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read whole: one fstat, one read of the file's size plus one byte (its end found)."""
    path = _write(tmp_path / "a.csv", "id,v\n1,a\n2,b\n")
    calls: list[str] = []
    real_fstat, real_read = _common.os.fstat, _common.os.read

    def fstat(fd: int) -> os.stat_result:
        calls.append("fstat")
        return real_fstat(fd)

    def read(fd: int, size: int) -> bytes:
        calls.append(f"read {size}")
        return real_read(fd, size)

    monkeypatch.setattr(_common.os, "fstat", fstat)
    monkeypatch.setattr(_common.os, "read", read)
    small = _common.read_small(path, limit=1 << 20)
    assert calls == ["fstat", f"read {path.stat().st_size + 1}"]
    assert small is not None
    assert small.identity == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _resized(st: os.stat_result, shift: int) -> os.stat_result:
    """``st`` with ``shift`` bytes more (or fewer) in ``st_size``."""
    fields = list(st)
    fields[6] = st.st_size + shift
    extra = ("st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_blksize", "st_blocks")
    return os.stat_result(fields, {k: getattr(st, k) for k in extra})


@pytest.mark.parametrize("shift", [-5, 5])
def test_csv_small_file_of_another_size_than_its_stat_is_read_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: int
) -> None:
    """Written between the stat and the read: all its bytes are read, and it is not settled."""
    data = b"id,v\n1,a\n2,b\n"
    path = tmp_path / "a.csv"
    path.write_bytes(data)
    monkeypatch.setattr(_prefetch, "RACY_NS", 0)  # settled, but for the size
    real_fstat = _common.os.fstat
    # the stat a moment before a write changed the size
    monkeypatch.setattr(_common.os, "fstat", lambda fd: _resized(real_fstat(fd), shift))
    small = _common.read_small(path, limit=1 << 20)
    assert small is not None
    assert small.text == data.decode()
    assert small.identity == "sha256:" + hashlib.sha256(data).hexdigest()
    assert not small.settled
    monkeypatch.setattr(_common.os, "fstat", real_fstat)
    again = _common.read_small(path, limit=1 << 20)
    assert again is not None
    assert again.settled


def test_csv_small_file_that_grew_past_the_limit_is_streamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file larger than the limit by the time it is read is left to the streaming path."""
    path = _write(tmp_path / "a.csv", "id\n" + "1\n" * 100)
    assert _common.read_small(path, limit=50) is None
    real_fstat = _common.os.fstat
    # the stat before the file grew: 10 bytes
    monkeypatch.setattr(_common.os, "fstat", lambda fd: _resized(real_fstat(fd), 10 - 203))
    assert _common.read_small(path, limit=50) is None
    assert _common.read_small(path, limit=1 << 20) is not None


def test_csv_source_that_is_a_directory_names_the_path(tmp_path: Path) -> None:
    """A directory is not a source file: SourceInvalid naming the path, as a missing file."""
    with pytest.raises(SourceInvalid, match="does not exist or cannot be opened"):
        CsvSource(tmp_path).columns()


def test_csv_blank_lines_are_skipped(tmp_path: Path) -> None:
    """An empty line is not a row."""
    source = CsvSource(_write(tmp_path / "a.csv", "id,v\n1,a\n\n2,b\n\n"))
    assert _rows(source) == [("1", "a"), ("2", "b")]


def test_csv_byte_order_mark_and_delimiter(tmp_path: Path) -> None:
    """A UTF-8 BOM does not stick to the first name; another delimiter splits fields."""
    path = tmp_path / "a.csv"
    path.write_bytes("\ufeffid;name\n1;Zoë\n".encode())
    source = CsvSource(path, delimiter=";")
    assert [c.name for c in source.columns()] == ["id", "name"]
    assert _rows(source) == [("1", "Zoë")]


@pytest.mark.parametrize("delimiter", ["", ";;", '"', "\n"])
def test_csv_bad_delimiter_is_config_invalid(tmp_path: Path, delimiter: str) -> None:
    """The delimiter must be one character that is not a quote or line break."""
    with pytest.raises(ConfigInvalid):
        CsvSource(tmp_path / "a.csv", delimiter=delimiter)


def test_csv_missing_file_names_the_path(tmp_path: Path) -> None:
    """A missing file is SourceInvalid naming the path, with what to check."""
    path = tmp_path / "nope.csv"
    source = CsvSource(path)
    for call in (source.snapshot_identity, source.columns):
        with pytest.raises(SourceInvalid, match=r"nope\.csv") as caught:
            call()
        assert "source.path" in (caught.value.hint or "")
    with pytest.raises(SourceInvalid, match=r"nope\.csv"):
        list(source.batches(batch_size=10, expected_identity="sha256:0"))


@pytest.mark.parametrize(
    ("text", "pattern"),
    [("", "is empty"), ("id,,v\n", "has no name"), ("id,ID\n", "more than once")],
)
def test_csv_bad_header(tmp_path: Path, text: str, pattern: str) -> None:
    """An empty file, an unnamed or a repeated column is refused."""
    with pytest.raises(SourceInvalid, match=pattern):
        CsvSource(_write(tmp_path / "a.csv", text)).columns()


def test_csv_not_utf8_is_source_invalid(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 raise SourceInvalid, not UnicodeDecodeError."""
    path = tmp_path / "a.csv"
    path.write_bytes(b"id,v\n1,ok\n2,\xff\xfe\n")
    source = CsvSource(path, columns={"id": "integer", "v": "text"})
    with pytest.raises(SourceInvalid, match="UTF-8"):
        _all(source)


def test_snapshot_identity_is_the_sha256_of_the_bytes(tmp_path: Path) -> None:
    """snapshot_identity() is sha256: plus the hex digest of the file's bytes."""
    data = "id\n" + "".join(f"{i}\n" for i in range(300_000))  # > 1 MiB: several chunks
    path = _write(tmp_path / "a.csv", data)
    expected = "sha256:" + hashlib.sha256(data.encode()).hexdigest()
    assert CsvSource(path).snapshot_identity() == expected
    assert JsonlSource(path).snapshot_identity() == expected


def test_csv_small_file_rows_are_the_bytes_its_identity_hashed(tmp_path: Path) -> None:
    """A small file is read once: a change after its identity never reaches the rows."""
    path = _write(tmp_path / "a.csv", "id\n1\n2\n")
    source = CsvSource(path)
    identity = source.snapshot_identity()
    _write(path, "id\n1\n3\n")
    assert list(source.batches(batch_size=1, expected_identity=identity)) == [[("1",)], [("2",)]]
    # another snapshot than the one read: refused before any row
    other = CsvSource(path)
    with pytest.raises(SourceInvalid, match="source changed while it was read"):
        next(other.batches(batch_size=1, expected_identity=identity))


def test_csv_file_changed_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamed (a large file): content other than the snapshot raises after the last batch."""
    monkeypatch.setattr(csv_source, "SMALL_FILE_BYTES", 0)
    path = _write(tmp_path / "a.csv", "id\n1\n2\n")
    source = CsvSource(path)
    identity = source.snapshot_identity()
    _write(path, "id\n1\n3\n")
    batches = source.batches(batch_size=1, expected_identity=identity)
    assert next(batches) == [("1",)]
    assert next(batches) == [("3",)]
    with pytest.raises(SourceInvalid, match="source changed while it was read"):
        next(batches)


def test_csv_file_changed_while_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows appended during the read are caught by the hash of the bytes actually read."""
    monkeypatch.setattr(csv_source, "SMALL_FILE_BYTES", 0)  # streamed, not read whole
    path = _write(tmp_path / "a.csv", "id\n" + "".join(f"{i}\n" for i in range(50_000)))
    source = CsvSource(path)
    identity = source.snapshot_identity()
    batches = source.batches(batch_size=1000, expected_identity=identity)
    next(batches)
    with path.open("a", encoding="utf-8") as handle:
        handle.write("".join(f"{i}\n" for i in range(50_000, 500_000)))
    with pytest.raises(SourceInvalid, match="source changed while it was read"):
        for _ in batches:
            pass


def test_csv_unchanged_file_passes_the_check(tmp_path: Path) -> None:
    """With the right identity every batch is yielded and no error follows."""
    path = _write(tmp_path / "a.csv", "id\n1\n")
    assert _all(CsvSource(path)) == [[("1",)]]
    with pytest.raises(SourceInvalid):
        list(CsvSource(path).batches(batch_size=5, expected_identity="sha256:" + "0" * 64))


# ----------------------------------------------------------------- JSONL


def _jsonl(path: Path, *objects: object) -> Path:
    return _write(path, "".join(json.dumps(o) + "\n" for o in objects))


def test_jsonl_columns_are_the_sample_keys_in_first_seen_order(tmp_path: Path) -> None:
    """Keys of the sample become the columns; a missing key reads as None."""
    path = _jsonl(tmp_path / "a.jsonl", {"id": 1, "name": "a"}, {"id": 2, "flag": True})
    source = JsonlSource(path)
    assert source.kind == "jsonl"
    assert [c.name for c in source.columns()] == ["id", "name", "flag"]
    assert _rows(source) == [(1, "a", None), (2, None, True)]


def test_jsonl_type_inference(tmp_path: Path) -> None:
    """JSON ints give integer, numbers real, booleans boolean, numeric strings parse."""
    path = _jsonl(
        tmp_path / "a.jsonl",
        {"i": 1, "r": 1, "b": True, "s": "x", "n": None, "si": "7", "m": True},
        {"i": None, "r": 2.5, "b": False, "s": "1", "n": None, "si": "", "m": 1},
    )
    types = {c.name: c.type for c in JsonlSource(path).columns()}
    assert types == {"i": INT, "r": REAL, "b": BOOL, "s": TEXT, "n": TEXT, "si": INT, "m": TEXT}


def test_jsonl_declared_columns(tmp_path: Path) -> None:
    """Declared columns fix names, order and types; absent keys read as None."""
    path = _jsonl(tmp_path / "a.jsonl", {"b": 1, "a": "x"}, {"a": "y"})
    source = JsonlSource(path, columns={"a": "text", "b": "integer"})
    assert source.columns() == (Column(name="a", type=TEXT), Column(name="b", type=INT))
    assert _rows(source) == [("x", 1), ("y", None)]


def test_jsonl_unknown_key_after_the_sample_names_the_line(tmp_path: Path) -> None:
    """A key first seen after the 1000-row sample is not a column: SourceInvalid, line named."""
    path = _jsonl(tmp_path / "a.jsonl", *({"id": i} for i in range(1200)), {"id": 0, "new": 1})
    with pytest.raises(SourceInvalid, match=r"line 1201 has key\(s\) 'new'"):
        _all(JsonlSource(path))


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ('{"id": 2, "v": {"nested": 1}}', r"line 2: key 'v' holds a nested value"),
        ('{"id": 2, "v": [1, 2]}', r"line 2: key 'v' holds a nested value"),
        ("[1, 2]", r"line 2 is not a JSON object"),
        ('{"id": 2, ', r"line 2 is not valid JSON"),
        ('{"id": NaN}', r"line 2 is not valid JSON"),
    ],
)
def test_jsonl_bad_lines_name_the_line(tmp_path: Path, line: str, pattern: str) -> None:
    """Nested values, non-objects and invalid JSON raise SourceInvalid naming the line."""
    path = _write(tmp_path / "a.jsonl", '{"id": 1, "v": "a"}\n' + line + "\n")
    source = JsonlSource(path, columns={"id": "integer", "v": "text"})
    with pytest.raises(SourceInvalid, match=pattern):
        _all(source)


def test_jsonl_nested_value_in_the_sample_is_refused(tmp_path: Path) -> None:
    """Inference also refuses a nested value, naming its line."""
    path = _jsonl(tmp_path / "a.jsonl", {"id": 1}, {"id": 2, "tags": ["a"]})
    with pytest.raises(SourceInvalid, match="line 2"):
        JsonlSource(path).columns()


def test_jsonl_braces_inside_strings_are_fine(tmp_path: Path) -> None:
    """A string holding { or [ is a scalar, not a nested value."""
    path = _jsonl(tmp_path / "a.jsonl", {"id": 1, "v": "{not [nested]}"})
    assert _rows(JsonlSource(path)) == [(1, "{not [nested]}")]


def test_jsonl_blank_lines_are_skipped_and_line_numbers_count_them(tmp_path: Path) -> None:
    """Blank lines yield nothing but still count for line numbers."""
    path = _write(tmp_path / "a.jsonl", '{"id": 1}\n\n  \n{"id": 2}\n\n{"id": 3, "x": 1}\n')
    source = JsonlSource(path, columns={"id": "integer"})
    with pytest.raises(SourceInvalid, match="line 6"):
        _all(source)
    _write(tmp_path / "b.jsonl", '{"id": 1}\n\n{"id": 2}\n')
    assert _rows(JsonlSource(tmp_path / "b.jsonl")) == [(1,), (2,)]


def test_jsonl_changed_file_is_refused(tmp_path: Path) -> None:
    """Content other than the recorded snapshot raises after the last batch."""
    path = _jsonl(tmp_path / "a.jsonl", {"id": 1})
    source = JsonlSource(path)
    identity = source.snapshot_identity()
    _jsonl(path, {"id": 2})
    with pytest.raises(SourceInvalid, match="source changed while it was read"):
        list(source.batches(batch_size=10, expected_identity=identity))


def test_jsonl_missing_and_empty_files(tmp_path: Path) -> None:
    """A missing file names its path; a file without objects has no columns to offer."""
    with pytest.raises(SourceInvalid, match=r"nope\.jsonl"):
        JsonlSource(tmp_path / "nope.jsonl").columns()
    with pytest.raises(SourceInvalid, match="no objects"):
        JsonlSource(_write(tmp_path / "e.jsonl", "\n")).columns()


# ----------------------------------------------------------------- memory


def _peak_while_streaming(source: CsvSource | JsonlSource) -> tuple[int, int]:
    identity = source.snapshot_identity()
    source.columns()
    tracemalloc.start()
    try:
        rows = 0
        for batch in source.batches(batch_size=1000, expected_identity=identity):
            rows += len(batch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return rows, peak


def test_csv_memory_stays_flat(tmp_path: Path) -> None:
    """Streaming a 200k-row CSV (~9 MB) peaks at a few MB: the file is never held whole."""
    path = tmp_path / "big.csv"
    with path.open("w", encoding="utf-8") as handle:
        handle.write("id,name,amount,at\n")
        handle.writelines(
            f"{i},customer-{i % 997},{i * 0.25:.2f},2026-11-01T10:{i % 60:02d}:00Z\n"
            for i in range(200_000)
        )
    assert path.stat().st_size > 8_000_000
    rows, peak = _peak_while_streaming(CsvSource(path))
    assert rows == 200_000
    assert peak < 4_000_000, f"peak {peak} bytes"


def test_jsonl_memory_stays_flat(tmp_path: Path) -> None:
    """Streaming a 100k-line JSONL file peaks at a few MB."""
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        handle.writelines(
            f'{{"id": {i}, "name": "customer-{i % 997}", "amount": {i * 0.25}}}\n'
            for i in range(100_000)
        )
    rows, peak = _peak_while_streaming(JsonlSource(path))
    assert rows == 100_000
    assert peak < 4_000_000, f"peak {peak} bytes"
