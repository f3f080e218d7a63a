"""The journal's one flush path: buffered events and run summaries, one store write at a time.

Callbacks only append to memory: events whose content may still hold LangChain messages and
whose ``created_at`` is a ``time.time()`` float. A write takes everything pending when it
starts and sends it with the pending run summaries in one store write (messages encoded as
their ``model_dump()``), all or nothing, under a batch id our stores record with it. If the
store fails, the batch is kept whole and retried first under the same id, so a batch whose
answer was lost (a connection dropped after the commit, a write cancelled with its loop) is
written once, and nothing is lost or reordered. A store that refuses an event for good
(``EventRefused``, or the event's own normalisation fails) gets the rest of the batch: the
batch is split until the refused events are found, and those are dropped, logged at ERROR and
counted in their runs' summaries. Writes run on an event loop chosen by the caller, as
tracked tasks or futures, one at a time.

Memory is bounded: past ``max_buffered`` events held, the next ones go in order to a
``SpillFile`` and come back, oldest first, once the store takes what memory holds; run
summaries wait until the spilled events are written. Run summaries are bounded too: past
``max_summaries`` waiting while writes fail, a write builds them and moves them, in order, to
a file of their own, read back once the spilled events are written and before any summary
still in memory (which is newer), ``max_summaries`` at a time. A write sends at most
``_MAX_BATCH`` events at a time, so a long backlog reaches the store in bounded batches.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from deerflow_journal.journal.loops import (
    background_loop,
    is_background_loop,
    loop_ending,
    on_background_loop,
    running_loop,
)
from deerflow_journal.journal.mapping import MessageEncoder
from deerflow_journal.journal.spill import SUMMARIES, SpillFile, report_leftover_spills
from deerflow_journal.records import (
    DEFAULT_MAX_OUTPUTS_CONTENT,
    DEFAULT_MAX_TRACE_CONTENT,
    JSON_MAX_LENGTH,
    EventRefused,
    decode_json,
    encode_json,
    fit_json,
    normalise_event,
    some_names,
    utc_timestamp,
)
from deerflow_journal.stores.base import JournalStore, RunEventStore
from deerflow_journal.summary import RunSummary

__all__ = ["EventBuffer"]

logger = logging.getLogger(__name__)


class SummaryBuilder(Protocol):
    """Builds a run's summary as of now under the journal's lock: ``locked`` if the caller
    holds it; at exit, gives up waiting for it after ``timeout`` seconds (``TimeoutError``;
    -1: waits as long as it takes)."""

    def __call__(self, timeout: float = -1, *, locked: bool = False) -> dict[str, Any]: ...


#: A run summary a write takes: its run's key, its builder and what that built.
_Summary = tuple[tuple[str, str], SummaryBuilder, dict[str, Any]]
#: The most events one store write takes (a backlog goes out in batches of this size).
_MAX_BATCH = 1000


def _timestamped(event: dict[str, Any]) -> dict[str, Any]:
    """Turn the event's ``time.time()`` into the timestamp a store takes (in place: the event
    is ours, and a retried batch finds it done)."""
    created_at = event["created_at"]
    if isinstance(created_at, float):
        event["created_at"] = utc_timestamp(created_at)
    return event


def _takes_journal_batches(store: Any) -> bool:
    """True for our own stores whose public writes are not overridden."""
    cls = type(store)
    # The class's MRO, not isinstance(): an ABC's instance check costs every journal a lot.
    return (
        RunEventStore in cls.__mro__
        and cls.put_batch is RunEventStore.put_batch
        and cls.put_run_summary is RunEventStore.put_run_summary
    )


def _plain_event(event: dict[str, Any], dumps: MessageEncoder) -> dict[str, Any]:
    """``event`` with its content and metadata as plain JSON values (messages dumped)."""
    plain = dict(event)
    for key in ("content", "metadata"):
        plain[key] = decode_json(encode_json(event[key], default=dumps))
    return plain


def _spilled_summary(timeout: float = -1, *, locked: bool = False) -> dict[str, Any]:
    raise AssertionError("a summary read back from its file is built already")


def _why_unspillable(error: Exception) -> str:
    """Why an event that went neither to memory nor to the spill file was dropped."""
    if isinstance(error, OSError):  # a full disk, say: no fault of the event or the store
        return "past the memory bound, which could not be spilled to a file"
    return "its store can never store (it cannot be encoded)"


def _fitted(event: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of ``event`` whose content, too long for any store (a tool's artifact of many
    megabytes, an image in a question), has its longest strings cut to fit, with metadata
    that says so; ``None`` if its content is not what is too long, or cannot be cut to fit.
    A message keeps its shape, so that a tool call keeps its result."""
    try:
        content = encode_json(event.get("content", ""), MessageEncoder())
    except Exception:  # not storable at all: refused as it is
        return None
    cut = fit_json(content)
    if cut is None or cut is content:
        return None
    metadata = event.get("metadata") or {}
    if not isinstance(metadata, dict):
        return None
    return {
        **event,
        "content": decode_json(cut),
        "metadata": {
            **metadata,
            "content_truncated": True,
            "original_byte_length": len(content.encode()),
        },
    }


async def _outcome(task: asyncio.Future[None]) -> None:
    await asyncio.wait([task])
    task.result()


def _end_quietly(coro: Coroutine[Any, Any, None], future: object) -> None:
    """End the coroutine of a job whose loop closed under it: its ``finally`` blocks run (what
    they await is thrown out again), and its task, if it has one here, is not reported as
    destroyed while pending."""
    if isinstance(future, asyncio.Task):
        with contextlib.suppress(AttributeError):
            future._log_destroy_pending = False  # type: ignore[attr-defined]
    for _ in range(100):
        if coro.cr_frame is None:
            return
        with contextlib.suppress(BaseException):
            coro.close()


def _new_batch_id() -> str:
    """A unique id that sorts by time: stores index it, and a new id then goes at the end of
    the index rather than into a random page of it."""
    return f"{time.time_ns():016x}{os.urandom(8).hex()}"


@dataclass(slots=True)
class _Batch:
    """Events written together, under an id our stores record with them: a retry of a batch
    the store took (its answer lost with the connection) writes nothing twice."""

    events: list[dict[str, Any]]
    batch_id: str = field(default_factory=lambda: _new_batch_id())
    #: Whether a write of it was tried (its id then stands for these events: never split).
    sent: bool = False
    #: The run summaries it carried, as built then: a retry carries the same, never newer
    #: ones, which may tell of events in later batches (a run's success before its run.end).
    summaries: list[dict[str, Any]] | None = None


