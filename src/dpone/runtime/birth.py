"""A new entry's birth sent ahead of its answer, read at the target's gate (ADR 0021).

Forward mode's first attempt sends the birth (the run's lookup and the entry born
COMMITTING, ADR 0018) and goes on preparing the write while the journal flushes it. The
connector calls the gate before its first byte to the target: the answer is read there,
so COMMITTING is durable before the target is touched, as always. An answer that says
not born stops the attempt before anything was sent to the target, and the run service
starts the try over from a lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

from dpone.contracts.journal import JournalEntry
from dpone.contracts.run import RunRecord
from dpone.contracts.states import CommitState
from dpone.errors import DponeError
from dpone.ports.ledger import BirthAnswer

__all__ = ["BirthUnread", "Found", "NotBorn", "SentBirth"]

#: What a birth-or-lookup found instead of bearing the entry: the run and the entry
#: (both None: another executor wrote one of them meanwhile, read again).
Found = tuple[RunRecord | None, JournalEntry | None]


class NotBorn(Exception):  # a signal to the run service, never a user error
    """The birth sent ahead found the run or the entry (``found``): nothing was written."""

    def __init__(self, found: Found) -> None:
        super().__init__("not born")
        self.found = found


class BirthUnread(Exception):  # a signal to the run service, never a user error
    """The birth's answer could not be read: ``error``, as the lookup would have raised it."""

    def __init__(self, error: DponeError) -> None:
        super().__init__(error.message)
        self.error = error


class SentBirth:
    """A birth whose answer is not read yet, and the entry it is expected to bear.

    ``expected`` stands in for the entry until the gate: its identity, state, version
    and lease are what a birth returns; its times and metadata are not known yet, and
    nothing reads them before ``confirm`` hands over the journal's entry.
    """

    def __init__(
        self,
        answer: BirthAnswer,
        *,
        operation_id: str,
        intent_digest: str,
        owner: str,
        on_born: Callable[[JournalEntry], None],
    ) -> None:
        self._answer: BirthAnswer | None = answer
        self._on_born = on_born
        self._born: JournalEntry | None = None
        self._error: DponeError | None = None  # the answer's, when it could not be read
        # anything else the read raised (an interrupt, a bug): the birth's fate is unknown,
        # so every later confirm raises it again, never NotBorn
        self._broken: BaseException | None = None
        self._found: Found = (None, None)
        self.expected = JournalEntry(
            operation_id=operation_id,
            intent_digest=intent_digest,
            state=CommitState.COMMITTING,
            version=2,  # created COMMITTING (ADR 0003)
            lease_owner=owner,
            lease_epoch=1,
            lease_expires_at=None,
            metadata=MappingProxyType({}),
            result=None,
            created_at=0.0,
            updated_at=0.0,
        )

    @property
    def unread(self) -> bool:
        """True until the answer has been read."""
        return self._answer is not None

    def confirm(self) -> JournalEntry:
        """The entry as the journal bore it; reads the answer the first time.

        Raises:
            NotBorn: the statement found the run or the entry and wrote nothing.
            BirthUnread: the answer could not be read (the journal's error inside).
            BaseException: whatever else reading it raised (an interrupt), every time.
        """
        answer, self._answer = self._answer, None
        if answer is not None:
            try:
                run, entry, born = answer()
            except DponeError as exc:
                self._error = exc
            except BaseException as exc:
                self._broken = exc
                raise
            else:
                if born and entry is not None:
                    self._born = entry
                    self._on_born(entry)
                else:
                    self._found = (run, entry)
        if self._born is not None:
            return self._born
        if self._broken is not None:
            raise self._broken
        if self._error is not None:
            raise BirthUnread(self._error)
        raise NotBorn(self._found)

    def __call__(self) -> None:
        """The gate a connector calls before it touches the target."""
        self.confirm()
