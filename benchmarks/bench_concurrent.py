"""Many runs at once: 32 concurrent agent runs, each with its own journal, on one shared store.

Run: ``.venv/bin/python benchmarks/bench_concurrent.py [--concurrent 32] [--waves 5]
[--rounds 5] [--dsn postgresql://...]``.

A wave starts ``--concurrent`` runs of bench_journal's agent together on one event loop (one
thread each, as 32 users would), each with a ``RunJournal`` of its own writing to one store,
and ends when every run's events are stored. Beside it, on the same database, the same wave
with bench_journal's ``FloorHandler`` (the least any journal does for these runs, a baseline
and not a journal) writing each run's rows in one transaction. Waves of the two alternate, so
load from other processes reaches both alike. Prints runs per second of each, and the
journal's as a ratio to the floor's (the median of same-round ratios; target >= 0.8x), and
the CPU time this process spent per run in each (the store's server not included):
first on SQLite (the store's file, the floor in a table of its own in that file, through one
connection, one run's transaction at a time), then on
PostgreSQL (one fresh schema, dropped at the end; the floor through a pool as large as the
store's), or why PostgreSQL was skipped. ``--profile`` prints where the journal's SQLite
waves spend their time (cProfile, top functions by cumulative time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiosqlite
from bench_journal import FloorHandler, FloorTable, Row, Write, build_agent
from bench_stores import FLOOR_SCHEMA
from langchain_core.messages import HumanMessage

from deerflow_journal import RunEventStore, RunJournal, SqliteRunEventStore

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_POOL_SIZE = 10  # the PostgreSQL store's own pool size

Wave = Callable[[Any, int], Awaitable[None]]


def line(name: str, value: str, note: str = "") -> None:
    """Print one figure."""
    print(f"{name}: {value}" + (f"  ({note})" if note else ""), flush=True)


def question(wave: int, user: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"weather {wave}-{user}?")]}


def config(callback: Any, user: int) -> dict[str, Any]:
    return {"callbacks": [callback], "configurable": {"thread_id": f"user-{user}"}}


def journal_wave(store: RunEventStore, concurrent: int) -> Wave:
    """A wave of runs each journaled by a journal of its own; ends when all are stored."""

    async def wave(agent: Any, number: int) -> None:
        journals = [RunJournal(event_store=store) for _ in range(concurrent)]
        await asyncio.gather(
            *(
                agent.ainvoke(question(number, user), config(journal, user))
                for user, journal in enumerate(journals)
            )
        )
        await asyncio.gather(*(journal.flush() for journal in journals))

    return wave


def floor_wave(write: Write, concurrent: int) -> Wave:
    """The same wave with the floor handler; ends when every run's rows are written."""

    async def wave(agent: Any, number: int) -> None:
        handlers = [FloorHandler(write) for _ in range(concurrent)]
        await asyncio.gather(
            *(
                agent.ainvoke(question(number, user), config(handler, user))
                for user, handler in enumerate(handlers)
            )
        )
        await asyncio.gather(*(h.written for h in handlers if h.written is not None))

    return wave


@dataclass
class Figures:
    """One variant's medians over rounds, and the journal's same-round ratios to the floor."""

    journal_rate: float
    floor_rate: float
    rate_ratios: list[float]
    journal_cpu: float  # this process's CPU ms per run, every thread
    floor_cpu: float
    cpu_ratios: list[float]


async def measure(journal: Wave, floor: Wave, concurrent: int, waves: int, rounds: int) -> Figures:
    """Runs/s and CPU per run of the journal and of the floor, in alternating waves."""
    agent = build_agent()
    for wave in (journal, floor):
        await wave(agent, -1)  # warm up
    rates: dict[str, list[float]] = {"journal": [], "floor": []}
    cpu: dict[str, list[float]] = {"journal": [], "floor": []}
    number = 0
    for _ in range(rounds):
        spent = {"journal": 0.0, "floor": 0.0}
        used = {"journal": 0.0, "floor": 0.0}
        for _ in range(waves):
            for name, wave in (("journal", journal), ("floor", floor)):
                started, cpu_started = time.perf_counter(), time.process_time()
                await wave(agent, number)
                spent[name] += time.perf_counter() - started
                used[name] += time.process_time() - cpu_started
                number += 1
        for name in spent:
            rates[name].append(concurrent * waves / spent[name])
            cpu[name].append(used[name] / (concurrent * waves) * 1e3)
    return Figures(
        statistics.median(rates["journal"]),
        statistics.median(rates["floor"]),
        [j / f for j, f in zip(rates["journal"], rates["floor"], strict=True)],
        statistics.median(cpu["journal"]),
        statistics.median(cpu["floor"]),
        [j / f for j, f in zip(cpu["journal"], cpu["floor"], strict=True)],
    )


def spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x floor, rounds {min(ratios):.2f}-{max(ratios):.2f}"


