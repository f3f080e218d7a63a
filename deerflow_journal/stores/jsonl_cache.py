"""The JSONL store's in-process view of a thread: parsed rows, indexes and read offsets.

A ``ThreadCache`` remembers how far it has read each run file and the thread's ``gen`` and
``epoch`` at that moment. While the state file shows the same ``gen`` the cache is current;
when only ``gen`` moved, just the bytes appended since are read; when ``epoch`` moved (a delete
or a rolled-back batch shrank files) everything is read again. A reader that may not write
takes no lock (``refresh_committed``): it checks the state again after reading and leaves out
what a batch still pending wrote.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from deerflow_journal.records import PendingEvent, RunEvent, make_record
from deerflow_journal.stores.jsonl_files import (
    ThreadState,
    cut_lines,
    peek_state,
    pending_sizes,
    read_lines,
    run_file_sizes,
    steady,
)
from deerflow_journal.stores.jsonl_paths import ThreadPaths
from deerflow_journal.stores.seq_index import RowFields, ThreadIndexes

__all__ = ["Row", "ThreadCache", "encode_line"]

logger = logging.getLogger(__name__)

_KEYS_PER_RECORD = len(RunEvent.__annotations__)


def encode_line(event: PendingEvent, seq: int) -> bytes:
    """Return the stored line of ``event`` at ``seq``: the record as JSON and a newline."""
    record = make_record(
        event.thread_id,
        event.run_id,
        seq,
        event.event_type,
        event.category,
        orjson.Fragment(event.content_json),  # the normalised JSON text, verbatim
        orjson.Fragment(event.metadata_json),
        event.created_at,
        event.user_id,
    )
    return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


@dataclass(slots=True)
class Row:
    """One stored event: its line (newline included) plus the fields queries look at."""

    seq: int
    line: bytes
    run_id: str
    event_type: str
    category: str
    user_id: str | None
    task_id: Any
    caller: Any

    @classmethod
    def written(cls, event: PendingEvent, seq: int, line: bytes) -> Row:
        """The row of an event this process has just written."""
        meta = event.metadata
        return cls(
            seq,
            line,
            event.run_id,
            event.event_type,
            event.category,
            event.user_id,
            meta.get("task_id"),
            meta.get("caller"),
        )

    @classmethod
    def parse(cls, line: bytes, thread_id: str) -> Row | None:
        """The row stored in ``line``, or ``None`` if the line is not a record of the thread."""
        try:
            data = orjson.loads(line)
            run_id, seq, meta = data["run_id"], data["seq"], data["metadata"]
            event_type, category = data["event_type"], data["category"]
            user, has_content = data.get("user_id"), "content" in data
            created_at_ok = type(data["created_at"]) is str
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        if not (
            data["thread_id"] == thread_id
            and has_content
            and created_at_ok
            and type(seq) is int
            and type(meta) is dict
            and type(run_id) is str
            and type(event_type) is str
            and type(category) is str
            and (user is None or type(user) is str)
        ):
            return None
        return cls(
            seq, line, run_id, event_type, category, user, meta.get("task_id"), meta.get("caller")
        )

    def record(self) -> RunEvent:
        """Decode a fresh copy of the stored record (unknown keys dropped)."""
        data = orjson.loads(self.line)
        if len(data) == _KEYS_PER_RECORD:
            return data
        # A line not written by ``encode_line`` (extra keys, no user_id): ``parse`` found the
        # other keys in it.
        return make_record(
            data["thread_id"],
            data["run_id"],
            data["seq"],
            data["event_type"],
            data["category"],
            data["content"],
            data["metadata"],
            data["created_at"],
            data.get("user_id"),
        )


_FIELDS: RowFields[Row] = RowFields(
    event_type=operator.attrgetter("event_type"),
    user_id=operator.attrgetter("user_id"),
    task_id=operator.attrgetter("task_id"),
    caller=operator.attrgetter("caller"),
)


class ThreadCache:
    """What this process has read of one thread's run files."""

    __slots__ = ("epoch", "gen", "indexes", "offsets", "thread_id")

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self._reset()

    def _reset(self) -> None:
        self.gen: int | None = None
        self.epoch: int | None = None
        self.offsets: dict[str, int] = {}
        self.indexes = ThreadIndexes(_FIELDS)

    def matches(self, state: ThreadState) -> bool:
        """Whether the cache holds exactly what ``state`` describes."""
        return self.gen == state.gen and self.epoch == state.epoch

    def refresh(self, paths: ThreadPaths, state: ThreadState) -> None:
        """Read what changed on disk since the last refresh (call with the thread locked)."""
        if not self.matches(state):
            self._take(self._read_new(paths, state), state.gen, state.epoch)

    def refresh_committed(self, paths: ThreadPaths, before: ThreadState) -> bool:
        """Like ``refresh``, without the lock, for a reader that may not recover the thread.

        ``before`` is the state read just before. Lines a batch still pending wrote are left
        out (its writer may have died: only a writer may roll it back). ``False``: files
        shrank meanwhile or a state read was torn, so nothing was taken in; try again.
        """
        if before.gen < 0:
            return False
        read = self._read_new(paths, before)
        after = peek_state(paths)  # after the lines: it names any batch they may belong to
        if not steady(before, after):
            return False
        skip = pending_sizes(paths, after)
        for name, (start, lines) in read.items():
            if name in skip:
                read[name] = (start, cut_lines(lines, start, skip[name]))
        # While a batch is pending the cache matches no state: its commit keeps the same gen.
        self._take(read, None if skip else after.gen, after.epoch)
        return True

    def _read_new(
        self, paths: ThreadPaths, state: ThreadState
    ) -> dict[str, tuple[int, list[bytes]]]:
        """Each run file's complete lines past what the cache has read, with their offset
        (after a reset if ``state`` shows files shrank)."""
        sizes = run_file_sizes(paths)
        if state.epoch != self.epoch or any(
            sizes.get(name, 0) < offset for name, offset in self.offsets.items()
        ):
            self._reset()
        read = {}
        for name, size in sizes.items():
            offset = self.offsets.get(name, 0)
            if size > offset:
                read[name] = (offset, read_lines(paths.runs / name, offset)[0])
        return read

    def _take(self, read: dict[str, tuple[int, list[bytes]]], gen: int | None, epoch: int) -> None:
        rows: list[Row] = []
        for name, (offset, lines) in read.items():
            self.offsets[name] = offset + sum(map(len, lines))
            rows.extend(self._parse(name, lines))
        self._add(rows)
        self.gen, self.epoch = gen, epoch

    def _parse(self, name: str, lines: list[bytes]) -> list[Row]:
        rows = [Row.parse(line, self.thread_id) for line in lines]
        parsed = [row for row in rows if row is not None]
        if len(parsed) != len(rows):
            logger.warning("skipped %d unreadable line(s) in %s", len(rows) - len(parsed), name)
        return parsed

    def apply(
        self,
        before: ThreadState,
        after: ThreadState,
        sizes: dict[str, tuple[int, int]],
        rows: list[Row],
    ) -> None:
        """Take in a batch this process wrote, if the cache was current before it."""
        if not self.matches(before) or any(
            self.offsets.get(name, 0) != old for name, (old, _) in sizes.items()
        ):
            self.gen = None
            return
        for name, (_, new) in sizes.items():
            self.offsets[name] = new
        self._add(rows)
        self.gen, self.epoch = after.gen, after.epoch

    def _add(self, rows: Iterable[Row]) -> None:
        rows = sorted(rows, key=lambda row: row.seq)
        known = self.indexes.rows()
        if rows and known and rows[0].seq <= known[-1].seq:
            rows = sorted([*known, *rows], key=lambda r: r.seq)
            self.indexes = ThreadIndexes(_FIELDS)
        for row in rows:
            self.indexes.add(row, row.seq, row.run_id, row.user_id, row.category == "message")
