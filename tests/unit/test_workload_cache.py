"""The workload cache (ADR 0015): a file run before is validated from its kept parse.

What must hold: the same ``Workload`` whether parsed or taken from the cache; PyYAML is
not imported on a hit; the cache is only ever a speed-up (a corrupt, foreign or
shared entry or folder is a miss, a cache that cannot be written changes nothing);
documents that msgpack would not give back as they were are never kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dpone.config import _parsed
from dpone.config.workload import load_workload
from dpone.errors import ConfigInvalid

WORKLOAD = """\
workload: orders
release: "r1"
deployment: prod
journal: sqlite:///journal.db
source:
  kind: csv
  path: orders.csv
  columns: {order_id: integer, customer: text, amount: real, ordered_at: timestamp}
target: {kind: sqlite, url: "sqlite:///target.db", table: orders}
load: {strategy: append}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("DPONE_CACHE_DIR", str(folder))
    return folder / "workloads"


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.exists() else []


def test_a_second_load_is_the_same_workload_from_the_cache(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    first = load_workload(path)
    assert len(_entries(cache)) == 1
    assert _parsed.cached(path.read_bytes()) is not _parsed.MISS
    assert load_workload(path) == first


def test_a_hit_does_not_import_pyyaml(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    probe = (
        "import sys; from dpone.config.workload import load_workload; "
        f"w = load_workload({str(path)!r}); print(w.workload, 'yaml' in sys.modules)"
    )
    env = {**os.environ, "DPONE_CACHE_DIR": str(cache.parent)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
        ).stdout.split()
        for _ in range(2)
    ]
    assert runs == [["orders", "True"], ["orders", "False"]]


def test_a_changed_file_is_parsed_again(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    load_workload(path)
    path.write_text(WORKLOAD.replace('"r1"', '"r2"'), encoding="utf-8")
    assert load_workload(path).release == "r2"
    assert len(_entries(cache)) == 2


def test_a_corrupt_entry_is_a_miss_and_is_replaced(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    expected = load_workload(path)
    (entry,) = _entries(cache)
    entry.write_bytes(b"\xc1 not msgpack")
    assert _parsed.cached(path.read_bytes()) is _parsed.MISS
    assert load_workload(path) == expected
    assert _parsed.cached(path.read_bytes()) is not _parsed.MISS


def test_an_entry_others_can_write_is_not_trusted(tmp_path: Path, cache: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    load_workload(path)
    (entry,) = _entries(cache)
    entry.chmod(0o666)
    assert _parsed.cached(path.read_bytes()) is _parsed.MISS
    entry.chmod(0o600)
    cache.chmod(0o777)
    assert _parsed.cached(path.read_bytes()) is _parsed.MISS
    cache.chmod(0o700)
    assert _parsed.cached(path.read_bytes()) is not _parsed.MISS


def test_a_forged_entry_is_still_validated(tmp_path: Path, cache: Path) -> None:
    """An entry holds a parse, not a verdict: what it holds is checked like a file."""
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    load_workload(path)
    (entry,) = _entries(cache)
    import msgspec

    entry.write_bytes(msgspec.msgpack.encode({"workload": "orders", "target": 42}))
    with pytest.raises(ConfigInvalid):
        load_workload(path)


@pytest.mark.parametrize(
    "text",
    [
        WORKLOAD + "incremental: {column: ordered_at, start: 2026-11-01}\n",  # a YAML date
        WORKLOAD + "extra: !!binary aGVsbG8=\n",
        WORKLOAD + "extra: !!set {a, b}\n",
        WORKLOAD + "extra: {1: integer key}\n",
    ],
)
def test_documents_msgpack_would_change_are_not_kept(
    tmp_path: Path, cache: Path, text: str
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        load_workload(path)
    except ConfigInvalid:
        pass  # refused or not: either way nothing is kept
    assert _entries(cache) == []


def test_an_alias_bomb_is_not_written_out(tmp_path: Path, cache: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(6)
    )
    document = {"workload": "w"}
    _parsed.remember(bomb.encode(), {**document, "bomb": _expand(bomb)})
    assert _entries(cache) == []


def _expand(text: str) -> object:
    import yaml

    return yaml.safe_load(text)


def test_an_empty_setting_turns_the_cache_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPONE_CACHE_DIR", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    load_workload(path)
    assert _parsed.cached(path.read_bytes()) is _parsed.MISS
    assert not (tmp_path / ".cache").exists()


def test_an_unwritable_cache_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DPONE_CACHE_DIR", str(blocker))
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    assert load_workload(path).workload == "orders"
    assert _parsed.cached(path.read_bytes()) is _parsed.MISS


def test_the_default_location_is_the_users_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DPONE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "w.yaml"
    path.write_text(WORKLOAD, encoding="utf-8")
    load_workload(path)
    folder = tmp_path / "xdg" / "dpone" / "workloads"
    assert len(_entries(folder)) == 1
    assert folder.stat().st_mode & 0o777 == 0o700
    assert _entries(folder)[0].stat().st_mode & 0o777 == 0o600


def test_a_refused_workload_leaves_nothing_in_the_cache(tmp_path: Path, cache: Path) -> None:
    """Only a valid workload's document is kept: a refused file (here a password
    under a misspelt key) leaves no copy of itself on disk."""
    path = tmp_path / "w.yaml"
    path.write_text(
        WORKLOAD.replace(
            'target: {kind: sqlite, url: "sqlite:///target.db", table: orders}',
            'target: {kind: sqlite, url: "sqlite:///target.db", table: orders, pasword: x}',
        ),
        encoding="utf-8",
    )
    with pytest.raises(ConfigInvalid):
        load_workload(path)
    assert _entries(cache) == []
