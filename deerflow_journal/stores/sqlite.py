"""``SqliteRunEventStore``: the default backend, one SQLite file shared by many processes.

Seq assignment lives in the database. A write takes SQLite's write lock (``BEGIN IMMEDIATE``,
or the single statement of a one-event ``put``) before it reads each thread's counter in
``run_thread_seq``, so concurrent writers in other processes queue on the busy timeout instead
of reading the same counter; it then inserts its rows numbered on from that counter. A trigger
moves the counter with every row and refuses a row whose seq does not follow it, so seq stays
unique, gap-free and never reused (deletes leave the counter alone), whoever writes. Triggers
also keep per-thread, per-user message counts, so ``count_messages`` does not grow with the
thread. On the store's own connection an append is one call on aiosqlite's worker thread (one
round trip), however many statements it runs, and a journal's write (events and run
summaries) is one transaction. A caller's connection in implicit-transaction mode,
``put_if_absent`` and deletes take the statement-by-statement path, numbering rows in SQL.

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
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

import aiosqlite

from deerflow_journal.records import (
    DEFAULT_MAX_TRACE_CONTENT,
    PendingEvent,
    RunEvent,
    decode_json,
    encode_json,
)
from deerflow_journal.stores.base import (
    AI_RESPONSE_EVENT_TYPES,
    BATCH_IDS_KEPT,
    MessagePage,
    RunEventStore,
)
from deerflow_journal.stores.sqlite_schema import MIGRATIONS, SCHEMA_VERSION
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
#: Events per INSERT statement that numbers its rows in SQL (``_append_sql``); a larger batch
#: is split into several in one transaction.
ROWS_PER_STATEMENT = _MAX_VARIABLES // _PARAMS_PER_EVENT
# Events per INSERT of rows numbered in Python (their seq is one more parameter each).
_NUMBERED_ROWS_PER_STATEMENT = _MAX_VARIABLES // (_PARAMS_PER_EVENT + 1)
# Longer IN lists go through one JSON parameter instead of one placeholder per value.
_MAX_IN_PLACEHOLDERS = 64

_COLUMNS = "thread_id, run_id, seq, event_type, category, content, metadata, created_at, user_id"
_BATCH_COLUMNS = (
    "thread_id, run_id, event_type, category, content, metadata, created_at, user_id, "
    "task_id, caller"
)
_AI_TYPES = ", ".join(f"'{t}'" for t in AI_RESPONSE_EVENT_TYPES)
# The one-event form of ``_append_sql``: a plain VALUES row is cheaper to run than a CTE.
_APPEND_ONE_SQL = (
    f"INSERT INTO run_events (seq, {_BATCH_COLUMNS}) VALUES ("
    "coalesce((SELECT last_seq FROM run_thread_seq WHERE thread_id = ?1), 0) + 1, "
    f"{', '.join(f'?{i}' for i in range(1, _PARAMS_PER_EVENT + 1))}) RETURNING thread_id, seq"
)
# Another user's summary is left alone: the statement then changes (and returns) no row.
_UPSERT_SUMMARY_QUIETLY = (
    "INSERT INTO run_summaries (thread_id, run_id, user_id, summary) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (thread_id, run_id) DO UPDATE SET summary = excluded.summary "
    "WHERE run_summaries.user_id IS excluded.user_id"
)
_UPSERT_SUMMARY = f"{_UPSERT_SUMMARY_QUIETLY} RETURNING id"
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
            writes commit on it, so do not hand in a connection holding uncommitted work.
        max_trace_content: byte limit of trace-category content (``None``: no limit).
        read_only: only read: writes are refused, nothing is created or migrated, and the
            file may be on storage this process cannot write (see the module docstring).
    """

    def __init__(
        self,
        path_or_conn: str | os.PathLike[str] | aiosqlite.Connection,
        *,
        max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
        read_only: bool = False,
    ) -> None:
        super().__init__(max_trace_content=max_trace_content, read_only=read_only)
        self._path: str | None
        self._db: aiosqlite.Connection | None
        if isinstance(path_or_conn, aiosqlite.Connection):
            self._path, self._db = None, path_or_conn
        elif isinstance(path_or_conn, str | os.PathLike):
            path = os.fspath(path_or_conn)
            # Fixed now: the store reopens its file after close(), and a relative path must
            # not follow a chdir made meanwhile (the journal would go on in another file).
            self._path = path if path in ("", ":memory:") else os.path.abspath(path)
            self._db = None
        else:
            raise TypeError(
                "SqliteRunEventStore needs a path or an aiosqlite.Connection, "
                f"got {type(path_or_conn).__name__}"
            )
        self._transaction_lock = asyncio.Lock()

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
        self._transaction_lock = asyncio.Lock()  # one per opening: each may be in another loop
        if sqlite3.sqlite_version_info < _MIN_SQLITE:
            raise RuntimeError(
                f"SqliteRunEventStore needs SQLite 3.35 or newer; this Python links "
                f"{sqlite3.sqlite_version}: upgrade Python or use another store"
            )
        if self._db is None:
            path = self._path or ""
            self._db = await (_open_read_only(path) if self.read_only else _open(path))
        try:
            await (self._check_schema() if self.read_only else self._migrate())
        except BaseException:
            await self._close()
            raise

    async def _close(self) -> None:
        if self._path is not None and self._db is not None:
            db, self._db = self._db, None
            await db.close()

    async def _migrate(self) -> None:
        db = self._conn
        if db.in_transaction:
            await db.commit()
        await _use_wal(db)
        async with self._transaction():
            await self._submit(
                _rows,
                "CREATE TABLE IF NOT EXISTS run_event_migrations "
                "(v INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
            )
            rows = await self._submit(_rows, "SELECT max(v) FROM run_event_migrations")
            current = -1 if rows[0][0] is None else rows[0][0]
            if current > SCHEMA_VERSION:
                raise _newer_schema_error(current)
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    await self._submit(_rows, statement)
                await self._submit(
                    _rows,
                    "INSERT INTO run_event_migrations (v, applied_at) VALUES (?, ?)",
                    (version, datetime.now(UTC).isoformat()),
                )

    async def _check_schema(self) -> None:
        """A read-only store's setup: the schema must be there and current, as it is read."""
        rows = await self._fetch("SELECT 1 FROM sqlite_schema WHERE name = 'run_event_migrations'")
        if rows:
            rows = await self._fetch("SELECT max(v) FROM run_event_migrations")
        current = -1 if not rows or rows[0][0] is None else rows[0][0]
        if current > SCHEMA_VERSION:
            raise _newer_schema_error(current)
        if current < SCHEMA_VERSION:
            found = "no journal schema" if current < 0 else f"schema version {current}"
            raise RuntimeError(
                f"the SQLite database {self._path or '(a given connection)'} has {found}, not "
                f"version {SCHEMA_VERSION}: open it once without read_only to create or migrate it"
            )

    # -- plumbing ----------------------------------------------------------------------------

    @property
    def _conn(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("the store is closed; use `await store.setup()` to reopen it")
        return self._db

    def _submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queue ``fn(sqlite3_connection, *args)`` on aiosqlite's worker thread; its future.

        Several statements in one call are one round trip. This is what aiosqlite's private
        ``_execute`` does, minus the coroutine around the future: the caller may shield the
        future without a task, and the call runs to its end even if nobody waits for it.
        Every statement of the store goes through here, so it reads plain rows whatever
        factories a caller's connection has (see ``_plainly``).
        """
        db = self._conn
        if not db._running or db._connection is None:
            raise ValueError("the store's connection is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        db._tx.put_nowait((future, functools.partial(_plainly, fn, db._connection, *args)))
        return future

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement in one round trip, after any transaction another task holds."""
        if self._transaction_lock.locked():
            async with self._transaction_lock:
                return await self._submit(_rows, sql, params)
        return await self._submit(_rows, sql, params)

    async def _write(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one write statement, committed when it returns."""
        db = self._conn
        if db.isolation_level is None:  # autocommit: the statement commits itself
            return await self._fetch(sql, params)
        # A caller's connection in Python's implicit-transaction mode may open a transaction
        # for the statement: commit it before any other task's statement can join it.
        async with self._transaction_lock:
            rows = await self._submit(_rows, sql, params)
            if db.in_transaction:
                await db.commit()
            return rows

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """Hold SQLite's write lock (``BEGIN IMMEDIATE``) for several statements."""
        async with self._transaction_lock:
            db = self._conn
            if db.in_transaction:
                await db.commit()
            begin = self._submit(_begin_immediate)
            try:
                await asyncio.shield(begin)
            except BaseException:
                # Cancelled while BEGIN waits for the write lock: it still runs on the worker
                # thread, and would leave the file locked for every other process. A rollback
                # queued behind it undoes it, whatever other cancellations come.
                self._submit(_rollback_if_in_transaction).add_done_callback(_retrieve)
                raise
            try:
                yield db
            except BaseException:
                await db.rollback()
                raise
            await db.commit()

    # -- writes ------------------------------------------------------------------------------

    def _append(self, events: list[PendingEvent]) -> Awaitable[list[RunEvent]]:
        if self._conn.isolation_level is None and not self._transaction_lock.locked():
            # The whole write in one call on the worker thread, its records built there too:
            # one round trip, and a future the caller can shield without a task.
            return self._submit(_insert_events, events)
        return self._append_in_transaction(events)

    async def _append_in_transaction(self, events: list[PendingEvent]) -> list[RunEvent]:
        if len(events) <= ROWS_PER_STATEMENT:
            returned = await self._write(_append_sql(len(events)), _batch_params(events))
        else:
            returned = []
            async with self._transaction():
                for start in range(0, len(events), ROWS_PER_STATEMENT):
                    chunk = events[start : start + ROWS_PER_STATEMENT]
                    rows = await self._submit(_rows, _append_sql(len(chunk)), _batch_params(chunk))
                    returned.extend(rows)
        return _numbered(events, returned)

    async def _append_with_summaries(
        self,
        events: list[PendingEvent],
        summaries: list[dict[str, Any]],
        batch_id: str | None = None,
    ) -> bool:
        async with self._transaction_lock:  # its BEGIN must not join another task's transaction
            return await self._submit(_write_journal_batch, events, summaries, batch_id)

    async def _append_if_absent(self, event: PendingEvent) -> tuple[RunEvent, bool]:
        while True:
            returned = await self._write(_append_sql(1, if_absent=True), _batch_params([event]))
            if returned:
                return _numbered([event], returned)[0], True
            key = (event.thread_id, event.run_id, event.event_type, event.user_id)
            rows = await self._fetch(_FIRST_OF_TYPE_SQL, key)
            if rows:  # else it was deleted in between: try again
                return _record(rows[0]), False

    async def _delete(self, thread_id: str, run_id: str | None, user_id: str | None) -> int:
        where, params = "thread_id = ?", [thread_id]
        if run_id is not None:
            where, params = where + " AND run_id = ?", [*params, run_id]
        if user_id is not None:
            where, params = where + " AND user_id = ?", [*params, user_id]
        async with self._transaction():
            deleted = await self._submit(_rowcount, f"DELETE FROM run_events WHERE {where}", params)
            await self._submit(_rows, f"DELETE FROM run_summaries WHERE {where}", params)
            await self._submit(
                _rows,
                "DELETE FROM run_message_counts WHERE thread_id = ? AND messages = 0",
                [thread_id],
            )
        return deleted

    # -- reads -------------------------------------------------------------------------------

    async def _list_messages(
        self, thread_id: str, run_id: str | None, page: MessagePage, user_id: str | None
    ) -> list[RunEvent]:
        if page.limit == 0:
            return []
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
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM run_events WHERE {' AND '.join(where)} "
            f"ORDER BY seq {order} LIMIT ?",
            (*params, page.limit),
        )
        if page.from_end:
            rows.reverse()
        return [_record(row) for row in rows]

    async def _list_events(
        self,
        thread_id: str,
        run_id: str,
        event_types: tuple[str, ...] | None,
        task_id: str | None,
        limit: int,
        after_seq: int | None,
        user_id: str | None,
    ) -> list[RunEvent]:
        if limit == 0:
            return []
        where: list[str] = ["thread_id = ?", "run_id = ?"]
        params: list[Any] = [thread_id, run_id]
        if event_types is not None:
            where.append(f"event_type IN {_in_list(event_types, params)}")
        if task_id is not None:
            where.append("task_id = ?")
            params.append(task_id)
        _filter_user(where, params, user_id, by_run=True)
        if after_seq is not None:
            where.append("seq > ?")
            params.append(after_seq)
        rows = await self._fetch(
            f"SELECT {_COLUMNS} FROM run_events WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
            (*params, limit),
        )
        return [_record(row) for row in rows]

    async def _last_visible_ai_seq_by_run(
        self, thread_id: str, run_ids: list[str], user_id: str | None
    ) -> dict[str, int]:
        where = [
            "thread_id = ?",
            "run_id = runs.value",
            "category = 'message'",
            f"event_type IN ({_AI_TYPES})",
            "(caller IS NULL OR caller NOT GLOB 'middleware:*')",
        ]
        params: list[Any] = [thread_id]
        _filter_user(where, params, user_id, by_run=True)
        rows = await self._fetch(
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
        rows = await self._fetch(
            f"SELECT coalesce(sum(messages), 0) FROM run_message_counts WHERE {where}", params
        )
        return int(rows[0][0])

    # -- run summaries -----------------------------------------------------------------------

    async def _put_run_summary(self, summary: dict[str, Any]) -> None:
        if not await self._write(_UPSERT_SUMMARY, _summary_params(summary)):
            raise other_users_summary_error(summary)

    async def _get_run_summary(
        self, thread_id: str, run_id: str, user_id: str | None
    ) -> dict[str, Any] | None:
        where, params = ["thread_id = ?", "run_id = ?"], [thread_id, run_id]
        _filter_user(where, params, user_id, by_run=True)
        rows = await self._fetch(
            f"SELECT summary FROM run_summaries WHERE {' AND '.join(where)}", params
        )
        return decode_json(rows[0][0]) if rows else None

    async def _list_run_summaries(
        self, thread_id: str, user_id: str | None
    ) -> list[dict[str, Any]]:
        where, params = ["thread_id = ?"], [thread_id]
        _filter_user(where, params, user_id, by_run=False)
        rows = await self._fetch(
            f"SELECT summary FROM run_summaries WHERE {' AND '.join(where)} ORDER BY id", params
        )
        return [decode_json(row[0]) for row in rows]


# -- connections ---------------------------------------------------------------------------


async def _open(path: str) -> aiosqlite.Connection:
    """Open the store's own connection: autocommit, busy timeout, WAL-safe sync level."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = await _daemon_connection(path)
    try:
        # In WAL mode NORMAL syncs at checkpoints, not at every commit: a committed
        # transaction is in the WAL file (the OS page cache) when COMMIT returns, so it
        # survives the process being killed; only an OS crash or power cut can drop the latest.
        await db.execute_fetchall("PRAGMA synchronous = NORMAL")
        await db.execute_fetchall("PRAGMA temp_store = MEMORY")
    except BaseException:
        await db.close()
        raise
    return db


async def _open_read_only(path: str) -> aiosqlite.Connection:
    """Open ``path`` to read only, creating nothing; ``immutable`` if its WAL index cannot be
    made (see the module docstring)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no SQLite journal at {path}")
    uri = Path(path).as_uri()
    db = await _daemon_connection(f"{uri}?mode=ro", uri=True)
    try:
        # The first read opens the WAL index: where it cannot be made, this fails.
        await db.execute_fetchall("SELECT count(*) FROM sqlite_schema")
        return db
    except sqlite3.OperationalError as exc:
        await db.close()
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None or code & 0xFF not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
            raise
    with contextlib.suppress(OSError):
        if os.path.getsize(f"{path}-wal"):
            logger.warning(
                "reading %s immutable: its WAL index cannot be created here, so what its "
                "-wal file holds (a writer's work not yet folded in) is not seen",
                path,
            )
    return await _daemon_connection(f"{uri}?immutable=1", uri=True)


def _newer_schema_error(current: int) -> RuntimeError:
    return RuntimeError(
        f"the journal database has schema version {current}, newer than this "
        f"deerflow-journal knows ({SCHEMA_VERSION}): upgrade deerflow-journal"
    )


async def _use_wal(db: aiosqlite.Connection) -> None:
    """Switch the file to WAL mode (kept in the file; a no-op once it is).

    While another connection holds the write lock, SQLite refuses the switch at once instead
    of waiting for the busy timeout (it could deadlock otherwise): retry until that timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    delay = 0.005
    while True:
        try:
            await db.execute_fetchall("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)  # extended: the low byte is BUSY
            if code is None or code & 0xFF != sqlite3.SQLITE_BUSY or time.monotonic() > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


def _daemon_connection(path: str, *, uri: bool = False) -> aiosqlite.Connection:
    """Build an aiosqlite connection whose worker thread cannot keep the interpreter alive.

    A thread inherits ``daemon`` from the thread that creates it, and aiosqlite creates its
    worker thread when the connection object is built: so we build it in a daemon thread.
    """
    built: list[aiosqlite.Connection] = []

    def build() -> None:
        built.append(
            aiosqlite.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_SECONDS, uri=uri)
        )

    builder = threading.Thread(target=build, name="deerflow-journal-sqlite", daemon=True)
    builder.start()
    builder.join()
    return built[0]


def _begin_immediate(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")


def _rollback_if_in_transaction(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.rollback()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future nobody awaits as seen (its error, if any, is not worth a warning)."""
    if not future.cancelled():
        future.exception()


def _insert_events(conn: sqlite3.Connection, events: list[PendingEvent]) -> list[RunEvent]:
    """Append ``events`` (autocommit connection) and return their records (worker thread)."""
    if len(events) == 1:  # one statement, its own transaction
        return _numbered(events, conn.execute(_APPEND_ONE_SQL, _batch_params(events)).fetchall())
    with _write_transaction(conn):
        seqs = _insert_numbered(conn, events)
    return [event.record(seq) for event, seq in zip(events, seqs, strict=True)]


def _write_journal_batch(
    conn: sqlite3.Connection,
    events: list[PendingEvent],
    summaries: list[dict[str, Any]],
    batch_id: str | None,
) -> bool:
    """Append ``events`` and upsert ``summaries`` in one transaction (in aiosqlite's thread),
    unless ``batch_id`` was written already; False then."""
    if conn.in_transaction:
        conn.commit()
    with _write_transaction(conn):
        if batch_id is not None:
            if conn.execute(_RECORD_BATCH, (batch_id,)).rowcount == 0:
                return False
            conn.execute(_FORGET_OLD_BATCHES, (BATCH_IDS_KEPT,))
        _insert_numbered(conn, events)
        for summary in summaries:
            if conn.execute(_UPSERT_SUMMARY_QUIETLY, _summary_params(summary)).rowcount != 1:
                raise other_users_summary_error(summary)
    return True


_RECORD_BATCH = "INSERT OR IGNORE INTO run_journal_batches (batch_id) VALUES (?)"
_FORGET_OLD_BATCHES = "DELETE FROM run_journal_batches WHERE n <= last_insert_rowid() - ?"


@contextlib.contextmanager
def _write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Hold the write lock (``BEGIN IMMEDIATE``) on the worker thread; commit, or roll back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.rollback()
        raise
    conn.commit()


def _plainly(fn: Callable[..., T], conn: sqlite3.Connection, *args: Any) -> T:
    """Run ``fn(conn, *args)`` with the connection's row and text factories at the defaults.

    A caller's connection may have its own (dict rows, bytes text); the store reads tuples of
    str. Nothing else runs on aiosqlite's worker thread meanwhile, so nobody sees the swap.
    """
    saved = conn.row_factory, conn.text_factory
    conn.row_factory, conn.text_factory = None, str
    try:
        return fn(conn, *args)
    finally:
        conn.row_factory, conn.text_factory = saved


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    """Run one statement; its rows."""
    return conn.execute(sql, params).fetchall()


def _rowcount(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> int:
    """Run one statement; how many rows it changed."""
    return conn.execute(sql, params).rowcount


# -- statements ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _append_sql(rows: int, *, if_absent: bool = False) -> str:
    """The one statement that numbers and inserts ``rows`` events (returning their seq).

    ``base`` reads each thread's counter once, before any row is inserted (the trigger moves
    the counter as rows go in); ``row_number()`` then numbers each thread's rows in input order.
    """
    placeholders = ", ".join("?" * _PARAMS_PER_EVENT)
    values = ", ".join(f"({i}, {placeholders})" for i in range(rows))
    absent = (
        "WHERE NOT EXISTS (SELECT 1 FROM run_events WHERE run_events.thread_id = b.thread_id "
        "AND run_events.run_id = b.run_id AND run_events.event_type = b.event_type "
        "AND run_events.user_id IS b.user_id) "
        if if_absent
        else ""
    )
    return (
        f"WITH batch (i, {_BATCH_COLUMNS}) AS (VALUES {values}), "
        "base (thread_id, last_seq) AS MATERIALIZED ("
        "SELECT t.thread_id, coalesce(s.last_seq, 0) "
        "FROM (SELECT DISTINCT thread_id FROM batch) AS t "
        "LEFT JOIN run_thread_seq AS s ON s.thread_id = t.thread_id) "
        f"INSERT INTO run_events (seq, {_BATCH_COLUMNS}) "
        "SELECT base.last_seq + row_number() OVER (PARTITION BY b.thread_id ORDER BY b.i), "
        "b.thread_id, b.run_id, b.event_type, b.category, b.content, b.metadata, "
        "b.created_at, b.user_id, b.task_id, b.caller "
        f"FROM batch AS b JOIN base ON base.thread_id = b.thread_id {absent}"
        "ORDER BY b.i RETURNING thread_id, seq"
    )


@functools.lru_cache(maxsize=256)
def _insert_numbered_sql(rows: int) -> str:
    """An INSERT of ``rows`` events whose seq is given (the trigger still checks it)."""
    row = f"({', '.join('?' * (_PARAMS_PER_EVENT + 1))})"
    return f"INSERT INTO run_events (seq, {_BATCH_COLUMNS}) VALUES {', '.join([row] * rows)}"


def _insert_numbered(conn: sqlite3.Connection, events: list[PendingEvent]) -> list[int]:
    """Insert ``events`` numbered on from each thread's counter; return their seqs.

    Call inside a write transaction: the counters are read once, and rows numbered here cost
    SQLite a third less than rows numbered in SQL (``_append_sql`` needs temporary tables).
    """
    if not events:
        return []
    threads = list(dict.fromkeys(event.thread_id for event in events))
    found = conn.execute(_LAST_SEQS_SQL, (encode_json(threads),)).fetchall()
    last = dict.fromkeys(threads, 0)
    for index, last_seq in found:
        last[threads[index]] = last_seq
    seqs = []
    for event in events:
        seq = last[event.thread_id] = last[event.thread_id] + 1
        seqs.append(seq)
    for start in range(0, len(events), _NUMBERED_ROWS_PER_STATEMENT):
        chunk = slice(start, start + _NUMBERED_ROWS_PER_STATEMENT)
        rows = events[chunk]
        conn.execute(_insert_numbered_sql(len(rows)), _numbered_params(rows, seqs[chunk]))
    return seqs


def _numbered_params(events: Iterable[PendingEvent], seqs: Iterable[int]) -> list[Any]:
    """``_batch_params`` with each event's seq first."""
    params: list[Any] = []
    for event, seq in zip(events, seqs, strict=True):
        params.append(seq)
        params += _row(event)
    return params


def _batch_params(events: Iterable[PendingEvent]) -> list[Any]:
    params: list[Any] = []
    for event in events:
        params += _row(event)
    return params


def _row(e: PendingEvent) -> tuple[Any, ...]:
    """An event's values in ``_BATCH_COLUMNS`` order."""
    task_id = e.metadata.get("task_id")
    caller = e.metadata.get("caller")
    return (
        e.thread_id,
        e.run_id,
        e.event_type,
        e.category,
        e.content_json,
        e.metadata_json,
        e.created_at,
        e.user_id,
        task_id if isinstance(task_id, str) else None,
        caller if isinstance(caller, str) else None,
    )


def _summary_params(summary: dict[str, Any]) -> tuple[Any, ...]:
    return summary["thread_id"], summary["run_id"], summary["user_id"], encode_json(summary)


def _numbered(events: list[PendingEvent], returned: Iterable[Any]) -> list[RunEvent]:
    """Pair events with the seq the database gave them (RETURNING rows come in any order)."""
    next_seq: dict[str, int] = {}
    for thread_id, seq in returned:
        next_seq[thread_id] = min(seq, next_seq.get(thread_id, seq))
    records = []
    for event in events:
        seq = next_seq[event.thread_id]
        next_seq[event.thread_id] = seq + 1
        records.append(event.record(seq))
    return records


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


def _record(row: Sequence[Any]) -> RunEvent:
    return {
        "thread_id": row[0],
        "run_id": row[1],
        "seq": row[2],
        "event_type": row[3],
        "category": row[4],
        "content": decode_json(row[5]),
        "metadata": decode_json(row[6]),
        "created_at": row[7],
        "user_id": row[8],
    }
