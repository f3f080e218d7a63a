"""Identical read-back and exact message counts, run unchanged against every backend.

What ``put`` returns, every read returns, with keys in their written order and every number as
written (-0.0 included): records are compared as JSON text, since dict equality ignores order.
The expected text is the input's own, so every backend returns the same.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections import Counter
from typing import Any

from deerflow_journal import RunEventStore, RunSummary, user_scope

T = "thread-1"

FLOATS = [
    -0.0,
    0.0,
    1e308,
    -1e308,
    1.7976931348623157e308,
    5e-324,
    2.2250738585072014e-308,
    0.1 + 0.2,
    1e16,
    1e-7,
    1.5,
]
INTS = [2**63 - 1, -(2**63), 2**53 + 1, 0, -1]
# jsonb would sort these keys by length, then bytes.
AWKWARD_KEYS = {"zebra": 1, "a": 2, "": 3, "bb": 4, "B": 5, "10": 6, "9": 7, "é": 8, "🦜": 9}
CONTENT = {
    "zebra": {"y": -0.0, "x": [{"b": 1, "a": 2}, {"d": {"f": 1e308, "e": 5e-324}}]},
    "floats": FLOATS,
    "ints": INTS,
    "unicode": {"ключ": "naïve 中文 🧪 עברית", "ß": "line\u2028sep\ttab"},
    "awkward": AWKWARD_KEYS,
    "": None,
    "a": True,
}
METADATA = {
    "task_id": "task-1",
    "caller": "lead_agent",
    "z": -0.0,
    "nested": {"b": {"d": 1, "c": 2}, "a": [0.1 + 0.2, -(2**63)]},
}


def ev(run_id: str = "r1", content: Any = CONTENT, **extra: Any) -> dict[str, Any]:
    """A message event for ``put``/``put_batch`` with awkward content and metadata."""
    return {
        "thread_id": T,
        "run_id": run_id,
        "event_type": "llm.ai.response",
        "category": "message",
        "content": content,
        "metadata": METADATA,
        **extra,
    }


def text(value: Any) -> str:
    """JSON text that tells apart what ``==`` does not: key order, and -0.0 from 0."""
    return json.dumps(value, ensure_ascii=False)


async def test_put_and_every_read_return_the_written_text(store: RunEventStore):
    one = await store.put(**ev())
    batch = await store.put_batch([ev(content=-0.0), ev(run_id="r2", content=[AWKWARD_KEYS])])
    absent, created = await store.put_if_absent(**ev(event_type="context:memory"))
    assert created
    written = [one, *batch, absent]
    assert text(one["content"]) == text(CONTENT)
    assert text(batch[0]["content"]) == "-0.0"
    assert text(batch[1]["content"]) == text([AWKWARD_KEYS])
    assert {text(r["metadata"]) for r in written} == {text(METADATA)}

    in_r1 = [one, batch[0], absent]
    reads = {
        "list_messages": (await store.list_messages(T), written),
        "list_messages after_seq": (await store.list_messages(T, after_seq=0), written),
        "list_messages before_seq": (await store.list_messages(T, before_seq=99), written),
        "list_messages_by_run": (await store.list_messages_by_run(T, "r1"), in_r1),
        "list_events": (await store.list_events(T, "r1"), in_r1),
        "list_events task_id": (await store.list_events(T, "r1", task_id="task-1"), in_r1),
        "list_events event_types": (
            await store.list_events(T, "r2", event_types=["llm.ai.response"]),
            [batch[1]],
        ),
        "put_if_absent existing": (
            [(await store.put_if_absent(**ev(event_type="context:memory")))[0]],
            [absent],
        ),
    }
    for name, (read, expected) in reads.items():
        assert [text(r) for r in read] == [text(r) for r in expected], name


async def test_a_journal_write_reads_back_the_written_text(store: RunEventStore):
    await store._put_journal_batch([ev(), ev(content={"b": -0.0, "a": 1e308})], [])
    read = await store.list_events(T, "r1")
    assert [text(r["content"]) for r in read] == [text(CONTENT), '{"b": -0.0, "a": 1e+308}']
    assert [text(r["metadata"]) for r in read] == [text(METADATA)] * 2


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    """A JSON value the normalisation keeps as it is, nested up to three levels."""
    kind = rng.randrange(8 if depth < 3 else 6)
    if kind == 0:
        # Any finite double, from its bits: subnormals and extremes among them.
        while True:
            number = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
            if math.isfinite(number):
                return number
    if kind == 1:
        return rng.choice(FLOATS)
    if kind == 2:
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == 3:
        return _random_text(rng)
    if kind == 4:
        return rng.choice([True, False, None])
    if kind == 5:
        return rng.choice(INTS)
    if kind == 6:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {_random_text(rng): _random_value(rng, depth + 1) for _ in range(rng.randrange(6))}


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice('abzAZ09_ -éß中🦜"\\\n') for _ in range(rng.randrange(6)))


async def test_random_nested_values_read_back_as_written(store: RunEventStore):
    rng = random.Random(20240601)
    values = [_random_value(rng) for _ in range(150)]
    metadata = [{_random_text(rng): _random_value(rng) for _ in range(4)} for _ in values]
    written = await store.put_batch(
        [ev(content=c, metadata=m) for c, m in zip(values, metadata, strict=True)]
    )
    read = await store.list_events(T, "r1", limit=1000)
    assert [text(r["content"]) for r in written] == [text(v) for v in values]
    assert [text(r["metadata"]) for r in written] == [text(m) for m in metadata]
    assert [text(r) for r in read] == [text(r) for r in written]


async def test_run_summaries_read_back_with_their_key_order(store: RunEventStore):
    usage = {
        "zeta-model": {"output_tokens": 2, "input_tokens": 1, "total_tokens": 3},
        "alpha": {"total_tokens": 5, "input_tokens": 4, "output_tokens": 1},
    }
    written = await store.put_run_summary(
        RunSummary(thread_id=T, run_id="r1", token_usage_by_model=usage)
    )
    await store._put_journal_batch(
        [], [RunSummary(thread_id=T, run_id="r2", error={"z": "1", "a": "2"}).to_json_dict()]
    )
    got = await store.get_run_summary(T, "r1")
    listed = await store.list_run_summaries(T)
    assert text(got.token_usage_by_model) == text(usage) == text(written.token_usage_by_model)
    assert [text(s.token_usage_by_model) for s in listed] == [text(usage), "{}"]
    assert text(listed[1].error) == '{"z": "1", "a": "2"}'


# -- message counts -------------------------------------------------------------------------


async def _assert_counts_match_the_messages(store: RunEventStore) -> None:
    """``count_messages`` in every scope equals the message rows ``list_messages`` returns."""
    rows = await store.list_messages(T, limit=10_000, user_id=None)
    users = Counter(r["user_id"] for r in rows)
    assert await store.count_messages(T, user_id=None) == len(rows)
    for user in ("alice", "bob", "carol"):
        assert await store.count_messages(T, user_id=user) == users[user], user
        with user_scope(user):
            assert await store.count_messages(T) == users[user], user


def _mixed(run_id: str, user: str | None) -> list[dict[str, Any]]:
    """Two messages and a trace event of ``user`` in ``run_id``."""
    trace = {**ev(run_id, content={}), "event_type": "run.start", "category": "trace"}
    return [{**e, "user_id": user} for e in (ev(run_id), ev(run_id), trace)]


async def test_message_counts_stay_exact_through_writes_and_scoped_deletes(store: RunEventStore):
    await store.put_batch(
        [*_mixed("r1", "alice"), *_mixed("r1", "bob"), *_mixed("r2", None), *_mixed("r2", "bob")]
    )
    await store.put(**ev("other", thread_id="elsewhere"))
    await _assert_counts_match_the_messages(store)
    with user_scope("alice"):
        await store.put(**ev("r3"))
        assert (await store.put_if_absent(**ev("r3", event_type="context:memory")))[1]
        assert not (await store.put_if_absent(**ev("r3", event_type="context:memory")))[1]
        await store._put_journal_batch(_mixed("r3", "alice"), [])
    await _assert_counts_match_the_messages(store)
    assert await store.count_messages(T, user_id="alice") == 6

    with user_scope("alice"):
        assert await store.delete_by_run(T, "r1") == 3
    await _assert_counts_match_the_messages(store)
    with user_scope("bob"):
        assert await store.delete_by_thread(T) == 6
    await _assert_counts_match_the_messages(store)
    assert await store.delete_by_run(T, "r2") == 3
    await _assert_counts_match_the_messages(store)
    assert await store.count_messages(T, user_id=None) == 4

    await store.put_batch(_mixed("r4", "bob"))
    await _assert_counts_match_the_messages(store)
    assert await store.delete_by_thread(T) == 8
    await _assert_counts_match_the_messages(store)
    assert await store.count_messages(T) == 0
    await store.put_batch(_mixed("r5", "carol"))
    await _assert_counts_match_the_messages(store)
    assert await store.count_messages(T, user_id="carol") == 2
    assert await store.count_messages("elsewhere") == 1
