"""How runs are formed for every way a journal is used: roots that are no chain, recorders
outside a run, one human input per question, reconciled tool messages, Ctrl-C, a forgotten
flush, and stores plugged in through their public methods."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.config import ContextThreadPoolExecutor
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph, add_messages
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from langsmith.run_helpers import tracing_context
from langsmith.run_trees import RunTree
from pydantic import BaseModel

from deerflow_journal import (
    EventRefused,
    MemoryRunEventStore,
    RunEvent,
    RunEventStore,
    RunJournal,
    RunSummary,
    SqliteRunEventStore,
    open_store,
    timeline_rows,
)
from tests.backends import Backend
from tests.journal.agents import (
    ONE_TOOL_CALL_SEQUENCE,
    QUESTION,
    FailingChatModel,
    ScriptedChatModel,
    add,
    agent_graph,
    ai,
    ask_human,
    explode,
    humans,
    model_node,
    run_events,
    scripted,
    step_then_answer,
    stored,
)

ROOT = Path(__file__).resolve().parents[2]
CHUNKS = [
    {"type": "task_started", "task_id": "t-1", "description": "look it up"},
    {"type": "task_completed", "task_id": "t-1", "result": "found"},
]
DIGEST = "a" * 64


def types(events: list[RunEvent]) -> list[str]:
    return [e["event_type"] for e in events]


# -- roots that are no chain ---------------------------------------------------------------


async def test_a_chat_model_called_directly_is_a_run(store):
    journal = RunJournal(event_store=store)
    model = scripted(ai("Paris.", tokens=(12, 3), model="fake-gpt"))
    await model.ainvoke([HumanMessage("Capital of France?")], {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    assert (summary.status, summary.total_tokens, summary.llm_call_count) == ("success", 15, 1)
    assert summary.first_human_message == "Capital of France?"
    assert summary.last_ai_message == "Paris."
    assert summary.token_usage_by_model["fake-gpt"]["total_tokens"] == 15


def test_a_completion_model_called_directly_is_a_run(tmp_path):
    store = SqliteRunEventStore(tmp_path / "j.db")
    journal = RunJournal(event_store=store)
    FakeListLLM(responses=["forty-two"]).invoke("The answer?", {"callbacks": [journal]})
    sequence, summary = asyncio.run(stored(journal))
    assert sequence == ["run.start", "llm.ai.response", "run.end"]
    assert summary.status == "success" and summary.last_ai_message == "forty-two"
    asyncio.run(store.close())


async def test_a_failing_chat_model_called_directly_ends_its_run_with_an_error(store):
    journal = RunJournal(event_store=store)
    with pytest.raises(ConnectionError):
        await FailingChatModel(messages=iter([])).ainvoke("hi", {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.human.input", "llm.error", "run.error"]
    assert summary.status == "error" and summary.error["type"] == "ConnectionError"


async def test_a_tool_called_directly_is_a_run(store):
    journal = RunJournal(event_store=store)
    call = {"type": "tool_call", "id": "call-1", "name": "add", "args": {"a": 2, "b": 3}}
    message = await add.ainvoke(call, {"callbacks": [journal]})
    assert message.content == "5"
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.tool.result", "run.end"]
    events = await run_events(journal)
    assert events[0]["content"] == {"chain": "add"}
    assert events[1]["metadata"]["tool_call_id"] == "call-1"
    assert summary.status == "success"


@tool
def unvalidated(a: int) -> ToolMessage:
    """Return a ToolMessage built without validation, and so without a tool call id."""
    return ToolMessage.model_construct(content=f"r{a}")


async def test_a_tool_message_built_without_its_call_id_is_written_and_ends_the_run(store):
    journal = RunJournal(event_store=store)
    output = await unvalidated.ainvoke({"a": 1}, {"callbacks": [journal]})
    assert type(output) is ToolMessage and "tool_call_id" not in output.__dict__
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.tool.result", "run.end"]
    assert summary.status == "success"


def test_a_failing_tool_called_directly_ends_its_run_with_an_error():
    journal = RunJournal(event_store="memory://")
    with pytest.raises(RuntimeError):
        explode.invoke({"reason": "no disk"}, {"callbacks": [journal]})
    summary = journal.summary()
    assert summary.status == "error" and summary.error["message"] == "tool exploded: no disk"


async def test_a_retriever_called_directly_is_a_run(store):
    class Shelf(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return [Document(page_content=f"about {query}")]

    journal = RunJournal(event_store=store)
    await Shelf().ainvoke("owls", {"callbacks": [journal]})
    await journal.flush()
    sequence, _ = await stored(journal)
    assert sequence == ["run.start", "run.end"]
    assert (await run_events(journal))[1]["content"][0]["page_content"] == "about owls"


# -- roots whose parent the journal never saw ----------------------------------------------
# LangGraph makes the caller's run the parent of a graph given the journal inside a runnable
# that is not journaled; LangChain makes a LangSmith trace's run the parent of what it calls.


def _tool_then_answer() -> Any:
    return agent_graph(scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3.")))


async def _in_function_chain(graph: Any, config: Any) -> Any:
    return await asyncio.to_thread(
        RunnableLambda(lambda _: graph.invoke(QUESTION, config)).invoke, 1
    )


async def _in_graph_node(graph: Any, config: Any) -> Any:
    async def node(state: MessagesState) -> dict[str, Any]:
        await graph.ainvoke(QUESTION, config)
        return {}

    outer = StateGraph(MessagesState)
    outer.add_node("delegate", node)
    outer.add_edge(START, "delegate")
    return await outer.compile().ainvoke({"messages": []})


async def _in_langsmith_trace(graph: Any, config: Any) -> Any:
    with tracing_context(parent=RunTree(name="request", run_type="chain"), enabled=False):
        return await graph.ainvoke(QUESTION, config)


@pytest.mark.parametrize("caller", [_in_function_chain, _in_graph_node, _in_langsmith_trace])
async def test_a_graph_called_where_the_journal_sees_no_caller_is_a_run(store, caller):
    journal = RunJournal(event_store=store)
    seen: list[Any] = []

    class Parents(BaseCallbackHandler):
        def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
            seen.append(kwargs["parent_run_id"])

    graph = _tool_then_answer()
    await caller(graph, {"callbacks": [journal, Parents()], "configurable": {"thread_id": "t-1"}})
    assert seen[0] is not None  # the graph has a parent: a run the journal never saw
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    assert (journal.thread_id, summary.status, summary.llm_call_count) == ("t-1", "success", 2)


async def test_a_graph_failing_where_the_journal_sees_no_caller_ends_its_run_with_an_error(store):
    journal = RunJournal(event_store=store)
    graph = agent_graph(FailingChatModel(messages=iter([])))
    with pytest.raises(ConnectionError):
        await _in_graph_node(graph, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.human.input", "llm.error", "run.error"]
    assert summary.status == "error"


def test_a_batch_of_graphs_inside_a_function_chain_is_a_run_per_item():
    journal = RunJournal(event_store=MemoryRunEventStore())
    graph = agent_graph(scripted(ai("one"), ai("two")), checkpointer=InMemorySaver())
    configs = [{"callbacks": [journal], "configurable": {"thread_id": t}} for t in ("b1", "b2")]
    RunnableLambda(lambda _: graph.batch([QUESTION, QUESTION], configs)).invoke(1)
    store = journal.event_store
    threads = sorted(t.thread_id for t in asyncio.run(store.list_threads()))
    assert threads == ["b1", "b2"]
    for thread in threads:
        events = asyncio.run(store.list_events(thread, None))
        assert types(events) == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


SUBAGENT_CALLS = {  # how a node calls a subagent's graph
    "graph": lambda graph: graph,
    "with_retry": lambda graph: graph.with_retry(),
    "function": lambda graph: RunnableLambda(
        lambda x, config: graph.invoke(x, config),
        afunc=lambda x, config: graph.ainvoke(x, config),
    ),
}


@pytest.mark.parametrize("call", SUBAGENT_CALLS)
@pytest.mark.parametrize("lead_journaled", [True, False])
async def test_a_subagent_journal_records_its_graph_on_the_subagents_own_thread(
    store, lead_journaled, call
):
    """LangChain and LangGraph keep the thread of the metadata the subagent's graph (or a
    wrapper around it) inherits from the node calling it: its run is on the thread its own
    config names all the same."""
    lead, sub = RunJournal(event_store=store), RunJournal(event_store=store)
    subagent = SUBAGENT_CALLS[call](
        agent_graph(scripted(ai("found it")), checkpointer=InMemorySaver())
    )

    async def delegate(state: MessagesState) -> dict[str, Any]:
        await subagent.ainvoke(QUESTION, {"callbacks": [sub], "configurable": {"thread_id": "s"}})
        return {}

    graph = step_then_answer(delegate, "done", checkpointer=InMemorySaver())
    callbacks = [lead] if lead_journaled else []
    await graph.ainvoke(QUESTION, {"callbacks": callbacks, "configurable": {"thread_id": "main"}})
    await sub.flush()
    await lead.flush()
    assert (sub.thread_id, sub.summary().status) == ("s", "success")
    assert types(await run_events(sub)) == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "run.end",
    ]
    runs = [summary.run_id for summary in await store.list_run_summaries("main")]
    assert runs == ([lead.run_id] if lead_journaled else [])
    if lead_journaled:
        # A graph adds the callbacks given to those of the node calling it, so the lead
        # journal hears the subagent too; LangChain's wrappers replace them.
        answers = [
            e["content"]["content"]
            for e in await run_events(lead)
            if e["event_type"] == "llm.ai.response"
        ]
        assert answers == (["found it", "done"] if call == "graph" else ["done"])


def test_a_graph_whose_own_config_never_shows_keeps_the_thread_its_metadata_names():
    """Its model runs on a thread of its own, outside any config context: the thread the
    graph's metadata named is the run's (it may be its caller's; nothing tells otherwise)."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    model = scripted(ai("found it"))

    def answer(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return {"messages": [pool.submit(model.invoke, state["messages"], config).result()]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    subagent = builder.compile()

    def delegate(state: MessagesState) -> dict[str, Any]:
        subagent.invoke(QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "s"}})
        return {}

    graph = step_then_answer(delegate, "done", checkpointer=None)
    graph.invoke(QUESTION, {"configurable": {"thread_id": "main"}})
    assert (journal.thread_id, journal.summary().status) == ("main", "success")


async def test_a_graph_deeper_down_does_not_give_a_waiting_run_its_thread():
    """A graph that a node of the subagent runs on a thread of its own (here from an
    executor thread, whose first steps see no config of the subagent's) does not name the
    subagent's thread: the run keeps the one its metadata named."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    inner = agent_graph(scripted(ai("inner answer")), checkpointer=InMemorySaver())

    def work(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        deeper: Any = {"callbacks": config["callbacks"], "configurable": {"thread_id": "x"}}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(inner.invoke, QUESTION, deeper).result()
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    subagent = builder.compile(checkpointer=InMemorySaver())

    async def delegate(state: MessagesState) -> dict[str, Any]:
        config: Any = {"callbacks": [journal], "configurable": {"thread_id": "s"}}
        await subagent.ainvoke(QUESTION, config)
        return {}

    graph = step_then_answer(delegate, "done", checkpointer=InMemorySaver())
    await graph.ainvoke(QUESTION, {"configurable": {"thread_id": "main"}})
    assert journal.thread_id == "main"


async def test_a_model_a_node_calls_inside_a_langsmith_trace_is_part_of_the_run(store):
    journal = RunJournal(event_store=store)
    model = scripted(ai("noted"), ai("boom"))

    async def helper(state: MessagesState) -> dict[str, Any]:
        trace = RunTree(name="helper", run_type="chain")
        with tracing_context(parent=trace, enabled=False):
            await model.ainvoke([HumanMessage("sum up")], {"callbacks": [journal]})
            with contextlib.suppress(ConnectionError):
                await FailingChatModel(messages=iter([])).ainvoke("hi", {"callbacks": [journal]})
        return {}

    graph = step_then_answer(helper, "done", checkpointer=None)
    await graph.ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "llm.error",
        "llm.ai.response",
        "run.end",
    ]
    assert (summary.llm_call_count, summary.last_ai_message) == (2, "done")  # one failed
    assert not journal._runs  # each call's own key went with its end


async def test_a_task_a_node_left_running_starts_no_run_of_its_own(store):
    journal = RunJournal(event_store=store)
    tasks = []

    async def note() -> None:
        await asyncio.sleep(0.01)  # after its node ended: the journal forgot its parent
        await scripted(ai("a note", tokens=(30, 10))).ainvoke([HumanMessage("note")])

    async def spawn(state: MessagesState) -> dict[str, Any]:
        tasks.append(asyncio.create_task(note()))
        return {}

    async def answer(state: MessagesState) -> dict[str, Any]:
        await asyncio.gather(*tasks)
        return {"messages": [await scripted(ai("done")).ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("spawn", spawn)
    graph.add_node("agent", RunnableLambda(answer))
    graph.add_edge(START, "spawn")
    graph.add_edge("spawn", "agent")
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "t-1"}}
    await graph.compile().ainvoke(QUESTION, config)
    await journal.flush()
    assert journal.summary().last_ai_message == "done"
    assert [s.run_id for s in await store.list_run_summaries("t-1")] == [journal.run_id]


async def test_a_graph_handing_off_to_the_graph_around_it_ends_its_run_well(store):
    journal = RunJournal(event_store=store)

    def hand_off(state: MessagesState) -> Command:
        return Command(graph=Command.PARENT, goto="done", update={"messages": [AIMessage("over")]})

    inner = StateGraph(MessagesState)
    inner.add_node("agent", model_node(scripted(ai("thinking"))))
    inner.add_node("hand_off", hand_off)
    inner.add_edge(START, "agent")
    inner.add_edge("agent", "hand_off")
    team = inner.compile()

    async def delegate(state: MessagesState) -> Any:
        return await team.ainvoke(state, {"callbacks": [journal]})

    outer = StateGraph(MessagesState)
    outer.add_node("delegate", delegate)
    outer.add_node("done", lambda state: {})
    outer.add_edge(START, "delegate")
    outer.add_edge("delegate", END)
    await outer.compile().ainvoke(QUESTION)
    await journal.flush()
    events = await run_events(journal)
    assert types(events)[-1] == "run.end"
    assert events[-1]["content"]["messages"][0]["content"] == "over"
    assert journal.summary().status == "success"


FAILURES = (ConnectionError, RuntimeError)  # of FailingChatModel and explode


async def _leaf_calls(journal: RunJournal) -> list[tuple[list[str], str]]:
    """Each kind of leaf called with the journal inside a LangSmith trace: its events and the
    status of its run."""

    class Shelf(BaseRetriever):
        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return [Document(page_content=f"about {query}")]

    config: Any = {"callbacks": [journal]}
    call = {"type": "tool_call", "id": "call-1", "name": "add", "args": {"a": 2, "b": 3}}
    calls = [
        lambda: scripted(ai("Paris.")).ainvoke("Capital of France?", config),
        lambda: FakeListLLM(responses=["forty-two"]).ainvoke("The answer?", config),
        lambda: FailingChatModel(messages=iter([])).ainvoke("hi", config),
        lambda: add.ainvoke(call, config),
        lambda: explode.ainvoke({"reason": "no disk"}, config),
        lambda: Shelf().ainvoke("owls", config),
    ]
    found = []
    for make in calls:
        trace = RunTree(name="request", run_type="chain")
        with tracing_context(parent=trace, enabled=False), contextlib.suppress(*FAILURES):
            await make()
        await journal.flush()
        found.append((types(await run_events(journal)), journal.summary().status))
    return found


async def test_models_tools_and_retrievers_called_inside_a_langsmith_trace_are_runs(store):
    assert await _leaf_calls(RunJournal(event_store=store)) == [
        (["run.start", "llm.human.input", "llm.ai.response", "run.end"], "success"),
        (["run.start", "llm.ai.response", "run.end"], "success"),
        (["run.start", "llm.human.input", "llm.error", "run.error"], "error"),
        (["run.start", "llm.tool.result", "run.end"], "success"),
        (["run.start", "tool.error", "run.error"], "error"),
        (["run.start", "run.end"], "success"),
    ]


async def test_a_journal_among_the_callbacks_twice_records_each_run_once(store):
    journal = RunJournal(event_store=store)
    model = scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3."))
    # Bound and given again: the root's callbacks come twice (LangChain gives its children
    # each handler once).
    graph = agent_graph(model).with_config(callbacks=[journal])
    await graph.ainvoke(QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "t"}})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    events = await run_events(journal)
    answers = [e for e in events if e["event_type"] == "llm.ai.response"]
    assert [e["metadata"]["llm_call_index"] for e in answers] == [1, 2]
    assert (summary.status, summary.llm_call_count) == ("success", 2)
    assert journal._open_runs == 0  # else a store the journal opened would never close


async def test_a_journal_among_the_callbacks_twice_writes_one_resume(store):
    journal = RunJournal(event_store=store)
    model = scripted(ai("", calls=[("ask_human", {"question": "Proceed?"}, "h1")]), ai("Done."))
    graph = agent_graph(model, [ask_human], checkpointer=InMemorySaver())
    bound = graph.with_config(callbacks=[journal])
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "t"}}
    await bound.ainvoke(QUESTION, config)
    await bound.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "run.resume", "llm.tool.result", "llm.ai.response", "run.end"]
    assert summary.status == "success"


# -- recorders outside a run ---------------------------------------------------------------


async def test_a_fixed_id_journal_without_callbacks_writes_its_recordings(store):
    journal = RunJournal(run_id="run-7", thread_id="thread-7", event_store=store)
    assert journal.record_subagent_chunks(CHUNKS) == 2
    journal.record_middleware("guardrail", name="g", hook="before", action="allow", changes={})
    assert journal.record_memory_context(content_sha256=DIGEST)
    await journal.flush()
    events = await store.list_events("thread-7", "run-7")
    assert types(events) == [
        "subagent.start",
        "subagent.end",
        "middleware:guardrail",
        "context:memory",
    ]
    # No run of its own: the run's real journal owns its summary.
    assert await store.get_run_summary("thread-7", "run-7") is None


async def test_a_recorder_after_a_run_ended_attaches_to_that_run(store):
    journal = RunJournal(event_store=store)
    await agent_graph(scripted(ai("done"))).ainvoke(QUESTION, {"callbacks": [journal]})
    ended = journal.run_id
    journal.record_middleware("guardrail", name="g", hook="after", action="log", changes={})
    journal.record_external_llm_usage_records(
        [
            {
                "source_run_id": "x",
                "caller": "lead_agent",
                "model_name": "m",
                "input_tokens": 4,
                "output_tokens": 1,
            }
        ]
    )
    await journal.flush()
    assert journal.run_id == ended
    sequence, summary = await stored(journal)
    assert sequence[-2:] == ["run.end", "middleware:guardrail"]
    assert summary.total_tokens == 15 + 5


async def test_flush_writes_a_tool_error_held_for_a_retry():
    seen: list[list[str]] = []
    journal = RunJournal(event_store="memory://")

    async def check(state: MessagesState) -> dict[str, Any]:
        await journal.flush()
        events = await journal.event_store.list_events(journal.thread_id, journal.run_id)
        seen.append(types(events))
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node(
        "agent", model_node(scripted(ai("", calls=[("explode", {"reason": "r"}, "e1")])))
    )
    builder.add_node("tools", ToolNode([explode], handle_tool_errors=True))
    builder.add_node("check", check)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "tools")
    builder.add_edge("tools", "check")
    await builder.compile().ainvoke(QUESTION, {"callbacks": [journal]})
    assert seen == [["run.start", "llm.human.input", "llm.ai.response", "tool.error"]]
    await journal.flush()
    assert types(await run_events(journal)).count("tool.error") == 1


# -- one human input per question ----------------------------------------------------------


async def test_a_resume_after_interrupt_before_writes_no_human_input(store):
    graph = agent_graph(
        scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3")),
        checkpointer=InMemorySaver(),
    )
    graph.interrupt_before_nodes = ["tools"]
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "ib"}}
    await graph.ainvoke(QUESTION, config)
    await graph.ainvoke(None, config)
    await journal.flush()
    messages = await store.list_messages("ib", limit=100)
    assert [m["event_type"] for m in messages] == [
        "llm.human.input",
        "llm.ai.response",
        "llm.tool.result",
        "llm.ai.response",
    ]


async def test_a_resume_through_a_pass_through_node_writes_no_human_input(store):
    builder = StateGraph(MessagesState)
    builder.add_node("relay", lambda state: state)  # returns the whole, old state
    builder.add_node(
        "agent", model_node(scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3")))
    )
    builder.add_node("tools", ToolNode([add]))
    builder.add_edge(START, "relay")
    builder.add_edge("relay", "agent")
    builder.add_edge("tools", "relay")
    builder.add_conditional_edges(
        "agent", lambda s: "tools" if s["messages"][-1].tool_calls else END
    )
    graph = builder.compile(checkpointer=InMemorySaver(), interrupt_before=["tools"])
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "relay"}}
    await graph.ainvoke(QUESTION, config)
    await graph.ainvoke(None, config)
    await journal.flush()
    assert humans(await store.list_messages("relay", limit=100)) == ["What is 1 + 2?"]


async def test_a_question_paused_before_any_model_call_is_written_once(store):
    graph = agent_graph(scripted(ai("3")), checkpointer=InMemorySaver())
    graph.interrupt_before_nodes = ["agent"]
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "early"}}
    await graph.ainvoke(QUESTION, config)
    await graph.ainvoke(None, config)
    await journal.flush()
    assert humans(await store.list_messages("early", limit=100)) == ["What is 1 + 2?"]


def test_a_pydantic_state_input_brings_its_human_message():
    class Chat(BaseModel):
        messages: Annotated[list[AnyMessage], add_messages]

    builder = StateGraph(Chat)
    builder.add_node(
        "agent", lambda state: {"messages": [scripted(ai("hi")).invoke(state.messages)]}
    )
    builder.add_edge(START, "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    journal = RunJournal(event_store="memory://")
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "p"}}
    for _ in range(2):
        graph.invoke(Chat(messages=[HumanMessage("hello")]), config)
        assert humans(asyncio.run(run_events(journal))) == ["hello"]


async def test_a_model_given_the_journal_inside_a_node_is_part_of_the_run(store):
    journal = RunJournal(event_store=store)
    helper = scripted(ai("short", tokens=(100, 100)))

    async def summarise(state: MessagesState) -> dict[str, Any]:
        await helper.ainvoke([HumanMessage("summarise")], {"callbacks": [journal]})
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("summarise", summarise)
    builder.add_edge(START, "summarise")
    await builder.compile().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    assert summary.total_tokens == 200
    assert len(await store.list_run_summaries(journal.thread_id)) == 1


def background_graph(
    journal: RunJournal, spawn: Any, direct: bool, **compile_kwargs: Any
) -> tuple[Any, Any]:
    """A graph whose first node hands a call given the journal (a chain calling a model, or
    the model called ``direct``ly) to ``spawn``, and returns once the call started without
    waiting for it; the lead agent then answers "done" (10 + 5 tokens). Returns the graph and
    the event that lets the call's model answer ("late answer", 30 + 10 tokens)."""
    started, go = threading.Event(), threading.Event()

    def answers() -> Iterator[AIMessage]:
        started.set()  # the model call started: on_chat_model_start came before
        go.wait(timeout=30)
        yield ai("late answer", tokens=(30, 10))

    helper = ScriptedChatModel(messages=answers())

    def start(state: MessagesState) -> dict[str, Any]:
        prompt, config = [HumanMessage("sum up")], {"callbacks": [journal]}
        if direct:
            spawn(lambda: helper.invoke(prompt, config).content)
        else:
            spawn(lambda: RunnableLambda(lambda p: helper.invoke(p).content).invoke(prompt, config))
        started.wait(timeout=30)
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("start", start)
    builder.add_node("agent", model_node(scripted(ai("done", tokens=(10, 5)))))
    builder.add_edge(START, "start")
    builder.add_edge("start", "agent")
    return builder.compile(**compile_kwargs), go


async def late_call_follows_the_end(journal: RunJournal, store: RunEventStore) -> None:
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.human.input", "llm.ai.response", "run.end",
                        "llm.ai.response"]  # fmt: skip
    assert summary.total_tokens == 15 + 40 and summary.llm_call_count == 2
    assert summary.status == "success" and summary.message_count == 3
    assert summary.last_ai_message == "late answer"
    assert len(await store.list_run_summaries(journal.thread_id)) == 1


