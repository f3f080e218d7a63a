"""Tool-call outcomes on their own: one outcome per call (``llm.tool.result``, ``tool.error`` or
``tool.unresolved``), the last attempt decides."""

from __future__ import annotations

from deerflow_journal.journal import mapping
from deerflow_journal.journal.outcomes import ToolCallOutcomes


def error_event(call_id: str) -> mapping.EventKwargs:
    return mapping.tool_error_event(
        tool_call_id=call_id,
        name="t",
        error=ConnectionError("transient"),
        caller="lead_agent",
        latency_ms=1,
    )


def test_a_call_stopped_after_a_failed_attempt_is_unresolved_not_an_error():
    outcomes = ToolCallOutcomes()
    outcomes.requested([{"id": "c1", "name": "t"}])
    outcomes.failed("c1", "lead_agent", error_event("c1"))
    outcomes.stopped("c1", "cancelled")
    assert outcomes.settle() == []
    assert outcomes.unresolved("error") == [("c1", "t", "cancelled")]


def test_held_errors_settle_per_caller():
    outcomes = ToolCallOutcomes()
    outcomes.requested([{"id": "c1", "name": "t"}, {"id": "c2", "name": "t"}])
    outcomes.failed("c1", "lead_agent", error_event("c1"))
    outcomes.failed("c2", "subagent:web", error_event("c2"))
    assert outcomes.settle("lead_agent") == [error_event("c1")]
    assert outcomes.settle() == [error_event("c2")]
    assert outcomes.unresolved("success") == []
