"""Subagent ``task_*`` chunks become ``subagent.*`` events (see docs/events.md)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from deerflow_journal import (
    SUBAGENT_END_EVENT,
    SUBAGENT_START_EVENT,
    SUBAGENT_STEP_EVENT,
    RunEventStore,
    capture_new_step_messages,
    capture_step_message,
    subagent_run_event,
    validate_event,
)
from deerflow_journal.records import encode_json
from deerflow_journal.subagent import (
    SUBAGENT_EVENT_CATEGORY,
    SUBAGENT_STEP_MAX_CHARS,
    build_subagent_step,
    truncate_step_text,
)

LIMIT = SUBAGENT_STEP_MAX_CHARS
USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
TERMINAL = [
    ("task_completed", "completed"),
    ("task_failed", "failed"),
    ("task_cancelled", "cancelled"),
    ("task_timed_out", "timed_out"),
]


def running(message: Any, index: Any = 0, task_id: Any = "t1") -> dict[str, Any]:
    return {"type": "task_running", "task_id": task_id, "message_index": index, "message": message}


def ai_with_call(args: Any) -> dict[str, Any]:
    call = {"name": "search", "args": args, "id": "call-1", "type": "tool_call"}
    return AIMessage(content="", tool_calls=[call]).model_dump()


async def write(store: RunEventStore, events: list[dict[str, Any] | None], run_id: str = "r1"):
    """Write the mapped events of one run the way the journal does: one ``put_batch``."""
    kept = [e for e in events if e is not None]
    return await store.put_batch([{"thread_id": "th", "run_id": run_id, **e} for e in kept])


# -- chunk types ------------------------------------------------------------------------------


def test_task_started_becomes_subagent_start():
    event = subagent_run_event({"type": "task_started", "task_id": "t1", "description": "look"})
    assert event == {
        "event_type": SUBAGENT_START_EVENT.event_type,
        "category": SUBAGENT_START_EVENT.category,
        "content": {"task_id": "t1", "description": "look"},
        "metadata": {"task_id": "t1"},
    }
    assert SUBAGENT_EVENT_CATEGORY == "subagent"


def test_task_started_without_description_keeps_a_null_description():
    event = subagent_run_event({"type": "task_started", "task_id": "t1"})
    assert event is not None
    assert event["content"] == {"task_id": "t1", "description": None}


def test_task_running_with_an_ai_message_becomes_an_ai_step():
    message = AIMessage(
        content="thinking", tool_calls=[{"name": "ls", "args": {"p": "/"}, "id": "c"}]
    )
    event = subagent_run_event(running(message.model_dump(), index=3))
    assert event is not None
    assert event["event_type"] == SUBAGENT_STEP_EVENT.event_type
    assert event["category"] == SUBAGENT_STEP_EVENT.category
    assert event["metadata"] == {"task_id": "t1", "message_index": 3}
    assert event["content"] == {
        "task_id": "t1",
        "message_index": 3,
        "kind": "ai",
        "text": "thinking",
        "truncated": False,
        "tool_calls": [{"name": "ls", "args": {"p": "/"}}],
    }


def test_task_running_with_a_tool_message_becomes_a_tool_step():
    message = ToolMessage(content="3 files", name="ls", tool_call_id="c")
    event = subagent_run_event(running(message.model_dump()))
    assert event is not None
    assert event["content"] == {
        "task_id": "t1",
        "message_index": 0,
        "kind": "tool",
        "text": "3 files",
        "truncated": False,
        "tool_name": "ls",
        "tool_call_id": "c",
    }


def test_task_running_accepts_a_message_object_as_well_as_its_dict():
    message = AIMessage(content="hi", id="m1")
    assert subagent_run_event(running(message)) == subagent_run_event(running(message.model_dump()))


@pytest.mark.parametrize(("chunk_type", "status"), TERMINAL)
def test_terminal_chunks_become_subagent_end_with_their_status(chunk_type, status):
    chunk = {
        "type": chunk_type,
        "task_id": "t1",
        "model_name": "gpt-x",
        "usage": USAGE,
        "result": "done",
        "error": "boom",
    }
    event = subagent_run_event(chunk)
    assert event == {
        "event_type": SUBAGENT_END_EVENT.event_type,
        "category": SUBAGENT_END_EVENT.category,
        "content": {
            "task_id": "t1",
            "status": status,
            "model_name": "gpt-x",
            "usage": USAGE,
            "result": "done",
            "result_truncated": False,
            "error": "boom",
            "error_truncated": False,
        },
        "metadata": {"task_id": "t1"},
    }


def test_terminal_chunk_with_only_a_task_id_has_only_the_required_fields():
    assert subagent_run_event({"type": "task_completed", "task_id": "t1"})["content"] == {
        "task_id": "t1",
        "status": "completed",
    }


def test_terminal_chunk_keeps_a_non_string_result_as_its_json():
    event = subagent_run_event({"type": "task_completed", "task_id": "t", "result": {"n": 1}})
    assert event["content"]["result"] == '{"n":1}'


def test_terminal_chunk_keeps_an_exception_as_its_message_else_its_type():
    event = subagent_run_event({"type": "task_failed", "task_id": "t", "error": ValueError("bad")})
    assert event["content"]["error"] == "bad"
    event = subagent_run_event({"type": "task_failed", "task_id": "t", "error": TimeoutError()})
    assert event["content"]["error"] == "TimeoutError"


# -- malformed chunks -------------------------------------------------------------------------

MALFORMED = {
    "missing task_id": {"type": "task_started", "description": "d"},
    "empty task_id": {"type": "task_started", "task_id": ""},
    "int task_id": {"type": "task_started", "task_id": 7},
    "None task_id": {"type": "task_completed", "task_id": None},
    "task_id too long to store": {"type": "task_started", "task_id": "t" * 129},
    "bool message_index": running({"type": "ai", "content": "x"}, index=True),
    "negative message_index": running({"type": "ai", "content": "x"}, index=-1),
    "float message_index": running({"type": "ai", "content": "x"}, index=1.0),
    # JSON stores keep integers beyond 64 bits as text, which the contract refuses.
    "message_index over 64 bits": running({"type": "ai", "content": "x"}, index=2**63),
    "missing message_index": {"type": "task_running", "task_id": "t", "message": {}},
    "string message": running("hello"),
    "list message": running([{"type": "ai"}]),
    "missing message": {"type": "task_running", "task_id": "t", "message_index": 0},
    "unknown task_ type": {"type": "task_paused", "task_id": "t"},
    "not a task_ type": {"type": "progress", "task_id": "t"},
    "missing type": {"task_id": "t"},
    "non-string type": {"type": 3, "task_id": "t"},
}


@pytest.mark.parametrize("chunk", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_chunks_give_none(chunk):
    assert subagent_run_event(chunk) is None


@pytest.mark.parametrize("chunk", [None, "task_started", 3, ["task_started", "t"], ("a", {})])
def test_non_mapping_chunks_give_none(chunk):
    assert subagent_run_event(chunk) is None


class ExplodingChunk(dict):
    """A chunk whose lookups fail, as a buggy producer's custom mapping might."""

    def get(self, key, default=None):
        raise RuntimeError("broken mapping")