@pytest.mark.parametrize("direct", [False, True], ids=["chain", "model"])
async def test_a_call_still_running_when_its_run_ended_is_recorded_in_that_run(store, direct):
    """A call that a node leaves running (here a thread it does not wait for) joined the run
    while it was active: what it does after the run ended follows the run's end."""
    journal = RunJournal(event_store=store)
    # A thread pool that passes on the node's context, as LangChain's own does: the call
    # knows which run called it.
    with ContextThreadPoolExecutor(max_workers=1) as pool:
        futures: list[Any] = []
        graph, go = background_graph(
            journal, lambda work: futures.append(pool.submit(work)), direct
        )
        await graph.ainvoke(QUESTION, {"callbacks": [journal]})
        ended = journal.run_id
        go.set()
        assert await asyncio.wrap_future(futures[0]) == "late answer"
    await journal.flush()
    assert journal.run_id == ended
    await late_call_follows_the_end(journal, store)


def test_a_call_still_running_when_a_plain_invoke_returned_is_written_when_it_ends():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    with ContextThreadPoolExecutor(max_workers=1) as pool:
        futures: list[Any] = []
        graph, go = background_graph(journal, lambda work: futures.append(pool.submit(work)), False)
        graph.invoke(QUESTION, {"callbacks": [journal]})
        go.set()
        assert futures[0].result(timeout=30) == "late answer"
    # No flush: the late call's end wrote what it added, as a plain invoke's end does.
    asyncio.run(late_call_follows_the_end(journal, store))


