"""Shared fixtures: every behavioural store test runs once per backend in ``BACKENDS``."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from deerflow_journal import RunEventStore
from deerflow_journal.journal import buffer
from deerflow_journal.journal.spill import SPILL_PREFIX
from tests.backends import BACKENDS, Backend

# The test run's own temporary directory, for it and the programs it starts: what other
# programs left in the system's (a journal's spill file, which every journal reports at ERROR
# once per process) must not change what a test sees.
_TMP = tempfile.mkdtemp(prefix="deerflow-journal-tests-")
os.chmod(_TMP, 0o1777)  # as /tmp is: tests run servers and readers as other users
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = None  # read TMPDIR again
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


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


def _spill_dirs() -> set[Path]:
    return set(Path(_TMP).glob(f"{SPILL_PREFIX}*"))


@pytest.fixture(autouse=True)
def forget_stranded_journal_buffers() -> Iterator[None]:
    """Forget the journal buffers a test left holding events its store never took (tests of
    a store that is down leave some): at the end of the run they would be saved to files. And
    remove the spill files a test left in the run's temporary directory (saved as at exit):
    their lock is free, so the programs later tests start would report them."""
    before, dirs = set(buffer._STRANDED), _spill_dirs()
    yield
    for left in buffer._STRANDED - before:
        left._spill.remove()
        left._summary_spill.remove()
        buffer._STRANDED.discard(left)
    for left_dir in _spill_dirs() - dirs:
        shutil.rmtree(left_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_timed_retries_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put a failed write's timed retry an hour away: a test that counts writes or failures
    must not race with a timer on a loaded machine. Tests of the timed retry set their own."""
    monkeypatch.setattr(buffer._FailedWrites, "first_retry_seconds", 3600.0)
    monkeypatch.setattr(buffer._FailedWrites, "max_retry_seconds", 3600.0)
