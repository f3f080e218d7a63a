"""Integration costs: an auto-enabled journal, cost estimates and span export, each beside a
baseline measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_integrations.py [--invocations 200] [--rounds 5]``.
Prints one line per figure (median of the rounds; variants interleaved round by round):

- ``invoke, enable()`` against ``invoke, callbacks=[journal]`` (and ``invoke, no journal``):
  what journaling through the configure hook costs over passing the journal by hand;
- ``estimate_cost`` against building the ``RunSummary`` it goes into;
- ``run_spans`` against ``timeline_rows`` over the same stored events.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

import deerflow_journal
from deerflow_journal import RunJournal, RunSummary, timeline_rows
from deerflow_journal.cost import estimate_cost
from deerflow_journal.otel import run_spans

QUESTION = {"messages": [HumanMessage("What is 1 + 2?")]}
USAGE = {"input_tokens": 120, "output_tokens": 18, "total_tokens": 138}


def graph() -> Any:
    """A one-node graph whose fake model answers forever, reporting usage as gpt-4o."""
    answers = (
        AIMessage("3", usage_metadata=USAGE, response_metadata={"model_name": "gpt-4o"})
        for _ in iter(int, 1)
    )
    model = GenericFakeChatModel(messages=answers)
    builder = StateGraph(MessagesState)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    builder.add_edge(START, "agent")
    return builder.compile()


def per_call(fn: Callable[[], Any], count: int) -> float:
    """Microseconds per call of ``fn`` over ``count`` calls."""
    started = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - started) / count * 1e6


def medians(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each variant's median over ``rounds``, the variants interleaved within each round."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, measure in variants.items():
            samples[name].append(measure())
    return {name: statistics.median(values) for name, values in samples.items()}


def show(name: str, value: float, baseline: str, base: float) -> None:
    print(f"{name:32} {value:10.1f} us   x{value / base:5.2f} of {baseline}")


def bench_invoke(invocations: int, rounds: int) -> None:
    agent = graph()
    explicit = RunJournal(event_store="memory://")

    def with_enable() -> float:
        deerflow_journal.enable("memory://")
        try:
            return per_call(lambda: agent.invoke(QUESTION), invocations)
        finally:
            deerflow_journal.disable()

    figures = medians(
        {
            "none": lambda: per_call(lambda: agent.invoke(QUESTION), invocations),
            "explicit": lambda: per_call(
                lambda: agent.invoke(QUESTION, {"callbacks": [explicit]}), invocations
            ),
            "enable": with_enable,
        },
        rounds,
    )
    explicit.close()
    show("invoke, no journal", figures["none"], "itself", figures["none"])
    show("invoke, callbacks=[journal]", figures["explicit"], "no journal", figures["none"])
    show("invoke, enable()", figures["enable"], "callbacks=[journal]", figures["explicit"])


def bench_cost(calls: int, rounds: int) -> None:
    usage = {"gpt-4o": dict(USAGE), "claude-haiku-4-5": {**USAGE, "cache_read_tokens": 60}}
    at = datetime.now(UTC)
    estimate_cost(usage, at)  # the table is loaded once per process, not measured here
    data = {"thread_id": "t", "run_id": "r", "token_usage_by_model": usage}
    figures = medians(
        {
            "summary": lambda: per_call(lambda: RunSummary(**data), calls),
            "cost": lambda: per_call(lambda: estimate_cost(usage, at), calls),
        },
        rounds,
    )
    show("RunSummary(...)", figures["summary"], "itself", figures["summary"])
    show("estimate_cost, 2 models", figures["cost"], "RunSummary(...)", figures["summary"])


async def stored_events(invocations: int) -> list[Any]:
    journal = RunJournal(event_store="memory://", thread_id="bench", run_id="bench")
    agent = graph()
    for _ in range(invocations):
        await agent.ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    events = await journal.event_store.list_events("bench", "bench", limit=1_000_000)
    await journal.aclose()
    return events


def bench_spans(invocations: int, rounds: int) -> None:
    events = asyncio.run(stored_events(invocations))
    figures = medians(
        {
            "timeline": lambda: per_call(lambda: timeline_rows(events), 1),
            "spans": lambda: per_call(lambda: run_spans(events), 1),
        },
        rounds,
    )
    per_event = {name: value / len(events) for name, value in figures.items()}
    show("timeline_rows, per event", per_event["timeline"], "itself", per_event["timeline"])
    show("run_spans, per event", per_event["spans"], "timeline_rows", per_event["timeline"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invocations", type=int, default=200, help="graph calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="repeats of each measurement")
    args = parser.parse_args()
    bench_invoke(args.invocations, args.rounds)
    bench_cost(args.invocations * 10, args.rounds)
    bench_spans(args.invocations, args.rounds)


if __name__ == "__main__":
    main()