def test_a_call_left_running_leaves_the_summary_of_a_later_run_under_its_id_alone():
    store = MemoryRunEventStore()
    journal = RunJournal(run_id="job", thread_id="t", event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "t"}}
    with ContextThreadPoolExecutor(max_workers=1) as pool:
        futures: list[Any] = []
        graph, go = background_graph(
            journal,
            lambda work: futures.append(pool.submit(work)),
            False,
            checkpointer=InMemorySaver(),
            interrupt_before=["agent"],
        )
        graph.invoke(QUESTION, config)  # paused before the agent; the call is left running
        graph.invoke(None, config)  # the resume: a second run under the same ids
        go.set()
        assert futures[0].result(timeout=30) == "late answer"
    summary = asyncio.run(store.get_run_summary("t", "job"))
    assert summary is not None and summary == journal.summary()
    assert summary.status == "success" and summary.total_tokens == 15
    events = asyncio.run(store.list_events("t", "job"))
    assert [e["event_type"] for e in events][-3:] == [
        "llm.ai.response",
        "run.end",
        "llm.ai.response",
    ]


async def test_calls_whose_end_never_comes_are_not_kept_forever():
    journal = RunJournal(event_store=MemoryRunEventStore())
    result = LLMResult(generations=[[ChatGeneration(message=ai("late", tokens=(3, 2)))]])
    for _ in range(1500):  # each run leaves a chain whose end never comes, as does its child
        root, left = uuid.uuid4(), uuid.uuid4()
        journal.on_chain_start(None, {}, run_id=root, name="graph")
        journal.on_chain_start(None, {}, run_id=left, parent_run_id=root)
        journal.on_chain_end({}, run_id=root)
        journal.on_chain_start(None, {}, run_id=uuid.uuid4(), parent_run_id=left)
    assert len(journal._runs) <= 1024 + 2  # the latest such calls only
    # The latest is still its run's.
    model = uuid.uuid4()
    journal.on_chat_model_start({}, [[HumanMessage("q")]], run_id=model, parent_run_id=left)
    journal.on_llm_end(result, run_id=model, parent_run_id=left)
    events = await run_events(journal, flush=True)
    assert [e["event_type"] for e in events] == [
        "run.start", "run.end", "llm.human.input", "llm.ai.response"
    ]  # fmt: skip
    assert journal.summary().total_tokens == 5


