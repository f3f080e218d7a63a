"""Common patterns a first week of use meets: structured output, a chain given the journal
inside a node, tool calls across a pause, dataclass state, usage in `llm_output`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, create_react_agent
from langgraph.types import Command, interrupt
from pydantic import BaseModel

from deerflow_journal import RunJournal

from .agents import QUESTION, ScriptedChatModel, add, ai, ask_human, humans, scripted, stored


class BindingModel(ScriptedChatModel):
    """Binds tools the way provider models do (kwargs such as the structured-output format
    travel with the binding)."""

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


class Answer(BaseModel):
    value: int


async def test_a_chain_given_the_journal_inside_a_node_is_part_of_the_run(store):
    journal = RunJournal(event_store=store)
    chain = ChatPromptTemplate.from_messages([("human", "Summarize: {text}")]) | scripted(
        ai("short", tokens=(100, 100))
    )

    def summarise(state: MessagesState) -> dict[str, Any]:
        return {"messages": [chain.invoke({"text": "x"}, {"callbacks": [journal]})]}

    builder = StateGraph(MessagesState)
    builder.add_node("summarise", summarise)
    builder.add_edge(START, "summarise")
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "chain"}}
    await builder.compile().ainvoke(QUESTION, config)
    await journal.flush()
    events = await store.list_events("chain", None)
    assert [e["event_type"] for e in events] == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "run.end",
    ]
    assert events[0]["content"]["chain"] == "LangGraph"
    (summary,) = await store.list_run_summaries("chain")
    assert summary.total_tokens == 200
    assert journal.summary() == summary


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_a_structured_output_call_leaves_no_unresolved_tool_call(store):
    model = BindingModel(
        messages=iter([ai("1 + 2 = 3"), ai("", calls=[("Answer", {"value": 3}, "s1")])])
    )
    agent = create_react_agent(model, [add], response_format=Answer)
    journal = RunJournal(event_store=store)
    out = await agent.ainvoke(QUESTION, {"callbacks": [journal]})
    assert out["structured_response"] == Answer(value=3)
    await journal.flush()
    sequence, _ = await stored(journal)
    assert "tool.unresolved" not in sequence


def review_graph(model: ScriptedChatModel, *, pauses: int = 1) -> Any:
    """Agent -> review (``pauses`` interrupts) -> the tool on "approve", the end otherwise."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def review(state: MessagesState) -> Command:
        call = state["messages"][-1].tool_calls[0]
        answer = None
        for _ in range(pauses):
            answer = interrupt({"tool_call": call})
        return Command(goto="tools" if answer == "approve" else END)

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("review", review, destinations=("tools", END))
    builder.add_node("tools", ToolNode([add]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda s: "review" if s["messages"][-1].tool_calls else END, ["review", END]
    )
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def outcomes(events: list[Any]) -> list[tuple[str, str]]:
    """(event type, tool call id) of the tool-call outcomes among ``events``, in order."""
    kinds = ("llm.tool.result", "tool.error", "tool.unresolved")
    return [
        (e["event_type"], e["metadata"]["tool_call_id"]) for e in events if e["event_type"] in kinds
    ]


@pytest.mark.parametrize("pauses", [1, 2])
async def test_a_call_a_resumed_run_leaves_unanswered_is_reported_by_its_own_run_only(
    store, pauses
):
    model = ScriptedChatModel(messages=iter([ai("", calls=[("add", {"a": 1, "b": 2}, "c1")])]))
    graph = review_graph(model, pauses=pauses)
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "drop"}}
    await graph.ainvoke({"messages": [HumanMessage("What is 1 + 2?")]}, config)
    for _ in range(pauses):
        await graph.ainvoke(Command(resume="drop"), config)
    await journal.flush()
    events = await store.list_events("drop", None, limit=100)
    assert len({e["run_id"] for e in events}) == pauses + 1
    assert outcomes(events) == [("tool.unresolved", "c1")]


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
async def test_parallel_calls_answered_before_a_pause_are_written_once(store):
    model = BindingModel(
        messages=iter(
            [
                ai(
                    "",
                    calls=[
                        ("add", {"a": 1, "b": 2}, "c1"),
                        ("ask_human", {"question": "ok?"}, "c2"),
                    ],
                ),
                ai("done"),
            ]
        )
    )
    agent = create_react_agent(model, [add, ask_human], checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "parallel"}}
    await agent.ainvoke({"messages": [HumanMessage("What is 1 + 2?")]}, config)
    await agent.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    events = await store.list_events("parallel", None, limit=100)
    assert sorted(outcomes(events)) == [
        ("llm.tool.result", "c1"),
        ("llm.tool.result", "c2"),
        ("tool.unresolved", "c2"),
    ]


