"""``RunEventStore``: the store contract every backend implements.

Invariants every backend keeps (the shared store suite in ``tests/`` checks each of them):

- ``seq`` is assigned by the store, strictly increasing within a thread and never reused, even
  after deletes; threads are independent of each other.
- Writes are normalised once, here, before a backend sees them (``records.normalise_batch``;
  a journal's batches ``records.normalise_journal_batch``, which stores the same), so the
  same writes read back identically from every backend.
- ``put_batch`` is atomic: every event lands, with seq in input order, or none does.
- Message projections return only ``category == "message"`` rows, in ascending seq.
- Filters (event types, task id, user) apply before ``limit``.
- Returned records are fresh copies: mutating one never changes what is stored.
- A read scoped to a user returns only rows stamped with exactly that user; ``put_if_absent``
  only counts events of the same user, and a run summary is never overwritten by another user.
- A write that has started finishes even if its caller is cancelled.
- A store opened ``read_only`` refuses every write and delete with ``ReadOnlyStoreError``
  before it touches storage, and its setup creates and migrates nothing.
- ``list_threads`` and the paged ``list_run_summaries`` are keyset pages over a total order
  (time, then ids, descending), answered from indexes the writes keep, never by reading events
  (JSONL: one state file per thread); deletes show in them at once.
- A SQL backend's schema is migrated by ``Schema.upgrade``, the same way on each: a database
  whose schema is newer than the code is refused, and a read-only store never migrates.

Backends implement the underscored hooks and receive only explicit, validated values.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

import orjson

from deerflow_journal.catalog import (
    LEGACY_EVENT_ALIASES,
    LLM_AI_RESPONSE_EVENT,
    RUN_EVENT_TYPE_MAX_LENGTH,
)
from deerflow_journal.records import (
    AUTO,
    DEFAULT_MAX_OUTPUTS_CONTENT,
    DEFAULT_MAX_TRACE_CONTENT,
    Auto,
    PendingEvent,
    RunEvent,
    check_max_outputs_content,
    check_max_trace_content,
    check_text,
    current_user_id,
    decode_json,
    encode_json,
    normalise_batch,
    normalise_created_at,
    normalise_event,
    normalise_journal_batch,
    resolve_read_user,
)
from deerflow_journal.stores.browsing import SummaryQuery, ThreadInfo, ThreadQuery
from deerflow_journal.summary import RUN_STATUSES, RunStatus, RunSummary

__all__ = [
    "AI_RESPONSE_EVENT_TYPES",
    "JournalStore",
    "MessagePage",
    "ReadOnlyStoreError",
    "RunEventStore",
    "ThreadInfo",
]

T = TypeVar("T")
R = TypeVar("R")

#: Event types the last-visible-AI query recognises (the canonical name and its legacy alias).
AI_RESPONSE_EVENT_TYPES = (LLM_AI_RESPONSE_EVENT.event_type, *LEGACY_EVENT_ALIASES)


class ReadOnlyStoreError(PermissionError):
    """A write or delete on a store opened ``read_only``: open it writable to change it."""


class MessagePage:
    """Paging arguments of a message query, validated once for every backend."""

    __slots__ = ("after_seq", "before_seq", "limit")

    def __init__(self, limit: int, before_seq: int | None, after_seq: int | None) -> None:
        self.limit = _check_count(limit, "limit")
        self.before_seq = None if before_seq is None else _check_count(before_seq, "before_seq")
        self.after_seq = None if after_seq is None else _check_count(after_seq, "after_seq")

    @property
    def from_end(self) -> bool:
        """True when the page is the last ``limit`` rows of the range, not the first."""
        return self.after_seq is None


_MAX_COUNT = 2**63 - 1  # the largest integer every backend can bind


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return min(value, _MAX_COUNT)


def _check_thread(thread_id: object) -> str:
    return check_text(thread_id, "thread_id")


def _check_run(run_id: object) -> str:
    return check_text(run_id, "run_id")


async def _shielded(write: Awaitable[T]) -> T:
    """Await a write; if the caller is cancelled meanwhile, let the write finish first.

    Backends cannot all abandon a write half way (a statement already handed to a driver
    thread completes anyway), so a cancelled caller waits for the outcome and then sees its
    ``CancelledError``: what the store holds is never in doubt, and a retry after a
    cancellation may find the write already done.
    """
    task = asyncio.ensure_future(write)  # a future stays itself: no task
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if not task.done():
            with contextlib.suppress(BaseException):
                await task
        raise


#: A SQL statement and its parameters, for a backend to run.
Statement = tuple[str, Sequence[Any]]
#: SQL statements a backend runs one after another, sending each the rows it returned (a
#: backend may answer SQL of its own kind otherwise); what the generator returns is their
#: result.
Statements = Generator[Statement, list[Any], T]


async def run_statements(
    statements: Statements[T], execute: Callable[[str, Sequence[Any]], Awaitable[list[Any]]]
) -> T:
    """Run ``statements`` through ``execute``, which returns a statement's rows; their result."""
    try:
        statement = next(statements)
        while True:
            statement = statements.send(await execute(*statement))
    except StopIteration as done:
        return done.value


