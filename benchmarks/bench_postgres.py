"""PostgreSQL store throughput and latency against raw psycopg measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_postgres.py [--dsn postgresql://...] [--events 20000]
[--read-size 100000] [--proc-events 4000]``. The DSN defaults to ``$DEERFLOW_JOURNAL_TEST_PG_DSN``
or the local server; everything happens in a fresh schema that is dropped at the end. Prints one
line per figure: the write workload (batches of 20 and single puts), the read workload on one
large thread, and the write workload from 1, 4 and 8 processes on different threads and on one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads import THREAD, line, make_events, median_seconds

from deerflow_journal.stores.postgres import PostgresRunEventStore

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
USER = "bench-user"
FLOOR_SCHEMA = [
    """CREATE TABLE floor_events (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, thread_id text NOT NULL,
        run_id text NOT NULL, seq bigint NOT NULL, event_type text NOT NULL,
        category text NOT NULL, content jsonb NOT NULL, metadata jsonb NOT NULL,
        created_at timestamptz NOT NULL, user_id text, UNIQUE (thread_id, seq))""",
    "CREATE INDEX floor_cat ON floor_events (thread_id, category, seq)",
    "CREATE INDEX floor_run ON floor_events (thread_id, run_id, seq)",
    "CREATE TABLE floor_seq (thread_id text PRIMARY KEY, last_seq bigint NOT NULL)",
]
FLOOR_INSERT = """INSERT INTO floor_events (thread_id, run_id, seq, event_type, category, content,
    metadata, created_at, user_id) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"""
FLOOR_COUNTER = """INSERT INTO floor_seq AS t VALUES (%s, %s) ON CONFLICT (thread_id)
    DO UPDATE SET last_seq = t.last_seq + excluded.last_seq RETURNING last_seq"""


class Floor:
    """The least a correct multi-process writer does per batch, on one raw psycopg connection.

    One transaction: the thread's advisory lock, the counter upsert, then ``executemany``.
    """

    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn

    async def put_batch(self, events: list[dict[str, Any]]) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime())
        thread = events[0]["thread_id"]
        async with self.conn.transaction():
            await self.conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (thread,)
            )
            cur = await self.conn.execute(FLOOR_COUNTER, (thread, len(events)))
            last = (await cur.fetchone())[0]
            rows = [
                (
                    e["thread_id"],
                    e["run_id"],
                    last - len(events) + i + 1,
                    e["event_type"],
                    e["category"],
                    json.dumps(e["content"]),
                    json.dumps(e.get("metadata") or {}),
                    now,
                    None,
                )
                for i, e in enumerate(events)
            ]
            async with self.conn.cursor() as cur:
                await cur.executemany(FLOOR_INSERT, rows)


def schema_dsn(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema``."""
    separator = "&" if urlsplit(dsn).query else "?"
    return f"{dsn}{separator}options={quote(f'-csearch_path={schema}', safe='')}"


async def write_seconds(writer: Any, events: list[dict[str, Any]], batch: int) -> float:
    """Seconds to write ``events`` in batches of ``batch`` (1: single puts)."""
    start = time.perf_counter()
    if batch == 1:
        for event in events:
            if isinstance(writer, Floor):
                await writer.put_batch([event])
            else:
                await writer.put(**event)
    else:
        for i in range(0, len(events), batch):
            await writer.put_batch(events[i : i + batch])
    return time.perf_counter() - start


