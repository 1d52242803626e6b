"""SIGKILL a real publication process at each step, on both stores; rerun; readers never see a mix.

The Russian seed's scenario (003): a report for a fixed interval is one file per tenant;
a task dies after p1 and before p2; the retry must not duplicate, must not read another
source cut, and readers must never see a half-written or mixed report.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from dpone.config.publication import Publication
from dpone.contracts.states import CommitState
from dpone.errors import PublicationRefused
from dpone.testing.crash import run_dpone, run_until_done, start_dpone
from dpone.testing.s3_server import S3Server
from tests.fixtures.publication import (
    S3_ENV,
    local_store,
    s3_store,
    write_tenants,
    write_workload,
)

pytestmark = pytest.mark.crash

TENANTS = ("t1", "t2", "t3")
ROWS = 200
ENV = {**os.environ, **S3_ENV}


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A published baseline (backfill v1) of a three-tenant report, on each store."""
    write_tenants(tmp_path, TENANTS, rows=ROWS)
    if request.param == "local":
        store = local_store()
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        store = s3_store(server, request.getfixturevalue("s3_bucket"))
    path = write_workload(tmp_path, store=store, partitions=list(TENANTS))
    data = json.loads(path.read_text())
    data["lease_ttl_seconds"] = 1  # a killed writer's lease lapses quickly
    path.write_text(json.dumps(data))
    with Publication(path, environ=ENV) as pub:
        pub.run(backfill="v1")
    return tmp_path


def _reader(root: Path) -> tuple[str, Counter[object], int]:
    """What a reader sees through current: generation, id counts, manifest partitions."""
    with Publication(root / "pub.yaml", environ=ENV) as pub:
        read = pub.service.read_rows(pub.layout())
        assert read is not None
        view, names, rows = read
        # the manifest matches the files: exactly its data objects exist in its generation
        prefix = f"{pub.layout().interval_prefix}/gen={view.pointer.generation}"
        data_keys = {o.key for o in pub.store.list(prefix) if o.key.endswith(".parquet")}
        assert data_keys == {e.key for e in view.manifest.partitions}
        ids = Counter(row[names.index("id")] for row in rows)
        return view.pointer.generation, ids, len(view.manifest.partitions)


def _assert_complete_report(root: Path, generation: str) -> None:
    seen, ids, partitions = _reader(root)
    assert seen == generation
    assert partitions == len(TENANTS)
    assert len(ids) == ROWS * len(TENANTS)
    assert set(ids.values()) == {1}