def approval_graph() -> Any:
    """Asks a human, adds the answer as a new human message, then lets the model reply."""

    def ask(state: MessagesState) -> dict[str, Any]:
        return {"messages": [HumanMessage(interrupt("Anything to add?"))]}

    return step_then_answer(ask, "Noted.", checkpointer=InMemorySaver())


async def test_a_resumed_node_adding_a_human_message_writes_that_one(store):
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "add"}}
    graph = approval_graph()
    await graph.ainvoke({"messages": [HumanMessage("Plan my trip")]}, config)
    await graph.ainvoke(Command(resume="Add a day in Rome"), config)
    await journal.flush()
    events = [e for e in await store.list_messages("add", limit=100)]
    # The question, recorded by the run that paused before any model saw it, then the answer.
    assert humans(events) == ["Plan my trip", "Add a day in Rome"]


async def test_a_node_building_the_human_message_from_other_input_writes_it(store):
    class Topic(TypedDict):
        topic: str
        messages: Annotated[list[AnyMessage], add_messages]

    def frame(state: Topic) -> dict[str, Any]:
        return {"messages": [HumanMessage(f"Tell me about {state['topic']}")]}

    builder = StateGraph(Topic)
    builder.add_node("frame", frame)
    builder.add_node("agent", model_node(scripted(ai("Owls hoot."))))
    builder.add_edge(START, "frame")
    builder.add_edge("frame", "agent")
    builder.add_edge("agent", END)
    journal = RunJournal(event_store=store)
    await builder.compile(checkpointer=InMemorySaver()).ainvoke(
        {"topic": "owls"}, {"callbacks": [journal], "configurable": {"thread_id": "topic"}}
    )
    await journal.flush()
    assert humans(await run_events(journal)) == ["Tell me about owls"]


