"""The store contract (``RunEventStore``'s invariants in ``stores/base.py``), run unchanged
against every backend in ``BACKENDS``."""

from __future__ import annotations

import asyncio
import contextlib
import decimal
import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from deerflow_journal import RunEventStore, RunSummary, open_store, user_scope, validate_event
from deerflow_journal.catalog import FIXED_RUN_EVENT_DEFINITIONS, MIDDLEWARE_EVENT_PATTERN
from tests.backends import Backend

T = "thread-1"


def ev(
    run_id: str = "r1",
    event_type: str = "llm.ai.response",
    category: str = "message",
    content: Any = "",
    thread_id: str = T,
    **extra: Any,
) -> dict[str, Any]:
    """An event dict for ``put_batch`` (``put`` takes the same keys)."""
    return {
        "thread_id": thread_id,
        "run_id": run_id,
        "event_type": event_type,
        "category": category,
        "content": content,
        **extra,
    }


def seqs(records: list[dict]) -> list[int]:
    return [r["seq"] for r in records]


async def fill(store: RunEventStore, events: list[dict]) -> list[dict]:
    return await store.put_batch(events)


async def mixed_thread(store: RunEventStore, n: int = 30) -> list[dict]:
    """Write ``n`` events where every third one is a trace event (not a message)."""
    events = [
        ev(content=f"m{i}") if i % 3 else ev(event_type="run.start", category="trace", content={})
        for i in range(n)
    ]
    return await store.put_batch(events)


# -- sequence numbers -----------------------------------------------------------------------


async def test_seq_is_strictly_increasing_within_a_thread(store):
    first = await store.put(**ev())
    batch = await store.put_batch([ev(), ev(run_id="r2"), ev()])
    last = await store.put(**ev(run_id="r3"))
    numbers = [first["seq"], *seqs(batch), last["seq"]]
    assert numbers == sorted(numbers) and len(set(numbers)) == 5
    assert numbers[0] >= 1


async def test_seq_is_independent_across_threads(store):
    a = await store.put_batch([ev(thread_id="a"), ev(thread_id="a")])
    b = await store.put(**ev(thread_id="b"))
    assert seqs(a) == [1, 2]
    assert b["seq"] == 1


async def test_seq_is_never_reused_after_deletes(store):
    written = await store.put_batch([ev(run_id="old"), ev(run_id="old")])
    assert await store.delete_by_run(T, "old") == 2
    after_run_delete = await store.put(**ev(run_id="new"))
    assert after_run_delete["seq"] > written[-1]["seq"]
    await store.delete_by_thread(T)
    after_thread_delete = await store.put(**ev(run_id="newer"))
    assert after_thread_delete["seq"] > after_run_delete["seq"]


async def test_concurrent_puts_on_one_thread_get_unique_increasing_seq(store):
    records = await asyncio.gather(*(store.put(**ev(content=str(i))) for i in range(40)))
    stored = await store.list_events(T, "r1", limit=100)
    assert sorted(seqs(records)) == seqs(stored)
    assert len(set(seqs(stored))) == 40


async def test_put_batch_assigns_seq_in_input_order(store):
    records = await store.put_batch([ev(content=str(i)) for i in range(10)])
    assert [r["content"] for r in records] == [str(i) for i in range(10)]
    assert seqs(records) == sorted(seqs(records))
    assert await store.list_events(T, "r1") == records


async def test_batch_spanning_runs_and_threads_lands_each_event_with_its_own_ids(store):
    batch = [
        ev(thread_id="ta", run_id="r1", content="a1"),
        ev(thread_id="tb", run_id="r9", content="b1"),
        ev(thread_id="ta", run_id="r2", content="a2"),
        ev(thread_id="tb", run_id="r9", content="b2"),
    ]
    records = await store.put_batch(batch)
    assert [(r["thread_id"], r["run_id"], r["content"]) for r in records] == [
        ("ta", "r1", "a1"),
        ("tb", "r9", "b1"),
        ("ta", "r2", "a2"),
        ("tb", "r9", "b2"),
    ]
    assert [r["seq"] for r in records] == [1, 1, 2, 2]
    assert [r["content"] for r in await store.list_events("ta", "r2")] == ["a2"]
    assert [r["content"] for r in await store.list_events("tb", "r9")] == ["b1", "b2"]


async def test_empty_batch_writes_nothing(store):
    assert await store.put_batch([]) == []
    assert await store.count_messages(T) == 0


# -- atomic, validated writes ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"thread_id": ""}, ValueError, "thread_id"),
        ({"run_id": 7}, TypeError, "run_id"),
        ({"event_type": "x" * 33}, ValueError, "event type"),
        ({"category": "c" * 17}, ValueError, "category"),
        ({"metadata": ["not", "a", "dict"]}, TypeError, "metadata"),
        ({"created_at": "yesterday"}, ValueError, "created_at"),
        ({"seq": 3}, ValueError, "seq is assigned by the store"),
        ({"contnet": "typo"}, ValueError, "contnet"),
        ({"thread_id": "a\nb"}, ValueError, "control"),
        ({"run_id": "r" * 129}, ValueError, "run_id"),
    ],
)
async def test_rejected_batch_writes_nothing_and_names_the_field_and_index(
    store, bad, error, match
):
    batch = [ev(), ev(), {**ev(), **bad}, ev()]
    with pytest.raises(error, match=match) as info:
        await store.put_batch(batch)
    assert "event 2" in str(info.value)
    assert await store.count_messages(T) == 0
    assert await store.list_events(T, "r1") == []


async def test_put_requires_keywords_and_rejects_bad_values(store):
    with pytest.raises(TypeError):
        await store.put(T, "r1", "x", "trace")  # type: ignore[misc]
    with pytest.raises(ValueError, match="event type"):
        await store.put(**ev(event_type=""))


async def test_put_batch_rejects_a_non_list(store):
    with pytest.raises(TypeError, match="list"):
        await store.put_batch(ev())  # type: ignore[arg-type]


# -- normalised read-back, identical on every backend ---------------------------------------


class Opaque:
    def __str__(self) -> str:
        return "<opaque>"


WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
GRAPH_OUTPUT = {
    "messages": [{"type": "ai", "content": "héllo 🌍"}],
    "when": WHEN,
    "tags": ("a", "b"),
    "price": decimal.Decimal("1.10"),
    "blob": b"\x00\x01",
    "obj": Opaque(),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "nan": float("nan"),
    "huge": 2**70,
    "nul": "a\x00b",
    1: "int key",
}
GRAPH_OUTPUT_READ_BACK = {
    "messages": [{"type": "ai", "content": "héllo 🌍"}],
    "when": "2026-01-02 03:04:05.678901+00:00",
    "tags": ["a", "b"],
    "price": "1.10",
    "blob": "b'\\x00\\x01'",
    "obj": "<opaque>",
    "id": "12345678-1234-5678-1234-567812345678",
    "nan": None,
    "huge": "1180591620717411303424",
    "nul": "a\ufffdb",
    "1": "int key",
}


async def test_run_end_with_nested_non_json_values_reads_back_as_plain_json(store):
    written = await store.put(
        **ev(
            event_type="run.end",
            category="outputs",
            content=GRAPH_OUTPUT,
            metadata={"status": "success", "at": WHEN},
        )
    )
    (read,) = await store.list_events(T, "r1")
    assert written["content"] == read["content"] == GRAPH_OUTPUT_READ_BACK
    assert read["metadata"] == {"status": "success", "at": "2026-01-02 03:04:05.678901+00:00"}
    validate_event(read)


async def test_unicode_content_and_metadata_read_back_unchanged(store):
    text = "naïve café — 中文 — עברית — 🧪\u2028\ttab"
    await store.put(**ev(content={"text": text}, metadata={"ключ": text}))
    (read,) = await store.list_messages(T)
    assert read["content"] == {"text": text}
    assert read["metadata"] == {"ключ": text}


@pytest.mark.parametrize("content", ["", "plain", 0, 1.5, True, None, [1, "x"], {"k": {"n": [1]}}])
async def test_json_content_types_read_back_with_their_type(store, content):
    await store.put(**ev(content=content))
    (read,) = await store.list_messages(T)
    assert read["content"] == content
    assert type(read["content"]) is type(content)


async def test_large_trace_content_is_cut_at_a_utf8_boundary(backend: Backend):
    async with backend.make(max_trace_content=100) as store:
        text = "é" * 80  # 160 bytes; byte 100 falls on a character boundary, 101 would not
        written = await store.put(**ev(event_type="llm.error", category="trace", content=text))
        odd = await store.put(**ev(event_type="llm.error", category="trace", content="x" + text))
        (first, second) = await store.list_events(T, "r1")
    assert first == written and second == odd
    assert first["content"] == "é" * 50
    assert first["metadata"] == {"content_truncated": True, "original_byte_length": 160}
    assert second["content"] == "x" + "é" * 49  # 99 bytes: the split character is dropped
    assert second["metadata"]["original_byte_length"] == 161


async def test_trace_object_content_over_the_limit_becomes_its_cut_json_text(backend: Backend):
    async with backend.make(max_trace_content=20) as store:
        await store.put(**ev(event_type="run.start", category="trace", content={"chain": "c" * 40}))
        (read,) = await store.list_events(T, "r1")
    assert read["content"] == '{"chain":"' + "c" * 10
    assert read["metadata"]["content_truncated"] is True


@pytest.mark.parametrize(
    "value",
    [uuid.UUID(int=12345), Path("/home/user/notes\nfile.txt"), b"raw\nbytes and more"],
    ids=["uuid", "path", "bytes"],
)
async def test_a_value_stored_as_a_json_string_is_cut_as_that_string(backend: Backend, value):
    # Stored as its str(), it must be cut as that text, as it would be once read back and
    # written again (a journal's spill file does that), not as its quoted, escaped JSON.
    async with backend.make(max_trace_content=12) as store:
        await store.put(**ev(event_type="llm.error", category="trace", content=value))
        await store.put(**ev(event_type="llm.error", category="trace", content=str(value)))
        as_value, as_text = await store.list_events(T, "r1")
    assert (as_value["content"], as_value["metadata"]) == (as_text["content"], as_text["metadata"])
    assert as_value["content"] == str(value).encode()[:12].decode()


async def test_max_trace_content_none_keeps_large_trace_content_whole(backend: Backend):
    big = "é" * 20000
    async with backend.make(max_trace_content=None) as store:
        written = await store.put_batch(
            [
                ev(event_type="llm.error", category="trace", content=big),
                ev(event_type="run.start", category="trace", content={"chain": big}),
            ]
        )
        read = await store.list_events(T, "r1")
    assert read == written
    assert [r["content"] for r in read] == [big, {"chain": big}]
    assert [r["metadata"] for r in read] == [{}, {}]


async def test_default_trace_limit_is_10240_bytes_and_other_categories_are_kept_whole(store):
    big = "x" * 20000
    await store.put(**ev(event_type="llm.error", category="trace", content=big))
    await store.put(**ev(content=big))
    trace, message = await store.list_events(T, "r1")
    assert len(trace["content"]) == 10240
    assert message["content"] == big
    assert "content_truncated" not in message["metadata"]


async def test_outputs_content_over_the_default_65536_bytes_is_cut_like_trace_content(store):
    state = {"messages": ["é" * 30000, "x" * 20000]}  # about 80 kB of JSON: a chat's run.end
    whole = await store.put(**ev(event_type="run.end", category="outputs", content=state))
    small = await store.put(**ev(event_type="run.end", category="outputs", content={"k": "v"}))
    read, kept = await store.list_events(T, "r1")
    assert (read, kept) == (whole, small)
    text = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    assert read["content"] == text.encode()[:65536].decode("utf-8", "ignore")
    assert read["metadata"] == {
        "content_truncated": True,
        "original_byte_length": len(text.encode()),
    }
    assert kept["content"] == {"k": "v"} and kept["metadata"] == {}


async def test_outputs_content_limit_is_a_store_option(backend: Backend):
    async with backend.make(max_outputs_content=100) as store:
        await store.put(**ev(event_type="run.end", category="outputs", content="é" * 60))
        await store.put(**ev(event_type="run.end", category="outputs", content="é" * 50))
        (cut, whole) = await store.list_events(T, "r1")
    assert cut["content"] == "é" * 50
    assert cut["metadata"] == {"content_truncated": True, "original_byte_length": 120}
    assert whole["content"] == "é" * 50 and whole["metadata"] == {}