@dataclass(frozen=True)
class Schema:
    """A SQL backend's schema: its migrations, and the SQL that finds, reads and records its
    version in the backend's dialect. ``upgrade`` is the one migration runner of every backend.

    ``migrations[v]`` holds the statements that make version ``v``; append new ones, never edit
    one that has shipped.
    """

    migrations: Sequence[Sequence[str]]
    #: Returns a row when the table of recorded versions exists.
    find_table: str
    #: Creates that table unless it exists.
    create_table: str
    #: Returns one row: the highest version recorded (NULL if none).
    read_version: str
    #: Records the version given as its one parameter.
    record_version: str

    @property
    def version(self) -> int:
        """The schema version this code reads and writes."""
        return len(self.migrations) - 1

    async def upgrade(
        self,
        run: Callable[[Callable[[], Statements[Any]]], Awaitable[Any]],
        run_migrating: Callable[[Callable[[], Statements[Any]]], Awaitable[Any]],
        *,
        read_only: bool,
        database: str,
    ) -> None:
        """Bring ``database`` (named so in errors) to this version, the same way on every backend.

        ``run`` runs the statements a function makes as they come; ``run_migrating`` runs them
        in one transaction holding the backend's migration lock, so concurrent setups migrate
        once. Either may call the function again to start over (after a lost connection). A
        current schema costs one read, with no lock and no DDL (a role that may only read can
        set up). A newer schema is refused, since this code could misread it; a read-only store
        never migrates, and refuses a missing or older schema.
        """
        found = await run(self._recorded_version)
        if found == self.version:
            return
        self._check(found, read_only=read_only, database=database)
        await run_migrating(functools.partial(self._migrate, database))

    def _recorded_version(self) -> Statements[int]:
        if not (yield self.find_table, ()):
            return -1
        return _version_in((yield self.read_version, ()))

    def _migrate(self, database: str) -> Statements[None]:
        yield self.create_table, ()
        # Read again under the lock: another process may have migrated meanwhile.
        found = _version_in((yield self.read_version, ()))
        self._check(found, read_only=False, database=database)
        for version in range(found + 1, self.version + 1):
            for statement in self.migrations[version]:
                yield statement, ()
            yield self.record_version, (version,)

    def _check(self, found: int, *, read_only: bool, database: str) -> None:
        if found > self.version:
            raise RuntimeError(
                f"{database} has journal schema version {found}, newer than version "
                f"{self.version} that this deerflow-journal knows: upgrade deerflow-journal"
            )
        if read_only and found < self.version:
            what = "no journal schema" if found < 0 else f"journal schema version {found}"
            raise RuntimeError(
                f"{database} has {what}, not version {self.version}: open it once without "
                "read_only to create or migrate it"
            )


def _version_in(rows: list[Any]) -> int:
    version = rows[0][0]
    return -1 if version is None else version


@runtime_checkable
class JournalStore(Protocol):
    """What ``RunJournal`` writes through: any object with these two async methods.

    Events arrive as ``put``'s keyword arguments in a dict each, with ``thread_id``,
    ``run_id``, ``user_id`` and an ISO ``created_at``, their content already plain JSON.
    """

    async def put_batch(self, events: Sequence[Mapping[str, Any]]) -> Any:
        """Append the events atomically, in order."""

    async def put_run_summary(self, summary: RunSummary) -> Any:
        """Insert or replace a run's summary."""


