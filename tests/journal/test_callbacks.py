"""The journal's callback rules (which callback writes which event, see docs/events.md) with
real models, tools and graphs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode, tools_condition
from langgraph.prebuilt.tool_node import ToolCallWithContext
from langgraph.types import Command, RetryPolicy, Send, interrupt

from deerflow_journal import MemoryRunEventStore, RunEvent, RunJournal, user_scope
from deerflow_journal.journal.outcomes import ToolCallOutcomes
from tests.journal.agents import (
    ONE_TOOL_CALL_SEQUENCE,
    QUESTION,
    FailingChatModel,
    add,
    agent_graph,
    ai,
    ask_human,
    explode,
    model_node,
    run_events,
    scripted,
)

HANG_GUARD = 120  # seconds: a guard against a hang, not a time limit
COMPLETION_KEYS = {
    "total_input_tokens",
    "total_output_tokens",
    "total_tokens",
    "llm_call_count",
    "lead_agent_tokens",
    "subagent_tokens",
    "middleware_tokens",
    "token_usage_by_model",
    "message_count",
    "last_ai_message",
    "first_human_message",
}


def tool_script() -> tuple[AIMessage, AIMessage]:
    return (
        ai("", calls=[("add", {"a": 1, "b": 2}, "c1")], msg_id="m1"),
        ai("The answer is 3.", msg_id="m2", tokens=(20, 7)),
    )


def types(events: list[RunEvent]) -> list[str]:
    return [e["event_type"] for e in events]


def of_type(events: list[RunEvent], event_type: str) -> list[RunEvent]:
    return [e for e in events if e["event_type"] == event_type]


def outcomes_of(events: list[RunEvent], *, callers: bool = False) -> list[tuple[Any, ...]]:
    """Each tool-call outcome as (event type, [caller,] tool call id), in order."""
    return [
        (
            e["event_type"],
            *([e["metadata"].get("caller")] if callers else []),
            e["metadata"]["tool_call_id"],
        )
        for e in events
        if e["event_type"] in ("llm.tool.result", "tool.error", "tool.unresolved")
    ]


async def journaled(graph: Any, journal: RunJournal, *messages: Any, **config: Any) -> Any:
    inputs = {"messages": list(messages) or [HumanMessage("What is 1 + 2?")]}
    return await graph.ainvoke(inputs, {"callbacks": [journal], **config})


# -- model responses -----------------------------------------------------------------------


async def test_streamed_graph_messages_match_non_streamed_responses_and_usage():
    plain = RunJournal(event_store=MemoryRunEventStore())
    await journaled(agent_graph(scripted(*tool_script())), plain)
    streamed = RunJournal(event_store=MemoryRunEventStore())
    inputs = {"messages": [HumanMessage("What is 1 + 2?")]}
    chunks = [
        c
        async for c in agent_graph(scripted(*tool_script())).astream(
            inputs, {"callbacks": [streamed]}, stream_mode="messages"
        )
    ]
    assert len(chunks) > 4  # the model really streamed token chunks
    plain_events, streamed_events = (
        await run_events(plain, flush=True),
        await run_events(streamed, flush=True),
    )
    assert types(plain_events) == types(streamed_events)
    for a, b in zip(
        of_type(plain_events, "llm.ai.response"),
        of_type(streamed_events, "llm.ai.response"),
        strict=True,
    ):
        assert a["content"] == b["content"]
        assert a["metadata"]["usage"] == b["metadata"]["usage"]
    token_keys = COMPLETION_KEYS - {"message_count", "last_ai_message", "first_human_message"}
    assert {k: getattr(plain.summary(), k) for k in token_keys} == {
        k: getattr(streamed.summary(), k) for k in token_keys
    }


async def test_model_astream_inside_a_chain_matches_ainvoke():
    async def stream_it(question: str) -> str:
        model = scripted(ai("streamed words here", msg_id="s1", tokens=(8, 3)))
        return "".join([str(chunk.content) async for chunk in model.astream(question)])

    async def invoke_it(question: str) -> str:
        model = scripted(ai("streamed words here", msg_id="s1", tokens=(8, 3)))
        return str((await model.ainvoke(question)).content)

    results = []
    for body in (stream_it, invoke_it):
        journal = RunJournal(event_store=MemoryRunEventStore())
        await RunnableLambda(body).ainvoke("q", {"callbacks": [journal]})
        (response,) = of_type(await run_events(journal, flush=True), "llm.ai.response")
        results.append((response["content"], response["metadata"]["usage"], journal.summary()))
    assert results[0][0] == results[1][0] and results[0][0]["content"] == "streamed words here"
    assert results[0][1] == results[1][1] == {"input_tokens": 8, "output_tokens": 3,
                                              "total_tokens": 11}  # fmt: skip
    assert results[0][2].total_tokens == results[1][2].total_tokens == 11


async def test_completion_model_response_becomes_an_ai_message():
    llm = FakeListLLM(responses=["forty-two"])
    journal = RunJournal(event_store=MemoryRunEventStore())
    await RunnableLambda(lambda q: llm.invoke(q), name="ask").ainvoke("q", {"callbacks": [journal]})
    events = await run_events(journal, flush=True)
    assert types(events) == ["run.start", "llm.ai.response", "run.end"]
    response = events[1]
    assert response["content"]["type"] == "ai" and response["content"]["content"] == "forty-two"
    assert response["metadata"]["llm_call_index"] == 1
    assert journal.summary().llm_call_count == 1
    assert journal.summary().last_ai_message == "forty-two"


async def test_llm_error_is_journaled():
    async def call(question: str) -> Any:
        try:
            return await FailingChatModel(messages=iter([])).ainvoke(question)
        except ConnectionError:
            return "fallback"

    journal = RunJournal(event_store=MemoryRunEventStore())
    await RunnableLambda(call).ainvoke("q", {"callbacks": [journal]})
    events = await run_events(journal, flush=True)
    assert types(events) == ["run.start", "llm.human.input", "llm.error", "run.end"]
    assert events[2]["content"] == "model endpoint unreachable"


async def test_repeated_llm_end_counts_once():
    journal = RunJournal(event_store=MemoryRunEventStore())
    root, call = uuid.uuid4(), uuid.uuid4()
    result = LLMResult(generations=[[ChatGeneration(message=ai("hi", tokens=(3, 2)))]])
    journal.on_chain_start({"name": "root"}, {}, run_id=root)
    journal.on_chat_model_start({}, [[HumanMessage("q")]], run_id=call, parent_run_id=root)
    journal.on_llm_end(result, run_id=call, parent_run_id=root)
    journal.on_llm_end(result, run_id=call, parent_run_id=root)
    journal.on_chain_end({}, run_id=root)
    events = await run_events(journal, flush=True)
    assert types(events) == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    summary = journal.summary()
    assert (summary.llm_call_count, summary.total_tokens) == (1, 5)


async def test_usage_counts_as_the_model_reported_it_when_its_callback_ran():
    journal = RunJournal(event_store=MemoryRunEventStore())
    root, call = uuid.uuid4(), uuid.uuid4()
    message = ai("hi", tokens=(3, 2))
    journal.on_chain_start({"name": "root"}, {}, run_id=root)
    journal.on_chat_model_start({}, [[HumanMessage("q")]], run_id=call, parent_run_id=root)
    journal.on_llm_end(
        LLMResult(generations=[[ChatGeneration(message=message)]]), run_id=call, parent_run_id=root
    )
    message.usage_metadata["input_tokens"] = 1000  # type: ignore[index]  # changed afterwards
    assert journal.get_completion_data()["total_input_tokens"] == 3
    journal.on_chain_end({}, run_id=root)
    await journal.flush()


async def test_usage_reported_under_the_model_run_id_still_leaves_its_response():
    journal = RunJournal(event_store=MemoryRunEventStore())
    model = scripted(ai("answer from the model", tokens=(10, 5)))

    def call(state: MessagesState) -> dict[str, Any]:
        call_id = uuid.uuid4()  # reported as an external record before the call ends
        record = {"source_run_id": str(call_id), "input_tokens": 10, "output_tokens": 5}
        assert journal.record_external_llm_usage_records([record]) == 1
        return {"messages": [model.invoke(state["messages"], {"run_id": call_id})]}

    builder = StateGraph(MessagesState)
    builder.add_node("call", call)
    builder.add_edge(START, "call")
    await journaled(builder.compile(), journal)
    (response,) = of_type(await run_events(journal, flush=True), "llm.ai.response")
    assert response["content"]["content"] == "answer from the model"
    summary = journal.summary()
    assert (summary.llm_call_count, summary.total_tokens) == (1, 15)  # usage counted once
    assert summary.last_ai_message == "answer from the model"


class RewritingRetriever(BaseRetriever):
    """A retriever that asks a model to rewrite the query first, as multi-query retrievers do."""

    rewriter: Any

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        rewritten = self.rewriter.invoke(query, {"callbacks": run_manager.get_child()})
        return [Document(page_content=f"found for {rewritten.content}")]


async def test_model_calls_inside_a_retriever_belong_to_the_run():
    retriever = RewritingRetriever(rewriter=scripted(ai("rewritten query", tokens=(50, 10))))

    def search(state: MessagesState) -> dict[str, Any]:
        (document,) = retriever.invoke("query")
        return {"messages": [AIMessage(document.page_content)]}

    builder = StateGraph(MessagesState)
    builder.add_node("search", search)
    builder.add_edge(START, "search")
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(builder.compile(), journal)
    (response,) = of_type(await run_events(journal, flush=True), "llm.ai.response")
    assert response["content"]["content"] == "rewritten query"
    assert (journal.summary().llm_call_count, journal.summary().total_tokens) == (1, 60)


# -- human input ---------------------------------------------------------------------------


async def test_hidden_and_summary_human_messages_are_skipped():
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(
        agent_graph(scripted(ai("ok"))),
        journal,
        HumanMessage("the real question"),
        HumanMessage("injected context", additional_kwargs={"hide_from_ui": True}),
        HumanMessage("summary of earlier turns", name="summary"),
    )
    (human,) = of_type(await run_events(journal, flush=True), "llm.human.input")
    assert human["content"]["content"] == "the real question"
    assert journal.summary().first_human_message == "the real question"


async def test_a_question_without_text_is_written_and_leaves_first_human_message_none():
    journal = RunJournal(event_store=MemoryRunEventStore())
    photo = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    await journaled(agent_graph(scripted(ai("A cat."))), journal, HumanMessage(content=[photo]))
    (human,) = of_type(await run_events(journal, flush=True), "llm.human.input")
    assert human["content"]["content"] == [photo]
    assert journal.summary().first_human_message is None


@pytest.mark.parametrize("lead_agent_answers", [True, False], ids=["then-the-lead", "alone"])
async def test_a_tagged_agent_answering_first_comes_after_the_question(lead_agent_answers):
    # A planner (or, in a swarm, the agent a turn goes to) tagged as a subagent answers
    # before the lead agent, or instead of it.
    builder = StateGraph(MessagesState)
    builder.add_node("planner", model_node(scripted(ai("plan: add")), ["subagent:planner"]))
    builder.add_edge(START, "planner")
    if lead_agent_answers:
        builder.add_node("agent", model_node(scripted(ai("3"))))
        builder.add_edge("planner", "agent")
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(builder.compile(), journal)
    events = await run_events(journal, flush=True)
    assert [(e["event_type"], e["metadata"].get("caller")) for e in events[:3]] == [
        ("run.start", "lead_agent"),
        ("llm.human.input", "lead_agent"),
        ("llm.ai.response", "subagent:planner"),
    ]
    assert len(of_type(events, "llm.human.input")) == 1
    assert journal.summary().first_human_message == "What is 1 + 2?"


async def test_only_the_first_lead_agent_call_records_the_human_input():
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(agent_graph(scripted(*tool_script())), journal)
    events = await run_events(journal, flush=True)
    assert len(of_type(events, "llm.human.input")) == 1
    assert [e["metadata"]["llm_call_index"] for e in of_type(events, "llm.ai.response")] == [1, 2]


async def test_set_first_human_message_overrides_the_prompt():
    journal = RunJournal(event_store=MemoryRunEventStore())
    journal.set_first_human_message("as typed by the user")
    await journaled(agent_graph(scripted(ai("ok"))), journal)
    assert journal.summary().first_human_message == "as typed by the user"


# -- callers -------------------------------------------------------------------------------


async def test_middleware_model_calls_are_attributed_and_bucketed():
    graph = agent_graph(scripted(ai("summarised", tokens=(4, 4))), tags=["middleware:summarize"])
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(graph, journal)
    events = await run_events(journal, flush=True)
    # The question the run's inputs brought comes first, though no lead agent call saw it.
    assert types(events) == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    assert events[2]["metadata"]["caller"] == "middleware:summarize"
    summary = journal.summary()
    assert (summary.middleware_tokens, summary.lead_agent_tokens) == (8, 0)
    assert summary.last_ai_message is None


async def test_inner_caller_tags_win_over_a_root_tagged_lead_agent():
    research = agent_graph(scripted(ai("8", tokens=(9, 1)))).with_config(tags=["subagent:research"])
    summarize = model_node(scripted(ai("short", tokens=(4, 4))), tags=["middleware:summarize"])
    graph = StateGraph(MessagesState)
    graph.add_node("research", research)
    graph.add_node("summarize", summarize)
    graph.add_node("lead", model_node(scripted(ai("Research says 8.", tokens=(11, 4)))))
    graph.add_edge(START, "research")
    graph.add_edge("research", "summarize")
    graph.add_edge("summarize", "lead")
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(graph.compile(), journal, tags=["lead_agent"])
    responses = of_type(await run_events(journal, flush=True), "llm.ai.response")
    assert [(r["content"]["content"], r["metadata"]["caller"]) for r in responses] == [
        ("8", "subagent:research"),
        ("short", "middleware:summarize"),
        ("Research says 8.", "lead_agent"),
    ]
    summary = journal.summary()
    assert (summary.subagent_tokens, summary.middleware_tokens, summary.lead_agent_tokens) == (
        10,
        8,
        15,
    )


# -- tools ---------------------------------------------------------------------------------


@tool
def finish_task(result: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
    """Finish the task and update the state."""
    return Command(update={"messages": [ToolMessage(result, tool_call_id=tool_call_id)]})


async def test_command_tool_output_becomes_a_tool_result():
    model = scripted(ai("", calls=[("finish_task", {"result": "filed"}, "c7")]), ai("Done."))
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(agent_graph(model, [finish_task]), journal)
    events = await run_events(journal, flush=True)
    assert types(events) == ONE_TOOL_CALL_SEQUENCE
    assert events[3]["content"]["content"] == "filed"
    assert events[3]["content"]["tool_call_id"] == "c7"


@tool
def finish_with_one(result: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
    """Finish the task with a single message-like update, as add_messages accepts."""
    message = {"role": "tool", "content": result, "tool_call_id": tool_call_id}
    return Command(update={"messages": message})


async def test_command_with_a_single_message_like_update_is_one_tool_result():
    model = scripted(ai("", calls=[("finish_with_one", {"result": "filed"}, "c7")]), ai("Done."))
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(agent_graph(model, [finish_with_one]), journal)
    events = await run_events(journal, flush=True)
    (result,) = of_type(events, "llm.tool.result")
    assert (result["content"]["type"], result["content"]["content"]) == ("tool", "filed")
    assert result["metadata"]["tool_call_id"] == "c7"
    assert of_type(events, "tool.unresolved") == []


@tool
def transfer_to_b(
    tool_call_id: Annotated[str, InjectedToolCallId], state: Annotated[dict, InjectedState]
) -> Command:
    """Hand the conversation to agent b (a handoff tool, as supervisors and swarms use)."""
    done = ToolMessage("Transferred to b", tool_call_id=tool_call_id)
    return Command(goto="b", graph=Command.PARENT, update={"messages": [*state["messages"], done]})


def handoff_graph(*script: AIMessage, tools: Sequence[Any] = (add, transfer_to_b)) -> Any:
    """Agent a (a tool agent, as a subgraph) answers with ``script`` and may hand off to b,
    which answers "42"."""
    builder = StateGraph(MessagesState)
    builder.add_node("a", agent_graph(scripted(*script), tools), destinations=("b",))
    builder.add_node("b", model_node(scripted(ai("42"))))
    builder.add_edge(START, "a")
    return builder.compile(checkpointer=InMemorySaver())


async def projection_is_the_state(journal: RunJournal, state: dict[str, Any]) -> None:
    """The thread's stored messages are those of the graph's final state, each once."""
    await journal.flush()
    assert journal.thread_id is not None
    stored = await journal.event_store.list_messages(journal.thread_id, limit=100)
    assert [(m["content"]["type"], m["content"]["content"]) for m in stored] == [
        (m.type, m.content) for m in state["messages"]
    ]


async def test_a_command_repeating_the_conversation_adds_only_its_new_messages():
    """A handoff's update repeats the messages the state holds (add_messages keeps one of
    each, by id): only the message the tool added is its result."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    graph = handoff_graph(
        ai("", calls=[("add", {"a": 1, "b": 2}, "a1")]),
        ai("", calls=[("transfer_to_b", {}, "h1")]),
    )
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "handoff"}}
    state = await graph.ainvoke({"messages": [HumanMessage("add 1 and 2, then ask b")]}, config)
    assert len(state["messages"]) == 6
    await projection_is_the_state(journal, state)