async def test_max_outputs_content_none_keeps_large_outputs_whole(backend: Backend):
    big = {"messages": ["é" * 50000]}
    async with backend.make(max_outputs_content=None) as store:
        written = await store.put(**ev(event_type="run.end", category="outputs", content=big))
        (read,) = await store.list_events(T, "r1")
    assert read == written
    assert read["content"] == big and read["metadata"] == {}


async def test_outputs_limit_leaves_trace_content_to_the_trace_limit(backend: Backend):
    async with backend.make(max_trace_content=None, max_outputs_content=10) as store:
        await store.put(**ev(event_type="llm.error", category="trace", content="t" * 50))
        await store.put(**ev(event_type="run.end", category="outputs", content="o" * 50))
        trace, outputs = await store.list_events(T, "r1")
    assert trace["content"] == "t" * 50
    assert outputs["content"] == "o" * 10


# -- created_at -----------------------------------------------------------------------------


async def test_created_at_with_an_offset_keeps_its_instant(store):
    plus_five = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone(timedelta(hours=5)))
    await store.put(**ev(created_at=plus_five))
    await store.put(**ev(created_at="2026-03-01T12:00:00-02:30"))
    first, second = await store.list_messages(T)
    assert datetime.fromisoformat(first["created_at"]) == plus_five
    assert datetime.fromisoformat(second["created_at"]) == datetime(2026, 3, 1, 14, 30, tzinfo=UTC)


async def test_naive_created_at_is_taken_as_utc_and_default_is_now(store):
    before = datetime.now(UTC)
    await store.put(**ev(created_at=datetime(2026, 3, 1, 12, 0, 0)))
    await store.put(**ev())
    naive, default = await store.list_messages(T)
    assert naive["created_at"] == "2026-03-01T12:00:00.000000+00:00"
    stamped = datetime.fromisoformat(default["created_at"])
    assert stamped.tzinfo is not None
    assert before - timedelta(seconds=1) <= stamped <= datetime.now(UTC) + timedelta(seconds=1)


EXTREME_CREATED_AT = ["9999-12-31T23:59:59.999999+00:00", "0001-01-01T00:00:00+00:00"]
EXTREME_CREATED_AT_READ_BACK = [
    "9999-12-31T23:59:59.999999+00:00",
    "0001-01-01T00:00:00.000000+00:00",
]


async def test_extreme_created_at_reads_back_byte_identical(store):
    written = await store.put_batch([ev(created_at=when) for when in EXTREME_CREATED_AT])
    single, _ = await store.put_if_absent(**ev(run_id="r2", created_at=EXTREME_CREATED_AT[0]))
    again, created = await store.put_if_absent(**ev(run_id="r2"))
    assert [r["created_at"] for r in written] == EXTREME_CREATED_AT_READ_BACK
    assert await store.list_messages(T, limit=2, before_seq=single["seq"]) == written
    assert await store.list_events(T, "r1") == written
    assert (again, created) == (single, False)


# -- records are copies ---------------------------------------------------------------------


async def test_returned_records_are_copies(store):
    written = await store.put(**ev(content={"items": [1]}, metadata={"caller": "lead_agent"}))
    written["content"]["items"].append(2)
    written["metadata"]["caller"] = "changed"
    (page,) = await store.list_messages(T)
    page["content"]["items"].append(3)
    (events,) = await store.list_events(T, "r1")
    events["metadata"]["x"] = 1
    (again,) = await store.list_messages(T)
    assert again["content"] == {"items": [1]}
    assert again["metadata"] == {"caller": "lead_agent"}


async def test_mutating_the_input_after_a_write_changes_nothing(store):
    content = {"items": [1]}
    metadata = {"caller": "lead_agent"}
    await store.put(**ev(content=content, metadata=metadata))
    content["items"].append(2)
    metadata["caller"] = "changed"
    (read,) = await store.list_messages(T)
    assert read["content"] == {"items": [1]}
    assert read["metadata"] == {"caller": "lead_agent"}


# -- message paging -------------------------------------------------------------------------


async def test_list_messages_without_bounds_returns_the_latest_page_ascending(store):
    written = await mixed_thread(store)
    messages = [r for r in written if r["category"] == "message"]
    page = await store.list_messages(T, limit=5)
    assert seqs(page) == seqs(messages[-5:])


async def test_list_messages_before_seq_returns_last_page_ascending(store):
    written = await mixed_thread(store)
    messages = [r for r in written if r["category"] == "message"]
    pivot = messages[10]["seq"]
    page = await store.list_messages(T, limit=4, before_seq=pivot)
    assert seqs(page) == seqs(messages[6:10])


async def test_list_messages_after_seq_returns_first_page_ascending(store):
    written = await mixed_thread(store)
    messages = [r for r in written if r["category"] == "message"]
    page = await store.list_messages(T, limit=4, after_seq=messages[3]["seq"])
    assert seqs(page) == seqs(messages[4:8])


async def test_list_messages_with_both_bounds_pages_forward_inside_the_range(store):
    written = await mixed_thread(store)
    messages = [r for r in written if r["category"] == "message"]
    page = await store.list_messages(
        T, limit=3, after_seq=messages[2]["seq"], before_seq=messages[10]["seq"]
    )
    assert seqs(page) == seqs(messages[3:6])
    narrow = await store.list_messages(
        T, limit=50, after_seq=messages[2]["seq"], before_seq=messages[5]["seq"]
    )
    assert seqs(narrow) == seqs(messages[3:5])


async def test_paging_walks_the_whole_thread_backwards_and_forwards(store):
    written = await mixed_thread(store, 40)
    expected = seqs([r for r in written if r["category"] == "message"])
    backwards, before = [], None
    while page := await store.list_messages(T, limit=7, before_seq=before):
        backwards = seqs(page) + backwards
        before = page[0]["seq"]
    forwards, after = [], 0
    while page := await store.list_messages(T, limit=7, after_seq=after):
        forwards += seqs(page)
        after = page[-1]["seq"]
    assert backwards == forwards == expected


async def test_list_messages_only_returns_the_message_category(store):
    await store.put_batch(
        [
            ev(event_type="run.start", category="trace", content={"chain": "g"}),
            ev(event_type="llm.human.input", category="message", content={"type": "human"}),
            ev(event_type="run.end", category="outputs", content={}),
            ev(event_type="middleware:guardrail", category="middleware", content={}),
        ]
    )
    page = await store.list_messages(T)
    assert [r["event_type"] for r in page] == ["llm.human.input"]
    assert await store.count_messages(T) == 1


