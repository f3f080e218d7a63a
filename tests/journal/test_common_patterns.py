"""Common patterns a first week of use meets: structured output, a chain given the journal
inside a node, a tool call rejected on resume, dataclass state, usage in `llm_output`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
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

from .agents import QUESTION, ScriptedChatModel, add, ai, humans, scripted, stored


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


async def test_a_tool_call_rejected_on_resume_keeps_its_answer(store):
    model = ScriptedChatModel(
        messages=iter([ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("OK, I won't.")])
    )

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    def review(state: MessagesState) -> Command:
        call = state["messages"][-1].tool_calls[0]
        if interrupt({"tool_call": call}) == "approve":
            return Command(goto="tools")
        rejected = ToolMessage("Rejected by the user", tool_call_id=call["id"], name=call["name"])
        return Command(goto="agent", update={"messages": [rejected]})

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("review", review, destinations=("tools", "agent"))
    builder.add_node("tools", ToolNode([add]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda s: "review" if s["messages"][-1].tool_calls else END, ["review", END]
    )
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config: Any = {"callbacks": [journal], "configurable": {"thread_id": "review"}}
    await graph.ainvoke({"messages": [HumanMessage("What is 1 + 2?")]}, config)
    await graph.ainvoke(Command(resume="reject"), config)
    await journal.flush()
    messages = await store.list_messages("review", limit=100)
    assert humans(messages) == ["What is 1 + 2?"]
    results = [m["content"]["content"] for m in messages if m["event_type"] == "llm.tool.result"]
    assert results == ["Rejected by the user"]


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
