"""A question whose run stopped before any model saw it, then resumed from the checkpoint:
the thread's messages still show it once."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command, interrupt

from deerflow_journal import RunJournal
from tests.journal.agents import (
    QUESTION,
    ScriptedChatModel,
    add,
    ai,
    ask_human,
    humans,
    step_then_answer,
)


def prepared_agent(prepare: Any) -> Any:
    """A graph whose first node runs before the model sees the question."""
    return step_then_answer(prepare, "3", checkpointer=InMemorySaver())


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


class ToolCallingModel(ScriptedChatModel):
    """A scripted model ``create_react_agent`` can bind tools to (the script has the calls)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_a_prebuilt_agent_resumed_after_a_tool_interrupt_writes_no_human_input(store):
    # The prebuilt agent sends each tool call to its tool node with the state beside it:
    # the resumed run starts there, not at a node given the state itself.
    model = ToolCallingModel(
        messages=iter([ai("", calls=[("ask_human", {"question": "sure?"}, "h1")]), ai("3")])
    )
    tools: list[BaseTool] = [ask_human, add]
    graph = create_react_agent(model, tools, checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "hitl"}}
    await graph.ainvoke(QUESTION, config)
    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    assert humans(await store.list_messages("hitl", limit=100)) == ["What is 1 + 2?"]


class ApprovalState(MessagesState):
    approved: bool


class ApprovalInput(TypedDict):
    approved: bool


async def test_a_resumed_node_that_reads_no_messages_leaves_the_question_old(store):
    # The node the run resumes at declares a narrower input: it is given no messages.
    def approve(state: ApprovalInput) -> dict[str, Any]:
        return {"approved": bool(interrupt("approve?"))}

    graph = step_then_answer(approve, "3", ApprovalState, checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "approve"}}
    await graph.ainvoke(QUESTION, config)
    await graph.ainvoke(Command(resume=True), config)
    await journal.flush()
    assert humans(await store.list_messages("approve", limit=100)) == ["What is 1 + 2?"]
