"""Partition publication end to end in one process, on the local store and on S3 (loopback)."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpone.config.publication import Publication
from dpone.config.workload import load_workload
from dpone.contracts.states import CommitState
from dpone.errors import ConfigInvalid, InjectedFault, IntentConflict, PublicationRefused
from dpone.publication.service import unresolved_targets
from dpone.runtime import failpoints
from dpone.testing.crash import run_dpone
from dpone.testing.s3_server import S3Server
from tests.fixtures.publication import (
    INTERVAL,
    S3_ENV,
    local_store,
    s3_store,
    write_tenants,
    write_workload,
)

TENANTS = ("t1", "t2", "t3")
ENV = {**os.environ, **S3_ENV}


@pytest.fixture(params=["local", "s3"])
def workload(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A three-tenant publication workload on each store."""
    write_tenants(tmp_path, TENANTS, rows=50)
    if request.param == "local":
        store = local_store()
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        store = s3_store(server, request.getfixturevalue("s3_bucket"))
    return write_workload(tmp_path, store=store)


@pytest.fixture
def pub(workload: Path) -> Iterator[Publication]:
    with Publication(workload, environ=ENV) as opened:
        yield opened


@pytest.fixture(autouse=True)
def _no_failpoints() -> Iterator[None]:
    yield
    failpoints.configure(None)


def _ids(pub: Publication) -> Counter[object]:
    read = pub.service.read_rows(pub.layout())
    assert read is not None
    _view, names, rows = read
    return Counter(row[names.index("id")] for row in rows)


def test_write_reconcile_publish_read(pub: Publication) -> None:
    """All partitions, one manifest, every row exactly once through current; reruns replay."""
    assert pub.read() is None
    results, published = pub.run()
    assert [r.state for r in results] == [CommitState.COMPLETE] * 3
    assert published.partitions == 3
    assert published.rows == 150
    ids = _ids(pub)
    assert len(ids) == 150
    assert set(ids.values()) == {1}
    again, republished = pub.run()
    assert all(r.replayed for r in again)
    assert republished.already_current


def test_generation_is_derived_and_backfill_is_isolated(pub: Publication) -> None:
    """The same interval always maps to one generation; a backfill label to another."""
    assert pub.layout().generation == pub.layout().generation
    assert pub.layout("fix1").generation != pub.layout().generation
    pub.run()
    first = pub.layout().generation
    _, published = pub.run(backfill="fix1")
    assert published.previous_generation == first
    view = pub.read()
    assert view is not None
    assert view.pointer.generation == pub.layout("fix1").generation
    assert all(f"gen={pub.layout('fix1').generation}/" in e.key for e in view.manifest.partitions)
    assert len(_ids(pub)) == 150


def test_incomplete_set_is_refused_with_the_missing_partitions(pub: Publication) -> None:
    """Reconcile names what is missing; readers stay on nothing (no premature current)."""
    assert pub.status()["partial_age_seconds"] is None  # not started
    pub.write(partitions=["t1"])
    with pytest.raises(PublicationRefused) as caught:
        pub.publish()
    assert "missing partitions (2 of 3): t2, t3" in caught.value.message
    assert pub.read() is None
    age = pub.status()["partial_age_seconds"]
    assert isinstance(age, float)
    assert 0 <= age < 120
    pub.write()
    assert pub.status()["partial_age_seconds"] is None  # complete


def test_source_changed_between_attempts_is_an_intent_conflict(
    pub: Publication, workload: Path
) -> None:
    """A changed source file is refused before anything is written or read."""
    pub.write(partitions=["t1"])
    before = {o.key for o in pub.store.list("tenant_report")}
    (workload.parent / "in" / "t3.csv").write_text("id,tenant,amount\nt3-x,t3,9\n")
    with pytest.raises(IntentConflict) as caught:
        pub.write()
    assert "t3" in caught.value.message
    assert {o.key for o in pub.store.list("tenant_report")} == before
    assert len(pub.journal.list_entries()) == 1


