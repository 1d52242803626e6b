"""LeaseKeeper: renews long work, costs nothing (no thread) for short work."""

from __future__ import annotations

import threading
import time
from typing import Any

from dpone.adapters.journal.memory import InMemoryCommitJournal
from dpone.runtime.lease import LeaseKeeper

OWNER = "host:1:2"


class CountingJournal(InMemoryCommitJournal):
    """Counts renewals."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0

    def renew_lease(self, **kwargs: Any) -> Any:
        self.renewals += 1
        return super().renew_lease(**kwargs)


def _leased(journal: CountingJournal, ttl: float) -> int:
    journal.create_intent(
        operation_id="op-1",
        intent_digest="sha256:" + "0" * 64,
        metadata={},
        actor=OWNER,
        lease_owner=OWNER,
        lease_ttl_seconds=ttl,
    )
    return 1


def _renewal_threads() -> int:
    return sum(t.name == "dpone-lease" for t in threading.enumerate())


def test_short_work_starts_no_renewal_thread_and_never_renews() -> None:
    journal = CountingJournal()
    epoch = _leased(journal, ttl=3.0)
    before = _renewal_threads()
    with LeaseKeeper(journal, operation_id="op-1", owner=OWNER, lease_epoch=epoch, ttl_seconds=3.0):
        assert _renewal_threads() == before
    time.sleep(1.2)  # past the first due time: a removed keeper is never renewed
    assert journal.renewals == 0
    assert _renewal_threads() == before


def test_long_work_is_renewed_every_third_of_the_ttl_until_it_ends() -> None:
    journal = CountingJournal()
    epoch = _leased(journal, ttl=0.3)
    with LeaseKeeper(journal, operation_id="op-1", owner=OWNER, lease_epoch=epoch, ttl_seconds=0.3):
        time.sleep(0.45)  # due at 0.1 s, then every 0.1 s
        during = journal.renewals
    assert during >= 2
    time.sleep(0.3)
    assert journal.renewals <= during + 1  # at most one renewal already under way
    entry = journal.get("op-1")
    assert entry is not None
    assert entry.lease_owner == OWNER


def test_a_keeper_due_sooner_or_later_than_the_timer_expects_is_renewed() -> None:
    """The timer thread is woken only for a keeper due before its next wake-up."""
    journal = CountingJournal()
    epoch = _leased(journal, ttl=0.3)
    other = CountingJournal()
    _leased(other, ttl=30.0)
    # the timer sleeps towards the slow keeper's renewal (10 s away); the fast one, due in
    # 0.1 s, must wake it
    with (
        LeaseKeeper(other, operation_id="op-1", owner=OWNER, lease_epoch=1, ttl_seconds=30.0),
        LeaseKeeper(journal, operation_id="op-1", owner=OWNER, lease_epoch=epoch, ttl_seconds=0.3),
    ):
        time.sleep(0.1)  # let the timer settle on its next deadline first
        time.sleep(0.35)
        assert journal.renewals >= 1
    assert other.renewals == 0
    # a keeper due after the timer's next (stale) wake-up needs no wake-up call: the
    # timer wakes, finds nothing due, and waits for it
    renewed = journal.renewals
    with LeaseKeeper(journal, operation_id="op-1", owner=OWNER, lease_epoch=epoch, ttl_seconds=0.3):
        pass  # leaves the timer a deadline 0.1 s away
    with LeaseKeeper(journal, operation_id="op-1", owner=OWNER, lease_epoch=epoch, ttl_seconds=0.6):
        time.sleep(0.5)  # due at 0.2 s
        assert journal.renewals >= renewed + 1
