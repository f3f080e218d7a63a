"""A journaled LangGraph agent: run it, then read its timeline and run summary back.

The agent is a real ``StateGraph`` (a model node and LangGraph's ``ToolNode``) whose model is
langchain-core's ``GenericFakeChatModel``, scripted to call a real tool and to report token
usage, so the example runs offline. The journal writes to the default store, ``open_store()``:
``$DEERFLOW_JOURNAL_URL``, else the SQLite file ``.deer-flow/journal.db``.

Run it with ``python3 dev.py demo`` (or ``python examples/quickstart.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from deerflow_journal import RunEvent, RunJournal, RunSummary, default_store_url, open_store

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
        response_metadata={"model_name": "fake-gpt"},
    )
    answer = AIMessage(
        content="It is sunny in Paris today, 21 °C.",
        usage_metadata={
            "input_tokens": 160,
            "output_tokens": 14,
            "total_tokens": 174,
            "input_token_details": {"cache_read": 96},
        },
        response_metadata={"model_name": "fake-gpt"},
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


def _short(text: Any, width: int = 48) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(event: RunEvent) -> str:
    """A one-line summary of an event's content."""
    content, metadata = event["content"], event["metadata"]
    kind = event["event_type"]
    if kind == "run.start":
        return f"chain {content['chain']}"
    if kind == "llm.ai.response":
        calls = ", ".join(f"{c['name']}({c['args']})" for c in content["tool_calls"])
        said = f"calls {calls}" if calls else repr(_short(content["content"]))
        return f"{said}  [{metadata['usage'].get('total_tokens', 0)} tokens]"
    if kind == "llm.tool.result":
        return f"{content['name']} -> {_short(content['content'])}"
    if kind == "run.end":
        return f"status {metadata['status']}, {len(content.get('messages', []))} messages"
    if isinstance(content, dict) and "content" in content:
        return repr(_short(content["content"]))
    return _short(content)


def print_timeline(events: list[RunEvent]) -> None:
    """Print seq, type, category, caller and a content summary, one event per line."""
    print(f"{'seq':>4}  {'type':<16} {'category':<9} {'caller':<11} summary")
    for event in events:
        caller = event["metadata"].get("caller", "")
        print(
            f"{event['seq']:>4}  {event['event_type']:<16} {event['category']:<9} "
            f"{caller:<11} {describe(event)}"
        )


def print_summary(summary: RunSummary) -> None:
    """Print the stored run summary."""
    print(f"status {summary.status} in {summary.duration_ms} ms")
    print(
        f"tokens: {summary.total_tokens} total ({summary.total_input_tokens} in, "
        f"{summary.total_output_tokens} out) over {summary.llm_call_count} model calls"
    )
    for model, usage in summary.token_usage_by_model.items():
        print(f"  {model}: {usage}")
    print(f"first human message: {summary.first_human_message!r}")
    print(f"last AI message:     {summary.last_ai_message!r}")


async def main() -> None:
    """Run the agent once with a journal and print what the store holds for the run."""
    async with open_store() as store:
        journal = RunJournal(thread_id="quickstart", event_store=store)
        question = HumanMessage("What's the weather in Paris?")
        await build_agent().ainvoke({"messages": [question]}, {"callbacks": [journal]})
        await journal.flush()
        assert journal.thread_id is not None and journal.run_id is not None
        print(f"run {journal.run_id} on thread {journal.thread_id} in {default_store_url()}\n")
        print_timeline(await store.list_events(journal.thread_id, journal.run_id))
        summary = await store.get_run_summary(journal.thread_id, journal.run_id)
        assert summary is not None
        print()
        print_summary(summary)


if __name__ == "__main__":
    asyncio.run(main())