@tool
def ask_then_transfer(
    tool_call_id: Annotated[str, InjectedToolCallId], state: Annotated[dict, InjectedState]
) -> Command:
    """Ask a human, then hand the conversation to agent b."""
    answer = interrupt("hand over?")
    done = ToolMessage(f"Transferred to b ({answer})", tool_call_id=tool_call_id)
    return Command(goto="b", graph=Command.PARENT, update={"messages": [*state["messages"], done]})


async def test_a_command_repeating_a_resumed_subgraph_adds_only_its_new_messages():
    """Resumed, agent a's subgraph starts from its own checkpoint: what the handoff repeats
    was written by the run that paused."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    graph = handoff_graph(
        ai("", calls=[("add", {"a": 1, "b": 2}, "a1")]),
        ai("", calls=[("ask_then_transfer", {}, "h1")]),
        tools=[add, ask_then_transfer],
    )
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "handoff"}}
    await graph.ainvoke({"messages": [HumanMessage("add 1 and 2, then ask b")]}, config)
    state = await graph.ainvoke(Command(resume="yes"), config)
    assert len(state["messages"]) == 6
    await projection_is_the_state(journal, state)


async def test_a_command_repeating_earlier_turns_adds_only_its_new_messages():
    journal = RunJournal(event_store=MemoryRunEventStore())
    graph = handoff_graph(ai("hello"), ai("", calls=[("transfer_to_b", {}, "h1")]))
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "handoff"}}
    await graph.ainvoke({"messages": [HumanMessage("hi")]}, config)
    state = await graph.ainvoke({"messages": [HumanMessage("ask b")]}, config)
    assert len(state["messages"]) == 6
    await projection_is_the_state(journal, state)


def retried_tools_agent(failures: int) -> Any:
    """A tool agent whose tools node is retried; its tool fails ``failures`` times first."""
    attempts: list[int] = []

    @tool
    def flaky(x: int) -> int:
        """Fail at first, then work."""
        attempts.append(x)
        if len(attempts) <= failures:
            raise ConnectionError(f"transient failure {len(attempts)}")
        return x

    model = scripted(ai("", calls=[("flaky", {"x": 1}, "r1")]), ai("ok"))
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model_node(model))
    retry = RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=False)
    graph.add_node("tools", ToolNode([flaky], handle_tool_errors=False), retry_policy=retry)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


def retried_pair_agent(first: Any, tags: list[str] | None = None, failures: int = 1) -> Any:
    """A tool agent asking for two calls at once, ``first`` (called c1) and a fetch (c2) that
    fails ``failures`` times; the tools node is tried twice, so ``first`` runs twice."""
    attempts: list[str] = []

    @tool
    def fetch(url: str) -> str:
        """Fail at first, then work."""
        attempts.append(url)
        if len(attempts) <= failures:
            raise ConnectionError(f"reset {len(attempts)}")
        return "<html/>"

    calls = [(first.name, {"a": 1, "b": 2} if first is add else {}, "c1")]
    calls += [("fetch", {"url": "x"}, "c2")]
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model_node(scripted(ai("", calls=calls), ai("done"))))
    retry = RetryPolicy(max_attempts=2, initial_interval=0.0, jitter=False)
    tools = ToolNode([first, fetch], handle_tool_errors=False)
    graph.add_node("tools", tools, retry_policy=retry)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile().with_config(tags=tags or [])


@pytest.mark.parametrize("tags", [None, ["subagent:researcher"]], ids=["lead", "subagent"])
async def test_a_call_answered_alike_before_its_node_was_retried_has_one_result(tags):
    """A tools node retried because one call failed runs its other call again: the same
    answer again is not a second result."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    state = await journaled(retried_pair_agent(add, tags), journal)
    events = await run_events(journal, flush=True)
    results = [e["metadata"]["tool_call_id"] for e in of_type(events, "llm.tool.result")]
    assert sorted(results) == ["c1", "c2"]
    assert of_type(events, "tool.error") == [] and of_type(events, "tool.unresolved") == []
    assert len(state["messages"]) == 5
    # A subagent's prompt is not the run's human input.
    assert journal.summary().message_count == (5 if tags is None else 4)


