"""``MemoryRunEventStore``: a per-process store for tests, notebooks and short-lived runs."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Iterable
from typing import Any

from deerflow_journal.records import (
    DEFAULT_MAX_OUTPUTS_CONTENT,
    DEFAULT_MAX_TRACE_CONTENT,
    PendingEvent,
    RunEvent,
    decode_json,
    make_record,
)
from deerflow_journal.stores.base import (
    EventQuery,
    MessagePage,
    RecentBatchIds,
    RunEventStore,
    Write,
    Written,
)
from deerflow_journal.stores.browsing import SummaryQuery, ThreadInfo, ThreadQuery
from deerflow_journal.stores.memory_browsing import IndexedSummaries, ThreadActivity
from deerflow_journal.stores.seq_index import RowFields, ThreadIndexes
from deerflow_journal.summary import other_users_summary_error

__all__ = ["MemoryRunEventStore"]


# A stored event: a plain tuple of strings and ints, which the garbage collector stops
# tracking, so a store holding many events adds nothing to collection pauses. task_id and
# caller are taken at write time, when they are strings, for the queries that filter on them.
_Row = tuple[int, str, str, str, str, str, str, "str | None", Any, Any]
_SEQ, _RUN, _TYPE, _CATEGORY, _CONTENT, _METADATA, _CREATED, _USER, _TASK, _CALLER = range(10)
_FIELDS: RowFields[_Row] = RowFields(
    event_type=operator.itemgetter(_TYPE),
    user_id=operator.itemgetter(_USER),
    task_id=operator.itemgetter(_TASK),
    caller=operator.itemgetter(_CALLER),
)


class _Thread:
    """One thread's rows and indexes, and the last seq it gave out (deletes keep it)."""

    __slots__ = ("indexes", "last_seq", "thread_id")

    def __init__(self, thread_id: str, last_seq: int = 0) -> None:
        self.thread_id = thread_id
        self.last_seq = last_seq
        self.indexes = ThreadIndexes(_FIELDS)

    def add(self, row: _Row) -> None:
        self.indexes.add(row, row[_SEQ], row[_RUN], row[_USER], row[_CATEGORY] == "message")

    def rows(self) -> list[_Row]:
        return self.indexes.rows()

    def records(self, rows: Iterable[_Row]) -> list[RunEvent]:
        """The stored records of ``rows``; decoding the JSON text hands every reader a copy."""
        thread_id = self.thread_id
        return [
            make_record(
                thread_id,
                row[_RUN],
                row[_SEQ],
                row[_TYPE],
                row[_CATEGORY],
                decode_json(row[_CONTENT]),
                decode_json(row[_METADATA]),
                row[_CREATED],
                row[_USER],
            )
            for row in rows
        ]


# What a read finds of a thread never written: its empty indexes answer every query.
_UNWRITTEN = _Thread("")


