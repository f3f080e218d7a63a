"""Estimated run cost: priced from genai-prices' table, never guessed, shown and stored.

Expected figures are computed here by hand from the per-million-token prices the table
publishes for each model, not by the library's own arithmetic.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import data

from deerflow_journal import RunJournal, RunSummary, open_store, render_summary
from deerflow_journal.cost import estimate_cost, model_cost
from deerflow_journal.timeline import timeline_rows
from tests.journal.agents import QUESTION, add, agent_graph, ai, run_events, scripted

MTOK = Decimal(1_000_000)


def published(provider_id: str, model_id: str) -> Any:
    """The table's flat prices of one model (``ModelPrice``: ``input_mtok`` and the rest)."""
    (provider,) = [p for p in data.providers if p.id == provider_id]
    (model,) = [m for m in provider.models if m.id == model_id]
    assert type(model.prices).__name__ == "ModelPrice", "pick a model with one flat price"
    return model.prices


def by_hand(prices: Any, *, inputs: int, outputs: int, **details: int) -> float:
    """Uncached input, cache reads and writes, plain output and reasoning, each at its price."""
    cache_read = details.get("cache_read", 0)
    cache_write = details.get("cache_write", 0)
    reasoning = details.get("reasoning", 0)
    cost = (inputs - cache_read - cache_write) * prices.input_mtok + (
        outputs - reasoning
    ) * prices.output_mtok
    if cache_read:
        cost += cache_read * prices.cache_read_mtok
    if cache_write:
        cost += cache_write * prices.cache_write_mtok
    if reasoning:
        cost += reasoning * prices.output_reasoning_mtok
    return float(cost / MTOK)


def counts(inputs: int, outputs: int, **details: int) -> dict[str, int]:
    """A ``token_usage_by_model`` entry."""
    return {
        "input_tokens": inputs,
        "output_tokens": outputs,
        "total_tokens": inputs + outputs,
        **{f"{key}_tokens": value for key, value in details.items()},
    }


def test_a_known_model_costs_what_the_table_publishes():
    prices = published("openai", "gpt-4o")
    assert model_cost("gpt-4o", counts(1200, 300)) == pytest.approx(
        by_hand(prices, inputs=1200, outputs=300)
    )


def test_cache_reads_and_writes_are_priced_apart_from_input():
    prices = published("anthropic", "claude-haiku-4-5")
    assert prices.cache_read_mtok < prices.input_mtok < prices.cache_write_mtok
    used = counts(5000, 400, cache_read=3000, cache_creation=1000)
    expected = by_hand(prices, inputs=5000, outputs=400, cache_read=3000, cache_write=1000)
    assert model_cost("claude-haiku-4-5", used) == pytest.approx(expected)
    assert expected != pytest.approx(by_hand(prices, inputs=5000, outputs=400))
    gpt = published("openai", "gpt-4o")
    assert model_cost("gpt-4o", counts(1000, 10, cache_read=600)) == pytest.approx(
        by_hand(gpt, inputs=1000, outputs=10, cache_read=600)
    )


def test_reasoning_tokens_are_priced_where_the_table_has_a_reasoning_price():
    prices = published("perplexity", "sonar-deep-research")
    assert prices.output_reasoning_mtok != prices.output_mtok
    used = counts(1000, 500, reasoning=300)
    # A provider-qualified name, as routers write them, finds the provider's model.
    assert model_cost("perplexity/sonar-deep-research", used) == pytest.approx(
        by_hand(prices, inputs=1000, outputs=500, reasoning=300)
    )


def test_an_unknown_model_has_no_cost_and_no_total():
    assert model_cost("fake-model", counts(10, 5)) is None
    assert model_cost("unknown", counts(10, 5)) is None
    total, by_model = estimate_cost({"gpt-4o": counts(1000, 100), "fake-model": counts(10, 5)})
    assert total is None  # a total leaving out a model would understate the run
    assert by_model == {
        "gpt-4o": pytest.approx(by_hand(published("openai", "gpt-4o"), inputs=1000, outputs=100)),
        "fake-model": None,
    }
    assert estimate_cost({}) == (None, {})


def test_the_total_adds_up_every_priced_model():
    total, by_model = estimate_cost(
        {"gpt-4o": counts(1000, 100), "claude-haiku-4-5": counts(2000, 50, cache_read=1500)}
    )
    assert by_model["gpt-4o"] is not None and by_model["claude-haiku-4-5"] is not None
    assert total == pytest.approx(by_model["gpt-4o"] + by_model["claude-haiku-4-5"])


