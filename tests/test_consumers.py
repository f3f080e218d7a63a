"""Consumer read helpers (visible messages, memory digests, workspace changes) on each backend."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from deerflow_journal import (
    WorkspaceRoot,
    capture_workspace_snapshot,
    latest_workspace_changes,
    memory_context_digests,
    record_workspace_changes,
    user_scope,
    visible_messages,
)
from deerflow_journal import consumers as consumers_module

T = "th"


def message(kind: str, payload: Any, caller: str = "lead_agent", run_id: str = "r1") -> dict:
    return {
        "thread_id": T,
        "run_id": run_id,
        "event_type": kind,
        "category": "message",
        "content": payload.model_dump(),
        "metadata": {"caller": caller},
    }


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_visible_messages_drops_middleware_subagent_ai_and_hidden_rows(store):
    hidden = HumanMessage(content="system nudge", additional_kwargs={"hide_from_ui": True})
    not_quite_hidden = HumanMessage(content="shown", additional_kwargs={"hide_from_ui": "yes"})
    events = [
        message("llm.human.input", HumanMessage(content="hi")),
        message("llm.ai.response", AIMessage(content="summary"), caller="middleware:summarize"),
        message("llm.ai.response", AIMessage(content="sub"), caller="subagent:research"),
        message("ai_message", AIMessage(content="old sub"), caller="subagent:research"),
        message("llm.tool.result", ToolMessage(content="r", tool_call_id="c"), caller="subagent:x"),
        message("llm.human.input", hidden),
        message("llm.human.input", not_quite_hidden),
        message("llm.ai.response", AIMessage(content="answer")),
        {"thread_id": T, "run_id": "r1", "event_type": "run.start", "category": "trace"},
    ]
    await store.put_batch(events)
    shown = visible_messages(await store.list_messages(T))
    assert [e["content"]["content"] for e in shown] == ["hi", "r", "shown", "answer"]
    everything = await store.list_events(T, "r1")
    assert visible_messages(everything) == shown


def test_visible_messages_tolerates_rows_without_metadata_or_dict_content():
    rows = [
        {"category": "message", "event_type": "llm.ai.response", "content": "plain"},
        {"category": "message", "event_type": "x", "content": None, "metadata": None},
    ]
    assert visible_messages(rows) == rows


async def test_memory_context_digests_maps_runs_to_their_digest(store):
    for run_id, text in (("r1", "memory one"), ("r3", "memory three")):
        await store.put(
            thread_id=T,
            run_id=run_id,
            event_type="context:memory",
            category="context",
            content={"content_sha256": digest(text)},
        )
    await store.put(thread_id=T, run_id="r2", event_type="run.start", category="trace")
    got = await memory_context_digests(store, T, ["r1", "r2", "r3", "unknown"])
    assert got == {"r1": digest("memory one"), "r3": digest("memory three")}
    assert await memory_context_digests(store, T, "r1") == {"r1": digest("memory one")}
    assert await memory_context_digests(store, T, []) == {}


async def test_memory_context_digests_respects_the_user_scope(store):
    with user_scope("alice"):
        await store.put(
            thread_id=T,
            run_id="r1",
            event_type="context:memory",
            category="context",
            content={"content_sha256": digest("a")},
        )
    with user_scope("bob"):
        assert await memory_context_digests(store, T, ["r1"]) == {}
    with user_scope("alice"):
        assert await memory_context_digests(store, T, ["r1"]) == {"r1": digest("a")}


async def test_latest_workspace_changes_returns_the_newest_payload(store, tmp_path, monkeypatch):
    monkeypatch.setattr(consumers_module, "_PAGE", 2)
    roots = [WorkspaceRoot("outputs", tmp_path, "/out")]
    assert await latest_workspace_changes(store, T, "r1") is None
    for i in range(5):
        before = await capture_workspace_snapshot(roots)
        (tmp_path / f"f{i}.txt").write_text("x\n")
        await record_workspace_changes(store, T, "r1", before, roots)
    await store.put(thread_id=T, run_id="r1", event_type="run.end", category="outputs")
    latest = await latest_workspace_changes(store, T, "r1")
    assert [f["path"] for f in latest["files"]] == ["/out/f4.txt"]
    assert latest["version"] == 1
    assert await latest_workspace_changes(store, T, "other-run") is None


@pytest.mark.parametrize("count", [2, 3])
async def test_latest_workspace_changes_pages_to_the_end(store, monkeypatch, count):
    monkeypatch.setattr(consumers_module, "_PAGE", 2)
    events = [
        {
            "thread_id": T,
            "run_id": "r1",
            "event_type": "workspace_changes",
            "category": "workspace",
            "content": f"{i} files changed +0 -0",
            "metadata": {"workspace_changes": {"n": i}},
        }
        for i in range(count)
    ]
    await store.put_batch(events)
    assert await latest_workspace_changes(store, T, "r1") == {"n": count - 1}


async def test_the_run_helpers_refuse_a_missing_run_id(store):
    """``list_events(thread, None)`` reads the whole thread: a helper of one run must not."""
    await store.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")
    with pytest.raises(TypeError, match="run_id"):
        await latest_workspace_changes(store, "t1", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="run_id"):
        await memory_context_digests(store, "t1", [None])  # type: ignore[list-item]
