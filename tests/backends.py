"""The store backends every behavioural test runs against.

Each backend is a ``Backend`` subclass bound to a fresh location (a temp dir, a database
schema); ``make()`` builds a store there, and several stores made by one backend share data
when the backend is persistent. Add a backend by adding a class to ``BACKENDS``.
"""

from __future__ import annotations

import functools
import os
import uuid
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import pytest

from deerflow_journal import (
    JsonlRunEventStore,
    MemoryRunEventStore,
    RunEventStore,
    SqliteRunEventStore,
)


class Backend:
    """A store backend bound to one test's private location."""

    name: ClassVar[str]
    #: Whether two stores made by ``make()`` see the same events.
    persistent: ClassVar[bool] = True
    #: pytest marks for every test that runs on this backend.
    marks: ClassVar[tuple[pytest.MarkDecorator, ...]] = ()

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.tmp_path = tmp_path
        self.request = request

    def make(self, **options: Any) -> RunEventStore:
        """Build a new (not yet set up) store at this backend's location."""
        raise NotImplementedError

    def url(self) -> str:
        """The ``open_store`` URL of this backend's location."""
        raise NotImplementedError

    async def cleanup(self) -> None:
        """Drop what the location holds (a database schema, say)."""


class MemoryBackend(Backend):
    name = "memory"
    persistent = False

    def make(self, **options: Any) -> RunEventStore:
        return MemoryRunEventStore(**options)

    def url(self) -> str:
        return "memory://"


class JsonlBackend(Backend):
    name = "jsonl"

    def make(self, **options: Any) -> RunEventStore:
        return JsonlRunEventStore(self.tmp_path / "jsonl", **options)

    def url(self) -> str:
        return f"jsonl:///{(self.tmp_path / 'jsonl').resolve()}"


class SqliteBackend(Backend):
    name = "sqlite"

    def make(self, **options: Any) -> RunEventStore:
        return SqliteRunEventStore(self.tmp_path / "journal.db", **options)

    def url(self) -> str:
        return f"sqlite:///{(self.tmp_path / 'journal.db').resolve()}"


PG_DSN_ENV = "DEERFLOW_JOURNAL_TEST_PG_DSN"
DEFAULT_PG_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


@functools.cache
def _pg_unreachable(dsn: str) -> str | None:
    """Why PostgreSQL at ``dsn`` cannot be used, or ``None`` when it answers."""
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return None


def pg_test_dsn() -> str:
    """The test server's DSN; skips the test if it is unreachable, fails it when CI=true."""
    dsn = os.environ.get(PG_DSN_ENV) or DEFAULT_PG_DSN
    problem = _pg_unreachable(dsn)
    if problem is not None:
        message = (
            f"PostgreSQL at {dsn} is unreachable ({problem}); set {PG_DSN_ENV} to the "
            "postgresql:// URL of a server where this user may create schemas"
        )
        skip_unless_ci(message)
    return dsn


def skip_unless_ci(message: str) -> None:
    """Skip the test for a missing outside part; in CI (``CI=true``), where every part must be
    there, fail it instead."""
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


class PostgresBackend(Backend):
    """A fresh schema per test on the test server, reached through ``search_path``."""

    name = "postgres"
    marks = (pytest.mark.postgres,)

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        super().__init__(tmp_path, request)
        import psycopg

        self.server_dsn = pg_test_dsn()
        self.schema = f"t_{uuid.uuid4().hex}"
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
        separator = "&" if urlsplit(self.server_dsn).query else "?"
        options = quote(f"-csearch_path={self.schema}", safe="")
        self.dsn = f"{self.server_dsn}{separator}options={options}"

    def make(self, **options: Any) -> RunEventStore:
        from deerflow_journal.stores.postgres import PostgresRunEventStore

        return PostgresRunEventStore(self.dsn, **options)

    def url(self) -> str:
        return self.dsn

    async def cleanup(self) -> None:
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.server_dsn, autocommit=True) as c:
            await c.execute(f"DROP SCHEMA {self.schema} CASCADE")


BACKENDS: list[type[Backend]] = [MemoryBackend, JsonlBackend, SqliteBackend, PostgresBackend]