class MemoryRunEventStore(RunEventStore):
    """Keeps events in process memory; paging is O(log n) through per-thread and per-run indexes.

    Content is kept as the normalised JSON text, so reads return exactly what the database
    backends return. ``read_only=True`` gives an empty store that refuses writes, a stand-in
    for a read-only store of another backend.
    """

    def __init__(
        self,
        *,
        max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
        max_outputs_content: int | None = DEFAULT_MAX_OUTPUTS_CONTENT,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            max_trace_content=max_trace_content,
            max_outputs_content=max_outputs_content,
            read_only=read_only,
        )
        self._threads: dict[str, _Thread] = {}
        self._summaries = IndexedSummaries()
        self._activity = ThreadActivity()
        self._batch_ids = RecentBatchIds()

    async def _setup(self) -> None:
        pass

    async def _close(self) -> None:
        pass

    def _thread(self, thread_id: str) -> _Thread:
        thread = self._threads.get(thread_id)
        if thread is None:
            thread = self._threads[thread_id] = _Thread(thread_id)
        return thread

    # No await in a write: each is atomic on the event loop.

    def _add(self, events: list[PendingEvent]) -> list[int]:
        """Store ``events`` in order; their seqs."""
        threads, seqs = self._threads, []
        thread = _UNWRITTEN
        # The last event of each (thread, run, user), in the order of those last events: the
        # threads' activity is what it would be after each event in turn.
        latest: dict[tuple[str, str, str | None], tuple[int, str]] = {}
        key = None
        for e in events:
            if e.thread_id != thread.thread_id:  # most batches hold one thread
                thread = threads.get(e.thread_id) or self._thread(e.thread_id)
            seq = thread.last_seq = thread.last_seq + 1
            # Not columns(): the thread id is the key of the rows, not one of their fields.
            row = (
                seq,
                e.run_id,
                e.event_type,
                e.category,
                e.content_json,
                e.metadata_json,
                e.created_at,
                e.user_id,
                e.task_id,
                e.caller,
            )
            thread.indexes.add(row, seq, e.run_id, e.user_id, e.category == "message")
            seqs.append(seq)
            if key != (key := (e.thread_id, e.run_id, e.user_id)):
                latest.pop(key, None)  # to the end: its last event is the latest so far
            latest[key] = (seq, e.created_at)
        for (thread_id, run_id, user_id), (seq, created_at) in latest.items():
            self._activity.added(thread_id, run_id, user_id, seq, created_at)
        return seqs

    def _write(self, write: Write) -> asyncio.Future[Written]:
        # Done before it returns: the caller awaits it without a task or a turn of the loop.
        future: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(self._write_now(write))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def _write_now(self, write: Write) -> Written:
        if write.batch_id in self._batch_ids:
            return Written([], repeated=True)
        if write.if_absent:
            (event,) = write.events
            thread = self._thread(event.thread_id)
            row = thread.indexes.first_of_type(event.run_id, event.event_type, event.user_id)
            if row is not None:
                return Written([], found=thread.records([row])[0])
        for summary in write.summaries:  # refuse before anything is written
            stored = self._summaries.get((summary["thread_id"], summary["run_id"]))
            if stored is not None and stored["user_id"] != summary["user_id"]:
                raise other_users_summary_error(summary)
        seqs = self._add(write.events) if write.events else []
        for summary in write.summaries:
            self._summaries[(summary["thread_id"], summary["run_id"])] = summary
        self._batch_ids.add(write.batch_id)
        return Written(seqs)

    async def _list_messages(
        self, thread_id: str, run_id: str | None, page: MessagePage, user_id: str | None
    ) -> list[RunEvent]:
        thread = self._threads.get(thread_id, _UNWRITTEN)
        return thread.records(thread.indexes.page(run_id, user_id, page))

    async def _list_events(self, query: EventQuery) -> list[RunEvent]:
        thread = self._threads.get(query.thread_id, _UNWRITTEN)
        return thread.records(thread.indexes.select(query))

    async def _last_visible_ai_seq_by_run(
        self, thread_id: str, run_ids: list[str], user_id: str | None
    ) -> dict[str, int]:
        thread = self._threads.get(thread_id, _UNWRITTEN)
        return thread.indexes.last_visible_ai_seq_by_run(run_ids, user_id)

    async def _count_messages(self, thread_id: str, user_id: str | None) -> int:
        return self._threads.get(thread_id, _UNWRITTEN).indexes.count_messages(user_id)

    async def _delete(self, thread_id: str, run_id: str | None, user_id: str | None) -> int:
        deleted = 0
        thread = self._threads.get(thread_id)
        if thread is not None:  # summaries go even where the thread has no events
            kept = [
                row
                for row in thread.rows()
                if not (
                    (run_id is None or row[_RUN] == run_id)
                    and (user_id is None or row[_USER] == user_id)
                )
            ]
            deleted = len(thread.rows()) - len(kept)
            rebuilt = _Thread(thread_id, thread.last_seq)
            for row in kept:
                rebuilt.add(row)
            self._threads[thread_id] = rebuilt
            self._activity.rebuilt(thread_id, _activity_rows(rebuilt.rows()))
        for key, summary in list(self._summaries.items()):
            if (
                key[0] == thread_id
                and (run_id is None or key[1] == run_id)
                and (user_id is None or summary["user_id"] == user_id)
            ):
                del self._summaries[key]
        return deleted

    async def _get_run_summary(
        self, thread_id: str, run_id: str, user_id: str | None
    ) -> dict[str, Any] | None:
        summary = self._summaries.get((thread_id, run_id))
        if summary is None or (user_id is not None and summary["user_id"] != user_id):
            return None
        return summary

    async def _list_run_summaries(
        self, thread_id: str, user_id: str | None
    ) -> list[dict[str, Any]]:
        return [
            summary
            for (thread, _), summary in self._summaries.items()
            if thread == thread_id and (user_id is None or summary["user_id"] == user_id)
        ]

    async def _list_threads(self, query: ThreadQuery) -> list[ThreadInfo]:
        return self._activity.page(query)

    async def _list_run_summary_page(self, query: SummaryQuery) -> list[dict[str, Any]]:
        return self._summaries.page(query)


def _activity_rows(rows: list[_Row]) -> list[tuple[int, str, str | None, str]]:
    """What ``ThreadActivity.rebuilt`` takes of each row."""
    return [(row[_SEQ], row[_RUN], row[_USER], row[_CREATED]) for row in rows]