def test_corrupt_and_mixed_partitions_are_refused(pub: Publication) -> None:
    """A changed data file and a record of another generation are each named."""
    pub.write()
    pub.write(backfill="other")
    layout = pub.layout()
    pub.store.put(layout.data_key("t1"), b"not parquet at all")
    foreign = pub.store.read(pub.layout("other").checksum_key("t2"))
    assert foreign is not None
    pub.store.put(layout.checksum_key("t2"), foreign[0])
    with pytest.raises(PublicationRefused) as caught:
        pub.reconcile()
    message = caught.value.message
    assert "t1: checksum mismatch" in message
    assert "t2: record belongs to generation" in message
    assert "mixed generation" in message


def test_audits_refuse_nulls_and_short_partitions(tmp_path: Path) -> None:
    """not_null and min_rows audits each name the failing partition."""
    write_tenants(tmp_path, TENANTS, rows=3)
    (tmp_path / "in" / "t2.csv").write_text("id,tenant,amount\n,t2,1\nx,t2,2\n")
    audits = {"min_rows": 3, "not_null": ["id", "nope"]}
    path = write_workload(tmp_path, store=local_store(), audits=audits)
    with Publication(path) as pub:
        pub.write()
        with pytest.raises(PublicationRefused) as caught:
            pub.publish()
        assert pub.read() is None
    message = caught.value.message
    assert "t2: audit min_rows failed (2 < 3)" in message
    assert "t2: audit not_null failed (1 nulls in id)" in message
    assert "t1: audit not_null names unknown column nope" in message
    assert "t1: audit min_rows" not in message


def test_cleanup_keeps_current_and_waits_for_recovery(pub: Publication) -> None:
    """Old generations go; never current, never one just replaced, never during a recovery."""
    pub.run(backfill="old")
    pub.run()
    old, current = pub.layout("old").generation, pub.layout().generation
    kept = pub.cleanup(older_than_hours=1)
    assert kept.deleted == ()
    assert kept.kept == {
        old: "replaced by current less than the retention cutoff ago",
        current: "current",
    }
    # an unresolved operation on the interval (a failed partition) blocks cleanup
    failpoints.configure("fence.mutate.before_commit=raise")
    with pytest.raises(InjectedFault):
        pub.write(backfill="broken", partitions=["t1"])
    failpoints.configure(None)
    blocked = pub.cleanup(older_than_hours=0)
    assert blocked.deleted == ()
    assert "never clean up during a recovery" in blocked.kept[old]
    pub.write(backfill="broken", partitions=["t1"])  # the recovery finishes
    broken = pub.layout("broken").generation
    young = pub.cleanup(older_than_hours=1)
    assert young.kept[broken] == "younger than the retention cutoff"
    done = pub.cleanup(older_than_hours=0)
    assert sorted(done.deleted) == sorted([old, broken])
    assert done.kept == {current: "current"}
    assert pub.store.list(pub.layout("old").prefix) == []
    assert len(_ids(pub)) == 150
    # a deleted generation never comes back half: a rerun is told to use a new backfill
    # (its partitions are COMPLETE in the journal and would otherwise replay into nothing)
    with pytest.raises(PublicationRefused, match="deleted by cleanup") as refused:
        pub.write(backfill="old")
    assert "--backfill" in (refused.value.hint or "")
    with pytest.raises(PublicationRefused, match="deleted by cleanup"):
        pub.reconcile(backfill="old")
    assert pub.store.list(pub.layout("old").prefix) == []
    assert pub.status(backfill="old")["retired"] is not None
    assert pub.status()["retired"] is None
    assert pub.cleanup(older_than_hours=0).deleted == ()


