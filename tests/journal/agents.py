"""Real LangChain models and LangGraph graphs the journal tests drive.

``ScriptedChatModel`` is langchain-core's ``GenericFakeChatModel`` with a stream that also
carries tool calls, usage and response metadata, so streamed and non-streamed calls of the
same script produce the same messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt

from deerflow_journal import RunEvent, RunJournal, RunSummary

QUESTION = {"messages": [HumanMessage("What is 1 + 2?")]}

#: The events of a run in which the lead agent calls one tool and then answers.
ONE_TOOL_CALL_SEQUENCE = [
    "run.start",
    "llm.human.input",
    "llm.ai.response",
    "llm.tool.result",
    "llm.ai.response",
    "run.end",
]


async def run_events(journal: RunJournal, *, flush: bool = False) -> list[RunEvent]:
    """The latest run's stored events in seq order; ``flush`` writes the buffer first."""
    if flush:
        await journal.flush()
    assert journal.thread_id is not None and journal.run_id is not None
    return await journal.event_store.list_events(journal.thread_id, journal.run_id, limit=10_000)


async def stored(journal: RunJournal) -> tuple[list[str], RunSummary]:
    """The latest run's stored event types in seq order and its stored (= current) summary."""
    events = await run_events(journal)
    assert journal.thread_id is not None and journal.run_id is not None
    summary = await journal.event_store.get_run_summary(journal.thread_id, journal.run_id)
    assert summary is not None
    assert summary == journal.summary()
    return [e["event_type"] for e in events], summary


def humans(events: list[RunEvent]) -> list[str]:
    """The texts of the ``llm.human.input`` events among ``events``."""
    return [e["content"]["content"] for e in events if e["event_type"] == "llm.human.input"]


def usage(input_tokens: int, output_tokens: int, **details: int) -> dict[str, Any]:
    """A ``usage_metadata`` dict; ``cache_read``/``cache_creation``/``reasoning`` details."""
    result: dict[str, Any] = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }
    inputs = {k: v for k, v in details.items() if k in ("cache_read", "cache_creation")}
    if inputs:
        result["input_token_details"] = inputs
    if "reasoning" in details:
        result["output_token_details"] = {"reasoning": details["reasoning"]}
    return result


def ai(
    text: str = "",
    *,
    calls: Sequence[tuple[str, dict[str, Any], str]] = (),
    tokens: tuple[int, int] = (10, 5),
    model: str = "fake-model",
    msg_id: str | None = None,
    **details: int,
) -> AIMessage:
    """An AI message with tool calls ``(name, args, id)``, usage and a model name."""
    return AIMessage(
        content=text,
        id=msg_id,
        tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls],
        usage_metadata=usage(*tokens, **details),
        response_metadata={"model_name": model},
    )


class ScriptedChatModel(GenericFakeChatModel):
    """Answers with the next scripted AI message, streamed or not, tool calls and usage kept."""

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        message = next(self.messages)
        assert isinstance(message, AIMessage)
        text = message.content if isinstance(message.content, str) else ""
        for token in (t for t in re.split(r"(\s)", text) if t):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=token, id=message.id))
            if run_manager:
                run_manager.on_llm_new_token(token, chunk=chunk)
            yield chunk
        last = AIMessageChunk(
            content="",
            id=message.id,
            tool_call_chunks=[
                tool_call_chunk(name=c["name"], args=json.dumps(c["args"]), id=c["id"], index=i)
                for i, c in enumerate(message.tool_calls)
            ],
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
            chunk_position="last",
        )
        chunk = ChatGenerationChunk(message=last)
        if run_manager:
            run_manager.on_llm_new_token("", chunk=chunk)
        yield chunk


def scripted(*messages: AIMessage) -> ScriptedChatModel:
    """A model answering with ``messages`` in order."""
    return ScriptedChatModel(messages=iter(messages))


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
def explode(reason: str) -> str:
    """Always fail."""
    raise RuntimeError(f"tool exploded: {reason}")


@tool
def ask_human(question: str) -> str:
    """Pause the graph until a human answers."""
    return str(interrupt(question))


def model_node(model: ScriptedChatModel, tags: Sequence[str] = ()) -> RunnableLambda:
    """A graph node calling ``model`` on the state's messages (sync and async)."""
    config: RunnableConfig = {"tags": list(tags)} if tags else {}

    def call(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"], config)]}

    async def acall(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"], config)]}

    return RunnableLambda(call, afunc=acall, name="agent")


def agent_graph(
    model: ScriptedChatModel,
    tools: Sequence[BaseTool] = (add, multiply),
    *,
    checkpointer: Any = None,
    handle_tool_errors: bool = True,
    tags: Sequence[str] = (),
) -> CompiledStateGraph:
    """A tool-calling agent: model node, ``ToolNode``, loop until no tool call."""
    graph = StateGraph(MessagesState)
    graph.add_node("agent", model_node(model, tags))
    graph.add_node("tools", ToolNode(list(tools), handle_tool_errors=handle_tool_errors))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def step_then_answer(
    step: Any, answer: str, state: type[Any] = MessagesState, *, checkpointer: Any
) -> CompiledStateGraph:
    """A graph that runs ``step`` (a node, named after it) and then a model answering
    ``answer``."""
    graph = StateGraph(state)
    graph.add_node(step.__name__, step)
    graph.add_node("agent", model_node(scripted(ai(answer))))
    graph.add_edge(START, step.__name__)
    graph.add_edge(step.__name__, "agent")
    return graph.compile(checkpointer=checkpointer)


class FailingChatModel(GenericFakeChatModel):
    """A chat model whose every call fails."""

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("model endpoint unreachable")
