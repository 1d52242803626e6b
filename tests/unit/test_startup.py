"""`dpone run` start-up: the identity hash prefetched beside the imports, stamina loaded lazily."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpone.adapters.sources import _prefetch
from dpone.adapters.sources._common import file_identity
from dpone.cli import _early
from dpone.errors import SourceInvalid
from dpone.testing.crash import write_orders_csv


def sha(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_prefetch, "_PREFETCHED", {})
    monkeypatch.setattr(_early, "_started", False)


def test_prefetched_identity_is_the_file_hash_and_is_used_once(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    _prefetch.prefetch_identity(data)
    assert str(data.resolve()) in _prefetch._PREFETCHED
    assert file_identity(data) == sha(data)
    assert _prefetch._PREFETCHED == {}  # taken: a second call hashes the file itself
    assert file_identity(data) == sha(data)


def test_a_file_changed_after_the_prefetch_is_hashed_again(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    _prefetch.prefetch_identity(data)
    pending = _prefetch._PREFETCHED[str(data.resolve())]
    pending._thread.join()
    assert pending.identity == sha(data)
    time.sleep(0.01)
    # same size, other bytes: only the timestamps tell
    raw = bytearray(data.read_bytes())
    raw[-3:-1] = b"99" if raw[-3:-1] != b"99" else b"98"
    data.write_bytes(bytes(raw))
    assert file_identity(data) == sha(data) != pending.identity


def test_a_replaced_file_is_hashed_again(tmp_path: Path) -> None:
    data = tmp_path / "a.csv"
    write_orders_csv(data, 1000)
    _prefetch.prefetch_identity(data)
    _prefetch._PREFETCHED[str(data.resolve())]._thread.join()
    other = tmp_path / "b.csv"
    write_orders_csv(other, 1000, start_id=7)
    os.replace(other, data)  # another inode under the same name
    assert file_identity(data) == sha(data)


def test_a_missing_file_still_fails_with_the_usual_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    _prefetch.prefetch_identity(missing)
    with pytest.raises(SourceInvalid, match="does not exist"):
        file_identity(missing)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "w.yaml", "--interval", "a/b"], "w.yaml"),
        (["run", "--interval", "a/b", "-q", "w.yaml"], "w.yaml"),
        (["run", "--partition", "p1", "--idempotency-key", "k", "w.yaml"], "w.yaml"),
        (["run", "--interval=a/b", "w.yaml"], "w.yaml"),
        (["run", "--", "-w.yaml"], "-w.yaml"),
        (["journal", "list", "w.yaml"], None),
        (["run", "--interval", "a/b"], None),
        ([], None),
    ],
)
def test_the_workload_argument_of_dpone_run(args: list[str], expected: str | None) -> None:
    assert _early._workload_argument(args) == expected


def _workload(tmp_path: Path, path: str, extra: str = "") -> Path:
    file = tmp_path / "w.yaml"
    file.write_text(
        "workload: w\nrelease: r\ndeployment: d\n"
        f"source: {{kind: csv, path: '{path}'}}\n"
        "target: {kind: sqlite, url: 'sqlite:///t.db', table: t}\n" + extra,
        encoding="utf-8",
    )
    return file


def test_dpone_run_prefetches_a_large_fixed_source_file(tmp_path: Path) -> None:
    write_orders_csv(tmp_path / "big.csv", 40_000)  # over 1 MiB
    wl = _workload(tmp_path, "big.csv")
    _early.prefetch_run_source(["run", str(wl), "--interval", "2026-11-01/2026-11-02"])
    assert list(_prefetch._PREFETCHED) == [str((tmp_path / "big.csv").resolve())]
    _early.prefetch_run_source(["run", str(wl)])  # once per process
    assert len(_prefetch._PREFETCHED) == 1
    assert file_identity(tmp_path / "big.csv") == sha(tmp_path / "big.csv")


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("small.csv", ""),  # under 1 MiB: hashed when asked, no thread
        ("p{partition}.csv", ""),  # depends on the run's arguments
        ("big.csv", "publication: {}\n"),  # many partitions: not this peek's business
        ("nope.csv", ""),  # the run reports it
    ],
)
def test_dpone_run_leaves_other_sources_alone(tmp_path: Path, path: str, extra: str) -> None:
    write_orders_csv(tmp_path / "small.csv", 10)
    write_orders_csv(tmp_path / "big.csv", 40_000)
    wl = _workload(tmp_path, path, extra)
    _early.prefetch_run_source(["run", str(wl)])
    assert _prefetch._PREFETCHED == {}


def test_an_unreadable_workload_is_left_to_the_run(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("source: [unclosed", encoding="utf-8")
    _early.prefetch_run_source(["run", str(bad)])
    _early._started = False
    _early.prefetch_run_source(["run", str(tmp_path / "missing.yaml")])
    assert _prefetch._PREFETCHED == {}


def test_one_try_does_not_import_stamina_and_hooks_stay_silenced_when_it_loads() -> None:
    probe = (
        "import sys\n"
        "from dpone.runtime.retry import RetryPolicy, call_with_retries, silence_stamina_hooks\n"
        "silence_stamina_hooks()\n"
        "assert call_with_retries(lambda: 1, policy=RetryPolicy()) == 1\n"
        "assert 'stamina' not in sys.modules\n"
        "assert call_with_retries(lambda: 2, policy=RetryPolicy(attempts=3)) == 2\n"
        "import stamina.instrumentation\n"
        "assert list(stamina.instrumentation.get_on_retry_hooks()) == []\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
