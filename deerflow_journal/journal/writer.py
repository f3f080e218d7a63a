"""``JournalWriter``: where and when a journal's events reach its store.

It owns the ``EventBuffer``, picks the event loop each write runs on, ends runs (a background
drain under ``ainvoke``, a blocking flush under a plain ``invoke``), tracks work still running
(progress snapshots, runs waiting for their workspace diff) and closes a store the journal
opened itself, at the latest when the program exits.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import time
import weakref
from collections.abc import Coroutine
from typing import Any

from deerflow_journal.journal.buffer import EventBuffer
from deerflow_journal.journal.loops import background_loop, running_loop, takes_work
from deerflow_journal.journal.progress import ProgressThrottle
from deerflow_journal.journal.state import RunState
from deerflow_journal.stores.base import JournalStore, RunEventStore

__all__ = ["JournalWriter"]

logger = logging.getLogger(__name__)

_OWNING: weakref.WeakSet[JournalWriter] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Write out what journals that opened their own store still hold when the program ends."""
    for writer in list(_OWNING):
        try:
            writer.close()
        except Exception:
            logger.exception("journal could not write its buffered events at exit")


class JournalWriter:
    """Writes one journal's events, one background batch at a time.

    A store the journal opened itself always runs on the journal's background loop. A store
    passed in runs on the loop it was set up on while that loop runs and is not shutting down
    (its pool or locks belong to it), else on the loop the callbacks run on; code that must
    block (a plain ``invoke``, ``close()``) uses one of those loops from another thread, else
    the background loop (also for a write such a loop cancelled or closed under it).

    Args:
        store: Where events go.
        owns_store: Whether the journal opened ``store`` (and must close it, at the latest
            when the program exits: what it still buffers is written out then).
        flush_threshold: Pending events that start a background write.
        progress: Throttled progress reporting, if any.
        max_buffered_events: Events held in memory at most while the store does not take
            them; the next ones spill to a temporary file.
    """

    #: Seconds each blocking wait (``close()``, the end of a plain ``invoke``) waits for the
    #: store before it logs at ERROR what is not written and returns.
    wait_timeout: float = 30.0

    def __init__(
        self,
        store: RunEventStore | JournalStore,
        *,
        owns_store: bool,
        flush_threshold: int,
        progress: ProgressThrottle | None,
        max_buffered_events: int = 100_000,
    ) -> None:
        self.buffer = EventBuffer(store, flush_threshold, self.wait_timeout, max_buffered_events)
        self.owns_store = owns_store
        self.progress = progress
        #: The loop of the latest run started under ``ainvoke``.
        self.home_loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: set[concurrent.futures.Future[Any]] = set()
        if owns_store:
            _OWNING.add(self)

    @property
    def store(self) -> RunEventStore | JournalStore:
        """The store written to."""
        return self.buffer.store

    # -- loops -------------------------------------------------------------------------------

    def store_loop(self) -> asyncio.AbstractEventLoop | None:
        """The running loop a store passed in was set up on, else ``None``."""
        # A psycopg pool hands out connections through tasks and conditions of the loop that
        # opened it: used from another loop, a waiting write is never woken.
        store = self.store
        loop = store._setup_loop if isinstance(store, RunEventStore) else None
        if self.owns_store or not takes_work(loop):
            return None
        return loop

    def blocking_loop(self) -> asyncio.AbstractEventLoop:
        """A loop this thread may block on: the store's or the caller's loop in another
        thread, else ours."""
        if not self.owns_store:
            current = running_loop()
            for home in (self.store_loop(), self.home_loop):
                if takes_work(home) and home is not current:
                    return home
        return background_loop()

    def caller_loop(self, sync: bool) -> asyncio.AbstractEventLoop:
        """The loop running the graph under ``ainvoke`` (``sync``: a plain ``invoke``), else
        ``blocking_loop()``: progress snapshots go there, and writes to a store passed in."""
        if not sync:
            loop = running_loop()
            if loop is not None:
                return loop
            home = self.home_loop
            if takes_work(home):  # a sync node's thread: the run's loop
                return home
        return self.blocking_loop()

    def write_loop(self, sync: bool) -> asyncio.AbstractEventLoop:
        """The loop a run's background writes go to (``sync``: the run is a plain ``invoke``)."""
        if self.owns_store:
            return background_loop()
        return (None if sync else self.store_loop()) or self.caller_loop(sync)

    # -- memory only (called under the journal's lock) -----------------------------------

    def changed(self, state: RunState) -> None:
        """Tell the progress reporter that the run's completion data changed."""
        if self.progress is not None:
            self.progress.changed(self.caller_loop(state.sync))

    # -- ending runs -------------------------------------------------------------------------

    def run_ended(self, state: RunState, loop: asyncio.AbstractEventLoop, last: bool) -> None:
        """Write out a run that reached its terminal outcome (``last``: no other run is open).

        ``loop`` is the run's ``caller_loop()``. Under ``ainvoke`` the writes drain in the
        background; under a plain ``invoke`` this blocks until the run is stored, so the caller
        needs no extra call.
        """
        if last and self.owns_store:
            self.buffer.close_store_when_empty()
        trailing = None if self.progress is None else self.progress.finish(loop)
        if not state.sync:
            self.buffer.write_pending(
                background_loop() if self.owns_store else self.store_loop() or loop
            )
            return
        started = time.monotonic()
        self.buffer.flush_blocking(self.blocking_loop, self.wait_timeout)
        if trailing is not None:
            left = max(0.0, self.wait_timeout - (time.monotonic() - started))
            try:
                trailing.result(timeout=left)
            except concurrent.futures.TimeoutError:
                logger.error(
                    "journal gave up after %.1f s waiting for its last progress snapshot",
                    self.wait_timeout,
                )

    def run_in_background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the background loop; ``flush`` and ``close`` wait for it."""
        future = asyncio.run_coroutine_threadsafe(coro, background_loop())
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _still_running(self) -> list[concurrent.futures.Future[Any]]:
        with self._lock:
            pending = list(self._pending)
        if self.progress is not None:
            pending.extend(self.progress.pending())
        return pending

    # -- flushing and closing ------------------------------------------------------------------

    async def flush(self) -> None:
        """Write everything buffered; raise if the store fails (the events stay buffered)."""
        with self._lock:
            pending = list(self._pending)
        for future in pending:
            await asyncio.wrap_future(future)
        await self.buffer.flush(self.write_loop(False))

    async def aclose(self) -> None:
        """Flush, wait for progress snapshots, close the store if the journal opened it."""
        self.buffer.closed()
        await self.flush()
        still = [asyncio.wrap_future(future) for future in self._still_running()]
        if still:
            _, waiting = await asyncio.wait(still, timeout=self.wait_timeout)
            if waiting:  # a progress reporter that never returns must not hang the close
                logger.error(
                    "journal gave up after %.1f s waiting for %d progress snapshots or "
                    "workspace diffs",
                    self.wait_timeout,
                    len(waiting),
                )
        if self.owns_store:
            closing = asyncio.run_coroutine_threadsafe(self.store._release(), background_loop())
            await asyncio.wrap_future(closing)

    def close(self) -> None:
        """``aclose()`` for code that may block (with no loop, or beside a running one); a
        write on this thread's own loop, which it cannot wait for, gets a WARNING."""
        self.buffer.closed()
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending, self.wait_timeout)
        if not self.buffer.flush_blocking(self.blocking_loop, self.wait_timeout, closing=True):
            return
        if running_loop() is None:
            concurrent.futures.wait(self._still_running(), self.wait_timeout)
        if self.owns_store:
            closing = asyncio.run_coroutine_threadsafe(self.store._release(), background_loop())
            if not concurrent.futures.wait([closing], self.wait_timeout).done:
                logger.error("journal gave up after %.1f s closing its store", self.wait_timeout)
                return
            closing.result()
