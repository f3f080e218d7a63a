"""The store backends every behavioural test runs against.

Each backend is a ``Backend`` subclass bound to a fresh location (a temp dir, a database
schema); ``make()`` builds a store there, and several stores made by one backend share data
when the backend is persistent. Add a backend by adding a class to ``BACKENDS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

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


BACKENDS: list[type[Backend]] = [MemoryBackend, JsonlBackend, SqliteBackend]
