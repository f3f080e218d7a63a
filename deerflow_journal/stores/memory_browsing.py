"""The memory store's browsing indexes: threads by latest activity, summaries by start time.

Kept up to date by the store's writes (``ThreadActivity.added``, ``ThreadActivity.rebuilt``
after a delete, and ``IndexedSummaries``, the store's summaries dict), so a page costs
O(log n + page) however many threads and runs the store holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from deerflow_journal.stores.browsing import (
    RecentIndex,
    SummaryQuery,
    ThreadInfo,
    ThreadQuery,
    summary_key,
)

__all__ = ["IndexedSummaries", "ThreadActivity"]

# Index key of every user's rows: never a user id (those have at least one character).
_ALL = ""


class _Activity:
    """One thread's latest event and runs, for one user or all."""

    __slots__ = ("last_event_at", "last_seq", "runs")

    def __init__(self) -> None:
        self.last_seq = 0
        self.last_event_at = ""
        self.runs: set[str] = set()


class ThreadActivity:
    """Each thread's latest event and runs, overall and per user, and the threads ordered by
    (last event time, thread id) for each."""

    __slots__ = ("_activity", "_keys", "_recent")

    def __init__(self) -> None:
        self._activity: dict[tuple[str, str], _Activity] = {}
        self._recent: dict[str, RecentIndex[tuple[str, str]]] = {}
        self._keys: dict[str, set[str]] = {}  # thread -> the user keys it is indexed under

    def added(
        self, thread_id: str, run_id: str, user_id: str | None, seq: int, created_at: str
    ) -> None:
        """Take in an event just stored (its seq above every seq of its thread)."""
        self._note(_ALL, thread_id, run_id, seq, created_at)
        if user_id is not None:
            self._note(user_id, thread_id, run_id, seq, created_at)

    def _note(self, key: str, thread_id: str, run_id: str, seq: int, created_at: str) -> None:
        activity = self._activity.get((key, thread_id))
        if activity is None:
            activity = self._activity[key, thread_id] = _Activity()
            self._keys.setdefault(thread_id, set()).add(key)
        activity.last_seq, activity.last_event_at = seq, created_at
        activity.runs.add(run_id)
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = RecentIndex()
        recent.set(thread_id, (created_at, thread_id))

    def rebuilt(self, thread_id: str, rows: Iterable[tuple[int, str, str | None, str]]) -> None:
        """Start the thread over from ``rows``, ``(seq, run_id, user_id, created_at)`` in seq
        order: what a delete left."""
        for key in self._keys.pop(thread_id, ()):
            del self._activity[key, thread_id]
            self._recent[key].discard(thread_id)
        for seq, run_id, user_id, created_at in rows:
            self.added(thread_id, run_id, user_id, seq, created_at)

    def page(self, query: ThreadQuery) -> list[ThreadInfo]:
        """The threads of a ``list_threads`` page."""
        key = _ALL if query.user_id is None else query.user_id
        recent = self._recent.get(key)
        if recent is None:
            return []
        before = None if query.before is None else query.before.sort_key
        page = []
        for last_event_at, thread_id in itertools.islice(recent.below(before), query.limit):
            activity = self._activity[key, thread_id]
            page.append(ThreadInfo(thread_id, activity.last_seq, last_event_at, len(activity.runs)))
        return page


class IndexedSummaries(dict[tuple[str, str], dict[str, Any]]):
    """The memory store's summaries by (thread, run), also ordered newest first for paging:
    over every thread by user and status, and per thread.

    Only item assignment and ``del`` change it (what the store uses), and both keep the order.
    """

    def __init__(self) -> None:
        super().__init__()
        # (user id or "", status or "") -> summary keys; a thread -> its summary keys.
        self._recent: dict[tuple[str, str], RecentIndex[tuple[str, str, str]]] = {}
        self._by_thread: dict[str, RecentIndex[tuple[str, str, str]]] = {}

    def _indexes(
        self, summary: dict[str, Any], *, create: bool
    ) -> list[RecentIndex[tuple[str, str, str]]]:
        user = summary.get("user_id") or _ALL
        status = summary.get("status") or _ALL
        keys = [(_ALL, _ALL)]
        if status != _ALL:
            keys.append((_ALL, status))
        if user != _ALL:
            keys.append((user, _ALL))
            if status != _ALL:
                keys.append((user, status))
        recent, found = self._recent, []
        for key in keys:
            index = recent.get(key)
            if index is None and create:
                index = recent[key] = RecentIndex()
            if index is not None:
                found.append(index)
        thread_id = summary["thread_id"]
        thread = self._by_thread.get(thread_id)
        if thread is None and create:
            thread = self._by_thread[thread_id] = RecentIndex()
        if thread is not None:
            found.append(thread)
        return found

    def __setitem__(self, key: tuple[str, str], summary: dict[str, Any]) -> None:
        old = self.get(key)
        if old is not None:
            self._forget(key, old)
        super().__setitem__(key, summary)
        sort_key = summary_key(summary)
        for index in self._indexes(summary, create=True):
            index.set(key, sort_key)

    def __delitem__(self, key: tuple[str, str]) -> None:
        self._forget(key, self[key])
        super().__delitem__(key)

    def _forget(self, key: tuple[str, str], summary: dict[str, Any]) -> None:
        for index in self._indexes(summary, create=False):
            index.discard(key)
        thread = self._by_thread.get(summary["thread_id"])
        if thread is not None and not len(thread):
            del self._by_thread[summary["thread_id"]]

    def page(self, query: SummaryQuery) -> list[dict[str, Any]]:
        """The stored summaries of a paged ``list_run_summaries``."""
        if query.thread_id is None:
            index = self._recent.get((query.user_id or _ALL, query.status or _ALL))
        else:
            index = self._by_thread.get(query.thread_id)
        if index is None:
            return []
        page = []
        for _, thread_id, run_id in index.below(query.before_key):
            summary = self[thread_id, run_id]
            if query.matches(summary):
                page.append(summary)
                if len(page) == query.limit:
                    break
        return page