def test_subagent_run_event_never_raises():
    assert subagent_run_event(ExplodingChunk(type="task_started", task_id="t")) is None


async def test_malformed_chunks_write_nothing(store):
    events = [subagent_run_event(chunk) for chunk in MALFORMED.values()]
    assert await write(store, events) == []
    assert await store.list_events("th", "r1") == []


# -- truncation -------------------------------------------------------------------------------


def test_truncate_step_text_keeps_text_at_the_limit_and_cuts_one_past():
    assert truncate_step_text("abc", 3) == ("abc", False)
    assert truncate_step_text("abcd", 3) == ("abc", True)
    assert truncate_step_text("", 0) == ("", False)


@pytest.mark.parametrize("bad", [-1, True, 1.5])
def test_truncate_step_text_rejects_a_bad_limit(bad):
    with pytest.raises(ValueError, match="max_chars"):
        truncate_step_text("abc", bad)


@pytest.mark.parametrize(("length", "truncated"), [(LIMIT, False), (LIMIT + 1, True)])
def test_step_text_is_cut_past_the_limit(length, truncated):
    content = build_subagent_step(
        {"type": "ai", "content": "é" * length}, task_id="t", message_index=0
    )
    assert content["text"] == "é" * LIMIT
    assert content["truncated"] is truncated


def test_step_text_joins_the_text_blocks_of_list_content():
    message = AIMessage(content=[{"type": "text", "text": "a"}, {"type": "image"}, "b"])
    assert build_subagent_step(message, task_id="t", message_index=0)["text"] == "ab"


