"""Store write and read throughput against a plain aiosqlite floor measured in the same run,
and browsing: ``list_threads`` and ``list_run_summaries`` across threads at 1,000 and 100,000
threads, and ``show`` (a 10,000-event run read and rendered).

Run: ``.venv/bin/python benchmarks/bench_stores.py [--events 20000] [--read-sizes 10000,100000]
[--browse-sizes 1000,100000] [--show-events 10000] [--instructions 2000]``. Prints one line per
figure and the ratios the issues set targets for.

The SQLite write rates depend on how fast this machine wakes a sleeping thread (the floor makes
five thread hops per batch, the store one), which varies several-fold between machines and with
their load. ``--instructions`` also counts, with valgrind's callgrind, the instructions per event
of the floor and of the SQLite store writing the same events: a figure that repeats anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads import THREAD, callgrind_counts, counted, line, make_events, median_seconds

from deerflow_journal import (
    MemoryRunEventStore,
    RunEventStore,
    RunSummary,
    ThreadInfo,
    open_store,
    render_timeline,
)

FLOOR_SCHEMA = """
CREATE TABLE events (
    id INTEGER PRIMARY KEY, thread_id TEXT NOT NULL, run_id TEXT NOT NULL, seq INTEGER NOT NULL,
    event_type TEXT NOT NULL, category TEXT NOT NULL, content TEXT NOT NULL,
    metadata TEXT NOT NULL, created_at TEXT NOT NULL, user_id TEXT,
    UNIQUE (thread_id, seq));
CREATE INDEX ix_events_cat ON events (thread_id, category, seq);
CREATE INDEX ix_events_run ON events (thread_id, run_id, seq);
"""
INSERT = (
    "INSERT INTO events (thread_id, run_id, seq, event_type, category, content, metadata,"
    " created_at, user_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


class Floor:
    """The least a correct SQLite writer does per batch, through plain aiosqlite."""

    def __init__(self, db: aiosqlite.Connection) -> None:
        self.db = db

    @classmethod
    async def open(cls, path: Path) -> Floor:
        db = await aiosqlite.connect(path, isolation_level=None)
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        await db.executescript(FLOOR_SCHEMA)
        return cls(db)

    async def put_batch(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00", time.gmtime())
        encoded = [(json.dumps(e["content"]), json.dumps(e.get("metadata") or {})) for e in events]
        await self.db.execute("BEGIN IMMEDIATE")
        async with self.db.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM events WHERE thread_id = ?", (THREAD,)
        ) as cursor:
            (last,) = await cursor.fetchone()
        rows = [
            (
                e["thread_id"],
                e["run_id"],
                last + i + 1,
                e["event_type"],
                e["category"],
                c,
                m,
                now,
                None,
            )
            for i, (e, (c, m)) in enumerate(zip(events, encoded, strict=True))
        ]
        await self.db.executemany(INSERT, rows)
        await self.db.execute("COMMIT")
        return [
            {**e, "seq": row[2], "created_at": now, "user_id": None}
            for e, row in zip(events, rows, strict=True)
        ]

    async def close(self) -> None:
        await self.db.close()


class EncodeFloor:
    """The least any store does per event: encode content and metadata, keep the row."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    async def put_batch(self, events: list[dict[str, Any]]) -> None:
        append = self.rows.append
        for e in events:
            content = orjson.dumps(e["content"]).decode()
            metadata = orjson.dumps(e.get("metadata") or {}).decode()
            append((e["thread_id"], e["run_id"], e["event_type"], e["category"], content, metadata))


def candidate_stores(tmp: Path) -> dict[str, Callable[[], RunEventStore]]:
    """The backends this checkout has, each on a fresh location under ``tmp``."""
    stores: dict[str, Callable[[], RunEventStore]] = {"memory": MemoryRunEventStore}
    for name, url in (("sqlite", f"sqlite:///{tmp}/store.db"), ("jsonl", f"jsonl:///{tmp}/jl")):
        try:
            open_store(url)
        except ImportError:
            continue
        stores[name] = lambda url=url: open_store(url)
    return stores


