"""Delivery contracts and the sink's input checks (no I/O)."""

from __future__ import annotations

import pytest

from dpone.adapters.delivery.rest import check_credential_ref, normalize_receiver_url
from dpone.contracts.delivery import (
    CAPACITY_HOLDING,
    DELIVERY_TRANSITIONS,
    DeliveryState,
    PayloadRef,
    RemoteStatus,
)
from dpone.errors import ConfigInvalid
from dpone.runtime.delivery import child_operation_id

D = DeliveryState


def test_every_state_has_a_row_and_final_states_have_no_exit():
    """The transition table covers every state; COMPLETE and the remote ends are final."""
    assert set(DELIVERY_TRANSITIONS) == set(DeliveryState)
    for final in (D.COMPLETE, D.REMOTE_FAILED, D.REMOTE_CANCELLED, D.REJECTED, D.BLOCKED):
        assert DELIVERY_TRANSITIONS[final] == frozenset()
    # nothing reaches SUBMITTING except from a state proven not to hold a live submit
    sources = {s for s, targets in DELIVERY_TRANSITIONS.items() if D.SUBMITTING in targets}
    assert sources == {D.STAGED, D.RETRY_WAIT, D.SUBMIT_UNKNOWN}
    assert D.COMPLETE in DELIVERY_TRANSITIONS[D.REMOTE_SUCCEEDED]
    assert all(
        D.COMPLETE not in t for s, t in DELIVERY_TRANSITIONS.items() if s is not D.REMOTE_SUCCEEDED
    )


def test_capacity_is_held_while_a_job_may_exist():
    """Unknown, accepted and blocked work hold a slot; work proven not accepted does not."""
    assert {D.SUBMITTING, D.SUBMIT_UNKNOWN, D.ACCEPTED, D.BLOCKED} == CAPACITY_HOLDING
    assert D.RETRY_WAIT not in CAPACITY_HOLDING
    assert D.REJECTED not in CAPACITY_HOLDING


def test_payload_chunk_count_and_remote_terminal_states():
    """Chunks round up; succeeded, failed and cancelled are terminal."""
    ref = PayloadRef(path="/p", digest="sha256:" + "0" * 64, size_bytes=10, rows=2, chunk_bytes=4)
    assert ref.chunk_count == 3
    empty = PayloadRef(path="/p", digest="sha256:" + "0" * 64, size_bytes=0, rows=0, chunk_bytes=4)
    assert empty.chunk_count == 0
    assert {s for s in RemoteStatus if s.terminal} == {
        RemoteStatus.SUCCEEDED,
        RemoteStatus.FAILED,
        RemoteStatus.CANCELLED,
    }


def test_receiver_urls_and_credentials_are_checked():
    """URLs are normalized without secrets; credentials must be env: or file: references."""
    assert normalize_receiver_url("HTTP://Example.COM:8080/api/") == "http://example.com:8080/api"
    for bad in ("ftp://x", "http://u:p@x", "http://x/?token=1", "not a url"):
        with pytest.raises(ConfigInvalid):
            normalize_receiver_url(bad)
    assert check_credential_ref("env:RECEIVER_TOKEN") == "env:RECEIVER_TOKEN"
    assert check_credential_ref("file:/run/secrets/token") == "file:/run/secrets/token"
    assert check_credential_ref(None) is None
    for bad in ("Bearer abc", "abc123", "env:", "env:1X"):
        with pytest.raises(ConfigInvalid):
            check_credential_ref(bad)


def test_child_operation_ids_are_stable_and_distinct():
    """A child's id depends only on its parent and index."""
    parent = "sha256:" + "1" * 64
    assert child_operation_id(parent, 0) == child_operation_id(parent, 0)
    assert child_operation_id(parent, 0) != child_operation_id(parent, 1)
    assert child_operation_id(parent, 0).startswith("sha256:")
