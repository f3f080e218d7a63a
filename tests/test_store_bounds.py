"""What no backend can hold is refused, or stored in one form, the same on every backend.

The limits live in the one normalisation every store runs before it writes, so the tests here
run unchanged against every backend in ``BACKENDS``; one more checks on PostgreSQL, which sets
the JSON size limit, the densest JSON at that limit.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import pytest

from deerflow_journal import EventRefused, RunSummary, user_scope
from deerflow_journal.records import ID_MAX_LENGTH, JSON_MAX_LENGTH
from tests.backends import PostgresBackend
from tests.test_store_suite import T, ev

C1_CONTROLS = ["\x80", "\x85", "\x9b", "\x9f"]


async def assert_nothing_written(store) -> None:
    assert await store.count_messages(T) == 0
    assert await store.list_events(T, "r1") == []


# -- ids ------------------------------------------------------------------------------------


async def test_ids_and_names_with_c1_controls_are_refused_on_put(store):
    for char in C1_CONTROLS:
        for field in ("thread_id", "run_id", "user_id", "event_type", "category"):
            bad = {**ev(), field: f"x{char}"}
            with pytest.raises(EventRefused, match=r"event 1: .*control characters"):
                await store.put_batch([ev(), bad])
            with pytest.raises(EventRefused, match="control characters"):
                await store.put(**bad)
    await assert_nothing_written(store)


async def test_reads_and_deletes_refuse_ids_with_c1_controls(store):
    await store.put(**ev())
    for char in C1_CONTROLS:
        bad = f"x{char}"
        reads = [
            store.list_messages(bad),
            store.list_messages_by_run(T, bad),
            store.list_events(bad, "r1"),
            store.list_events(T, bad),
            store.list_events(T, "r1", task_id=bad),
            store.list_events(T, "r1", event_types=[bad]),
            store.list_messages(T, user_id=bad),
            store.get_last_visible_ai_seq_by_run(T, [bad]),
            store.count_messages(bad),
            store.get_run_summary(T, bad),
            store.list_run_summaries(bad),
            store.delete_by_run(T, bad),
            store.delete_by_thread(bad),
        ]
        for read in reads:
            with pytest.raises(ValueError, match="control characters"):
                await read
        with pytest.raises(ValueError, match="control characters"):
            await store.put_run_summary(RunSummary(thread_id=T, run_id=bad))
        with pytest.raises(ValueError, match="control characters"), user_scope(bad):
            pass
    assert await store.count_messages(T) == 1


# -- what normalisation refuses -------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({**ev(), "thread_id": ""}, "thread_id"),
        ({**ev(), "run_id": "r" * 129}, "run_id"),
        ({**ev(), "created_at": "yesterday"}, "created_at"),
        ({**ev(), "seq": 3}, "seq is assigned by the store"),
        ({k: v for k, v in ev().items() if k != "category"}, "category is required"),
        (ev(content={1: "a", "1": "b"}), "content"),
    ],
)
async def test_bad_event_data_is_refused_as_event_refused(store, bad, match):
    with pytest.raises(EventRefused, match=f"event 1: .*{match}"):
        await store.put_batch([ev(), bad])
    await assert_nothing_written(store)


def long_id(length: int) -> str:
    """A string of ``length`` hex digits that does not compress (as an index entry might)."""
    digits = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(length // 64 + 1))
    return digits[:length]


async def test_a_metadata_task_id_longer_than_an_id_is_refused_and_nothing_is_written(store):
    # PostgreSQL indexes task_id: an entry this long cannot be indexed there.
    with pytest.raises(EventRefused, match=rf"event 1: metadata\.task_id .*{ID_MAX_LENGTH}"):
        await store.put_batch([ev(), ev(metadata={"task_id": long_id(4000)})])
    with pytest.raises(EventRefused, match="task_id"):
        await store.put(**ev(metadata={"task_id": long_id(ID_MAX_LENGTH + 1)}))
    await assert_nothing_written(store)
    longest = "🧪" * ID_MAX_LENGTH  # four bytes a character in UTF-8
    written = await store.put(**ev(metadata={"task_id": longest}))
    assert await store.list_events(T, "r1", task_id=longest) == [written]


async def test_json_over_the_size_limit_is_refused_and_at_the_limit_stored(store):
    at_limit = "x" * (JSON_MAX_LENGTH - 2)  # its JSON text adds the two quotes
    over = at_limit + "x"
    with pytest.raises(EventRefused, match=f"event 1: content .*{JSON_MAX_LENGTH}"):
        await store.put_batch([ev(), ev(content=over)])
    with pytest.raises(EventRefused, match=f"metadata .*{JSON_MAX_LENGTH}"):
        await store.put(**ev(metadata={"k": "x" * (JSON_MAX_LENGTH - 7)}))  # {"k":"..."}
    await assert_nothing_written(store)
    written = await store.put(**ev(content=at_limit))
    assert await store.list_messages(T) == [written]
    assert written["content"] == at_limit
    # Trace content is cut to max_trace_content first, and so is stored.
    cut = await store.put(**ev(event_type="llm.error", category="trace", content=over))
    assert cut["metadata"]["content_truncated"] is True


@pytest.mark.postgres
async def test_postgres_holds_the_densest_json_at_the_size_limit(tmp_path, request):
    # An array of digits is the JSON that takes the most jsonb space per character.
    digits = [1] * ((JSON_MAX_LENGTH - 1) // 2)  # "[1,1,...,1]"
    backend = PostgresBackend(tmp_path, request)
    try:
        async with backend.make() as store:
            with pytest.raises(EventRefused, match="content"):
                await store.put(**ev(content=[*digits, 1]))
            await store.put(**ev(content=digits))
            (read,) = await store.list_messages(T)
    finally:
        await backend.cleanup()
    assert read["content"] == digits


# -- one value, one stored form -------------------------------------------------------------

WHEN = datetime(2024, 5, 6, 7, 8, 9, 123456)


async def test_a_value_is_stored_alike_whatever_sits_beside_it(store):
    await store.put_batch(
        [
            ev(content=[2**63, 2**64 - 1], metadata={WHEN: "key"}),
            ev(content=[2**63, 2**64 - 1, 2**70], metadata={WHEN: "key", "odd": "\ud800"}),
        ]
    )
    alone, beside = await store.list_messages(T)
    assert alone["content"] == [2**63, 2**64 - 1]
    assert beside["content"] == [2**63, 2**64 - 1, str(2**70)]
    assert alone["metadata"] == {str(WHEN): "key"}
    assert beside["metadata"] == {str(WHEN): "key", "odd": "\ufffd"}


async def test_dict_keys_that_would_collide_are_refused_not_lost(store):
    collisions = [
        {1: "a", "1": "b"},
        {True: "a", "true": "b"},
        {None: "a", "null": "b"},
        {chr(0xD800): "a", chr(0xDC00): "b"},  # both become U+FFFD
        {"a\x00": "a", "a\ufffd": "b"},
    ]
    for keys in collisions:
        with pytest.raises(EventRefused, match=r"content cannot be stored.*both be stored as"):
            await store.put(**ev(content={"nested": keys}))
        with pytest.raises(EventRefused, match="metadata cannot be stored"):
            await store.put(**ev(metadata=keys))
    await assert_nothing_written(store)
    nan, inf = float("nan"), float("inf")
    written = await store.put(**ev(content={nan: 1, None: 2, inf: 3, -inf: 4, -0.0: 5}))
    expected = {"nan": 1, "null": 2, "inf": 3, "-inf": 4, "-0.0": 5}
    assert written["content"] == (await store.list_messages(T))[0]["content"] == expected
