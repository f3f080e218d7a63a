"""The journal's one flush path: buffered events and run summaries, one store write at a time.

Callbacks only append to memory. A write takes everything pending when it starts and sends it
with one ``put_batch`` (then the pending run summaries); if the store fails, the batch goes
back to the front of the buffer, so nothing is lost, duplicated or reordered. Writes run on an
event loop chosen by the caller, as tracked futures, never more than one at a time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deerflow_journal.journal.loops import running_loop
from deerflow_journal.stores.base import RunEventStore
from deerflow_journal.summary import RunSummary

__all__ = ["EventBuffer"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Write:
    """One write in flight: the future of its job and the loop it runs on."""

    future: concurrent.futures.Future[None]
    loop: asyncio.AbstractEventLoop

    def is_dead(self) -> bool:
        """True when its loop closed before the job could finish (the job took nothing)."""
        return self.loop.is_closed() and not self.future.done()


class EventBuffer:
    """Events and run summaries waiting for the store.

    Args:
        store: Where batches go.
        threshold: ``add`` reports a full buffer at this many pending events.
    """

    def __init__(self, store: RunEventStore, threshold: int) -> None:
        self.store = store
        self.threshold = threshold
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._summaries: dict[tuple[str, str], RunSummary] = {}
        self._write: _Write | None = None
        self._drain = False
        self._close_when_empty = False

    def __len__(self) -> int:
        return len(self._events)

    # -- memory only -----------------------------------------------------------------------

    def add(self, event: dict[str, Any]) -> bool:
        """Append an event; return True when the buffer reached the threshold."""
        with self._lock:
            self._events.append(event)
            return len(self._events) >= self.threshold

    def put_summary(self, summary: RunSummary) -> None:
        """Queue a run summary; a newer one of the same run replaces it."""
        with self._lock:
            self._summaries.pop((summary.thread_id, summary.run_id), None)
            self._summaries[(summary.thread_id, summary.run_id)] = summary

    def close_store_when_empty(self) -> None:
        """Close the store after the write that leaves nothing pending (it reopens on use)."""
        with self._lock:
            self._close_when_empty = True

    # -- background writes -----------------------------------------------------------------

    def kick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a background write on ``loop`` unless one is running or nothing is pending."""
        with self._lock:
            self._start_locked(loop)

    def drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write everything pending in the background, one write after another."""
        with self._lock:
            self._drain = True
            self._start_locked(loop)

    def _pending_locked(self) -> bool:
        return bool(self._events or self._summaries)

    def _start_locked(self, loop: asyncio.AbstractEventLoop) -> _Write | None:
        if self._write is not None and self._write.is_dead():
            self._write = None
        if self._write is not None or not self._pending_locked():
            return None
        coro = self._job()
        try:
            future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed: keep everything for the next writer
            coro.close()
            logger.warning("journal write skipped: its event loop is closed")
            return None
        write = self._write = _Write(future, loop)
        future.add_done_callback(lambda done: self._finished(write, done))
        return write

    async def _job(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            summaries = list(self._summaries.values())
            self._summaries.clear()
            close_after = self._close_when_empty
            self._close_when_empty = False
        try:
            if events:
                await self.store.put_batch(events)
        except BaseException:
            self._requeue(events, summaries, close_after)
            raise
        for index, summary in enumerate(summaries):
            try:
                await self.store.put_run_summary(summary)
            except BaseException:
                self._requeue([], summaries[index:], close_after)
                raise
        if close_after:
            await self.store.close()

    def _requeue(
        self, events: list[dict[str, Any]], summaries: list[RunSummary], close_after: bool
    ) -> None:
        with self._lock:
            self._events[:0] = events
            newer = self._summaries
            self._summaries = {(s.thread_id, s.run_id): s for s in summaries}
            self._summaries.update(newer)
            self._close_when_empty = self._close_when_empty or close_after

    def _finished(self, write: _Write, future: concurrent.futures.Future[None]) -> None:
        error = None if future.cancelled() else future.exception()
        if future.cancelled() or error is not None:
            logger.warning("journal write failed; its events stay buffered: %r", error)
        with self._lock:
            if self._write is write:
                self._write = None
            if future.cancelled() or error is not None:
                return
            if self._drain and not self._pending_locked():
                self._drain = False
            if self._drain or len(self._events) >= self.threshold:
                self._start_locked(write.loop)

    # -- waiting -----------------------------------------------------------------------------

    def _next_locked(self, loop: asyncio.AbstractEventLoop) -> tuple[_Write | None, bool]:
        """Return (write to wait for, whether we started it); (None, False) when all is done."""
        if self._write is not None and self._write.is_dead():
            self._write = None
        if self._write is not None:
            return self._write, False
        return self._start_locked(loop), True

    async def flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write everything pending (on ``loop``); raise if the store fails."""
        while True:
            with self._lock:
                write, ours = self._next_locked(loop)
            if write is None:
                return
            try:
                await asyncio.wrap_future(write.future)
            except BaseException:
                if ours:
                    raise

    def flush_blocking(self, pick_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        """Write everything pending, blocking this thread; raise if the store fails.

        ``pick_loop`` names a loop that is not blocked by this thread. A write already
        running on this thread's own loop cannot be waited for here: it finishes in the
        background.
        """
        current = running_loop()
        while True:
            with self._lock:
                write, ours = self._next_locked(pick_loop())
            if write is None:
                return
            if write.loop is current:
                return
            try:
                write.future.result()
            except BaseException:
                if ours:
                    raise

    def forget_drain(self) -> None:
        """Stop continuing background writes (the next trigger starts them again)."""
        with self._lock:
            self._drain = False
