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
from deerflow_journal.records import normalise_batch, normalise_journal_batch, utc_timestamp


@pytest.fixture(autouse=True)
def journal_events_honour_the_contract(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Validate every record written by ``put_batch`` or by a journal; fail on any violation.

    A journal's write returns no records: its events are checked as normalised for the store
    (seq aside, which the envelope only needs to be positive).
    """
    monkeypatch.setattr(RunJournal, "raise_error", True)
    written: list[dict[str, Any]] = []
    problems: list[str] = []
    original = RunEventStore.put_batch

    def check(record: Any) -> None:
        try:
            validate_event(record)
        except Exception as exc:  # collected: raising here would look like a store failure
            problems.append(f"{record['event_type']}: {exc}")
        written.append(record)

    async def checked_put_batch(self: RunEventStore, events: Any) -> Any:
        records = await original(self, events)
        for record in records:
            check(record)
        return records

    monkeypatch.setattr(RunEventStore, "put_batch", checked_put_batch)
    original_journal_batch = RunEventStore._put_journal_batch

    async def checked_journal_batch(
        self: RunEventStore, events: Any, summaries: Any, default: Any = str, batch_id: Any = None
    ) -> bool:
        written = await original_journal_batch(self, events, summaries, default, batch_id)
        limits = {
            "max_trace_content": self.max_trace_content,
            "max_outputs_content": self.max_outputs_content,
        }
        pending = normalise_journal_batch(events, **limits, default=default)
        # The journal's own path stores what put_batch's would (given timestamps, not floats).
        dated = [
            {**e, "created_at": utc_timestamp(e["created_at"])}
            if isinstance(e["created_at"], float)
            else e
            for e in events
        ]
        public = normalise_batch(dated, **limits, default=default)
        if [p.columns() for p in pending] != [p.columns() for p in public]:
            problems.append(f"the journal's write path stored {events!r} otherwise")
        for seq, event in enumerate(pending, start=1):
            check(event.record(seq))
        return written

    monkeypatch.setattr(RunEventStore, "_put_journal_batch", checked_journal_batch)
    yield written
    assert not problems, problems
