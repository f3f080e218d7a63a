"""A question whose run stopped before any model saw it, then resumed from the checkpoint:
the thread's messages still show it once."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from langgraph.types import Command, interrupt

from deerflow_journal import RunJournal
from tests.journal.agents import (
    QUESTION,
    ScriptedChatModel,
    add,
    ai,
    ask_human,
    humans,
    scripted,
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


# -- messages without ids ---------------------------------------------------------------------
# A state without LangGraph's ``add_messages`` and the functional API keep messages as given:
# without ids, a resumed run's question is told from a new one by its text.


def functional_agent(model: ScriptedChatModel, make_prompt: Any = list) -> Any:
    """A tool-calling agent written with LangGraph's functional API (``make_prompt`` turns its
    input into the first prompt)."""

    @task
    def call_model(prompt: list[Any]) -> Any:
        return model.invoke(prompt)

    @task
    def call_tool(call: dict[str, Any]) -> Any:
        return ask_human.invoke(call)

    @entrypoint(checkpointer=InMemorySaver())
    def agent(inputs: Any) -> str:
        prompt = make_prompt(inputs)
        answer = call_model(prompt).result()
        while answer.tool_calls:
            results = [call_tool(call).result() for call in answer.tool_calls]
            prompt = [*prompt, answer, *results]
            answer = call_model(prompt).result()
        return str(answer.content)

    return agent


def asking(*then: AIMessage) -> ScriptedChatModel:
    """A model that first asks a human through ``ask_human``, then answers ``then``."""
    return scripted(ai("", calls=[("ask_human", {"question": "Which city?"}, "h1")]), *then)


async def resumed_humans(store: Any, graph: Any, question: Any, thread: str) -> list[str]:
    """The thread's human inputs after ``graph`` asked ``question``, was interrupted and resumed;
    checks that the resumed run records none of its own."""
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": thread}}
    await graph.ainvoke(question, config)
    await graph.ainvoke(Command(resume="Paris"), config)
    await journal.flush()
    assert journal.summary().first_human_message is None
    return humans(await store.list_messages(thread, limit=100))


@pytest.mark.parametrize(
    "question",
    [HumanMessage("Book a trip"), {"role": "user", "content": "Book a trip"}],
    ids=["message", "dict"],
)
async def test_a_functional_agent_resumed_after_an_interrupt_writes_its_question_once(
    store, question
):
    graph = functional_agent(asking(ai("Paris it is")))
    assert await resumed_humans(store, graph, [question], "functional") == ["Book a trip"]


class PlainMessages(TypedDict):
    messages: list[Any]  # no reducer: messages keep no id


def plain_agent(model: ScriptedChatModel) -> Any:
    """A tool-calling agent whose state's messages are a plain list."""
    tools = ToolNode([ask_human])

    def agent(state: PlainMessages) -> dict[str, Any]:
        return {"messages": [*state["messages"], model.invoke(state["messages"])]}

    def run_tools(state: PlainMessages) -> dict[str, Any]:
        return {"messages": [*state["messages"], *tools.invoke(state)["messages"]]}

    graph = StateGraph(PlainMessages)
    graph.add_node("agent", agent)
    graph.add_node("tools", run_tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=InMemorySaver())


async def test_a_plain_list_agent_resumed_after_an_interrupt_writes_its_question_once(store):
    graph = plain_agent(asking(ai("Paris it is")))
    question = {"messages": [HumanMessage("Book a trip")]}
    assert await resumed_humans(store, graph, question, "plain") == ["Book a trip"]


def ask_then_answer(ask: Any, model: ScriptedChatModel, *, until_done: bool = False) -> Any:
    """A plain-list graph: the node ``ask`` (which interrupts), then ``model`` on the messages;
    ``until_done``: back to ``ask`` until the model says "done"."""

    def agent(state: PlainMessages) -> dict[str, Any]:
        return {"messages": [*state["messages"], model.invoke(state["messages"])]}

    graph = StateGraph(PlainMessages)
    graph.add_node("ask", ask)
    graph.add_node("agent", agent)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", "agent")
    if until_done:
        graph.add_conditional_edges(
            "agent", lambda state: END if state["messages"][-1].content == "done" else "ask"
        )
    return graph.compile(checkpointer=InMemorySaver())


async def test_a_question_a_resumed_node_adds_without_an_id_is_written(store):
    def clarify(state: PlainMessages) -> dict[str, Any]:
        city = interrupt("Which city?")
        return {"messages": [*state["messages"], HumanMessage(f"Book it for {city}")]}

    compiled = ask_then_answer(clarify, scripted(ai("Booked.")))
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "clarified"}}
    await compiled.ainvoke({"messages": [HumanMessage("Book a trip")]}, config)
    await compiled.ainvoke(Command(resume="Paris"), config)
    await journal.flush()
    assert journal.summary().first_human_message == "Book it for Paris"
    assert humans(await store.list_messages("clarified", limit=100)) == [
        "Book a trip",
        "Book it for Paris",
    ]


async def test_a_question_a_functional_agent_builds_from_its_input_is_written(store):
    # A fresh run's first prompt is built by the entrypoint: no state to resume from.
    graph = functional_agent(
        scripted(ai("Paris it is")), lambda inputs: [HumanMessage(inputs["question"])]
    )
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "built"}}
    await graph.ainvoke({"question": "Book a trip"}, config)
    await journal.flush()
    assert humans(await store.list_messages("built", limit=100)) == ["Book a trip"]


async def test_an_answer_given_twice_in_a_row_is_new_each_time(store):
    def confirm(state: PlainMessages) -> dict[str, Any]:
        return {"messages": [*state["messages"], HumanMessage(interrupt("Go on?"))]}

    compiled = ask_then_answer(confirm, scripted(ai("step 1"), ai("done")), until_done=True)
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "twice"}}
    await compiled.ainvoke({"messages": [HumanMessage("Deploy")]}, config)
    await compiled.ainvoke(Command(resume="yes"), config)
    await compiled.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    assert humans(await store.list_messages("twice", limit=100)) == ["Deploy", "yes", "yes"]


@pytest.mark.parametrize(
    "inputs",
    [{"question": "Book a trip"}, [{"role": "user", "content": "Book a trip"}]],
    ids=["built-by-the-entrypoint", "given-as-dicts"],
)
async def test_a_functional_agent_interrupted_before_its_first_model_call_writes_its_question(
    store, inputs
):
    model = scripted(ai("Booked."))

    @task
    def call_model(prompt: list[Any]) -> Any:
        return model.invoke(prompt)

    @entrypoint(checkpointer=InMemorySaver())
    def agent(inputs: Any) -> str:
        interrupt("Run this request?")  # an approval before any model call
        prompt = [HumanMessage(inputs["question"])] if isinstance(inputs, dict) else inputs
        return str(call_model(prompt).result().content)

    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "approved"}}
    await agent.ainvoke(inputs, config)
    await agent.ainvoke(Command(resume=True), config)
    await journal.flush()
    assert humans(await store.list_messages("approved", limit=100)) == ["Book a trip"]