class ToolEnded(BaseCallbackHandler):
    """Sets ``ended`` once a tool's end or error callback has run (after the journal's: it
    follows it in the callbacks list)."""

    run_inline = True

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        self.ended.set()

    def on_tool_error(self, error: BaseException, **kwargs: Any) -> None:
        self.ended.set()


def slow_and_failing_calls_agent(caught: bool, fails: bool) -> tuple[Any, asyncio.Event]:
    """An agent asking for a slow call (c_slow, which waits for the event returned, then
    answers or ``fails``) and a failing one (c_boom) at once. The tools node runs them
    together and fails when c_boom does, leaving c_slow running; ``caught``: a node around
    it answers both calls itself."""
    release = asyncio.Event()

    @tool
    async def slow() -> str:
        """Answer (or fail) once released."""
        await release.wait()
        if fails:
            raise ConnectionError("too late")
        return "slow done"

    calls = [("slow", {}, "c_slow"), ("explode", {"reason": "boom"}, "c_boom")]
    tools = ToolNode([slow, explode], handle_tool_errors=False)

    async def answer_failures(state: MessagesState, config: RunnableConfig) -> Any:
        try:
            return await tools.ainvoke(state, config)
        except RuntimeError as error:
            asked = state["messages"][-1].tool_calls
            return {
                "messages": [ToolMessage(f"failed: {error}", tool_call_id=c["id"]) for c in asked]
            }

    graph = StateGraph(MessagesState)
    graph.add_node("agent", model_node(scripted(ai("", calls=calls), ai("done"))))
    graph.add_node("tools", answer_failures if caught else tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(), release


@pytest.mark.parametrize("fails", [False, True], ids=["late result", "late error"])
@pytest.mark.parametrize("caught", [False, True], ids=["run failed", "node answered"])
async def test_a_call_whose_tool_ends_after_its_outcome_keeps_that_one_outcome(caught, fails):
    """A tool that another call's failure left running ends after its call's outcome was
    written (the run's end; the node's own answer, which the model saw): its late result or
    error is not a second outcome."""
    graph, release = slow_and_failing_calls_agent(caught, fails)
    journal, ended = RunJournal(event_store=MemoryRunEventStore()), ToolEnded()
    config = {"callbacks": [journal, ended]}
    if caught:
        await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
    else:
        with pytest.raises(RuntimeError, match="boom"):
            await graph.ainvoke({"messages": [HumanMessage("go")]}, config)
    release.set()
    await asyncio.wait_for(ended.ended.wait(), 10)
    events = await run_events(journal, flush=True)
    outcomes = outcomes_of(events)
    slow = [outcome for outcome in outcomes if outcome[1] == "c_slow"]
    expected = "llm.tool.result" if caught else "tool.unresolved"
    assert slow == [(expected, "c_slow")]
    assert [o for o in outcomes if o[1] == "c_boom"] == [("tool.error", "c_boom")]
    if caught:
        (result,) = [e for e in events if e["event_type"] == "llm.tool.result"]
        assert result["content"]["content"] == "failed: tool exploded: boom"
    assert events[-1]["event_type"] == ("run.end" if caught else "run.error")
    assert journal.summary().message_count == (4 if caught else 2)


async def test_a_subagent_reusing_a_failed_call_id_keeps_its_new_result():
    """A subagent's model numbers its calls afresh: its failed call_0 is settled once its
    error is written (at its next model call), and the next call_0 is a new call."""
    sub = agent_graph(
        scripted(
            ai("", calls=[("explode", {"reason": "r"}, "call_0")]),
            ai("", calls=[("add", {"a": 1, "b": 2}, "call_0")]),
            ai("3"),
        ),
        tools=(add, explode),
    )

    async def delegate(state: MessagesState) -> dict[str, Any]:
        out = await sub.ainvoke(state, {"tags": ["subagent:math"]})
        return {"messages": [out["messages"][-1]]}

    builder = StateGraph(MessagesState)
    builder.add_node("delegate", delegate)
    builder.add_edge(START, "delegate")
    journal = RunJournal(event_store=MemoryRunEventStore())
    await builder.compile().ainvoke({"messages": [HumanMessage("1+2?")]}, {"callbacks": [journal]})
    outcomes = outcomes_of(await run_events(journal, flush=True))
    assert outcomes == [("tool.error", "call_0"), ("llm.tool.result", "call_0")]


@pytest.mark.parametrize("sub_fails", [True, False], ids=["subagent call failed", "answered"])
async def test_a_task_tool_and_its_subagent_sharing_a_call_id_keep_both_outcomes(sub_fails):
    """The lead agent's task tool (call_0) runs a subagent whose model numbers its calls
    afresh (call_0 too): the subagent's outcome, or its answer alike, takes nothing from the
    lead agent's."""
    first = (
        ("explode", {"reason": "r"}, "call_0") if sub_fails else ("add", {"a": 1, "b": 2}, "call_0")
    )
    sub = agent_graph(scripted(ai("", calls=[first]), ai("3")), tools=(add, explode))

    @tool
    async def task(description: str) -> str:
        """Delegate to a subagent."""
        out = await sub.ainvoke(
            {"messages": [HumanMessage(description)]}, {"tags": ["subagent:math"]}
        )
        return out["messages"][-1].content

    lead = agent_graph(
        scripted(ai("", calls=[("task", {"description": "1+2"}, "call_0")]), ai("3")), [task]
    )
    journal = RunJournal(event_store=MemoryRunEventStore())
    await lead.ainvoke({"messages": [HumanMessage("1+2?")]}, {"callbacks": [journal]})
    outcomes = outcomes_of(await run_events(journal, flush=True), callers=True)
    sub_outcome = "tool.error" if sub_fails else "llm.tool.result"
    assert outcomes == [
        (sub_outcome, "subagent:math", "call_0"),
        ("llm.tool.result", "lead_agent", "call_0"),
    ]


async def test_a_subagent_answering_its_call_0_leaves_the_lead_agent_s_call_0_waiting():
    """The subagent answers its own call_0 and then pauses: the lead agent's call_0 (the task
    tool running it) is still waiting, so it ends unresolved when the run pauses."""
    sub_model = scripted(
        ai("", calls=[("add", {"a": 1, "b": 2}, "call_0")]),
        ai("", calls=[("ask_human", {"question": "ok?"}, "s_ask")]),
        ai("sub done"),
    )
    sub = agent_graph(sub_model, [add, ask_human])

    @tool
    async def task(description: str) -> str:
        """Run a subagent."""
        tagged = {"tags": ["subagent:general"]}
        out = await sub.ainvoke({"messages": [HumanMessage(description)]}, tagged)
        return out["messages"][-1].content

    lead = scripted(ai("", calls=[("task", {"description": "research"}, "call_0")]), ai("done"))
    graph = agent_graph(lead, [task], checkpointer=InMemorySaver())
    journal = RunJournal(event_store=MemoryRunEventStore())
    await graph.ainvoke(QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "t"}})
    outcomes = outcomes_of(await run_events(journal, flush=True), callers=True)
    assert outcomes == [
        ("llm.tool.result", "subagent:general", "call_0"),
        ("tool.unresolved", None, "call_0"),
    ]


