"""Fixtures of the viewer's tests: a SQLite or PostgreSQL journal filled by real runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from deerflow_journal import RunEventStore
from deerflow_journal.web import create_app
from tests.backends import Backend, PostgresBackend, SqliteBackend
from tests.web.journals import fill

VIEWER_BACKENDS = [SqliteBackend, PostgresBackend]


@dataclass
class Viewer:
    """A filled journal, the viewer app over it, a client of that app and a store to compare."""

    backend: Backend
    ids: dict[str, Any]
    store: RunEventStore  # read-only, the one the app reads
    client: httpx.AsyncClient


def client_of(app: Any) -> httpx.AsyncClient:
    """An in-process HTTP client of ``app`` (no socket)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


@pytest.fixture(params=[pytest.param(b.name, marks=b.marks) for b in VIEWER_BACKENDS])
async def viewer(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Viewer]:
    """A journal of every kind of run on SQLite or PostgreSQL, and the viewer over it."""
    backend_class = next(b for b in VIEWER_BACKENDS if b.name == request.param)
    backend = backend_class(tmp_path, request)
    try:
        async with backend.make() as writable:
            ids = await fill(writable, tmp_path)
        async with (
            backend.make(read_only=True) as store,
            client_of(create_app(store)) as client,
        ):
            yield Viewer(backend, ids, store, client)
    finally:
        await backend.cleanup()