SCENARIOS = {
    "after_p1_before_p2": "after:COMPLETE=kill@1",
    "during_partition_write": "fence.mutate.before_commit=kill@2",
    "between_reconcile_and_publish": "before:publication.manifest=kill",
    "during_publish": "before:publication.current=kill",
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_sigkill_then_rerun(root: Path, scenario: str) -> None:
    """Readers see v1 whole until v2 is whole; the rerun writes every partition exactly once."""
    with Publication(root / "pub.yaml", environ=ENV) as pub:
        v1, v2 = pub.layout("v1").generation, pub.layout("v2").generation
    args = ["publication", "run", "pub.yaml", "--backfill", "v2"]
    killed = run_dpone(args, cwd=root, failpoints=SCENARIOS[scenario], env=S3_ENV)
    assert killed.returncode == -9, killed.stderr
    _assert_complete_report(root, v1)

    with Publication(root / "pub.yaml", environ=ENV) as pub:
        status = pub.status(backfill="v2")
        if scenario == "after_p1_before_p2":
            assert status["committed"] == ["t1"]
            assert status["missing"] == ["t2", "t3"]
        elif scenario == "during_partition_write":
            assert status["committed"] == ["t1"]
            assert status["written_not_committed"] == ["t2"]
        else:
            assert status["committed"] == list(TENANTS)
            assert status["manifest_written"] is (scenario == "during_publish")
        if scenario in ("after_p1_before_p2", "during_partition_write"):
            # the seed's fault test: one partition really exists, and reconcile refuses
            with pytest.raises(PublicationRefused) as caught:
                pub.reconcile(backfill="v2")
            assert "missing partitions (2 of 3)" in caught.value.message

    rerun = run_until_done(args, cwd=root, env=S3_ENV)
    assert rerun.final == 0, rerun.last_stderr
    _assert_complete_report(root, v2)

    with Publication(root / "pub.yaml", environ=ENV) as pub:
        entries = [
            e
            for e in pub.journal.list_entries()
            if str(e.metadata.get("target_identity", "")).endswith(f"gen={v2}")
        ]
        assert sorted(str(e.metadata["partition"]) for e in entries) == list(TENANTS)
        assert {e.state for e in entries} == {CommitState.COMPLETE}
        assert pub.status(backfill="v2")["published"] is True


def test_two_publishers_race_one_wins(root: Path) -> None:
    """Two processes publish different generations at once: one moves current, one conflicts."""
    with Publication(root / "pub.yaml", environ=ENV) as pub:
        pub.write(backfill="a")
        pub.write(backfill="b")
        generations = {"a": pub.layout("a").generation, "b": pub.layout("b").generation}
    # both read current before either moves it: the conditional put decides
    procs = {
        label: start_dpone(
            ["publication", "publish", "pub.yaml", "--backfill", label, "--json"],
            cwd=root,
            failpoints="before:publication.current=sleep(2)",
            env=S3_ENV,
        )
        for label in generations
    }
    outputs = {label: proc.communicate(timeout=60) for label, proc in procs.items()}
    codes = {label: proc.returncode for label, proc in procs.items()}
    assert sorted(codes.values()) == [0, 1], outputs
    [winner] = [label for label, code in codes.items() if code == 0]
    [loser] = [label for label, code in codes.items() if code == 1]
    error = json.loads(outputs[loser][0])["error"]
    assert error["code"] == "DPONE_PUBLICATION_CONFLICT"
    assert generations[winner] in error["message"]
    _assert_complete_report(root, generations[winner])


def test_reader_during_a_killed_publish_sees_only_complete_manifests(root: Path) -> None:
    """A reader polls current while a publisher writes, is SIGKILLed mid-publish and reruns.

    Every read, concurrent with each step, is one whole generation with every row exactly
    once: the previous one until the rerun's pointer move, then the new one, never back.
    """
    with Publication(root / "pub.yaml", environ=ENV) as pub:
        v1, v2 = pub.layout("v1").generation, pub.layout("v2").generation
    stop = threading.Event()
    seen: list[str] = []
    failures: list[BaseException] = []

    def poll() -> None:
        try:
            while not stop.is_set():
                generation, ids, partitions = _reader(root)
                assert partitions == len(TENANTS), (generation, partitions)
                assert len(ids) == ROWS * len(TENANTS), (generation, len(ids))
                assert set(ids.values()) == {1}, generation
                seen.append(generation)
        except BaseException as exc:  # reported by the test thread
            failures.append(exc)

    reader = threading.Thread(target=poll)
    reader.start()
    args = ["publication", "run", "pub.yaml", "--backfill", "v2"]
    try:
        # the manifest of v2 exists for a while before the process dies short of current
        killed = run_dpone(
            args,
            cwd=root,
            failpoints="after:COMPLETE=sleep(0.2);after:publication.manifest=sleep(0.6);"
            "before:publication.current=kill",
            env=S3_ENV,
        )
        during_kill = len(seen)
        rerun = run_dpone(
            args, cwd=root, failpoints="after:publication.current=sleep(0.6)", env=S3_ENV
        )
        while len(seen) == during_kill or seen[-1] != v2:  # one more read after the move
            assert not failures
            assert reader.is_alive()
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join(timeout=60)
    assert not failures, failures[0]
    assert killed.returncode == -9, killed.stderr
    assert rerun.returncode == 0, rerun.stderr
    assert during_kill >= 3, "the reader did not overlap the killed publisher"
    assert seen[:during_kill] == [v1] * during_kill
    flip = seen.index(v2)
    assert set(seen[:flip]) == {v1}
    assert set(seen[flip:]) == {v2}
