"""PostgreSQL-only promises: many writer processes, concurrent setup, pools the caller owns."""

from __future__ import annotations

import asyncio
import dataclasses
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

from deerflow_journal import PostgresRunEventStore, RunSummary, open_store
from deerflow_journal.stores.postgres import MIGRATIONS
from tests.backends import PostgresBackend
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


@dataclasses.dataclass
class _ThreadOnly:
    thread_id: str


async def test_a_journal_write_ignores_the_pool_row_factory(pg):
    pool = AsyncConnectionPool(pg.dsn, open=False, kwargs={"row_factory": class_row(_ThreadOnly)})
    async with pool, PostgresRunEventStore(pool) as store:
        event = {"thread_id": THREAD, "run_id": "r", "event_type": "e", "category": "message"}
        await store._put_journal_batch([event], [RunSummary(thread_id=THREAD, run_id="r")])
        assert await store.get_run_summary(THREAD, "r") is not None
