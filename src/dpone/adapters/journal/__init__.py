"""Commit journal adapters: ``memory`` (tests), ``sqlite`` (embedded default).

Each adapter implements :class:`dpone.ports.journal.CommitJournalPort` without inheriting
from it and passes :mod:`dpone.testing.journal_conformance`. Rules every adapter shares
(legal moves, fold history, safe values) live in :mod:`dpone.adapters.journal._rules`.
Adapters are imported by module path so that importing this package loads no driver.
"""