async def test_list_messages_limit_zero_and_unknown_thread_are_empty(store):
    await mixed_thread(store, 6)
    assert await store.list_messages(T, limit=0) == []
    assert await store.list_messages("no-such-thread") == []
    assert await store.list_messages(T, before_seq=1) == []


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"limit": -1}, ValueError),
        ({"limit": "5"}, TypeError),
        ({"limit": True}, TypeError),
        ({"before_seq": -3}, ValueError),
        ({"after_seq": 1.5}, TypeError),
    ],
)
async def test_list_messages_rejects_bad_paging_arguments(store, kwargs, error):
    with pytest.raises(error):
        await store.list_messages(T, **kwargs)


async def test_list_messages_by_run_pages_one_run(store):
    batch = []
    for i in range(12):
        batch.append(ev(run_id="ra", content=f"a{i}"))
        batch.append(ev(run_id="rb", content=f"b{i}"))
        batch.append(ev(run_id="ra", event_type="run.start", category="trace", content={}))
    written = await store.put_batch(batch)
    ra = [r for r in written if r["run_id"] == "ra" and r["category"] == "message"]
    assert seqs(await store.list_messages_by_run(T, "ra", limit=3)) == seqs(ra[-3:])
    assert seqs(
        await store.list_messages_by_run(T, "ra", limit=3, before_seq=ra[5]["seq"])
    ) == seqs(ra[2:5])
    assert seqs(await store.list_messages_by_run(T, "ra", limit=3, after_seq=ra[5]["seq"])) == (
        seqs(ra[6:9])
    )
    assert await store.list_messages_by_run(T, "missing") == []


# -- run events -----------------------------------------------------------------------------


async def test_list_events_returns_every_category_of_one_run_ascending(store):
    written = await store.put_batch(
        [
            ev(event_type="run.start", category="trace", content={"chain": "g"}),
            ev(run_id="other"),
            ev(event_type="llm.ai.response"),
            ev(event_type="run.end", category="outputs", content={}),
        ]
    )
    events = await store.list_events(T, "r1")
    assert [r["event_type"] for r in events] == ["run.start", "llm.ai.response", "run.end"]
    assert seqs(events) == [written[0]["seq"], written[2]["seq"], written[3]["seq"]]


async def test_list_events_filters_by_event_types_before_limit(store):
    batch = [ev(event_type="subagent.step", category="subagent") for _ in range(10)]
    batch += [ev(event_type="llm.tool.result") for _ in range(3)]
    await store.put_batch(batch)
    tools = await store.list_events(T, "r1", event_types=["llm.tool.result"], limit=2)
    assert [r["event_type"] for r in tools] == ["llm.tool.result"] * 2
    one = await store.list_events(T, "r1", event_types="llm.tool.result", limit=5)
    assert len(one) == 3
    both = await store.list_events(
        T, "r1", event_types=("llm.tool.result", "subagent.step"), limit=100
    )
    assert len(both) == 13
    assert await store.list_events(T, "r1", event_types=[]) == []


async def test_list_events_filters_by_task_id_before_limit_and_pages_after_seq(store):
    batch = []
    for i in range(6):
        for task in ("task-a", "task-b"):
            batch.append(
                ev(
                    event_type="subagent.step",
                    category="subagent",
                    content={"i": i},
                    metadata={"task_id": task, "message_index": i},
                )
            )
    batch.append(ev(metadata={"task_id": 7}))
    await store.put_batch(batch)
    first = await store.list_events(T, "r1", task_id="task-b", limit=4)
    assert [r["content"]["i"] for r in first] == [0, 1, 2, 3]
    rest = await store.list_events(T, "r1", task_id="task-b", limit=4, after_seq=first[-1]["seq"])
    assert [r["content"]["i"] for r in rest] == [4, 5]
    assert all(r["metadata"]["task_id"] == "task-b" for r in first + rest)
    combined = await store.list_events(
        T, "r1", task_id="task-a", event_types=["subagent.step"], limit=100
    )
    assert len(combined) == 6
    assert await store.list_events(T, "r1", task_id="7") == []


async def test_list_events_limit_and_after_seq(store):
    written = await store.put_batch([ev(content=str(i)) for i in range(10)])
    assert seqs(await store.list_events(T, "r1", limit=3)) == seqs(written[:3])
    assert seqs(await store.list_events(T, "r1", limit=3, after_seq=written[6]["seq"])) == seqs(
        written[7:10]
    )
    assert await store.list_events(T, "r1", limit=0) == []


async def test_list_events_of_every_run_pages_through_the_whole_thread(store):
    batch = [
        ev(run_id=f"r{i % 3}", event_type="run.start", category="trace", content={"i": i})
        if i % 4 == 0
        else ev(run_id=f"r{i % 3}", content=str(i), metadata={"task_id": f"t{i % 2}"})
        for i in range(12)
    ]
    written = await store.put_batch(batch)
    await store.put_batch([ev(thread_id="other-thread", run_id="r1")])
    everything = await store.list_events(T, None, limit=100)
    assert everything == written
    walked, after = [], None
    while page := await store.list_events(T, None, limit=5, after_seq=after):
        walked += page
        after = page[-1]["seq"]
    assert walked == written
    starts = await store.list_events(T, None, event_types="run.start")
    assert starts == [e for e in written if e["event_type"] == "run.start"]
    tasks = await store.list_events(T, None, task_id="t1", limit=2)
    assert tasks == [e for e in written if e["metadata"].get("task_id") == "t1"][:2]
    with user_scope("alice"):
        mine = await store.put_batch([ev(run_id="r9"), ev(run_id="r1")])
        assert await store.list_events(T, None) == mine
    assert await store.list_events(T, None) == [*written, *mine]
    assert await store.list_events("no-such-thread", None) == []


# -- last visible AI message ----------------------------------------------------------------


