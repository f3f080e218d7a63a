"""A question whose run stopped before any model saw it, then resumed from the checkpoint:
the thread's messages still show it once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from deerflow_journal import RunEvent, RunJournal
from tests.journal.agents import QUESTION, ai, model_node, scripted


def humans(events: list[RunEvent]) -> list[str]:
    return [e["content"]["content"] for e in events if e["event_type"] == "llm.human.input"]


def prepared_agent(prepare: Any) -> Any:
    """A graph whose first node runs before the model sees the question."""
    builder = StateGraph(MessagesState)
    builder.add_node("prepare", prepare)
    builder.add_node("agent", model_node(scripted(ai("3"))))
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "agent")
    return builder.compile(checkpointer=InMemorySaver())


async def test_a_question_whose_run_failed_before_any_model_call_is_written_once(store):
    failures = [ConnectionError("upstream down")]

    def prepare(state: MessagesState) -> dict[str, Any]:
        if failures:
            raise failures.pop()
        return {}

    graph = prepared_agent(prepare)
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "failed-early"}}
    with pytest.raises(ConnectionError):
        await graph.ainvoke(QUESTION, config)
    await graph.ainvoke(None, config)  # LangGraph retries from the last checkpoint
    await journal.flush()
    assert humans(await store.list_messages("failed-early", limit=100)) == ["What is 1 + 2?"]


async def test_a_question_whose_run_was_cancelled_before_any_model_call_is_written_once(store):
    started, release = asyncio.Event(), asyncio.Event()

    async def prepare(state: MessagesState) -> dict[str, Any]:
        if not release.is_set():
            started.set()
            await asyncio.Event().wait()
        return {}

    graph = prepared_agent(prepare)
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "cancelled-early"}}
    task = asyncio.create_task(graph.ainvoke(QUESTION, config))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    await graph.ainvoke(None, config)
    await journal.flush()
    assert humans(await store.list_messages("cancelled-early", limit=100)) == ["What is 1 + 2?"]
