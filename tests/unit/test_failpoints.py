"""Failpoints: parsing, actions, and zero cost when unset."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from dpone.errors import ConfigInvalid, InjectedFault
from dpone.runtime import failpoints


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    yield
    failpoints.configure(None)


def test_raise_fires_only_where_configured() -> None:
    """A raise action fires at its own point and nowhere else."""
    failpoints.configure("after:COMMITTING=raise")
    failpoints.hit("before:COMMITTING")
    with pytest.raises(InjectedFault):
        failpoints.hit("after:COMMITTING")


def test_nth_hit() -> None:
    """@N fires on the N-th hit only."""
    failpoints.configure("before:fence.mutate=raise@2")
    failpoints.hit("before:fence.mutate")
    with pytest.raises(InjectedFault):
        failpoints.hit("before:fence.mutate")
    failpoints.hit("before:fence.mutate")


def test_sleep_action_sleeps() -> None:
    """sleep(S) delays the caller."""
    failpoints.configure("before:fence.observe=sleep(0.05)")
    started = time.monotonic()
    failpoints.hit("before:fence.observe")
    assert time.monotonic() - started >= 0.05


@pytest.mark.parametrize("spec", ["nowhere=kill", "after:COMMITTING=explode", "after:COMMITTING"])
def test_bad_specs_are_config_errors(spec: str) -> None:
    """An unknown point or action is DPONE_CONFIG_INVALID, never silently ignored."""
    with pytest.raises(ConfigInvalid):
        failpoints.configure(spec)


def test_unset_is_cheap() -> None:
    """With nothing configured a hit is a dictionary miss (well under a microsecond)."""
    failpoints.configure(None)
    started = time.perf_counter()
    for _ in range(100_000):
        failpoints.hit("after:COMMITTING")
    assert (time.perf_counter() - started) / 100_000 < 5e-6