async def test_last_visible_ai_seq_skips_middleware_callers_and_counts_legacy_alias(store):
    written = await store.put_batch(
        [
            ev(run_id="r1", metadata={"caller": "lead_agent"}),
            ev(run_id="r1", metadata={"caller": "middleware:summarize"}),
            ev(run_id="r2", event_type="ai_message"),
            ev(run_id="r2", event_type="llm.tool.result"),
            ev(run_id="r3", metadata={"caller": "middleware:title"}),
            ev(run_id="r4", event_type="llm.ai.response", category="trace"),
            ev(run_id="r5", metadata={"caller": "subagent:research"}),
        ]
    )
    found = await store.get_last_visible_ai_seq_by_run(T, ["r1", "r2", "r3", "r4", "r5", "r6"])
    assert found == {"r1": written[0]["seq"], "r2": written[2]["seq"], "r5": written[6]["seq"]}
    assert await store.get_last_visible_ai_seq_by_run(T, []) == {}


async def test_mutating_a_returned_records_caller_does_not_change_last_visible_ai(store):
    written = await store.put(**ev(metadata={"caller": "lead_agent"}))
    (batched,) = await store.put_batch([ev(run_id="r2", metadata={"caller": "lead_agent"})])
    absent, _ = await store.put_if_absent(**ev(run_id="r3", metadata={"caller": "lead_agent"}))
    for record in (written, batched, absent):
        record["metadata"]["caller"] = "middleware:x"
    found = await store.get_last_visible_ai_seq_by_run(T, ["r1", "r2", "r3"])
    assert found == {"r1": written["seq"], "r2": batched["seq"], "r3": absent["seq"]}


# -- put_if_absent --------------------------------------------------------------------------


async def test_put_if_absent_writes_once_per_run_and_type(store):
    first, created = await store.put_if_absent(
        **ev(event_type="context:memory", category="context", content={"content_sha256": "a"})
    )
    again, created_again = await store.put_if_absent(
        **ev(event_type="context:memory", category="context", content={"content_sha256": "b"})
    )
    other_run, created_other = await store.put_if_absent(
        **ev(run_id="r2", event_type="context:memory", category="context", content={})
    )
    assert (created, created_again, created_other) == (True, False, True)
    assert again == first
    assert again["content"] == {"content_sha256": "a"}
    assert other_run["run_id"] == "r2"


async def test_put_if_absent_under_concurrent_writers_creates_exactly_one(store):
    async def writer(i: int):
        await store.put(**ev(content=f"noise {i}"))
        return await store.put_if_absent(
            **ev(event_type="run.start", category="trace", content={"chain": str(i)})
        )

    results = await asyncio.gather(*(writer(i) for i in range(25)))
    assert sum(created for _, created in results) == 1
    assert len({record["seq"] for record, _ in results}) == 1
    starts = await store.list_events(T, "r1", event_types=["run.start"])
    assert len(starts) == 1


async def test_put_if_absent_only_counts_events_of_the_same_user(store):
    start = ev(event_type="run.start", category="trace", content={})
    with user_scope("alice"):
        alice, alice_created = await store.put_if_absent(**start)
    with user_scope("bob"):
        bob, bob_created = await store.put_if_absent(**start)
        assert await store.list_events(T, "r1") == [bob]
    nobody, nobody_created = await store.put_if_absent(**start)
    with user_scope("alice"):
        assert await store.list_events(T, "r1") == [alice]
        again, created_again = await store.put_if_absent(**start)
    assert (alice_created, bob_created, nobody_created) == (True, True, True)
    assert [r["user_id"] for r in (alice, bob, nobody)] == ["alice", "bob", None]
    assert (again, created_again) == (alice, False)
    assert await store.put_if_absent(**start) == (nobody, False)
    assert await store.put_if_absent(**start, user_id="bob") == (bob, False)


# -- counts and deletes ---------------------------------------------------------------------


async def test_count_and_delete_by_run_and_thread(store):
    await store.put_batch(
        [
            ev(run_id="r1"),
            ev(run_id="r1"),
            ev(run_id="r2"),
            ev(run_id="r2", event_type="run.start", category="trace", content={}),
            ev(thread_id="elsewhere"),
        ]
    )
    assert await store.count_messages(T) == 3
    assert await store.delete_by_run(T, "r2") == 2
    assert await store.count_messages(T) == 2
    assert await store.list_events(T, "r2") == []
    assert await store.delete_by_run(T, "unknown") == 0
    assert await store.delete_by_thread(T) == 2
    assert await store.count_messages(T) == 0
    assert await store.delete_by_thread("unknown") == 0
    assert await store.count_messages("elsewhere") == 1


# -- user scoping ---------------------------------------------------------------------------


async def test_writes_are_stamped_with_the_scoped_or_explicit_user(store):
    with user_scope("alice"):
        scoped = await store.put(**ev())
        explicit = await store.put(**ev(), user_id="bob")
        batch = await store.put_batch([ev(), ev(user_id="carol"), ev(user_id=None)])
    plain = await store.put(**ev())
    assert [r["user_id"] for r in (scoped, explicit, *batch, plain)] == [
        "alice",
        "bob",
        "alice",
        "carol",
        None,
        None,
    ]


async def test_scoped_reads_return_only_that_users_rows(store):
    with user_scope("alice"):
        await store.put_batch([ev(run_id="r1", content="a1"), ev(run_id="r1", content="a2")])
    with user_scope("bob"):
        await store.put(**ev(run_id="r1", content="b1"))
    await store.put(**ev(run_id="r1", content="nobody"))

    with user_scope("alice"):
        assert [r["content"] for r in await store.list_messages(T)] == ["a1", "a2"]
        assert [r["content"] for r in await store.list_messages_by_run(T, "r1")] == ["a1", "a2"]
        assert [r["content"] for r in await store.list_events(T, "r1")] == ["a1", "a2"]
        assert await store.count_messages(T) == 2
        everything = await store.list_messages(T, user_id=None)
    assert [r["content"] for r in everything] == ["a1", "a2", "b1", "nobody"]
    assert await store.count_messages(T) == 4
    assert await store.count_messages(T, user_id="bob") == 1
    assert [r["content"] for r in await store.list_messages(T, user_id="bob")] == ["b1"]
    assert await store.list_messages(T, user_id="mallory") == []


