"""Retries inside one invocation: exponential backoff with jitter, bounded, by retryability.

Built on stamina (maintained, typed, with explicit finite limits and a test mode that
skips sleeping): stamina runs the loop and the sleeps, this module decides. A failure is
retried only when its error says TRANSIENT and its family is not on the never-retry
list; the delay before retry ``n`` is ``min(wait_max, wait_initial * base**(n-1) +
uniform(0, jitter))`` (stamina's own formula), and a retry is scheduled only when it
fits both the attempt count and the time budget. Each scheduled retry is logged with
its delay and cause before the wait.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import msgspec

from dpone.errors import DponeError, ErrorCode, Retryability
from dpone.runtime._log import LazyLogger

if TYPE_CHECKING:
    from types import ModuleType

__all__ = [
    "NEVER_RETRY",
    "RetryNotice",
    "RetryPolicy",
    "call_with_retries",
    "is_retryable",
    "silence_stamina_hooks",
]

_T = TypeVar("_T")
_log = LazyLogger("dpone.runtime")

#: Families never retried automatically, whatever else is configured: an unknown outcome,
#: a changed intent, bad configuration, a refused principal, a reused idempotency key,
#: and another live executor (an in-flight run is returned to the caller at once).
NEVER_RETRY: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.COMMIT_UNKNOWN,
        ErrorCode.INTENT_CONFLICT,
        ErrorCode.RECOVERY_CONFLICT,
        ErrorCode.CONFIG_INVALID,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.RUN_KEY_CONFLICT,
        ErrorCode.LEASE_HELD,
    }
)


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How often and how long one invocation retries transient failures.

    Args:
        attempts: tries in all, the first included; 1 turns retries off (the default).
        budget_seconds: no retry is scheduled that would start after this many seconds.
        wait_initial_seconds: the delay before the first retry (before jitter).
        wait_max_seconds: no delay is longer than this.
        wait_jitter_seconds: up to this much random delay is added to each wait.
        wait_exp_base: each delay is this many times the previous one.
    """

    attempts: int = 1
    budget_seconds: float = 60.0
    wait_initial_seconds: float = 0.5
    wait_max_seconds: float = 10.0
    wait_jitter_seconds: float = 0.5
    wait_exp_base: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.budget_seconds <= 0:
            raise ValueError("attempts must be at least 1 and budget_seconds positive")

    def delay(self, retry: int, rng: random.Random) -> float:
        """Return the wait before retry number ``retry`` (1-based), jitter included."""
        jitter = rng.uniform(0, self.wait_jitter_seconds) if self.wait_jitter_seconds else 0.0
        try:
            base = self.wait_initial_seconds * self.wait_exp_base ** (retry - 1)
        except OverflowError:
            return self.wait_max_seconds
        return min(self.wait_max_seconds, base + jitter)


class RetryNotice(msgspec.Struct, frozen=True, kw_only=True):
    """One scheduled retry: its number, the wait before it, and the error that caused it."""

    retry: int
    delay_seconds: float
    cause: DponeError
    elapsed_seconds: float


def is_retryable(exc: BaseException) -> bool:
    """True when ``exc`` is a transient dpone error outside the never-retry families."""
    return (
        isinstance(exc, DponeError)
        and exc.retryability is Retryability.TRANSIENT
        and exc.code not in NEVER_RETRY
    )


def call_with_retries(
    work: Callable[[], _T],
    *,
    policy: RetryPolicy,
    on_retry: Callable[[RetryNotice], None] | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> _T:
    """Call ``work`` until it returns, retrying transient failures under ``policy``.

    Raises:
        DponeError: the last error when it is not retryable, or attempts or budget ran out.
        Exception: anything that is not a dpone error, at once (never retried).

    """
    if policy.attempts == 1:
        # one try (the default): nothing to schedule, so skip building the retry machinery
        # and importing stamina (a small operation's journal read costs less; and it is
        # part of a short `dpone run`'s start-up; docs/benchmarks.md)
        return work()
    chance = rng or random.Random()  # noqa: S311 - jitter, not cryptography
    started = clock()
    scheduled = 0

    def decide(exc: Exception) -> bool | float:
        nonlocal scheduled
        if not is_retryable(exc) or scheduled + 1 >= policy.attempts:
            return False
        assert isinstance(exc, DponeError)  # noqa: S101 - is_retryable checked it
        wait = policy.delay(scheduled + 1, chance)
        elapsed = clock() - started
        if elapsed + wait > policy.budget_seconds:
            _log.warning(
                "not retrying %s: the next try would start after the %gs budget",
                exc.code.value,
                policy.budget_seconds,
                extra={"dpone": {"event": "retry_budget_spent", "cause": exc.code.value}},
            )
            return False
        scheduled += 1
        notice = RetryNotice(
            retry=scheduled, delay_seconds=wait, cause=exc, elapsed_seconds=elapsed
        )
        _log_retry(notice)
        if on_retry is not None:
            on_retry(notice)
        return wait  # stamina waits exactly this (nothing in its test mode)

    for attempt in _stamina().retry_context(
        on=decide,
        attempts=policy.attempts,
        timeout=policy.budget_seconds,
        wait_initial=policy.wait_initial_seconds,
        wait_max=policy.wait_max_seconds,
        wait_jitter=policy.wait_jitter_seconds,
        wait_exp_base=policy.wait_exp_base,
    ):
        with attempt:
            return work()
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


_hooks_silenced = False


def silence_stamina_hooks() -> None:
    """Turn off stamina's own retry hooks in this process (the CLI logs each retry itself).

    Applied now if stamina is loaded, else when :func:`call_with_retries` first loads it
    (a policy of one try never does).
    """
    global _hooks_silenced  # noqa: PLW0603 - a process-wide setting, like stamina's own
    _hooks_silenced = True
    if "stamina" in sys.modules:
        _stamina()


def _stamina() -> ModuleType:
    """Import stamina on first use (applying :func:`silence_stamina_hooks` if asked)."""
    import stamina
    import stamina.instrumentation

    if _hooks_silenced:
        stamina.instrumentation.set_on_retry_hooks([])
    return stamina


def _log_retry(notice: RetryNotice) -> None:
    cause = notice.cause
    fields: dict[str, object] = {
        "event": "retry",
        "retry": notice.retry,
        "delay_s": round(notice.delay_seconds, 3),
        "elapsed_s": round(notice.elapsed_seconds, 3),
        "cause": cause.code.value,
    }
    if cause.operation_id is not None:
        fields["operation_id"] = cause.operation_id
    _log.warning(
        "retry %d in %.2fs after %s: %s",
        notice.retry,
        notice.delay_seconds,
        cause.code.value,
        cause.message,
        extra={"dpone": fields},
    )
