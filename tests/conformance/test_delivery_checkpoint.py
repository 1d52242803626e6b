"""``DeliveryCheckpointPort`` on the memory, SQLite and PostgreSQL journals.

A delivery binds what it promotes before anything is sent and promotes it by an
absolute write once its success is verified; a repeated promotion changes nothing;
the watermark follows ADR 0005 (contiguous, pending beyond a gap).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from dpone.contracts.checkpoint import CheckpointAdvance, stream_id
from dpone.contracts.identity import Interval

ORIGIN = datetime(2026, 11, 1, tzinfo=UTC)
STREAM = stream_id(
    workload_id="orders", deployment_id="d", partition="-", target_identity="rest:http://r"
)


def _advance(day: int) -> CheckpointAdvance:
    return CheckpointAdvance.of(
        stream=STREAM,
        workload_id="orders",
        partition="-",
        target_identity="rest:http://r",
        origin=ORIGIN,
        interval=Interval(
            start=datetime(2026, 11, day, tzinfo=UTC), end=datetime(2026, 11, day + 1, tzinfo=UTC)
        ),
    )


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def journal(request, tmp_path) -> Iterator[object]:
    if request.param == "memory":
        from dpone.adapters.journal.memory import InMemoryCommitJournal

        yield InMemoryCommitJournal()
        return
    if request.param == "sqlite":
        from dpone.adapters.journal.sqlite import SqliteCommitJournal

        opened = SqliteCommitJournal(tmp_path / "journal.db")
    else:
        from dpone.adapters.journal.postgres import PostgresCommitJournal

        dsn = request.getfixturevalue("pg_available")
        opened = PostgresCommitJournal(dsn, schema=request.getfixturevalue("pg_schema"))
    yield opened
    opened.close()


def test_bind_is_create_if_absent_and_readable(journal):
    """The first binding wins; an unknown operation (or no table yet) reads None."""
    assert journal.delivery_checkpoint("sha256:none") is None
    first = journal.bind_delivery_checkpoint(operation_id="op-1", checkpoint=_advance(1))
    again = journal.bind_delivery_checkpoint(operation_id="op-1", checkpoint=_advance(2))
    assert first == again == _advance(1)
    assert journal.delivery_checkpoint("op-1") == _advance(1)
    assert journal.delivery_checkpoint("op-2") is None


def test_promotion_is_absolute_and_contiguous(journal):
    """Day 2 first waits beyond the gap; day 1 chains both; repeats change nothing."""
    assert journal.promote_delivered(operation_id="op-2", checkpoint=_advance(2)) is True
    checkpoint = journal.get_checkpoint(STREAM)
    assert (checkpoint.watermark, checkpoint.pending) == (_advance(1).start, 1)
    assert journal.promote_delivered(operation_id="op-1", checkpoint=_advance(1)) is True
    assert journal.promote_delivered(operation_id="op-1", checkpoint=_advance(1)) is False
    assert journal.promote_delivered(operation_id="op-2", checkpoint=_advance(2)) is False
    checkpoint = journal.get_checkpoint(STREAM)
    assert (checkpoint.watermark, checkpoint.pending) == (_advance(2).end, 0)
    assert checkpoint.operation_id == "op-1"  # the completion that moved it last


def test_concurrent_promoters_record_one_promotion(journal, request):
    """Four threads promote the same interval at once: exactly one records it."""
    if request.node.callspec.params["journal"] == "memory":
        opened = [journal] * 4
    else:
        opened = [_reopen(journal, request) for _ in range(4)]
    results: list[bool] = []
    barrier = threading.Barrier(4)

    def promote(one) -> None:
        barrier.wait()
        results.append(one.promote_delivered(operation_id="op-1", checkpoint=_advance(1)))

    threads = [threading.Thread(target=promote, args=(one,)) for one in opened]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    if opened[0] is not journal:
        for one in opened:
            one.close()
    assert sorted(results) == [False, False, False, True]
    assert journal.get_checkpoint(STREAM).watermark == _advance(1).end


def _reopen(journal, request):
    """Another connection to the same journal (one per thread, as separate processes have)."""
    if request.node.callspec.params["journal"] == "sqlite":
        return journal.__class__(journal._path)
    return journal.__class__(
        request.getfixturevalue("pg_available"), schema=request.getfixturevalue("pg_schema")
    )
