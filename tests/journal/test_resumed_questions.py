"""A question whose run stopped before any model saw it, then resumed from the checkpoint:
the thread's messages still show it once."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command, interrupt

from deerflow_journal import RunJournal
from tests.journal.agents import (
    QUESTION,
    EchoChatModel,
    ToolCallingModel,
    add,
    ai,
    ask_human,
    humans,
    model_node,
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


class Topic(TypedDict, total=False):
    topic: str
    answer: str


def asking_graph(inner: Any, given: Any) -> Any:
    """A checkpointed graph whose node runs ``inner`` on ``given(question)``, a question
    it builds from the state's topic."""

    async def ask(state: Topic) -> dict[str, Any]:
        out = await inner.ainvoke({"messages": given(f"What is the {state['topic']}?")})
        return {"answer": out["messages"][-1].content}

    builder = StateGraph(Topic)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    return builder.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize(
    "given",
    [lambda q: [HumanMessage(q)], lambda q: [("user", q)]],
    ids=["message", "text"],
)
async def test_a_question_an_inner_graph_paused_before_its_model_is_written_once(store, given):
    # The inner graph pauses before its model; when resumed, its checkpoint holds the
    # question under the id LangGraph gave it in the paused run, which records it.
    def approve(state: MessagesState) -> dict[str, Any]:
        interrupt("go?")
        return {}

    inner = StateGraph(MessagesState)
    inner.add_node("approve", approve)
    inner.add_node("agent", model_node(EchoChatModel()))
    inner.add_edge(START, "approve")
    inner.add_edge("approve", "agent")
    graph = asking_graph(inner.compile(), given)
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "paused"}}
    await graph.ainvoke({"topic": "capital"}, config)
    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    assert humans(await store.list_messages("paused", limit=100)) == ["What is the capital?"]


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
@pytest.mark.parametrize(
    "given",
    [lambda q: [("user", q)], lambda q: q, lambda q: [{"role": "user", "content": q}]],
    ids=["tuple", "string", "dict"],
)
async def test_an_inner_agent_resumed_from_its_checkpoint_keeps_a_text_question_old(store, given):
    # LangGraph builds the question anew from the text each time the node runs; resumed,
    # the agent's state has it before the tool call it stopped at.
    model = ToolCallingModel(
        messages=iter([ai("", calls=[("ask_human", {"question": "sure?"}, "h1")]), ai("Paris")])
    )
    graph = asking_graph(create_react_agent(model, [ask_human]), given)
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "inner"}}
    await graph.ainvoke({"topic": "capital of France"}, config)
    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    assert humans(await store.list_messages("inner", limit=100)) == [
        "What is the capital of France?"
    ]


async def test_a_subgraph_node_paused_twice_before_its_model_writes_the_question_once(store):
    # The subgraph is given its graph's state: the question it brings by id is the one the
    # graph's state already holds, old once the run is resumed.
    def approve(state: MessagesState) -> dict[str, Any]:
        interrupt("sure?")
        interrupt("really sure?")
        return {}

    inner = StateGraph(MessagesState)
    inner.add_node("approve", approve)
    inner.add_node("agent", model_node(EchoChatModel()))
    inner.add_edge(START, "approve")
    inner.add_edge("approve", "agent")
    builder = StateGraph(MessagesState)
    builder.add_node("step", inner.compile())
    builder.add_edge(START, "step")
    graph = builder.compile(checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "twice"}}
    await graph.ainvoke(QUESTION, config)
    await graph.ainvoke(Command(resume="yes"), config)
    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    assert humans(await store.list_messages("twice", limit=100)) == ["What is 1 + 2?"]
