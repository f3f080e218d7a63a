"""``SqliteRunEventStore``: the default backend, one SQLite file shared by many processes.

Seq assignment lives in the database. A write takes SQLite's write lock (``BEGIN IMMEDIATE``,
or the single statement of a one-event ``put``) before it reads each thread's counter in
``run_thread_seq``, so concurrent writers in other processes queue on the busy timeout instead
of reading the same counter; it then inserts its rows numbered on from that counter. The
counter moves with every row, and a trigger refuses another writer's row whose seq does not
follow it, so seq stays unique, gap-free and never reused (deletes leave the counter alone),
whoever writes. Per-thread, per-user message counts and the thread list are kept the same way,
so ``count_messages`` and ``list_threads`` do not grow with the thread. On its own connection
the store marks a batch's rows ``booked`` and keeps those counters once per batch
(``_bookings``), a fraction of the trigger's work per row; the trigger keeps them for every row
not marked so. Only the store may mark a row: a program that copies rows in must leave
``booked`` NULL (name the columns it copies), or the counters miss them.

Each operation (a write of events and run summaries, a delete, a migration) is one generator
of statements, all or nothing. The store's own connection is a plain ``sqlite3`` connection on
a thread of its own, where an operation is one call (one round trip)
that runs to its end even if its caller is cancelled; nothing there ever calls back into an
event loop that has closed. A caller's ``aiosqlite`` connection gets the statements one by one
through aiosqlite's public calls, in a task that runs to its end, one operation at a time;
there each statement is a round trip, so its rows are left to the trigger rather than booked.

The store's own connection follows its path. Before a write it checks that the file there is
still the one it opened: a file deleted or replaced meanwhile would take the writes where
nobody reads them, so it opens (or creates) and sets up the file now at the path. And SQLite
opens a file it cannot write (or whose ``-shm`` index it cannot make) read-only without a word,
keeping the connection so: an operation refused as read-only reopens it and runs once more.
A caller's connection is never replaced; its errors are raised as they come.

Opened ``read_only`` it neither migrates nor switches to WAL, and opens the file with
``mode=ro``. A WAL database needs its ``-shm`` index to be read, and SQLite creates it beside
the file when missing: where that cannot be (read-only media, a directory of another user) the
file is opened ``immutable=1`` instead, unlocked and without reading the ``-wal`` file. That is
sound when no writer has it open: the last writer to close folds the ``-wal`` file into the
database and removes both, and a writer still open keeps the ``-shm`` index there for readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import aiosqlite

from deerflow_journal.catalog import MIDDLEWARE_EVENT_PATTERN
from deerflow_journal.records import (
    DEFAULT_MAX_OUTPUTS_CONTENT,
    DEFAULT_MAX_TRACE_CONTENT,
    PendingEvent,
    RunEvent,
    decode_json,
    encode_json,
    make_record,
)
from deerflow_journal.stores.base import (
    AI_RESPONSE_EVENT_TYPES,
    BATCH_IDS_KEPT,
    BATCH_IDS_PRUNED_EVERY,
    EventQuery,
    MessagePage,
    RunEventStore,
    Statements,
    Write,
    Written,
    run_statements,
)
from deerflow_journal.stores.browsing import SummaryQuery, ThreadInfo, ThreadQuery
from deerflow_journal.stores.sqlite_schema import SCHEMA
from deerflow_journal.summary import other_users_summary_error

__all__ = ["BUSY_TIMEOUT_SECONDS", "ROWS_PER_STATEMENT", "SqliteRunEventStore"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: How long a writer waits for another process's write transaction before giving up.
BUSY_TIMEOUT_SECONDS = 30.0

# RETURNING and MATERIALIZED common table expressions arrived in SQLite 3.35.
_MIN_SQLITE = (3, 35, 0)
# SQLite's default bound-variable limit (999 before 3.32); larger batches are chunked.
_MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
_PARAMS_PER_EVENT = 10
#: Events per INSERT statement; a larger batch is split into several in one transaction.
ROWS_PER_STATEMENT = _MAX_VARIABLES // (_PARAMS_PER_EVENT + 1)  # each row's seq is one more
# Longer IN lists go through one JSON parameter instead of one placeholder per value.
_MAX_IN_PLACEHOLDERS = 64

_COLUMNS = "thread_id, run_id, seq, event_type, category, content, metadata, created_at, user_id"
_BATCH_COLUMNS = (
    "thread_id, run_id, event_type, category, content, metadata, created_at, user_id, "
    "task_id, caller"
)
# The sqlite3 module binds None through its adaptation protocol (an attribute lookup that
# raises and is caught): several times the cost of binding an int. The nullable columns, the
# last three, hold text or NULL, so None is bound as 0 and nullif() turns it back into NULL.
_NULLABLE_FROM = _PARAMS_PER_EVENT - 3


def _placeholder(index: int, marker: str = "?") -> str:
    """The SQL that binds column ``index`` (from 1) of ``_BATCH_COLUMNS`` (see ``_row``)."""
    return marker if index <= _NULLABLE_FROM else f"nullif({marker}, 0)"


_AI_TYPES = ", ".join(f"'{t}'" for t in AI_RESPONSE_EVENT_TYPES)
# is_middleware_caller in SQL: GLOB is case-sensitive, as startswith is, and the prefix holds
# no wildcard.
_NOT_MIDDLEWARE = f"(caller IS NULL OR caller NOT GLOB '{MIDDLEWARE_EVENT_PATTERN.prefix}*')"
# One event in one statement, numbered in SQL: its own transaction, with no BEGIN or COMMIT
# (a quarter of the instructions of a transaction around it).
_APPEND_ONE_SQL = (
    f"INSERT INTO run_events (seq, {_BATCH_COLUMNS}) VALUES ("
    "coalesce((SELECT last_seq FROM run_thread_seq WHERE thread_id = ?1), 0) + 1, "
    f"{', '.join(_placeholder(i, f'?{i}') for i in range(1, _PARAMS_PER_EVENT + 1))}) RETURNING seq"
)


class _Counted(str):
    """SQL answered with one row, (rows it changed, rowid of its insert), instead of its rows.

    The store's own connection reads both from the sqlite3 cursor: ``RETURNING`` costs SQLite
    about 30k instructions a statement (it runs as a trigger). The rowid is the connection's
    last insert, meaningful only when a row changed. A caller's connection adds ``RETURNING``
    instead: reading the cursor there would cost a second round trip to aiosqlite's thread,
    and ``PRAGMA count_changes`` would hide the count.
    """

    __slots__ = ()


# Another user's summary is left alone: the statement then changes no row.
_UPSERT_SUMMARY = _Counted(
    "INSERT INTO run_summaries (thread_id, run_id, user_id, summary) "
    "VALUES (?, ?, nullif(?, 0), ?) "
    "ON CONFLICT (thread_id, run_id) DO UPDATE SET summary = excluded.summary "
    "WHERE run_summaries.user_id IS excluded.user_id"
)
# The counters of booked rows, kept by _bookings' statements (the insert trigger skips
# those rows).
_BOOK_SEQ = (
    "INSERT INTO run_thread_seq (thread_id, last_seq) VALUES (?, ?) "
    "ON CONFLICT (thread_id) DO UPDATE SET last_seq = excluded.last_seq"
)
_BOOK_MESSAGES = (
    "INSERT INTO run_message_counts (thread_id, user_key, messages) VALUES (?, ?, ?) "
    "ON CONFLICT (thread_id, user_key) DO UPDATE SET messages = messages + excluded.messages"
)


def _book_thread_sql(same_user: str) -> str:
    """Move a ``run_threads`` row (?1, ?2) on to a booked row (seq ?3, time ?4, run ?5),
    counting the run unless it is the row's last or has a row up to seq ?6 (the thread's last
    before the batch); ``same_user`` narrows that probe to the user's rows."""
    return f"""INSERT INTO run_threads
            (user_key, thread_id, last_seq, last_event_at, run_count, last_run_id)
        VALUES (?1, ?2, ?3, ?4, 1, ?5)
        ON CONFLICT (user_key, thread_id) DO UPDATE SET
            last_seq = excluded.last_seq,
            last_event_at = excluded.last_event_at,
            last_run_id = excluded.last_run_id,
            run_count = run_count + (?5 IS NOT last_run_id AND NOT EXISTS (
                SELECT 1 FROM run_events
                WHERE thread_id = ?2 AND run_id = ?5 {same_user}AND seq <= ?6))"""


