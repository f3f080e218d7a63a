"""PostgreSQL-only promises: many writer processes, concurrent setup, pools the caller owns,
schema upgrades, message counters and refused events."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import string
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict
from urllib.parse import quote

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import class_row, dict_row
from psycopg_pool import AsyncConnectionPool

from deerflow_journal import (
    EventRefused,
    PostgresRunEventStore,
    RunJournal,
    RunSummary,
    open_store,
)
from deerflow_journal.stores.postgres import MIGRATIONS
from tests.backends import PostgresBackend
from tests.journal.agents import QUESTION, agent_graph, ai, scripted
from tests.pg_processes import (
    BATCH_SIZE,
    BATCHES,
    TASKS,
    THREAD,
    Children,
    set_up_once,
    write_from_tasks,
)

pytestmark = pytest.mark.postgres

PROCESSES = 8
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def pg(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[PostgresBackend]:
    """A fresh schema on the test server."""
    backend = PostgresBackend(tmp_path, request)
    try:
        yield backend
    finally:
        await backend.cleanup()


# -- many processes ---------------------------------------------------------------------------


async def _tail(store: PostgresRunEventStore, children: Children, expected: int) -> int:
    """Follow the thread with ``after_seq`` while it grows; every page must continue the last."""
    cursor = 0
    while cursor < expected:
        page = await store.list_messages(THREAD, after_seq=cursor, limit=200, user_id=None)
        seqs = [r["seq"] for r in page]
        assert seqs == list(range(cursor + 1, cursor + 1 + len(seqs))), "a reader saw a gap"
        cursor = seqs[-1] if seqs else cursor
        if not seqs and not children.alive():
            break
        await asyncio.sleep(0.002)
    return cursor


@pytest.mark.slow
async def test_many_processes_writing_one_thread_keep_seq_gap_free_in_commit_order(pg):
    singles, batched = (BATCHES + 1) // 2, BATCHES // 2
    expected = PROCESSES * TASKS * (singles + batched * BATCH_SIZE) + 1
    async with pg.make() as store:
        children = Children(write_from_tasks, [(pg.dsn, p) for p in range(PROCESSES)])
        seen = await _tail(store, children, expected)
        outcomes = await children.collect()
        stored = await store.list_messages(THREAD, limit=expected + 10, user_id=None)
        counted = await store.count_messages(THREAD, user_id=None)

    assert seen == expected
    assert [r["seq"] for r in stored] == list(range(1, expected + 1))
    writers = [tuple(r["content"]["writer"]) for r in stored if r["run_id"] != "once"]
    assert len(writers) == len(set(writers)) == expected - 1
    spans = [span for outcome in outcomes for span in outcome["spans"]]
    assert sorted(s for _, _, batch in spans for s in batch) == [
        r["seq"] for r in stored if r["run_id"] != "once"
    ]
    for _, _, batch in spans:
        assert batch == list(range(batch[0], batch[0] + len(batch)))
    # A batch that returned before another began holds the lower seq numbers.
    ordered = sorted(spans)
    for first_end, first_seqs in ((end, seqs) for _, end, seqs in ordered):
        later = [seqs for start, _, seqs in ordered if start > first_end]
        assert all(first_seqs[-1] < seqs[0] for seqs in later)

    absent = [entry for outcome in outcomes for entry in outcome["absent"]]
    assert len(absent) == PROCESSES * TASKS
    assert [created for _, created in absent].count(True) == 1
    assert len({seq for seq, _ in absent}) == 1
    assert [r["run_id"] for r in stored].count("once") == 1
    assert counted == expected


@pytest.mark.slow
async def test_setup_from_several_processes_at_once_migrates_once(pg):
    seqs = await Children(set_up_once, [(pg.dsn, p) for p in range(PROCESSES)]).collect()
    assert sorted(seqs) == list(range(1, PROCESSES + 1))
    async with (
        AsyncConnectionPool(pg.dsn, open=False) as pool,
        pool.connection() as conn,
    ):
        rows = await (
            await conn.execute("SELECT v FROM run_event_migrations ORDER BY v")
        ).fetchall()
    assert [v for (v,) in rows] == list(range(len(MIGRATIONS)))


# -- pools ------------------------------------------------------------------------------------


async def test_a_pool_passed_in_is_used_and_never_closed(pg):
    async with AsyncConnectionPool(pg.dsn, open=False) as pool:
        async with PostgresRunEventStore(pool) as store:
            await store.put(thread_id=THREAD, run_id="r", event_type="e", category="message")
        assert not pool.closed
        async with PostgresRunEventStore(pool) as again:
            assert await again.count_messages(THREAD) == 1
        async with pool.connection() as conn:
            assert (await (await conn.execute("SELECT count(*) FROM run_events")).fetchone()) == (
                1,
            )


async def _connections_named(dsn: str, name: str) -> int:
    async with AsyncConnectionPool(dsn, open=False, min_size=1) as pool, pool.connection() as c:
        cur = await c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
        )
        return (await cur.fetchone())[0]


async def test_from_conn_string_owns_its_pool_and_closes_it(pg):
    name = f"journal-{uuid.uuid4().hex[:12]}"
    dsn = f"{pg.dsn}&application_name={name}"
    async with PostgresRunEventStore.from_conn_string(dsn) as store:
        await store.put(thread_id=THREAD, run_id="r", event_type="e", category="message")
        assert await _connections_named(pg.dsn, name) >= 1
    for _ in range(100):
        if await _connections_named(pg.dsn, name) == 0:
            break
        await asyncio.sleep(0.05)
    assert await _connections_named(pg.dsn, name) == 0
    async with open_store(dsn) as reopened:
        assert await reopened.count_messages(THREAD) == 1


@pytest.mark.parametrize("autocommit", [True, False])
async def test_store_ignores_the_pool_connection_settings(pg, autocommit):
    kwargs = {"autocommit": autocommit, "row_factory": dict_row, "prepare_threshold": 0}
    async with AsyncConnectionPool(pg.dsn, open=False, kwargs=kwargs) as pool:
        async with PostgresRunEventStore(pool) as store:
            events = [
                {"thread_id": THREAD, "run_id": "r", "event_type": "e", "category": "message"}
            ] * 3
            assert [r["seq"] for r in await store.put_batch(events)] == [1, 2, 3]
            _, created = await store.put_if_absent(**events[0])
            assert not created
            assert [r["seq"] for r in await store.list_messages(THREAD)] == [1, 2, 3]
            await store.put_run_summary(RunSummary(thread_id=THREAD, run_id="r"))
            assert await store.get_run_summary(THREAD, "r") is not None
            assert await store.delete_by_run(THREAD, "r") == 3
            assert await store.list_run_summaries(THREAD) == []
        async with pool.connection() as conn:
            assert (await (await conn.execute("SELECT 1 AS one")).fetchone()) == {"one": 1}


def _dsn_with(pg: PostgresBackend, *settings: str) -> str:
    """The test schema's DSN with session ``settings`` (``name=value``, spaces escaped)."""
    options = quote(
        " ".join([f"-csearch_path={pg.schema}", *(f"-c{s}" for s in settings)]), safe=""
    )
    separator = "&" if "?" in pg.server_dsn else "?"
    return f"{pg.server_dsn}{separator}options={options}"