def _watch(
    task: asyncio.Future[None], loop: asyncio.AbstractEventLoop
) -> concurrent.futures.Future[None]:
    """A future of any thread that ends as ``task`` (of ``loop``, running in another thread)
    ends; never if ``loop`` stops or closes first. Raises ``RuntimeError`` if it is closed.

    A callback, not a coroutine: a loop closed before it runs drops it without a warning."""
    watcher: concurrent.futures.Future[None] = concurrent.futures.Future()

    def copy(done: asyncio.Future[None]) -> None:
        if watcher.done():
            return
        if done.cancelled():
            watcher.cancel()
        elif (error := done.exception()) is not None:
            watcher.set_exception(error)
        else:
            watcher.set_result(None)

    loop.call_soon_threadsafe(task.add_done_callback, copy)
    return watcher


class LoopStopped(TimeoutError):
    """A journal write waited for is on another thread's event loop, which stopped (kept for
    a next task) and may never run it; its events stay buffered."""


@dataclass(slots=True)
class _Write:
    """One write in flight: its job (a task on ``loop``, or a future from another thread)."""

    loop: asyncio.AbstractEventLoop
    #: Set once the job is started (it gets this write first, to know if it was given up).
    future: asyncio.Future[None] | concurrent.futures.Future[None] = field(init=False)
    #: The job's coroutine (ended by hand if its loop closes under it).
    job: Coroutine[Any, Any, None] | None = None
    #: Given up, its loop closed under it: what it took is queued again, it touches nothing.
    abandoned: bool = False
    #: Its end was accounted for (by its done callback, or by the next write if that never ran).
    settled: bool = False

    def is_dead(self) -> bool:
        """True when its loop closed: it never runs again, nor the callbacks of its end.

        (A loop that is only stopped may run again: its write is waited for, as long as the
        waiter's timeout allows. Given up, it could hold a lock of that loop, such as a store's
        setup lock, that every later write would wait for.)"""
        return self.loop.is_closed()

    def _outcome_if_closed(self) -> None:
        """Raise what the job raised, if it ended (its loop closed before telling us)."""
        future = self.future
        if future.done():
            future.result()

    def _waitable(self) -> concurrent.futures.Future[None] | None:
        """The job's end as a future any thread may wait on; ``None`` if its loop is closed
        (what the job raised, if it ended, is raised)."""
        future = self.future
        if isinstance(future, concurrent.futures.Future):
            return future
        try:
            return _watch(future, self.loop)
        except RuntimeError:  # its loop is closed
            self._outcome_if_closed()
            return None

    async def wait(self, stopped_for: float) -> None:
        """Wait for the job from any running loop; raise what it raised. Returns at once if
        its loop is closed, or closes while waiting, before the job ends (``is_dead``); raises
        ``LoopStopped`` once another thread's loop has stayed stopped ``stopped_for`` seconds
        (kept for a next task, it may never run again)."""
        if self.loop is asyncio.get_running_loop():
            await _outcome(self.future)
            return
        future = self._waitable()
        if future is None:
            return
        waiting = asyncio.wrap_future(future)
        stopped_at = None
        # Looked at now and then: a loop that closes never runs what it was sent.
        while not (await asyncio.wait([waiting], timeout=_LOOK_EVERY))[0]:
            if self.loop.is_closed():
                self._outcome_if_closed()
                return
            if self.loop.is_running():
                stopped_at = None
            elif stopped_at is None:
                stopped_at = time.monotonic()
            elif time.monotonic() - stopped_at > stopped_for:
                raise LoopStopped(
                    f"the event loop of the journal write waited for stopped {stopped_for:.1f} "
                    "s ago: run it again or close it"
                )
        waiting.result()

    def wait_blocking(self, timeout: float) -> bool:
        """Wait for the job from a thread not running its loop; raise what it raised.

        Returns False if the job did not finish within ``timeout`` seconds, True at once if
        its loop closed under it (``is_dead``).
        """
        deadline = time.monotonic() + timeout
        future = self._waitable()
        if future is None:
            return True
        # Looked at now and then: a loop that closes never runs what it was sent.
        while not concurrent.futures.wait([future], min(_LOOK_EVERY, timeout)).done:
            if self.loop.is_closed():
                self._outcome_if_closed()  # it ended, but our waiter never ran
                return True
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return False
        future.result()
        return True


#: Buffers holding events their store has not taken, after a failed write or a spill, or
#: while a write runs; held strongly, so that a journal dropped meanwhile still writes them
#: when its loop closes, or saves them when the program exits.
_STRANDED: set[EventBuffer] = set()

#: Seconds the program's exit waits for a write in flight on another thread's loop.
_EXIT_WAIT = 2.0
#: Seconds between looks at the loop of a write waited for from another thread.
_LOOK_EVERY = 0.05
#: What a write sent to a loop that ends under it raises to who waits for it.
_CANCELLED = (asyncio.CancelledError, concurrent.futures.CancelledError)


@atexit.register
def _save_at_exit() -> None:
    deadline = time.monotonic() + _EXIT_WAIT  # one wait for all: a journal per request
    for buffer in list(_STRANDED):
        buffer.save_at_exit(deadline)


# Per caller loop: the buffers that wrote on it, and the async generator that writes what
# they hold before the loop closes (the generator is kept here: loops hold theirs weakly).
_LOOP_GUARDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[EventBuffer]] = (
    weakref.WeakKeyDictionary()
)
_GUARD_GENERATORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
    weakref.WeakKeyDictionary()
)
#: Held to change or walk the two maps above: loops of several threads start guards at once.
_GUARDS_LOCK = threading.Lock()