async def test_scoped_paging_and_last_ai_ignore_other_users(store):
    for i in range(10):
        with user_scope("alice" if i % 2 else "bob"):
            await store.put(**ev(content=str(i)))
    with user_scope("alice"):
        page = await store.list_messages(T, limit=2)
        before = await store.list_messages(T, limit=2, before_seq=page[0]["seq"])
        last = await store.get_last_visible_ai_seq_by_run(T, ["r1"])
    assert [r["content"] for r in page] == ["7", "9"]
    assert [r["content"] for r in before] == ["3", "5"]
    assert last == {"r1": page[-1]["seq"]}
    assert await store.get_last_visible_ai_seq_by_run(T, ["r1"], user_id="nobody") == {}


async def test_scoped_delete_only_removes_that_users_rows(store):
    with user_scope("alice"):
        await store.put(**ev())
    await store.put(**ev(), user_id="bob")
    with user_scope("alice"):
        assert await store.delete_by_thread(T) == 1
    assert [r["user_id"] for r in await store.list_messages(T)] == ["bob"]


async def test_scoped_delete_by_run_only_removes_that_users_rows(store):
    with user_scope("alice"):
        await store.put_batch([ev(run_id="r1", content="a1"), ev(run_id="r2", content="a2")])
    with user_scope("bob"):
        await store.put_batch([ev(run_id="r1", content="b1"), ev(run_id="r2", content="b2")])
    await store.put(**ev(run_id="r1", content="nobody"))
    with user_scope("alice"):
        assert await store.delete_by_run(T, "r1") == 1
        assert await store.delete_by_run(T, "r1") == 0
        assert [r["content"] for r in await store.list_messages(T)] == ["a2"]
    assert [r["content"] for r in await store.list_events(T, "r1")] == ["b1", "nobody"]
    assert [r["content"] for r in await store.list_messages(T)] == ["a2", "b1", "b2", "nobody"]
    assert await store.count_messages(T, user_id="alice") == 1


async def test_scoped_delete_keeps_other_users_run_summaries(store):
    for user, run_id in [("alice", "r1"), ("bob", "r2"), ("alice", "r3")]:
        with user_scope(user):
            await store.put(**ev(run_id=run_id))
            await store.put_run_summary(RunSummary(thread_id=T, run_id=run_id))
    with user_scope("alice"):
        assert await store.delete_by_run(T, "r2") == 0
        assert await store.delete_by_run(T, "r1") == 1
        assert [s.run_id for s in await store.list_run_summaries(T)] == ["r3"]
    assert [s.run_id for s in await store.list_run_summaries(T)] == ["r2", "r3"]
    with user_scope("bob"):
        assert await store.delete_by_thread(T) == 1
    assert [s.run_id for s in await store.list_run_summaries(T)] == ["r3"]
    with user_scope("alice"):
        assert await store.delete_by_thread(T) == 1
    assert await store.list_run_summaries(T) == []


async def test_bad_user_ids_are_rejected(store):
    with pytest.raises(TypeError, match="user_id"):
        await store.list_messages(T, user_id=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="user_id"):
        await store.put(**ev(), user_id="")
    with pytest.raises(ValueError, match="user_id"), user_scope("a\x00b"):
        pass


# -- hostile and unusual ids ----------------------------------------------------------------

HOSTILE_IDS = [
    "../x",
    "..",
    ".",
    "/etc/passwd",
    "a/b\\c",
    'it\'s "quoted"',
    "x'; DROP TABLE run_events; --",
    "%2e%2e",
    "ünï©ødé-🧵",
    "CON",
    "Thread",
    "thread",
    "i" * 128,
]


@pytest.mark.parametrize("hostile", HOSTILE_IDS)
async def test_hostile_ids_are_stored_and_read_back_safely(store, hostile):
    await store.put(**ev(thread_id=hostile, run_id=hostile, content="x"), user_id=hostile)
    await store.put(**ev(thread_id="neighbour", run_id="r1", content="y"))
    assert [r["thread_id"] for r in await store.list_messages(hostile)] == [hostile]
    (event,) = await store.list_events(hostile, hostile)
    assert (event["run_id"], event["user_id"], event["content"]) == (hostile, hostile, "x")
    assert await store.count_messages(hostile, user_id=hostile) == 1
    assert await store.count_messages("neighbour") == 1
    assert await store.delete_by_thread(hostile) == 1
    assert await store.count_messages("neighbour") == 1


async def test_ids_differing_only_in_case_are_distinct(store):
    await store.put(**ev(thread_id="Thread", content="upper"))
    await store.put(**ev(thread_id="thread", content="lower"))
    assert [r["content"] for r in await store.list_messages("Thread")] == ["upper"]
    assert [r["content"] for r in await store.list_messages("thread")] == ["lower"]


# -- run summaries --------------------------------------------------------------------------


async def test_run_summaries_upsert_read_and_list_in_first_written_order(store):
    started = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)
    await store.put_run_summary(RunSummary(thread_id=T, run_id="r2", started_at=started))
    await store.put_run_summary(RunSummary(thread_id=T, run_id="r1"))
    final = RunSummary(
        thread_id=T,
        run_id="r2",
        status="success",
        started_at=started,
        ended_at=started + timedelta(seconds=2),
        duration_ms=2000,
        total_tokens=30,
        token_usage_by_model={"fake": {"input_tokens": 10, "output_tokens": 20}},
    )
    await store.put_run_summary(final)
    assert await store.get_run_summary(T, "r2") == final
    assert await store.get_run_summary(T, "missing") is None
    assert [s.run_id for s in await store.list_run_summaries(T)] == ["r2", "r1"]
    assert await store.list_run_summaries("other") == []


async def test_run_summaries_are_deleted_with_their_run_and_thread(store):
    await store.put(**ev(run_id="r1"))
    await store.put_run_summary(RunSummary(thread_id=T, run_id="r1", status="error"))
    await store.put_run_summary(RunSummary(thread_id=T, run_id="r2"))
    await store.delete_by_run(T, "r1")
    assert await store.get_run_summary(T, "r1") is None
    await store.delete_by_thread(T)
    assert await store.list_run_summaries(T) == []


async def test_run_summaries_of_a_thread_without_events_are_deleted_too(store):
    await store.put_run_summary(RunSummary(thread_id=T, run_id="r1"))
    await store.put_run_summary(RunSummary(thread_id=T, run_id="r2"))
    assert await store.delete_by_run(T, "r1") == 0
    assert [s.run_id for s in await store.list_run_summaries(T)] == ["r2"]
    assert await store.delete_by_thread(T) == 0
    assert await store.list_run_summaries(T) == []