@pytest.mark.parametrize("as_text", [False, True])
async def test_a_second_turn_repeating_the_same_words_writes_it_again(store, as_text):
    graph = agent_graph(scripted(ai("Hi!"), ai("Hi again!")), checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "twice"}}
    for _ in range(2):
        words: Any = "hello" if as_text else [HumanMessage("hello")]
        await graph.ainvoke({"messages": words}, config)
    await journal.flush()
    assert humans(await store.list_messages("twice", limit=100)) == ["hello", "hello"]


# -- reconciled tool messages --------------------------------------------------------------


async def test_tool_node_answers_to_unknown_tools_and_bad_arguments_are_outcomes(store):
    calls = [("no_such_tool", {}, "u1"), ("add", {"a": "one"}, "v1")]
    graph = agent_graph(scripted(ai("", calls=calls), ai("Sorry.")))
    journal = RunJournal(event_store=store)
    await graph.ainvoke(QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "tn"}})
    await journal.flush()
    events = await run_events(journal)
    outcomes = [
        (e["event_type"], e["metadata"].get("tool_call_id"))
        for e in events
        if e["event_type"] in ("llm.tool.result", "tool.error", "tool.unresolved")
    ]
    # The unknown tool never reached a tool callback: its ToolMessage is its result; the bad
    # arguments did reach one (the tool refused them), so that call ends as its error.
    assert sorted(outcomes) == [("llm.tool.result", "u1"), ("tool.error", "v1")]
    (result,) = [e for e in events if e["event_type"] == "llm.tool.result"]
    assert result["content"]["status"] == "error"
    assert "no_such_tool is not a valid tool" in result["content"]["content"]
    assert "llm.tool.result" in types(await store.list_messages("tn", limit=100))