@pytest.mark.parametrize(("extra", "truncated"), [(0, False), (1, True)])
def test_tool_call_args_are_cut_to_a_string_past_the_limit(extra, truncated):
    padding = len(encode_json({"q": ""}))
    args = {"q": "x" * (LIMIT - padding + extra)}
    assert len(encode_json(args)) == LIMIT + extra
    event = subagent_run_event(running(ai_with_call(args)))
    (call,) = event["content"]["tool_calls"]
    if truncated:
        assert call == {"name": "search", "args": encode_json(args)[:LIMIT], "args_truncated": True}
    else:
        assert call == {"name": "search", "args": args}  # the flag appears only when true


@pytest.mark.parametrize("key", ["result", "error"])
@pytest.mark.parametrize(("length", "truncated"), [(LIMIT, False), (LIMIT + 1, True)])
def test_result_and_error_are_cut_past_the_limit(key, length, truncated):
    event = subagent_run_event({"type": "task_failed", "task_id": "t", key: "r" * length})
    assert event["content"][key] == "r" * LIMIT
    assert event["content"][f"{key}_truncated"] is truncated


def test_a_custom_max_chars_applies_to_text_and_args():
    message = ai_with_call({"q": "long"})
    message["content"] = "abcdef"
    step = build_subagent_step(message, task_id="t", message_index=1, max_chars=4)
    assert (step["text"], step["truncated"]) == ("abcd", True)
    assert step["tool_calls"] == [{"name": "search", "args": '{"q"', "args_truncated": True}]


# -- usage ------------------------------------------------------------------------------------


def test_valid_usage_is_kept():
    event = subagent_run_event({"type": "task_completed", "task_id": "t", "usage": USAGE})
    assert event["content"]["usage"] == USAGE


INVALID_USAGE = {
    "not a dict": "15 tokens",
    "missing total": {"input_tokens": 1, "output_tokens": 2},
    "negative": {**USAGE, "output_tokens": -1},
    "bool": {**USAGE, "input_tokens": True},
    "float": {**USAGE, "total_tokens": 15.0},
    "string": {**USAGE, "total_tokens": "15"},
    "None": None,
}


@pytest.mark.parametrize("usage", INVALID_USAGE.values(), ids=INVALID_USAGE.keys())
def test_invalid_usage_is_dropped(usage):
    event = subagent_run_event({"type": "task_completed", "task_id": "t", "usage": usage})
    assert event is not None
    assert "usage" not in event["content"]


def test_usage_keeps_only_the_token_counts():
    usage = {**USAGE, "input_token_details": {"cache_read": 3}}
    event = subagent_run_event({"type": "task_completed", "task_id": "t", "usage": usage})
    assert event["content"]["usage"] == USAGE


# -- step history capture ---------------------------------------------------------------------


def test_capture_step_message_keeps_new_ai_and_tool_messages_once():
    captured: list[dict] = []
    seen: set[str] = set()
    ai = AIMessage(content="a", id="m1")
    tool = ToolMessage(content="r", tool_call_id="c", id="m2")
    assert capture_step_message(ai, captured, seen) is True
    assert capture_step_message(ai.model_dump(), captured, seen) is False
    assert capture_step_message(tool, captured, seen) is True
    assert captured == [ai.model_dump(), tool.model_dump()]
    assert seen == {"m1", "m2"}


def test_capture_step_message_ignores_other_message_types():
    captured: list[dict] = []
    for message in (HumanMessage(content="q"), SystemMessage(content="s"), "text", None):
        assert capture_step_message(message, captured, set()) is False
    assert captured == []


def test_capture_step_message_dedupes_messages_without_id_by_equality():
    captured: list[dict] = []
    seen: set[str] = set()
    assert capture_step_message(AIMessage(content="a"), captured, seen) is True
    assert capture_step_message(AIMessage(content="a"), captured, seen) is False
    assert capture_step_message(AIMessage(content="b"), captured, seen) is True
    assert [m["content"] for m in captured] == ["a", "b"]


