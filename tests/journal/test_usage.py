"""Run summaries' token accounting on its own: buckets, details, dedup and external records."""

from __future__ import annotations

from uuid import uuid4

import pytest

from deerflow_journal import RunSummary
from deerflow_journal.journal.state import RunState
from deerflow_journal.journal.usage import TokenUsage, token_counts
from tests.journal.agents import usage


def test_total_is_computed_from_input_and_output_when_missing_or_zero():
    assert token_counts({"input_tokens": 3, "output_tokens": 4})["total_tokens"] == 7
    assert token_counts({"input_tokens": 3, "output_tokens": 4, "total_tokens": 0}) == {
        "input_tokens": 3,
        "output_tokens": 4,
        "total_tokens": 7,
    }
    assert token_counts(None) == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}


def test_details_are_reported_beside_the_totals_never_added():
    counts = token_counts(usage(100, 50, cache_read=60, cache_creation=10, reasoning=20))
    assert counts == {
        "input_tokens": 100,
        "output_tokens": 50,
        "total_tokens": 150,
        "cache_read_tokens": 60,
        "cache_creation_tokens": 10,
        "reasoning_tokens": 20,
    }


def test_buckets_by_caller():
    tokens = TokenUsage()
    tokens.add_call("c1", "lead_agent", "m", [token_counts(usage(1, 1))])
    tokens.add_call("c2", "subagent:research", "m", [token_counts(usage(2, 2))])
    tokens.add_call("c3", "middleware:guardrail", "m", [token_counts(usage(3, 3))])
    data = tokens.completion_data()
    assert (data["lead_agent_tokens"], data["subagent_tokens"], data["middleware_tokens"]) == (
        2,
        4,
        6,
    )
    assert data["total_tokens"] == 12 and data["llm_call_count"] == 3


def test_by_model_keeps_detail_buckets_only_when_non_zero():
    tokens = TokenUsage()
    tokens.add_call("c4", "lead_agent", "a", [token_counts(usage(10, 5, cache_read=4))])
    tokens.add_call("c5", "lead_agent", "a", [token_counts(usage(10, 5))])
    tokens.add_call("c6", "lead_agent", "b", [token_counts(usage(1, 1))])
    assert tokens.completion_data()["token_usage_by_model"] == {
        "a": {"input_tokens": 20, "output_tokens": 10, "total_tokens": 30, "cache_read_tokens": 4},
        "b": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    }


def test_each_call_counts_once():
    tokens = TokenUsage()
    assert tokens.add_call("run-1", "lead_agent", "m", [token_counts(usage(1, 1))]) is True
    assert tokens.add_call("run-1", "lead_agent", "m", [token_counts(usage(1, 1))]) is False
    data = tokens.completion_data()
    assert (data["llm_call_count"], data["total_tokens"]) == (1, 2)


def test_token_figures_that_are_no_finite_number_count_as_zero():
    weird = {"input_tokens": float("nan"), "output_tokens": float("inf"), "total_tokens": True}
    assert token_counts(weird) == {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    assert token_counts({"input_tokens": 2.0, "output_tokens": -3})["total_tokens"] == 2


def test_external_records_count_once_and_skip_records_without_id_or_tokens():
    tokens = TokenUsage()
    records = [
        {"source_run_id": "x1", "caller": "subagent:web", "model_name": "m", "input_tokens": 5,
         "output_tokens": 5, "total_tokens": 0, "cache_read_tokens": 2},
        {"source_run_id": "x1", "caller": "subagent:web", "model_name": "m", "input_tokens": 5,
         "output_tokens": 5},
        {"caller": "lead_agent", "model_name": "m", "input_tokens": 1, "output_tokens": 1},
        {"source_run_id": "x2", "caller": "lead_agent", "model_name": None, "input_tokens": 0},
        {"source_run_id": "x3", "caller": "lead_agent", "model_name": None, "input_tokens": 2,
         "output_tokens": 1},
    ]  # fmt: skip
    assert tokens.add_external(records) == 2
    data = tokens.completion_data()
    assert data["total_tokens"] == 13 and data["subagent_tokens"] == 10
    assert data["lead_agent_tokens"] == 3 and data["llm_call_count"] == 2
    assert data["token_usage_by_model"] == {
        "m": {"input_tokens": 5, "output_tokens": 5, "total_tokens": 10, "cache_read_tokens": 2},
        "unknown": {"input_tokens": 2, "output_tokens": 1, "total_tokens": 3},
    }


def test_completion_data_is_a_copy():
    tokens = TokenUsage()
    tokens.add_call("c7", "lead_agent", "a", [token_counts(usage(1, 1))])
    tokens.completion_data()["token_usage_by_model"]["a"]["input_tokens"] = 99
    assert tokens.completion_data()["token_usage_by_model"]["a"]["input_tokens"] == 1


def test_a_call_counted_later_counts_before_anything_after_it():
    tokens = TokenUsage()
    tokens.add_call_later("c1", "lead_agent", "m", usage(1, 1))
    tokens.add_call_later("c2", "lead_agent", "m", None)  # a call without a response
    # The same call reported as an external record afterwards is a repeat, as it always was.
    assert tokens.add_external([{"source_run_id": "c1", "input_tokens": 7}]) == 0
    assert tokens.add_call("c2", "lead_agent", "m", [token_counts(usage(5, 5))]) is False
    data = tokens.completion_data()
    assert (data["llm_call_count"], data["total_tokens"]) == (2, 2)


def _run_state(status: str | None, *, whole_second: bool) -> RunState:
    """A bound run with priced and unpriced usage, ended with ``status`` (None: running)."""
    state = RunState()
    state.bind(uuid4(), "run-1", "thread-1", sync=False, user_id="alice")
    if whole_second:
        state.started_at = state.started_at.replace(microsecond=0)
    state.usage.add_call("c1", "lead_agent", "gpt-4o", [token_counts(usage(120, 18))])
    state.usage.add_call_later("c2", "subagent:research", "mystery-model", usage(5, 5))
    state.message_count, state.last_ai_message = 3, "It is sunny \x00 today."
    if status is not None:
        state.end(status, ValueError("boom") if status == "error" else None)  # type: ignore[arg-type]
        if whole_second:
            state.ended_at = state.ended_at.replace(microsecond=0)  # type: ignore[union-attr]
    return state


@pytest.mark.parametrize("status", [None, "success", "error", "interrupted"])
@pytest.mark.parametrize("whole_second", [False, True])
def test_the_summary_the_journal_writes_is_the_models_json(status: str | None, whole_second: bool):
    # The journal builds the JSON of each run's summary without the pydantic model: it must
    # be what the model writes, keys in the same order (stores keep the text).
    state = _run_state(status, whole_second=whole_second)
    written = state.summary_json()
    expected = state.summary().to_json_dict()
    assert written == expected
    assert list(written) == list(expected)
    assert RunSummary.model_validate(written) == state.summary()