async def test_parallel_subagents_sharing_a_call_id_keep_each_outcome():
    """Two instances of one subagent run at once, each model numbering its calls call_0: the
    one failing while the other's tool still runs takes nothing from it."""
    b_started, a_done = asyncio.Event(), asyncio.Event()

    @tool
    async def boom(reason: str) -> str:
        """Fail once the other call runs."""
        await b_started.wait()
        raise RuntimeError("boom")

    @tool
    async def slow(q: str) -> str:
        """Answer once the other subagent is done."""
        b_started.set()
        await a_done.wait()
        return "B result"

    sub_a = agent_graph(
        scripted(ai("", calls=[("boom", {"reason": "r"}, "call_0")]), ai("A")), [boom]
    )
    sub_b = agent_graph(scripted(ai("", calls=[("slow", {"q": "x"}, "call_0")]), ai("B")), [slow])

    async def run_a(state: MessagesState) -> dict[str, Any]:
        out = await sub_a.ainvoke({"messages": [HumanMessage("a")]}, {"tags": ["subagent:gp"]})
        a_done.set()
        return {"messages": [out["messages"][-1]]}

    async def run_b(state: MessagesState) -> dict[str, Any]:
        out = await sub_b.ainvoke({"messages": [HumanMessage("b")]}, {"tags": ["subagent:gp"]})
        return {"messages": [out["messages"][-1]]}

    graph = StateGraph(MessagesState)
    graph.add_node("a", run_a)
    graph.add_node("b", run_b)
    graph.add_edge(START, "a")
    graph.add_edge(START, "b")
    journal = RunJournal(event_store=MemoryRunEventStore())
    await graph.compile().ainvoke({"messages": [HumanMessage("go")]}, {"callbacks": [journal]})
    outcomes = outcomes_of(await run_events(journal, flush=True))
    assert sorted(outcomes) == [("llm.tool.result", "call_0"), ("tool.error", "call_0")]


@pytest.mark.parametrize("caller", ["lead_agent", "subagent:research"])
async def test_a_call_id_a_model_uses_again_is_a_new_call_with_its_own_result(caller: str):
    """Some models number their calls afresh each turn: the same id asked for again, and
    answered alike, is a second call and a second result, the lead agent's or a subagent's."""
    same = ("add", {"a": 1, "b": 2}, "call_0")
    journal = RunJournal(event_store=MemoryRunEventStore())
    model = scripted(ai("", calls=[same]), ai("", calls=[same]), ai("3"))
    graph = agent_graph(model)
    if caller != "lead_agent":  # the whole agent tagged, as a node of the lead's graph
        outer = StateGraph(MessagesState)
        outer.add_node("research", graph.with_config(tags=[caller]))
        outer.add_edge(START, "research")
        graph = outer.compile()
    state = await journaled(graph, journal)
    events = await run_events(journal, flush=True)
    results = of_type(events, "llm.tool.result")
    assert [(r["metadata"]["caller"], r["content"]["content"]) for r in results] == [
        (caller, "3"),
        (caller, "3"),
    ]
    assert sum(m.type == "tool" for m in state["messages"]) == 2
    if caller == "lead_agent":
        assert journal.summary().message_count == len(state["messages"]) == 6


def ticket_stamp() -> tuple[Any, list[str]]:
    """A tool answering each call with a new ticket number, and the numbers it gave."""
    tickets: list[str] = []

    @tool
    def stamp() -> str:
        """Return a new ticket number."""
        tickets.append(f"ticket-{len(tickets) + 1}")
        return tickets[-1]

    return stamp, tickets


async def test_a_call_answered_otherwise_after_its_node_was_retried_has_the_retrys_answer():
    """LangGraph drops what a failed attempt of a node returned: the call's one result is
    the retry's answer, the one the state, and so the model, has."""
    stamp, tickets = ticket_stamp()
    journal = RunJournal(event_store=MemoryRunEventStore())
    state = await journaled(retried_pair_agent(stamp), journal)
    events = await run_events(journal, flush=True)
    answers = [e["content"]["content"] for e in of_type(events, "llm.tool.result")]
    assert answers == ["ticket-2", "<html/>"] and tickets == ["ticket-1", "ticket-2"]
    assert answers == [m.content for m in state["messages"] if m.type == "tool"]
    assert journal.summary().message_count == len(state["messages"]) == 5


async def test_a_call_of_a_node_failing_every_retry_has_one_result_the_last():
    """Each attempt of the tools node answers c1 anew and fails on c2: each call has one
    outcome, c1 the last attempt's answer and c2 the last error."""
    stamp, tickets = ticket_stamp()
    journal = RunJournal(event_store=MemoryRunEventStore())
    with pytest.raises(ConnectionError):
        await journaled(retried_pair_agent(stamp, failures=2), journal)
    events = await run_events(journal, flush=True)
    assert tickets == ["ticket-1", "ticket-2"]
    assert outcomes_of(events) == [("tool.error", "c2"), ("llm.tool.result", "c1")]
    assert [e["content"]["content"] for e in of_type(events, "llm.tool.result")] == ["ticket-2"]
    assert of_type(events, "tool.error")[0]["content"]["error"] == "reset 2"
    assert types(events)[-1] == "run.error"


async def test_a_tool_result_a_node_gets_before_calling_its_model_comes_before_the_answer():
    """Results wait for the node that made their call to end, but not past a model call:
    that call came after them."""
    model = scripted(ai("3"))

    async def look_up_then_answer(state: MessagesState) -> dict[str, Any]:
        call = {"name": "add", "args": {"a": 1, "b": 2}, "id": "t1", "type": "tool_call"}
        found = await add.ainvoke(call)
        return {"messages": [found, await model.ainvoke([*state["messages"], found])]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", look_up_then_answer)
    graph.add_edge(START, "answer")
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(graph.compile(), journal)
    written = types(await run_events(journal, flush=True))
    assert written.index("llm.tool.result") < written.index("llm.ai.response")


async def test_a_subagent_model_called_by_a_sibling_tool_leaves_the_results_waiting():
    """A task tool runs a subagent while its sibling's result waits for their tools node,
    which fails later: the subagent's model call does not write that result, so the node's
    retry replaces it."""
    tickets: list[str] = []
    helper = scripted(ai("found 1"), ai("found 2"))
    fetched: list[str] = []

    @tool
    async def stamp() -> str:
        """Return a new ticket number."""
        tickets.append(f"ticket-{len(tickets) + 1}")
        return tickets[-1]

    @tool
    async def task(q: str) -> str:
        """Ask a subagent (once stamp has answered)."""
        await asyncio.sleep(0.01)
        return str((await helper.ainvoke([HumanMessage(q)], {"tags": ["subagent:x"]})).content)

    @tool
    async def fetch(url: str) -> str:
        """Fail the first time, once the subagent has been asked."""
        fetched.append(url)
        await asyncio.sleep(0.05)
        if len(fetched) == 1:
            raise ConnectionError("reset")
        return "<html/>"

    calls = [("stamp", {}, "c1"), ("task", {"q": "q"}, "c2"), ("fetch", {"url": "x"}, "c3")]
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model_node(scripted(ai("", calls=calls), ai("done"))))
    retry = RetryPolicy(max_attempts=2, initial_interval=0.0, jitter=False)
    tools = ToolNode([stamp, task, fetch], handle_tool_errors=False)
    graph.add_node("tools", tools, retry_policy=retry)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    journal = RunJournal(event_store=MemoryRunEventStore())
    state = await journaled(graph.compile(), journal)
    events = await run_events(journal, flush=True)
    kept = [m.content for m in state["messages"] if m.type == "tool" and m.tool_call_id == "c1"]
    written = [
        e["content"]["content"]
        for e in of_type(events, "llm.tool.result")
        if e["metadata"]["tool_call_id"] == "c1"
    ]
    assert written == kept == ["ticket-2"]