async def write_rate(store: Any, events: list[dict[str, Any]], batch: int) -> float:
    """Events per second writing ``events`` in batches of ``batch`` (1: single puts)."""
    start = time.perf_counter()
    if batch == 1:
        for event in events:
            if isinstance(store, Floor | EncodeFloor):
                await store.put_batch([event])
            else:
                await store.put(**event)
    else:
        for i in range(0, len(events), batch):
            await store.put_batch(events[i : i + batch])
    return len(events) / (time.perf_counter() - start)


async def bench_writes(tmp: Path, count: int, singles: int, rounds: int) -> None:
    """Write rates of the floor and of every store, and each store's ratio to the floor.

    The events are written in ``rounds`` slices; in each round the floor and then every store
    write the same slice, so all of them see the same machine. A rate is the median of the
    rounds' rates, a ratio the median of the same-round ratios: load from other processes
    drifts slowly and cancels out.
    """
    workloads = {
        "put_batch(20)": (make_events(count, 50), 20),
        "single put": (make_events(singles, 5, thread_id=THREAD), 1),
    }
    floor = await Floor.open(tmp / "floor.db")
    stores = {name: make() for name, make in candidate_stores(tmp).items()}
    for store in stores.values():
        await store.setup()
    rates: dict[tuple[str, str], list[float]] = {}
    for workload, (events, batch) in workloads.items():
        size = -(-len(events) // rounds)
        for start in range(0, len(events), size):
            chunk = events[start : start + size]
            writers = {"floor": floor, "encode": EncodeFloor(), **stores}
            for name, writer in writers.items():
                rate = await write_rate(writer, chunk, batch)
                rates.setdefault((name, workload), []).append(rate)
    await floor.close()
    for store in stores.values():
        await store.close()
    for workload in workloads:
        encode_rates = rates[("encode", workload)]
        encode_us = 1e6 / statistics.median(encode_rates)
        line(f"write floor encode-and-append {workload}", encode_us, "µs/event")
        for name in stores:
            mine = rates[(name, workload)]
            ratio = statistics.median(f / m for m, f in zip(mine, encode_rates, strict=True))
            line(
                f"write {name} {workload} per event",
                1e6 / statistics.median(mine),
                "µs/event",
                f"{ratio:.1f}x encode-and-append floor",
            )
        floor_rates = rates[("floor", workload)]
        line(f"write floor aiosqlite {workload}", statistics.median(floor_rates), "events/s")
        for name in stores:
            mine = rates[(name, workload)]
            ratio = statistics.median(m / f for m, f in zip(mine, floor_rates, strict=True))
            line(
                f"write {name} {workload}",
                statistics.median(mine),
                "events/s",
                f"{ratio:.2f}x floor (median of {len(mine)} same-round ratios)",
            )


async def count_writes(writer: str, batch: int, count: int) -> None:
    """Write ``count`` events, counting the instructions of the writes only."""
    with tempfile.TemporaryDirectory() as tmp:
        if writer == "floor":
            store: Any = await Floor.open(Path(tmp) / "floor.db")
        else:
            store = open_store(f"sqlite:///{tmp}/store.db")
            await store.setup()
        warm, events = 400, make_events(count + 400, 50)
        await write_rate(store, events[:warm], batch)
        with counted():
            await write_rate(store, events[warm:], batch)
        await store.close()


def write_instructions(count: int) -> None:
    """Instructions per event of the floor and of the SQLite store (every thread)."""
    runs = [(writer, batch) for batch in (20, 1) for writer in ("floor", "sqlite")]
    child = [sys.executable, __file__, "--count-writes"]
    counts = callgrind_counts({run: [*child, f"{run[0]},{run[1]},{count}"] for run in runs})
    if counts is None:
        print("write instructions: not measured (valgrind not found)", flush=True)
        return
    for batch, workload in ((20, "put_batch(20)"), (1, "single put")):
        floor, mine = counts[("floor", batch)] / count, counts[("sqlite", batch)] / count
        line(f"write instructions floor aiosqlite {workload}", floor / 1e3, "k/event")
        line(
            f"write instructions sqlite {workload}",
            mine / 1e3,
            "k/event",
            f"the floor does {floor / mine:.2f}x as many (callgrind, every thread)",
        )


async def read_figures(store: RunEventStore, thread: str, first_seq: int, total: int) -> dict:
    """Median latency (µs) of each read path on ``thread``, which holds ``total`` events."""
    middle = first_seq + total // 2
    run = "run-0002"
    queries = {
        "list_messages latest page": lambda: store.list_messages(thread, limit=50),
        "list_messages before_seq middle": lambda: store.list_messages(
            thread, limit=50, before_seq=middle
        ),
        "list_events event_types": lambda: store.list_events(
            thread, run, event_types=["llm.tool.result"], limit=50
        ),
        "list_events task_id": lambda: store.list_events(thread, run, task_id="task-1", limit=50),
        "count_messages": lambda: store.count_messages(thread),
        "scoped list_messages latest page": lambda: store.list_messages(
            thread, limit=50, user_id="bench-user"
        ),
        "scoped list_messages before_seq middle": lambda: store.list_messages(
            thread, limit=50, before_seq=middle, user_id="bench-user"
        ),
        "scoped count_messages": lambda: store.count_messages(thread, user_id="bench-user"),
    }
    return {label: await median_seconds(fn) * 1e6 for label, fn in queries.items()}


async def fill_thread(store: RunEventStore, thread: str, size: int) -> int:
    """Write ``size`` small events (half of them a user's) to ``thread``; return the first seq."""
    # Runs of 2,000 events whatever the thread size, so per-run queries compare like with like.
    events = make_events(size, max(1, size // 2000), thread_id=thread, text_bytes=200)
    for event in events[::2]:
        event["user_id"] = "bench-user"
    first = None
    for i in range(0, size, 1000):
        written = await store.put_batch(events[i : i + 1000])
        first = first or written[0]["seq"]
    return first


RAW_COLUMNS = "thread_id, run_id, seq, event_type, category, content, metadata, created_at, user_id"


def raw_records(rows: list[Any]) -> list[dict[str, Any]]:
    """Build the same record dicts the store returns, with the stdlib JSON decoder."""
    return [
        {
            "thread_id": r[0],
            "run_id": r[1],
            "seq": r[2],
            "event_type": r[3],
            "category": r[4],
            "content": json.loads(r[5]),
            "metadata": json.loads(r[6]),
            "created_at": r[7],
            "user_id": r[8],
        }
        for r in rows
    ]


async def raw_sqlite_figures(db: aiosqlite.Connection, thread: str, first: int, total: int):
    """The same reads as ``read_figures``, as hand-written SQL through plain aiosqlite."""
    middle = first + total // 2
    run = "run-0002"
    select = f"SELECT {RAW_COLUMNS} FROM run_events WHERE thread_id = ? "

    async def page(sql: str, *params: Any) -> list[dict[str, Any]]:
        return raw_records(list(await db.execute_fetchall(select + sql, (thread, *params))))

    async def count(sql: str, *params: Any) -> int:
        rows = await db.execute_fetchall(
            "SELECT count(*) FROM run_events WHERE thread_id = ? " + sql, (thread, *params)
        )
        return next(iter(rows))[0]

    latest = "AND category = 'message' ORDER BY seq DESC LIMIT 50"
    before = "AND category = 'message' AND seq < ? ORDER BY seq DESC LIMIT 50"
    queries = {
        "list_messages latest page": lambda: page(latest),
        "list_messages before_seq middle": lambda: page(before, middle),
        "list_events event_types": lambda: page(
            "AND run_id = ? AND event_type IN ('llm.tool.result') ORDER BY seq LIMIT 50", run
        ),
        "list_events task_id": lambda: page(
            "AND run_id = ? AND task_id = 'task-1' ORDER BY seq LIMIT 50", run
        ),
        "count_messages": lambda: count("AND category = 'message'"),
        "scoped list_messages latest page": lambda: page("AND user_id = 'bench-user' " + latest),
        "scoped list_messages before_seq middle": lambda: page(
            "AND user_id = 'bench-user' " + before, middle
        ),
        "scoped count_messages": lambda: count(
            "AND category = 'message' AND user_id = ?", "bench-user"
        ),
    }
    return {label: await median_seconds(fn) * 1e6 for label, fn in queries.items()}


async def bench_reads(tmp: Path, sizes: list[int], sqlite_sizes: list[int]) -> None:
    for name, make in candidate_stores(tmp).items():
        figures: dict[int, dict[str, float]] = {}
        raw: aiosqlite.Connection | None = None
        async with make() as store:
            if name == "sqlite":
                raw = await aiosqlite.connect(tmp / "store.db")
            for size in sqlite_sizes if name == "sqlite" else sizes:
                thread = f"{THREAD}-{size}"
                first = await fill_thread(store, thread, size)
                figures[size] = await read_figures(store, thread, first, size)
                baseline = (
                    None if raw is None else await raw_sqlite_figures(raw, thread, first, size)
                )
                for label, micros in figures[size].items():
                    extra = (
                        ""
                        if baseline is None
                        else (
                            f"raw aiosqlite {baseline[label]:,.1f} µs = "
                            f"{micros / baseline[label]:.2f}x raw"
                        )
                    )
                    line(f"read {name} {size:,} {label}", micros, "µs", extra)
        if raw is not None:
            await raw.close()
        measured = sorted(figures)
        if len(measured) > 1:
            small, big = figures[measured[0]], figures[measured[-1]]
            for label in small:
                ratio = big[label] / small[label]
                print(f"read {name} {label}: {measured[-1]:,} vs {measured[0]:,} = {ratio:.2f}x")


BROWSE_BASE = datetime(2026, 1, 1, tzinfo=UTC)


def browse_time(i: int) -> datetime:
    """When thread ``i`` was last active, and its run started: three threads a second, so
    pages cross equal times."""
    return BROWSE_BASE + timedelta(seconds=i // 3)


async def fill_threads(store: RunEventStore, count: int) -> None:
    """``count`` threads of two events and one run summary each, written 1,000 at a time."""
    for start in range(0, count, 1000):
        events, summaries = [], []
        for i in range(start, min(count, start + 1000)):
            thread, when = f"thread-{i:06d}", browse_time(i)
            for kind in ("run.start", "run.end"):
                events.append(
                    {
                        "thread_id": thread,
                        "run_id": "run-1",
                        "event_type": kind,
                        "category": "trace",
                        "content": {},
                        "created_at": when,
                    }
                )
            status = "error" if i % 10 == 0 else "success"
            summary = RunSummary(thread_id=thread, run_id="run-1", status=status, started_at=when)
            summaries.append(summary.to_json_dict())
        await store._put_journal_batch(events, summaries)


def middle_thread(count: int) -> ThreadInfo:
    """The thread halfway down the list: the ``before`` of a deep page."""
    i = count // 2
    at = browse_time(i).isoformat(timespec="microseconds")
    return ThreadInfo(f"thread-{i:06d}", 2, at, 1)


def middle_run(count: int) -> RunSummary:
    """The run halfway down the list of runs: the ``before`` of a deep page."""
    i = count // 2
    return RunSummary(thread_id=f"thread-{i:06d}", run_id="run-1", started_at=browse_time(i))


async def browse_figures(store: RunEventStore, count: int) -> dict[str, float]:
    """Median latency (µs) of browsing pages of 50 over ``count`` threads."""
    deep_thread, deep_run = middle_thread(count), middle_run(count)
    queries = {
        "list_threads first page": lambda: store.list_threads(limit=50),
        "list_threads deep page": lambda: store.list_threads(limit=50, before=deep_thread),
        "list_run_summaries first page": lambda: store.list_run_summaries(limit=50),
        "list_run_summaries deep page": lambda: store.list_run_summaries(limit=50, before=deep_run),
        "list_run_summaries error deep page": lambda: store.list_run_summaries(
            status="error", limit=50, before=deep_run
        ),
    }
    deep = await store.list_threads(limit=1, before=deep_thread)
    assert deep and deep[0].sort_key < deep_thread.sort_key, "a deep page follows its before"
    return {label: await median_seconds(fn) * 1e6 for label, fn in queries.items()}


async def show_seconds(store: RunEventStore, thread: str, run_id: str) -> float:
    """Median seconds of what ``deerflow-journal show`` does: read the run and render it."""

    async def show() -> None:
        events, after = [], None
        while True:
            page = await store.list_events(thread, run_id, limit=500, after_seq=after)
            events += page
            if len(page) < 500:
                break
            after = page[-1]["seq"]
        summary = await store.get_run_summary(thread, run_id)
        render_timeline(events, summary, width=80)

    return await median_seconds(show, repeat=5)


async def bench_browsing(tmp: Path, sizes: list[int], show_events: int) -> None:
    """Browsing pages at each size of store, their ratio from the smallest to the largest,
    and ``show`` of a run of ``show_events`` events."""
    for name in ("memory", "sqlite"):
        figures: dict[int, dict[str, float]] = {}
        for size in sizes:
            url = "memory://" if name == "memory" else f"sqlite:///{tmp}/browse-{size}.db"
            async with open_store(url) as store:
                start = time.perf_counter()
                await fill_threads(store, size)
                filled = time.perf_counter() - start
                line(f"browse {name} fill {size:,} threads", size / filled, "threads/s")
                figures[size] = await browse_figures(store, size)
                for label, micros in figures[size].items():
                    line(f"browse {name} {size:,} threads {label}", micros, "µs")
        small, big = min(sizes), max(sizes)
        if small != big:
            for label in figures[small]:
                ratio = figures[big][label] / figures[small][label]
                print(f"browse {name} {label}: {big:,} vs {small:,} threads = {ratio:.2f}x")
        url = "memory://" if name == "memory" else f"sqlite:///{tmp}/show.db"
        async with open_store(url) as store:
            events = make_events(show_events, 1, thread_id="show-thread")
            for i in range(0, len(events), 1000):
                await store.put_batch(events[i : i + 1000])
            run_id = events[0]["run_id"]
            await store.put_run_summary(RunSummary(thread_id="show-thread", run_id=run_id))
            seconds = await show_seconds(store, "show-thread", run_id)
            line(
                f"browse {name} show a {show_events:,}-event run (read + render)",
                seconds * 1e3,
                "ms",
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--singles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="slices the writes interleave in")
    parser.add_argument("--read-sizes", default="10000,100000")
    parser.add_argument("--sqlite-read-sizes", default="10000,100000,1000000")
    parser.add_argument("--skip-reads", action="store_true")
    parser.add_argument("--skip-writes", action="store_true")
    parser.add_argument("--browse-sizes", default="1000,100000", help="threads; empty: skip")
    parser.add_argument("--show-events", type=int, default=10000)
    parser.add_argument(
        "--instructions",
        type=int,
        default=2000,
        metavar="N",
        help="also count the instructions of N SQLite writes with valgrind (0: skip)",
    )
    parser.add_argument("--count-writes", help=argparse.SUPPRESS)  # one callgrind child
    args = parser.parse_args()
    if args.count_writes is not None:
        writer, batch, count = args.count_writes.split(",")
        await count_writes(writer, int(batch), int(count))
        return
    if not args.skip_writes:
        with tempfile.TemporaryDirectory() as tmp:
            await bench_writes(Path(tmp), args.events, args.singles, args.rounds)
    if args.instructions:
        write_instructions(args.instructions)
    if args.browse_sizes:
        with tempfile.TemporaryDirectory() as tmp:
            sizes = [int(s) for s in args.browse_sizes.split(",")]
            await bench_browsing(Path(tmp), sizes, args.show_events)
    if not args.skip_reads:
        with tempfile.TemporaryDirectory() as tmp:
            await bench_reads(
                Path(tmp),
                [int(s) for s in args.read_sizes.split(",")],
                [int(s) for s in args.sqlite_read_sizes.split(",")],
            )


if __name__ == "__main__":
    asyncio.run(main())
