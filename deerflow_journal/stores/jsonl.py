"""``JsonlRunEventStore``: one JSON-lines file per run, safe for several processes.

What it guarantees, on a local file system:

- seq is assigned under a file lock on the thread, so processes sharing the base dir get
  unique, strictly increasing seq; the last seq lives in the thread's state file and is never
  reused. Threads share a fixed set of lock files, so a batch over any number of threads keeps
  few files open.
- A batch is all or nothing, also when the writing process is killed: each file's lines go in
  with one write call, and a batch cut short is truncated away by the next process that takes
  the thread's lock. A batch spanning threads has one commit point for all of them.
- Readers never return a corrupt record: an unfinished last line is skipped (and cut off by the
  next writer), an unreadable line is logged and skipped. Nor do they return what a batch cut
  short wrote, events or run summaries: a reader finishes the batch first, as a writer does.
- A store opened ``read_only`` creates, locks and changes nothing, so it reads a base dir it
  may not write (read-only media, another user's files). It cannot finish a cut-short batch,
  so it leaves out what a batch still pending wrote, and it checks the thread's state again
  after reading, so that a writer working meanwhile cannot slip it anything uncommitted.
- Deletes are not atomic across runs: a killed ``delete_by_thread`` may have removed some runs
  and not others (calling it again finishes the job).
- Nothing is fsynced: a process crash loses nothing written, a power cut may.

Reads keep a per-thread cache of parsed rows and how far each file was read; a read checks
the thread's small state file and reads only bytes appended since, so other processes' writes
become visible on the next call. All file work runs in a worker thread, one hop per call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from deerflow_journal.offload import to_thread
from deerflow_journal.records import (
    DEFAULT_MAX_OUTPUTS_CONTENT,
    DEFAULT_MAX_TRACE_CONTENT,
    PendingEvent,
    RunEvent,
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
from deerflow_journal.stores.jsonl_browsing import JsonlBrowser
from deerflow_journal.stores.jsonl_cache import Row, ThreadCache, encode_line
from deerflow_journal.stores.jsonl_files import (
    SUMMARIES_KEY,
    LockedThread,
    append_file,
    create_batch_marker,
    cut_lines,
    hold_lock,
    lock_thread,
    open_thread,
    peek_state,
    pending_sizes,
    prepare_append,
    rewrite_file,
    run_file_sizes,
    steady,
)
from deerflow_journal.stores.jsonl_paths import LOCK_STRIPES, ThreadPaths
from deerflow_journal.stores.jsonl_summaries import (
    delete_summaries,
    parse_summaries,
    read_summaries,
    read_summary_lines,
    summary_line,
)
from deerflow_journal.summary import other_users_summary_error

__all__ = ["JsonlRunEventStore"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Sizes = dict[str, tuple[int, int]]
# A batch over more threads opens each state file per step instead of holding it open.
_STATE_FILES_HELD = 8
# Unlocked reads retry while files shrink under them or a state read is torn; past this many
# tries the state file is taken to be broken (only a writer can rebuild it).
_UNLOCKED_TRIES = 100


class JsonlRunEventStore(RunEventStore):
    """Stores each run in ``threads/{thread_id}/runs/{run_id}.jsonl`` under ``base_dir``.

    Ids are encoded into path-safe names (``jsonl_paths.encode_id``); every record keeps the
    real ids. See the module docstring for the multi-process and crash guarantees; with
    ``read_only=True`` it only reads, and may read a directory it cannot write.
    """

    #: How many threads keep their parsed rows cached in this process (least recent go first;
    #: 0 turns the cache off).
    max_cached_threads: int = 64

    def __init__(
        self,
        base_dir: str | os.PathLike[str] = ".deer-flow",
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
        # Fixed now: a relative directory must not follow a later chdir (seqs would restart).
        self.base_dir = Path(base_dir).absolute()
        self._caches: OrderedDict[str, ThreadCache] = OrderedDict()
        # One in-process lock per lock file: memory does not grow with the threads.
        self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._guard = threading.Lock()
        self._batch_ids = RecentBatchIds()
        self._browser = JsonlBrowser(self.base_dir, self._paths, self._read_sync, self._summaries)

    async def _setup(self) -> None:
        await to_thread(self._make_dirs)

    def _make_dirs(self) -> None:
        if self.read_only:
            if not self.base_dir.is_dir():
                raise FileNotFoundError(f"no JSONL journal directory at {self.base_dir}")
            return
        for sub in ("threads", "batches", "locks"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)

    async def _close(self) -> None:
        with self._guard:
            self._caches.clear()

    # -- locks and caches --------------------------------------------------------------------

    def _paths(self, thread_id: str) -> ThreadPaths:
        return _thread_paths(self.base_dir, thread_id)

    def _local_lock(self, thread_id: str) -> threading.Lock:
        return self._stripes[self._paths(thread_id).stripe]

    @contextlib.contextmanager
    def _locked(self, thread_ids: Iterable[str]) -> Iterator[dict[str, LockedThread]]:
        # Every in-process lock first, then the file locks, each kind in stripe order, so
        # batches over overlapping threads can never wait on each other.
        paths = {t: self._paths(t) for t in sorted(set(thread_ids))}
        stripes = {p.stripe: p.lock for p in paths.values()}
        keep_open = len(paths) <= _STATE_FILES_HELD
        with contextlib.ExitStack() as stack:
            for stripe in sorted(stripes):
                stack.enter_context(self._stripes[stripe])
            for stripe in sorted(stripes):
                stack.enter_context(hold_lock(stripes[stripe]))
            yield {
                t: stack.enter_context(open_thread(p, keep_open=keep_open))
                for t, p in paths.items()
            }

    def _cache(self, thread_id: str) -> ThreadCache:
        with self._guard:
            cache = self._caches.get(thread_id)
            if cache is not None:
                self._caches.move_to_end(thread_id)
                return cache
            cache = ThreadCache(thread_id)
            if self.max_cached_threads < 1:
                return cache  # caching off: this read parses the thread afresh
            while len(self._caches) >= self.max_cached_threads:
                self._caches.popitem(last=False)
            self._caches[thread_id] = cache
            return cache

    def _drop_cache(self, thread_id: str) -> None:
        with self._guard:
            self._caches.pop(thread_id, None)

    def _refreshed(self, held: LockedThread) -> ThreadCache:
        cache = self._cache(held.paths.thread_id)
        cache.refresh(held.paths, held.state)
        return cache

    def _current(self, thread_id: str) -> ThreadCache | None:
        """The thread's cache brought up to date, or ``None`` for a thread never written."""
        state = peek_state(self._paths(thread_id))
        if state is None:
            self._drop_cache(thread_id)
            return None
        cache = self._cache(thread_id)
        if cache.matches(state):
            return cache
        with lock_thread(self._paths(thread_id)) as held:
            return self._refreshed(held)

    def _committed(self, thread_id: str) -> ThreadCache | None:
        """``_current`` for a read-only store: what is committed, read without the lock."""
        paths = self._paths(thread_id)
        for _ in range(_UNLOCKED_TRIES):
            state = peek_state(paths)
            if state is None:
                self._drop_cache(thread_id)
                return None
            cache = self._cache(thread_id)
            if cache.matches(state) or cache.refresh_committed(paths, state):
                return cache
        raise _unreadable_state(paths)

    async def _read(self, thread_id: str, query: Callable[[ThreadCache], _T], default: _T) -> _T:
        return await to_thread(self._read_sync, thread_id, query, default)

    def _read_sync(self, thread_id: str, query: Callable[[ThreadCache], _T], default: _T) -> _T:
        with self._local_lock(thread_id):
            cache = self._committed(thread_id) if self.read_only else self._current(thread_id)
            return default if cache is None else query(cache)

    # -- writes ------------------------------------------------------------------------------

    async def _write(self, write: Write) -> Written:
        return await to_thread(self._write_sync, write)

    def _write_sync(self, write: Write) -> Written:
        events, summaries = write.events, write.summaries
        threads = [*(e.thread_id for e in events), *(s["thread_id"] for s in summaries)]
        if not threads:
            return Written([], repeated=write.batch_id in self._batch_ids)
        with self._locked(threads) as held:
            # Looked up under the threads' locks: a retry sent while the first write of its
            # batch still runs (its caller cancelled) waits for it, and finds its id then.
            if write.batch_id in self._batch_ids:
                return Written([], repeated=True)
            if write.if_absent:
                (event,) = events
                indexes = self._refreshed(held[event.thread_id]).indexes
                row = indexes.first_of_type(event.run_id, event.event_type, event.user_id)
                if row is not None:
                    return Written([], found=row.record())
            for summary in summaries:  # refuse before anything is written
                _check_summary_owner(held[summary["thread_id"]].paths, summary)
            # The summaries go into the events' batch (before its commit point): the journal
            # retries a failed batch whole, so nothing of it may stay written when this raises.
            lines: dict[str, list[bytes]] = {}
            for summary in summaries:
                lines.setdefault(summary["thread_id"], []).append(summary_line(summary))
            return Written(self._write_rows(held, events, lines, write.batch_id))

    def _write_rows(
        self,
        held: dict[str, LockedThread],
        events: list[PendingEvent],
        summaries: dict[str, list[bytes]],
        batch_id: str | None,
    ) -> list[int]:
        """Assign seq and write ``events`` (and ``summaries`` lines, by thread) all or nothing,
        with every thread in ``held`` locked; ``batch_id`` is remembered once they are in."""
        last = {thread_id: lt.state.seq for thread_id, lt in held.items()}
        lines: dict[str, dict[str, list[bytes]]] = {thread_id: {} for thread_id in held}
        rows: dict[str, list[Row]] = {thread_id: [] for thread_id in held}
        names: dict[str, str] = {}
        seqs = []
        for event in events:
            thread_id, seq = event.thread_id, last[event.thread_id] + 1
            last[thread_id] = seq
            line = encode_line(event, seq)
            name = names.get(event.run_id)
            if name is None:
                name = names[event.run_id] = held[thread_id].paths.run_file(event.run_id).name
            lines[thread_id].setdefault(name, []).append(line)
            rows[thread_id].append(Row.written(event, seq, line))
            seqs.append(seq)
        before = {thread_id: dataclasses.replace(lt.state) for thread_id, lt in held.items()}
        sizes = self._commit(held, last, lines, summaries, batch_id)
        for thread_id, lt in held.items():
            with self._guard:
                cache = self._caches.get(thread_id)
            if cache is not None:
                cache.apply(before[thread_id], lt.state, sizes[thread_id], rows[thread_id])
        return seqs

    def _commit(
        self,
        held: dict[str, LockedThread],
        last: dict[str, int],
        lines: dict[str, dict[str, list[bytes]]],
        summaries: dict[str, list[bytes]],
        batch_id: str | None,
    ) -> dict[str, _Sizes]:
        """Write each thread's lines (run files, then summaries) all-or-nothing; return each
        run file's size before and after. ``batch_id`` is remembered at the commit point, so
        that nothing raising after it can make its retry write the batch twice."""
        paths = [lt.paths for lt in held.values()]
        marker = create_batch_marker(self.base_dir, paths) if len(held) > 1 else None
        begun: list[LockedThread] = []
        sizes = {}
        try:
            for t, lt in held.items():
                sizes[t] = _write_thread(lt, last[t], lines[t], summaries.get(t), marker, begun)
            if marker is None:
                begun[0].commit()
            else:
                marker.unlink()
            self._batch_ids.add(batch_id)
        except BaseException:
            for lt in begun:
                lt.rollback()
            if marker is not None:
                marker.unlink(missing_ok=True)
            raise
        if marker is not None:
            for lt in begun:
                try:
                    lt.commit()
                except OSError:
                    # The marker is gone, so the batch is in: recovery will roll it forward.
                    logger.warning("left the committed batch for recovery in %s", lt.paths.dir)
        return sizes

    # -- reads -------------------------------------------------------------------------------

    async def _list_messages(
        self, thread_id: str, run_id: str | None, page: MessagePage, user_id: str | None
    ) -> list[RunEvent]:
        def query(cache: ThreadCache) -> list[RunEvent]:
            return [row.record() for row in cache.indexes.page(run_id, user_id, page)]

        return await self._read(thread_id, query, [])

    async def _list_events(self, query: EventQuery) -> list[RunEvent]:
        def read(cache: ThreadCache) -> list[RunEvent]:
            return [row.record() for row in cache.indexes.select(query)]

        return await self._read(query.thread_id, read, [])

    async def _last_visible_ai_seq_by_run(
        self, thread_id: str, run_ids: list[str], user_id: str | None
    ) -> dict[str, int]:
        return await self._read(
            thread_id, lambda c: c.indexes.last_visible_ai_seq_by_run(run_ids, user_id), {}
        )

    async def _count_messages(self, thread_id: str, user_id: str | None) -> int:
        return await self._read(thread_id, lambda c: c.indexes.count_messages(user_id), 0)

    # -- deletes -----------------------------------------------------------------------------

    async def _delete(self, thread_id: str, run_id: str | None, user_id: str | None) -> int:
        return await to_thread(self._delete_sync, thread_id, run_id, user_id)

    def _delete_sync(self, thread_id: str, run_id: str | None, user_id: str | None) -> int:
        if peek_state(self._paths(thread_id)) is None:
            return 0
        with self._locked([thread_id]) as held:
            lt = held[thread_id]
            cache = self._refreshed(lt)
            self._drop_cache(thread_id)
            # Marked first, so that every reader re-reads the thread even if this is cut short.
            lt.mark_shrunk()
            runs = cache.indexes.run_ids() if run_id is None else [run_id]
            deleted = sum(_delete_rows(lt.paths, cache, run, user_id) for run in runs)
            if run_id is None and user_id is None:
                for name in run_file_sizes(lt.paths):
                    (lt.paths.runs / name).unlink(missing_ok=True)
            delete_summaries(lt.paths, run_id, user_id)
            # Again now it is done: a reader without the lock may have read it half done.
            lt.mark_shrunk()
            return deleted

    # -- run summaries -----------------------------------------------------------------------

    async def _get_run_summary(
        self, thread_id: str, run_id: str, user_id: str | None
    ) -> dict[str, Any] | None:
        summaries = await to_thread(self._summaries, thread_id)
        summary = summaries.get(run_id)
        if summary is None or (user_id is not None and summary.get("user_id") != user_id):
            return None
        return summary

    async def _list_run_summaries(
        self, thread_id: str, user_id: str | None
    ) -> list[dict[str, Any]]:
        summaries = await to_thread(self._summaries, thread_id)
        return [s for s in summaries.values() if user_id is None or s.get("user_id") == user_id]

    def _summaries(self, thread_id: str) -> dict[str, dict[str, Any]]:
        """The thread's committed summaries: a batch a dead writer left is finished first (or,
        read-only, left out), as event reads do."""
        paths = self._paths(thread_id)
        if self.read_only:
            return self._committed_summaries(paths)
        if peek_state(paths) is None:
            return {}  # never written: nothing to recover, and nothing to create
        with self._locked([thread_id]):
            return read_summaries(paths)

    def _committed_summaries(self, paths: ThreadPaths) -> dict[str, dict[str, Any]]:
        for _ in range(_UNLOCKED_TRIES):
            before = peek_state(paths)
            if before is None:
                return {}
            lines = read_summary_lines(paths)
            after = peek_state(paths)  # after the lines, as ThreadCache.refresh_committed does
            if steady(before, after):
                skip = pending_sizes(paths, after).get(SUMMARIES_KEY)
                return parse_summaries(paths, lines if skip is None else cut_lines(lines, 0, skip))
        raise _unreadable_state(paths)

    # -- browsing ----------------------------------------------------------------------------

    async def _list_threads(self, query: ThreadQuery) -> list[ThreadInfo]:
        return await to_thread(self._browser.threads, query)

    async def _list_run_summary_page(self, query: SummaryQuery) -> list[dict[str, Any]]:
        return await to_thread(self._browser.summaries, query)