async def test_a_tool_result_comes_before_the_answer_of_the_agent_it_hands_over_to():
    """A handoff (``Command.PARENT``) ends its tools node with a control-flow error: its
    result is written then, not held as a failed attempt's."""

    @tool
    def transfer_to_b(
        tool_call_id: Annotated[str, InjectedToolCallId], state: Annotated[dict, InjectedState]
    ) -> Command:
        """Hand over to b."""
        done = ToolMessage("Transferred to b", tool_call_id=tool_call_id)
        return Command(
            goto="b", graph=Command.PARENT, update={"messages": [*state["messages"], done]}
        )

    agent_a = agent_graph(scripted(ai("", calls=[("transfer_to_b", {}, "h1")])), [transfer_to_b])
    graph = StateGraph(MessagesState)
    graph.add_node("a", agent_a, destinations=("b",))
    graph.add_node("b", model_node(scripted(ai("42")), ["subagent:b"]))
    graph.add_edge(START, "a")
    journal = RunJournal(event_store=MemoryRunEventStore())
    state = await journaled(graph.compile(), journal)
    events = await run_events(journal, flush=True)
    messages = [e["content"]["content"] for e in events if e["category"] == "message"]
    assert (
        messages
        == [m.content for m in state["messages"]]
        == [
            "What is 1 + 2?",
            "",
            "Transferred to b",
            "42",
        ]
    )


async def test_a_tool_called_by_a_tool_has_its_result_first():
    """A tool's result waits for a graph node only: one a tool called is written as it ends."""

    @tool
    async def outer(x: int) -> str:
        """Add 2 with the add tool."""
        call = {"name": "add", "args": {"a": x, "b": 2}, "id": "inner1", "type": "tool_call"}
        found = await add.ainvoke(call)
        return f"outer got {found.content}"

    model = scripted(ai("", calls=[("outer", {"x": 1}, "c1")]), ai("done"))
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(agent_graph(model, [outer, add]), journal)
    events = await run_events(journal, flush=True)
    assert outcomes_of(events) == [("llm.tool.result", "inner1"), ("llm.tool.result", "c1")]