async def test_a_tool_message_only_in_the_root_outputs_is_reconciled_once(store):
    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [ToolMessage("made up", tool_call_id="r1")]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", model_node(scripted(ai("", calls=[("add", {"a": 1, "b": 1}, "r1")]))))
    builder.add_node("answer", answer)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "answer")
    journal = RunJournal(event_store=store)
    await builder.compile().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, _ = await stored(journal)
    assert sequence == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "llm.tool.result",
        "run.end",
    ]


# -- Ctrl-C --------------------------------------------------------------------------------


def test_ctrl_c_in_a_sync_invoke_ends_the_run_cancelled():
    @tool
    def wait_for_user(prompt: str) -> str:
        """Wait until the user presses Ctrl-C."""
        raise KeyboardInterrupt

    graph = agent_graph(
        scripted(ai("", calls=[("wait_for_user", {"prompt": "?"}, "k1")])),
        [wait_for_user],
        handle_tool_errors=False,
    )
    journal = RunJournal(event_store="memory://")
    with pytest.raises(KeyboardInterrupt):
        graph.invoke(QUESTION, {"callbacks": [journal]})
    summary = journal.summary()
    assert summary.status == "cancelled"
    assert summary.error == {"type": "KeyboardInterrupt", "message": ""}
    events = asyncio.run(run_events(journal))
    assert types(events)[-2:] == ["tool.unresolved", "run.error"]
    assert events[-2]["content"]["reason"] == "cancelled"
    assert events[-1]["metadata"] == {"error_type": "KeyboardInterrupt"}


@pytest.mark.parametrize("sync", [True, False], ids=["invoke", "ainvoke"])
def test_a_tool_exiting_the_program_ends_the_run_cancelled_either_way(sync):
    @tool
    def leave(code: int) -> str:
        """Exit the program."""
        sys.exit(code)

    graph = agent_graph(
        scripted(ai("", calls=[("leave", {"code": 3}, "k1")])), [leave], handle_tool_errors=False
    )
    journal = RunJournal(event_store="memory://")
    with pytest.raises(SystemExit):
        if sync:
            graph.invoke(QUESTION, {"callbacks": [journal]})
        else:
            asyncio.run(graph.ainvoke(QUESTION, {"callbacks": [journal]}))
    assert journal.summary().status == "cancelled"
    events = asyncio.run(run_events(journal))
    assert types(events)[-2:] == ["tool.unresolved", "run.error"]
    assert events[-2]["content"]["reason"] == "cancelled"
    assert timeline_rows(events)[-1].status == "cancelled"


def test_a_tool_failing_with_a_cancelled_future_is_a_tool_error_not_a_stop():
    """``concurrent.futures.CancelledError`` is an ordinary failure of the code raising it."""

    @tool
    def fetch(url: str) -> str:
        """Fetch a page."""
        future: concurrent.futures.Future[str] = concurrent.futures.Future()
        future.cancel()
        return future.result()

    model = scripted(ai("", calls=[("fetch", {"url": "x"}, "f1")]), ai("it failed"))
    journal = RunJournal(event_store="memory://")
    agent_graph(model, [fetch]).invoke(QUESTION, {"callbacks": [journal]})
    assert journal.summary().status == "success"
    assert "tool.error" in types(asyncio.run(run_events(journal)))


