"""The raw CSV checks decide the same at every chunk size, and count Python's records."""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path

import pytest

from dpone.adapters.sources import _passthrough
from dpone.adapters.sources._passthrough import CsvFileBytes
from dpone.errors import SourceInvalid
from dpone.ports.source import RawCsvRefused

HEADER = "id,name,amount,note\n"
ACCEPTED = [
    '1,"say ""hi""",1.5,plain\n2,"a,b","2","line one\nline two"\n3,,,""\n',
    '1,"""",1,"\n"\n2,"x""",2,""""""\n',
    "1,a,1,b",  # no newline at the end
    "",  # a header alone
    '1,Ünïcødé 日本,1,"q\r\nz"\r\n',
]
REFUSED = [
    '1,ab"c,1,"d\n2,x,2,y\n',  # a quote opening mid-field
    '1,"a"b"c",1,d\n',  # a quote after a closed section
    "1,a,1,b\n\n2,x,2,y\n",  # a blank line
    "1\r\n\r\n2,x,2,y\r\n",  # a blank line in CRLF (LF CR LF: borders 1-8 cut it twice)
    "1,a,1,b\n\\.\n",  # end-of-data marker
    "1,a,1,b\r2,x,2,y\n",  # a lone CR
    "1,a,1,b\r",  # a lone CR at the end
    '1,"open,1,b\n',  # an unterminated quoted section
    "1,a\x00,1,b\n",  # NUL
    '1,a,1,"two\n\nlines"\n',  # an empty line, even inside quotes (cheaper to refuse)
]


def _file(tmp_path: Path, body: str) -> tuple[Path, str]:
    path = tmp_path / "f.csv"
    path.write_bytes((HEADER + body).encode("utf-8"))
    return path, "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _read(path: Path, identity: str, size: int, monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setattr(_passthrough, "CHUNK_SIZE", size)
    raw = CsvFileBytes(
        path, delimiter=",", columns=("id", "name", "amount", "note"), expected_identity=identity
    )
    data = b"".join(raw.chunks(crlf=True))
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    assert raw.records() == len(rows) - 1
    return data


# The header line must fit the first chunk; past it, chunk borders fall on every offset.
SIZES = [len(HEADER) + k for k in range(1, 9)] + [1 << 20]


@pytest.mark.parametrize("body", ACCEPTED)
def test_accepted_files_pass_whole_at_every_chunk_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    path, identity = _file(tmp_path, body)
    for size in SIZES:
        assert _read(path, identity, size, monkeypatch) == path.read_bytes(), size


@pytest.mark.parametrize("body", REFUSED)
def test_refused_files_are_refused_at_every_chunk_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    path, identity = _file(tmp_path, body)
    for size in SIZES:
        with pytest.raises(RawCsvRefused):
            _read(path, identity, size, monkeypatch)


def test_a_changed_file_raises_source_changed_before_its_last_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, _ = _file(tmp_path, "1,a,1,b\n")
    with pytest.raises(SourceInvalid, match="source changed"):
        _read(path, "sha256:" + "0" * 64, 1 << 20, monkeypatch)
