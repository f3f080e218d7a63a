"""The journal's store write (``_put_journal_batch``) on every backend: events and run
summaries in one write, all or nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import orjson
import pytest

from deerflow_journal import RunSummary
from deerflow_journal.journal.mapping import MessageEncoder
from deerflow_journal.records import decode_json, encode_json
from deerflow_journal.stores.base import _summary_data
from tests.journal_events import nasty_events


def start_event(thread_id: str, run_id: str, user_id: str | None = None) -> dict[str, object]:
    return {
        "thread_id": thread_id,
        "run_id": run_id,
        "event_type": "run.start",
        "category": "trace",
        "content": {"chain": "agent"},
        "metadata": {},
        "user_id": user_id,
    }


async def test_a_journal_write_spans_threads_and_upserts_their_summaries(store):
    events = [start_event("t1", "r1"), start_event("t2", "r2"), start_event("t1", "r1")]
    summaries = [RunSummary(thread_id="t1", run_id="r1"), RunSummary(thread_id="t3", run_id="r3")]
    await store._put_journal_batch(events, [s.to_json_dict() for s in summaries])
    assert [e["seq"] for e in await store.list_events("t1", "r1")] == [1, 2]
    assert [e["seq"] for e in await store.list_events("t2", "r2")] == [1]
    assert await store.get_run_summary("t3", "r3") == summaries[1]
    ended = RunSummary(thread_id="t1", run_id="r1", status="success")
    await store._put_journal_batch([], [ended.to_json_dict()])
    assert await store.get_run_summary("t1", "r1") == ended


async def test_a_journal_write_with_a_refused_summary_writes_nothing(store):
    await store.put_run_summary(RunSummary(thread_id="t", run_id="r", user_id="alice"))
    bob = RunSummary(thread_id="t", run_id="r", user_id="bob", status="success")
    with pytest.raises(PermissionError):
        await store._put_journal_batch([start_event("t", "r", "bob")], [bob.to_json_dict()])
    assert await store.list_events("t", "r", user_id=None) == []
    summary = await store.get_run_summary("t", "r", user_id=None)
    assert summary is not None and summary.user_id == "alice"


async def test_a_large_journal_write_numbers_each_thread_on_from_its_last_seq(store):
    # More events than one SQL statement takes, and more threads than one IN list.
    threads = [f"t{i}" for i in range(70)]
    await store._put_journal_batch([start_event("t0", "r"), start_event("t1", "r")], [])
    events = [start_event(threads[i % len(threads)], "r") for i in range(3100)]
    for i, event in enumerate(events):
        event["content"] = {"i": i}
    await store._put_journal_batch(events, [])
    for thread_id in ("t0", "t1", "t69"):
        stored = await store.list_events(thread_id, "r", limit=100)
        expected = [i for i in range(3100) if threads[i % len(threads)] == thread_id]
        skip = 1 if thread_id in ("t0", "t1") else 0
        assert [e["content"]["i"] for e in stored[skip:]] == expected
        assert [e["seq"] for e in stored] == list(range(1, len(stored) + 1))


async def test_a_batch_id_the_store_took_writes_nothing_the_second_time(store):
    # The journal retries a batch whose answer was lost (a dropped connection after the
    # commit): under its id, the retry must not write it twice.
    first = RunSummary(thread_id="t", run_id="r", status="running")
    assert await store._put_journal_batch(
        [start_event("t", "r")], [first.to_json_dict()], batch_id="b1"
    )
    later = RunSummary(thread_id="t", run_id="r", status="success")
    assert not await store._put_journal_batch(
        [start_event("t", "r")], [later.to_json_dict()], batch_id="b1"
    )
    assert [e["seq"] for e in await store.list_events("t", "r")] == [1]
    assert await store.get_run_summary("t", "r") == first
    assert await store._put_journal_batch(
        [start_event("t", "r")], [later.to_json_dict()], batch_id="b2"
    )
    assert [e["seq"] for e in await store.list_events("t", "r")] == [1, 2]
    assert await store.get_run_summary("t", "r") == later


async def test_a_batch_retried_while_its_first_write_still_runs_is_written_once(store):
    # The journal's loop closing cancels a write while the store still works on it (in a
    # thread, or in the database): the retry that follows at once must not write it again.
    events = [start_event("t", "r") for _ in range(200)]
    taken = await asyncio.gather(
        *(store._put_journal_batch(events, [], batch_id="b1") for _ in range(4))
    )
    assert sorted(taken) == [False, False, False, True]
    assert len(await store.list_events("t", "r", limit=1000)) == 200


async def test_a_refused_batch_leaves_its_id_unused(store):
    await store.put_run_summary(RunSummary(thread_id="t", run_id="r", user_id="alice"))
    bob = RunSummary(thread_id="t", run_id="r", user_id="bob")
    with pytest.raises(PermissionError):
        await store._put_journal_batch(
            [start_event("t", "r", "bob")], [bob.to_json_dict()], batch_id="b1"
        )
    assert await store._put_journal_batch([start_event("t", "r", "bob")], [], batch_id="b1")
    assert len(await store.list_events("t", "r", user_id=None)) == 1


async def test_a_reopened_database_still_knows_the_batches_it_took(persistent_backend):
    async with persistent_backend.make() as first:
        assert await first._put_journal_batch([start_event("t", "r")], [], batch_id="b1")
    async with persistent_backend.make() as second:
        taken = not await second._put_journal_batch([start_event("t", "r")], [], batch_id="b1")
        events = await second.list_events("t", "r")
    # SQL databases record the ids with the batch; a JSONL store remembers them in memory,
    # where the journal that sent the batch retries it.
    assert taken == (persistent_backend.name in ("sqlite", "postgres"))
    assert len(events) == (1 if taken else 2)


async def test_a_store_remembers_only_the_latest_batch_ids(store, monkeypatch):
    import deerflow_journal.stores.base as base
    import deerflow_journal.stores.postgres as postgres
    import deerflow_journal.stores.sqlite as sqlite

    for module in (base, postgres, sqlite):
        monkeypatch.setattr(module, "BATCH_IDS_KEPT", 2)
        monkeypatch.setattr(module, "BATCH_IDS_PRUNED_EVERY", 1)
    for n in range(4):
        assert await store._put_journal_batch([start_event("t", "r")], [], batch_id=f"b{n}")
    assert not await store._put_journal_batch([start_event("t", "r")], [], batch_id="b3")
    assert not await store._put_journal_batch([start_event("t", "r")], [], batch_id="b2")
    assert await store._put_journal_batch([start_event("t", "r")], [], batch_id="b1")  # forgotten


async def test_sql_stores_forget_old_batch_ids_only_every_so_many_batches(store, monkeypatch):
    import deerflow_journal.stores.base as base
    import deerflow_journal.stores.postgres as postgres
    import deerflow_journal.stores.sqlite as sqlite

    for module in (base, postgres, sqlite):
        monkeypatch.setattr(module, "BATCH_IDS_KEPT", 2)
        monkeypatch.setattr(module, "BATCH_IDS_PRUNED_EVERY", 4)
    for n in range(5):
        assert await store._put_journal_batch([start_event("t", "r")], [], batch_id=f"b{n}")
    # Every store still knows the last two; the SQL ones forgot only at their 4th batch.
    assert not await store._put_journal_batch([start_event("t", "r")], [], batch_id="b4")
    assert not await store._put_journal_batch([start_event("t", "r")], [], batch_id="b3")
    sql = store.__class__.__name__.startswith(("Sqlite", "Postgres"))
    assert (not await store._put_journal_batch([], [], batch_id="b2")) == sql
    assert await store._put_journal_batch([], [], batch_id="b1")  # forgotten everywhere


async def test_a_journal_write_stores_what_put_batch_stores(store):
    # Each event alone (most take the journal's own path) and all in one batch (which the
    # events it cannot take send down put_batch's path).
    for event in nasty_events("alone", messages=False):
        await store._put_journal_batch([event], [], MessageEncoder())
    await store._put_journal_batch(nasty_events("batch", messages=False), [], MessageEncoder())
    await store.put_batch(nasty_events("public", messages=False))

    async def stored(thread_id: str) -> list[bytes]:
        found = await store.list_events(thread_id, "r", user_id=None)
        found += await store.list_events(thread_id, "r", task_id="task-1", user_id=None)
        seqs = await store.get_last_visible_ai_seq_by_run(thread_id, ["r"], user_id=None)
        return [orjson.dumps({**record, "thread_id": ""}) for record in found] + [
            orjson.dumps(seqs)
        ]

    public = await stored("public")
    assert len(public) == 14
    assert await stored("alone") == public
    assert await stored("batch") == public


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"first_human_message": "hi\x00", "last_ai_message": "\ud800"},
        {"total_tokens": 2**70, "token_usage_by_model": {"m": {"input_tokens": -(2**64)}}},
        {"estimated_cost_usd": float("inf"), "estimated_cost_by_model": {"m": 0.5}},
        {"estimated_cost_by_model": {"m": float("nan"), "n": None}},
        {"started_at": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "error": {"k": "v\x00"}},
    ],
)
def test_a_summary_is_stored_as_its_json_text_reads_back(fields):
    summary = RunSummary(thread_id="t", run_id="r", **fields)
    expected = decode_json(encode_json(summary.to_json_dict()))
    assert repr(_summary_data(summary)) == repr(expected)


def test_the_costs_are_the_only_floats_of_a_summary():
    # _summary_data checks those for NaN and infinities, which JSON does not keep.
    floats = {
        name for name, field in RunSummary.model_fields.items() if "float" in str(field.annotation)
    }
    assert floats == {"estimated_cost_usd", "estimated_cost_by_model"}