def _unreadable_state(paths: ThreadPaths) -> OSError:
    return OSError(
        f"cannot read {paths.state} steadily: it is unreadable (a writable store rebuilds it) "
        "or files keep shrinking under the reader"
    )


def _check_summary_owner(paths: ThreadPaths, summary: dict[str, Any]) -> None:
    stored = read_summaries(paths).get(summary["run_id"])
    if stored is not None and stored.get("user_id") != summary["user_id"]:
        raise other_users_summary_error(summary)


@functools.lru_cache(maxsize=1024)
def _thread_paths(base_dir: Path, thread_id: str) -> ThreadPaths:
    return ThreadPaths(base_dir, thread_id)


def _write_thread(
    lt: LockedThread,
    last_seq: int,
    lines: dict[str, list[bytes]],
    summaries: list[bytes] | None,
    marker: Path | None,
    begun: list[LockedThread],
) -> _Sizes:
    """Record the thread's file sizes, then append each file's lines with one write call."""
    before = {name: prepare_append(lt.paths.runs / name) for name in lines}
    summaries_size = None if not summaries else prepare_append(lt.paths.summaries)
    lt.begin(last_seq, before, marker, summaries_size)
    begun.append(lt)
    sizes = {}
    for name, size in before.items():
        data = b"".join(lines[name])
        append_file(lt.paths.runs / name, data)
        sizes[name] = (size, size + len(data))
    if summaries:
        append_file(lt.paths.summaries, b"".join(summaries))
    return sizes


def _delete_rows(paths: ThreadPaths, cache: ThreadCache, run_id: str, user_id: str | None) -> int:
    rows = cache.indexes.get("events", run_id, None).rows
    doomed = sum(1 for row in rows if user_id is None or row.user_id == user_id)
    if doomed == len(rows):
        paths.run_file(run_id).unlink(missing_ok=True)
    elif doomed:
        rewrite_file(paths.run_file(run_id), [row.line for row in rows if row.user_id != user_id])
    return doomed
