"""Browsing a store, the same on every backend: ``list_threads`` (threads by latest activity)
and ``list_run_summaries`` without a thread (runs of every thread, newest first), keyset-paged,
user-scoped, kept up to date by writes and deletes, and built from existing rows when a SQL
database of the previous schema version is upgraded."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from deerflow_journal import RunEventStore, RunSummary, ThreadInfo, user_scope
from deerflow_journal.stores.browsing import started_key
from tests.backends import Backend
from tests.test_store_migrations import SQL_BACKENDS, Raw, bound

BASE = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    """A stored timestamp ``seconds`` after ``BASE``."""
    return (BASE + timedelta(seconds=seconds)).isoformat(timespec="microseconds")


def ev(thread_id: str, run_id: str, when: float, **extra: Any) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "run_id": run_id,
        "event_type": "llm.ai.response",
        "category": "message",
        "content": "x",
        "created_at": at(when),
        **extra,
    }


def summary(thread_id: str, run_id: str, started: float | None, **fields: Any) -> RunSummary:
    started_at = None if started is None else BASE + timedelta(seconds=started)
    return RunSummary(thread_id=thread_id, run_id=run_id, started_at=started_at, **fields)


async def every_thread(store: RunEventStore, page: int, **scope: Any) -> list[ThreadInfo]:
    """Every thread, read ``page`` at a time."""
    found: list[ThreadInfo] = []
    while True:
        got = await store.list_threads(limit=page, before=found[-1] if found else None, **scope)
        assert len(got) <= page
        found += got
        if len(got) < page:
            return found


async def every_run(store: RunEventStore, page: int, **options: Any) -> list[tuple[str, str]]:
    """Every (thread, run) of ``list_run_summaries(**options)``, read ``page`` at a time."""
    found: list[RunSummary] = []
    while True:
        got = await store.list_run_summaries(
            limit=page, before=found[-1] if found else None, **options
        )
        assert len(got) <= page
        found += got
        if len(got) < page:
            return [(s.thread_id, s.run_id) for s in found]


def brief(threads: list[ThreadInfo]) -> list[tuple[str, int, str, int]]:
    return [(t.thread_id, t.last_seq, t.last_event_at, t.run_count) for t in threads]


# -- threads -------------------------------------------------------------------------------


async def test_threads_come_newest_activity_first_with_their_last_event_and_run_count(store):
    await store.put_batch([ev("a", "r1", 1), ev("a", "r1", 2), ev("a", "r2", 3)])
    await store.put_batch([ev("b", "r1", 5)])
    # The last event decides, even when an earlier one carries a later time.
    await store.put_batch([ev("c", "r1", 9), ev("c", "r2", 4)])
    assert brief(await store.list_threads()) == [
        ("b", 1, at(5), 1),
        ("c", 2, at(4), 2),
        ("a", 3, at(3), 2),
    ]
    assert brief(await store.list_threads(limit=2)) == [("b", 1, at(5), 1), ("c", 2, at(4), 2)]
    assert await store.list_threads(limit=0) == []


async def test_a_thread_written_again_moves_to_the_front_with_its_new_run(store):
    await store.put(**ev("a", "r1", 1))
    await store.put(**ev("b", "r1", 2))
    await store.put(**ev("a", "r2", 3))
    await store._put_journal_batch([ev("a", "r2", 4)], [], batch_id="x")
    await store.put_if_absent(**{**ev("b", "r3", 5), "event_type": "run.start"})
    assert brief(await store.list_threads()) == [("b", 2, at(5), 2), ("a", 3, at(4), 2)]


async def test_paging_lists_every_thread_once_when_times_are_equal(store):
    # 23 threads at one instant, interleaved with 7 at others.
    threads = [f"t{i:02d}" for i in range(30)]
    await store.put_batch([ev(t, "r", 0 if i % 4 else i) for i, t in enumerate(threads)])
    expected = sorted(
        await store.list_threads(limit=100), key=lambda t: (t.last_event_at, t.thread_id)
    )[::-1]
    assert [t.thread_id for t in expected] == sorted(
        threads, key=lambda t: (at(0 if int(t[1:]) % 4 else int(t[1:])), t), reverse=True
    )
    for page in (1, 4, 7, 30, 31):
        assert await every_thread(store, page) == expected


async def test_threads_are_user_scoped(store):
    await store.put_batch(
        [
            ev("shared", "r1", 1, user_id="alice"),
            ev("shared", "r1", 2, user_id="bob"),
            ev("shared", "r2", 3, user_id="bob"),
            ev("shared", "r3", 4),  # no user: only unscoped reads see it
            ev("alices", "r1", 5, user_id="alice"),
            ev("nobodys", "r1", 6),
        ]
    )
    assert brief(await store.list_threads(user_id="alice")) == [
        ("alices", 1, at(5), 1),
        ("shared", 1, at(1), 1),
    ]
    assert brief(await store.list_threads(user_id="bob")) == [("shared", 3, at(3), 2)]
    with user_scope("bob"):
        assert brief(await store.list_threads()) == [("shared", 3, at(3), 2)]
        assert brief(await store.list_threads(user_id=None)) == [
            ("nobodys", 1, at(6), 1),
            ("alices", 1, at(5), 1),
            ("shared", 4, at(4), 3),
        ]
    assert await store.list_threads(user_id="carol") == []
    alices = await store.list_threads(user_id="alice", limit=1)
    assert brief(await store.list_threads(user_id="alice", before=alices[0])) == [
        ("shared", 1, at(1), 1)
    ]


async def test_deletes_are_reflected_in_the_thread_list(store):
    await store.put_batch(
        [
            ev("a", "r1", 1, user_id="alice"),
            ev("a", "r2", 2, user_id="bob"),
            ev("a", "r2", 3, user_id="alice"),
            ev("a", "r3", 4, user_id="bob"),
            ev("b", "r1", 5),
        ]
    )
    assert brief(await store.list_threads()) == [("b", 1, at(5), 1), ("a", 4, at(4), 3)]
    # The run holding the last event goes: the event before it is the last.
    await store.delete_by_run("a", "r3")
    assert brief(await store.list_threads()) == [("b", 1, at(5), 1), ("a", 3, at(3), 2)]
    assert brief(await store.list_threads(user_id="bob")) == [("a", 2, at(2), 1)]
    # Alice's rows go: her last run and the run she shared with bob leave her count.
    await store.delete_by_thread("a", user_id="alice")
    assert await store.list_threads(user_id="alice") == []
    assert brief(await store.list_threads()) == [("b", 1, at(5), 1), ("a", 2, at(2), 1)]
    await store.delete_by_thread("a")
    assert brief(await store.list_threads()) == [("b", 1, at(5), 1)]
    assert await store.list_threads(user_id="bob") == []
    # A thread emptied and written again starts over (its seq goes on).
    await store.put(**ev("a", "r9", 0))
    assert brief(await store.list_threads()) == [("b", 1, at(5), 1), ("a", 5, at(0), 1)]


async def test_list_threads_checks_its_arguments(store):
    with pytest.raises(ValueError, match="limit"):
        await store.list_threads(limit=-1)
    with pytest.raises(TypeError, match="before must be the last ThreadInfo"):
        await store.list_threads(before="a")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limit"):
        await store.list_threads(limit="5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"before\.last_event_at is not an ISO-8601 timestamp"):
        await store.list_threads(before=ThreadInfo("a", 1, "garbage", 1))


async def test_a_cursor_time_written_another_way_pages_the_same(store):
    """A cursor whose time names the same instant in another form (``Z``, another offset) is
    the same cursor on every backend (some compare the stored text)."""
    await store.put_batch([ev(t, "r", i) for i, t in enumerate(["a", "b", "c"])])
    first, *rest = await store.list_threads()
    stored = datetime.fromisoformat(first.last_event_at)
    for written in (
        stored.isoformat().replace("+00:00", "Z"),
        stored.astimezone(timezone(timedelta(hours=1))).isoformat(),
    ):
        cursor = ThreadInfo(first.thread_id, first.last_seq, written, first.run_count)
        assert await store.list_threads(before=cursor) == rest


async def test_another_stores_writes_and_deletes_show_up_in_the_list(
    persistent_backend: Backend,
):
    async with persistent_backend.make() as reader, persistent_backend.make() as writer:
        await writer.put(**ev("a", "r1", 1))
        assert brief(await reader.list_threads()) == [("a", 1, at(1), 1)]
        await writer.put_batch([ev("b", "r1", 2), ev("a", "r2", 3)])
        assert brief(await reader.list_threads()) == [("a", 2, at(3), 2), ("b", 1, at(2), 1)]
        await writer.delete_by_run("a", "r2")
        assert brief(await reader.list_threads()) == [("b", 1, at(2), 1), ("a", 1, at(1), 1)]
        async with persistent_backend.make(read_only=True) as read_only:
            assert await read_only.list_threads() == await reader.list_threads()


# -- run summaries across threads ----------------------------------------------------------


async def test_run_summaries_of_every_thread_come_newest_first(store):
    for s in [
        summary("a", "r1", 10, status="success"),
        summary("b", "r1", 30, status="error"),
        summary("a", "r2", None),  # never started: after every run that did
        summary("c", "r1", 20, status="success"),
        summary("b", "r2", 20, status="interrupted"),  # same start: thread id, then run id
        summary("c", "r0", 20),
    ]:
        await store.put_run_summary(s)
    runs = [(s.thread_id, s.run_id) for s in await store.list_run_summaries()]
    assert runs == [("b", "r1"), ("c", "r1"), ("c", "r0"), ("b", "r2"), ("a", "r1"), ("a", "r2")]
    page = await store.list_run_summaries(limit=2)
    assert page == [await store.get_run_summary("b", "r1"), await store.get_run_summary("c", "r1")]
    # Without keywords a thread keeps its first-written order; with one it is paged too.
    assert [s.run_id for s in await store.list_run_summaries("c")] == ["r1", "r0"]
    assert [s.run_id for s in await store.list_run_summaries("c", limit=5)] == ["r1", "r0"]
    assert [s.run_id for s in await store.list_run_summaries("a", limit=1)] == ["r1"]
    assert [s.run_id for s in await store.list_run_summaries("a", status="running")] == ["r2"]
    assert await store.list_run_summaries(limit=0) == []


async def test_start_times_order_by_instant_whatever_their_offset(store):
    tokyo = timezone(timedelta(hours=9))
    for run_id, started in [
        ("utc", datetime(2026, 3, 1, 12, 0, 0, 500000, tzinfo=UTC)),
        ("tokyo", datetime(2026, 3, 1, 20, 0, 0, 999999, tzinfo=tokyo)),  # 11:00:00.999999Z
        ("naive", datetime(2026, 3, 1, 12, 0, 0, 499999)),  # taken as UTC
        ("whole", datetime(2026, 3, 1, 12, 0, 1, tzinfo=UTC)),
    ]:
        await store.put_run_summary(RunSummary(thread_id="t", run_id=run_id, started_at=started))
    assert await every_run(store, 1) == [
        ("t", "whole"),
        ("t", "utc"),
        ("t", "naive"),
        ("t", "tokyo"),
    ]


async def test_run_summary_pages_reach_the_end_with_every_run_once(store):
    for i in range(40):
        thread = f"t{i % 7}"
        await store.put_run_summary(summary(thread, f"r{i:02d}", None if i % 9 == 0 else i % 3))
    everything = await every_run(store, 100)
    assert len(everything) == len(set(everything)) == 40
    for page in (1, 3, 40):
        assert await every_run(store, page) == everything
    keys = []
    for thread_id, run_id in everything:
        started = (await store.get_run_summary(thread_id, run_id)).started_at
        keys.append((started or datetime.min.replace(tzinfo=UTC), thread_id, run_id))
    assert keys == sorted(keys, reverse=True)
    assert await every_run(store, 4, thread_id="t3") == [r for r in everything if r[0] == "t3"]


async def test_run_summaries_filter_by_status(store):
    for i, status in enumerate(["success", "error", "success", "running", "error", "success"]):
        await store.put_run_summary(summary(f"t{i % 2}", f"r{i}", i, status=status))
    assert await every_run(store, 2, status="error") == [("t0", "r4"), ("t1", "r1")]
    assert await every_run(store, 1, status="success") == [
        ("t1", "r5"),
        ("t0", "r2"),
        ("t0", "r0"),
    ]
    assert await store.list_run_summaries(status="cancelled") == []
    # A run whose status changes moves to its new status.
    await store.put_run_summary(summary("t1", "r1", 1, status="success"))
    assert await every_run(store, 2, status="error") == [("t0", "r4")]
    assert ("t1", "r1") in await every_run(store, 2, status="success")
    with pytest.raises(ValueError, match="status must be one of"):
        await store.list_run_summaries(status="done")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="before must be the last RunSummary"):
        await store.list_run_summaries(before=("t1", "r1"))  # type: ignore[arg-type]


async def test_run_summaries_across_threads_are_user_scoped(store):
    await store.put_run_summary(summary("a", "r1", 1, user_id="alice"))
    await store.put_run_summary(summary("a", "r2", 2, user_id="bob"))
    await store.put_run_summary(summary("b", "r1", 3, user_id="alice", status="error"))
    await store.put_run_summary(summary("c", "r1", 4))
    assert await every_run(store, 1, user_id="alice") == [("b", "r1"), ("a", "r1")]
    assert await every_run(store, 1, user_id="alice", status="error") == [("b", "r1")]
    with user_scope("bob"):
        assert await every_run(store, 5) == [("a", "r2")]
    assert await every_run(store, 5) == [("c", "r1"), ("b", "r1"), ("a", "r2"), ("a", "r1")]


async def test_deleted_runs_leave_the_summary_pages(store):
    await store.put_batch([ev("a", "r1", 1), ev("b", "r1", 2)])
    for thread, run, started in [("a", "r1", 1), ("a", "r2", 2), ("b", "r1", 3)]:
        await store.put_run_summary(summary(thread, run, started))
    await store.delete_by_run("a", "r2")  # a summary without events goes too
    assert await every_run(store, 5) == [("b", "r1"), ("a", "r1")]
    await store.delete_by_thread("b")
    assert await every_run(store, 5) == [("a", "r1")]


async def test_another_stores_summaries_show_up_in_the_pages(persistent_backend: Backend):
    async with persistent_backend.make() as reader, persistent_backend.make() as writer:
        await writer.put_run_summary(summary("a", "r1", 1))
        assert await every_run(reader, 5) == [("a", "r1")]
        await writer._put_journal_batch([ev("b", "r1", 2)], [summary("b", "r1", 2).to_json_dict()])
        await writer.put_run_summary(summary("a", "r1", 3, status="success"))
        assert await every_run(reader, 5) == [("a", "r1"), ("b", "r1")]
        assert await every_run(reader, 5, status="success") == [("a", "r1")]
        await writer.delete_by_thread("a")
        assert await every_run(reader, 5) == [("b", "r1")]


# -- SQL backends: the upgrade and the query plans -----------------------------------------


#: Each SQL backend's last schema version without the browsing tables.
BEFORE_BROWSING = {"sqlite": 2, "postgres": 15}


@pytest.fixture(params=[pytest.param(name, marks=b.marks) for name, b in SQL_BACKENDS.items()])
async def sql_backend(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Backend]:
    async with bound(request.param, tmp_path, request) as backend:
        yield backend


async def test_a_database_of_the_previous_schema_upgrades_with_its_threads_and_runs(
    sql_backend: Backend,
):
    previous = BEFORE_BROWSING[sql_backend.name]
    with contextlib.closing(Raw(sql_backend)) as raw:
        raw.build(previous)
        assert not raw.has_table("run_threads")
        rows = [  # (thread, run, seq, user, seconds after BASE)
            ("a", "r1", 1, "alice", 1),
            ("a", "r2", 2, "bob", 5),
            ("a", "r2", 3, None, 2),
            ("b", "r1", 1, None, 4),
        ]
        for thread, run, seq, user, when in rows:
            raw.rows(
                "INSERT INTO run_events (thread_id, run_id, seq, event_type, category, content, "
                "metadata, created_at, user_id) VALUES (?, ?, ?, 'e', 'message', '1', '{}', ?, ?)",
                (thread, run, seq, at(when), user),
            )
        if raw.postgres:  # SQLite's trigger keeps the counters; PostgreSQL's store did
            raw.rows("INSERT INTO run_thread_seq VALUES ('a', 3), ('b', 1)")
        column = "data" if raw.postgres else "summary"
        for s in [
            summary("a", "r1", 1, user_id="alice", status="success"),
            summary("a", "r2", 5, user_id="bob", status="error"),
            summary("b", "r1", None),
        ]:
            raw.rows(
                f"INSERT INTO run_summaries (thread_id, run_id, user_id, {column}) "
                "VALUES (?, ?, ?, ?)",
                (s.thread_id, s.run_id, s.user_id, s.model_dump_json()),
            )
    async with sql_backend.make() as store:
        assert brief(await store.list_threads()) == [("b", 1, at(4), 1), ("a", 3, at(2), 2)]
        assert brief(await store.list_threads(user_id="bob")) == [("a", 2, at(5), 1)]
        assert await every_run(store, 1) == [("a", "r2"), ("a", "r1"), ("b", "r1")]
        assert await every_run(store, 1, status="success") == [("a", "r1")]
        assert await every_run(store, 1, user_id="bob") == [("a", "r2")]
        # The upgraded tables go on with new writes and deletes.
        await store.put(**ev("b", "r2", 9, user_id="bob"))
        await store.delete_by_run("a", "r2")
        assert brief(await store.list_threads()) == [("b", 2, at(9), 2), ("a", 1, at(1), 1)]
        assert brief(await store.list_threads(user_id="bob")) == [("b", 2, at(9), 1)]
        assert await every_run(store, 5) == [("a", "r1"), ("b", "r1")]


async def test_sqlite_browsing_queries_read_their_index_in_order_and_never_sort(tmp_path):
    import aiosqlite

    from deerflow_journal import SqliteRunEventStore

    async with aiosqlite.connect(tmp_path / "j.db", isolation_level=None) as db:
        store = SqliteRunEventStore(db)
        await store.put_batch([ev("a", "r1", 1, user_id="u1"), ev("b", "r1", 2)])
        await store.put_run_summary(summary("a", "r1", 1, user_id="u1"))
        last = summary("b", "r1", 2)
        first = (await store.list_threads())[0]
        # (how the index is read, the index, the call): a SCAN only for the first page of
        # every run, which reads the index from its newest entry and stops after the page.
        calls = [
            ("SEARCH", "run_threads_recent", lambda: store.list_threads()),
            (
                "SEARCH",
                "run_threads_recent",
                lambda: store.list_threads(before=first, user_id="u1"),
            ),
            ("SCAN", "run_summaries_recent", lambda: store.list_run_summaries()),
            ("SEARCH", "run_summaries_recent", lambda: store.list_run_summaries(before=last)),
            (
                "SEARCH",
                "run_summaries_status_recent",
                lambda: store.list_run_summaries(status="error"),
            ),
            ("SEARCH", "run_summaries_user_recent", lambda: store.list_run_summaries(user_id="u1")),
            (
                "SEARCH",
                "run_summaries_user_status_recent",
                lambda: store.list_run_summaries(status="running", before=last, user_id="u1"),
            ),
        ]
        statements: list[str] = []
        await db.set_trace_callback(statements.append)
        for how, index, call in calls:
            statements.clear()
            await call()
            (sql,) = statements
            plan = [row[3] for row in await db.execute_fetchall(f"EXPLAIN QUERY PLAN {sql}")]
            assert len(plan) == 1, plan  # no TEMP B-TREE: the index gives the order
            assert plan[0].startswith(f"{how} run_"), plan
            assert f" INDEX {index} " in f"{plan[0]} ", plan
        await db.set_trace_callback(None)


@pytest.mark.parametrize(
    ("started_at", "key"),
    [
        ("2026-01-02T03:04:05.000006Z", "2026-01-02T03:04:05.000006"),
        ("2026-01-02T03:04:05.999999Z", "2026-01-02T03:04:05.999999"),
        ("2026-01-02T03:04:05Z", "2026-01-02T03:04:05.000000"),
        ("2026-01-02T03:04:05.000006+01:00", "2026-01-02T02:04:05.000006"),
        ("2026-02-30T03:04:05.000006Z", ""),  # no such day
        ("2026-01-02T03:04:60.000006Z", ""),
        (None, ""),
    ],
)
def test_a_summary_sorts_by_its_start_in_utc(started_at, key):
    assert started_key(started_at) == key
