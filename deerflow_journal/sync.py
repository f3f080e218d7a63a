"""``SyncStore``: every method of a ``RunEventStore`` for programs that do not use asyncio.

A store's pool, connections and locks belong to the event loop that set it up, so the facade
gives its store one loop of its own, running on a daemon thread: the store is set up, used and
closed there, and each blocking method hands its coroutine to that loop and waits for the
answer. A ``RunJournal`` given the facade writes to the same store on the same loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

from deerflow_journal.records import AUTO, Auto, RunEvent
from deerflow_journal.stores import RunEventStore, open_store
from deerflow_journal.stores.browsing import ThreadInfo
from deerflow_journal.summary import RunStatus, RunSummary

__all__ = ["SyncStore", "open_sync_store"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds the program's exit waits for each facade left open to close its store.
EXIT_TIMEOUT = 30.0

_open_lock = threading.Lock()
# Facades' loops still open, with their stores: closed at exit. Not the facades themselves,
# so that `RunJournal(event_store=SyncStore(url))` keeps working after the facade is dropped.
_open: dict[_StoreLoop, RunEventStore] = {}


@atexit.register
def _close_at_exit() -> None:
    """Close the stores of facades nobody closed, so their last writes are not left behind."""
    with _open_lock:
        still_open = list(_open.items())
    for loop, store in still_open:
        try:
            loop.stop(store, EXIT_TIMEOUT)
        except Exception:
            logger.exception("a SyncStore left open could not close its store at exit")


def _settle(outcome: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    """Hand the outcome of a call's task, from the loop, to the thread waiting for it."""
    if task.cancelled():
        outcome.cancel()
        outcome.set_running_or_notify_cancel()  # else concurrent.futures.wait() never sees it
    elif (error := task.exception()) is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(task.result())


