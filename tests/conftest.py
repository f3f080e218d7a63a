"""Shared fixtures: every behavioural store test runs once per backend in ``BACKENDS``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from deerflow_journal import RunEventStore
from tests.backends import BACKENDS, Backend


@pytest.fixture(params=[pytest.param(b.name, marks=b.marks) for b in BACKENDS])
async def backend(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Backend]:
    """One backend, bound to a location private to this test."""
    backend_class = next(b for b in BACKENDS if b.name == request.param)
    bound = backend_class(tmp_path, request)
    try:
        yield bound
    finally:
        await bound.cleanup()


@pytest.fixture(params=[pytest.param(b.name, marks=b.marks) for b in BACKENDS if b.persistent])
async def persistent_backend(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Backend]:
    """A backend whose stores share data across instances and processes."""
    backend_class = next(b for b in BACKENDS if b.name == request.param)
    bound = backend_class(tmp_path, request)
    try:
        yield bound
    finally:
        await bound.cleanup()


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[RunEventStore]:
    """A set-up store of the current backend, closed after the test."""
    async with backend.make() as opened:
        yield opened