def test_without_genai_prices_nothing_is_priced():
    # A real interpreter in which the package cannot be imported.
    code = (
        "import sys; sys.modules['genai_prices'] = None\n"
        "from deerflow_journal.cost import estimate_cost\n"
        "print(estimate_cost({'gpt-4o': {'input_tokens': 9, 'output_tokens': 1, "
        "'total_tokens': 10}}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "(None, {})"


async def test_a_journaled_run_stores_its_cost_and_the_timeline_shows_it(tmp_path):
    model = scripted(
        ai("", calls=[("add", {"a": 1, "b": 2}, "c1")], tokens=(120, 18), model="gpt-4o"),
        ai("3", tokens=(160, 14), model="gpt-4o", cache_read=96),
    )
    prices = published("openai", "gpt-4o")
    first = by_hand(prices, inputs=120, outputs=18)
    second = by_hand(prices, inputs=160, outputs=14, cache_read=96)
    async with open_store(f"sqlite:///{tmp_path / 'journal.db'}") as store:
        journal = RunJournal(event_store=store)
        await agent_graph(model, [add]).ainvoke(QUESTION, {"callbacks": [journal]})
        events = await run_events(journal, flush=True)
        summary = await store.get_run_summary(journal.thread_id, journal.run_id)
    assert summary is not None
    assert summary.estimated_cost_usd == pytest.approx(first + second)
    assert summary.estimated_cost_by_model == {"gpt-4o": pytest.approx(first + second)}
    rows = [row for row in timeline_rows(events) if row.kind == "llm.ai.response"]
    assert [row.cost_usd for row in rows] == [pytest.approx(first), pytest.approx(second)]
    assert "$" in rows[0].text
    lines = render_summary(summary).splitlines()
    (shown,) = [line for line in lines if line.startswith("cost: $")]
    assert shown.endswith(" (estimated)")
    assert float(shown.split("$")[1].split()[0]) == pytest.approx(first + second, abs=1e-6)
    assert any(line.startswith("  gpt-4o: 312 total") and " · $" in line for line in lines)


async def test_a_run_of_an_unknown_model_stores_no_cost():
    journal = RunJournal(event_store="memory://")
    await agent_graph(scripted(ai("3")), []).ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    summary = await journal.event_store.get_run_summary(journal.thread_id, journal.run_id)
    assert summary is not None
    assert (summary.estimated_cost_usd, summary.estimated_cost_by_model) == (
        None,
        {"fake-model": None},
    )
    assert "cost: unknown (no price for fake-model)" in render_summary(summary).splitlines()
    await journal.aclose()


# A run summary exactly as the version before cost estimates wrote it.
OLD_SUMMARY = {
    "thread_id": "t1",
    "run_id": "r1",
    "user_id": None,
    "status": "success",
    "started_at": "2026-11-30T10:00:00Z",
    "ended_at": "2026-11-30T10:00:01Z",
    "duration_ms": 1000,
    "error": None,
    "total_input_tokens": 120,
    "total_output_tokens": 18,
    "total_tokens": 138,
    "llm_call_count": 1,
    "lead_agent_tokens": 138,
    "subagent_tokens": 0,
    "middleware_tokens": 0,
    "token_usage_by_model": {
        "gpt-4o": {"input_tokens": 120, "output_tokens": 18, "total_tokens": 138}
    },
    "message_count": 2,
    "last_ai_message": "3",
    "first_human_message": "What is 1 + 2?",
    "dropped_events": 0,
}


async def test_a_summary_stored_before_cost_estimates_reads_back(tmp_path):
    path = tmp_path / "journal.db"
    async with open_store(f"sqlite:///{path}") as store:
        await store.put_run_summary(RunSummary.model_validate(OLD_SUMMARY))
    with sqlite3.connect(path) as db:  # the row as the previous version left it
        db.execute("UPDATE run_summaries SET summary = ?", (json.dumps(OLD_SUMMARY),))
    async with open_store(f"sqlite:///{path}", read_only=True) as store:
        summary = await store.get_run_summary("t1", "r1")
        (listed,) = await store.list_run_summaries("t1")
    assert summary is not None and listed == summary
    assert summary.estimated_cost_usd is None and summary.estimated_cost_by_model == {}
    assert summary.total_tokens == 138 and summary.token_usage_by_model["gpt-4o"]["total_tokens"]
    assert "cost: unknown (not estimated)" in render_summary(summary).splitlines()
