"""Browsing a store: which threads it holds and which runs, newest first, a page at a time.

``ThreadInfo`` describes one thread; ``ThreadQuery`` and ``SummaryQuery`` are the checked
arguments of ``RunEventStore.list_threads`` and of the cross-thread ``list_run_summaries``,
which each backend answers from an index its writes keep (never by reading events). Both pages
are keyset pages: the next page starts below the last item of the previous one, so paging
returns every item once even when several share a timestamp.

User scoping follows the other reads: a scoped call sees a thread when it has rows of that user,
with that user's last event and runs; an unscoped call sees every row.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from deerflow_journal.summary import RunStatus, RunSummary

__all__ = [
    "RecentIndex",
    "SummaryQuery",
    "ThreadInfo",
    "ThreadQuery",
    "newest_first",
    "started_key",
    "summary_key",
]

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """One thread as ``list_threads`` lists it: its last event and how many runs it has."""

    #: The thread's id.
    thread_id: str
    #: ``seq`` of the thread's last event (of the user's last one, for a scoped call).
    last_seq: int
    #: ``created_at`` of that event, an ISO-8601 UTC string as records carry it.
    last_event_at: str
    #: How many runs have events in the thread (of the user, for a scoped call).
    run_count: int

    @property
    def sort_key(self) -> tuple[str, str]:
        """What ``list_threads`` orders by, descending."""
        return (self.last_event_at, self.thread_id)

    def to_json_dict(self) -> dict[str, Any]:
        """The thread as plain JSON values."""
        return {
            "thread_id": self.thread_id,
            "last_seq": self.last_seq,
            "last_event_at": self.last_event_at,
            "run_count": self.run_count,
        }


@dataclass(frozen=True, slots=True)
class ThreadQuery:
    """One ``list_threads`` call, checked (``limit`` is at least 1)."""

    limit: int
    before: ThreadInfo | None
    user_id: str | None


@dataclass(frozen=True, slots=True)
class SummaryQuery:
    """One paged ``list_run_summaries`` call, checked (``limit`` is at least 1).

    Summaries come newest first: by start time, then thread id, then run id, descending; a
    run without a start time counts as older than any that has one.
    """

    thread_id: str | None
    status: RunStatus | None
    limit: int
    before: RunSummary | None
    user_id: str | None

    @property
    def before_key(self) -> tuple[str, str, str] | None:
        """``summary_key`` of ``before``: the page holds only summaries below it."""
        if self.before is None:
            return None
        started = self.before.started_at
        return (
            "" if started is None else _utc_text(started),
            self.before.thread_id,
            self.before.run_id,
        )

    @property
    def before_started_at(self) -> datetime | None:
        """``before``'s start time in UTC (a naive one taken as UTC), or ``None``."""
        started = None if self.before is None else self.before.started_at
        if started is None:
            return None
        return started.replace(tzinfo=UTC) if started.tzinfo is None else started

    def matches(self, summary: dict[str, Any]) -> bool:
        """Whether a stored summary belongs to the page's thread, status and user."""
        return (
            (self.thread_id is None or summary["thread_id"] == self.thread_id)
            and (self.status is None or summary.get("status") == self.status)
            and (self.user_id is None or summary.get("user_id") == self.user_id)
        )


def _utc_text(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="microseconds")[:26]


def started_key(started_at: str | None) -> str:
    """The sort key of a stored summary's ``started_at``: UTC to the microsecond, ``""`` if none.

    ``YYYY-MM-DDTHH:MM:SS.ffffff`` sorts as time does; a naive time is taken as UTC. The SQLite
    store computes the same text in SQL.
    """
    if not started_at:
        return ""
    try:
        return _utc_text(datetime.fromisoformat(started_at))
    except (ValueError, OverflowError):
        return ""


def summary_key(summary: dict[str, Any]) -> tuple[str, str, str]:
    """What the paged ``list_run_summaries`` orders a stored summary by, descending."""
    return (started_key(summary.get("started_at")), summary["thread_id"], summary["run_id"])


class RecentIndex(Generic[K]):
    """Items by a sortable key, for newest-first keyset pages in process memory.

    ``set`` moves an item to its new key in O(log n) comparisons; an item whose key grows (a
    thread's newest activity) moves to the end, which costs little.
    """

    __slots__ = ("_keys", "_order")

    def __init__(self) -> None:
        self._keys: dict[Any, K] = {}
        self._order: list[K] = []

    def __len__(self) -> int:
        return len(self._keys)

    def set(self, item: Any, key: K) -> None:
        """Give ``item`` the key ``key`` (adding it if new)."""
        old = self._keys.get(item)
        if old == key:
            return
        if old is not None:
            del self._order[bisect.bisect_left(self._order, old)]
        self._keys[item] = key
        bisect.insort(self._order, key)

    def discard(self, item: Any) -> None:
        """Forget ``item`` if it is here."""
        old = self._keys.pop(item, None)
        if old is not None:
            del self._order[bisect.bisect_left(self._order, old)]

    def below(self, before: K | None) -> Iterator[K]:
        """The keys below ``before`` (all if ``None``), largest first."""
        end = len(self._order) if before is None else bisect.bisect_left(self._order, before)
        order = self._order
        return (order[i] for i in range(end - 1, -1, -1))


def newest_first(items: Iterable[K], before: K | None, limit: int) -> list[K]:
    """The first ``limit`` of ``items`` below ``before`` (all if ``None``), largest first."""
    kept = [item for item in items if before is None or item < before]
    kept.sort(reverse=True)
    return kept[:limit]
