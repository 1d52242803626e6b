"""The retry policy in stamina's test mode: schedule, limits, budget, never-retry families."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterator

import pytest
import stamina

from dpone.cli._logging import JsonFormatter
from dpone.config.workload import parse_workload
from dpone.errors import (
    CommittedIncomplete,
    CommitUnknown,
    ConfigInvalid,
    DponeError,
    FenceUnavailable,
    InjectedFault,
    IntentConflict,
    JournalUnavailable,
    LeaseHeld,
    LeaseLost,
    RecoveryConflict,
    RunKeyConflict,
    SourceInvalid,
    SourceUnavailable,
    TargetWriteFailed,
    Unauthorized,
)
from dpone.runtime.retry import RetryNotice, RetryPolicy, call_with_retries, is_retryable

POLICY = RetryPolicy(
    attempts=6,
    budget_seconds=120.0,
    wait_initial_seconds=0.5,
    wait_max_seconds=5.0,
    wait_jitter_seconds=0.25,
    wait_exp_base=2.0,
)


@pytest.fixture(autouse=True)
def testing_mode() -> Iterator[None]:
    """stamina's test mode: the policy's attempts, no real sleeping."""
    with stamina.set_testing(True, attempts=100, cap=True):
        yield


class Flaky:
    """Fails with ``error`` for the first ``failures`` calls, then returns ``"done"``."""

    def __init__(self, error: Exception, failures: int) -> None:
        self.error = error
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


def test_schedule_is_exponential_with_bounded_jitter_and_capped() -> None:
    """Delay n is initial * 2**(n-1) plus up to the jitter, never above the maximum."""
    notices: list[RetryNotice] = []
    work = Flaky(JournalUnavailable("journal down"), failures=5)
    started = time.monotonic()
    result = call_with_retries(work, policy=POLICY, on_retry=notices.append, rng=random.Random(7))
    assert result == "done"
    assert work.calls == 6
    assert time.monotonic() - started < 1.0  # ~7.75 s of planned waits, none slept
    delays = [n.delay_seconds for n in notices]
    assert [n.retry for n in notices] == [1, 2, 3, 4, 5]
    for n, delay in enumerate(delays, start=1):
        base = 0.5 * 2 ** (n - 1)
        assert min(base, 5.0) <= delay <= min(base + 0.25, 5.0), (n, delay)
    assert delays[-1] == 5.0  # 8 s + jitter is capped at wait_max
    assert delays == sorted(delays)
    assert all(isinstance(n.cause, JournalUnavailable) for n in notices)


def test_same_seed_same_schedule_other_seed_other_jitter() -> None:
    """Jitter comes from the rng: reproducible with a seed, different across seeds."""
    policy = RetryPolicy(attempts=4, wait_initial_seconds=1.0, wait_jitter_seconds=1.0)

    def schedule(seed: int) -> list[float]:
        seen: list[RetryNotice] = []
        call_with_retries(
            Flaky(FenceUnavailable("lock"), failures=3),
            policy=policy,
            on_retry=seen.append,
            rng=random.Random(seed),
        )
        return [n.delay_seconds for n in seen]

    assert schedule(1) == schedule(1)
    assert schedule(1) != schedule(2)


def test_attempts_bound_the_tries_and_the_last_error_is_raised() -> None:
    """With attempts=3 a permanent transient failure is tried 3 times, then raised."""
    work = Flaky(FenceUnavailable("still locked"), failures=99)
    with pytest.raises(FenceUnavailable, match="still locked"):
        call_with_retries(work, policy=RetryPolicy(attempts=3))
    assert work.calls == 3


def test_the_default_policy_does_not_retry() -> None:
    """No retry block: one try, the error goes straight to the caller (exit 75 on the CLI)."""
    work = Flaky(JournalUnavailable("down"), failures=1)
    with pytest.raises(JournalUnavailable):
        call_with_retries(work, policy=RetryPolicy())
    assert work.calls == 1


def test_time_budget_stops_retries_that_would_start_too_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retry that would start after the budget is not scheduled; the error is raised."""
    now = [0.0]

    def slow() -> str:
        now[0] += 4.0  # each try takes 4 s of the budget
        raise JournalUnavailable("down")

    policy = RetryPolicy(
        attempts=50, budget_seconds=10.0, wait_initial_seconds=1.0, wait_jitter_seconds=0
    )
    seen: list[RetryNotice] = []
    with caplog.at_level(logging.WARNING, logger="dpone"), pytest.raises(JournalUnavailable):
        call_with_retries(slow, policy=policy, on_retry=seen.append, clock=lambda: now[0])
    # try 1 ends at 4 s (+1 s wait ok), try 2 ends at 8 s (+2 s wait = 10 s ok), try 3
    # ends at 12 s: over budget, no retry
    assert [n.retry for n in seen] == [1, 2]
    assert any(getattr(r, "dpone", {}).get("event") == "retry_budget_spent" for r in caplog.records)