async def _session_time_zone(pool: AsyncConnectionPool) -> str:
    async with pool.connection() as conn:
        return (await (await conn.execute("SHOW timezone")).fetchone())[0]


EXTREME_CREATED_AT = ["9999-12-31T23:59:59.999999+00:00", "0001-01-01T00:00:00.000000+00:00"]


async def _assert_extreme_created_at_round_trip(store: PostgresRunEventStore) -> None:
    events = [
        {
            "thread_id": THREAD,
            "run_id": "r",
            "event_type": "e",
            "category": "message",
            "created_at": when,
        }
        for when in EXTREME_CREATED_AT
    ]
    written = await store.put_batch(events)
    assert [r["created_at"] for r in written] == EXTREME_CREATED_AT
    assert await store.list_messages(THREAD) == written
    assert await store.list_events(THREAD, "r") == written
    assert await store.put_if_absent(**events[0]) == (written[0], False)


async def test_extreme_created_at_reads_back_in_a_caller_pool_with_a_tokyo_session(pg):
    async with AsyncConnectionPool(_dsn_with(pg, "timezone=Asia/Tokyo"), open=False) as pool:
        assert await _session_time_zone(pool) == "Asia/Tokyo"
        async with PostgresRunEventStore(pool) as store:
            await _assert_extreme_created_at_round_trip(store)


