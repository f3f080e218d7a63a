"""A long chat thread's storage grows linearly with its turns: ``run.end`` holds the whole graph
state, rewritten every turn, and is cut at the store's ``max_outputs_content``."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from deerflow_journal import RunJournal, RunSummary
from deerflow_journal.records import DEFAULT_MAX_OUTPUTS_CONTENT, encode_json
from tests.backends import Backend
from tests.journal.agents import agent_graph, ai, scripted

TURNS = 30
REPLY = "word " * 1600  # 8 kB: the state passes the outputs limit within ten turns


async def chat_thread(store: Any) -> list[list[dict[str, Any]]]:
    """Run a ``TURNS``-turn chat on one thread; return each turn's stored events."""
    graph = agent_graph(scripted(*(ai(f"{i}: {REPLY}") for i in range(TURNS))), [])
    graph.checkpointer = InMemorySaver()
    journal = RunJournal(event_store=store)
    config: dict[str, Any] = {"callbacks": [journal], "configurable": {"thread_id": "chat"}}
    runs = []
    for turn in range(TURNS):
        await graph.ainvoke({"messages": [HumanMessage(f"question {turn}")]}, config)
        await journal.flush()
        assert journal.run_id is not None
        runs.append(await store.list_events("chat", journal.run_id, limit=1000))
    summaries = await store.list_run_summaries("chat", limit=TURNS)
    assert {s.status for s in summaries} == {"success"}
    assert all(isinstance(s, RunSummary) for s in summaries)
    return runs


def stored_bytes(events: list[dict[str, Any]]) -> int:
    """The JSON bytes of the events' content and metadata (what a row holds, ids aside)."""
    return sum(
        len(encode_json(e["content"]).encode()) + len(encode_json(e["metadata"]).encode())
        for e in events
    )


def run_end(events: list[dict[str, Any]]) -> dict[str, Any]:
    (end,) = [e for e in events if e["event_type"] == "run.end"]
    return end


async def test_a_chat_threads_storage_grows_linearly_with_its_turns(backend: Backend):
    async with backend.make() as store:
        runs = await chat_thread(store)
    per_turn = [stored_bytes(events) for events in runs]
    ends = [run_end(events) for events in runs]
    # Early turns keep their whole state; from the tenth on it is cut at the limit.
    assert "content_truncated" not in ends[0]["metadata"]
    for end in ends[9:]:
        assert end["metadata"]["content_truncated"] is True
        assert len(end["content"].encode()) <= DEFAULT_MAX_OUTPUTS_CONTENT
    lengths = [end["metadata"]["original_byte_length"] for end in ends[9:]]
    assert lengths == sorted(lengths) and lengths[-1] > 3 * DEFAULT_MAX_OUTPUTS_CONTENT
    # So each later turn adds about the same bytes: turns 21-30 add what turns 11-20 did.
    assert sum(per_turn[20:]) < 1.05 * sum(per_turn[10:20])
    assert max(per_turn[10:]) < 1.05 * min(per_turn[10:])


async def test_max_outputs_content_none_keeps_every_run_end_whole(backend: Backend):
    async with backend.make(max_outputs_content=None) as store:
        runs = await chat_thread(store)
    per_turn = [stored_bytes(events) for events in runs]
    ends = [run_end(events) for events in runs]
    assert all("content_truncated" not in end["metadata"] for end in ends)
    assert len(ends[-1]["content"]["messages"]) == 2 * TURNS
    # Without the limit each turn stores the whole thread again: growth with the square.
    assert sum(per_turn[20:]) > 1.5 * sum(per_turn[10:20])