def test_csv_format(tmp_path: Path) -> None:
    """CSV output: same protocol, rows read back as text."""
    write_tenants(tmp_path, TENANTS, rows=4)
    path = write_workload(tmp_path, store=local_store(), partitions=list(TENANTS), fmt="csv")
    with Publication(path) as pub:
        _, published = pub.run()
        assert published.rows == 12
        assert pub.layout().data_key("t1").endswith("t1.csv")
        assert len(_ids(pub)) == 12


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"partitions": None}, "publication"),
        ({"partitions": []}, "publication"),
        ({"partitions": ["a", "a"]}, "publication"),
        ({"partitions": ["../x"]}, "publication.partitions"),
        ({"format": "xlsx"}, "publication.format"),
        ({"store": {"kind": "ftp"}}, "publication.store"),
        ({"interval": "yesterday"}, "publication.interval"),
    ],
)
def test_bad_publication_sections_are_config_errors(
    tmp_path: Path, change: dict[str, object], named: str
) -> None:
    """Each mistake is DPONE_CONFIG_INVALID naming the field."""
    path = write_workload(tmp_path, store=local_store(), partitions=["a"])
    data = json.loads(path.read_text())
    data["publication"].update(change)
    if change.get("partitions", 1) is None:
        del data["publication"]["partitions"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigInvalid) as caught:
        load_workload(path)
    assert (caught.value.field or "").startswith(named)


