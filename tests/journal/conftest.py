"""Journal test fixtures: every event a journal writes is checked against the contract.

The autouse fixture also turns ``raise_error`` on, so an exception inside a journal callback
fails the test instead of being logged by LangChain. End-to-end tests take the shared ``store``
fixture, so they run on every backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deerflow_journal import RunEventStore, RunJournal, validate_event


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
