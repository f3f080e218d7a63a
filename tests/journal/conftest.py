"""Journal test fixtures: every event a journal writes is checked against the contract.

The autouse fixture also turns ``raise_error`` on, so an exception inside a journal callback
fails the test instead of being logged by LangChain.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from deerflow_journal import RunEventStore, RunJournal, validate_event
from tests.backends import BACKENDS, Backend

#: Backends the end-to-end journal tests run on (those present in ``BACKENDS``).
JOURNAL_BACKENDS = [b.name for b in BACKENDS if b.name in ("memory", "sqlite")]


@pytest.fixture(autouse=True)
def journal_events_honour_the_contract(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Validate every record written by ``put_batch``; fail the test on any violation."""
    monkeypatch.setattr(RunJournal, "raise_error", True)
    written: list[dict[str, Any]] = []
    problems: list[str] = []
    original = RunEventStore.put_batch

    async def checked_put_batch(self: RunEventStore, events: Any) -> Any:
        records = await original(self, events)
        for record in records:
            try:
                validate_event(record)
            except Exception as exc:  # collected: raising here would look like a store failure
                problems.append(f"{record['event_type']}: {exc}")
        written.extend(records)
        return records

    monkeypatch.setattr(RunEventStore, "put_batch", checked_put_batch)
    yield written
    assert not problems, problems


@pytest.fixture(params=JOURNAL_BACKENDS)
async def journal_store(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[RunEventStore]:
    """A set-up store of each backend the end-to-end tests cover."""
    backend_class = next(b for b in BACKENDS if b.name == request.param)
    backend: Backend = backend_class(tmp_path, request)
    try:
        async with backend.make() as store:
            yield store
    finally:
        await backend.cleanup()