async def test_run_summaries_are_user_scoped(store):
    with user_scope("alice"):
        stamped = await store.put_run_summary(RunSummary(thread_id=T, run_id="r1"))
    await store.put_run_summary(RunSummary(thread_id=T, run_id="r2", user_id="bob"))
    assert stamped.user_id == "alice"
    with user_scope("alice"):
        assert [s.run_id for s in await store.list_run_summaries(T)] == ["r1"]
        assert await store.get_run_summary(T, "r2") is None
    assert [s.run_id for s in await store.list_run_summaries(T)] == ["r1", "r2"]


async def test_put_run_summary_refuses_to_overwrite_another_users_summary(store):
    with user_scope("alice"):
        alices = await store.put_run_summary(RunSummary(thread_id=T, run_id="r1"))
    with user_scope("mallory"), pytest.raises(PermissionError, match="'r1'"):
        await store.put_run_summary(RunSummary(thread_id=T, run_id="r1", status="cancelled"))
    with pytest.raises(PermissionError, match="'r1'"):
        await store.put_run_summary(RunSummary(thread_id=T, run_id="r1", status="error"))
    assert await store.list_run_summaries(T) == [alices]
    with user_scope("alice"):
        assert await store.get_run_summary(T, "r1") == alices
        final = await store.put_run_summary(RunSummary(thread_id=T, run_id="r1", status="success"))
        assert await store.get_run_summary(T, "r1") == final
    unowned = await store.put_run_summary(RunSummary(thread_id=T, run_id="r2"))
    with pytest.raises(PermissionError, match="'r2'"):
        await store.put_run_summary(RunSummary(thread_id=T, run_id="r2", user_id="alice"))
    assert await store.list_run_summaries(T) == [final, unowned]


async def test_put_run_summary_rejects_other_types(store):
    with pytest.raises(TypeError, match="RunSummary"):
        await store.put_run_summary({"thread_id": T, "run_id": "r1"})  # type: ignore[arg-type]


# -- contract -------------------------------------------------------------------------------

EXAMPLE_PAYLOADS: dict[str, tuple[Any, dict[str, Any]]] = {
    "run.start": ({"chain": "agent"}, {"caller": "lead_agent"}),
    "run.end": ({"messages": []}, {"status": "success"}),
    "run.error": ("boom", {"error_type": "ValueError"}),
    "run.interrupt": (
        {"checkpoint_id": "c1", "checkpoint_ns": [], "interrupts": [{"id": "i1", "value": "?"}]},
        {"status": "interrupted"},
    ),
    "run.resume": ({"checkpoint_id": "c1", "checkpoint_ns": ["n"]}, {}),
    "llm.human.input": ({"type": "human", "content": "hi"}, {"caller": "lead_agent"}),
    "llm.ai.response": (
        {"type": "ai", "content": "hello", "tool_calls": []},
        {"caller": "lead_agent", "usage": {}, "latency_ms": 3, "llm_call_index": 1},
    ),
    "llm.tool.result": ({"type": "tool", "content": "42", "tool_call_id": "call-1"}, {}),
    "llm.error": ("rate limited", {}),
    "tool.error": (
        {"tool_call_id": "call-1", "name": "search", "error_type": "KeyError", "error": "x"},
        {"caller": "lead_agent", "tool_call_id": "call-1", "latency_ms": 5},
    ),
    "tool.unresolved": (
        {"tool_call_id": "call-2", "name": "search", "reason": "run_failed"},
        {"tool_call_id": "call-2"},
    ),
    "context:memory": ({"content_sha256": "0" * 64}, {}),
    "subagent.start": ({"task_id": "t1", "description": "research"}, {"task_id": "t1"}),
    "subagent.step": (
        {
            "task_id": "t1",
            "message_index": 0,
            "kind": "ai",
            "text": "thinking",
            "truncated": False,
            "tool_calls": [{"name": "search", "args": {"q": "x"}}],
        },
        {"task_id": "t1", "message_index": 0},
    ),
    "subagent.end": ({"task_id": "t1", "status": "completed", "result": "ok"}, {"task_id": "t1"}),
    "workspace_changes": (
        "0 files changed +0 -0",
        {
            "workspace_changes": {
                "version": 1,
                "summary": {
                    "created": 0,
                    "modified": 0,
                    "deleted": 0,
                    "symlink_created": 0,
                    "additions": 0,
                    "deletions": 0,
                    "truncated": False,
                },
                "files": [],
                "limits": {
                    "max_files": 200,
                    "max_scanned_files": 2000,
                    "max_file_bytes_for_diff": 262144,
                    "max_total_diff_bytes": 1048576,
                },
            }
        },
    ),
}


async def test_every_catalog_event_reads_back_valid_against_the_contract(store):
    assert set(EXAMPLE_PAYLOADS) == {d.event_type for d in FIXED_RUN_EVENT_DEFINITIONS}
    batch = [
        ev(event_type=d.event_type, category=d.category, content=c, metadata=m)
        for d in FIXED_RUN_EVENT_DEFINITIONS
        for c, m in [EXAMPLE_PAYLOADS[d.event_type]]
    ]
    batch.append(
        ev(
            event_type=MIDDLEWARE_EVENT_PATTERN.event_type("guardrail"),
            category="middleware",
            content={"name": "g", "hook": "before_model", "action": "block", "changes": {}},
        )
    )
    written = await store.put_batch(batch)
    read = await store.list_events(T, "r1", limit=100)
    assert read == written
    for record in read:
        validate_event(record)
    assert set(read[0]) == {
        "thread_id",
        "run_id",
        "seq",
        "event_type",
        "category",
        "content",
        "metadata",
        "created_at",
        "user_id",
    }


# -- lifecycle ------------------------------------------------------------------------------


async def test_methods_before_setup_set_the_store_up(backend: Backend):
    store = backend.make()
    try:
        await store.put(**ev())
        assert await store.count_messages(T) == 1
    finally:
        await store.close()


async def test_setup_is_idempotent_and_close_can_repeat(backend: Backend):
    store = backend.make()
    await store.setup()
    await store.setup()
    await store.put(**ev())
    await asyncio.gather(store.setup(), store.setup())
    assert await store.count_messages(T) == 1
    await store.close()
    await store.close()