async def test_extreme_created_at_reads_back_through_a_new_york_dsn(pg):
    dsn = _dsn_with(pg, "timezone=America/New_York")
    async with AsyncConnectionPool(dsn, open=False) as pool:
        assert await _session_time_zone(pool) == "America/New_York"
    async with PostgresRunEventStore.from_conn_string(dsn) as store:
        await _assert_extreme_created_at_round_trip(store)


class _Counter(TypedDict):
    count: int


async def test_one_pool_serves_langgraph_checkpoints_and_the_journal_in_one_run(pg):
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(pg.dsn, open=False, max_size=4, kwargs=kwargs) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        store = PostgresRunEventStore(pool)

        async def step(state: _Counter, config: RunnableConfig) -> _Counter:
            thread_id = config["configurable"]["thread_id"]
            await store.put(
                thread_id=thread_id,
                run_id="run-1",
                event_type="run.start",
                category="trace",
                content={"chain": "counter"},
            )
            return {"count": state["count"] + 1}

        builder = StateGraph(_Counter)
        builder.add_node("step", step)
        builder.add_edge(START, "step")
        builder.add_edge("step", END)
        graph = builder.compile(checkpointer=saver)
        config: RunnableConfig = {"configurable": {"thread_id": "graph-thread"}}
        assert await graph.ainvoke({"count": 0}, config) == {"count": 1}
        await store.put(
            thread_id="graph-thread",
            run_id="run-1",
            event_type="run.end",
            category="outputs",
            content={"count": 1},
        )

        checkpoint = await saver.aget_tuple(config)
        assert checkpoint is not None
        assert checkpoint.checkpoint["channel_values"]["count"] == 1
        events = await store.list_events("graph-thread", "run-1")
        assert [e["event_type"] for e in events] == ["run.start", "run.end"]
        await store.close()
        assert not pool.closed


# -- installation -----------------------------------------------------------------------------