#: How many journal batch ids a store remembers: the journal retries a batch whose write
#: failed before any other write of its own, so only a store shared by many writers needs
#: more than a few.
BATCH_IDS_KEPT = 10_000
#: The SQL stores forget older batch ids on every this many-th batch only (a statement saved
#: on the others); they remember up to this many more than ``BATCH_IDS_KEPT`` meanwhile.
BATCH_IDS_PRUNED_EVERY = 64


class RecentBatchIds:
    """The ids of the latest journal batches an in-process store took.

    A retry always comes from the journal that sent the batch, through the same store
    object, so memory and JSONL stores need to remember them only in memory.
    """

    def __init__(self) -> None:
        self._ids: dict[str, None] = {}
        self._lock = threading.Lock()  # JSONL writes threads from several worker threads

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._ids

    def add(self, batch_id: str | None) -> None:
        """Remember ``batch_id`` (if any), forgetting the oldest past ``BATCH_IDS_KEPT``."""
        if batch_id is None:
            return
        with self._lock:
            self._ids[batch_id] = None
            if len(self._ids) > BATCH_IDS_KEPT:
                del self._ids[next(iter(self._ids))]


@dataclass(frozen=True, slots=True)
class Write:
    """One write, normalised: what a backend's ``_write`` hook stores all or nothing.

    Its events are numbered on per thread in input order; its run summaries are upserted by
    ``(thread_id, run_id)``, keeping the place a run's first summary took in listings.
    ``batch_id`` (the journal's batches) is recorded with them, and a write whose id the
    store recorded already writes nothing. ``if_absent`` (one event) writes nothing if the
    run has an event of that type from the same user (``None`` matches only ``None``).
    """

    events: list[PendingEvent]
    summaries: list[dict[str, Any]] = field(default_factory=list)
    batch_id: str | None = None
    if_absent: bool = False


@dataclass(frozen=True, slots=True)
class Written:
    """What a ``_write`` did: the seqs of its events in input order, or why it wrote nothing
    (its batch id was recorded already, or the stored event an ``if_absent`` write found)."""

    seqs: list[int]
    repeated: bool = False
    found: RunEvent | None = None


@dataclass(frozen=True, slots=True)
class EventQuery:
    """One ``list_events`` call, checked: what a backend's ``_list_events`` returns."""

    thread_id: str
    run_id: str | None  # None: every run of the thread
    event_types: tuple[str, ...] | None
    task_id: str | None
    limit: int
    after_seq: int | None
    user_id: str | None

    def select(
        self, rows: Iterable[R], event_type: Callable[[R], str], task_id: Callable[[R], Any]
    ) -> list[R]:
        """The rows an in-process backend returns, of the run's ``rows`` after ``after_seq``
        in seq order; ``event_type`` and ``task_id`` read a row's fields."""
        types, task, limit = self.event_types, self.task_id, self.limit
        if types is None and task is None:
            return list(itertools.islice(rows, limit))
        picked: list[R] = []
        for row in rows:  # a plain loop: this scans every row of a run
            if (types is None or event_type(row) in types) and (
                task is None or task_id(row) == task
            ):
                picked.append(row)
                if len(picked) == limit:
                    break
        return picked


