"""Rows in ascending seq, indexed per run and per user: the query side of the memory and
JSONL stores, which keep a thread's rows in process memory."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from deerflow_journal.catalog import is_middleware_caller
from deerflow_journal.stores.base import AI_RESPONSE_EVENT_TYPES, EventQuery, MessagePage

__all__ = ["RowFields", "SeqIndex", "ThreadIndexes"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class RowFields(Generic[R]):
    """How a backend's row gives the fields queries read (``itemgetter``s or ``attrgetter``s)."""

    event_type: Callable[[R], str]
    user_id: Callable[[R], str | None]
    task_id: Callable[[R], Any]
    caller: Callable[[R], Any]


@dataclass(slots=True)
class SeqIndex(Generic[R]):
    """Rows in ascending seq with a parallel seq list for O(log n) range lookups."""

    seqs: list[int] = field(default_factory=list)
    rows: list[R] = field(default_factory=list)

    def page(self, page: MessagePage) -> list[R]:
        """The rows of a message page (see ``RunEventStore.list_messages``)."""
        lo = 0 if page.after_seq is None else bisect.bisect_right(self.seqs, page.after_seq)
        hi = len(self.seqs)
        if page.before_seq is not None:
            hi = bisect.bisect_left(self.seqs, page.before_seq)
        if hi <= lo:
            return []
        if page.from_end:
            return self.rows[max(lo, hi - page.limit) : hi]
        return self.rows[lo : min(hi, lo + page.limit)]

    def after(self, after_seq: int | None) -> Iterator[R]:
        """The rows above ``after_seq``, in order."""
        start = 0 if after_seq is None else bisect.bisect_right(self.seqs, after_seq)
        return (self.rows[i] for i in range(start, len(self.rows)))


class ThreadIndexes(Generic[R]):
    """One thread's rows, indexed by kind ("events", or "messages" for messages), run and user.

    ``None`` for the run or the user means every run or every user, so each query reads one
    index and every index stays in ascending seq. The store queries below read a row's fields
    through ``fields``.
    """

    __slots__ = ("_fields", "_indexes", "_targets")

    def __init__(self, fields: RowFields[R]) -> None:
        self._fields = fields
        self._indexes: dict[tuple[str, str | None, str | None], SeqIndex[R]] = {}
        # How a row of (run, user, is message) is added: the ``append`` of each index's seqs
        # and rows (lists never replaced), looked up once per key: every write goes through.
        self._targets: dict[
            tuple[str, str | None, bool], list[tuple[Callable[[int], None], Callable[[R], None]]]
        ] = {}

    def add(self, row: R, seq: int, run_id: str, user_id: str | None, is_message: bool) -> None:
        """Add a row whose ``seq`` is above every seq of the thread so far."""
        targets = self._targets.get((run_id, user_id, is_message))
        if targets is None:
            targets = self._targets[run_id, user_id, is_message] = self._new_targets(
                run_id, user_id, is_message
            )
        for append_seq, append_row in targets:
            append_seq(seq)
            append_row(row)

    def _new_targets(
        self, run_id: str, user_id: str | None, is_message: bool
    ) -> list[tuple[Callable[[int], None], Callable[[R], None]]]:
        """The appends of every index a row of (run, user, is message) joins, created if new."""
        indexes = self._indexes
        users = (None,) if user_id is None else (None, user_id)
        kinds = ("events", "messages") if is_message else ("events",)
        targets = []
        for user in users:
            for run in (None, run_id):
                for kind in kinds:
                    index = indexes.get((kind, run, user))
                    if index is None:  # not setdefault, which builds a SeqIndex to throw away
                        index = indexes[kind, run, user] = SeqIndex()
                    targets.append((index.seqs.append, index.rows.append))
        return targets

    def get(self, kind: str, run_id: str | None, user_id: str | None) -> SeqIndex[R]:
        """The rows of ``kind``, optionally of one run and one user (an empty index if none)."""
        return self._indexes.get((kind, run_id, user_id)) or SeqIndex()

    def rows(self) -> list[R]:
        """Every row of the thread, in ascending seq."""
        return self.get("events", None, None).rows

    def run_ids(self) -> list[str]:
        """Every run with at least one row."""
        return [run for kind, run, user in self._indexes if kind == "events" and run and not user]

    def page(self, run_id: str | None, user_id: str | None, page: MessagePage) -> list[R]:
        """The message rows of a ``list_messages`` page, of one run unless ``run_id`` is None."""
        return self.get("messages", run_id, user_id).page(page)

    def select(self, query: EventQuery) -> Iterator[R]:
        """The rows ``list_events`` returns for ``query``."""
        rows = self.get("events", query.run_id, query.user_id).after(query.after_seq)
        return query.select(rows, self._fields.event_type, self._fields.task_id)

    def first_of_type(self, run_id: str, event_type: str, user_id: str | None) -> R | None:
        """The run's first row of ``event_type`` by exactly ``user_id`` (None: by nobody)."""
        fields = self._fields
        for row in self.get("events", run_id, user_id).rows:
            if fields.event_type(row) == event_type and fields.user_id(row) == user_id:
                return row
        return None

    def last_visible_ai_seq_by_run(
        self, run_ids: Iterable[str], user_id: str | None
    ) -> dict[str, int]:
        """Each run's seq of its last AI message that no middleware wrote, for runs with one."""
        event_type, caller = self._fields.event_type, self._fields.caller
        ai_types = AI_RESPONSE_EVENT_TYPES
        found: dict[str, int] = {}
        for run_id in run_ids:
            index = self.get("messages", run_id, user_id)
            rows = index.rows
            for i in range(len(rows) - 1, -1, -1):  # a third faster than reversed() and zip()
                row = rows[i]
                if event_type(row) in ai_types and not is_middleware_caller(caller(row)):
                    found[run_id] = index.seqs[i]
                    break
        return found

    def count_messages(self, user_id: str | None) -> int:
        """How many message rows the thread has, of one user unless ``user_id`` is None."""
        return len(self.get("messages", None, user_id).rows)