async def test_a_node_returning_a_command_with_the_question_writes_it(store):
    class Intake(TypedDict, total=False):
        question: str
        messages: Annotated[list[AnyMessage], add_messages]

    model = scripted(ai("It is 3."))

    def intake(state: Intake) -> Command:
        return Command(update={"messages": [HumanMessage(state["question"])]}, goto="agent")

    def agent(state: Intake) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(Intake)
    builder.add_node("intake", intake, destinations=("agent",))
    builder.add_node("agent", agent)
    builder.add_edge(START, "intake")
    builder.add_edge("agent", END)
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "intake"}}
    await builder.compile().ainvoke({"question": "What is 1 + 2?"}, config)
    await journal.flush()
    assert humans(await store.list_messages("intake", limit=100)) == ["What is 1 + 2?"]


@dataclass
class ChatState:
    messages: Annotated[list[AnyMessage], add_messages] = field(default_factory=list)


async def test_a_dataclass_state_resumed_after_a_review_writes_its_question_once(store):
    model = ScriptedChatModel(
        messages=iter([ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("It is 3.")])
    )

    def agent(state: ChatState) -> dict[str, Any]:
        return {"messages": [model.invoke(state.messages)]}

    def review(state: ChatState) -> Command:
        interrupt("run add?")
        return Command(goto="tools")

    builder = StateGraph(ChatState)
    builder.add_node("agent", agent)
    builder.add_node("review", review, destinations=("tools",))
    builder.add_node("tools", ToolNode([add]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda s: "review" if s.messages[-1].tool_calls else END, ["review", END]
    )
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "dc"}}
    await graph.ainvoke(ChatState(messages=[HumanMessage("What is 1 + 2?")]), config)
    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    assert humans(await store.list_messages("dc", limit=100)) == ["What is 1 + 2?"]


class LlmOutputUsageModel(BaseChatModel):
    """A chat model reporting usage only in ``llm_output`` (older community integrations)."""

    @property
    def _llm_type(self) -> str:
        return "llm-output-usage"

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        return ChatResult(
            generations=[ChatGeneration(message=AIMessage("hi"))],
            llm_output={"token_usage": usage, "model_name": "old-model"},
        )


async def test_a_chat_model_reporting_usage_in_llm_output_counts_it(store):
    journal = RunJournal(event_store=store)
    await LlmOutputUsageModel().ainvoke("q", {"callbacks": [journal]})
    await journal.flush()
    _, summary = await stored(journal)
    assert (summary.total_input_tokens, summary.total_output_tokens) == (12, 3)
    assert summary.token_usage_by_model["old-model"]["total_tokens"] == 15


class TwoChoices(BaseChatModel):
    """A model answering structured output with two choices (``n=2``), each the schema's call."""

    @property
    def _llm_type(self) -> str:
        return "two-choices"

    def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        choices = [ai("", calls=[("Answer", {"value": i}, f"s{i}")]) for i in (1, 2)]
        return ChatResult(generations=[ChatGeneration(message=m) for m in choices])


async def test_every_choice_of_a_structured_output_call_is_its_answer(store):
    journal = RunJournal(event_store=store)
    answer = (
        await TwoChoices().with_structured_output(Answer).ainvoke("q", {"callbacks": [journal]})
    )
    assert answer == Answer(value=1)
    await journal.flush()
    sequence, _ = await stored(journal)
    assert sequence.count("llm.ai.response") == 2
    assert "tool.unresolved" not in sequence