def test_a_result_ending_while_its_node_fails_on_another_thread_is_held(monkeypatch):
    """A tool ending on a worker thread while its node's error comes on another: the error
    waits for the result and holds it, so the retry's answer replaces it."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    root, first, second, tool_1, tool_2 = (uuid.uuid4() for _ in range(5))
    journal.on_chain_start({}, {"messages": [HumanMessage("go")]}, run_id=root, name="graph")
    journal.on_chain_start({}, {}, run_id=first, parent_run_id=root, name="tools")
    journal.on_tool_start({}, "", run_id=tool_1, parent_run_id=first, tool_call_id="c1")
    inside, go_on = threading.Event(), threading.Event()
    answered = ToolCallOutcomes.answered

    def answered_slowly(self: ToolCallOutcomes, *args: Any) -> bool:
        inside.set()  # the tool's end holds the journal's lock here
        go_on.wait(HANG_GUARD)
        return answered(self, *args)

    monkeypatch.setattr(ToolCallOutcomes, "answered", answered_slowly)
    ending = threading.Thread(
        target=journal.on_tool_end,
        args=(ToolMessage("ticket-1", tool_call_id="c1"),),
        kwargs={"run_id": tool_1, "parent_run_id": first},
    )
    ending.start()
    assert inside.wait(HANG_GUARD)
    failing = threading.Thread(
        target=journal.on_chain_error,
        args=(ConnectionError("reset"),),
        kwargs={"run_id": first, "parent_run_id": root},
    )
    failing.start()
    failing.join(0.5)  # gives it the time to reach the lock (or, unlocked, to end)
    go_on.set()
    ending.join(HANG_GUARD)
    failing.join(HANG_GUARD)
    monkeypatch.undo()
    journal.on_chain_start({}, {}, run_id=second, parent_run_id=root, name="tools")
    journal.on_tool_start({}, "", run_id=tool_2, parent_run_id=second, tool_call_id="c1")
    journal.on_tool_end(
        ToolMessage("ticket-2", tool_call_id="c1"), run_id=tool_2, parent_run_id=second
    )
    journal.on_chain_end({}, run_id=second, parent_run_id=root)
    journal.on_chain_end({"messages": []}, run_id=root)
    events = asyncio.run(run_events(journal, flush=True))
    assert [e["content"]["content"] for e in of_type(events, "llm.tool.result")] == ["ticket-2"]


async def test_a_retried_tool_call_that_succeeds_has_only_its_result():
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(retried_tools_agent(failures=1), journal)
    events = await run_events(journal, flush=True)
    assert types(events) == ONE_TOOL_CALL_SEQUENCE


async def test_a_tool_call_failing_every_retry_has_one_error():
    journal = RunJournal(event_store=MemoryRunEventStore())
    with pytest.raises(ConnectionError):
        await journaled(retried_tools_agent(failures=3), journal)
    events = await run_events(journal, flush=True)
    assert types(events) == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "tool.error",
        "run.error",
    ]
    assert events[3]["content"]["error"] == "transient failure 3"


async def test_tool_calls_stopped_by_control_flow_are_unresolved_with_their_own_reason():
    """Each call runs in its own task: one fails the run, one pauses, one is cancelled."""
    sleeping, paused = asyncio.Event(), asyncio.Event()

    @tool
    async def slow(topic: str) -> str:
        """Wait long (cancelled when a sibling fails)."""
        sleeping.set()
        await asyncio.Event().wait()
        return topic

    @tool
    def pause(question: str) -> str:
        """Ask a human."""
        paused.set()
        return str(interrupt(question))

    @tool
    async def boom(reason: str) -> str:
        """Fail once both siblings are under way."""
        await sleeping.wait()
        await paused.wait()
        raise RuntimeError(reason)

    def one_task_per_call(state: MessagesState) -> list[Send]:
        calls = state["messages"][-1].tool_calls
        return [Send("tools", ToolCallWithContext(__type="tool_call_with_context",
                                                  tool_call=call, state=state))
                for call in calls]  # fmt: skip

    calls = [("slow", {"topic": "x"}, "s1"), ("pause", {"question": "?"}, "p1"),
             ("boom", {"reason": "no"}, "b1")]  # fmt: skip
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model_node(scripted(ai("", calls=calls))))
    graph.add_node("tools", ToolNode([slow, pause, boom], handle_tool_errors=False))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", one_task_per_call, ["tools"])
    journal = RunJournal(event_store=MemoryRunEventStore())
    with pytest.raises(RuntimeError, match="no"):
        await journaled(graph.compile(checkpointer=InMemorySaver()), journal,
                        configurable={"thread_id": "t"})  # fmt: skip
    events = await run_events(journal, flush=True)
    assert types(events)[-4:] == ["tool.error", "tool.unresolved", "tool.unresolved", "run.error"]
    assert types(events).count("tool.error") == 1  # an interrupt or a cancellation is no error
    outcomes = {e["content"]["tool_call_id"]: e["content"] for e in events[-4:-1]}
    assert outcomes["b1"]["error"] == "no"
    assert (outcomes["s1"]["reason"], outcomes["p1"]["reason"]) == ("cancelled", "interrupted")
    assert journal.summary().status == "error"


# -- chains --------------------------------------------------------------------------------


async def test_nested_chain_errors_produce_one_run_error():
    def inner(_: Any) -> Any:
        raise KeyError("missing")

    nested = RunnableLambda(lambda x: x) | RunnableLambda(inner)
    graph = StateGraph(MessagesState)
    graph.add_node("work", nested)
    graph.add_edge(START, "work")
    journal = RunJournal(event_store=MemoryRunEventStore())
    with pytest.raises(KeyError):
        await journaled(graph.compile(), journal)
    events = await run_events(journal, flush=True)
    assert types(events) == ["run.start", "run.error"]
    assert events[1]["content"] == "'missing'"
    assert events[1]["metadata"]["error_type"] == "KeyError"
    summary = journal.summary()
    assert summary.status == "error"
    assert summary.error == {"type": "KeyError", "message": "'missing'"}


# -- recorders -----------------------------------------------------------------------------


class LoopDetectionJournal(RunJournal):
    """A journal that adds its own middleware tag."""

    def record_loop_detection(self, *, repeated_calls: int) -> None:
        self.record_middleware(
            "loop_detection",
            name="LoopDetection",
            hook="after_model",
            action="warned",
            changes={"repeated_calls": repeated_calls},
        )


async def test_subclass_adds_a_custom_middleware_tag():
    journal = LoopDetectionJournal(event_store=MemoryRunEventStore())

    def detect(state: MessagesState) -> dict[str, Any]:
        journal.record_loop_detection(repeated_calls=3)
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("detect", detect)
    graph.add_edge(START, "detect")
    await journaled(graph.compile(), journal)
    events = await run_events(journal, flush=True)
    assert types(events) == ["run.start", "middleware:loop_detection", "run.end"]
    assert events[1]["category"] == "middleware"
    assert events[1]["content"] == {
        "name": "LoopDetection",
        "hook": "after_model",
        "action": "warned",
        "changes": {"repeated_calls": 3},
    }


def test_record_middleware_rejects_a_tag_over_21_characters():
    journal = RunJournal(event_store=MemoryRunEventStore())
    with pytest.raises(ValueError, match="suffix"):
        journal.record_middleware("t" * 22, name="n", hook="h", action="a", changes={})


@pytest.mark.parametrize("tag", ["guard\nrail", "guard\x00", "bad\ud800"])
def test_record_middleware_rejects_a_tag_no_store_can_keep(tag):
    # Refused when recorded: once buffered, the store would drop the event with a log line.
    journal = RunJournal(event_store=MemoryRunEventStore())
    with pytest.raises(ValueError, match="middleware tag"):
        journal.record_middleware(tag, name="n", hook="h", action="a", changes={})


async def test_a_call_with_several_choices_counts_its_usage_once():
    # Like ChatOpenAI with n=2: each choice carries the usage of the whole call.
    choices = [
        ChatGeneration(message=ai(f"choice {i}", tokens=(100, 20), model="m")) for i in range(2)
    ]
    journal = RunJournal(event_store=MemoryRunEventStore())
    root, call = uuid.uuid4(), uuid.uuid4()
    journal.on_chain_start(None, {}, run_id=root, name="agent")
    journal.on_chat_model_start({}, [[HumanMessage("hi")]], run_id=call, parent_run_id=root)
    journal.on_llm_end(LLMResult(generations=[choices]), run_id=call, parent_run_id=root)
    journal.on_chain_end({}, run_id=root)
    await journal.flush()
    summary = journal.summary()
    assert (summary.total_tokens, summary.llm_call_count) == (120, 1)
    assert summary.token_usage_by_model["m"]["total_tokens"] == 120
    responses = [e for e in await run_events(journal) if e["event_type"] == "llm.ai.response"]
    assert len(responses) == 2  # each choice is still written


def test_external_usage_records_are_checked_before_any_counts():
    journal = RunJournal(event_store=MemoryRunEventStore())
    good = {"source_run_id": "a", "input_tokens": 10, "output_tokens": 5}
    with pytest.raises(TypeError, match="usage record 1 must be a dict"):
        journal.record_external_llm_usage_records([good, None])  # type: ignore[list-item]
    assert journal.get_completion_data()["total_tokens"] == 0


async def test_memory_context_is_recorded_once_per_run():
    journal = RunJournal(event_store=MemoryRunEventStore())
    digest = "0f" * 32

    def remember(state: MessagesState) -> dict[str, Any]:
        assert journal.record_memory_context(content_sha256=digest) is True
        assert journal.record_memory_context(content_sha256="1e" * 32) is False
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("remember", remember)
    graph.add_edge(START, "remember")
    await journaled(graph.compile(), journal)
    (memory,) = of_type(await run_events(journal, flush=True), "context:memory")
    assert memory["category"] == "context"
    assert memory["content"] == {"content_sha256": digest}
    with pytest.raises(ValueError):
        journal.record_memory_context(content_sha256="not-a-digest")


async def test_recorders_before_the_run_starts_land_right_after_run_start():
    journal = RunJournal(event_store=MemoryRunEventStore())
    journal.record_memory_context(content_sha256="ab" * 32)
    journal.record_middleware("guardrail", name="g", hook="before_agent", action="ok", changes={})
    await journaled(agent_graph(scripted(ai("ok"))), journal)
    assert types(await run_events(journal, flush=True))[:3] == [
        "run.start",
        "context:memory",
        "middleware:guardrail",
    ]


async def test_external_usage_records_join_the_run_totals():
    journal = RunJournal(event_store=MemoryRunEventStore())

    def delegate(state: MessagesState) -> dict[str, Any]:
        record = {
            "source_run_id": "sub-1",
            "caller": "subagent:web",
            "model_name": "web-model",
            "input_tokens": 30,
            "output_tokens": 10,
        }
        assert journal.record_external_llm_usage_records([record, record]) == 1
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("delegate", delegate)
    graph.add_edge(START, "delegate")
    await journaled(graph.compile(), journal)
    summary = journal.summary()
    assert (summary.subagent_tokens, summary.total_tokens, summary.llm_call_count) == (40, 40, 1)
    assert summary.token_usage_by_model == {
        "web-model": {"input_tokens": 30, "output_tokens": 10, "total_tokens": 40}
    }


async def test_recorders_act_on_the_run_that_calls_them_when_runs_overlap():
    journal = RunJournal(event_store=MemoryRunEventStore())
    other_started = asyncio.Event()

    def graph(name: str) -> Any:
        async def record(state: MessagesState) -> dict[str, Any]:
            if name == "a":
                await other_started.wait()  # "b" started after "a": it is the latest run
            else:
                other_started.set()
            journal.record_middleware("guardrail", name=name, hook="h", action="a", changes={})
            journal.record_memory_context(content_sha256=name * 64)
            journal.set_first_human_message(f"asked in {name}")
            record = {"source_run_id": f"sub-{name}", "input_tokens": 1, "output_tokens": 1}
            journal.record_external_llm_usage_records([record])
            return {}

        builder = StateGraph(MessagesState)
        builder.add_node("record", record)
        builder.add_edge(START, "record")
        return builder.compile()

    await asyncio.gather(
        *(journaled(graph(name), journal, configurable={"thread_id": name}) for name in "ab")
    )
    await journal.flush()
    for name in "ab":
        (summary,) = await journal.event_store.list_run_summaries(name)
        events = await journal.event_store.list_events(name, summary.run_id)
        assert types(events) == ["run.start", "middleware:guardrail", "context:memory", "run.end"]
        assert events[1]["content"]["name"] == name
        assert events[2]["content"] == {"content_sha256": name * 64}
        assert (summary.first_human_message, summary.total_tokens) == (f"asked in {name}", 2)


def test_usage_reported_right_after_a_run_ended_counts_toward_that_run():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    agent_graph(scripted(ai("first"))).invoke(QUESTION, {"callbacks": [journal]})
    first = journal.summary()
    record = {"source_run_id": "sub-1", "caller": "subagent:web", "input_tokens": 100,
              "output_tokens": 50}  # fmt: skip
    assert journal.record_external_llm_usage_records([record]) == 1
    assert journal.summary().subagent_tokens == 150
    again = asyncio.run(store.get_run_summary(first.thread_id, first.run_id))
    assert again is not None and (again.subagent_tokens, again.total_tokens) == (150, 165)
    agent_graph(scripted(ai("second"))).invoke(QUESTION, {"callbacks": [journal]})
    assert journal.summary().run_id != first.run_id
    assert journal.summary().subagent_tokens == 0


# -- completion data and summary -----------------------------------------------------------


async def test_completion_data_has_exactly_the_listed_keys():
    journal = RunJournal(event_store=MemoryRunEventStore())
    assert set(journal.get_completion_data()) == COMPLETION_KEYS
    await journaled(agent_graph(scripted(*tool_script())), journal)
    data = journal.get_completion_data()
    assert set(data) == COMPLETION_KEYS
    assert data == {
        "total_input_tokens": 30,
        "total_output_tokens": 12,
        "total_tokens": 42,
        "llm_call_count": 2,
        "lead_agent_tokens": 42,
        "subagent_tokens": 0,
        "middleware_tokens": 0,
        "token_usage_by_model": {
            "fake-model": {"input_tokens": 30, "output_tokens": 12, "total_tokens": 42}
        },
        "message_count": 4,
        "last_ai_message": "The answer is 3.",
        "first_human_message": "What is 1 + 2?",
    }


async def test_last_ai_message_is_cut_to_2000_characters():
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(agent_graph(scripted(ai("x" * 2500))), journal)
    assert journal.summary().last_ai_message == "x" * 2000


async def test_token_usage_tracking_can_be_turned_off():
    journal = RunJournal(event_store=MemoryRunEventStore(), track_token_usage=False)
    await journaled(agent_graph(scripted(*tool_script())), journal)
    data = journal.get_completion_data()
    assert data["total_tokens"] == data["llm_call_count"] == 0
    assert data["token_usage_by_model"] == {}
    assert data["message_count"] == 4


async def test_summary_before_any_run_is_an_error():
    with pytest.raises(RuntimeError, match="no run"):
        RunJournal(event_store=MemoryRunEventStore()).summary()


# -- ids -----------------------------------------------------------------------------------


async def test_a_journal_without_run_id_starts_a_new_run_per_invocation():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    config: RunnableConfig = {"configurable": {"thread_id": "thread-a"}}
    await journaled(agent_graph(scripted(ai("first"))), journal, **config)
    first = journal.summary()
    await journaled(agent_graph(scripted(ai("second"), ai("more"))), journal, **config)
    await journal.flush()
    second = journal.summary()
    assert first.run_id != second.run_id
    assert (first.thread_id, second.thread_id) == ("thread-a", "thread-a")
    assert second.last_ai_message == "second" and second.llm_call_count == 1
    stored = await store.list_run_summaries("thread-a")
    assert [(s.run_id, s.status) for s in stored] == [
        (first.run_id, "success"),
        (second.run_id, "success"),
    ]


async def test_fixed_ids_are_used_as_given():
    store = MemoryRunEventStore()
    journal = RunJournal("run-1", "thread-1", store)
    await journaled(agent_graph(scripted(ai("ok"))), journal)
    await journal.flush()
    assert [e["run_id"] for e in await store.list_events("thread-1", "run-1")] == ["run-1"] * 4
    summary = await store.get_run_summary("thread-1", "run-1")
    assert summary is not None and summary.status == "success"


async def test_thread_id_falls_back_to_the_run_id():
    journal = RunJournal(event_store=MemoryRunEventStore())
    await journaled(agent_graph(scripted(ai("ok"))), journal)
    assert journal.thread_id == journal.run_id


def _wrapped(graph: Any, how: str) -> Any:
    """``graph`` under a runnable of its own at the root, the way users wrap one."""
    if how == "retry":
        return graph.with_retry()
    if how == "fallbacks":
        return graph.with_fallbacks([graph])
    if how == "stacked":  # fallbacks hand their runnable the root's own config
        return graph.with_retry().with_fallbacks([graph])
    if how == "nested":
        return RunnableLambda(lambda inputs: inputs, name="prepare") | graph.with_retry()
    if how == "sequence":  # a first step whose chain is given no thread id
        return RunnableLambda(lambda inputs: inputs, name="prepare") | graph

    async def acall(inputs: Any, config: RunnableConfig) -> Any:
        return await graph.ainvoke(inputs, config)

    return RunnableLambda(
        lambda inputs, config: graph.invoke(inputs, config), afunc=acall, name="wrapper"
    )


@pytest.mark.parametrize("how", ["retry", "fallbacks", "sequence", "function", "stacked", "nested"])
async def test_a_wrapped_graph_pauses_and_resumes_its_run(how):
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    model = scripted(ai("", calls=[("ask_human", {"question": "which?"}, "c1")]), ai("done"))
    graph = _wrapped(agent_graph(model, [ask_human], checkpointer=InMemorySaver()), how)
    config: RunnableConfig = {"callbacks": [journal], "configurable": {"thread_id": "chat-1"}}
    await graph.ainvoke(QUESTION, config)
    assert journal.summary().status == "interrupted"
    assert types(await run_events(journal, flush=True))[-1] == "run.interrupt"
    await graph.ainvoke(Command(resume="the red one"), config)
    assert journal.summary().status == "success"
    assert types(await run_events(journal, flush=True))[:2] == ["run.start", "run.resume"]


@pytest.mark.parametrize("how", ["retry", "sequence"])
def test_a_batch_of_wrapped_graphs_journals_each_run_under_its_configs_thread(how):
    """A batch starts each item's first step outside the item's config context."""
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    graph = _wrapped(agent_graph(scripted(ai("one"), ai("two")), checkpointer=InMemorySaver()), how)
    configs: list[RunnableConfig] = [
        {"callbacks": [journal], "configurable": {"thread_id": thread}} for thread in ("b1", "b2")
    ]
    graph.batch([QUESTION, QUESTION], configs, return_exceptions=False)
    threads = sorted(t.thread_id for t in asyncio.run(store.list_threads()))
    assert threads == ["b1", "b2"]
    for thread in threads:
        events = asyncio.run(store.list_events(thread, None))
        assert types(events) == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


def test_a_wrapper_running_its_graph_on_an_executor_thread_keeps_its_thread_and_pause():
    """A plain executor thread has no config context: the graph's own chain tells."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    model = scripted(ai("", calls=[("ask_human", {"question": "which?"}, "c1")]), ai("done"))
    graph = agent_graph(model, [ask_human], checkpointer=InMemorySaver())

    def handle(inputs: Any, config: RunnableConfig) -> Any:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(graph.invoke, inputs, config).result()

    config: RunnableConfig = {"callbacks": [journal], "configurable": {"thread_id": "chat-3"}}
    assert "__interrupt__" in RunnableLambda(handle).invoke(QUESTION, config)
    assert (journal.thread_id, journal.summary().status) == ("chat-3", "interrupted")
    assert types(asyncio.run(run_events(journal)))[-1] == "run.interrupt"