class _StoreLoop:
    """One facade's event loop, on a daemon thread that never keeps the program from exiting."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self._serve, name="deerflow-journal-sync", daemon=True
        )
        self._lock = threading.Lock()
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self.closed = False
        self.thread.start()

    def _serve(self) -> None:
        try:
            self.loop.run_forever()
        except BaseException as exc:
            # A call raised KeyboardInterrupt or SystemExit, which asyncio lets out of the
            # loop: nothing runs here any more, so every caller still waiting is told.
            with self._lock:
                self.closed = True
                waiting = list(self._calls)
            with _open_lock:
                _open.pop(self, None)
            for outcome in waiting:
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    outcome.set_exception(
                        RuntimeError(f"the SyncStore's event loop ended: a call raised {exc!r}")
                    )
            logger.error("a SyncStore's event loop ended: a call raised %r", exc)
        finally:
            self.loop.close()

    def check_caller(self, method: str) -> None:
        """Refuse a call from the loop's own thread, which would wait for itself forever."""
        if threading.current_thread() is self.thread:
            raise RuntimeError(
                f"SyncStore.{method}() was called on the SyncStore's own event loop, where it "
                f"would wait for itself forever: await `sync_store.store.{method}(...)` there"
            )

    def call(self, method: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``make`` returns on the loop and return its result.

        Interrupted (Ctrl-C), the call is cancelled and then waited for: a write the store
        began still finishes, and whatever the caller does next (say, delete what it wrote)
        must not overlap it.
        """
        self.check_caller(method)
        coroutine = make()  # a bad argument raises here, in the caller's thread
        outcome: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[T]] = []

        def begin() -> None:
            # Run by the loop in a copy of the caller's context, taken by call_soon_threadsafe:
            # `user_scope` applies to the call.
            task = self.loop.create_task(coroutine)
            tasks.append(task)
            task.add_done_callback(functools.partial(_settle, outcome))

        with self._lock:  # close() must see every call started before it
            if self.closed:
                coroutine.close()
                raise RuntimeError(
                    f"this SyncStore is closed: SyncStore.{method}() needs an open one"
                )
            self.loop.call_soon_threadsafe(begin)
            self._calls.add(outcome)
        # Forgotten once it has ended, not when the caller stops waiting: close() still waits
        # for a write that a second Ctrl-C left running.
        outcome.add_done_callback(self._forget)
        try:
            return outcome.result()
        except BaseException:
            # begin() was queued first, so the task exists by the time this runs; a task
            # cancelled before its first step still ends, and settles the outcome.
            with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to wait for
                self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in tasks])
                with contextlib.suppress(BaseException):  # a second Ctrl-C stops waiting
                    outcome.exception()
            raise

    def _forget(self, outcome: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._calls.discard(outcome)

    def stop(self, store: RunEventStore, timeout: float | None) -> None:
        """Wait for calls under way, close ``store`` on the loop, then end the loop's thread."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            calls = list(self._calls)
        with _open_lock:
            _open.pop(self, None)
        concurrent.futures.wait(calls, timeout)
        closing = asyncio.run_coroutine_threadsafe(self._close(store), self.loop)
        try:
            closing.result(timeout)
        except concurrent.futures.TimeoutError:
            # Stopping the loop now would abandon the close half way: leave the daemon thread.
            raise TimeoutError(f"the store did not close within {timeout} s") from None
        except Exception:
            self._end()
            raise
        self._end()

    async def _close(self, store: RunEventStore) -> None:
        try:
            await store.close()
        finally:
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

    def _end(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


class SyncStore:
    """A blocking facade over a ``RunEventStore``: its reads and writes without ``await``.

    ``SyncStore(store)`` takes a store not set up yet (or closed), ``SyncStore(url)`` opens
    ``open_store(url)``. The facade runs the store on an event loop of its own, in a daemon
    thread, and ``close()`` (or leaving ``with``) closes the store and ends that thread; a
    facade left open is closed when the program exits. Each method takes the same arguments
    and returns the same values as the store's coroutine of the same name. Pass the facade to
    ``RunJournal(event_store=...)`` to journal a plain ``invoke`` into its store. Async code
    should open an async store of its own: a call on the facade's own loop raises
    ``RuntimeError``, and one on another running loop blocks that loop until it returns.
    """

    def __init__(self, store: RunEventStore | str) -> None:
        if isinstance(store, str):
            store = open_store(store)
        elif not isinstance(store, RunEventStore):
            raise TypeError(
                f"SyncStore needs a RunEventStore or a store URL, got {type(store).__name__}"
            )
        elif store._is_setup:
            # What it opened belongs to another loop, where the facade cannot run it.
            raise ValueError(
                "SyncStore sets its store up on a loop of its own: pass a store that is not "
                "set up yet (or was closed), or a URL"
            )
        self._store = store
        self._loop = _StoreLoop()
        with _open_lock:
            _open[self._loop] = store

    @property
    def store(self) -> RunEventStore:
        """The async store underneath, set up on the facade's loop (await it only there)."""
        return self._store

    @property
    def read_only(self) -> bool:
        """Whether the store was opened only to read."""
        return self._store.read_only

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._loop.closed

    # -- lifecycle ---------------------------------------------------------------------------

    def setup(self) -> None:
        """Set the store up on the facade's loop; safe to call any number of times."""
        self._loop.call("setup", self._store.setup)

    def close(self) -> None:
        """Close the store and end the facade's loop; later calls raise, closing again does not."""
        self._loop.check_caller("close")
        self._loop.stop(self._store, None)

    def __enter__(self) -> Self:
        try:
            self.setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writes ------------------------------------------------------------------------------

    def put(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: Any = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: datetime | str | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> RunEvent:
        """Append one event and return the stored record."""
        return self._loop.call(
            "put",
            lambda: self._store.put(
                thread_id=thread_id,
                run_id=run_id,
                event_type=event_type,
                category=category,
                content=content,
                metadata=metadata,
                created_at=created_at,
                user_id=user_id,
            ),
        )

    def put_batch(self, events: Sequence[Mapping[str, Any]]) -> list[RunEvent]:
        """Append every event atomically, seq in input order; a rejected batch writes nothing."""
        return self._loop.call("put_batch", lambda: self._store.put_batch(events))

    def put_if_absent(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: Any = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: datetime | str | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> tuple[RunEvent, bool]:
        """Append unless the run already has an event of this type; ``(record, created)``."""
        return self._loop.call(
            "put_if_absent",
            lambda: self._store.put_if_absent(
                thread_id=thread_id,
                run_id=run_id,
                event_type=event_type,
                category=category,
                content=content,
                metadata=metadata,
                created_at=created_at,
                user_id=user_id,
            ),
        )

    def put_run_summary(self, summary: RunSummary) -> RunSummary:
        """Insert or replace the summary of ``(summary.thread_id, summary.run_id)``."""
        return self._loop.call("put_run_summary", lambda: self._store.put_run_summary(summary))

    def delete_by_thread(self, thread_id: str, *, user_id: str | Auto | None = AUTO) -> int:
        """Delete the thread's events and run summaries and return how many events went."""
        return self._loop.call(
            "delete_by_thread", lambda: self._store.delete_by_thread(thread_id, user_id=user_id)
        )

    def delete_by_run(
        self, thread_id: str, run_id: str, *, user_id: str | Auto | None = AUTO
    ) -> int:
        """Delete one run's events and summary and return how many events went."""
        return self._loop.call(
            "delete_by_run",
            lambda: self._store.delete_by_run(thread_id, run_id, user_id=user_id),
        )

    # -- reads -------------------------------------------------------------------------------

    def list_messages(
        self,
        thread_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[RunEvent]:
        """Return a page of the thread's message rows in ascending seq."""
        return self._loop.call(
            "list_messages",
            lambda: self._store.list_messages(
                thread_id, limit=limit, before_seq=before_seq, after_seq=after_seq, user_id=user_id
            ),
        )

    def list_messages_by_run(
        self,
        thread_id: str,
        run_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[RunEvent]:
        """Return a page of one run's message rows, paged like ``list_messages``."""
        return self._loop.call(
            "list_messages_by_run",
            lambda: self._store.list_messages_by_run(
                thread_id,
                run_id,
                limit=limit,
                before_seq=before_seq,
                after_seq=after_seq,
                user_id=user_id,
            ),
        )

    def list_events(
        self,
        thread_id: str,
        run_id: str | None,
        *,
        event_types: Iterable[str] | str | None = None,
        task_id: str | None = None,
        limit: int = 500,
        after_seq: int | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[RunEvent]:
        """Return one run's events (``None``: every run's) in ascending seq, filters first."""
        return self._loop.call(
            "list_events",
            lambda: self._store.list_events(
                thread_id,
                run_id,
                event_types=event_types,
                task_id=task_id,
                limit=limit,
                after_seq=after_seq,
                user_id=user_id,
            ),
        )

    def get_last_visible_ai_seq_by_run(
        self,
        thread_id: str,
        run_ids: Iterable[str],
        *,
        user_id: str | Auto | None = AUTO,
    ) -> dict[str, int]:
        """Map each run to the seq of its last AI message not produced by middleware."""
        return self._loop.call(
            "get_last_visible_ai_seq_by_run",
            lambda: self._store.get_last_visible_ai_seq_by_run(thread_id, run_ids, user_id=user_id),
        )

    def count_messages(self, thread_id: str, *, user_id: str | Auto | None = AUTO) -> int:
        """Return how many message rows the thread has."""
        return self._loop.call(
            "count_messages", lambda: self._store.count_messages(thread_id, user_id=user_id)
        )

    def get_run_summary(
        self, thread_id: str, run_id: str, *, user_id: str | Auto | None = AUTO
    ) -> RunSummary | None:
        """Return the stored summary of one run, or ``None``."""
        return self._loop.call(
            "get_run_summary",
            lambda: self._store.get_run_summary(thread_id, run_id, user_id=user_id),
        )

    def list_run_summaries(
        self,
        thread_id: str | None = None,
        *,
        status: RunStatus | None = None,
        limit: int | None = None,
        before: RunSummary | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[RunSummary]:
        """Return run summaries: a thread's all, or a page of runs newest first."""
        return self._loop.call(
            "list_run_summaries",
            lambda: self._store.list_run_summaries(
                thread_id, status=status, limit=limit, before=before, user_id=user_id
            ),
        )

    def list_threads(
        self,
        *,
        limit: int = 50,
        before: ThreadInfo | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[ThreadInfo]:
        """Return a page of threads, most recent activity first."""
        return self._loop.call(
            "list_threads",
            lambda: self._store.list_threads(limit=limit, before=before, user_id=user_id),
        )


def open_sync_store(
    url: str | None = None, *, read_only: bool = False, **options: Any
) -> SyncStore:
    """``open_store(url, read_only=..., **options)`` behind a ``SyncStore`` (use ``with``)."""
    return SyncStore(open_store(url, read_only=read_only, **options))