@pytest.mark.parametrize(
    "error",
    [
        CommitUnknown("outcome unknown"),
        IntentConflict("another intent"),
        RecoveryConflict("disagree"),
        ConfigInvalid("bad field", field="x"),
        Unauthorized("not allowed"),
        RunKeyConflict("key reused"),
        LeaseHeld("in flight"),
        TargetWriteFailed("constraint"),
        SourceInvalid("bad row"),
        ValueError("not a dpone error"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_never_retried_families_are_tried_once(error: Exception) -> None:
    """COMMIT_UNKNOWN, intent conflict, config, authorization (and every non-transient)."""
    work = Flaky(error, failures=99)
    with pytest.raises(type(error)):
        call_with_retries(work, policy=POLICY)
    assert work.calls == 1
    assert not is_retryable(error)


@pytest.mark.parametrize(
    "error",
    [
        JournalUnavailable("down"),
        FenceUnavailable("locked"),
        LeaseLost("stale"),
        CommittedIncomplete("finish me"),
        InjectedFault("test"),
        SourceUnavailable("source server down"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transient_families_are_retried(error: DponeError) -> None:
    """TRANSIENT errors outside the never-retry list get another try."""
    work = Flaky(error, failures=2)
    assert call_with_retries(work, policy=POLICY) == "done"
    assert work.calls == 3


def test_each_retry_is_a_json_log_line_with_delay_and_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The CLI's JSON log format carries event, retry number, delay and error code."""
    work = Flaky(JournalUnavailable("down", operation_id="sha256:" + "a" * 64), failures=2)
    with caplog.at_level(logging.WARNING, logger="dpone"):
        call_with_retries(work, policy=POLICY, rng=random.Random(1))
    lines = [
        json.loads(JsonFormatter().format(r))
        for r in caplog.records
        if getattr(r, "dpone", {}).get("event") == "retry"
    ]
    assert [line["retry"] for line in lines] == [1, 2]
    for line in lines:
        assert line["cause"] == "DPONE_TARGET_COMMIT_JOURNAL_UNAVAILABLE"
        assert line["delay_s"] > 0
        assert line["operation_id"] == "sha256:" + "a" * 64
        assert line["level"] == "warning"


def test_workload_retry_block_is_validated() -> None:
    """retry: attempts 0 or an unknown key is DPONE_CONFIG_INVALID naming the field."""
    base = {
        "workload": "w",
        "release": "1",
        "deployment": "d",
        "source": {"kind": "csv", "path": "x.csv"},
        "target": {"kind": "sqlite", "url": "sqlite:///t.db", "table": "t"},
        "load": {"strategy": "append"},
    }
    from pathlib import Path

    ok = parse_workload({**base, "retry": {"attempts": 5, "budget_seconds": 30}}, base_dir=Path())
    assert (ok.retry.attempts, ok.retry.budget_seconds) == (5, 30)
    assert parse_workload(base, base_dir=Path()).retry.attempts == 1
    for bad in ({"attempts": 0}, {"tries": 3}, {"budget_seconds": -1}):
        with pytest.raises(ConfigInvalid) as caught:
            parse_workload({**base, "retry": bad}, base_dir=Path())
        assert caught.value.field is not None
        assert caught.value.field.startswith("retry")