def _guard(loop: asyncio.AbstractEventLoop) -> weakref.WeakSet[EventBuffer]:
    """Start the guard of ``loop`` (running in this thread); the set of buffers it writes.

    ``asyncio.run`` cancels every task when its coroutine returns, our writes included, and
    then finalises the async generators the loop has seen: a started generator is finalised
    there, on the still running loop, and writes what its buffers hold. One per loop, not
    one per journal: a journal per request is common. The generator holds its loop (through
    the loop's finaliser hook): its entry goes when the loop shuts down its generators, or,
    for a loop closed without that, when the next guard starts.
    """
    buffers: weakref.WeakSet[EventBuffer] = weakref.WeakSet()
    guard = _at_loop_shutdown(buffers)
    with contextlib.suppress(StopIteration):
        guard.asend(None).send(None)  # runs to its ``yield``: the loop now tracks it
    with _GUARDS_LOCK:
        for closed in [known for known in list(_GUARD_GENERATORS) if known.is_closed()]:
            # Dropped unfinished: a closed loop's finaliser hook lets it go without a word.
            _GUARD_GENERATORS.pop(closed, None)
            _LOOP_GUARDS.pop(closed, None)
        _LOOP_GUARDS[loop] = buffers
        _GUARD_GENERATORS[loop] = guard
    return buffers


