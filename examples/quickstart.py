"""A journaled LangGraph agent: run it, then read its timeline and run summary back.

The agent is a real ``StateGraph`` (a model node and LangGraph's ``ToolNode``) whose model is
langchain-core's ``GenericFakeChatModel``, scripted to call a real tool and to report token
usage under a real model's name (``gpt-4o``, so the summary can estimate its cost), so the
example runs offline. The journal writes to the default store, ``open_store()``:
``$DEERFLOW_JOURNAL_URL``, else the SQLite file ``.deer-flow/journal.db``.

Run it with ``python3 dev.py demo`` (or ``python examples/quickstart.py``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from deerflow_journal import RunJournal, default_store_url, open_store, render_timeline

WEATHER = {"paris": "sunny, 21 °C", "oslo": "light rain, 9 °C"}


@tool
def get_weather(city: str) -> str:
    """Return today's weather in a city."""
    return WEATHER.get(city.lower(), "no report")


def scripted_model() -> GenericFakeChatModel:
    """A chat model that asks for the weather, then answers, reporting usage like a real one."""
    ask = AIMessage(
        content="",
        tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}],
        usage_metadata={"input_tokens": 120, "output_tokens": 18, "total_tokens": 138},
        response_metadata={"model_name": "gpt-4o"},
    )
    answer = AIMessage(
        content="It is sunny in Paris today, 21 °C.",
        usage_metadata={
            "input_tokens": 160,
            "output_tokens": 14,
            "total_tokens": 174,
            "input_token_details": {"cache_read": 96},
        },
        response_metadata={"model_name": "gpt-4o"},
    )
    return GenericFakeChatModel(messages=iter([ask, answer]))


def build_agent() -> Any:
    """model -> tools -> model, until the model stops calling tools."""
    model = scripted_model()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([get_weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


async def main() -> None:
    """Run the agent once with a journal and print what the store holds for the run."""
    async with open_store() as store:
        journal = RunJournal(thread_id="quickstart", event_store=store)
        question = HumanMessage("What's the weather in Paris?")
        await build_agent().ainvoke({"messages": [question]}, {"callbacks": [journal]})
        await journal.flush()
        assert journal.thread_id is not None and journal.run_id is not None
        print(f"run {journal.run_id} on thread {journal.thread_id} in {default_store_url()}\n")
        events = await store.list_events(journal.thread_id, journal.run_id)
        summary = await store.get_run_summary(journal.thread_id, journal.run_id)
        # Colours only on a terminal, and never when NO_COLOR (no-color.org) is set.
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        width = shutil.get_terminal_size((120, 24)).columns  # 120 when not on a terminal
        print(render_timeline(events, summary, width=width, color=color))


if __name__ == "__main__":
    asyncio.run(main())
