"""Browsing the JSONL store: its threads by latest activity and its runs by start time.

The JSONL store keeps no index across threads, so a page looks at every thread directory:
one small ``state`` file read per thread (and a ``stat`` of its summaries file for summary
pages). What it learns of a thread (its last event and runs, per user; its summaries) is kept
in process memory under the thread's ``gen`` and ``epoch`` (and the summaries file's identity,
size and modification time), so a thread's files are read again only after they changed: a
first page reads what the threads hold, later pages what changed since. A thread with a batch
in flight is read each time (through the store's own reads, which finish or leave out that
batch as the store's other reads do) and not remembered.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from deerflow_journal.stores.browsing import (
    SummaryQuery,
    ThreadInfo,
    ThreadQuery,
    newest_first,
    summary_key,
)
from deerflow_journal.stores.jsonl_cache import ThreadCache
from deerflow_journal.stores.jsonl_files import ThreadState, peek_state
from deerflow_journal.stores.jsonl_paths import RUN_SUFFIX, ThreadPaths, encode_id

__all__ = ["JsonlBrowser"]

# Key of every user's rows: never a user id (those have at least one character).
_ALL = ""
_Activity = dict[str, ThreadInfo]
_Summaries = dict[str, dict[str, Any]]


def activity_of(cache: ThreadCache) -> _Activity:
    """The thread's last event and run count, over every user (key ``""``) and per user."""
    last: dict[str, Any] = {}
    runs: dict[str, set[str]] = {}
    for row in cache.indexes.rows():
        for key in (_ALL,) if row.user_id is None else (_ALL, row.user_id):
            last[key] = row
            runs.setdefault(key, set()).add(row.run_id)
    return {
        key: ThreadInfo(
            cache.thread_id, row.seq, orjson.loads(row.line)["created_at"], len(runs[key])
        )
        for key, row in last.items()
    }


def _settled(state: ThreadState) -> bool:
    """Whether what a thread holds at ``state`` may be remembered: no batch in flight, and
    not a torn read."""
    return state.pending is None and state.gen >= 0


class JsonlBrowser:
    """A JSONL store's browsing pages, with what it remembers of each thread."""

    def __init__(
        self,
        base_dir: Path,
        paths: Callable[[str], ThreadPaths],
        read: Callable[[str, Callable[[ThreadCache], Any], Any], Any],
        summaries: Callable[[str], _Summaries],
    ) -> None:
        """``read`` and ``summaries`` are the store's own thread reads (``_read_sync`` and
        ``_summaries``), which recover or leave out a batch in flight."""
        self._base_dir = base_dir
        self._paths = paths
        self._read = read
        self._summaries = summaries
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}  # thread directory name -> thread id
        self._activity: dict[str, tuple[tuple[int, int], _Activity]] = {}
        self._summary_cache: dict[str, tuple[tuple[Any, ...], _Summaries]] = {}

    def threads(self, query: ThreadQuery) -> list[ThreadInfo]:
        """The threads of a ``list_threads`` page."""
        key = _ALL if query.user_id is None else query.user_id
        infos = {}
        for thread_id in self._thread_ids():
            info = self._thread_activity(thread_id).get(key)
            if info is not None:
                infos[info.sort_key] = info
        before = None if query.before is None else query.before.sort_key
        return [infos[k] for k in newest_first(infos, before, query.limit)]

    def summaries(self, query: SummaryQuery) -> list[dict[str, Any]]:
        """The stored summaries of a paged ``list_run_summaries``."""
        before = query.before_key
        threads = self._thread_ids() if query.thread_id is None else [query.thread_id]
        found = {}
        for thread_id in threads:
            for summary in self._thread_summaries(thread_id).values():
                if query.matches(summary):
                    key = summary_key(summary)
                    if before is None or key < before:
                        found[key] = summary
        return [found[key] for key in heapq.nlargest(query.limit, found)]

    # -- one thread --------------------------------------------------------------------------

    def _thread_activity(self, thread_id: str) -> _Activity:
        state = peek_state(self._paths(thread_id))
        if state is None:
            return {}
        stamp = (state.gen, state.epoch)
        with self._lock:
            known = self._activity.get(thread_id)
        if known is not None and known[0] == stamp and _settled(state):
            return known[1]
        # Read after the state: what is read is at least as new as the stamp it is kept under.
        activity: _Activity = self._read(thread_id, activity_of, {})
        if _settled(state):
            with self._lock:
                self._activity[thread_id] = (stamp, activity)
        return activity

    def _thread_summaries(self, thread_id: str) -> _Summaries:
        paths = self._paths(thread_id)
        state = peek_state(paths)
        if state is None:
            return {}
        try:
            st = os.stat(paths.summaries)
            stamp: tuple[Any, ...] = (state.gen, state.epoch, st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            stamp = (state.gen, state.epoch)
        with self._lock:
            known = self._summary_cache.get(thread_id)
        if known is not None and known[0] == stamp and _settled(state):
            return known[1]
        summaries = self._summaries(thread_id)
        if _settled(state):
            with self._lock:
                self._summary_cache[thread_id] = (stamp, summaries)
        return summaries

    # -- thread ids --------------------------------------------------------------------------

    def _thread_ids(self) -> Iterator[str]:
        """Every thread with a directory, by its real id."""
        try:
            entries = list(os.scandir(self._base_dir / "threads"))
        except FileNotFoundError:
            return
        for entry in entries:
            thread_id = self._names.get(entry.name)
            if thread_id is None:
                thread_id = _thread_id_of(Path(entry.path))
                if thread_id is None:
                    continue
                self._names[entry.name] = thread_id
            yield thread_id


def _thread_id_of(directory: Path) -> str | None:
    """The id of the thread in ``directory``: its name decoded, or for a shortened name, the
    ``thread_id`` of its first stored line (``None`` when it has none)."""
    name = directory.name
    try:
        decoded = urllib.parse.unquote(name, errors="strict")
    except UnicodeDecodeError:
        decoded = None
    if decoded is not None and encode_id(decoded) == name:
        return decoded
    candidates = [directory / "summaries.jsonl"]
    with contextlib.suppress(FileNotFoundError):
        candidates += [
            e.path for e in os.scandir(directory / "runs") if e.name.endswith(RUN_SUFFIX)
        ]
    for path in candidates:
        try:
            with open(path, "rb") as f:
                line = f.readline()
            thread_id = orjson.loads(line).get("thread_id")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(thread_id, str) and encode_id(thread_id) == name:
            return thread_id
    return None
