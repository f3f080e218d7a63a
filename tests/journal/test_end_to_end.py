"""Whole graphs under ainvoke, invoke and astream: exact event sequences and stored summaries."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from deerflow_journal import MemoryRunEventStore, RunJournal, RunSummary
from tests.journal.agents import (
    ONE_TOOL_CALL_SEQUENCE,
    QUESTION,
    add,
    agent_graph,
    ai,
    ask_human,
    explode,
    model_node,
    multiply,
    run_events,
    scripted,
    stored,
)


def tool_agent() -> Any:
    return agent_graph(
        scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("It is 3.", tokens=(20, 7)))
    )


def assert_agent_summary(summary: RunSummary) -> None:
    assert summary.status == "success" and summary.error is None
    assert (summary.total_input_tokens, summary.total_output_tokens) == (30, 12)
    assert (summary.total_tokens, summary.lead_agent_tokens, summary.llm_call_count) == (42, 42, 2)
    assert summary.message_count == 4
    assert summary.last_ai_message == "It is 3."
    assert summary.first_human_message == "What is 1 + 2?"
    assert summary.started_at is not None and summary.ended_at is not None
    assert summary.duration_ms is not None and summary.duration_ms >= 0


# -- one tool-calling agent, three ways to run it -------------------------------------------


async def test_agent_under_ainvoke(store):
    journal = RunJournal(event_store=store)
    await tool_agent().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    assert_agent_summary(summary)


async def test_agent_under_astream(store):
    journal = RunJournal(event_store=store)
    updates = [u async for u in tool_agent().astream(QUESTION, {"callbacks": [journal]})]
    assert len(updates) == 3
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    assert_agent_summary(summary)


async def test_agent_under_invoke_is_complete_when_invoke_returns(store):
    journal = RunJournal(event_store=store)
    # A plain invoke on a thread with no running loop, as a sync program makes it; no flush.
    await asyncio.to_thread(tool_agent().invoke, QUESTION, {"callbacks": [journal]})
    sequence, summary = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    assert_agent_summary(summary)


def test_agent_under_invoke_in_a_program_without_any_event_loop():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    tool_agent().invoke(QUESTION, {"callbacks": [journal]})
    sequence, summary = asyncio.run(stored(journal))
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    assert_agent_summary(summary)


# -- parallel tools ------------------------------------------------------------------------


def parallel_agent() -> Any:
    calls = [("add", {"a": 2, "b": 3}, "p1"), ("multiply", {"a": 2, "b": 3}, "p2")]
    return agent_graph(scripted(ai("", calls=calls), ai("5 and 6")), [add, multiply])


PARALLEL_SEQUENCE = [
    "run.start",
    "llm.human.input",
    "llm.ai.response",
    "llm.tool.result",
    "llm.tool.result",
    "llm.ai.response",
    "run.end",
]


async def test_parallel_tool_calls_under_ainvoke(store):
    journal = RunJournal(event_store=store)
    await parallel_agent().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == PARALLEL_SEQUENCE
    results = [e for e in await run_events(journal) if e["category"] == "message"]
    assert {e["content"]["tool_call_id"] for e in results[2:4]} == {"p1", "p2"}
    assert summary.status == "success" and summary.message_count == 5


async def test_parallel_tool_calls_under_invoke_on_worker_threads(store):
    journal = RunJournal(event_store=store)
    await asyncio.to_thread(parallel_agent().invoke, QUESTION, {"callbacks": [journal]})
    sequence, summary = await stored(journal)
    assert sequence == PARALLEL_SEQUENCE
    assert summary.status == "success" and summary.llm_call_count == 2


# -- failing tools -------------------------------------------------------------------------


def exploding_agent(handled: bool) -> Any:
    model = scripted(ai("", calls=[("explode", {"reason": "disk full"}, "e1")]), ai("Sorry."))
    return agent_graph(model, [explode], handle_tool_errors=handled)


async def test_a_handled_tool_error_is_its_calls_outcome(store):
    journal = RunJournal(event_store=store)
    await exploding_agent(handled=True).ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "tool.error",
        "llm.ai.response",
        "run.end",
    ]
    error = (await run_events(journal))[3]
    assert error["content"] == {
        "tool_call_id": "e1",
        "name": "explode",
        "error_type": "RuntimeError",
        "error": "tool exploded: disk full",
    }
    assert error["metadata"]["caller"] == "lead_agent"
    assert summary.status == "success"


async def test_an_unhandled_tool_error_fails_the_run(store):
    journal = RunJournal(event_store=store)
    with pytest.raises(RuntimeError, match="disk full"):
        await exploding_agent(handled=False).ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "tool.error",
        "run.error",
    ]
    assert summary.status == "error"
    assert summary.error == {"type": "RuntimeError", "message": "tool exploded: disk full"}


async def test_a_failed_run_leaves_unanswered_calls_unresolved(store):
    calls = [("explode", {"reason": "x"}, "f1"), ("never_runs", {}, "f2")]
    graph = agent_graph(scripted(ai("", calls=calls)), [explode], handle_tool_errors=False)
    journal = RunJournal(event_store=store)
    with pytest.raises(RuntimeError):
        await graph.ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    events = await run_events(journal)
    (unresolved,) = [e for e in events if e["event_type"] == "tool.unresolved"]
    assert unresolved["content"] == {
        "tool_call_id": "f2",
        "name": "never_runs",
        "reason": "run_failed",
    }
    assert [e["event_type"] for e in events][-2:] == ["tool.unresolved", "run.error"]


# -- subagents -----------------------------------------------------------------------------


async def test_subgraph_tagged_as_a_subagent_lands_in_the_subagent_bucket(store):
    research = agent_graph(
        scripted(
            ai("", calls=[("add", {"a": 4, "b": 4}, "s1")], tokens=(7, 3)), ai("8", tokens=(9, 1))
        )
    ).with_config(tags=["subagent:research"])
    graph = StateGraph(MessagesState)
    graph.add_node("research", research)
    graph.add_node("lead", model_node(scripted(ai("Research says 8.", tokens=(11, 4)))))
    graph.add_edge(START, "research")
    graph.add_edge("research", "lead")
    journal = RunJournal(event_store=store)
    await graph.compile().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == [
        "run.start",
        "llm.human.input",  # the question comes before the subagent's answers
        "llm.ai.response",
        "llm.tool.result",
        "llm.ai.response",
        "llm.ai.response",
        "run.end",
    ]
    callers = [e["metadata"].get("caller") for e in await run_events(journal)]
    assert callers[2:5] == ["subagent:research"] * 3
    assert callers[5] == "lead_agent"
    assert (summary.subagent_tokens, summary.lead_agent_tokens, summary.total_tokens) == (
        20,
        15,
        35,
    )
    assert summary.last_ai_message == "Research says 8."


# -- human in the loop ---------------------------------------------------------------------


async def test_interrupt_then_resume_with_a_checkpointer(store):
    model = scripted(ai("", calls=[("ask_human", {"question": "Proceed?"}, "h1")]), ai("Done."))
    graph = agent_graph(model, [ask_human], checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: dict[str, Any] = {"callbacks": [journal], "configurable": {"thread_id": "hitl"}}

    paused = await graph.ainvoke(QUESTION, config)
    assert "__interrupt__" in paused
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "tool.unresolved",
        "run.interrupt",
    ]
    assert summary.status == "interrupted"
    first = await run_events(journal)
    assert first[3]["content"] == {
        "tool_call_id": "h1",
        "name": "ask_human",
        "reason": "interrupted",
    }
    interrupt = first[4]["content"]
    state = await graph.aget_state({"configurable": {"thread_id": "hitl"}})
    assert interrupt["checkpoint_id"] == state.config["configurable"]["checkpoint_id"]
    assert interrupt["checkpoint_ns"] == []
    assert [i["value"] for i in interrupt["interrupts"]] == ["Proceed?"]
    paused_run = journal.run_id

    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    sequence, summary = await stored(journal)
    assert journal.run_id != paused_run and journal.thread_id == "hitl"
    assert sequence == [
        "run.start",
        "run.resume",
        "llm.tool.result",
        "llm.ai.response",
        "run.end",
    ]
    resumed = await run_events(journal)
    assert resumed[1]["content"]["checkpoint_id"] == interrupt["checkpoint_id"]
    assert resumed[2]["content"]["tool_call_id"] == "h1"
    assert summary.status == "success"
    statuses = [s.status for s in await store.list_run_summaries("hitl")]
    assert statuses == ["interrupted", "success"]


# -- cancellation --------------------------------------------------------------------------


async def test_a_cancelled_run_ends_cancelled(store):
    started = asyncio.Event()

    @tool
    async def wait_forever(topic: str) -> str:
        """Wait for something that never comes."""
        started.set()
        await asyncio.Event().wait()
        return topic

    model = scripted(ai("", calls=[("wait_forever", {"topic": "x"}, "w1")]))
    journal = RunJournal(event_store=store)
    task = asyncio.create_task(
        agent_graph(model, [wait_forever]).ainvoke(QUESTION, {"callbacks": [journal]})
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "tool.unresolved",
        "run.error",
    ]
    events = await run_events(journal)
    assert events[3]["content"]["reason"] == "cancelled"
    assert events[4]["metadata"] == {"error_type": "CancelledError"}
    assert summary.status == "cancelled"
    assert summary.error is not None and summary.error["type"] == "CancelledError"


def test_a_stream_closed_early_ends_cancelled():
    journal = RunJournal(event_store=MemoryRunEventStore())
    updates = tool_agent().stream(QUESTION, {"callbacks": [journal]})
    next(updates)
    updates.close()
    events = asyncio.run(run_events(journal, flush=True))
    assert [e["event_type"] for e in events][-2:] == ["tool.unresolved", "run.error"]
    assert events[-2]["content"]["reason"] == "cancelled"
    assert events[-1]["metadata"] == {"error_type": "GeneratorExit"}
    assert journal.summary().status == "cancelled"


async def test_an_async_stream_closed_early_ends_cancelled():
    journal = RunJournal(event_store=MemoryRunEventStore())
    updates = tool_agent().astream(QUESTION, {"callbacks": [journal]})
    async for _ in updates:
        break
    await updates.aclose()
    events = await run_events(journal, flush=True)
    assert [e["event_type"] for e in events][-2:] == ["tool.unresolved", "run.error"]
    assert events[-2]["content"]["reason"] == "cancelled"
    assert journal.summary().status == "cancelled"


def _pausing_agent() -> Any:
    model = scripted(ai("", calls=[("ask_human", {"question": "Proceed?"}, "h1")]), ai("Done."))
    return agent_graph(model, [ask_human], checkpointer=InMemorySaver())


def _stop_at_the_pause(graph: Any, config: Any) -> None:
    updates = graph.stream(QUESTION, config, stream_mode="updates")
    for chunk in updates:
        if "__interrupt__" in chunk:  # show the question, read no further
            break
    updates.close()


async def _astop_at_the_pause(graph: Any, config: Any) -> None:
    updates = graph.astream(QUESTION, config, stream_mode="updates")
    async for chunk in updates:
        if "__interrupt__" in chunk:
            break
    await updates.aclose()


@pytest.mark.parametrize("stop", [_stop_at_the_pause, _astop_at_the_pause])
async def test_a_stream_closed_at_its_interrupt_chunk_ends_interrupted(store, stop):
    """LangGraph reports the pause after it hands the caller the ``__interrupt__`` chunk:
    the run knew from the node that raised it."""
    graph, journal = _pausing_agent(), RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "hitl"}}
    if asyncio.iscoroutinefunction(stop):
        await stop(graph, config)
    else:
        await asyncio.to_thread(stop, graph, config)
    assert (await graph.aget_state(config)).next == ("tools",)  # the graph did pause
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence[-2:] == ["tool.unresolved", "run.interrupt"]
    assert summary.status == "interrupted"
    events = await run_events(journal)
    assert events[-2]["content"]["reason"] == "interrupted"
    assert [i["value"] for i in events[-1]["content"]["interrupts"]] == ["Proceed?"]
    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence[:2] == ["run.start", "run.resume"] and summary.status == "success"


async def test_a_stream_closed_while_a_parallel_step_still_runs_ends_cancelled(store):
    """One branch pauses while the other still works: closing the stream then cuts that
    step short, which is no pause."""

    class Log(TypedDict):
        log: Annotated[list[str], operator.add]

    def ask(state: Log) -> dict[str, Any]:
        return {"log": [interrupt("Proceed?")]}

    async def work(state: Log) -> dict[str, Any]:
        await asyncio.Event().wait()  # until the run is cancelled
        return {"log": ["worked"]}

    builder = StateGraph(Log)
    builder.add_node("ask", ask)
    builder.add_node("work", work)
    builder.add_edge(START, "ask")
    builder.add_edge(START, "work")
    graph = builder.compile(checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "t"}}
    updates = graph.astream({"log": []}, config, stream_mode="updates")
    async for chunk in updates:
        if "__interrupt__" in chunk:
            break
    await updates.aclose()
    await journal.flush()
    sequence, summary = await stored(journal)
    assert (sequence[-1], summary.status) == ("run.error", "cancelled")


def test_a_run_cancelled_after_its_graph_resumed_ends_cancelled():
    """A wrapper pauses its graph, resumes it to the end, and is then cancelled: the pause
    is over, so the cancellation is no pause."""
    graph = _pausing_agent()

    def pause_resume_and_stop(inputs: Any, config: RunnableConfig) -> Any:
        graph.invoke(inputs, config)
        graph.invoke(Command(resume="yes"), config)
        raise KeyboardInterrupt  # Ctrl-C

    journal = RunJournal(event_store=MemoryRunEventStore())
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "t"}}
    with pytest.raises(KeyboardInterrupt):
        RunnableLambda(pause_resume_and_stop).invoke(QUESTION, config)
    sequence = [e["event_type"] for e in asyncio.run(run_events(journal, flush=True))]
    assert "run.resume" in sequence and sequence[-1] == "run.error"
    assert journal.summary().status == "cancelled"
