"""The placeholder rewriting of a fused statement (ADR 0022): exact, or refused."""

from __future__ import annotations

import pytest

from dpone.adapters.connectors.postgres import _numbered
from dpone.adapters.journal.postgres import PostgresCommitJournal, _positional


def test_numbered_counts_placeholders_in_order_and_keeps_a_literal_percent() -> None:
    assert _numbered(b"SELECT %s, '100%%', %s FROM t WHERE a = %s") == (
        b"SELECT $1, '100%', $2 FROM t WHERE a = $3"
    )


def test_numbered_refuses_any_other_percent_sequence() -> None:
    with pytest.raises(ValueError, match="only %s and %%"):
        _numbered(b"SELECT %d")


def test_positional_lists_every_named_placeholder_in_order_repeats_included() -> None:
    statement, names = _positional("SELECT %(a)s, %(b)s::jsonb, %(a)s")
    assert statement == b"SELECT %s, %s::jsonb, %s"
    assert names == ("a", "b", "a")


def test_positional_refuses_a_stray_percent() -> None:
    with pytest.raises(ValueError, match="placeholders"):
        _positional("SELECT %(a)s, 5 % 2")


def test_the_journal_s_fused_births_wait_for_the_gate_in_every_write() -> None:
    journal = PostgresCommitJournal("postgresql://127.0.0.1:1/x", schema="s")  # no I/O
    for ctes, names in journal._fusions.values():
        text = ctes.decode()
        assert text.count("%s") == len(names)
        assert "created AS (" in text
        inserts = text.count("INSERT INTO")
        gated = text.count("EXISTS (SELECT 1 FROM gate)")
        # every INSERT but the history's (which reads ``created``) and the attempt's
        # (which reads ``run``) is conditional on the gate
        assert gated == inserts - 1 - ("dpone_run_attempts" in text)


def test_the_fused_run_variant_writes_the_entry_only_after_the_run() -> None:
    """The entry's INSERT reads ``run`` (ADR 0022 rule 4): the run's INSERT, and a run key
    already taken, come before the rows'."""
    journal = PostgresCommitJournal("postgresql://127.0.0.1:1/x", schema="s")  # no I/O
    with_run = [c.decode() for c, _ in journal._fusions.values() if b"dpone_runs" in c]
    assert len(with_run) == 1
    created = with_run[0].split("created AS (", 1)[1].split("RETURNING", 1)[0]
    assert "EXISTS (SELECT 1 FROM run) AND EXISTS (SELECT 1 FROM gate)" in created