class RunEventStore(ABC):
    """Append-only event store with thread-global sequence numbers.

    Use it as an async context manager (``setup()`` on enter, ``close()`` on exit) or call
    ``await store.setup()`` yourself; a method called first sets the store up by itself. After
    ``close()`` only ``setup()`` reopens it: a closed store used by mistake raises, rather than
    silently opening what nobody will close. With ``read_only=True`` it only reads (see the
    module docstring).
    """

    def __init__(
        self,
        *,
        max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
        max_outputs_content: int | None = DEFAULT_MAX_OUTPUTS_CONTENT,
        read_only: bool = False,
    ) -> None:
        self.max_trace_content = check_max_trace_content(max_trace_content)
        self.max_outputs_content = check_max_outputs_content(max_outputs_content)
        if not isinstance(read_only, bool):
            raise TypeError(f"read_only must be a bool, got {read_only!r}")
        self._read_only = read_only
        self._is_setup = False
        self._closed = False
        self._setup_lock: asyncio.Lock | None = None
        #: The loop the store was set up on: what it opened (a pool, locks) belongs to it.
        self._setup_loop: asyncio.AbstractEventLoop | None = None
        #: The loop of the setup holding ``_setup_lock``, if one does.
        self._setting_up: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create or migrate what the backend needs; safe to call any number of times."""
        if self._is_setup:
            return
        holder = self._setting_up
        if self._setup_lock is None or (holder is not None and holder.is_closed()):
            # A setup whose loop closed under it never releases its lock: this one starts over.
            self._setup_lock = asyncio.Lock()
            self._setting_up = None
        async with self._setup_lock:
            if not self._is_setup:
                loop = self._setting_up = asyncio.get_running_loop()
                try:
                    await self._setup()
                except GeneratorExit:
                    # Dropped with its closed loop: what it opened may be a later setup's now.
                    raise
                except BaseException:
                    # Release what a failed setup opened (a pool, a connection) before raising.
                    with contextlib.suppress(Exception):
                        await self._close()
                    raise
                finally:
                    if self._setting_up is loop:
                        self._setting_up = None
                self._is_setup = True
                self._closed = False
                self._setup_loop = loop

    async def close(self) -> None:
        """Release what the store opened itself (never a connection or pool it was given)."""
        await self._release()
        self._closed = True

    async def _release(self) -> None:
        """Close, leaving the store to reopen on its next use: a journal's own store, between
        runs, so that no connection outlives the loop that opened it."""
        await self._close()
        self._is_setup = False
        self._setup_lock = None  # bound to this event loop; the store may reopen in another
        self._setup_loop = None

    def _let_go_of_closed_loop(self) -> bool:
        """The loop the store was set up on has closed: a store whose connections belong to
        that loop lets go of what it opened there (unusable now) and returns True, to be set
        up again. What the caller gave it stays: nothing can reopen it."""
        return False

    async def __aenter__(self) -> Self:
        await self.setup()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def read_only(self) -> bool:
        """Whether the store was opened only to read."""
        return self._read_only

    async def _ready(self) -> None:
        loop = self._setup_loop
        closed = loop is not None and loop.is_closed() and self._is_setup
        if closed and self._let_go_of_closed_loop():
            self._is_setup = False
            self._setup_lock = None  # bound to the closed loop
            self._setup_loop = None
        if not self._is_setup:
            if self._closed:
                raise RuntimeError(
                    f"this {type(self).__name__} is closed: reopen it with "
                    "`await store.setup()` or `async with store:`"
                )
            await self.setup()

    def _check_writable(self, action: str) -> None:
        # First thing in every write: a read-only store must not even validate or set up.
        if self._read_only:
            raise ReadOnlyStoreError(
                f"cannot {action}: the store was opened read_only; open it without read_only "
                "to change it"
            )

    # -- writes ------------------------------------------------------------------------------

    async def put(
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
        self._check_writable("put an event")
        pending = normalise_event(
            _event_kwargs(
                thread_id, run_id, event_type, category, content, metadata, created_at, user_id
            ),
            max_trace_content=self.max_trace_content,
            max_outputs_content=self.max_outputs_content,
        )
        await self._ready()
        written = await _shielded(self._write(Write([pending])))
        return pending.record(written.seqs[0])

    async def put_batch(self, events: Sequence[Mapping[str, Any]]) -> list[RunEvent]:
        """Append every event atomically, seq in input order; a rejected batch writes nothing."""
        self._check_writable("put a batch")
        pending = normalise_batch(
            events,
            max_trace_content=self.max_trace_content,
            max_outputs_content=self.max_outputs_content,
        )
        if not pending:
            return []
        await self._ready()
        written = await _shielded(self._write(Write(pending)))
        return [event.record(seq) for event, seq in zip(pending, written.seqs, strict=True)]

    async def put_if_absent(
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
        """Append unless the run already has an event of this type from the same user.

        Returns ``(record, created)``: the new record, or the existing one with ``False``.
        """
        self._check_writable("put an event")
        pending = normalise_event(
            _event_kwargs(
                thread_id, run_id, event_type, category, content, metadata, created_at, user_id
            ),
            max_trace_content=self.max_trace_content,
            max_outputs_content=self.max_outputs_content,
        )
        await self._ready()
        written = await _shielded(self._write(Write([pending], if_absent=True)))
        if written.found is not None:
            return written.found, False
        return pending.record(written.seqs[0]), True

    # -- reads -------------------------------------------------------------------------------

    async def list_messages(
        self,
        thread_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[RunEvent]:
        """Return a page of the thread's message rows in ascending seq.

        ``before_seq``: the last ``limit`` below it; ``after_seq``: the first ``limit`` above
        it; neither: the latest ``limit``.
        """
        page = MessagePage(limit, before_seq, after_seq)
        user = resolve_read_user(user_id)
        await self._ready()
        thread = _check_thread(thread_id)
        return [] if page.limit == 0 else await self._list_messages(thread, None, page, user)

    async def list_messages_by_run(
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
        page = MessagePage(limit, before_seq, after_seq)
        user = resolve_read_user(user_id)
        await self._ready()
        thread, run = _check_thread(thread_id), _check_run(run_id)
        return [] if page.limit == 0 else await self._list_messages(thread, run, page, user)

    async def list_events(
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
        """Return one run's events of every category in ascending seq, filters before limit.

        ``run_id`` ``None`` returns the events of every run of the thread (``after_seq`` pages
        through all of it: an export, a follower). ``task_id`` matches ``metadata["task_id"]``;
        ``event_types`` may be one name or several.
        """
        types: tuple[str, ...] | None
        if event_types is None:
            types = None
        else:
            types = (event_types,) if isinstance(event_types, str) else tuple(event_types)
            for event_type in types:
                check_text(event_type, "event type", RUN_EVENT_TYPE_MAX_LENGTH)
        if task_id is not None:
            check_text(task_id, "task_id")
        limit = _check_count(limit, "limit")
        if after_seq is not None:
            after_seq = _check_count(after_seq, "after_seq")
        query = EventQuery(
            _check_thread(thread_id),
            None if run_id is None else _check_run(run_id),
            types,
            task_id,
            limit,
            after_seq,
            resolve_read_user(user_id),
        )
        await self._ready()
        return [] if limit == 0 else await self._list_events(query)

    async def get_last_visible_ai_seq_by_run(
        self,
        thread_id: str,
        run_ids: Iterable[str],
        *,
        user_id: str | Auto | None = AUTO,
    ) -> dict[str, int]:
        """Map each run to the seq of its last AI message not produced by middleware.

        Rows of type ``llm.ai.response`` or the legacy ``ai_message`` count; rows whose
        ``metadata.caller`` starts with ``middleware:`` do not. Runs without one are absent.
        """
        runs = [run_ids] if isinstance(run_ids, str) else list(run_ids)
        for run_id in runs:
            _check_run(run_id)
        user = resolve_read_user(user_id)
        if not runs:
            return {}
        await self._ready()
        return await self._last_visible_ai_seq_by_run(_check_thread(thread_id), runs, user)

    async def count_messages(self, thread_id: str, *, user_id: str | Auto | None = AUTO) -> int:
        """Return how many message rows the thread has."""
        user = resolve_read_user(user_id)
        await self._ready()
        return await self._count_messages(_check_thread(thread_id), user)

    async def delete_by_thread(self, thread_id: str, *, user_id: str | Auto | None = AUTO) -> int:
        """Delete the thread's events (a scoped call only that user's) and return the count.

        Run summaries of the thread are deleted with them. Seq numbers are not reused.
        """
        self._check_writable("delete a thread")
        user = resolve_read_user(user_id)
        await self._ready()
        return await _shielded(self._delete(_check_thread(thread_id), None, user))

    async def delete_by_run(
        self, thread_id: str, run_id: str, *, user_id: str | Auto | None = AUTO
    ) -> int:
        """Delete one run's events and summary and return how many events went."""
        self._check_writable("delete a run")
        user = resolve_read_user(user_id)
        await self._ready()
        return await _shielded(self._delete(_check_thread(thread_id), _check_run(run_id), user))

    # -- run summaries -----------------------------------------------------------------------

    async def put_run_summary(self, summary: RunSummary) -> RunSummary:
        """Insert or replace the summary of ``(summary.thread_id, summary.run_id)``.

        The summary is stamped with the current user when it names none. Raises
        ``PermissionError`` and writes nothing if the stored summary belongs to another user.
        """
        self._check_writable("put a run summary")
        data = _summary_data(summary)
        await self._ready()
        await _shielded(self._write(Write([], [data])))
        return RunSummary.model_validate(data)

    async def get_run_summary(
        self, thread_id: str, run_id: str, *, user_id: str | Auto | None = AUTO
    ) -> RunSummary | None:
        """Return the stored summary of one run, or ``None``."""
        user = resolve_read_user(user_id)
        await self._ready()
        data = await self._get_run_summary(_check_thread(thread_id), _check_run(run_id), user)
        return None if data is None else RunSummary.model_validate(data)

    async def list_run_summaries(
        self,
        thread_id: str | None = None,
        *,
        status: RunStatus | None = None,
        limit: int | None = None,
        before: RunSummary | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[RunSummary]:
        """Return run summaries: a thread's all, or a page of runs newest first.

        With only ``thread_id``: every summary of the thread, in the order they were first
        written. Without a thread, or with ``status``, ``limit`` or ``before``: a page of at
        most ``limit`` (default 50) summaries, of the thread or of every thread, newest first
        (by ``started_at``, then thread id, then run id, descending; runs without a start time
        last), only those with ``status`` if given; ``before`` is the last summary of the
        previous page, and the page holds the summaries after it.
        """
        user = resolve_read_user(user_id)
        if thread_id is not None and status is None and limit is None and before is None:
            await self._ready()
            rows = await self._list_run_summaries(_check_thread(thread_id), user)
            return [RunSummary.model_validate(row) for row in rows]
        query = SummaryQuery(
            None if thread_id is None else _check_thread(thread_id),
            _check_status(status),
            50 if limit is None else _check_count(limit, "limit"),
            _check_before(before, RunSummary),
            user,
        )
        await self._ready()
        if query.limit == 0:
            return []
        rows = await self._list_run_summary_page(query)
        return [RunSummary.model_validate(row) for row in rows]

    # -- browsing ----------------------------------------------------------------------------

    async def list_threads(
        self,
        *,
        limit: int = 50,
        before: ThreadInfo | None = None,
        user_id: str | Auto | None = AUTO,
    ) -> list[ThreadInfo]:
        """Return a page of threads, most recent activity first.

        Ordered by ``last_event_at`` (the ``created_at`` of the thread's last event), then
        thread id, both descending; ``before`` is the last ``ThreadInfo`` of the previous page,
        and the page holds the threads after it, so paging lists every thread once. A scoped
        call lists the threads with rows of that user, with that user's last event and runs.
        """
        query = ThreadQuery(
            _check_count(limit, "limit"),
            _check_thread_cursor(before),
            resolve_read_user(user_id),
        )
        await self._ready()
        return [] if query.limit == 0 else await self._list_threads(query)

    # -- the journal's writes ----------------------------------------------------------------

    async def _put_journal_batch(
        self,
        events: Sequence[Mapping[str, Any]],
        summaries: Sequence[dict[str, Any]],
        default: Callable[[Any], Any] = str,
        batch_id: str | None = None,
    ) -> bool:
        """Append ``events`` and upsert ``summaries`` in one write, all or nothing.

        ``RunJournal``'s flush: stored as ``put_batch`` and ``put_run_summary`` store them
        (``default`` encodes the values JSON cannot hold; see ``normalise_journal_batch``), but
        returns no records and is not shielded, since the journal awaits it to the end
        itself. A ``batch_id`` is recorded with the
        write: a batch with an id the store took already writes nothing and returns False
        (the journal retries a write whose answer was lost, say with its connection).
        """
        self._check_writable("write the journal's batch")
        if batch_id is not None:
            check_text(batch_id, "batch_id")
        pending = normalise_journal_batch(
            events,
            max_trace_content=self.max_trace_content,
            max_outputs_content=self.max_outputs_content,
            default=default,
        )
        data = [_checked_summary(summary) for summary in summaries]
        await self._ready()
        return not (await self._write(Write(pending, data, batch_id))).repeated

    # -- backend hooks -----------------------------------------------------------------------

    @abstractmethod
    async def _setup(self) -> None: ...

    @abstractmethod
    async def _close(self) -> None: ...

    @abstractmethod
    def _write(self, write: Write) -> Awaitable[Written]:
        """Store ``write`` in one atomic step; raise ``PermissionError`` without writing if
        one of its summaries would replace another user's.

        A coroutine, or a future already under way (``_shielded`` then shields it without
        wrapping it in a task).
        """

    @abstractmethod
    async def _list_messages(
        self, thread_id: str, run_id: str | None, page: MessagePage, user_id: str | None
    ) -> list[RunEvent]:
        """The message rows of ``page`` (its ``limit`` is at least 1), of one run unless
        ``run_id`` is None."""

    @abstractmethod
    async def _list_events(self, query: EventQuery) -> list[RunEvent]:
        """The events ``query`` asks for (its ``limit`` is at least 1)."""

    @abstractmethod
    async def _last_visible_ai_seq_by_run(
        self, thread_id: str, run_ids: list[str], user_id: str | None
    ) -> dict[str, int]: ...

    @abstractmethod
    async def _count_messages(self, thread_id: str, user_id: str | None) -> int: ...

    @abstractmethod
    async def _delete(self, thread_id: str, run_id: str | None, user_id: str | None) -> int: ...

    @abstractmethod
    async def _get_run_summary(
        self, thread_id: str, run_id: str, user_id: str | None
    ) -> dict[str, Any] | None: ...

    @abstractmethod
    async def _list_run_summaries(
        self, thread_id: str, user_id: str | None
    ) -> list[dict[str, Any]]: ...

    @abstractmethod
    async def _list_run_summary_page(self, query: SummaryQuery) -> list[dict[str, Any]]:
        """The stored summaries of a paged ``list_run_summaries`` (``limit`` at least 1)."""

    @abstractmethod
    async def _list_threads(self, query: ThreadQuery) -> list[ThreadInfo]:
        """The threads of a ``list_threads`` page (``limit`` at least 1)."""


def _check_status(status: object) -> RunStatus | None:
    if status is None or status in RUN_STATUSES:
        return status  # type: ignore[return-value]
    raise ValueError(f"status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")


B = TypeVar("B")


def _check_before(before: object, kind: type[B]) -> B | None:
    if before is None or isinstance(before, kind):
        return before
    raise TypeError(f"before must be the last {kind.__name__} of the previous page, got {before!r}")


def _check_thread_cursor(before: object) -> ThreadInfo | None:
    """A ``list_threads`` cursor, its time as stored: every backend then compares it the same
    way (SQLite and the in-process stores compare the text)."""
    checked = _check_before(before, ThreadInfo)
    if checked is None:
        return None
    if not isinstance(checked.last_event_at, str):
        raise TypeError(f"before.last_event_at must be a string, got {checked.last_event_at!r}")
    at = normalise_created_at(checked.last_event_at, "before.last_event_at")
    return checked if at == checked.last_event_at else replace(checked, last_event_at=at)


def _summary_data(summary: RunSummary) -> dict[str, Any]:
    """Check a summary, stamp the current user, and return the JSON dict backends store."""
    if not isinstance(summary, RunSummary):
        raise TypeError(f"summary must be a RunSummary, got {type(summary).__name__}")
    return _checked_summary(summary.to_json_dict())


def _checked_summary(data: dict[str, Any]) -> dict[str, Any]:
    """A summary's JSON dict (``RunSummary.to_json_dict()``, ours to change) stamped with the
    current user, its ids checked, normalised as events are."""
    if data["user_id"] is None:
        data["user_id"] = current_user_id()
    _check_thread(data["thread_id"])
    _check_run(data["run_id"])
    if data["user_id"] is not None:
        check_text(data["user_id"], "user_id")
    # The same JSON normalisation as events, so every backend stores the same text.
    return data if _plain_json(data) else decode_json(encode_json(data))


def _plain_json(data: dict[str, Any]) -> bool:
    """Whether a summary's JSON dict is what encoding and decoding it gives back: orjson
    writes it as it is (text it need not clean, integers it can hold), and its floats (the
    costs; the other numbers are integers) are finite, which JSON keeps."""
    try:
        text = orjson.dumps(data)
    except TypeError:
        return False
    if b"\\u0000" in text:
        return False
    cost, by_model = data["estimated_cost_usd"], data["estimated_cost_by_model"]
    return (cost is None or math.isfinite(cost)) and all(
        value is None or math.isfinite(value) for value in by_model.values()
    )


def _event_kwargs(
    thread_id: Any,
    run_id: Any,
    event_type: Any,
    category: Any,
    content: Any,
    metadata: Any,
    created_at: Any,
    user_id: Any,
) -> dict[str, Any]:
    event = {
        "thread_id": thread_id,
        "run_id": run_id,
        "event_type": event_type,
        "category": category,
        "content": content,
        "metadata": metadata,
        "created_at": created_at,
    }
    if user_id is not AUTO:
        event["user_id"] = user_id
    return event
