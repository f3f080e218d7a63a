"""A real LangGraph run whose tool is a subagent graph streaming ``task_*`` chunks.

The parent graph's caller consumes ``stream_mode="custom"`` and persists the mapped chunks with
``put_batch``, the path users take without a journal. The ``subagent.*`` events they become are
described in docs/events.md.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from deerflow_journal import (
    capture_new_step_messages,
    subagent_run_event,
    validate_event,
)

USAGE = {"input_tokens": 30, "output_tokens": 12, "total_tokens": 42}


def call(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"name": name, "args": args, "id": call_id, "type": "tool_call"}


@tool
def list_files(path: str) -> str:
    """List the files under ``path``."""
    return f"{path}: a.txt b.txt"


def agent_graph(replies: list[AIMessage], tools: list) -> Any:
    """A minimal ReAct graph: a fake model node and a tool node."""
    model = GenericFakeChatModel(messages=iter(replies))

    def agent(state: MessagesState) -> dict[str, list]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    return graph.compile()


def research_subagent(steps: int) -> Any:
    """A subagent that lists files ``steps`` times and then answers."""
    replies = [
        AIMessage(
            content=f"looking {i}", tool_calls=[call("list_files", {"path": f"/d{i}"}, f"s{i}")]
        )
        for i in range(steps)
    ]
    return agent_graph([*replies, AIMessage(content="found 2 files")], [list_files])


@tool
def task(description: str, task_id: str, steps: int) -> str:
    """Delegate ``description`` to a research subagent and return its answer."""
    write = get_stream_writer()
    write({"type": "task_started", "task_id": task_id, "description": description})
    write({"type": "task_running", "task_id": task_id, "message": {}})  # malformed: no index
    captured: list[dict[str, Any]] = []
    seen: set[str] = set()
    cursor = 0
    subagent = research_subagent(steps)
    for state in subagent.stream({"messages": [HumanMessage(description)]}, stream_mode="values"):
        already = len(captured)
        cursor = capture_new_step_messages(state["messages"], captured, seen, cursor)
        for index in range(already, len(captured)):
            write(
                {
                    "type": "task_running",
                    "task_id": task_id,
                    "message_index": index,
                    "message": captured[index],
                }
            )
    result = captured[-1]["content"]
    write(
        {
            "type": "task_completed",
            "task_id": task_id,
            "result": result,
            "usage": USAGE,
            "model_name": "fake",
        }
    )
    return result


def lead_graph() -> Any:
    delegate = AIMessage(
        content="delegating",
        tool_calls=[
            call("task", {"description": "find files", "task_id": "ta", "steps": 3}, "c1"),
            call("task", {"description": "find more", "task_id": "tb", "steps": 1}, "c2"),
        ],
    )
    return agent_graph([delegate, AIMessage(content="all done")], [task])


async def test_a_subagent_tool_streams_chunks_that_read_back_per_task(store):
    chunks = [
        chunk
        async for chunk in lead_graph().astream(
            {"messages": [HumanMessage("go")]}, stream_mode="custom"
        )
    ]
    events = [subagent_run_event(chunk) for chunk in chunks]
    assert sum(e is None for e in events) == 2  # the malformed chunk of each task
    await store.put_batch(
        [{"thread_id": "th", "run_id": "r1", **e} for e in events if e is not None]
    )

    pages, after = [], None
    while page := await store.list_events("th", "r1", task_id="ta", limit=2, after_seq=after):
        pages.append(page)
        after = page[-1]["seq"]
    records = [r for page in pages for r in page]
    for record in records:
        validate_event(record)
    # 3 tool-calling AI steps, their 3 tool results, the final answer: 7 steps.
    assert [r["event_type"] for r in records] == [
        "subagent.start",
        *["subagent.step"] * 7,
        "subagent.end",
    ]
    steps = [r["content"] for r in records[1:-1]]
    assert [s["message_index"] for s in steps] == list(range(7))
    assert [s["kind"] for s in steps] == ["ai", "tool"] * 3 + ["ai"]
    assert steps[0]["tool_calls"] == [{"name": "list_files", "args": {"path": "/d0"}}]
    assert steps[1]["tool_name"] == "list_files"
    assert steps[1]["text"] == "/d0: a.txt b.txt"
    assert records[-1]["content"] == {
        "task_id": "ta",
        "status": "completed",
        "model_name": "fake",
        "usage": USAGE,
        "result": "found 2 files",
        "result_truncated": False,
    }
    other = await store.list_events("th", "r1", task_id="tb")
    assert [r["event_type"] for r in other] == ["subagent.start"] + ["subagent.step"] * 3 + [
        "subagent.end"
    ]
