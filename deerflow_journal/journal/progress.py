"""Throttled progress snapshots: at most one per interval, plus one trailing snapshot."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ProgressReporter", "ProgressThrottle"]

logger = logging.getLogger(__name__)

#: Receives each snapshot: an async callable, or a plain one (called on the event loop);
#: what it returns is awaited if it is awaitable.
ProgressReporter = Callable[[dict[str, Any]], Any]

#: Seconds the program's exit waits for the snapshots it cancels to finish.
_EXIT_WAIT = 2.0

# Every snapshot being delivered, whoever still holds its throttle. A loop keeps only weak
# references to its tasks: a reporter that never returns would otherwise be destroyed pending
# (and logged as such) once its journal is dropped.
_delivering: set[asyncio.Task[Any]] = set()
_delivering_lock = threading.Lock()


class ProgressThrottle:
    """Sends completion-data snapshots to an async reporter without flooding it.

    The first change sends a snapshot at once; changes within ``interval`` seconds of the last
    send are held back and delivered as one trailing snapshot when the interval ends (or at
    ``finish()``). Snapshots are built when sent, so a trailing one shows the latest data.

    Args:
        reporter: Callable receiving each snapshot (awaited if it returns an awaitable).
        interval: Minimum seconds between two snapshots.
        snapshot: Builds the snapshot to send.
    """

    def __init__(
        self,
        reporter: ProgressReporter,
        interval: float,
        snapshot: Callable[[], dict[str, Any]],
    ) -> None:
        self._reporter = reporter
        self._interval = interval
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self._next_at = float("-inf")
        self._held = False
        self._timer: asyncio.TimerHandle | None = None
        self._sends: set[concurrent.futures.Future[Any]] = set()

    def changed(self, loop: asyncio.AbstractEventLoop) -> None:
        """Note a change; send now if the interval allows, else hold it for a trailing send."""
        with self._lock:
            now = time.monotonic()
            if not self._held and now >= self._next_at:
                self._next_at = now + self._interval
                send = True
            else:
                send = False
                if not self._held:
                    self._held = True
                    delay = max(self._next_at - now, 0.0)
                    with contextlib.suppress(RuntimeError):  # a closed loop: sent at finish()
                        loop.call_soon_threadsafe(self._arm, loop, delay)
        if send:
            self._send(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        with self._lock:
            if self._held and self._timer is None:
                self._timer = loop.call_later(delay, self._trail, loop)

    def _trail(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._timer = None
            if not self._held:
                return
            self._held = False
            self._next_at = time.monotonic() + self._interval
        self._send(loop)

    def finish(self, loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[Any] | None:
        """Send the held trailing snapshot now, if any; return its future."""
        with self._lock:
            if not self._held:
                return None
            self._held = False  # a timer still armed finds nothing held and does nothing
        return self._send(loop)

    def _send(self, loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future[Any] | None:
        try:
            future = asyncio.run_coroutine_threadsafe(self._report(self._snapshot()), loop)
        except RuntimeError:
            logger.warning("progress snapshot skipped: its event loop is closed")
            return None
        with self._lock:
            self._sends.add(future)
        future.add_done_callback(self._sent)
        return future

    def _sent(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._sends.discard(future)

    async def _report(self, snapshot: dict[str, Any]) -> None:
        task = asyncio.current_task()
        assert task is not None  # run_coroutine_threadsafe runs it as a task
        with _delivering_lock:
            _delivering.add(task)
        try:
            result = self._reporter(snapshot)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("progress_reporter failed")
        finally:
            with _delivering_lock:
                _delivering.discard(task)

    def pending(self) -> list[concurrent.futures.Future[Any]]:
        """Return the snapshots still being delivered."""
        with self._lock:
            return list(self._sends)


@atexit.register
def _cancel_at_exit() -> None:
    """Cancel the snapshots still being delivered when the program ends, and wait for them.

    On a loop that runs on (the journal's background loop, in a daemon thread) they would be
    destroyed pending when the interpreter shuts down. Exit handlers run last-registered
    first: the journal's own (``writer.py``) has waited for its snapshots by then.
    """
    with _delivering_lock:
        tasks = list(_delivering)
    loops: dict[asyncio.AbstractEventLoop, list[asyncio.Task[Any]]] = {}
    for task in tasks:
        loops.setdefault(task.get_loop(), []).append(task)
    for loop, group in loops.items():
        if not loop.is_running():  # stopped or closed: it can run nothing any more
            continue
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel(group), loop).result(_EXIT_WAIT)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` (of the running loop) and wait until each has ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
