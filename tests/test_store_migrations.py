"""Schema migrations, the same on every SQL backend: a database of any earlier schema version
upgrades and keeps its rows, one newer than the code is refused, a current one opens without
the migration lock."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import psycopg
import pytest

from deerflow_journal import RunSummary
from deerflow_journal.stores.postgres import _SCHEMA as POSTGRES_SCHEMA
from deerflow_journal.stores.postgres import _SETUP_LOCK_KEY
from deerflow_journal.stores.sqlite_schema import SCHEMA as SQLITE_SCHEMA
from tests.backends import BACKENDS, Backend

T = "thread-1"
SQL_BACKENDS = {b.name: b for b in BACKENDS if b.name in ("sqlite", "postgres")}
CREATED_AT = "2026-01-02T03:04:05.000000+00:00"
SCHEMAS = {"sqlite": SQLITE_SCHEMA, "postgres": POSTGRES_SCHEMA}


@contextlib.asynccontextmanager
async def bound(name: str, tmp_path, request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    backend = SQL_BACKENDS[name](tmp_path, request)
    try:
        yield backend
    finally:
        await backend.cleanup()


@pytest.fixture(params=[pytest.param(name, marks=b.marks) for name, b in SQL_BACKENDS.items()])
async def sql_backend(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Backend]:
    """A SQL backend (SQLite or PostgreSQL), bound to a location private to this test."""
    async with bound(request.param, tmp_path, request) as backend:
        yield backend


@pytest.fixture(
    params=[
        pytest.param((name, version), marks=SQL_BACKENDS[name].marks, id=f"{name}-v{version}")
        for name, schema in SCHEMAS.items()
        for version in range(schema.version)
    ]
)
async def earlier_schema(
    request: pytest.FixtureRequest, tmp_path
) -> AsyncIterator[tuple[Backend, Raw, int]]:
    """A SQL backend's location, a plain connection to it, and one of its earlier schema
    versions (not built yet)."""
    name, version = request.param
    async with bound(name, tmp_path, request) as backend:
        with contextlib.closing(Raw(backend)) as raw:
            yield backend, raw, version


class Raw:
    """A plain connection to a backend's location, under the store (placeholders are ``?``)."""

    def __init__(self, backend: Backend) -> None:
        self.postgres = backend.name == "postgres"
        self.schema = SCHEMAS[backend.name]
        self.conn: Any
        if self.postgres:
            self.conn = psycopg.connect(backend.dsn, autocommit=True)
        else:
            self.conn = sqlite3.connect(backend.tmp_path / "journal.db", isolation_level=None)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        if self.postgres:
            cursor = self.conn.execute(sql.replace("?", "%s"), params or None)
            return cursor.fetchall() if cursor.description else []
        return self.conn.execute(sql, params).fetchall()

    def has_table(self, name: str) -> bool:
        if self.postgres:
            return self.rows("SELECT to_regclass(?) IS NOT NULL", (name,))[0][0]
        return bool(self.rows("SELECT 1 FROM sqlite_schema WHERE name = ?", (name,)))

    def build(self, version: int) -> None:
        """Make the schema of ``version`` as the store of that time did: migrations 0 to it."""
        self.rows(self.schema.create_table)
        for v in range(version + 1):
            for statement in self.schema.migrations[v]:
                self.rows(statement)
            self.rows(self.schema.record_version, (v,))

    def versions(self) -> list[int]:
        return [v for (v,) in self.rows("SELECT v FROM run_event_migrations ORDER BY v")]

    @contextlib.contextmanager
    def holding_the_migration_lock(self) -> Iterator[None]:
        """Hold what a migration waits for: SQLite's write lock, PostgreSQL's advisory lock."""
        if self.postgres:
            self.rows(f"SELECT pg_advisory_lock({_SETUP_LOCK_KEY})")
            try:
                yield
            finally:
                self.rows(f"SELECT pg_advisory_unlock({_SETUP_LOCK_KEY})")
        else:
            self.rows("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                self.rows("ROLLBACK")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def raw(sql_backend: Backend) -> Iterator[Raw]:
    """A plain connection to the backend's location."""
    opened = Raw(sql_backend)
    try:
        yield opened
    finally:
        opened.close()


# (seq, event_type, category, user_id, content JSON, metadata JSON) of the rows an old store
# wrote to thread T, run r1.
OLD_ROWS = [
    (1, "llm.human.input", "message", "alice", '{"text": "hi"}', '{"task_id": "k"}'),
    (2, "llm.ai.response", "message", None, '"ok"', '{"caller": "lead_agent"}'),
    (3, "run.end", "trace", "alice", "{}", "{}"),
]
OLD_SUMMARY = RunSummary(thread_id=T, run_id="r1", user_id="alice", status="success")


def rows_fit(raw: Raw, version: int) -> bool:
    """Whether rows written at ``version`` can be upgraded. No store ever left a database
    where they cannot: those versions shipped with later ones, applied in one transaction."""
    if not raw.postgres:
        return True
    # Before 6 there are no seq counters; at 12 and 13 the insert trigger counts messages that
    # the backfill of 14 counts again.
    return 6 <= version <= 11 or version >= 14


def write_old_rows(raw: Raw, version: int) -> tuple[bool, bool]:
    """Write ``OLD_ROWS`` and, where the schema has summaries, ``OLD_SUMMARY``, as a store of
    ``version`` did; whether it wrote each."""
    if not rows_fit(raw, version):
        return False, False
    for seq, event_type, category, user_id, content, metadata in OLD_ROWS:
        raw.rows(
            "INSERT INTO run_events (thread_id, run_id, seq, event_type, category, content, "
            "metadata, created_at, user_id, task_id) VALUES (?, 'r1', ?, ?, ?, ?, ?, ?, ?, ?)",
            (T, seq, event_type, category, content, metadata, CREATED_AT, user_id,
             "k" if "task_id" in metadata else None),
        )  # fmt: skip
    if raw.postgres:  # SQLite's trigger keeps the counter; PostgreSQL's store did
        raw.rows("INSERT INTO run_thread_seq (thread_id, last_seq) VALUES (?, 3)", (T,))
    if not raw.has_table("run_summaries"):
        return True, False
    column = "data" if raw.postgres else "summary"
    raw.rows(
        f"INSERT INTO run_summaries (thread_id, run_id, user_id, {column}) "
        "VALUES (?, 'r1', 'alice', ?)",
        (T, OLD_SUMMARY.model_dump_json()),
    )
    return True, True


def ev(run_id: str = "r2", category: str = "message") -> dict[str, Any]:
    return {"thread_id": T, "run_id": run_id, "event_type": "e", "category": category}


async def test_a_database_of_every_earlier_schema_version_upgrades_and_reads_back(
    earlier_schema: tuple[Backend, Raw, int],
):
    sql_backend, raw, earlier_version = earlier_schema
    raw.build(earlier_version)
    written, summary_written = write_old_rows(raw, earlier_version)
    # A read-only store never migrates: it says so and leaves the database as it was.
    with pytest.raises(RuntimeError, match=f"journal schema version {earlier_version}, not"):
        await sql_backend.make(read_only=True).setup()
    assert raw.versions() == list(range(earlier_version + 1))

    async with sql_backend.make() as store:
        events = await store.list_events(T, "r1", user_id=None)
        if written:
            assert [
                (e["seq"], e["event_type"], e["category"], e["user_id"], e["created_at"])
                for e in events
            ] == [(seq, t, c, u, CREATED_AT) for seq, t, c, u, _, _ in OLD_ROWS]
            assert [e["content"] for e in events] == [{"text": "hi"}, "ok", {}]
            assert events[1]["metadata"] == {"caller": "lead_agent"}
            assert [e["seq"] for e in await store.list_events(T, "r1", task_id="k")] == [1]
            assert await store.count_messages(T, user_id=None) == 2
            assert await store.count_messages(T, user_id="alice") == 1
            old_summary = await store.get_run_summary(T, "r1", user_id=None)
            assert old_summary == (OLD_SUMMARY if summary_written else None)
        else:
            assert events == []
        first = 4 if written else 1
        assert (await store.put(**ev()))["seq"] == first
        summary = RunSummary(thread_id=T, run_id="r2")
        summaries = [summary.to_json_dict()]
        assert await store._put_journal_batch([ev(), ev()], summaries, batch_id="b1")
        assert not await store._put_journal_batch([ev()], summaries, batch_id="b1")
        assert [e["seq"] for e in await store.list_events(T, "r2")] == [first, first + 1, first + 2]
        assert await store.count_messages(T, user_id=None) == (2 if written else 0) + 3
        assert await store.get_run_summary(T, "r2") == summary
    assert raw.versions() == list(range(raw.schema.version + 1))


async def test_a_database_newer_than_the_code_is_refused_alike(sql_backend: Backend, raw: Raw):
    async with sql_backend.make() as store:
        await store.put(**ev())
    latest = raw.schema.version
    raw.rows(raw.schema.record_version, (latest + 1,))
    for read_only in (False, True):
        with pytest.raises(
            RuntimeError,
            match=rf"has journal schema version {latest + 1}, newer than version {latest} that "
            r"this deerflow-journal knows: upgrade deerflow-journal",
        ):
            await sql_backend.make(read_only=read_only).setup()
    assert raw.versions() == list(range(latest + 2))


async def test_a_current_schema_opens_while_another_session_holds_the_migration_lock(
    sql_backend: Backend, raw: Raw
):
    # Setting up a current schema takes no lock and runs no DDL: a reopened journal store or
    # a role that may only read never waits for (or needs) what a migration holds.
    async with sql_backend.make() as store:
        await store.put(**ev())
    with raw.holding_the_migration_lock():
        for read_only in (False, True):
            async with sql_backend.make(read_only=read_only) as store:
                assert await store.count_messages(T) == 1