def test_a_wrapper_answering_its_graphs_pause_within_the_run_ends_it_successfully():
    journal = RunJournal(event_store=MemoryRunEventStore())
    model = scripted(ai("", calls=[("ask_human", {"question": "which?"}, "c1")]), ai("done"))
    graph = agent_graph(model, [ask_human], checkpointer=InMemorySaver())

    def answer_itself(inputs: Any, config: RunnableConfig) -> Any:
        out = graph.invoke(inputs, config)
        while "__interrupt__" in out:
            out = graph.invoke(Command(resume="the red one"), config)
        return out

    config: RunnableConfig = {"callbacks": [journal], "configurable": {"thread_id": "chat-4"}}
    RunnableLambda(answer_itself).invoke(QUESTION, config)
    assert journal.summary().status == "success"
    run = types(asyncio.run(run_events(journal)))
    assert [t for t in run if t.startswith("run.")] == ["run.start", "run.resume", "run.end"]


def test_a_wrapper_calling_a_model_before_its_graph_takes_its_configs_thread():
    journal = RunJournal(event_store=MemoryRunEventStore())
    summarizer = scripted(ai("short"))
    graph = agent_graph(scripted(ai("ok")), checkpointer=InMemorySaver())

    def handle(inputs: Any, config: RunnableConfig) -> Any:
        summarizer.invoke("summarize first", config)
        return graph.invoke(inputs, config)

    config: RunnableConfig = {"callbacks": [journal], "configurable": {"thread_id": "chat-5"}}
    RunnableLambda(handle).invoke(QUESTION, config)
    assert journal.thread_id == "chat-5"


def test_a_graph_a_node_runs_on_its_own_thread_pausing_does_not_pause_the_run():
    journal = RunJournal(event_store=MemoryRunEventStore())
    asks = [ai("", calls=[("ask_human", {"question": "which?"}, f"c{n}")]) for n in (1, 2)]
    helper = agent_graph(scripted(*asks), [ask_human], checkpointer=InMemorySaver())

    def research(state: MessagesState) -> dict[str, Any]:
        config: RunnableConfig = {"configurable": {"thread_id": "helper-9"}}
        paused = helper.invoke({"messages": [HumanMessage("look it up")]}, config)
        assert "__interrupt__" in paused  # returned to the node, which goes on
        return {"messages": [AIMessage("looked")]}

    lead = StateGraph(MessagesState)
    lead.add_node("research", research)
    lead.add_edge(START, "research")
    lead = lead.compile()
    for runnable in (lead, lead.with_retry()):
        runnable.invoke(QUESTION, {"callbacks": [journal]})
        assert journal.summary().status == "success"
        assert types(asyncio.run(run_events(journal)))[-1] == "run.end"


@pytest.mark.parametrize("how", ["retry", "fallbacks", "sequence", "function", "stacked", "nested"])
def test_a_graph_wrapped_at_the_root_is_journaled_under_its_configs_thread(how):
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    graph = _wrapped(agent_graph(scripted(*tool_script()), checkpointer=InMemorySaver()), how)
    config: RunnableConfig = {"callbacks": [journal], "configurable": {"thread_id": "chat-7"}}
    graph.invoke(QUESTION, config)
    assert journal.thread_id == "chat-7"
    events = asyncio.run(store.list_events("chat-7", journal.run_id or ""))
    assert types(events) == ONE_TOOL_CALL_SEQUENCE
    summary = asyncio.run(store.get_run_summary("chat-7", journal.run_id or ""))
    assert summary is not None and summary.status == "success"
    assert asyncio.run(store.list_threads()) == asyncio.run(store.list_threads(limit=1))


def test_a_wrapped_root_takes_its_own_configs_thread_not_a_graph_it_runs_on_another():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    helper = StateGraph(MessagesState)
    helper.add_node("noop", lambda state: {})
    helper.add_edge(START, "noop")
    bookkeeping = helper.compile(checkpointer=InMemorySaver())
    chat = agent_graph(scripted(ai("ok")), checkpointer=InMemorySaver())

    def handle(inputs: Any, config: RunnableConfig) -> Any:
        bookkeeping.invoke({"messages": []}, {"configurable": {"thread_id": "bookkeeping"}})
        return chat.invoke(inputs, config)

    config: RunnableConfig = {"callbacks": [journal], "configurable": {"thread_id": "chat-7"}}
    RunnableLambda(handle).invoke(QUESTION, config)
    assert journal.thread_id == "chat-7"
    assert [t.thread_id for t in asyncio.run(store.list_threads())] == ["chat-7"]