# -- a forgotten flush ---------------------------------------------------------------------


NO_FLUSH = """
import asyncio, sys
from deerflow_journal import RunJournal, SqliteRunEventStore
from tests.journal.agents import QUESTION, agent_graph, ai, scripted

class FarStore(SqliteRunEventStore):  # a database 0.2 s away: writes are under way long
    async def put_batch(self, events):
        await asyncio.sleep(0.2)
        return await super().put_batch(events)

async def main():
    path, calls, owned = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["owned"]
    store = f"sqlite:///{path}" if owned else FarStore(path)
    journal = RunJournal(event_store=store)
    script = [ai("", calls=[("add", {"a": i, "b": 2}, f"c{i}")]) for i in range(calls)]
    config = {"callbacks": [journal], "configurable": {"thread_id": "t"}}
    await agent_graph(scripted(*script, ai("done"))).ainvoke(QUESTION, config)
    print(journal.run_id)

asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("owned", [False, True], ids=["store passed in", "store opened"])
@pytest.mark.parametrize("calls", [1, 12], ids=["one write", "writes under way"])
async def test_asyncio_run_returning_without_flush_loses_nothing(tmp_path, calls, owned):
    """Stored when ``asyncio.run`` returns, before anything else reads the store; with 12 tool
    calls (28 events), a write started from the thread a sync tool runs on is under way when
    the run ends."""
    path = tmp_path / "journal.db"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_FLUSH), str(path), str(calls)]
        + (["owned"] if owned else []),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    run_id = done.stdout.strip()
    assert "ERROR" not in done.stderr, done.stderr
    async with SqliteRunEventStore(path) as store:
        events = await store.list_events("t", run_id, limit=1000)
        summary = await store.get_run_summary("t", run_id)
    assert types(events) == [
        "run.start", "llm.human.input", *["llm.ai.response", "llm.tool.result"] * calls,
        "llm.ai.response", "run.end",
    ]  # fmt: skip
    assert summary is not None and summary.status == "success"


# -- stores plugged in through their public methods ------------------------------------------


async def test_a_subclass_overriding_put_batch_sees_every_write(backend: Backend):
    store = backend.make()
    batches: list[int] = []
    summaries: list[str] = []
    base = type(store)

    async def put_batch(self: RunEventStore, events: Any) -> Any:
        batches.append(len(events))
        return await base.put_batch(self, events)

    async def put_run_summary(self: RunEventStore, summary: RunSummary) -> Any:
        summaries.append(summary.status)
        return await base.put_run_summary(self, summary)

    store.__class__ = type(f"Counting{base.__name__}", (base,), {"put_batch": put_batch})
    async with store:
        journal = RunJournal(event_store=store, flush_threshold=2)
        await agent_graph(
            scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3"))
        ).ainvoke(QUESTION, {"callbacks": [journal]})
        await journal.flush()
        sequence, _ = await stored(journal)
        assert sum(batches) == len(sequence) == 6
        events = await run_events(journal)
        assert events[1]["content"]["content"] == "What is 1 + 2?"  # messages stored as dicts
        store.__class__ = type("Summaries", (base,), {"put_run_summary": put_run_summary})
        await agent_graph(scripted(ai("again"))).ainvoke(QUESTION, {"callbacks": [journal]})
        await journal.flush()
        assert summaries[-1] == "success"
        assert (await stored(journal))[1].status == "success"


class ListStore:
    """Not a RunEventStore: just the two methods a journal writes through."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.summaries: dict[tuple[str, str], RunSummary] = {}

    async def put_batch(self, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)

    async def put_run_summary(self, summary: RunSummary) -> None:
        self.summaries[summary.thread_id, summary.run_id] = summary


async def test_any_object_with_the_two_async_methods_is_a_journal_store():
    sink = ListStore()
    journal = RunJournal(event_store=sink)
    await agent_graph(scripted(ai("3"))).ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    assert [e["event_type"] for e in sink.events] == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "run.end",
    ]
    human = sink.events[1]
    assert human["content"]["type"] == "human" and human["run_id"] == journal.run_id
    assert isinstance(human["created_at"], str)
    assert sink.summaries[journal.thread_id, journal.run_id].status == "success"


def test_a_store_url_is_opened_and_owned_by_the_journal(tmp_path):
    url = f"sqlite:///{tmp_path / 'owned.db'}"
    journal = RunJournal(event_store=url)
    agent_graph(scripted(ai("3"))).invoke(QUESTION, {"callbacks": [journal]})
    journal.close()

    async def read() -> list[str]:
        async with open_store(url) as store:
            return types(await store.list_events(journal.thread_id, journal.run_id))

    assert asyncio.run(read()) == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


@pytest.mark.parametrize("bad", [42, object(), Path("x.db")])
def test_anything_else_as_event_store_is_a_type_error(bad):
    with pytest.raises(TypeError, match="event_store"):
        RunJournal(event_store=bad)


class Count(int):
    """An int subclass: a count as good as an int."""


@pytest.mark.parametrize("name", ["flush_threshold", "max_buffered_events"])
@pytest.mark.parametrize(
    ("bad", "error", "says"),
    [
        (True, TypeError, "must be an int, got True"),
        (2.0, TypeError, "must be an int, got 2.0"),
        ("10", TypeError, "must be an int, got '10'"),
        (0, ValueError, "must be at least 1, got 0"),
        (-5, ValueError, "must be at least 1, got -5"),
        (Count(0), ValueError, "must be at least 1, got 0"),
    ],
)
def test_a_count_that_is_not_a_positive_int_is_refused(name, bad, error, says):
    with pytest.raises(error, match=f"^{name} {says}$"):
        RunJournal(event_store=MemoryRunEventStore(), **{name: bad})