def test_missing_psycopg_raises_an_import_error_naming_the_extra():
    script = textwrap.dedent(
        """
        import sys

        class BlockPsycopg:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {"psycopg", "psycopg_pool"}:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, BlockPsycopg())
        import deerflow_journal

        print("imported", "PostgresRunEventStore" in deerflow_journal.__all__)
        exec("from deerflow_journal import *")  # every name it lists can be imported
        for build in (
            lambda: deerflow_journal.PostgresRunEventStore,
            lambda: deerflow_journal.open_store("postgresql://postgres@127.0.0.1/postgres"),
        ):
            try:
                build()
            except ImportError as exc:
                print("error", exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "imported False"
    assert len(lines) == 3
    for line in lines[1:]:
        assert "pip install 'deerflow-journal[postgres]'" in line


# -- the caller's session settings ------------------------------------------------------------


async def _write_from_tasks(store: PostgresRunEventStore, tasks: int = 6, each: int = 15) -> None:
    async def write(task: int) -> None:
        for i in range(each):
            await store.put(
                thread_id=THREAD, run_id=f"r{task}", event_type="e", category="message", content=i
            )

    await asyncio.gather(*(write(task) for task in range(tasks)))


@pytest.mark.parametrize("level", ["read\\ committed", "repeatable\\ read", "serializable"])
@pytest.mark.parametrize("autocommit", [True, False])
async def test_a_caller_pool_at_any_isolation_level_writes_each_batch_once(pg, level, autocommit):
    # Events alone go in one statement on an autocommit session at READ COMMITTED; any other
    # session writes them in a transaction, and the statement tried first leaves no trace.
    kwargs = {"autocommit": autocommit, "row_factory": dict_row}
    dsn = _dsn_with(pg, f"default_transaction_isolation={level}")
    async with (
        AsyncConnectionPool(dsn, open=False, kwargs=kwargs) as pool,
        PostgresRunEventStore(pool) as store,
    ):
        await _write_from_tasks(store)
        batch = [_event("b", "alice")] * 3
        assert await store._put_journal_batch(batch, [], batch_id="batch-1")
        assert not await store._put_journal_batch(batch, [], batch_id="batch-1")
        assert await store._put_journal_batch(batch[:1], [], batch_id="batch-2")
        assert not await store._put_journal_batch(batch[:1], [], batch_id="batch-2")
        messages = await store.list_messages(THREAD, limit=200, user_id=None)
        assert [r["seq"] for r in messages] == list(range(1, 95))
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT batch_id FROM run_journal_batches ORDER BY n")
            assert [row["batch_id"] for row in await cur.fetchall()] == ["batch-1", "batch-2"]


@pytest.mark.parametrize("level", ["repeatable\\ read", "serializable"])
async def test_writers_and_setup_work_whatever_the_default_isolation_level(pg, level):
    # The thread locks serialise writers only at READ COMMITTED: at stricter levels the
    # snapshot is taken before the lock is granted (serialisation failures, duplicate DDL).
    dsn = _dsn_with(pg, f"default_transaction_isolation={level}")
    stores = [PostgresRunEventStore(dsn) for _ in range(3)]
    try:
        await asyncio.gather(*(store.setup() for store in stores))
        await _write_from_tasks(stores[0])
        messages = await stores[1].list_messages(THREAD, limit=200)
        assert [r["seq"] for r in messages] == list(range(1, 91))
    finally:
        for store in stores:
            await store.close()


async def test_a_read_only_session_reads_a_set_up_store(pg):
    async with pg.make() as store:
        await store.put(thread_id=THREAD, run_id="r", event_type="e", category="message")
    dsn = _dsn_with(pg, "default_transaction_read_only=on")
    async with PostgresRunEventStore(dsn) as reader:  # setting up needs no DDL any more
        assert await reader.count_messages(THREAD) == 1


async def test_a_dsn_naming_a_missing_database_fails_with_the_servers_reason(pg):
    dsn = pg.server_dsn.rsplit("/", 1)[0] + f"/missing_{uuid.uuid4().hex[:8]}"
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        await PostgresRunEventStore(dsn).setup()


@pytest.mark.parametrize("read_only", [False, True])
def test_a_malformed_url_is_refused_at_once_saying_what_to_encode(read_only: bool):
    with pytest.raises(ValueError, match='invalid URI query parameter: "bogus"'):
        open_store("postgresql://u@localhost/db?bogus=1", read_only=read_only)
    with pytest.raises(ValueError, match=r"percent-encode '=' and '&' in a value"):
        open_store("postgresql://u@localhost/db?options=-csearch_path=s", read_only=read_only)


@dataclasses.dataclass
class _ThreadOnly:
    thread_id: str


async def test_a_journal_write_ignores_the_pool_row_factory(pg):
    pool = AsyncConnectionPool(pg.dsn, open=False, kwargs={"row_factory": class_row(_ThreadOnly)})
    async with pool, PostgresRunEventStore(pool) as store:
        event = {"thread_id": THREAD, "run_id": "r", "event_type": "e", "category": "message"}
        await store._put_journal_batch(
            [event], [RunSummary(thread_id=THREAD, run_id="r").to_json_dict()]
        )
        assert await store.get_run_summary(THREAD, "r") is not None


# -- schema upgrades --------------------------------------------------------------------------

#: The last schema version with jsonb payloads and no message counters.
JSONB_VERSION = 7


async def test_a_database_of_the_jsonb_schema_upgrades_and_reads_back_the_same(pg):
    # Rows as the jsonb store wrote them: keys reordered, floats spelled as long decimals.
    huge = "1" + "0" * 308 + ".0"
    rows = [
        (1, "r1", "message", "alice", '{"zebra": 1, "a": [1.5, -0.0]}', '{"task_id": "t1"}'),
        (2, "r1", "trace", "alice", '{"run": {"b": 2, "a": 1}}', "{}"),
        (3, "r1", "message", None, f'{{"huge": {huge}, "tiny": 5e-324}}', '{"caller": "x"}'),
        (4, "r2", "message", "bob", '"plain"', '{"z": 1, "y": 2}'),
    ]
    async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE run_event_migrations "
            "(v integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, statement in enumerate(MIGRATIONS[: JSONB_VERSION + 1]):
            await conn.execute(statement)
            await conn.execute("INSERT INTO run_event_migrations (v) VALUES (%s)", (version,))
        for seq, run_id, category, user_id, content, metadata in rows:
            await conn.execute(
                "INSERT INTO run_events (thread_id, run_id, seq, event_type, category, content, "
                "metadata, created_at, user_id, task_id) VALUES (%s, %s, %s, 'e', %s, %s::jsonb, "
                "%s::jsonb, '2026-01-02T03:04:05Z', %s, %s::jsonb ->> 'task_id')",
                (THREAD, run_id, seq, category, content, metadata, user_id, metadata),
            )
        await conn.execute("INSERT INTO run_thread_seq VALUES (%s, 4)", (THREAD,))
        await conn.execute(
            "INSERT INTO run_summaries (thread_id, run_id, user_id, data) VALUES (%s, 'r1', NULL, "
            "%s::jsonb)",
            (THREAD, RunSummary(thread_id=THREAD, run_id="r1").model_dump_json()),
        )
        cur = await conn.execute(
            "SELECT content::text, metadata::text FROM run_events ORDER BY seq"
        )
        before = [(json.loads(c), json.loads(m)) for c, m in await cur.fetchall()]

    async with pg.make() as store:
        read = [*await store.list_events(THREAD, "r1"), *await store.list_events(THREAD, "r2")]
        assert [_text((r["content"], r["metadata"])) for r in read] == [_text(b) for b in before]
        assert read[0]["content"] == {"a": [1.5, 0.0], "zebra": 1}
        assert read[2]["content"]["huge"] == 1e308
        assert [r["seq"] for r in await store.list_events(THREAD, "r1", task_id="t1")] == [1]
        counts = [await store.count_messages(THREAD, user_id=u) for u in (None, "alice", "bob")]
        assert counts == [3, 1, 1]
        assert await store.get_run_summary(THREAD, "r1") == RunSummary(
            thread_id=THREAD, run_id="r1"
        )
        new = await store.put(
            thread_id=THREAD, run_id="r3", event_type="e", category="message", content={"b": -0.0}
        )
        assert new["seq"] == 5
        (again,) = await store.list_events(THREAD, "r3")
        assert _text(again["content"]) == '{"b": -0.0}'
        assert await store.count_messages(THREAD) == 4
    async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT v FROM run_event_migrations ORDER BY v")
        assert [v for (v,) in await cur.fetchall()] == list(range(len(MIGRATIONS)))


def _text(value: object) -> str:
    """JSON text that tells apart what ``==`` does not: key order, and -0.0 from 0."""
    return json.dumps(value)


# -- message counters -------------------------------------------------------------------------


async def _counters_and_counts(dsn: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The thread's counter rows, and its message rows counted per user ('' for none)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        counters = await conn.execute(
            "SELECT user_key, messages FROM run_message_counts WHERE thread_id = %s "
            "ORDER BY user_key",
            (THREAD,),
        )
        counted = await conn.execute(
            "SELECT coalesce(user_id, ''), count(*) FROM run_events "
            "WHERE thread_id = %s AND category = 'message' GROUP BY 1 ORDER BY 1",
            (THREAD,),
        )
        return await counters.fetchall(), await counted.fetchall()


def _event(run_id: str, user_id: str | None, category: str = "message") -> dict[str, object]:
    return {
        "thread_id": THREAD,
        "run_id": run_id,
        "event_type": "e",
        "category": category,
        "user_id": user_id,
    }


async def test_count_messages_reads_per_user_counters_kept_by_writes_and_deletes(pg):
    async with pg.make() as store:
        await store.put_batch(
            [_event("r1", u) for u in ("alice", "alice", "bob", None, None, "bob")]
            + [_event("r1", "alice", "trace"), _event("r2", "alice"), _event("r2", "bob")]
        )
        await store.delete_by_run(THREAD, "r2", user_id="bob")
        await store.put(**_event("r3", "alice"))
        counters, counted = await _counters_and_counts(pg.dsn)
        assert counters == counted == [("", 2), ("alice", 4), ("bob", 2)]
        await store.delete_by_thread(THREAD, user_id="alice")
        counters, counted = await _counters_and_counts(pg.dsn)
        assert counters == counted == [("", 2), ("bob", 2)]

        # count_messages reads those rows, not the thread's events: moving one moves the count.
        async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
            await conn.execute(
                "UPDATE run_message_counts SET messages = messages + 1000 WHERE user_key = 'bob'"
            )
        assert await store.count_messages(THREAD, user_id="bob") == 1002
        assert await store.count_messages(THREAD, user_id=None) == 1004


_INSERT_ROW = """INSERT INTO run_events
    (thread_id, run_id, seq, event_type, category, content, metadata, created_at, user_id)
    SELECT 'big', 'r' || (n / 100), n, 'e', 'message', '{}', '{}', now(), %s
    FROM generate_series(%s::bigint, %s::bigint) AS n"""


async def _rows_read_by_table_scans(conn: psycopg.AsyncConnection, sql: str, params) -> int:
    """Rows of run_events that ``sql`` (its triggers included) read by scanning the table."""
    async with conn.transaction():
        await conn.execute(sql, params)
        cur = await conn.execute("SELECT pg_stat_get_xact_tuples_returned('run_events'::regclass)")
        ((scanned,),) = await cur.fetchall()
    return scanned


@pytest.mark.parametrize("user_id", [None, "alice"])
async def test_a_write_reads_no_more_rows_as_the_table_grows(pg, user_id):
    # A session keeps the plans its first trigger calls made, on a nearly empty table: they
    # must not scan run_events, or every later write reads all of it.
    async with pg.make() as store:
        await store.put(**_event("r0", user_id))
    async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
        await conn.execute(_INSERT_ROW, (user_id, 1, 1))
        await conn.execute(_INSERT_ROW, (user_id, 2, 5000))
        assert await _rows_read_by_table_scans(conn, _INSERT_ROW, (user_id, 5001, 5001)) < 100
        deleted = "DELETE FROM run_events WHERE thread_id = 'big' AND seq = %s"
        assert await _rows_read_by_table_scans(conn, deleted, (5001,)) < 100
        assert await _rows_read_by_table_scans(conn, deleted, (4000,)) < 100
        cur = await conn.execute(
            "SELECT user_key, last_seq, run_count FROM run_threads WHERE thread_id = 'big' "
            "ORDER BY user_key"
        )
        expected = [("", 5000, 51)] + ([] if user_id is None else [(user_id, 5000, 51)])
        assert await cur.fetchall() == expected


async def test_message_counters_stay_exact_under_concurrent_writers_and_deleters(pg):
    stores = [pg.make() for _ in range(3)]
    users = ["alice", "bob", None]

    async def work(store: PostgresRunEventStore, worker: int) -> None:
        # Worker 0 deletes alice's rows of a run, worker 1 bob's, worker 2 everyone's.
        for step in range(12):
            run_id = f"r{step % 4}"
            if step % 3 == 2:
                await store.delete_by_run(THREAD, run_id, user_id=users[worker])
            elif step % 3 == 1:
                await store.put_batch([_event(run_id, u) for u in users] * 2)
            else:
                await store.put(**_event(run_id, users[worker]))

    try:
        await asyncio.gather(*(work(store, n) for n, store in enumerate(stores)))
        counters, counted = await _counters_and_counts(pg.dsn)
        assert counters == counted
        assert await stores[0].count_messages(THREAD) == sum(n for _, n in counted) > 0
    finally:
        for store in stores:
            await store.close()


async def test_thread_listings_stay_exact_under_concurrent_writers_of_new_runs(pg):
    # Each writer's statement waits for the thread's lock; its triggers must then see what
    # the writers before it committed, or a run would be counted twice (or not at all).
    stores = [pg.make() for _ in range(4)]
    for store in stores:
        await store.setup()

    async def work(store: PostgresRunEventStore, worker: int) -> None:
        for step in range(12):
            run_id, user = f"r{step % 5}", ("alice", "bob", None)[(worker + step) % 3]
            if step % 2:
                await store.put_batch([_event(run_id, user)] * 3)
            else:
                await store.put(**_event(run_id, user))

    try:
        await asyncio.gather(*(work(store, n) for n, store in enumerate(stores)))
        async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
            kept = await conn.execute(
                "SELECT user_key, last_seq, run_count FROM run_threads WHERE thread_id = %s "
                "ORDER BY user_key",
                (THREAD,),
            )
            counted = await conn.execute(
                "SELECT '', max(seq), count(DISTINCT run_id) FROM run_events WHERE thread_id = %s "
                "UNION ALL SELECT user_id, max(seq), count(DISTINCT run_id) FROM run_events "
                "WHERE thread_id = %s AND user_id IS NOT NULL GROUP BY user_id ORDER BY 1",
                (THREAD, THREAD),
            )
            assert await kept.fetchall() == await counted.fetchall()
        seqs = [r["seq"] for r in await stores[0].list_messages(THREAD, limit=200, user_id=None)]
        assert seqs == list(range(1, 4 * (6 + 6 * 3) + 1))
    finally:
        for store in stores:
            await store.close()


# -- refused events ---------------------------------------------------------------------------


def _unindexable() -> str:
    """4,000 characters too random to compress into a btree entry (2,704 bytes at most)."""
    return "".join(random.Random(7).choices(string.ascii_letters + string.digits, k=4000))


async def test_an_event_postgresql_cannot_index_is_refused_and_writes_nothing(pg):
    # The normalisation bounds what our own indexes hold; an index a DBA adds (on caller,
    # say) can still refuse a row, and that is a refused event, not a failing store.
    good = _event("r", None)
    bad = {**good, "metadata": {"caller": _unindexable()}}
    summary = RunSummary(thread_id=THREAD, run_id="r")
    async with pg.make() as store:
        async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
            await conn.execute("CREATE INDEX run_events_by_caller ON run_events (caller)")
        writes = {
            "put": lambda: store.put(**bad),
            "put_batch": lambda: store.put_batch([good, bad]),
            "put_if_absent": lambda: store.put_if_absent(**bad),
            "journal": lambda: store._put_journal_batch([good, bad], [summary.to_json_dict()]),
        }
        for name, write in writes.items():
            with pytest.raises(EventRefused, match="index row size") as refused:
                await write()
            assert isinstance(refused.value.__cause__, psycopg.errors.ProgramLimitExceeded), name
            if name == "put":
                assert f"store event 'e' of run 'r' in thread '{THREAD}': " in str(refused.value)
        assert await store.list_events(THREAD, "r") == []
        assert await store.count_messages(THREAD) == 0
        assert await store.get_run_summary(THREAD, "r") is None
        # A batch of many threads names a few of them: the error stays one readable line.
        many = [{**good, "thread_id": f"t{i:02}"} for i in range(40)]
        with pytest.raises(EventRefused) as refused:
            await store.put_batch([*many, bad])
        assert (
            "a write of 41 events (threads 't00', 't01', 't02', 't03', 't04' and 36 more "
            "threads) and 0 summaries" in str(refused.value)
        )
        assert (await store.put(**good))["seq"] == 1


async def test_a_thread_out_of_seq_numbers_refuses_events(pg):
    async with pg.make() as store:
        await store.put(**_event("r", None))
        async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as conn:
            await conn.execute("UPDATE run_thread_seq SET last_seq = 9223372036854775807")
        with pytest.raises(EventRefused, match="bigint out of range") as refused:
            await store.put(**_event("r", None))
        assert isinstance(refused.value.__cause__, psycopg.errors.NumericValueOutOfRange)
        assert await store.count_messages(THREAD) == 1


async def test_a_lost_connection_is_raised_as_it_is_not_as_a_refused_event(pg):
    pool = AsyncConnectionPool(pg.dsn, open=False, min_size=1, max_size=1)
    async with pool, PostgresRunEventStore(pool) as store:
        async with pool.connection() as conn:
            pid = conn.info.backend_pid
        async with await psycopg.AsyncConnection.connect(pg.dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        with pytest.raises(psycopg.OperationalError):
            await store.put(**_event("r", None))
        assert (await store.put(**_event("r", None)))["seq"] == 1


# -- a store whose loop has closed --------------------------------------------------------------


@pytest.mark.parametrize("stage", ["idle", "write", "setup"])
def test_a_store_opened_from_a_dsn_reopens_its_pool_once_its_loop_has_closed(
    tmp_path: Path, request: pytest.FixtureRequest, stage: str
):
    """A worker making a loop per task (``loop.run_until_complete(...)``, then
    ``loop.close()``) with the store set up on its first loop, idle when it closes (``idle``)
    or with the run's write holding the pool's connection (``write``), or with the first setup
    cut short by the close (``setup``): the pool's tasks are gone with that loop, so the store
    opens a new pool on the loop of its next use. (Without that, ``write`` fails with the
    pool's timeout; ``idle`` and ``setup`` get by, on the idle connection or by a failed
    write's retry.)"""
    backend = PostgresBackend(tmp_path, request)
    store = PostgresRunEventStore(backend.dsn)
    stalled: list[bool] = []
    if stage == "setup":
        real = store._repeatable

        async def stalling(work):  # type: ignore[no-untyped-def]
            async def holding(cur):  # type: ignore[no-untyped-def]
                if not stalled:  # the schema check, holding a pool connection
                    stalled.append(True)
                    await asyncio.Event().wait()  # only its loop closing ends it
                return await work(cur)

            return await real(holding)

        store._repeatable = stalling  # type: ignore[method-assign]
    elif stage == "write":
        real_write = store._write

        async def stalling_write(write):  # type: ignore[no-untyped-def]
            if not stalled:
                stalled.append(True)
                async with store._connection():  # a slow statement, holding its connection
                    await asyncio.Event().wait()  # only its loop closing ends it
            return await real_write(write)

        store._write = stalling_write  # type: ignore[method-assign]
    journal = RunJournal(event_store=store, flush_threshold=1000)
    answer = ["run.start", "llm.human.input", "llm.ai.response", "run.end"]

    async def types(run_id: str) -> list[str]:
        return [event["event_type"] for event in await store.list_events(run_id, run_id)]

    loop = asyncio.new_event_loop()
    try:
        if stage != "setup":
            loop.run_until_complete(store.setup())

        async def first_run() -> None:
            await agent_graph(scripted(ai("1"))).ainvoke(QUESTION, {"callbacks": [journal]})
            if stage == "idle":
                await asyncio.wait_for(journal.flush(), 60)

        loop.run_until_complete(first_run())
        for _ in range(60_000):  # the write starts on the next turns
            if stage == "idle" or stalled:
                break
            loop.run_until_complete(asyncio.sleep(0.001))
        assert stage == "idle" or stalled
    finally:
        loop.close()
    first = journal.run_id
    assert first is not None

    async def next_run() -> tuple[list[str], list[str]]:
        await agent_graph(scripted(ai("2"))).ainvoke(QUESTION, {"callbacks": [journal]})
        await asyncio.wait_for(journal.flush(), 60)
        assert journal.run_id is not None
        return await types(first), await types(journal.run_id)

    try:
        # A dead pool fails the flush with PoolTimeout (after its 30 s wait for a connection).
        assert asyncio.run(asyncio.wait_for(next_run(), 150)) == (answer, answer)
    finally:
        asyncio.run(store.close())
        asyncio.run(backend.cleanup())