async def interleaved_rates(
    writers: list[Any], events: list[dict[str, Any]], batch: int
) -> list[float]:
    """Events/s of each writer, alternating in slices so load noise hits them alike. Each
    writer writes its own copy of the events, on a thread of its own."""
    seconds = [0.0] * len(writers)
    step = max(batch, len(events) // 10)
    for i in range(0, len(events), step):
        for k, writer in enumerate(writers):
            mine = [{**e, "thread_id": f"{e['thread_id']}-{k}"} for e in events[i : i + step]]
            seconds[k] += await write_seconds(writer, mine, batch)
    return [len(events) / s for s in seconds]


async def bench_writes(dsn: str, count: int, singles: int) -> None:
    events = make_events(count, 50)
    single_events = make_events(singles, 5, thread_id=f"{THREAD}-singles")
    # A caller's pool as LangGraph's AsyncPostgresSaver sets it up.
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with (
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
        AsyncConnectionPool(dsn, open=False, kwargs=kwargs) as pool,
        PostgresRunEventStore(dsn) as store,
        PostgresRunEventStore(pool) as given,
    ):
        for statement in FLOOR_SCHEMA:
            await conn.execute(statement)
        for label, workload, batch in (
            ("put_batch(20)", events, 20),
            ("single put", single_events, 1),
        ):
            floor_rate, rate, given_rate = await interleaved_rates(
                [Floor(conn), store, given], workload, batch
            )
            line(f"write floor raw psycopg {label}", floor_rate, "events/s")
            line(f"write postgres {label}", rate, "events/s", f"{rate / floor_rate:.2f}x floor")
            line(
                f"write postgres {label}, LangGraph-style caller pool",
                given_rate,
                "events/s",
                f"{given_rate / floor_rate:.2f}x floor",
            )


async def fill_thread(store: PostgresRunEventStore, thread: str, size: int) -> int:
    """Write ``size`` small events (half of them a user's) to ``thread``; return the first seq."""
    events = make_events(size, 50, thread_id=thread, text_bytes=200)
    for event in events[::2]:
        event["user_id"] = USER
    first = 0
    for i in range(0, size, 1000):
        written = await store.put_batch(events[i : i + 1000])
        first = first or written[0]["seq"]
    return first


def read_queries(
    store: PostgresRunEventStore, thread: str, middle: int, user: str | None
) -> dict[str, Any]:
    """The read paths of the workload, as store calls."""
    run = "run-0025"
    return {
        "list_messages latest page": lambda: store.list_messages(thread, limit=50, user_id=user),
        "list_messages before_seq middle": lambda: store.list_messages(
            thread, limit=50, before_seq=middle, user_id=user
        ),
        "list_events event_types": lambda: store.list_events(
            thread, run, event_types=["llm.tool.result"], limit=50, user_id=user
        ),
        "list_events task_id": lambda: store.list_events(
            thread, run, task_id="task-1", limit=50, user_id=user
        ),
        "count_messages": lambda: store.count_messages(thread, user_id=user),
    }


RAW_COLUMNS = "thread_id, run_id, seq, event_type, category, content, metadata, created_at, user_id"


def raw_queries(
    conn: psycopg.AsyncConnection, thread: str, middle: int, user: str | None
) -> dict[str, Any]:
    """The same reads as plain SQL on the same table, with psycopg's default loaders."""
    scope = "" if user is None else " AND user_id = %(user)s"
    params = {"thread": thread, "run": "run-0025", "middle": middle, "user": user}
    where = f"thread_id = %(thread)s{scope}"
    sqls = {
        "list_messages latest page": f"SELECT {RAW_COLUMNS} FROM run_events WHERE {where}"
        " AND category = 'message' ORDER BY seq DESC LIMIT 50",
        "list_messages before_seq middle": f"SELECT {RAW_COLUMNS} FROM run_events WHERE {where}"
        " AND category = 'message' AND seq < %(middle)s ORDER BY seq DESC LIMIT 50",
        "list_events event_types": f"SELECT {RAW_COLUMNS} FROM run_events WHERE {where}"
        " AND run_id = %(run)s AND event_type = ANY(ARRAY['llm.tool.result']) ORDER BY seq"
        " LIMIT 50",
        "list_events task_id": f"SELECT {RAW_COLUMNS} FROM run_events WHERE {where}"
        " AND run_id = %(run)s AND task_id = 'task-1' ORDER BY seq LIMIT 50",
        "count_messages": f"SELECT count(*) FROM run_events WHERE {where} AND category = 'message'",
    }

    def query(sql: str) -> Any:
        async def run() -> list[Any]:
            return await (await conn.execute(sql, params)).fetchall()

        return run

    return {label: query(sql) for label, sql in sqls.items()}


async def bench_reads(dsn: str, size: int) -> None:
    thread = f"{THREAD}-read"
    async with (
        PostgresRunEventStore(dsn) as store,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn,
    ):
        first = await fill_thread(store, thread, size)
        await conn.execute("ANALYZE run_events")
        middle = first + size // 2
        for user in (None, USER):
            scope = "" if user is None else "scoped "
            ours = read_queries(store, thread, middle, user)
            raw = raw_queries(conn, thread, middle, user)
            for label, fn in ours.items():
                raw_micros = await median_seconds(raw[label]) * 1e6
                micros = await median_seconds(fn) * 1e6
                line(
                    f"read postgres {size:,} {scope}{label}",
                    micros,
                    "µs",
                    f"raw {raw_micros:,.0f} µs = {micros / raw_micros:.2f}x raw",
                )


def scaling_child(dsn: str, thread: str, count: int, barrier: Any, results: Any) -> None:
    """One writer process: write ``count`` events to ``thread`` in batches of 20."""
    results.put(asyncio.run(scaling_writer(dsn, thread, count, barrier)))


async def scaling_writer(dsn: str, thread: str, count: int, barrier: Any) -> tuple[float, float]:
    events = make_events(count, 50, thread_id=thread)
    async with PostgresRunEventStore(dsn) as store:
        await store.put_batch(events[:1])  # connect and warm up before the clock starts
        await asyncio.to_thread(barrier.wait)
        start = time.monotonic()
        for i in range(1, count, 20):
            await store.put_batch(events[i : i + 20])
        return start, time.monotonic()


def scaling_rate(dsn: str, processes: int, same_thread: bool, count: int) -> float:
    """Aggregate events/s of ``processes`` writers started together."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    tag = uuid.uuid4().hex[:8]
    children = [
        ctx.Process(
            target=scaling_child,
            args=(
                dsn,
                f"scale-{tag}" if same_thread else f"scale-{tag}-{p}",
                count,
                barrier,
                results,
            ),
        )
        for p in range(processes)
    ]
    for child in children:
        child.start()
    spans = [results.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    return processes * (count - 1) / wall


def bench_scaling(dsn: str, count: int) -> None:
    for same_thread in (False, True):
        where = "one thread" if same_thread else "own threads"
        base = 0.0
        for processes in (1, 4, 8):
            rate = scaling_rate(dsn, processes, same_thread, count)
            base = base or rate
            line(
                f"write postgres put_batch(20), {processes} procs on {where}",
                rate,
                "events/s",
                f"{rate / base:.2f}x 1 process",
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--dsn", default=os.environ.get("DEERFLOW_JOURNAL_TEST_PG_DSN", DEFAULT_DSN)
    )
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--singles", type=int, default=2000)
    parser.add_argument("--read-size", type=int, default=100000)
    parser.add_argument("--proc-events", type=int, default=4000, help="events per writer process")
    args = parser.parse_args()
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        dsn = schema_dsn(args.dsn, schema)
        asyncio.run(bench_writes(dsn, args.events, args.singles))
        asyncio.run(bench_reads(dsn, args.read_size))
        bench_scaling(dsn, args.proc_events)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