@pytest.mark.parametrize("name", ["flush_threshold", "max_buffered_events"])
def test_a_positive_int_subclass_is_a_count(name):
    RunJournal(event_store=MemoryRunEventStore(), **{name: Count(3)})


class DownStore(ListStore):
    """A store that is down for good."""

    async def put_batch(self, events: list[dict[str, Any]]) -> None:
        raise ConnectionError("store is down")


class FlakySummaries(ListStore):
    """Takes every batch; refuses every other run summary while it is up, all while down."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.calls = True, 0

    async def put_run_summary(self, summary: RunSummary) -> None:
        self.calls += 1
        if self.down or self.calls % 2 == 0:
            raise ConnectionError("timeout")
        await super().put_run_summary(summary)


@pytest.mark.parametrize(("runs", "bound"), [(3, 100_000), (15, 1000)], ids=["held", "spilled"])
async def test_summaries_a_store_takes_one_by_one_are_not_sent_again(runs, bound):
    """Each failed write starts over with the summaries not taken yet: with the store taking
    every other one, every run's summary is in after a few flushes (also once summaries
    past the journal's bound went to their file while the store was down)."""
    store = FlakySummaries()
    journal = RunJournal(event_store=store, max_buffered_events=bound)
    for _ in range(runs):
        await agent_graph(scripted(ai("hi"))).ainvoke(QUESTION, {"callbacks": [journal]})
        with contextlib.suppress(ConnectionError):
            await journal.flush()
    store.down = False
    for _ in range(2 * runs):
        with contextlib.suppress(ConnectionError):
            await journal.flush()
            break
    assert len(store.summaries) == runs
    assert all(summary.status == "success" for summary in store.summaries.values())
    assert [e["event_type"] for e in store.events].count("run.end") == runs


class RefusesOneSummary(MemoryRunEventStore):
    """Takes every batch; fails every run summary (a timeout) until told, then refuses one
    run's for good."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.refused_run = True, ""
        self.taken: list[str] = []  # the runs whose summaries it stored, in order
        self.refusals = 0

    async def put_run_summary(self, summary: RunSummary) -> RunSummary:
        if self.down:
            raise ConnectionError("timeout")
        if summary.run_id == self.refused_run:
            self.refusals += 1
            raise EventRefused("summary too large")
        stored = await super().put_run_summary(summary)
        self.taken.append(summary.run_id)
        return stored


@pytest.mark.parametrize(("runs", "bound"), [(3, 100_000), (15, 1000)], ids=["held", "spilled"])
async def test_a_summary_refused_among_others_is_dropped_alone(runs, bound, caplog):
    """The store refuses the second of the summaries one write sends: it alone is dropped and
    named, and those after it are still stored, once (also once summaries went to their file
    while the store failed them)."""
    store = RefusesOneSummary()
    journal = RunJournal(event_store=store, max_buffered_events=bound)
    keys = []
    for _ in range(runs):
        await agent_graph(scripted(ai("hi"))).ainvoke(QUESTION, {"callbacks": [journal]})
        keys.append((journal.thread_id, journal.run_id))
        with contextlib.suppress(ConnectionError):
            await journal.flush()
    if runs > 10:  # past the journal's bound of 10 summaries: the oldest are in their file
        assert journal._writer.buffer._summary_spill.count
    store.down = False
    refused_thread, refused_run = keys[1]
    store.refused_run = refused_run
    with caplog.at_level("ERROR", logger="deerflow_journal"):
        await journal.flush()  # does not raise: a refused summary is dropped, as events are
        await journal.flush()  # and is not sent again
    others = [run_id for _, run_id in keys if run_id != refused_run]
    assert store.taken == others and store.refusals == 1
    for thread_id, run_id in keys:
        summary = await store.get_run_summary(thread_id, run_id)
        assert (summary is None) if run_id == refused_run else (summary.status == "success")
        assert types(await store.list_events(thread_id, run_id))[-1] == "run.end"
    (error,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "dropped the run summary" in error
    assert refused_thread in error and refused_run in error


def test_what_cannot_be_written_before_the_loop_closes_is_named(caplog):
    journal = RunJournal(event_store=DownStore())

    async def main() -> None:
        await agent_graph(scripted(ai("3"))).ainvoke(QUESTION, {"callbacks": [journal]})

    with caplog.at_level("ERROR", logger="deerflow_journal"):
        asyncio.run(main())
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert f"4 events of runs {journal.run_id}" in record.getMessage()
    assert "await journal.flush()" in record.getMessage()


def test_a_journal_of_many_runs_names_a_few_of_those_it_could_not_write(caplog):
    journal = RunJournal(event_store=DownStore())
    run_ids = []

    async def main() -> None:
        for _ in range(8):
            await agent_graph(scripted(ai("3"))).ainvoke(QUESTION, {"callbacks": [journal]})
            run_ids.append(journal.run_id)

    with caplog.at_level("ERROR", logger="deerflow_journal"):
        asyncio.run(main())
    (record,) = [r for r in caplog.records if r.levelname == "ERROR"]
    named = sorted(run_ids)[:5]
    assert f"32 events of runs {', '.join(named)} and 3 more runs" in record.getMessage()
    assert not any(run_id in record.getMessage() for run_id in sorted(run_ids)[5:])


async def test_a_fixed_run_id_without_thread_keeps_recordings_for_its_run_or_flush(store):
    journal = RunJournal(run_id="job-1", event_store=store)
    journal.record_middleware("uploads", name="u", hook="before", action="add", changes={})
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "T-42"}}
    await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, config)
    await journal.flush()
    assert types(await store.list_events("T-42", "job-1"))[:2] == [
        "run.start",
        "middleware:uploads",
    ]
    idle = RunJournal(run_id="job-2", event_store=store)
    idle.record_middleware("uploads", name="u", hook="before", action="add", changes={})
    await idle.flush()  # no run will come: written under the thread named like the run
    assert types(await store.list_events("job-2", "job-2")) == ["middleware:uploads"]