def test_capture_new_step_messages_follows_a_history_that_shrinks_and_regrows():
    human = HumanMessage(content="task", id="h")
    a1 = AIMessage(content="step 1", id="a1")
    t1 = ToolMessage(content="out 1", tool_call_id="c1", id="t1")
    a2 = AIMessage(content="step 2", id="a2")
    summary = HumanMessage(content="summary so far", id="s", name="summary")
    a3 = AIMessage(content="step 3", id="a3")
    t3 = ToolMessage(content="out 3", tool_call_id="c3", id="t3")
    captured: list[dict] = []
    seen: set[str] = set()

    cursor = capture_new_step_messages([human], captured, seen, 0)
    assert (cursor, captured) == (1, [])
    cursor = capture_new_step_messages([human, a1, t1], captured, seen, cursor)
    assert cursor == 3
    # The history did not grow: only the last message is re-checked.
    cursor = capture_new_step_messages([human, a1, t1], captured, seen, cursor)
    assert cursor == 3
    cursor = capture_new_step_messages([human, a1, t1, a2], captured, seen, cursor)
    assert cursor == 4
    # A summarisation rewrites the history to fewer messages, ending with a kept one.
    cursor = capture_new_step_messages([summary, a2], captured, seen, cursor)
    assert cursor == 2
    cursor = capture_new_step_messages([summary, a2, a3, t3], captured, seen, cursor)
    assert cursor == 4
    assert [m["id"] for m in captured] == ["a1", "t1", "a2", "a3", "t3"]


def test_capture_new_step_messages_rechecks_the_last_message_when_the_count_is_unchanged():
    captured: list[dict] = []
    seen: set[str] = set()
    human = HumanMessage(content="task", id="h")
    cursor = capture_new_step_messages([human, AIMessage(content="x", id="a")], captured, seen, 0)
    assert cursor == 2
    captured.clear()
    replaced = [human, AIMessage(content="y", id="b")]
    assert capture_new_step_messages(replaced, captured, seen, cursor) == 2
    assert [m["id"] for m in captured] == ["b"]


def test_capture_new_step_messages_on_an_empty_history_captures_nothing():
    captured: list[dict] = []
    assert capture_new_step_messages([], captured, set(), 3) == 0
    assert captured == []


# -- events through a store -------------------------------------------------------------------


def subagent_chunks(task_id: str, steps: int) -> list[dict[str, Any]]:
    """A whole subagent task: start, ``steps`` alternating AI/tool steps, completion."""
    chunks: list[dict[str, Any]] = [
        {"type": "task_started", "task_id": task_id, "description": f"task {task_id}"}
    ]
    for i in range(steps):
        if i % 2:
            message = ToolMessage(content=f"out {i}", name="ls", tool_call_id=f"c{i}")
        else:
            call = {"name": "ls", "args": {"path": "/" * (i + 1)}, "id": f"c{i + 1}"}
            message = AIMessage(content=f"step {i}", tool_calls=[call])
        chunks.append(running(message.model_dump(), index=i, task_id=task_id))
    chunks.append(
        {"type": "task_completed", "task_id": task_id, "usage": USAGE, "result": "x" * (LIMIT + 5)}
    )
    return chunks


async def test_every_produced_event_validates_against_the_contract(store):
    chunks = subagent_chunks("a", 4) + [
        {"type": t, "task_id": f"end-{t}", "error": "e" * (LIMIT + 1), "model_name": "m"}
        for t, _ in TERMINAL
    ]
    chunks.append(running(ai_with_call({"q": "z" * LIMIT}), index=9, task_id="a"))
    chunks.append({"type": "task_started", "task_id": "b", "description": None})
    records = await write(store, [subagent_run_event(c) for c in chunks])
    assert len(records) == len(chunks)
    stored = await store.list_events("th", "r1")
    assert stored == records
    for record in stored:
        validate_event(record)


async def test_interleaved_tasks_read_back_per_task_with_after_seq_paging(store):
    a, b = subagent_chunks("a", 7), subagent_chunks("b", 5)
    interleaved = [c for pair in zip(a, b, strict=False) for c in pair] + a[len(b) :]
    await write(store, [subagent_run_event(c) for c in interleaved])
    pages, after = [], None
    while page := await store.list_events("th", "r1", task_id="a", limit=3, after_seq=after):
        pages.append(page)
        after = page[-1]["seq"]
    got = [r for page in pages for r in page]
    assert [len(p) for p in pages] == [3, 3, 3]
    assert [r["event_type"] for r in got] == ["subagent.start"] + ["subagent.step"] * 7 + [
        "subagent.end"
    ]
    steps = [r["content"]["message_index"] for r in got if r["event_type"] == "subagent.step"]
    assert steps == list(range(7))
    end = got[-1]["content"]
    assert (end["result_truncated"], len(end["result"])) == (True, LIMIT)