_BOOK_THREAD = _book_thread_sql("")
# Unary + keeps the probe on the run index, not the per-user one.
_BOOK_USER_THREAD = _book_thread_sql("AND +user_id = ?1 ")
# A batch id recorded already changes no row; a new one's n is the rowid.
_RECORD_BATCH = _Counted("INSERT OR IGNORE INTO run_journal_batches (batch_id) VALUES (?)")
_FORGET_OLD_BATCHES = "DELETE FROM run_journal_batches WHERE n <= ?"
_LAST_SEQ_SQL = "SELECT last_seq FROM run_thread_seq WHERE thread_id = ?"
# Each listed thread's counter, keyed by its index in the JSON list.
_LAST_SEQS_SQL = (
    "SELECT threads.key, s.last_seq FROM json_each(?) AS threads "
    "JOIN run_thread_seq AS s ON s.thread_id = threads.value"
)
_FIRST_OF_TYPE_SQL = (
    f"SELECT {_COLUMNS} FROM run_events WHERE thread_id = ? AND run_id = ? AND event_type = ? "
    "AND user_id IS ? ORDER BY seq LIMIT 1"
)


class SqliteRunEventStore(RunEventStore):
    """Events in one SQLite file (WAL), safe for several processes writing the same threads.

    Args:
        path_or_conn: a database path (parent directories are created) or an open
            ``aiosqlite.Connection`` that the caller owns: the store never closes it, and its
            writes commit on it, so do not hand in a connection holding uncommitted work (a
            failing read leaves it alone). The store reads plain rows whatever its row
            factory, and text whether its text factory gives ``str`` or ``bytes``. The store
            reopens a path of its own when the file there was deleted or replaced, or when
            SQLite opened it read-only (see ``_Connection``); it never replaces a given
            connection, whose errors (``attempt to write a readonly database``) it raises.
        max_trace_content: byte limit of trace-category content (``None``: no limit).
        max_outputs_content: byte limit of outputs-category content, such as ``run.end``'s
            graph state (``None``: no limit).
        read_only: only read: writes are refused, nothing is created or migrated, and the
            file may be on storage this process cannot write (see the module docstring).
    """

    def __init__(
        self,
        path_or_conn: str | os.PathLike[str] | aiosqlite.Connection,
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
        self._path: str | None = None
        self._given: aiosqlite.Connection | None = None
        self._worker: _Worker | None = None
        if isinstance(path_or_conn, aiosqlite.Connection):
            self._given = path_or_conn
        elif isinstance(path_or_conn, str | os.PathLike):
            path = os.fspath(path_or_conn)
            # Fixed now: the store reopens its file after close(), and a relative path must
            # not follow a chdir made meanwhile (the journal would go on in another file).
            self._path = path if path in ("", ":memory:") else os.path.abspath(path)
        else:
            raise TypeError(
                "SqliteRunEventStore needs a path or an aiosqlite.Connection, "
                f"got {type(path_or_conn).__name__}"
            )
        self._given_lock = asyncio.Lock()

    @classmethod
    @contextlib.asynccontextmanager
    async def from_conn_string(
        cls, path: str | os.PathLike[str], **options: Any
    ) -> AsyncIterator[Self]:
        """Open a set-up store on the database at ``path`` and close it on exit."""
        async with cls(path, **options) as store:
            yield store

    # -- lifecycle ---------------------------------------------------------------------------

    async def _setup(self) -> None:
        self._given_lock = asyncio.Lock()  # one per opening: each may be in another loop
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise RuntimeError(
                f"SqliteRunEventStore needs SQLite 3.35 or newer; this Python links "
                f"{sqlite3.sqlite_version}: upgrade Python or use another store"
            )
        if self._given is None:
            self._worker = await _Worker.open(self._path or "", read_only=self.read_only)
        if not self.read_only:
            await self._use_wal()
        await SCHEMA.upgrade(
            lambda make: self._run(make, writes=False),
            lambda make: self._run(lambda: _write_transaction(make())),
            read_only=self.read_only,
            database=_database_name(self._path),
        )

    async def _close(self) -> None:
        if self._worker is not None:
            worker, self._worker = self._worker, None
            await worker.close()

    async def _use_wal(self) -> None:
        """Switch the file to WAL mode (kept in the file; a no-op once it is).

        While another connection holds the write lock, SQLite refuses the switch at once instead
        of waiting for the busy timeout (it could deadlock otherwise): retry until that timeout.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        delay = 0.005
        while True:
            try:
                await self._run(_wal_mode)
                return
            except sqlite3.OperationalError as exc:
                if _error_code(exc) != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)

    # -- plumbing ----------------------------------------------------------------------------

    def _run(self, make: Callable[[], Statements[T]], *, writes: bool = True) -> Awaitable[T]:
        """Run the statements ``make`` makes to their end, even if nobody waits for them any
        more; a failure rolls back what they began. The store's own connection may run them
        again on a reopened connection (see ``_Connection``). On a caller's connection a write
        first commits any transaction open there, and commits what Python's implicit
        transactions open."""
        if self._given is not None:
            return _run_given(self._given, self._given_lock, make(), writes)
        if self._worker is None:
            raise RuntimeError("the store is closed; use `await store.setup()` to reopen it")
        return self._worker.run(make, writes=writes)

    def _query(self, sql: str, params: Sequence[Any] = ()) -> Awaitable[list[Any]]:
        """Run one read statement; its rows."""
        return self._run(functools.partial(_statement, sql, params), writes=False)

    # -- writes ------------------------------------------------------------------------------

    def _write(self, write: Write) -> Awaitable[Written]:
        # On the store's own connection a future, which the caller can shield without a task.
        if len(write.events) == 1 and not (write.summaries or write.batch_id or write.if_absent):
            return self._run(functools.partial(_append_one, write.events[0]))
        # On a caller's connection each statement is a round trip to aiosqlite's thread, which
        # costs more than the trigger's work per row: its rows are left to the trigger.
        book = self._given is None
        return self._run(lambda: _write_transaction(_written(write, book)))

    async def _delete(self, thread_id: str, run_id: str | None, user_id: str | None) -> int:
        where, params = "thread_id = ?", [thread_id]
        if run_id is not None:
            where, params = where + " AND run_id = ?", [*params, run_id]
        if user_id is not None:
            where, params = where + " AND user_id = ?", [*params, user_id]
        return await self._run(lambda: _write_transaction(_delete_rows(thread_id, where, params)))

    # -- reads -------------------------------------------------------------------------------

    async def _list_messages(
        self, thread_id: str, run_id: str | None, page: MessagePage, user_id: str | None
    ) -> list[RunEvent]:
        where, params = ["thread_id = ?", "category = 'message'"], [thread_id]
        if run_id is not None:
            where.append("run_id = ?")
            params.append(run_id)
        _filter_user(where, params, user_id, by_run=run_id is not None)
        if page.before_seq is not None:
            where.append("seq < ?")
            params.append(page.before_seq)
        if page.after_seq is not None:
            where.append("seq > ?")
            params.append(page.after_seq)
        order = "DESC" if page.from_end else "ASC"
        rows = await self._query(
            f"SELECT {_COLUMNS} FROM run_events WHERE {' AND '.join(where)} "
            f"ORDER BY seq {order} LIMIT ?",
            (*params, page.limit),
        )
        if page.from_end:
            rows.reverse()
        return _records(rows)

    async def _list_events(self, query: EventQuery) -> list[RunEvent]:
        where: list[str] = ["thread_id = ?"]
        params: list[Any] = [query.thread_id]
        if query.run_id is not None:
            where.append("run_id = ?")
            params.append(query.run_id)
        if query.event_types is not None:
            where.append(f"event_type IN {_in_list(query.event_types, params)}")
        if query.task_id is not None:
            where.append("task_id = ?")
            params.append(query.task_id)
        # Kept off the per-user index either way: the run's index, or the thread's seq order.
        _filter_user(where, params, query.user_id, by_run=True)
        if query.after_seq is not None:
            where.append("seq > ?")
            params.append(query.after_seq)
        rows = await self._query(
            f"SELECT {_COLUMNS} FROM run_events WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
            (*params, query.limit),
        )
        return _records(rows)

    async def _last_visible_ai_seq_by_run(
        self, thread_id: str, run_ids: list[str], user_id: str | None
    ) -> dict[str, int]:
        where = [
            "thread_id = ?",
            "run_id = runs.value",
            "category = 'message'",
            f"event_type IN ({_AI_TYPES})",
            _NOT_MIDDLEWARE,
        ]
        params: list[Any] = [thread_id]
        _filter_user(where, params, user_id, by_run=True)
        rows = await self._query(
            "SELECT runs.value, (SELECT seq FROM run_events WHERE "
            f"{' AND '.join(where)} ORDER BY seq DESC LIMIT 1) "
            "FROM json_each(?) AS runs",
            (*params, encode_json(run_ids)),
        )
        return {run_id: seq for run_id, seq in rows if seq is not None}

    async def _count_messages(self, thread_id: str, user_id: str | None) -> int:
        where, params = "thread_id = ?", [thread_id]
        if user_id is not None:
            # Rows with no user are counted under '' (never a valid user id).
            where, params = where + " AND user_key = ?", [thread_id, user_id]
        rows = await self._query(
            f"SELECT coalesce(sum(messages), 0) FROM run_message_counts WHERE {where}", params
        )
        return int(rows[0][0])

    # -- run summaries -----------------------------------------------------------------------

    async def _get_run_summary(
        self, thread_id: str, run_id: str, user_id: str | None
    ) -> dict[str, Any] | None:
        where, params = ["thread_id = ?", "run_id = ?"], [thread_id, run_id]
        _filter_user(where, params, user_id, by_run=True)
        rows = await self._query(
            f"SELECT summary FROM run_summaries WHERE {' AND '.join(where)}", params
        )
        return decode_json(rows[0][0]) if rows else None

    async def _list_run_summaries(
        self, thread_id: str, user_id: str | None
    ) -> list[dict[str, Any]]:
        where, params = ["thread_id = ?"], [thread_id]
        _filter_user(where, params, user_id, by_run=False)
        rows = await self._query(
            f"SELECT summary FROM run_summaries WHERE {' AND '.join(where)} ORDER BY id", params
        )
        return [decode_json(row[0]) for row in rows]

    # -- browsing ----------------------------------------------------------------------------

    async def _list_threads(self, query: ThreadQuery) -> list[ThreadInfo]:
        params: list[Any] = ["" if query.user_id is None else query.user_id]
        after = ""
        if query.before is not None:
            after = "AND (last_event_at, thread_id) < (?, ?) "
            params += query.before.sort_key
        rows = await self._query(
            "SELECT thread_id, last_seq, last_event_at, run_count FROM run_threads "
            f"WHERE user_key = ? {after}"
            "ORDER BY last_event_at DESC, thread_id DESC LIMIT ?",
            [*params, query.limit],
        )
        return [ThreadInfo(*row) for row in rows]

    async def _list_run_summary_page(self, query: SummaryQuery) -> list[dict[str, Any]]:
        where, params = ["1"], []
        for column, value in (
            ("thread_id", query.thread_id),
            ("status", query.status),
            ("user_key", query.user_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if query.before_key is not None:
            where.append("(started_key, thread_id, run_id) < (?, ?, ?)")
            params += query.before_key
        rows = await self._query(
            f"SELECT summary FROM run_summaries WHERE {' AND '.join(where)} "
            "ORDER BY started_key DESC, thread_id DESC, run_id DESC LIMIT ?",
            [*params, query.limit],
        )
        return [decode_json(row[0]) for row in rows]


# -- running statements --------------------------------------------------------------------


class _Worker:
    """The store's own ``sqlite3`` connection (a ``_Connection``), on a daemon thread of its own
    that runs each call in turn: a connection, and so its transactions, serve one statement at
    a time.

    Not a ``ThreadPoolExecutor``: that refuses work once the interpreter begins to exit, and a
    journal writes out what it still holds from an exit handler.
    """

    def __init__(self, path: str, *, read_only: bool) -> None:
        self._calls: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        threading.Thread(
            target=_serve, args=(self._calls,), name="deerflow-journal-sqlite", daemon=True
        ).start()
        # A store dropped unclosed: the thread ends after the calls queued before. Not at exit,
        # which comes before the journal's own exit handler has written out what it holds.
        # The calls hold the connection, never the worker, so that it can be dropped.
        weakref.finalize(self, self._calls.put, None).atexit = False
        self._db = _Connection(path, read_only=read_only)

    @classmethod
    async def open(cls, path: str, *, read_only: bool) -> _Worker:
        """Start the thread and connect to ``path`` there."""
        worker = cls(path, read_only=read_only)
        try:
            await worker._call(worker._db.connect)
        except BaseException:
            worker._calls.put(None)
            raise
        return worker

    def run(self, make: Callable[[], Statements[T]], *, writes: bool) -> asyncio.Future[T]:
        """Run the statements ``make`` makes on the thread in one call; the future of their
        result."""
        return self._call(self._db.run, make, writes)

    async def close(self) -> None:
        """Close the connection after the calls queued before, and end the thread."""
        try:
            await self._call(self._db.close)
        finally:
            self._calls.put(None)

    def _call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(*args)`` on the thread; the future of its outcome.

        The call runs to its end whether anyone still waits or not: cancelling the future only
        drops the answer (``run_in_executor`` would drop a call not yet started).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future


class _Connection:
    """The worker thread's connection to the store's file, reopened (and the file set up again)
    by a writable store in two cases:

    - Before a write, when the file at the path is not the one the connection opened (deleted,
      or replaced by another file): writes would go on into a file nobody can open any more.
    - When an operation fails with ``SQLITE_READONLY``: SQLite opens a file it cannot write
      (or whose ``-shm`` index it cannot make) read-only without a word, and the connection
      stays so once the file is writable again. The operation then runs once more on the new
      connection; it rolled back, so nothing is written twice. A read-only ``-shm`` mapping is
      shared by every connection of the process to the file: it goes with the last of them.
    """

    def __init__(self, path: str, *, read_only: bool) -> None:
        self._path = path
        self._read_only = read_only
        self._conn: sqlite3.Connection | None = None
        # (device, inode) of the file the connection opened; None for no file (":memory:").
        self._file: tuple[int, int] | None = None
        # (device, inode) of the -wal and -shm files this connection uses, once seen.
        self._sidecars: dict[str, tuple[int, int]] = {}

    def connect(self) -> None:
        """Open the path."""
        if self._read_only:
            self._conn = _connect_read_only(self._path)
            return
        self._conn = _connect(self._path)
        if self._path not in ("", ":memory:"):
            # Right after opening: what SQLite has open is what is at the path now.
            self._file = _ident(self._path)

    def run(self, make: Callable[[], Statements[T]], writes: bool) -> T:
        """Run the statements ``make`` makes; roll back what a failure began."""
        if self._conn is None:  # a reopening failed: try again
            self._reopen()
        elif writes and not self._read_only and self._replaced():
            logger.warning(
                "the SQLite journal %s was deleted or replaced while open: writing to the "
                "file now at that path",
                self._path,
            )
            self._reopen(moved=True)
        assert self._conn is not None
        try:
            result = _run_here(self._conn, make())
            if self._file is not None and len(self._sidecars) < 2:
                self._note_sidecars()
            return result
        except sqlite3.OperationalError as exc:
            if self._read_only or _error_code(exc) != sqlite3.SQLITE_READONLY:
                raise
            logger.info("reopening the SQLite journal %s: %s", self._path, exc)
            conn = self._reopen()
        return _run_here(conn, make())  # once: a file still read-only raises again

    def close(self) -> None:
        """Close the connection, if open."""
        conn, self._conn, self._file = self._conn, None, None
        self._sidecars = {}
        if conn is not None:
            conn.close()

    def _note_sidecars(self) -> None:
        """Remember the -wal and -shm files the connection uses (SQLite makes them lazily)."""
        for suffix in ("-wal", "-shm"):
            if suffix not in self._sidecars and (ident := _ident(f"{self._path}{suffix}")):
                self._sidecars[suffix] = ident

    def _replaced(self) -> bool:
        """Whether the file at the path is no longer the one the connection has open."""
        if self._file is None:
            return False
        try:
            stat = os.stat(self._path)
        except (FileNotFoundError, NotADirectoryError):
            return True
        except OSError:  # cannot tell (a directory we may not search): keep writing
            return False
        return (stat.st_dev, stat.st_ino) != self._file

    def _reopen(self, *, moved: bool = False) -> sqlite3.Connection:
        """Close the connection and open the path again, setting up the file found there."""
        # One store of the process at a time: another one's new -wal must not be taken for
        # ours (and removed) between our look at the path and our unlink.
        with _reopening(self._path):
            return self._reopen_now(moved)

    def _reopen_now(self, moved: bool) -> sqlite3.Connection:
        ours: dict[str, tuple[int, int]] = {}
        if moved and self._conn is not None:
            # The -wal and -shm still at the path that this connection opened are ours: ours
            # only is emptied (SQLite neither checkpoints nor removes the -wal of a moved
            # database as it closes, and the next file at the path would read its frames as
            # its own) and removed, so that the new file gets its own. Those another store of
            # the process reopened there since are the new file's: checkpointing them would
            # copy its rows into the old one. Best effort: waiting for another process still
            # on the old file is no use.
            ours = {
                suffix: ident
                for suffix, ident in self._sidecars.items()
                if _ident(f"{self._path}{suffix}") == ident
            }
            if "-wal" in ours:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA busy_timeout = 0")
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        self.close()
        for suffix, ident in ours.items():  # the new file gets sidecars of its own
            if _ident(f"{self._path}{suffix}") == ident:
                with contextlib.suppress(OSError):
                    os.unlink(f"{self._path}{suffix}")
        self.connect()
        conn = self._conn
        assert conn is not None
        try:
            _set_up_here(conn, self._path)
        except BaseException:
            self.close()
            raise
        return conn


#: Held by a store of the process reopening a file, one per file (``_Connection._reopen``).
_REOPENING: dict[str, threading.Lock] = {}
_REOPENING_LOCK = threading.Lock()


def _reopening(path: str) -> threading.Lock:
    """The lock stores of the process take to reopen the file at ``path``."""
    with _REOPENING_LOCK:
        return _REOPENING.setdefault(os.path.realpath(path), threading.Lock())


def _ident(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, or ``None`` if there is none."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _set_up_here(conn: sqlite3.Connection, path: str) -> None:
    """On the worker thread, set up a file the store reopened as ``_setup`` does (it may be a
    new one): WAL mode, then the schema. A busy file fails the call, and the next one retries."""
    _run_here(conn, _wal_mode())

    async def run(make: Callable[[], Statements[Any]]) -> Any:
        return _run_here(conn, make())

    async def run_migrating(make: Callable[[], Statements[Any]]) -> Any:
        return _run_here(conn, _write_transaction(make()))

    # Nothing in it waits: a loop of its own on this thread just drives the shared runner.
    asyncio.run(SCHEMA.upgrade(run, run_migrating, read_only=False, database=_database_name(path)))


def _database_name(path: str | None) -> str:
    """How errors name the database."""
    return f"the SQLite database {path or '(a given connection)'}"


def _error_code(exc: sqlite3.Error) -> int | None:
    """The primary result code of ``exc`` (the low byte of its extended code)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _serve(calls: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
    """The worker thread: run the queued calls in order until told to stop."""
    while (call := calls.get()) is not None:
        _call_and_answer(*call)


def _call_and_answer(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """Run ``fn(*args)`` on the worker thread and hand its outcome to ``future``'s loop."""
    result, error = None, None
    try:
        result = fn(*args)
    except BaseException as exc:  # the future must learn of any failure
        error = exc
    # A closed loop has nobody waiting: dropping the answer there keeps the thread quiet.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_answer, future, result, error)


def _answer(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled: its caller stopped waiting
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _run_here(conn: sqlite3.Connection, statements: Statements[T]) -> T:
    """Run ``statements`` on ``conn`` (the worker thread), sending each its rows (a
    ``_Counted`` statement: its one row of counts); roll back what a failure began."""
    try:
        statement = next(statements)
        while True:
            cursor = conn.execute(*statement)
            if type(statement[0]) is _Counted:
                statement = statements.send([(cursor.rowcount, cursor.lastrowid)])
            else:
                statement = statements.send(cursor.fetchall())
    except StopIteration as done:
        return done.value
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise


async def _run_given(
    db: aiosqlite.Connection, lock: asyncio.Lock, statements: Statements[T], writes: bool
) -> T:
    """Run ``statements`` on a caller's connection, one operation at a time, in a task that
    goes on to their end if the caller is cancelled."""
    await lock.acquire()
    task = asyncio.ensure_future(_run_given_now(db, statements, writes))
    task.add_done_callback(lambda _: lock.release())
    return await asyncio.shield(task)


async def _run_given_now(db: aiosqlite.Connection, statements: Statements[T], writes: bool) -> T:
    if writes and db.in_transaction:  # the caller's work, committed apart from ours
        await db.commit()
    try:
        result = await run_statements(statements, functools.partial(_plain_rows, db))
    except BaseException:
        # A write committed the caller's work first, so what is open now is its own; a read
        # begins nothing, so what is open is the caller's, to commit or roll back.
        if writes and db.in_transaction:
            await db.rollback()
        raise
    if writes and db.in_transaction:  # opened by Python's implicit-transaction mode
        await db.commit()
    return result


async def _plain_rows(db: aiosqlite.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    """Run one statement on a caller's connection; its rows as plain tuples whatever the
    connection's row factory, their text as ``str`` even if its text factory gives bytes (a
    ``_Counted`` statement: its one row of counts)."""
    if type(sql) is _Counted:  # see _Counted
        return await _plain_rows(db, f"{sql} RETURNING 1, rowid", params) or [(0, None)]
    if db.row_factory is None:
        rows = list(await db.execute_fetchall(sql, params))
    else:
        async with db.execute(sql, params) as cursor:
            cursor.row_factory = None  # a cursor's own: the caller's connection keeps theirs
            rows = list(await cursor.fetchall())
    if db.text_factory is not str:
        rows = [tuple(_text(value) for value in row) for row in rows]
    return rows


def _text(value: Any) -> Any:
    # The store's tables hold no blobs: bytes are text a text factory left undecoded.
    return value.decode() if isinstance(value, bytes) else value


# -- connections ---------------------------------------------------------------------------


def _connect(path: str) -> sqlite3.Connection:
    """Open the store's own connection: autocommit, busy timeout, WAL-safe sync level."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_SECONDS)
    try:
        # In WAL mode NORMAL syncs at checkpoints, not at every commit: a committed
        # transaction is in the WAL file (the OS page cache) when COMMIT returns, so it
        # survives the process being killed; only an OS crash or power cut can drop the latest.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA temp_store = MEMORY")
    except BaseException:
        conn.close()
        raise
    return conn


def _connect_read_only(path: str) -> sqlite3.Connection:
    """Open ``path`` to read only, creating nothing; ``immutable`` if its WAL index cannot be
    made (see the module docstring)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no SQLite journal at {path}")
    uri = Path(path).as_uri()
    conn = _connect_uri(f"{uri}?mode=ro")
    try:
        # The first read opens the WAL index: where it cannot be made, this fails.
        conn.execute("SELECT count(*) FROM sqlite_schema").fetchall()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if _error_code(exc) not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
            raise
    with contextlib.suppress(OSError):
        if os.path.getsize(f"{path}-wal"):
            logger.warning(
                "reading %s immutable: its WAL index cannot be created here, so what its "
                "-wal file holds (a writer's work not yet folded in) is not seen",
                path,
            )
    return _connect_uri(f"{uri}?immutable=1")


def _connect_uri(uri: str) -> sqlite3.Connection:
    return sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_SECONDS)


# -- operations: each a generator of statements, run whole by ``_run_here`` or ``_run_given`` -


def _statement(sql: str, params: Sequence[Any] = ()) -> Statements[list[Any]]:
    """One statement; its rows."""
    return (yield sql, params)


def _wal_mode() -> Statements[list[Any]]:
    """Switch the file to WAL mode."""
    return (yield "PRAGMA journal_mode = WAL", ())


def _write_transaction(body: Statements[T]) -> Statements[T]:
    """``body`` holding SQLite's write lock (``BEGIN IMMEDIATE``), then committed; the runners
    roll back a failure."""
    yield "BEGIN IMMEDIATE", ()
    result = yield from body
    yield "COMMIT", ()
    return result


def _append_one(event: PendingEvent) -> Statements[Written]:
    """Append one event in one statement."""
    ((seq,),) = yield _APPEND_ONE_SQL, _row(event)
    return Written([seq])


def _written(write: Write, book: bool) -> Statements[Written]:
    """Store ``write`` (in a write transaction), its rows booked if ``book`` (see
    ``_insert_numbered``)."""
    if write.batch_id is not None:
        ((recorded, n),) = yield _RECORD_BATCH, (write.batch_id,)
        if not recorded:
            return Written([], repeated=True)
        if n % BATCH_IDS_PRUNED_EVERY == 0:
            yield _FORGET_OLD_BATCHES, (n - BATCH_IDS_KEPT,)
    if write.if_absent:
        (event,) = write.events
        key = (event.thread_id, event.run_id, event.event_type, event.user_id)
        found = yield _FIRST_OF_TYPE_SQL, key
        if found:
            return Written([], found=_records(found)[0])
    seqs = yield from _insert_numbered(write.events, book)
    for summary in write.summaries:
        ((changed, _),) = yield _UPSERT_SUMMARY, _summary_params(summary)
        if not changed:
            raise other_users_summary_error(summary)
    return Written(seqs)


def _delete_rows(thread_id: str, where: str, params: list[Any]) -> Statements[int]:
    """Delete the matching events and summaries (in a write transaction); how many events."""
    yield f"DELETE FROM run_events WHERE {where}", params
    ((deleted,),) = yield "SELECT changes()", ()
    yield f"DELETE FROM run_summaries WHERE {where}", params
    yield "DELETE FROM run_message_counts WHERE thread_id = ? AND messages = 0", (thread_id,)
    return deleted


# -- statements ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _insert_numbered_sql(rows: int, booked: bool) -> str:
    """An INSERT of ``rows`` events whose seq is given, ``booked`` (their counters kept by
    ``_bookings``) or not (kept, and their seq checked, by the trigger)."""
    mark = "1" if booked else "NULL"
    row = f"(?, {mark}, {', '.join(_placeholder(i) for i in range(1, _PARAMS_PER_EVENT + 1))})"
    return (
        f"INSERT INTO run_events (seq, booked, {_BATCH_COLUMNS}) VALUES {', '.join([row] * rows)}"
    )


def _insert_numbered(events: list[PendingEvent], book: bool) -> Statements[list[int]]:
    """Insert ``events`` numbered on from each thread's counter; their seqs. If ``book``, and
    ``_bookings`` needs few enough statements, they are booked rows kept by those statements.

    Run inside a write transaction, which keeps the counters read here current. Rows numbered
    here cost SQLite a third less than rows numbered in SQL (which needs temporary tables).
    """
    if not events:
        return []
    threads = list(dict.fromkeys(event.thread_id for event in events))
    before = dict.fromkeys(threads, 0)
    if len(threads) == 1:  # most batches: no JSON list to build and walk
        found = yield _LAST_SEQ_SQL, (threads[0],)
        if found:
            before[threads[0]] = found[0][0]
    else:
        found = yield _LAST_SEQS_SQL, (encode_json(threads),)
        for index, last_seq in found:
            before[threads[index]] = last_seq
    last = dict(before)
    seqs = []
    for event in events:
        seq = last[event.thread_id] = last[event.thread_id] + 1
        seqs.append(seq)
    bookings = _bookings(events, seqs, before, last) if book else None
    for start in range(0, len(events), ROWS_PER_STATEMENT):
        chunk = slice(start, start + ROWS_PER_STATEMENT)
        rows = events[chunk]
        sql = _insert_numbered_sql(len(rows), bookings is not None)
        yield sql, _numbered_params(rows, seqs[chunk])
    if bookings is not None:
        # Not yield from: the runner sends each statement's rows, which a list cannot take.
        for booking in bookings:  # noqa: UP028
            yield booking
    return seqs


def _bookings(
    events: list[PendingEvent], seqs: list[int], before: dict[str, int], after: dict[str, int]
) -> list[tuple[str, tuple[Any, ...]]] | None:
    """The statements that do for booked rows what the insert trigger does for others, one per
    thread and key (and run) instead of several per row: move each thread's seq counter from
    ``before`` to ``after``, count its messages, and move its ``run_threads`` rows on.

    None if that takes more than a statement per two rows (a batch of many threads, users or
    runs): each costs about what the trigger does for two rows, so those rows are its.
    ``events`` is not empty (``_insert_numbered`` returns first)."""
    limit = len(events) // 2
    count = len(after)
    if count > limit:
        return None
    messages: dict[tuple[str, str], int] = {}
    # (user_key, thread_id) -> {run: its last row's (seq, created_at)}, runs in the order of
    # their last rows: booking them in that order leaves the row on the batch's last row.
    last_rows: dict[tuple[str, str], dict[str, tuple[int, str]]] = {}
    # Rows come in stretches of one thread, run and user (a whole batch, mostly): each stretch
    # is counted once, at its last row, with its messages (in_stretch).
    in_stretch = 0
    for event, seq, following in zip(events, seqs, [*events[1:], None], strict=True):
        if event.category == "message":
            in_stretch += 1
        run = event.run_id
        if (
            following is not None
            and following.run_id == run
            and following.thread_id == event.thread_id
            and following.user_id == event.user_id
        ):
            continue
        thread, user = event.thread_id, event.user_id
        if in_stretch:
            key = (thread, "" if user is None else user)
            found = messages.get(key)
            if found is None:
                count += 1
            messages[key] = in_stretch if found is None else found + in_stretch
            in_stretch = 0
        for user_key in ("",) if user is None else ("", user):
            runs = last_rows.setdefault((user_key, thread), {})
            if runs.pop(run, None) is None:
                count += 1
            runs[run] = (seq, event.created_at)
        if count > limit:
            return None
    bookings: list[tuple[str, tuple[Any, ...]]] = [
        (_BOOK_SEQ, (thread, last_seq)) for thread, last_seq in after.items()
    ]
    bookings += [
        (_BOOK_MESSAGES, (thread, user_key, messages_in_batch))
        for (thread, user_key), messages_in_batch in messages.items()
    ]
    for (user_key, thread), runs in last_rows.items():
        sql = _BOOK_USER_THREAD if user_key else _BOOK_THREAD
        bookings += [
            (sql, (user_key, thread, seq, created_at, run, before[thread]))
            for run, (seq, created_at) in runs.items()
        ]
    return bookings


def _numbered_params(events: Iterable[PendingEvent], seqs: Iterable[int]) -> list[Any]:
    """Each event's seq, then its columns: the parameters of ``_insert_numbered_sql``."""
    params: list[Any] = []
    for event, seq in zip(events, seqs, strict=True):
        params.append(seq)
        params += _row(event)
    return params


def _row(event: PendingEvent) -> tuple[Any, ...]:
    """``event.columns()`` as bound here: a nullable column's None as 0 (see ``_placeholder``)."""
    # Spelled out: rebuilding columns()'s tuple generically costs 4.6k instructions an event,
    # nearly all that binding 0 saves.
    user_id, task_id, caller = event.user_id, event.task_id, event.caller
    return (
        event.thread_id,
        event.run_id,
        event.event_type,
        event.category,
        event.content_json,
        event.metadata_json,
        event.created_at,
        0 if user_id is None else user_id,
        0 if task_id is None else task_id,
        0 if caller is None else caller,
    )


def _summary_params(summary: dict[str, Any]) -> tuple[Any, ...]:
    """A summary's row as ``_UPSERT_SUMMARY`` binds it (no user: 0, see ``_placeholder``)."""
    user_id = summary["user_id"]
    return (
        summary["thread_id"],
        summary["run_id"],
        0 if user_id is None else user_id,
        encode_json(summary),
    )


def _in_list(values: Sequence[str], params: list[Any]) -> str:
    """Return the right side of an ``IN`` over ``values``, adding its parameters."""
    distinct = list(dict.fromkeys(values))
    if len(distinct) <= _MAX_IN_PLACEHOLDERS:
        params.extend(distinct)
        return f"({', '.join('?' * len(distinct))})"
    params.append(encode_json(distinct))
    return "(SELECT value FROM json_each(?))"


def _filter_user(where: list[str], params: list[Any], user_id: str | None, *, by_run: bool) -> None:
    if user_id is None:
        return
    # Unary + keeps a run query on its run index rather than the per-user one.
    where.append("+user_id = ?" if by_run else "user_id = ?")
    params.append(user_id)


def _records(rows: Iterable[Sequence[Any]]) -> list[RunEvent]:
    """The records of rows of ``_COLUMNS``."""
    return [
        make_record(
            thread, run, seq, type_, category, decode_json(content), decode_json(meta), at, user
        )
        for thread, run, seq, type_, category, content, meta, at, user in rows
    ]