async def test_a_store_closed_by_its_user_says_so_until_set_up_again(backend: Backend):
    # Reopening by itself would leave a connection (a pool, a thread) that nobody closes.
    store = backend.make()
    await store.put(**ev())
    await store.close()
    for use in (
        store.put(**ev()),
        store.put_batch([ev()]),
        store.list_messages(T),
        store.count_messages(T),
        store.get_run_summary(T, "r1"),
    ):
        with pytest.raises(
            RuntimeError, match=r"is closed: reopen it with `await store.setup\(\)`"
        ):
            await use
    async with store:
        assert await store.count_messages(T) == 1


async def test_a_reopened_store_sees_earlier_events_and_continues_seq(
    persistent_backend: Backend,
):
    async with persistent_backend.make() as first:
        written = await first.put_batch([ev(), ev()])
    async with persistent_backend.make() as second:
        assert seqs(await second.list_messages(T)) == seqs(written)
        later = await second.put(**ev())
    assert later["seq"] > written[-1]["seq"]


async def test_two_open_stores_on_one_location_share_one_sequence(persistent_backend: Backend):
    async with persistent_backend.make() as a, persistent_backend.make() as b:
        results = await asyncio.gather(
            *(store.put(**ev(content=str(i))) for i, store in enumerate([a, b] * 10))
        )
        assert len({r["seq"] for r in results}) == 20
        assert seqs(await a.list_messages(T, limit=100)) == sorted(seqs(results))


async def test_open_store_url_builds_this_backend(backend: Backend):
    async with open_store(backend.url()) as store:
        assert isinstance(store, RunEventStore)
        await store.put(**ev())
        assert await store.count_messages(T) == 1


async def test_lone_surrogates_read_back_as_replacement_characters(store):
    await store.put(**ev(content="bad \ud83d half", metadata={"m": "\udc00"}))
    (read,) = await store.list_messages(T)
    assert (read["content"], read["metadata"]) == ("bad \ufffd half", {"m": "\ufffd"})
    with pytest.raises(ValueError, match="Unicode"):
        await store.put(**ev(run_id="r\ud800"))


# -- input the backends could not all store is refused or made storable, the same everywhere -


@pytest.mark.parametrize(
    ("field", "value"),
    [("event_type", "run\x00start"), ("category", "tra\nce"), ("event_type", "run\ud800")],
)
async def test_names_with_control_characters_or_surrogates_are_rejected(store, field, value):
    with pytest.raises(ValueError, match=r"control characters|Unicode"):
        await store.put(**{**ev(), field: value})
    assert await store.count_messages(T) == 0


@pytest.mark.parametrize("bad", ["t\x00", "t\ud800", ""])
async def test_read_ids_are_validated_like_write_ids(store, bad):
    with pytest.raises(ValueError):
        await store.list_messages(bad)
    with pytest.raises(ValueError):
        await store.list_events(T, bad)
    with pytest.raises(ValueError):
        await store.list_events(T, "r1", task_id=bad)
    with pytest.raises(ValueError):
        await store.list_events(T, "r1", event_types=[bad])


async def test_huge_limits_and_seq_bounds_are_accepted(store):
    await store.put_batch([ev(), ev()])
    assert len(await store.list_messages(T, limit=2**70)) == 2
    assert len(await store.list_messages(T, before_seq=2**70, limit=10)) == 2
    assert await store.list_events(T, "r1", after_seq=2**70) == []


async def test_metadata_may_be_any_mapping(store):
    from types import MappingProxyType

    await store.put(**ev(metadata=MappingProxyType({"caller": "lead_agent"})))
    (read,) = await store.list_messages(T)
    assert read["metadata"] == {"caller": "lead_agent"}


async def test_trace_content_with_lone_surrogates_is_cleaned_before_it_is_measured(store):
    await store.put(**ev(event_type="llm.error", category="trace", content="bad \ud83d half"))
    (read,) = await store.list_events(T, "r1")
    assert read["content"] == "bad \ufffd half"


async def test_content_too_deep_for_json_is_a_value_error_naming_the_field(store):
    deep: list = []
    for _ in range(400):
        deep = [deep]
    with pytest.raises(ValueError, match="event 1: content"):
        await store.put_batch([ev(), ev(content=deep)])
    circular: dict = {}
    circular["self"] = circular
    with pytest.raises(ValueError, match="metadata"):
        await store.put(**ev(metadata=circular))
    assert await store.count_messages(T) == 0


async def test_created_at_outside_the_utc_calendar_is_a_value_error(store):
    with pytest.raises(ValueError, match="created_at"):
        await store.put(**ev(created_at="0001-01-01T00:00:00+05:00"))


async def test_run_summary_text_is_normalised_like_event_payloads(store):
    written = await store.put_run_summary(
        RunSummary(thread_id=T, run_id="r1", last_ai_message="a\x00b\ud800")
    )
    assert written.last_ai_message == "a\ufffdb\ufffd"
    assert (await store.get_run_summary(T, "r1")).last_ai_message == "a\ufffdb\ufffd"
    with pytest.raises(ValueError, match="thread_id"):
        await store.put_run_summary(RunSummary(thread_id="t\x00", run_id="r1"))


async def test_a_cancelled_write_finishes_before_the_cancellation_is_seen(store):
    batch = [ev(content=str(i)) for i in range(500)]
    task = asyncio.ensure_future(store.put_batch(batch))
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    stored = await store.list_messages(T, limit=1000)
    assert [r["content"] for r in stored] == [str(i) for i in range(500)]


async def test_a_closed_store_opens_again_in_another_event_loop(store):
    # One event loop per CLI call or per test is common: nothing may stay bound to the first.
    await store.close()

    async def use(run_id: str) -> None:
        await store.setup()
        await asyncio.gather(
            store.put_batch([ev(run_id=run_id), ev(run_id=run_id)]),
            store.put(**ev(run_id=run_id)),
            store.delete_by_run(T, "nothing"),
            store.put_run_summary(RunSummary(thread_id=T, run_id=run_id)),
        )
        await store.close()

    await asyncio.to_thread(asyncio.run, use("r1"))
    await asyncio.to_thread(asyncio.run, use("r2"))
    await store.setup()
    assert seqs(await store.list_messages(T)) == list(range(1, 7))
    assert [s.run_id for s in await store.list_run_summaries(T)] == ["r1", "r2"]