async def _at_loop_shutdown(buffers: weakref.WeakSet[EventBuffer]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        loop = asyncio.get_running_loop()
        loop_ending(loop)  # other threads' writes go elsewhere now
        # The generator holds the loop: the loop may be freed once closed. (Its buffers stay
        # known: one that writes on it from now on starts no generator the loop would not end.)
        with _GUARDS_LOCK:
            _GUARD_GENERATORS.pop(loop, None)
        await asyncio.gather(*(buffer._write_before_loop_closes() for buffer in list(buffers)))


class _FailedWrites:
    """Says that the store fails writes once, then at most every ``repeat_seconds`` while it
    goes on failing, and says when a write works again: a store down for an hour logs a line
    a minute, not one per write. Also times the retries: ``first_retry_seconds`` after the
    first failure, twice as long after each next one, at most ``max_retry_seconds``."""

    repeat_seconds = 60.0
    first_retry_seconds = 1.0
    max_retry_seconds = 30.0

    def __init__(self) -> None:
        self.count = 0  # failed writes in a row
        self._said_at: float | None = None

    def failed(self, error: BaseException, unwritten: int) -> None:
        self.count += 1
        now = time.monotonic()
        if self._said_at is not None and now - self._said_at < self.repeat_seconds:
            return
        if self._said_at is None:
            logger.warning("journal write failed; its events stay buffered: %r", error)
        else:
            logger.warning(
                "journal writes still fail (%d in a row); %d events wait: %r",
                self.count,
                unwritten,
                error,
            )
        self._said_at = now

    def retry_delay(self) -> float:
        """Seconds to wait before retrying, after ``count`` failed writes in a row."""
        doublings = min(max(self.count - 1, 0), 32)  # 2**32 s is past any cap
        return min(self.first_retry_seconds * 2**doublings, self.max_retry_seconds)

    def succeeded(self) -> None:
        if self.count > 1:
            logger.warning("journal writes work again after %d failed in a row", self.count)
        self.count, self._said_at = 0, None


class EventBuffer:
    """Events and run summaries waiting for the store.

    Args:
        store: Where batches go.
        threshold: ``add`` reports a full buffer at this many pending events.
        wait_timeout: Seconds a blocking wait waits for the store.
        max_buffered: Events held in memory at most; the next ones spill to a file. Run
            summaries held while writes fail are bounded by a hundredth of it (at least 10).
    """

    def __init__(
        self,
        store: RunEventStore | JournalStore,
        threshold: int,
        wait_timeout: float = 30.0,
        max_buffered: int = 100_000,
    ) -> None:
        report_leftover_spills()
        self.store = store
        self.threshold = threshold
        self.max_buffered = max_buffered
        self._journal_batches = _takes_journal_batches(store)  # the store never changes
        self.wait_timeout = wait_timeout
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        #: A batch whose write failed in a way that may have stored it (retried first, alone).
        self._unsure: _Batch | None = None
        #: Events after those in memory, once memory holds ``max_buffered``.
        self._spill = SpillFile()
        #: Events the running write took from memory (they still take memory).
        self._taken = 0
        #: How many events ``_events`` may hold (the bound less those taken or to retry).
        self._room = max_buffered
        #: Events that could not be spilled (nor stored): dropped by the next write.
        self._unspillable: list[tuple[dict[str, Any], Exception]] = []
        #: Told of the events dropped for good (after they are logged): it must hold its
        #: owner (which holds this buffer) weakly, so that the owner is freed once dropped.
        self.on_dropped: Callable[[list[dict[str, Any]]], None] | None = None
        self._summaries: dict[tuple[str, str], SummaryBuilder] = {}
        #: Summaries held at most while writes fail; the next write moves them to a file.
        self.max_summaries = max(10, max_buffered // 100)
        #: Summaries moved out of memory, oldest first (a run's newer one is later, or in
        #: ``_summaries``).
        self._summary_spill = SpillFile(SUMMARIES)
        #: Summaries read back from that file, carried by every write until one stores them.
        self._summary_chunk: list[dict[str, Any]] = []
        self._write: _Write | None = None
        #: The loop whose guard knows this buffer (the latest one), weakly.
        self._guarded: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._in_background = False  # the latest write went to the background loop
        self._failures = _FailedWrites()
        #: The loop a timed retry waits on (one at a time, while that loop lives).
        self._retry_loop: asyncio.AbstractEventLoop | None = None
        #: The ticket when the journal was closed: no timed retry while nothing is new.
        self._closed_ticket: int | None = None
        #: What the running write took and has not stored yet (saved at exit if it hangs):
        #: its batches to send, the one being sent, and the summaries it carries.
        self._in_flight: collections.deque[_Batch] | None = None
        self._sending: _Batch | None = None
        self._in_flight_summaries: list[_Summary] = []
        self._next_write_at = threshold  # after a failed write: the next multiple of the threshold
        self._write_all = False
        self._close_when_empty = False
        #: Set once the program's exit saved what was unwritten to a file: nothing writes then.
        self._saved = False
        # Every event and summary queued takes the next ticket; a write takes all that is
        # pending, so once it is stored, every ticket up to the last it took is written.
        self._ticket = 0
        self._written_ticket = 0

    # -- memory only -----------------------------------------------------------------------

    def add(self, event: dict[str, Any]) -> bool:
        """Append an event; True when a write should start (threshold reached, none running).

        After a failed write the next one waits for the next multiple of the threshold (or a
        flush or ``write_pending``), so a store that is down is not sent the whole buffer on
        every event.
        """
        self._lock.acquire()  # not `with`: half the cost on CPython 3.11, on every event
        try:
            self._ticket += 1
            events = self._events
            held = len(events)
            if held < self._room:  # no room while anything is spilled: order holds
                events.append(event)
                return held >= self._next_write_at - 1 and self._write is None
            self._spill_locked(event)
            return self._waiting_locked() >= self._next_write_at and self._write is None
        finally:
            self._lock.release()

    def _spill_locked(self, event: dict[str, Any]) -> None:
        self._room = 0
        opening = self._spill.path is None
        try:
            self._spill.append(_timestamped(event))
        except MemoryError:
            raise
        except Exception as exc:  # unencodable, or the disk refused it: dropped by the next write
            self._unspillable.append((event, exc))
        if opening and self._spill.path is not None:
            _STRANDED.add(self)
            logger.warning(
                "journal holds %d events in memory, its bound, that its store has not taken "
                "yet: the next ones go to %s until it does",
                self._memory_locked(),
                self._spill.path,
            )

    def _memory_locked(self) -> int:
        """Events held in memory: pending, being written, or to be retried."""
        unsure = 0 if self._unsure is None else len(self._unsure.events)
        return len(self._events) + self._taken + unsure

    def _set_room_locked(self) -> None:
        """Recount ``_room`` after events were taken by a write or given back (none while
        events are spilled: new ones go after them)."""
        held = self._memory_locked() - len(self._events)
        self._room = 0 if self._spill.count else self.max_buffered - held

    def _waiting_locked(self) -> int:
        """Events waiting for a write to take them."""
        return len(self._events) + self._spill.count

    def put_summary(self, key: tuple[str, str], build: SummaryBuilder) -> None:
        """Queue the summary of run ``key`` (thread id, run id), built when it is written.

        Called with the journal's lock held. A write that hangs starts no other, and only a
        write moves summaries out of memory: past twice their bound while one is in flight,
        they are built and moved out here.
        """
        self._lock.acquire()  # not `with`: half the cost on CPython 3.11, twice a run
        try:
            summaries = self._summaries
            summaries.pop(key, None)
            summaries[key] = build
            self._ticket += 1
            if self._write is not None and len(summaries) > 2 * self.max_summaries:
                self._shed_locked([(k, b, b(locked=True)) for k, b in summaries.items()])
        finally:
            self._lock.release()

    def close_store_when_empty(self) -> None:
        """Close the store after the write that leaves nothing pending (it reopens on use)."""
        with self._lock:
            self._close_when_empty = True

    # -- background writes -----------------------------------------------------------------

    def start_write(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start a background write on ``loop`` unless one is running or nothing is pending."""
        with self._lock:
            self._start_locked(loop)

    def write_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write everything pending now in the background (after the write in flight, if any)."""
        with self._lock:
            self._write_all = True
            self._start_locked(loop)

    def _pending_locked(self) -> bool:
        pending = self._events or self._summaries or self._unsure or self._unspillable
        return bool(pending or self._spill.count or self._spilled_summaries_locked())

    def _spilled_summaries_locked(self) -> int:
        """Summaries out of memory, to be written before those in it."""
        return self._summary_spill.count + len(self._summary_chunk)

    def _start_locked(self, loop: asyncio.AbstractEventLoop) -> _Write | None:
        caller = running_loop()
        in_background = is_background_loop(loop)
        if caller is not None and (loop is caller or in_background):
            # Whether a write starts now or runs already (started from a worker thread, say),
            # on this loop or on the journal's own (its own store's), this loop writes what
            # is pending before it closes. Writes to another loop are left to that loop: it
            # may be blocked waiting for this one.
            self._guard_locked(caller)
        self._drop_dead_locked()
        if self._write is not None or self._saved or not self._pending_locked():
            return None
        write = _Write(loop)
        coro = write.job = self._job(write)
        try:
            if loop is caller:
                write.future = loop.create_task(coro)
            else:
                write.future = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed: keep everything for the next writer
            coro.close()
            logger.warning("journal write skipped: its event loop is closed")
            return None
        self._in_background = in_background
        _STRANDED.add(self)  # until a write leaves nothing pending: saved at exit meanwhile
        self._write = write
        write.future.add_done_callback(lambda done: self._finished(write, done))
        return write

    def _drop_dead_locked(self) -> None:
        """Forget a write whose loop closed (``is_dead``: ``loop.close()`` after
        ``run_until_complete``, with no ``asyncio.run`` to cancel it). One that ended, its done
        callback never run, is accounted for as that would have. One that did not is
        abandoned, and what it took put back: the batch it was sending may be stored, so it
        goes first, under its id."""
        write = self._write
        if write is None or not write.is_dead():
            return
        if write.future.done():
            future = write.future
            cancelled = future.cancelled()
            error = None if cancelled else future.exception()
            unwritten = self._settle_locked(write, cancelled, error, start=False)
            if unwritten is None:
                return
            self._write_all = True  # nothing retries on that loop: the next write takes all
            if error is not None:
                self._failures.failed(error, unwritten)
            elif not cancelled:
                self._failures.succeeded()
            return
        write.abandoned = True
        self._write = None
        # Summaries read back from their file stay there: they go with the retry anyway.
        summaries = [item for item in self._in_flight_summaries if item[1] is not _spilled_summary]
        # The job touches none of them again (its cleanup sees it abandoned).
        self._requeue_locked(self._sending or _Batch([]), self._in_flight or (), summaries, False)
        self._write_all = True
        logger.warning("journal write ended with its event loop; its events are written next")
        if write.loop.is_closed() and write.job is not None:
            # Never to run again: ended now, not when collected, where a store's cleanup that
            # awaits in its `finally` blocks would be reported as an exception ignored; off
            # this lock (those blocks may take it), on a thread with no loop to schedule on.
            with contextlib.suppress(RuntimeError):  # the interpreter is exiting
                threading.Thread(
                    target=_end_quietly,
                    args=(write.job, write.future),
                    name="deerflow-journal-dead-write",
                    daemon=True,
                ).start()

    # -- the end of a caller's loop --------------------------------------------------------

    def _guard_locked(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make sure ``loop`` (running in this thread) writes what is pending before it closes."""
        guarded = self._guarded
        if guarded is not None and guarded() is loop:  # every write of a run: once is enough
            return
        with _GUARDS_LOCK:
            buffers = _LOOP_GUARDS.get(loop)
        if buffers is None:
            if on_background_loop():
                return
            buffers = _guard(loop)
        buffers.add(self)
        self._guarded = weakref.ref(loop)

    async def _write_before_loop_closes(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._pending_locked() and self._write is None:
                return
            # Written where the writes went (the journal's own store has a loop of its own).
            target = background_loop() if self._in_background else loop
        try:
            await asyncio.wait_for(self.flush(target), self.wait_timeout)
        except BaseException as exc:  # the loop is closing: say what is lost, do not raise
            with self._lock:
                write = self._write
            if write is not None and write.loop is loop and not write.future.done():
                write.future.cancel()  # it puts its batch back, to be counted and kept
                await asyncio.wait([write.future])
            with self._lock:
                events = self._unwritten_locked()
                runs = sorted({str(event.get("run_id")) for event in events})
                count, spilled = len(events), self._spilled_locked()
                summaries = len(self._summaries) + self._spilled_summaries_locked()
            logger.error(
                "journal could not write %d events of runs %s%s and %d run summaries before "
                "its event loop closed (%r): call `await journal.flush()` before the "
                "program's asyncio.run() returns",
                count,
                some_names(runs, "run"),
                spilled,
                summaries,
                exc,
            )

    # -- writing -----------------------------------------------------------------------------

    async def _job(self, write: _Write) -> None:
        # The summaries are built before the events are taken, so that none tells of an event
        # this write does not carry (a run's success, before the batch holding its run.end).
        # Builders take the journal's lock, which is taken before ours: built without ours.
        with self._lock:
            # Past their bound while writes fail, the summaries are built to leave memory.
            shed = len(self._summaries) > self.max_summaries and bool(
                self._spill.count or self._failures.count
            )
            wait = self._spill.count or self._spilled_summaries_locked()
            building = list(self._summaries.items()) if shed or not wait else []
            built_ticket = self._ticket
        built = [(key, build, build()) for key, build in building]
        if shed:
            self._shed(built)
            built = []
        with self._lock:
            # A batch that may have been stored goes first, under its id (a store that took
            # it skips it), then what is pending.
            unsure = self._unsure
            queue = collections.deque([] if unsure is None else [unsure])
            self._unsure = None
            events = self._events
            self._events = []
            backlog = bool(self._spill.count)
            if backlog and unsure is None:
                # Spilled events follow those in memory: the oldest come back to be written
                # (not while a failed write waits for its retry: the store may still be down).
                room = min(_MAX_BATCH, self.max_buffered) - len(events)
                if room > 0:
                    events.extend(self._spill.read(room))
                    backlog = bool(self._spill.count)
            queue.append(_Batch(events))
            self._in_flight = queue
            self._taken = len(events) + (0 if unsure is None else len(unsure.events))
            self._room = 0 if backlog else self.max_buffered - self._taken
            unspillable = self._unspillable
            if unspillable:
                self._unspillable = []
            # While events are spilled, the summaries (and closing the store) wait for them.
            # Those moved to a file go first, those in memory (newer) once it is empty; a
            # summary queued again since it was built waits for the next write.
            summaries: list[_Summary] = []
            from_file = not backlog and bool(self._spilled_summaries_locked())
            if from_file:
                summaries = [
                    (key, _spilled_summary, data) for key, data in self._read_summaries_locked()
                ]
            elif not backlog:
                pending = self._summaries
                summaries = [item for item in built if pending.get(item[0]) is item[1]]
                for key, _, _ in summaries:
                    del pending[key]
            everything = not backlog and not self._summaries and not self._summary_spill.count
            close_after = self._close_when_empty and everything
            if everything:
                self._close_when_empty = False
                self._write_all = False  # this write takes everything write_pending asked for
            # Summaries not built for this write (held back while events were spilled, or
            # shed to a file that refused them) are older than built_ticket: not written yet.
            held_back = not backlog and not from_file and bool(self._summaries) and not built
            if held_back:
                self._write_all = True  # they go with the next write
            taken = (
                None
                if backlog or from_file or held_back
                else self._ticket
                if everything
                else built_ticket
            )
            self._in_flight_summaries = summaries
        for event, error in unspillable:
            self._dropped([event], error, _why_unspillable(error))
        summaries_written = False
        while queue:
            if self._saved:  # the exit saved what the queue holds: sending it would repeat it
                break
            batch = self._sending = queue[0]  # held before it leaves the queue: never in neither
            queue.popleft()
            if len(batch.events) > _MAX_BATCH and not batch.sent:  # a backlog: in parts
                queue.appendleft(_Batch(batch.events[_MAX_BATCH:]))
                batch.events = batch.events[:_MAX_BATCH]
            last = not queue
            # The summaries go with the last events; a retried batch carries what it carried
            # before (a refused summary writes nothing of its batch); an upsert may repeat.
            carried = summaries if last and not batch.sent else []
            if not batch.events and not batch.summaries and (not carried or summaries_written):
                continue
            batch.sent = True
            self._sending = batch  # a backlog's first part
            try:
                written = await self._send(batch, carried)
                self._sending = None
                if carried:
                    self._in_flight_summaries = []
                summaries_written = summaries_written or (written and bool(carried))
            except BaseException as exc:
                if write.abandoned:  # closed with its dead loop: what it took is queued again
                    raise
                instead = self._refused(batch, carried or batch.summaries or [], exc)
                if instead is None:
                    # A write that failed, or was cancelled with its loop, may or may not
                    # have reached the store: it is retried first, under its id. Summaries
                    # read back from their file stay in ``_summary_chunk`` for the retry,
                    # but for those a put_run_summary took or refused (``_send`` takes them
                    # out of the batch): those are not sent again.
                    if carried and batch.summaries is not None:
                        left = {id(data) for data in batch.summaries}
                        if from_file:
                            self._forget_read_summaries(
                                {key for key, _, data in summaries if id(data) not in left}
                            )
                        summaries = [item for item in summaries if id(item[2]) in left]
                    with self._lock:
                        kept = [] if from_file else summaries
                        self._requeue_locked(batch, queue, kept, close_after)
                    raise
                if last and not instead and batch.events:
                    instead = [_Batch([])]  # the summaries still go
                elif last and not batch.events:
                    summaries = []
                queue.extendleft(reversed(instead))
                self._sending = None  # what it held is in the queue again (or dropped)
        try:
            if close_after and not write.abandoned:
                await self.store._release()  # the journal's own store: reopens on use
        finally:  # written: a blocked invoke may return, once the store it opened is closed
            with self._lock:
                if not write.abandoned:  # else the state is a later write's
                    if from_file:
                        self._summary_chunk = []
                    self._taken = 0
                    self._in_flight, self._sending, self._in_flight_summaries = None, None, []
                    self._set_room_locked()
                    if taken is not None:
                        self._written_ticket = max(self._written_ticket, taken)

    def _shed(self, built: list[_Summary]) -> None:
        """Move the summaries built, unless queued again since, from memory to their file."""
        with self._lock:
            self._shed_locked(built)

    def _shed_locked(self, built: list[_Summary]) -> None:
        pending = self._summaries
        opening = self._summary_spill.path is None
        for key, build, data in built:
            if pending.get(key) is not build:
                continue
            try:
                self._summary_spill.append(data)
            except MemoryError:
                raise
            except Exception as exc:  # a full disk, say: they stay in memory
                logger.warning("journal cannot move run summaries out of memory: %r", exc)
                break
            del pending[key]
        if opening and self._summary_spill.path is not None:
            _STRANDED.add(self)

    def _forget_read_summaries(self, taken: set[tuple[str, str]]) -> None:
        """Drop from the summaries read back from their file those of the runs in ``taken``
        (thread id, run id), which the store took: the retry sends the others."""
        if taken:
            with self._lock:
                self._summary_chunk = [
                    data
                    for data in self._summary_chunk
                    if (data["thread_id"], data["run_id"]) not in taken
                ]

    def _read_summaries_locked(self) -> list[tuple[tuple[str, str], dict[str, Any]]]:
        """The summaries read back from their file to write now, the latest of each run;
        none of a run with a summary in memory, which is newer."""
        if not self._summary_chunk and self._summary_spill.count:
            self._summary_chunk = self._summary_spill.read(self.max_summaries)
        latest = {(data["thread_id"], data["run_id"]): data for data in self._summary_chunk}
        pending = self._summaries
        return [(key, data) for key, data in latest.items() if key not in pending]

    def _refused(
        self, batch: _Batch, summaries: Sequence[object], error: BaseException
    ) -> list[_Batch] | None:
        """What to write instead of ``batch`` if ``error`` says its store refused it (nothing
        of it is stored then); ``None`` for any other failure.

        Events whose own normalisation fails are dropped at once; otherwise an
        ``EventRefused`` batch is split (its summaries from its events first) until each
        refused event, or the refused summaries, are found alone, and dropped.
        """
        if not isinstance(error, ValueError | TypeError):
            return None
        unstorable, cut = self._unstorable(batch.events)
        if unstorable:
            self._dropped([batch.events[i] for i in unstorable], error)
            return [_Batch([e for i, e in enumerate(batch.events) if i not in unstorable])]
        if cut:
            return [_Batch(batch.events)]
        if not isinstance(error, EventRefused):
            return None
        if summaries and batch.events:  # the events, or the summaries?
            return [_Batch(batch.events), _Batch([])]
        if len(batch.events) > 1:
            half = len(batch.events) // 2
            return [_Batch(batch.events[:half]), _Batch(batch.events[half:])]
        if batch.events:
            self._dropped(batch.events, error)
        elif summaries:
            logger.error(
                "journal dropped %d run summaries its store refused: %s", len(summaries), error
            )
        return []

    async def _send(self, batch: _Batch, summaries: list[_Summary]) -> bool:
        """Write the batch's events and then the summaries; False if the store had them.

        Our own stores take both in one transaction under the batch's id, unless a subclass
        overrides one of the public methods: it then sees every write, as any other store
        does. There, events a ``put_batch`` took leave the batch, and so does each summary
        ``put_run_summary`` took or refused (``EventRefused``: dropped alone, logged at ERROR,
        and the next ones still go): a retry sends only what is left.
        """
        if batch.summaries is None:
            batch.summaries = [data for _, _, data in summaries]
        built = batch.summaries
        if self._journal_batches:  # which turns our time.time() floats into timestamps
            return await self.store._put_journal_batch(
                batch.events, built, MessageEncoder(), batch.batch_id
            )
        events = [_timestamped(event) for event in batch.events]
        if events:
            dumps = MessageEncoder()
            await self.store.put_batch([_plain_event(event, dumps) for event in events])
            batch.events.clear()
        done = 0
        try:
            for summary in built:
                try:
                    await self.store.put_run_summary(RunSummary.model_validate(summary))
                except EventRefused as exc:
                    # This summary alone: those before it are stored, those after it go next.
                    logger.error(
                        "journal dropped the run summary of thread %s run %s its store refused: %s",
                        summary["thread_id"],
                        summary["run_id"],
                        exc,
                    )
                done += 1
        finally:
            del built[:done]
        return True

    def _unstorable(self, events: list[dict[str, Any]]) -> tuple[set[int], bool]:
        """The indexes of the events that cannot be stored by themselves, and whether some
        were replaced by a copy whose content is cut to fit (in ``events``)."""
        bad, cut = set(), False
        for index, event in enumerate(events):
            try:
                self._normalise(event)
            except (ValueError, TypeError):
                fitted = _fitted(event)
                if fitted is None:
                    bad.add(index)
                    continue
                try:
                    self._normalise(fitted)
                except (ValueError, TypeError):
                    bad.add(index)
                    continue
                logger.warning(
                    "journal cut the content of a %s event of run %s to fit its store: %d "
                    "bytes of JSON, over the %d characters every store holds",
                    event.get("event_type"),
                    event.get("run_id"),
                    fitted["metadata"]["original_byte_length"],
                    JSON_MAX_LENGTH,
                )
                events[index], cut = fitted, True
        return bad, cut

    def _normalise(self, event: dict[str, Any]) -> None:
        """Normalise ``event`` as the store would; raise as it would refuse it."""
        normalise_event(
            _timestamped(event),
            max_trace_content=getattr(self.store, "max_trace_content", DEFAULT_MAX_TRACE_CONTENT),
            max_outputs_content=getattr(
                self.store, "max_outputs_content", DEFAULT_MAX_OUTPUTS_CONTENT
            ),
            default=MessageEncoder(),
        )

    def _dropped(
        self,
        events: list[dict[str, Any]],
        error: BaseException,
        why: str = "its store can never store",
    ) -> None:
        for event in events:
            logger.error(
                "journal dropped a %s event of run %s %s: %s",
                event.get("event_type"),
                event.get("run_id"),
                why,
                error,
            )
        if self.on_dropped is not None:
            self.on_dropped(events)  # their runs' summaries change: written next
        with self._lock:
            self._write_all = True

    def _requeue_locked(
        self,
        batch: _Batch,
        later: Iterable[_Batch],
        summaries: list[_Summary],
        close_after: bool,
    ) -> None:
        # Put back in front, in order; the first list is reused (a backlog is long).
        parts = [part.events for part in later if part.events]
        if parts:
            front = parts[0]
            for part in parts[1:]:
                front.extend(part)
            front.extend(self._events)
            self._events = front
        self._taken = 0
        self._in_flight, self._sending, self._in_flight_summaries = None, None, []
        if batch.events:
            self._unsure = batch
        self._set_room_locked()
        newer = self._summaries
        self._summaries = {key: build for key, build, _ in summaries}
        self._summaries.update(newer)
        self._close_when_empty = self._close_when_empty or close_after

    def _finished(self, write: _Write, future: Any) -> None:
        cancelled = future.cancelled()
        error = None if cancelled else future.exception()
        with self._lock:
            unwritten = self._settle_locked(write, cancelled, error, start=True)
        if unwritten is None:  # accounted for already
            return
        if cancelled:
            guarded = self._guarded
            if guarded is not None and guarded() is write.loop:
                # Its loop is closing (asyncio.run cancels every task): the loop's guard
                # writes them next, or says at ERROR what it could not.
                logger.debug("journal write cancelled; its loop's guard writes its events")
            else:
                logger.warning("journal write cancelled; its events stay buffered")
        if error is not None:
            self._failures.failed(error, unwritten)
            self._time_retry(write.loop)
        elif not cancelled:
            self._failures.succeeded()

    def _settle_locked(
        self, write: _Write, cancelled: bool, error: BaseException | None, *, start: bool
    ) -> int | None:
        """Account for the end of ``write`` (once: ``None`` if it was already), starting the
        next write on its loop if ``start``; the events it left unwritten, if it failed."""
        if write.settled or write.abandoned:
            return None
        write.settled = True
        unwritten = 0
        if self._write is write:
            self._write = None
        if cancelled or error is not None:
            waiting = self._waiting_locked()
            self._next_write_at = (waiting // self.threshold + 1) * self.threshold
            unwritten = self._memory_locked() + self._spill.count
            _STRANDED.add(self)
        else:
            self._next_write_at = self.threshold
            if start and (
                self._write_all
                or self._spill.count
                or self._spilled_summaries_locked()
                or len(self._events) >= self.threshold
            ):
                self._start_locked(write.loop)
            if self._write is None and not self._pending_locked():
                _STRANDED.discard(self)
        return unwritten

    def _time_retry(self, loop: asyncio.AbstractEventLoop) -> None:
        """Retry on ``loop`` after a while, so that what a failed write left reaches the store
        once it is back, although nothing else writes (the last run ended, a server idles)."""
        with self._lock:
            waiting = self._retry_loop
            if waiting is loop and not loop.is_closed():
                return
            self._retry_loop = loop
            delay = self._failures.retry_delay()
        owner = weakref.ref(self)  # a stranded buffer is held by _STRANDED meanwhile

        def retry() -> None:
            buffer = owner()
            if buffer is not None:
                buffer._retry(loop)

        try:
            if running_loop() is loop:
                loop.call_later(delay, retry)
            else:
                loop.call_soon_threadsafe(loop.call_later, delay, retry)
        except RuntimeError:  # its loop is closed: the next write or flush retries
            with self._lock:
                if self._retry_loop is loop:
                    self._retry_loop = None

    def _retry(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._retry_loop is loop:
                self._retry_loop = None
            # Not once a write has worked meanwhile, nor for a closed journal with nothing
            # new (what it holds is saved at exit: its owner may have closed the store).
            if self._failures.count and self._closed_ticket != self._ticket:
                self._start_locked(loop)

    def closed(self) -> None:
        """Note that the journal was closed: no timed retry until something new is queued."""
        with self._lock:
            self._closed_ticket = self._ticket

    # -- waiting -----------------------------------------------------------------------------

    def _next_locked(self, loop: asyncio.AbstractEventLoop) -> tuple[_Write | None, bool]:
        """Return (write to wait for, whether we started it); (None, False) when all is done."""
        self._drop_dead_locked()
        if self._write is not None:
            return self._write, False
        return self._start_locked(loop), True

    async def flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Write everything pending (on ``loop``); raise if the store fails.

        A write it did not start that failed is looked at again every 50 ms while it stays
        the journal's write (its loop has yet to run its end), at most ``wait_timeout``
        seconds: then what it raised is raised. A write on another thread's loop that stays
        stopped ``wait_timeout`` seconds raises ``LoopStopped`` (the events stay buffered)."""
        deadline = None
        failed: _Write | None = None
        while True:
            with self._lock:
                write, ours = self._next_locked(loop)
            if write is None:
                return
            if write is failed:  # its end is not accounted for yet: no busy loop meanwhile
                await asyncio.sleep(_LOOK_EVERY)
            try:
                await write.wait(self.wait_timeout)
            except BaseException as exc:
                task = asyncio.current_task()
                if ours or (task is not None and task.cancelling()) or isinstance(exc, LoopStopped):
                    raise  # our own write failed, this flush is being cancelled, or its loop
                    # stopped: what it waits for may never run
                failed = write
                if deadline is None:
                    deadline = time.monotonic() + self.wait_timeout
                elif time.monotonic() > deadline:
                    raise

    def flush_blocking(
        self,
        pick_loop: Callable[[], asyncio.AbstractEventLoop],
        timeout: float,
        *,
        closing: bool = False,
    ) -> bool:
        """Write what is pending now, blocking this thread; raise if the store fails.

        What other runs queue meanwhile is not waited for. ``pick_loop`` names a loop that is
        not blocked by this thread. A write already running on this thread's own loop cannot
        be waited for here: it finishes in the background, and what it leaves goes out right
        after it (with the next write, if it fails); ``closing`` (the caller is about to say
        everything is written) says so in a WARNING. Gives up after ``timeout`` seconds (a
        hung store, a stopped loop): logs at ERROR what is not written, leaves it to go out
        once the store answers, returns False.
        """
        if sys.is_finalizing():  # no other thread runs again: waiting would never end
            return False
        current = running_loop()
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._ticket
        ended: asyncio.AbstractEventLoop | None = None  # a loop that cancelled a write
        failed: _Write | None = None  # a write we did not start that raised
        while True:
            with self._lock:
                if self._written_ticket >= target:
                    return True
                loop = pick_loop()
                write, ours = self._next_locked(background_loop() if loop is ended else loop)
                if write is not None and write.loop is current:
                    self._write_all = True
                    if closing:
                        # Raising would replace what a `with` block raises (a cancellation
                        # too), and a notebook cell's store stays open for the write to end.
                        logger.warning(
                            "journal.close() returns before its write on this thread's event "
                            "loop ends (it cannot wait for it there; the loop ends it): use "
                            "`await journal.aclose()` or `async with RunJournal(...)` in async "
                            "code and notebooks, and close the store only after that"
                        )
                    return True
            if write is None:
                return True
            try:
                if not write.wait_blocking(max(0.0, deadline - time.monotonic())):
                    with self._lock:
                        self._write_all = True
                    self._log_unwritten(timeout)
                    return False
            except _CANCELLED:
                # Another thread's loop ending (asyncio.run cancels every task) cancelled it,
                # and it put back what it took: written again on the journal's own loop.
                ended = write.loop
            except BaseException:
                if ours:
                    raise
                if write is failed:  # its end is not accounted for yet: no busy loop
                    if time.monotonic() > deadline:
                        self._log_unwritten(timeout)
                        return False
                    time.sleep(_LOOK_EVERY)
                failed = write

    def _unwritten_locked(self) -> list[dict[str, Any]]:
        unsure = [] if self._unsure is None else self._unsure.events
        return unsure + self._events

    def save_at_exit(self, deadline: float | None = None) -> None:
        """Save every event not written to a file (those in memory first), say at ERROR where
        it is, and write nothing more: the program exits. A write running on another thread's
        loop is waited for until ``deadline`` (``time.monotonic()``; ``None``: not at all)."""
        write = self._write
        if (
            deadline is not None
            and write is not None
            and not write.future.done()
            and write.loop.is_running()
        ):
            # A write (a timed retry, say) may end: then what it took is stored, or back in
            # memory to be saved.
            with contextlib.suppress(BaseException):
                write.wait_blocking(max(0.0, deadline - time.monotonic()))
        # A daemon thread may hold a lock for good at exit: then read racily, and a summary
        # whose run is locked is lost. Built first: builders take the journal's lock first.
        locked = self._lock.acquire(timeout=1.0)
        building = list(self._summaries.items())
        if locked:
            self._lock.release()
        built = []
        for _, build in building:
            with contextlib.suppress(Exception):
                built.append(build(timeout=1.0))
        locked = self._lock.acquire(timeout=1.0)
        try:
            # What a write still running took goes first (it is older), and may be stored.
            sending = [] if self._sending is None else list(self._sending.events)
            queued = [event for batch in list(self._in_flight or ()) for event in batch.events]
            unsure = sending + queued + ([] if self._unsure is None else self._unsure.events)
            unwritten = unsure + self._events
            summaries = len(building) - len(built)
            # Those a write carries, unless newer are pending or they came from their file
            # (kept there).
            pending = {key for key, _ in building}
            built += [
                data
                for key, build, data in self._in_flight_summaries
                if key not in pending and build is not _spilled_summary
            ]
            try:
                saved = self._spill.save(_timestamped(event) for event in unwritten)
            except Exception as exc:  # the disk is full, say: what is lost is said
                saved, error, spilled = None, exc, self._spilled_locked()
            else:
                error, spilled = None, ""
                # Saved: a write the loop may still start must not store them twice.
                self._saved, self._unsure, self._events = True, None, []
                self._in_flight, self._sending, self._in_flight_summaries = None, None, []
            summaries_note = self._save_summaries_locked(built)
        finally:
            if locked:
                self._lock.release()
        notes = [] if summaries_note is None else [summaries_note]
        if unsure:
            notes.append(
                f"the first {len(unsure)} were in a write that failed or did not end, which "
                "may have stored them"
            )
        if summaries:
            notes.append(f"{summaries} run summaries are lost")
        if saved is not None and saved[0] is None:  # none could be encoded
            failed = saved[2]
            logger.error(
                "journal exits with %d events its store did not take, lost: none could be "
                "encoded (%r)%s",
                len(failed),
                failed[0][1],
                "".join(f"; {note}" for note in notes),
            )
        elif saved is not None:
            path, count, failed = saved
            if failed:
                notes.append(f"{len(failed)} could not be encoded, lost: {failed[0][1]!r}")
            logger.error(
                "journal exits with %d events its store did not take, kept in %s (one event a "
                "line, as `store.put_batch` takes them)%s",
                count,
                path,
                "".join(f"; {note}" for note in notes),
            )
        elif error is not None:
            logger.error(
                "journal exits with %d events its store did not take in memory, lost: they "
                "could not be saved (%r)%s%s",
                len(unwritten),
                error,
                spilled,
                "".join(f"; {note}" for note in notes),
            )
        elif notes:
            logger.error("journal exits with its store not answering: %s", "; ".join(notes))

    def _save_summaries_locked(self, built: list[dict[str, Any]]) -> str | None:
        """Leave the summaries moved out of memory in their file for good, with ``built``
        (those held in memory, newer) after them; what to say of them."""
        try:
            saved = self._summary_spill.save(self._summary_chunk, built)
        except Exception as exc:  # the disk is full, say
            lost = self._spilled_summaries_locked() + len(built)
            return f"{lost} run summaries are lost: {exc!r}"
        if saved is None or saved[0] is None:
            return None
        self._summary_chunk = []
        return (
            f"{saved[1]} run summaries are kept in {saved[0]} (one a line: write each, in "
            "order, with `store.put_run_summary(RunSummary.model_validate_json(line))`)"
        )

    def _spilled_locked(self) -> str:
        """What the spill file holds, said after the events in memory (empty if nothing)."""
        if not self._spill.count:
            return ""
        return f" (and {self._spill.count} more kept in {self._spill.path})"

    def _log_unwritten(self, timeout: float) -> None:
        with self._lock:
            events, spilled = len(self._unwritten_locked()), self._spilled_locked()
            summaries = len(self._summaries) + self._spilled_summaries_locked()
        logger.error(
            "journal gave up after %.1f s waiting for its store: a write is still in flight; "
            "%d more events%s and %d run summaries are not written",
            timeout,
            events,
            spilled,
            summaries,
        )