def test_cli_publication_commands(tmp_path: Path) -> None:
    """status / write / reconcile / publish / read / cleanup with --json and exit codes."""
    write_tenants(tmp_path, TENANTS, rows=5)
    write_workload(tmp_path, store=local_store())
    status = run_dpone(["publication", "status", "pub.yaml", "--json"], cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["missing"] == list(TENANTS)
    wrote = run_dpone(["publication", "write", "pub.yaml", "--partition", "t1"], cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    refused = run_dpone(["publication", "reconcile", "pub.yaml", "--json"], cwd=tmp_path)
    assert refused.returncode == 1
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "DPONE_PUBLICATION_REFUSED"
    assert "t2, t3" in error["message"]
    ran = run_dpone(["run", "pub.yaml", "--interval", INTERVAL, "--json"], cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    payload = json.loads(ran.stdout)
    assert payload["published"]["partitions"] == 3
    assert [p["replayed"] for p in payload["partitions"]] == [True, False, False]
    read = run_dpone(["publication", "read", "pub.yaml", "--json"], cwd=tmp_path)
    assert read.returncode == 0, read.stderr
    files = json.loads(read.stdout)["files"]
    assert [f["partition"] for f in files] == list(TENANTS)
    assert all((tmp_path / "lake" / f["key"]).exists() for f in files)
    cleanup = run_dpone(["publication", "cleanup", "pub.yaml", "--json"], cwd=tmp_path)
    assert cleanup.returncode == 0, cleanup.stderr
    assert json.loads(cleanup.stdout)["deleted"] == []
    other = run_dpone(
        ["publication", "status", "pub.yaml", "--interval", "2026-11-02/2026-11-03"], cwd=tmp_path
    )
    assert other.returncode == 2
    assert "differs from the workload's fixed" in other.stderr
    certify = run_dpone(["certify", "pub.yaml", "--json"], cwd=tmp_path)
    assert certify.returncode == 2
    assert json.loads(certify.stdout)["error"]["field"] == "target.kind"


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_formats_refuse_ragged_rows(fmt: str) -> None:
    """A row with the wrong number of values is DPONE_TARGET_WRITE_FAILED, never a traceback."""
    from dpone.adapters.objectstores.formats import open_format
    from dpone.contracts.load import Column, ColumnType
    from dpone.errors import TargetWriteFailed

    columns = (Column(name="a", type=ColumnType.INTEGER), Column(name="b", type=ColumnType.TEXT))
    encoder = open_format(fmt)
    _data, rows = encoder.encode(columns, [[("1", "x"), ("2", "")]])
    assert rows == 2
    with pytest.raises(TargetWriteFailed):
        encoder.encode(columns, [[("1", "x"), ("2",)]])
    if fmt == "parquet":
        with pytest.raises(TargetWriteFailed, match="column 'a'"):
            encoder.encode(columns, [[("one", "x")]])


def test_twin_publishers_of_one_generation_agree(tmp_path: Path) -> None:
    """Two publishers of the same manifest race: one moves current, the other finds it done."""
    import threading

    from dpone.publication.service import PublishResult

    write_tenants(tmp_path, TENANTS, rows=3)
    path = write_workload(tmp_path, store=local_store())
    with Publication(path) as pub:
        pub.write()
        failpoints.configure("before:publication.current=sleep(0.5)")
        results: list[PublishResult] = []
        threads = [threading.Thread(target=lambda: results.append(pub.publish())) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failpoints.configure(None)
        assert sorted(r.already_current for r in results) == [False, True]
        view = pub.read()
        assert view is not None
        assert view.pointer.generation == pub.layout().generation


def test_pinned_source_hashes_in_the_workload(tmp_path: Path) -> None:
    """source_hashes pins the cut: matching files publish; a changed one writes nothing."""
    import hashlib

    write_tenants(tmp_path, TENANTS, rows=4)
    path = write_workload(tmp_path, store=local_store())
    data = json.loads(path.read_text())
    hashes = {
        t: "sha256:" + hashlib.sha256((tmp_path / "in" / f"{t}.csv").read_bytes()).hexdigest()
        for t in TENANTS
    }
    data["publication"]["source_hashes"] = {t: hashes[t] for t in TENANTS[:2]}
    path.write_text(json.dumps(data))
    with Publication(path) as pub, pytest.raises(ConfigInvalid, match="lacks partition"):
        pub.write()
    data["publication"]["source_hashes"] = hashes
    path.write_text(json.dumps(data))
    (tmp_path / "in" / "t2.csv").write_text("id,tenant,amount\nt2-x,t2,1\n")
    with Publication(path) as pub:
        with pytest.raises(IntentConflict, match="t2"):
            pub.write()
        assert pub.store.list("tenant_report") == []
    write_tenants(tmp_path, TENANTS, rows=4)
    with Publication(path) as pub:
        _, published = pub.run()
        assert published.rows == 12


def test_backfill_of_a_corrected_source_is_isolated(pub: Publication, workload: Path) -> None:
    """A backfill writes its own generation and journal entries; readers and the original
    generation are untouched until its publish, and the original stays publishable."""
    pub.run()
    original = pub.layout()
    before = {o.key: o.etag for o in pub.store.list(original.prefix)}
    (workload.parent / "in" / "t2.csv").write_text("id,tenant,amount\nt2-new,t2,7\n")
    with pytest.raises(IntentConflict):
        pub.write()  # the original generation keeps its pinned cut
    results = pub.write(backfill="fix")
    assert all(r.state is CommitState.COMPLETE and not r.replayed for r in results)
    fix = pub.layout("fix")
    assert {o.key: o.etag for o in pub.store.list(original.prefix)} == before
    view = pub.read()
    assert view is not None
    assert view.pointer.generation == original.generation  # nothing visible before publish
    assert "t2-new" not in _ids(pub)
    ids = {e.operation_id for e in pub.journal.list_entries(limit=100)}
    assert len(ids) == 2 * len(TENANTS)  # its own operations, none of the original's reused
    published = pub.publish(backfill="fix")
    assert (published.generation, published.previous_generation) == (
        fix.generation,
        original.generation,
    )
    assert _ids(pub)["t2-new"] == 1
    assert len(_ids(pub)) == 101
    assert {o.key: o.etag for o in pub.store.list(original.prefix)} == before
    back = pub.publish()  # the untouched original can be published again (a rollback)
    assert back.previous_generation == fix.generation
    assert len(_ids(pub)) == 150
    assert "t2-new" not in _ids(pub)


def test_cleanup_is_blocked_only_by_a_recovery_of_the_same_interval(tmp_path: Path) -> None:
    """An unresolved partition of another interval does not hold this interval's cleanup."""
    write_tenants(tmp_path, TENANTS, rows=3)
    path = write_workload(tmp_path, store=local_store())
    data = json.loads(path.read_text())
    del data["publication"]["interval"]
    path.write_text(json.dumps(data))
    with (
        Publication(path, interval=INTERVAL) as first,
        Publication(path, interval="2026-11-02/2026-11-03") as second,
    ):
        first.run(backfill="old")
        first.run()
        failpoints.configure("fence.mutate.before_commit=raise")
        with pytest.raises(InjectedFault):
            second.write(partitions=["t1"])
        failpoints.configure(None)
        assert second.cleanup(older_than_hours=0).deleted == ()
        assert (
            "never clean up during a recovery"
            in second.cleanup(older_than_hours=0).kept[second.layout().generation]
        )
        # more unresolved operations than cleanup can list: it cannot tell, so it keeps all
        assert unresolved_targets(first.journal, limit=1) is None
        unsure = first.service.cleanup(
            first.layout(),
            older_than_seconds=0,
            unresolved=None,
            target_prefix=f"staging:{first.store.location()}/{first.layout().interval_prefix}/",
        )
        assert unsure.deleted == ()
        assert "too many unresolved operations" in unsure.kept[first.layout("old").generation]
        done = first.cleanup(older_than_hours=0)
        assert done.deleted == (first.layout("old").generation,)
        assert first.store.list(first.layout("old").prefix) == []
        assert second.store.head(second.layout().data_key("t1")) is not None


def test_reconcile_lists_every_problem_at_once(tmp_path: Path) -> None:
    """Each way a generation can be wrong is named with its partition, all in one refusal."""
    import dataclasses
    import hashlib

    from dpone.contracts.load import Column, ColumnType
    from dpone.contracts.publication import ChecksumRecord

    tenants = ("t1", "t2", "t3", "t4", "t5", "t6", "t7")
    write_tenants(tmp_path, tenants, rows=5)
    with Publication(write_workload(tmp_path, store=local_store())) as pub:
        pub.write()
        layout, store = pub.layout(), pub.store

        def record(partition: str) -> ChecksumRecord:
            got = store.read(layout.checksum_key(partition))
            assert got is not None
            return ChecksumRecord.from_bytes(got[0])

        def rewrite(partition: str, **changes: object) -> None:
            changed = dataclasses.replace(record(partition), **changes)  # type: ignore[arg-type]
            store.put(layout.checksum_key(partition), changed.to_bytes())

        def sha(data: bytes) -> str:
            return "sha256:" + hashlib.sha256(data).hexdigest()

        rewrite("t1", rows=6)
        rewrite("t2", source_manifest="sha256:" + "0" * 64)
        store.put(layout.checksum_key("t3"), b"{not json")
        store.delete(layout.data_key("t4"))
        store.delete(layout.checksum_key("t5"))
        store.put(layout.data_key("t6"), b"garbage")
        rewrite("t6", sha256=sha(b"garbage"))
        other, rows = pub.format.encode(
            (Column(name="only", type=ColumnType.TEXT),), [[("x",)] * 5]
        )
        store.put(layout.data_key("t7"), other)
        rewrite("t7", sha256=sha(other), rows=rows)
        store.put(layout.data_key("t9"), other)
        store.put(layout.checksum_key("t9"), record("t7").to_bytes())
        with pytest.raises(PublicationRefused) as caught:
            pub.publish()
        assert pub.read() is None
    message = caught.value.message
    for expected in (
        "unexpected partitions in the generation: t9",
        "missing partitions (1 of 7): t5 (data written, not committed)",
        "t1: row count mismatch (file 5, record 6)",
        "t2: written from another source cut",
        "t3: checksum record is damaged",
        "t4: data object is missing",
        "t6: data object is not a readable parquet file",
        "partitions have different columns",
    ):
        assert expected in message, (expected, message)
    assert "t7" in message.split("different columns", 1)[1]