def test_a_graph_given_no_thread_is_not_journaled_under_a_thread_its_subagent_names():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    subagent = agent_graph(scripted(ai("found it")), checkpointer=InMemorySaver())

    def research(state: MessagesState) -> dict[str, Any]:
        config: RunnableConfig = {"configurable": {"thread_id": "subagent-9"}}
        found = subagent.invoke({"messages": [HumanMessage("look it up")]}, config)
        return {"messages": [found["messages"][-1]]}

    lead = StateGraph(MessagesState)
    lead.add_node("research", research)
    lead.add_node("agent", model_node(scripted(ai("done"))))
    lead.add_edge(START, "research")
    lead.add_edge("research", "agent")
    lead.compile().invoke(QUESTION, {"callbacks": [journal]})
    assert journal.thread_id == journal.run_id
    assert [t.thread_id for t in asyncio.run(store.list_threads())] == [journal.run_id]


async def test_a_root_that_never_reaches_a_graph_keeps_the_run_id_as_its_thread():
    journal = RunJournal(event_store=MemoryRunEventStore())
    chain = RunnableLambda(lambda text: text, name="first") | RunnableLambda(str.upper)
    assert await chain.ainvoke("hi", {"callbacks": [journal]}) == "HI"
    assert journal.thread_id == journal.run_id
    assert types(await run_events(journal, flush=True)) == ["run.start", "run.end"]


async def test_a_wrapped_graph_failing_before_its_first_node_is_journaled_under_its_thread():
    journal = RunJournal(event_store=MemoryRunEventStore())
    graph = agent_graph(scripted(ai("ok")), checkpointer=InMemorySaver())
    with pytest.raises(ValueError):  # a checkpointer needs a thread id; the input has none
        await graph.with_retry().ainvoke(QUESTION, {"callbacks": [journal]})
    assert journal.thread_id == journal.run_id
    assert types(await run_events(journal, flush=True)) == ["run.start", "run.error"]


@pytest.mark.parametrize("ids", [{"run_id": "r" * 129}, {"thread_id": "thread\n1"}])
def test_fixed_ids_the_store_would_reject_are_refused_at_once(ids):
    with pytest.raises(ValueError, match=next(iter(ids))):
        RunJournal(event_store=MemoryRunEventStore(), **ids)


async def test_a_config_thread_id_the_store_would_reject_falls_back_to_the_run_id(caplog):
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    await journaled(agent_graph(scripted(ai("ok"))), journal, configurable={"thread_id": "t" * 200})
    assert "thread_id" in caplog.text
    assert journal.thread_id == journal.run_id
    assert types(await run_events(journal, flush=True))[-1] == "run.end"
    await journaled(agent_graph(scripted(ai("ok"))), journal, configurable={"thread_id": "good"})
    await journal.flush()
    assert len(await store.list_events("good", journal.run_id or "")) == 4


async def test_events_and_summary_are_stamped_with_the_current_user():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    with user_scope("alice"):
        await journaled(agent_graph(scripted(ai("ok"))), journal)
    await journal.flush()
    assert journal.thread_id is not None and journal.run_id is not None
    events = await store.list_events(journal.thread_id, journal.run_id, user_id="alice")
    assert len(events) == 4
    assert await store.list_events(journal.thread_id, journal.run_id, user_id="bob") == []
    stored = await store.get_run_summary(journal.thread_id, journal.run_id, user_id="alice")
    assert stored is not None and stored.user_id == "alice"


# -- progress ------------------------------------------------------------------------------


async def test_progress_snapshots_are_throttled_with_one_trailing_snapshot():
    snapshots: list[dict[str, Any]] = []

    async def report(snapshot: dict[str, Any]) -> None:
        snapshots.append(snapshot)

    journal = RunJournal(
        event_store=MemoryRunEventStore(),
        progress_reporter=report,
        progress_flush_interval=3600,
    )
    await journaled(agent_graph(scripted(*tool_script())), journal)
    await journal.aclose()
    assert len(snapshots) == 2
    assert snapshots[0]["message_count"] == 1  # the human input, sent at once
    assert snapshots[-1] == journal.get_completion_data()


async def test_progress_without_throttling_sends_every_change():
    snapshots: list[dict[str, Any]] = []

    async def report(snapshot: dict[str, Any]) -> None:
        snapshots.append(snapshot)

    journal = RunJournal(
        event_store=MemoryRunEventStore(), progress_reporter=report, progress_flush_interval=0
    )
    await journaled(agent_graph(scripted(*tool_script())), journal)
    await journal.aclose()
    assert [s["message_count"] for s in snapshots] == [1, 2, 3, 4]


async def test_a_plain_function_is_a_progress_reporter_too(caplog):
    """Not only an async one: a plain function got every snapshot's TypeError logged."""
    snapshots: list[dict[str, Any]] = []
    journal = RunJournal(
        event_store=MemoryRunEventStore(),
        progress_reporter=snapshots.append,
        progress_flush_interval=0,
    )
    await journaled(agent_graph(scripted(*tool_script())), journal)
    await journal.aclose()
    assert [s["message_count"] for s in snapshots] == [1, 2, 3, 4]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    with pytest.raises(TypeError, match="callable"):
        RunJournal(event_store=MemoryRunEventStore(), progress_reporter="http://example.com")


@pytest.mark.parametrize("owned", [False, True], ids=["store passed in", "own store"])
async def test_progress_snapshots_run_on_the_loop_running_the_graph(monkeypatch, owned):
    monkeypatch.setenv("DEERFLOW_JOURNAL_URL", "memory://")
    caller = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # bound to the caller's loop
    on_caller: list[bool] = []

    async def report(snapshot: dict[str, Any]) -> None:
        on_caller.append(asyncio.get_running_loop() is caller)
        queue.put_nowait(snapshot)

    store = None if owned else MemoryRunEventStore()
    journal = RunJournal(event_store=store, progress_reporter=report, progress_flush_interval=0)
    await journaled(agent_graph(scripted(*tool_script())), journal)
    await journal.aclose()
    assert on_caller == [True] * 4 and queue.qsize() == 4


async def test_a_held_snapshot_is_sent_when_the_interval_ends():
    snapshots: list[dict[str, Any]] = []

    async def report(snapshot: dict[str, Any]) -> None:
        snapshots.append(snapshot)

    journal = RunJournal(
        event_store=MemoryRunEventStore(), progress_reporter=report, progress_flush_interval=0.05
    )
    root = uuid.uuid4()
    journal.on_chain_start(None, {}, run_id=root, name="slow run")
    for tokens in ((1, 1), (2, 2)):
        call = uuid.uuid4()
        result = LLMResult(generations=[[ChatGeneration(message=ai("x", tokens=tokens))]])
        journal.on_llm_end(result, run_id=call, parent_run_id=root)
    for _ in range(500):  # the run is still going: only the interval's timer can send it
        if len(snapshots) == 2:
            break
        await asyncio.sleep(0.01)
    assert [s["total_tokens"] for s in snapshots] == [2, 6]
    journal.on_chain_end({}, run_id=root)
    await journal.aclose()
    assert len(snapshots) == 2  # nothing was held back at the end


async def test_a_run_id_the_caller_sets_as_text_is_journaled_like_any_other():
    journal = RunJournal(event_store=MemoryRunEventStore())
    graph = agent_graph(scripted(ai(calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3")))
    await graph.ainvoke(QUESTION, {"callbacks": [journal], "run_id": "my-run-1"})
    events = await run_events(journal, flush=True)
    assert [e["event_type"] for e in events] == ONE_TOOL_CALL_SEQUENCE
    assert journal.run_id == "my-run-1"
    assert journal.summary().llm_call_count == 2


def test_a_recorder_in_a_run_whose_id_is_text_records_into_that_run():
    journal = RunJournal(event_store=MemoryRunEventStore())

    def step(x: int) -> int:
        journal.record_middleware("guard", name="g", hook="before", action="noop", changes={})
        return x

    assert RunnableLambda(step).invoke(1, {"callbacks": [journal], "run_id": "job-42"}) == 1
    events = asyncio.run(run_events(journal, flush=True))
    assert [e["event_type"] for e in events] == ["run.start", "middleware:guard", "run.end"]
    assert journal.run_id == "job-42"


async def test_closing_with_recorded_events_waiting_for_a_run_says_so(caplog):
    journal = RunJournal(event_store=MemoryRunEventStore())  # no run yet, no fixed id
    journal.record_middleware("guardrail", name="n", hook="h", action="a", changes={})
    with caplog.at_level(logging.WARNING, logger="deerflow_journal"):
        await journal.aclose()
    assert "1 recorded events waiting for a run to start" in caplog.text
