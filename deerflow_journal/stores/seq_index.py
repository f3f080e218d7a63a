"""Rows in ascending seq, indexed per run and per user: the query side of the memory and
JSONL stores, which keep a thread's rows in process memory."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from deerflow_journal.stores.base import MessagePage

__all__ = ["SeqIndex", "ThreadIndexes"]

R = TypeVar("R")


@dataclass(slots=True)
class SeqIndex(Generic[R]):
    """Rows in ascending seq with a parallel seq list for O(log n) range lookups."""

    seqs: list[int] = field(default_factory=list)
    rows: list[R] = field(default_factory=list)

    def add(self, seq: int, row: R) -> None:
        """Append a row whose ``seq`` is above every seq already here."""
        self.seqs.append(seq)
        self.rows.append(row)

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
    index and every index stays in ascending seq.
    """

    __slots__ = ("_indexes", "_targets")

    def __init__(self) -> None:
        self._indexes: dict[tuple[str, str | None, str | None], SeqIndex[R]] = {}
        # The indexes a row of (run, user, is message) goes to, looked up once per key.
        self._targets: dict[tuple[str, str | None, bool], list[SeqIndex[R]]] = {}

    def add(self, row: R, seq: int, run_id: str, user_id: str | None, is_message: bool) -> None:
        """Add a row whose ``seq`` is above every seq of the thread so far."""
        targets = self._targets.get((run_id, user_id, is_message))
        if targets is None:
            kinds = ("events", "messages") if is_message else ("events",)
            targets = self._targets[run_id, user_id, is_message] = [
                self._indexes.setdefault((kind, run, user), SeqIndex())
                for user in {None, user_id}
                for run in (None, run_id)
                for kind in kinds
            ]
        for index in targets:
            index.add(seq, row)

    def get(self, kind: str, run_id: str | None, user_id: str | None) -> SeqIndex[R]:
        """The rows of ``kind``, optionally of one run and one user (an empty index if none)."""
        return self._indexes.get((kind, run_id, user_id)) or SeqIndex()

    def rows(self) -> list[R]:
        """Every row of the thread, in ascending seq."""
        return self.get("events", None, None).rows

    def run_ids(self) -> list[str]:
        """Every run with at least one row."""
        return [run for kind, run, user in self._indexes if kind == "events" and run and not user]