def report(backend: str, concurrent: int, figures: Figures) -> None:
    label = f"{concurrent} concurrent runs {backend}"
    note = "the least any journal does, a baseline"
    line(f"{label} floor", f"{figures.floor_rate:.1f} runs/s", note)
    line(
        f"{label} journal",
        f"{figures.journal_rate:.1f} runs/s",
        f"{spread(figures.rate_ratios)}; target >= 0.8x",
    )
    line(f"{label} floor CPU", f"{figures.floor_cpu:.2f} ms per run", "this process, every thread")
    line(
        f"{label} journal CPU",
        f"{figures.journal_cpu:.2f} ms per run",
        f"{spread(figures.cpu_ratios)}; less noisy than the rates on a busy machine",
    )


# -- SQLite --------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def sqlite_waves(tmp: str, concurrent: int) -> AsyncIterator[tuple[Wave, Wave]]:
    """The journal and floor waves on one SQLite file."""
    path = Path(tmp) / "shared.db"
    store = SqliteRunEventStore(path)
    await store.setup()
    floor_db = await aiosqlite.connect(path)
    try:
        await floor_db.execute("PRAGMA journal_mode=WAL")
        await floor_db.execute("PRAGMA synchronous=NORMAL")
        await floor_db.executescript(FLOOR_SCHEMA)
        yield (
            journal_wave(store, concurrent),
            floor_wave(FloorTable(floor_db).write, concurrent),
        )
    finally:
        await floor_db.close()
        await store.close()


async def bench_sqlite(concurrent: int, waves: int, rounds: int, profile: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with sqlite_waves(tmp, concurrent) as (journal, floor):
            report(
                "sqlite",
                concurrent,
                await measure(journal, floor, concurrent, waves, rounds),
            )
            if profile:
                await profile_waves(journal, waves)


async def profile_waves(journal: Wave, waves: int) -> None:
    """Print where the journal's waves spend their time."""
    agent = build_agent()
    profiler = cProfile.Profile()
    profiler.enable()
    for number in range(waves):
        await journal(agent, number)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


# -- PostgreSQL ------------------------------------------------------------------------------


def pg_unreachable(dsn: str) -> str | None:
    """Why PostgreSQL at ``dsn`` cannot be used, or ``None``."""
    try:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # ImportError included: the extra is not installed
        return f"{type(exc).__name__}: {exc}".strip()
    return None


class PgFloorTable:
    """The floor's rows on PostgreSQL: per run one transaction on a pooled connection, with
    the thread's advisory lock and seq counter, as bench_postgres' raw-psycopg floor does."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def write(self, rows: list[Row]) -> None:
        from bench_postgres import FLOOR_COUNTER, FLOOR_INSERT

        thread = f"floor-{rows[0][1]}"  # the floor's rows carry no thread: one per run
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (thread,))
            cur = await conn.execute(FLOOR_COUNTER, (thread, len(rows)))
            (last,) = await cur.fetchone()
            first = last - len(rows)
            numbered = [
                (thread, run, first + i, kind, category, content, metadata, created, None)
                for i, (_, run, kind, category, content, metadata, created) in enumerate(rows, 1)
            ]
            async with conn.cursor() as cursor:
                await cursor.executemany(FLOOR_INSERT, numbered)


async def bench_postgres(dsn: str, concurrent: int, waves: int, rounds: int) -> None:
    import psycopg
    from bench_postgres import FLOOR_SCHEMA as PG_FLOOR_SCHEMA
    from bench_postgres import schema_dsn
    from psycopg_pool import AsyncConnectionPool

    from deerflow_journal.stores.postgres import PostgresRunEventStore

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE SCHEMA {schema}")
    try:
        scoped = schema_dsn(dsn, schema)
        async with (
            PostgresRunEventStore(scoped) as store,
            AsyncConnectionPool(
                scoped, min_size=1, max_size=PG_POOL_SIZE, kwargs={"autocommit": True}
            ) as pool,
        ):
            async with pool.connection() as conn:
                for statement in PG_FLOOR_SCHEMA:
                    await conn.execute(statement)
            journal = journal_wave(store, concurrent)
            floor = floor_wave(PgFloorTable(pool).write, concurrent)
            figures = await measure(journal, floor, concurrent, waves, rounds)
            report("postgres", concurrent, figures)
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def main(args: argparse.Namespace) -> None:
    """Measure and print every figure."""
    line(
        "workload",
        f"{args.concurrent} concurrent runs a wave",
        f"{args.waves} waves of each a round, {args.rounds} rounds; journal and floor alternate",
    )
    await bench_sqlite(args.concurrent, args.waves, args.rounds, args.profile)
    problem = pg_unreachable(args.dsn)
    if problem is not None:
        line(f"{args.concurrent} concurrent runs postgres", "skipped", f"{args.dsn}: {problem}")
        return
    await bench_postgres(args.dsn, args.concurrent, args.waves, args.rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrent", type=int, default=32, help="runs started together")
    parser.add_argument("--waves", type=int, default=5, help="waves of each variant a round")
    parser.add_argument("--rounds", type=int, default=5, help="repeats of the measurement")
    parser.add_argument(
        "--dsn", default=os.environ.get("DEERFLOW_JOURNAL_TEST_PG_DSN", DEFAULT_DSN)
    )
    parser.add_argument("--profile", action="store_true", help="profile the SQLite journal")
    parsed = parser.parse_args()
    if min(parsed.concurrent, parsed.waves, parsed.rounds) < 1:
        parser.error("--concurrent, --waves and --rounds must be at least 1")
    asyncio.run(main(parsed))
