"""JsonlAppendConnector: appends, cut back on failure, never a proof."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.adapters.connectors.jsonl_append import JsonlAppendConnector
from dpone.contracts.fence import FenceCapability
from dpone.contracts.load import Column, ColumnType, LoadPlan, LoadStrategy
from dpone.errors import SourceInvalid, TargetWriteFailed

PLAN = LoadPlan(
    table="-",
    strategy=LoadStrategy.APPEND,
    columns=(Column(name="id", type=ColumnType.INTEGER), Column(name="v", type=ColumnType.TEXT)),
)
OP = "sha256:" + "a" * 64


def _mutate(connector: JsonlAppendConnector, batches: object, **kw: object) -> int:
    report = connector.mutate(
        operation_id=OP,
        intent_digest="sha256:" + "b" * 64,
        epoch=1,
        plan=PLAN,
        batches=batches,  # type: ignore[arg-type]
        content_digest="sha256:" + "c" * 64,
        **kw,  # type: ignore[arg-type]
    )
    return report.row_count


def _read(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_appends_json_objects_and_keeps_earlier_lines(tmp_path: Path) -> None:
    """Each row is one JSON object line named by the plan's columns; '' is written as null."""
    path = tmp_path / "out" / "rows.jsonl"
    connector = JsonlAppendConnector(path)
    assert connector.capability is FenceCapability.NONE
    assert connector.target_identity() == f"jsonl_append:{path.resolve()}"
    assert _mutate(connector, [[(1, "a"), ("2", "")]]) == 2
    assert _mutate(connector, [[(3, "Zoë")], []]) == 1
    assert _read(path) == [
        {"id": 1, "v": "a"},
        {"id": "2", "v": None},
        {"id": 3, "v": "Zoë"},
    ]


def test_within_failure_cuts_the_append_back(tmp_path: Path) -> None:
    """within() gets no transaction (None); if it raises, the file returns to its old size."""
    path = tmp_path / "rows.jsonl"
    connector = JsonlAppendConnector(path)
    _mutate(connector, [[(1, "a")]])
    before = path.read_bytes()
    seen: list[object] = []

    def hook(txn: object) -> None:
        seen.append(txn)
        raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        _mutate(connector, [[(2, "b"), (3, "c")]], within=hook)
    assert seen == [None]
    assert path.read_bytes() == before


@pytest.mark.parametrize("bad", [(1,), (1, "a", "extra"), (1, {1, 2}), (1, float("nan"))], ids=str)
def test_unencodable_row_appends_nothing(tmp_path: Path, bad: tuple[object, ...]) -> None:
    """A wrong-width row or a value JSON cannot hold: TargetWriteFailed, file unchanged."""
    path = tmp_path / "rows.jsonl"
    connector = JsonlAppendConnector(path)
    _mutate(connector, [[(1, "a")]])
    before = path.read_bytes()
    with pytest.raises(TargetWriteFailed):
        _mutate(connector, [[(2, "b")], [bad]])
    assert path.read_bytes() == before


def test_failing_source_appends_nothing(tmp_path: Path) -> None:
    """A source error after some batches were written cuts them back and reaches the caller."""
    path = tmp_path / "rows.jsonl"
    connector = JsonlAppendConnector(path)

    def batches() -> Iterator[list[tuple[object, ...]]]:
        yield [(1, "a")]
        raise SourceInvalid("source changed while it was read")

    with pytest.raises(SourceInvalid):
        _mutate(connector, batches())
    assert path.read_bytes() == b""


def test_unwritable_path_is_target_write_failed(tmp_path: Path) -> None:
    """A path that cannot be opened for append is TargetWriteFailed, not OSError."""
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(TargetWriteFailed, match="EISDIR"):
        _mutate(JsonlAppendConnector(tmp_path / "dir.jsonl"), [[(1, "a")]])
